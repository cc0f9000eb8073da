#!/usr/bin/env python3
"""Writes a one-node ONNX model for lit tests.

  node_model.py OUT.onnx OP IN:DTYPE:DIMS[=VALUES]... -- OUT:DTYPE:DIMS... [attr=VALUE...] [opset=N]
  e.g. node_model.py m.onnx Div a:int32:4 b:int32:4 -- q:int32:4
DIMS are x-separated ('2x3'); '' is a scalar; a non-numeric dim is symbolic ('Nx3').
An input with =VALUES (comma-separated numbers) is a constant (an initializer).
VALUE is an int, a comma-separated int list or else a string; opset (default 17) is the
model's default-domain opset.
"""
import sys

from onnx import TensorProto, helper, save


def value(spec):
    name, dtype, dims = spec.split(":")
    shape = [int(d) if d.isdigit() else d for d in dims.split("x")] if dims else []
    return helper.make_tensor_value_info(name, getattr(TensorProto, dtype.upper()), shape)


def main(argv):
    out, op, rest = argv[1], argv[2], argv[3:]
    sep = rest.index("--")
    inputs, inits = [], []
    for spec in rest[:sep]:
        spec, _, values = spec.partition("=")
        inputs.append(value(spec))
        if values:
            t = inputs[-1].type.tensor_type
            inits.append(helper.make_tensor(inputs[-1].name, t.elem_type,
                                            [d.dim_value for d in t.shape.dim],
                                            [int(v) if v.lstrip("-").isdigit() else float(v)
                                             for v in values.split(",")]))
    outs = [a for a in rest[sep + 1:] if "=" not in a]
    outputs = [value(s) for s in outs]
    attrs = {}
    opset = 17
    for a in rest[sep + 1 + len(outs):]:
        key, v = a.split("=")
        if key == "opset":
            opset = int(v)
        elif "," in v:
            attrs[key] = [int(x) for x in v.split(",")]
        else:
            attrs[key] = int(v) if v.lstrip("-").isdigit() else v
    node = helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], name="node",
                            **attrs)
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), out)


if __name__ == "__main__":
    main(sys.argv)
