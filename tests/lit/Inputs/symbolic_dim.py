"""symbolic_dim.py IN.onnx OUT.onnx AXIS NAME: every graph input and output of IN whose dim AXIS
is static gets the symbolic dim NAME there instead (value_info dropped: shapes re-inferred).
Makes a length-generic export (one that computes positions and masks from the input's shape,
as TorchScript's does) take any sequence length."""
import sys

import onnx

src, dst, axis, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
m = onnx.load(src)
del m.graph.value_info[:]
init = {t.name for t in m.graph.initializer}
for v in [i for i in m.graph.input if i.name not in init] + list(m.graph.output):
    dims = v.type.tensor_type.shape.dim
    if len(dims) > axis:
        dims[axis].ClearField("dim_value")
        dims[axis].dim_param = name
onnx.save(m, dst)
