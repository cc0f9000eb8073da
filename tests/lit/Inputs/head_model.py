#!/usr/bin/env python3
"""Writes a classifier head for lit tests: logits [N, VOCAB] = x [N, 8] W [8, VOCAB] + b.

  head_model.py OUT.onnx VOCAB
(seeded weights; the loss's kernels at a given vocabulary width, without a model file).
"""
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save


def main(argv):
    out, vocab = argv[1], int(argv[2])
    rng = np.random.default_rng(0)
    w = (0.5 * rng.standard_normal((8, vocab))).astype(np.float32)
    b = (0.1 * rng.standard_normal(vocab)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"], name="head"),
         helper.make_node("Add", ["p", "b"], ["logits"], name="head_bias")],
        "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", vocab])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
