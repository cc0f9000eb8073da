#!/usr/bin/env python3
"""float8 casts over every input that matters (ctest float8_casts on the CPU, gpu_float8_casts
on CUDA), bit for bit against a float64 NumPy reference.

Cast to FLOAT8E4M3FN, FLOAT8E5M2, FLOAT8E4M3FNUZ and FLOAT8E5M2FNUZ (saturate 0 and 1) from every f16 value (as f32) plus
values around each format's largest finite value; Cast from every float8 byte to f32. Each
model is compiled for cuda:sm_90 (CUDA bundles run on the CPU executor too) and replayed by
forge-replay with zero tolerance.

The reference rounds to nearest even onto the format's grid and then applies the overflow
rule (saturate: +-max; else NaN for E4M3FN and the FNUZ formats, infinity for E5M2; FNUZ
formats have one NaN, 0x80, and no negative zero), as the Cast spec says; it is
checked against onnx.reference wherever that is consistent with the spec. (onnx 1.18's
reference is not beyond the largest finite value without saturation: it maps 470 to NaN but
480 to 448, and 61440 to NaN but 70000 to infinity in E5M2.)

  test_float8_casts.py --forgec F --replay R --device cpu|cuda        (compiles, then runs)
  test_float8_casts.py --forgec F --bundles DIR --compile-only         (here)
  test_float8_casts.py --bundles DIR --replay R --device cuda          (on the GPU machine)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import forge_e2e as e2e  # noqa: E402


def cases():
    """name -> (onnx model, input array)."""
    from onnx import TensorProto, helper

    def cast(src, dst, n, **attrs):
        node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
        graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", src, [n])],
                                  [helper.make_tensor_value_info("y", dst, [n])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([240, 247.9, 248, 250, 256, 448, 464, 479.9, 480, 480.1, 500, 57344,
                      61439, 61440, 61441, 65504, 2.0**-11, 3 * 2.0**-12, 2.0**-19, 2.0**-18,
                      2.0**-10, 2.0**-9, 1.5 * 2.0**-10, 2.0**-17, 3 * 2.0**-17, 2.0**-18,
                      1e30, -1e30, 3.4e38], dtype=np.float32)
    floats = np.concatenate([halves, edges, -edges])
    out = {}
    for fmt, dtype in (("e4m3fn", TensorProto.FLOAT8E4M3FN), ("e5m2", TensorProto.FLOAT8E5M2),
                       ("e4m3fnuz", TensorProto.FLOAT8E4M3FNUZ),
                       ("e5m2fnuz", TensorProto.FLOAT8E5M2FNUZ)):
        for sat in (0, 1):
            out[f"f32_to_{fmt}_sat{sat}"] = (cast(TensorProto.FLOAT, dtype, floats.size,
                                                  saturate=sat), floats)
        out[f"{fmt}_to_f32"] = (cast(dtype, TensorProto.FLOAT, 256),
                                np.arange(256, dtype=np.uint8))
    return out


FORMATS = {  # mantissa bits, exponent bias, largest finite, has infinities, FNUZ
    "e4m3fn": (3, 7, 448.0, False, False),
    "e5m2": (2, 15, 57344.0, True, False),
    "e4m3fnuz": (3, 8, 240.0, False, True),
    "e5m2fnuz": (2, 16, 57344.0, False, True),
}


def format_of(name):
    """The float8 format a case name ("f32_to_FMT_satN" or "FMT_to_f32") casts."""
    return name.split("_to_")[1].split("_")[0] if name.startswith("f32_to") else name.split("_to_")[0]


def to_float8(x, fmt, saturate):
    """float64 -> float8 bytes: round to nearest even, then the overflow rule."""
    mbits, bias, largest, has_inf, fnuz = FORMATS[fmt]
    exp_bits = 7 - mbits
    nan_bits = ((1 << exp_bits) - 1) << mbits | 1 if has_inf else 0x7F
    inf_bits = ((1 << exp_bits) - 1) << mbits
    max_bits = 0x7F if fnuz else inf_bits - 1 if has_inf else 0x7E
    x = np.asarray(x, dtype=np.float64)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.int64)
    a = np.abs(x)
    emin = 1 - bias
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.frexp(np.where(np.isfinite(a), a, 1.0))[1]
        q = np.maximum(e - 1, emin) - mbits
        r = np.rint(a / np.ldexp(1.0, q))          # ties to even
        rounded = r * np.ldexp(1.0, q)
    carry = r >= 2 << mbits
    r = np.where(carry, r / 2, r)
    q = np.where(carry, q + 1, q)
    normal = r >= 1 << mbits
    field = np.where(normal, q + mbits + bias, 0)
    mant = np.where(normal, r - (1 << mbits), r)
    mant = np.where(np.isfinite(mant), mant, 0).astype(np.int64)
    out = sign | (np.where(np.isfinite(field), field, 0).astype(np.int64) << mbits) | mant
    over = np.isinf(a) | (rounded > largest)
    if fnuz:
        out = np.where(over, sign | max_bits if saturate else 0x80, out)
        out = np.where(rounded == 0, 0, out)
        out = np.where(np.isnan(x), 0x80, out)
        return out.astype(np.uint8)
    out = np.where(over, sign | (max_bits if saturate else (inf_bits if has_inf else nan_bits)), out)
    out = np.where(rounded == 0, sign, out)
    out = np.where(np.isnan(x), sign | nan_bits, out)
    return out.astype(np.uint8)


def from_float8(b, fmt):
    """float8 bytes -> float32 (exact)."""
    b = np.asarray(b, dtype=np.uint8)
    if fmt == "e5m2":
        return (b.astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    mbits, bias, _, _, fnuz = FORMATS[fmt]
    e, m = (b & 0x7F) >> mbits, (b & ((1 << mbits) - 1)).astype(np.int64)
    v = np.where(e == 0, np.ldexp(m.astype(np.float64), 1 - bias - mbits),
                 np.ldexp((m + (1 << mbits)).astype(np.float64), e.astype(np.int64) - bias - mbits))
    v = np.where(b & 0x80, -v, v)
    nan = (b == 0x80) if fnuz else ((b & 0x7F) == 0x7F)
    return np.where(nan, np.nan, v).astype(np.float32)


def compile_cases(rep, forgec, bundles):
    import onnx
    from onnx.reference import ReferenceEvaluator
    os.makedirs(bundles, exist_ok=True)
    from onnx import _custom_element_types as custom
    for name, (model, x) in cases().items():
        case = os.path.join(bundles, name)
        os.makedirs(case, exist_ok=True)
        fmt = format_of(name)
        if name.startswith("f32_to"):
            saturate = name.endswith("sat1")
            expected = to_float8(x, fmt, saturate)
            onnx_out = ReferenceEvaluator(model).run(None, {"x": x})[0].view(np.uint8)
            # Where onnx.reference follows the spec: in range, or saturating.
            in_range = np.isnan(x) | (np.abs(x) <= FORMATS[fmt][2]) | saturate
            nan = np.isnan(from_float8(expected, fmt))
            agree = (onnx_out == expected) | (nan & np.isnan(from_float8(onnx_out, fmt)))
            bad = np.flatnonzero(in_range & ~agree)
            rep.check(f"{name} NumPy reference = onnx.reference", bad.size == 0,
                      f"{bad.size} differ, first x={x[bad[:3]]}: ours "
                      f"{expected[bad[:3]]} onnx {onnx_out[bad[:3]]}" if bad.size else
                      f"{int(in_range.sum())} values")
        else:
            expected = from_float8(x, fmt)
            onnx_out = ReferenceEvaluator(model).run(
                None, {"x": x.view(getattr(custom, "float8" + fmt))})[0]
            same = (onnx_out == expected) | (np.isnan(onnx_out) & np.isnan(expected))
            rep.check(f"{name} NumPy reference = onnx.reference", bool(same.all()),
                      f"{int((~same).sum())} of 256 differ")
        np.savez(os.path.join(case, "set_0.npz"), **{"x": x, "expected:0": expected,
                                                      "cpu:0": expected})
        path = os.path.join(bundles, name + ".onnx")
        onnx.save(model, path)
        rc, t, log = e2e.run([forgec, path, "--inference-only", "--target", "cuda:sm_90", "-o",
                              os.path.join(case, "model.forge")])
        rep.check(f"{name} forgec", rc == 0 and "host" not in log,
                  f"{t:.1f}s {e2e.failure(rc, log)}")


def replay_cases(rep, replay, bundles, device):
    # Exact: every output bit must match (NaN matches NaN).
    rc, t, log = e2e.run([replay, bundles, "--device", device, "--rtol", "0", "--atol", "0",
                          "--cpu-rtol", "0", "--cpu-atol", "0"], timeout=600)
    rep.check(f"float8 casts on {device}", rc == 0 and f"{len(cases())} passed" in log,
              e2e.tail(log, 8))


if __name__ == "__main__":
    sys.exit(e2e.replay_check_main(__doc__, compile_cases, replay_cases))
