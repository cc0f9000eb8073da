#!/usr/bin/env python3
"""Writes y = ReduceSum(Dropout(x, ratio, training_mode) * w) for lit tests.

  dropout_model.py OUT.onnx RATIO TRAINING   (TRAINING: 1, 0, or 'none' for no input)
"""
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

out, ratio, training = sys.argv[1], float(sys.argv[2]), sys.argv[3]
inits = [numpy_helper.from_array(np.ones(8, np.float32), "w"),
         numpy_helper.from_array(np.array(ratio, np.float32), "ratio")]
inputs = ["x", "ratio"]
if training != "none":
    inits.append(numpy_helper.from_array(np.array(training == "1"), "training"))
    inputs.append("training")
nodes = [helper.make_node("Dropout", inputs, ["d"], name="drop"),
         helper.make_node("Mul", ["d", "w"], ["p"], name="scale"),
         helper.make_node("ReduceSum", ["p"], ["loss"], name="sum", keepdims=0)]
graph = helper.make_graph(nodes, "dropout",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
