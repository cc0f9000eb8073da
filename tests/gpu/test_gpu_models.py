#!/usr/bin/env python3
"""The bundled models trained on the GPU against the CPU (ctest gpu_models, label gpu).

For each model in models/ (the losses of tests/e2e/test_overfit.py) and two generated wide
classifier heads (GENERATED), one CUDA bundle
  forgec M.onnx --target cuda:sm_90 --batch 8 --loss ... --optimizer sgd:lr=0.01,momentum=0.9
         --expose-gradients -o B/M.forge
runs STEPS steps in file order on both devices (the CPU runs a CUDA bundle's ops with its own
kernels, so the CPU is the reference for every generated kernel and library call):
  forge-train B/M.forge --data B/M.npz --no-shuffle --steps STEPS --device cpu|cuda
              --metrics ... --dump-grads ... --dump-params ...
Checks (fp32 on both sides; relative L2 norms in float64; with --tf32 the CUDA bundle's
matmuls and convolutions use TF32 tensor cores and the tolerances are the right column):
                                                                     fp32   TF32
  loss step 1            |gpu - cpu| / |cpu|                          1e-4   2e-3
  losses steps 1..STEPS  |gpu - cpu| / |cpu|                          1e-4   2e-3
  grads step 1           per parameter ||gpu - cpu||
                           / max(||cpu||, 1e-2 ||all grads||)         1e-4   2e-3
  params after STEPS     per tensor ||gpu - cpu|| / ||cpu||           1e-4   2e-3
  momentum after STEPS   per buffer ||gpu - cpu||
                           / max(||cpu||, 1e-2 ||all momentum buffers||) 1e-4 5e-2
TF32 rounds each matmul/convolution input to 10 mantissa bits (2^-11 relative); a weight
gradient (a sum of many mixed-sign products) loses more, the more its terms cancel, which
they do more as the model fits. The momentum buffers sum STEPS such gradients: the MLP's
reach 3.5e-2 against fp32 (its parameters stay within 2e-3, the fp32 run within 1e-4).
Some gradients are zero in exact arithmetic (a conv bias before BatchNorm, attention's key
bias): both devices compute rounding noise there, so their error is measured against the
global gradient norm instead, and so is their momentum buffer's (the sum of that noise). SGD keeps that noise out of the parameters; Adam, which divides
by sqrt(v), would amplify it (Adam's parity is checked against PyTorch by e2e_parity, which
runs on CUDA too). Non-finite values (e.g. a -inf attention mask) must match exactly.

The GPU machines have no MLIR, so the two halves can run apart:
  test_gpu_models.py --compile-only --bundles DIR --forgec F      (here)
  test_gpu_models.py --bundles DIR --forge-train F                 (on the GPU machine)
Without a GPU the run half prints 'SKIP' and exits 0 (ctest reports it skipped).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import forge_e2e as e2e  # noqa: E402
from forge_e2e import Report  # noqa: E402

MODELS = dict(e2e.MODEL_LOSSES)
# Generated here (no models/ file): a classifier head over a vocabulary wide enough for the
# loss's persistent row kernel (cross_entropy_with_grad with rows of >= 16384 f32 and more
# rows than SMs: 320 rows of [8, 40] tokens), even (16384: the vector kernel, unpadded) and
# odd (16381: the scalar kernel; under --gemm-pad-min-flops=0 padded to 16384 and read with
# `classes`); and in bf16 (--precision bf16: the bf16 logit gradient of the on-chip row
# kernel, its row's exponentials held in shared memory as f16) at GPT-2's padded width (50304:
# 98 KiB, beyond the 48 KiB a kernel gets without opting in), at 24576 (48 KiB exactly, above
# the 48 KiB less the static bytes a kernel gets without opting in) and at GPT-2's own 50257
# (unaligned and unpadded at this size: the gradient stays f32, the scalar kernel runs); and
# GPT-2's tied form (logits = x E^T, E [50257, 16], no bias): unpadded, the scalar kernel with
# a bf16 gradient; under --gemm-pad-min-flops=0 (gpu_models_padded) padded to 50264 columns,
# the on-chip kernel reading 50257 classes of each 50264-wide row.
# And tokens centred over the sequence (h = x W1, logits = (h - mean over tokens of h) W2 + b:
# attention's dk centring as forge-fuse-line-reductions makes it one "lines" kernel) at three
# widths of h, for the kernel's three vector widths: 128 (one column a lane), 2304 (four) and
# in bf16 1152 (two, as GPT-2's dk); 40 tokens, not a multiple of its rows per pass. And
# "centred_pairs": h [N, 40, 2, 128] centred over its pair axis (2 rows on 2 warps, fewer
# threads than the block's 128 columns at four a lane: the partials' sums loop over columns).
# And "lm_head_bf16": x E^T with E [2000, 64] in bf16, C and K multiples of 8, so that on sm_90
# forge-fuse-linear-cross-entropy makes it the runtime's CUTLASS GEMM with the streaming loss
# (320 rows and 2000 columns: neither a multiple of the 128-wide tiles; tied_head_bf16 under
# gpu_models_padded runs it too, at 50264 columns with 7 of padding).

GENERATED = {"wide_head": 16384, "wide_head_odd": 16381, "wide_head_bf16": 50304,
             "wide_head_bf16_48k": 24576, "wide_head_bf16_odd": 50257, "tied_head_bf16": 50257,
             "centred_tokens": 16, "centred_tokens_wide": 16, "centred_tokens_bf16": 16,
             "centred_pairs": 16, "lm_head_bf16": 2000}
TIED = {"tied_head_bf16": 16, "lm_head_bf16": 64}  # generated as x E^T, with this many features
CENTRED = {"centred_tokens": 128, "centred_tokens_wide": 2304, "centred_tokens_bf16": 1152,
           "centred_pairs": 256}
PAIRS = {"centred_pairs"}  # centred over an axis of 2 (h as [N, 40, 2, h / 2])
GENERATED_ARGS = {name: ["--precision", "bf16"] for name in GENERATED if "bf16" in name}
GENERATED_TOKENS, GENERATED_DIM = 40, 8
MODELS.update({name: ("cross_entropy:logits,labels", "classes") for name in GENERATED})
BATCH, STEPS = 8, 10
TOL = {"loss1": 1e-4, "grads1": 1e-4, "losses": 1e-4, "params": 1e-4, "momentum": 1e-4}
TF32_TOL = {"loss1": 2e-3, "grads1": 2e-3, "losses": 2e-3, "params": 2e-3, "momentum": 5e-2}
# A bf16 bundle on both devices: the CPU and the GPU may round a bf16 gradient element
# differently by one unit in the last place (2^-8 relative), so the gradients and the momentum
# (their sum) are compared within 4e-3; the loss (f32 from the logits) and the parameters
# (updated by lr times those gradients) keep the fp32 tolerances.
BF16_GRAD_TOL = 4e-3
ZERO_GRAD_FLOOR = 1e-2  # of the global gradient norm
SKIP_EXIT = 77  # ctest SKIP_RETURN_CODE


def make_generated(name, out, rng):
    """GENERATED[name]: logits [N, 40, V] = x [N, 40, 8] W [8, V] + b (or x E^T for TIED
    names, E [V, d]); its ONNX in `out` and its two batches of data."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    vocab, t, d = GENERATED[name], GENERATED_TOKENS, TIED.get(name, GENERATED_DIM)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", t, d])
    logits_info = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", t, vocab])
    if name in CENTRED:
        h = CENTRED[name]
        w1 = (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32)
        w2 = (rng.standard_normal((h, vocab)) / np.sqrt(h)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(vocab)).astype(np.float32)
        inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                 numpy_helper.from_array(bias, "b")]
        if name in PAIRS:  # [N, 40, 2, h / 2] centred over axis 2, back to [N, 40, h]
            nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="up"),
                     helper.make_node("Reshape", ["h0", "pairs"], ["h"], name="split"),
                     helper.make_node("ReduceMean", ["h"], ["m"], axes=[2], keepdims=1,
                                      name="mean"),
                     helper.make_node("Sub", ["h", "m"], ["c4"], name="centre"),
                     helper.make_node("Reshape", ["c4", "rows"], ["c"], name="join")]
            inits += [numpy_helper.from_array(np.array([0, t, 2, h // 2], np.int64), "pairs"),
                      numpy_helper.from_array(np.array([0, t, h], np.int64), "rows")]
        else:
            nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
                     helper.make_node("ReduceMean", ["h"], ["m"], axes=[1], keepdims=1,
                                      name="mean"),
                     helper.make_node("Sub", ["h", "m"], ["c"], name="centre")]
        nodes += [helper.make_node("MatMul", ["c", "w2"], ["p"], name="head"),
                  helper.make_node("Add", ["p", "b"], ["logits"], name="head_bias")]
        graph = helper.make_graph(nodes, name, [x_info], [logits_info], inits)
    elif name in TIED:
        e = (0.5 * rng.standard_normal((vocab, d)) / np.sqrt(d / 8)).astype(np.float32)
        graph = helper.make_graph(
            [helper.make_node("Transpose", ["e"], ["et"], perm=[1, 0], name="tie"),
             helper.make_node("MatMul", ["x", "et"], ["logits"], name="head")],
            name, [x_info], [logits_info], [numpy_helper.from_array(e, "e")])
    else:
        w = (0.5 * rng.standard_normal((d, vocab))).astype(np.float32)
        bias = (0.1 * rng.standard_normal(vocab)).astype(np.float32)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["p"], name="head"),
             helper.make_node("Add", ["p", "b"], ["logits"], name="head_bias")],
            name, [x_info], [logits_info],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    path = os.path.join(out, name + ".onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    data = {"x": rng.standard_normal((2 * BATCH, t, d)).astype(np.float32),
            "labels": rng.integers(0, vocab, size=(2 * BATCH, t)).astype(np.int64)}
    return path, data


def prepare(rep, a, forgec, out):
    manifest = json.load(open(os.path.join(a.models_dir, "manifest.json")))["models"]
    rng = np.random.default_rng(0)
    for name, (loss, kind) in MODELS.items():
        if a.only and name not in a.only:
            continue
        if name in GENERATED:
            onnx_path, data = make_generated(name, out, rng)
            np.savez(os.path.join(out, name + ".npz"), **data)
            compile_bundle(rep, a, forgec, out, name, onnx_path, loss, GENERATED_ARGS.get(name, []))
            continue
        ref = np.load(os.path.join(a.models_dir, name + ".ref.npz"))
        info = manifest[name]
        data = {}
        for k in info["inputs"]:  # the reference batch, tiled to 2 batches (floats jittered)
            x = ref[k]
            x = np.concatenate([x] * (-(-2 * BATCH // x.shape[0])))[:2 * BATCH]
            if x.dtype.kind == "f":
                x = (x + 0.1 * rng.standard_normal(x.shape)).astype(x.dtype)
            data[k] = x
        output, label = loss.split(":")[1].split(",")
        y = ref[output][:BATCH]
        if kind == "classes":
            labels = rng.integers(0, y.shape[-1], size=(2 * BATCH,) + y.shape[1:-1])
            data[label] = labels.astype(np.int64)
        else:
            data[label] = rng.uniform(-0.9, 0.9, size=(2 * BATCH,) + y.shape[1:]).astype(y.dtype)
        np.savez(os.path.join(out, name + ".npz"), **data)
        compile_bundle(rep, a, forgec, out, name, os.path.join(a.models_dir, name + ".onnx"),
                       loss)


def compile_bundle(rep, a, forgec, out, name, onnx_path, loss, extra=()):
    rc, t, log = e2e.run([forgec, onnx_path, "--target", a.target, "--batch", str(BATCH),
                          "--loss", loss, "--optimizer", "sgd:lr=0.01,momentum=0.9",
                          "--expose-gradients", "-o", os.path.join(out, name + ".forge")] +
                         (["--tf32"] if a.tf32 else []) + a.forgec_arg + list(extra), 900)
    rep.check(f"{name} forgec --target {a.target}", rc == 0,
              f"{t:.1f}s {e2e.tail(log, 3) if rc == 0 else e2e.failure(rc, log)}")


def train(forge_train, bundle, data, device, tmp):
    files = {k: os.path.join(tmp, f"{device}.{k}") for k in ("jsonl", "grads.npz", "params.npz")}
    rc, t, log = e2e.run([forge_train, bundle, "--data", data, "--no-shuffle", "--steps",
                          str(STEPS), "--device", device, "--threads", "4", "--log-every", "1000",
                          "--metrics", files["jsonl"], "--dump-grads", files["grads.npz"],
                          "--dump-params", files["params.npz"]], 900)
    return rc, t, log, files


# forge-train --profile (#11 item 5's split of the step comes from its trace) on one model:
# it runs, and its trace times the step's kernels and library calls. (That a copy issuing
# nothing gets no span is CudaExecutorGpuTest.ProfileLeavesOutCopiesThatIssueNothing.)
PROFILED_MODEL = "gpt"


def check_profile(rep, forge_train, bundle, data, tmp):
    """forge-train --profile on `bundle`: a trace of the profiled steps' instructions."""
    trace = os.path.join(tmp, "trace.json")
    rc, t, log = e2e.run([forge_train, bundle, "--data", data, "--no-shuffle", "--steps", "8",
                          "--device", "cuda", "--profile", trace, "--log-every", "1000"], 900)
    if not rep.check(f"{PROFILED_MODEL} forge-train --profile", rc == 0 and os.path.exists(trace),
                     f"{t:.1f}s" if rc == 0 else e2e.failure(rc, log, 8)):
        return
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = {e.get("args", {}).get("step") for e in events} - {None}
    kernels = [e for e in events if e.get("cat") not in ("memcpy", "transfer")]
    rep.check(f"{PROFILED_MODEL} profile: kernels of 5 steps traced",
              len(steps) == 5 and len(kernels) >= 5 and all(e["dur"] > 0 for e in kernels),
              f"steps {sorted(steps)}, {len(kernels)} kernel/library spans")


def bf16_floats(bits):
    """bf16 values stored as their uint16 bits, as float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def as_floats(name, a):
    """Tensor `name` of a dump as floats: a parameter's bf16 copy (uint16 bits) decoded."""
    return bf16_floats(a) if name.endswith(".bf16") and a.dtype == np.uint16 else a


def compare(rep, label, got, ref, tol, floor=0.0, keys=None):
    """Per tensor ||got - ref|| / max(||ref||, floor) over the finite entries (tensors `keys`,
    default all); non-finite entries must be identical. `floor` is a number or a function of
    the tensor's name."""
    worst, worst_name, bad = 0.0, None, []
    for k in keys if keys is not None else ref.files:
        if k not in got.files or got[k].shape != ref[k].shape:
            bad.append(f"{k} missing or misshapen")
            continue
        g, r = got[k], ref[k]
        # A parameter's bf16 copy (the optimizer writes it from the f32 master): masters that
        # differ in their last bits may round to neighbouring bf16 values, so the copies are
        # compared as the floats they hold, not bit for bit.
        g, r = as_floats(k, g), as_floats(k, r)
        if r.dtype.kind != "f":
            if not np.array_equal(g, r):
                bad.append(f"{k} differs")
            continue
        finite = np.isfinite(r)
        if not np.array_equal(np.isfinite(g), finite) or \
                not np.array_equal(g[~finite], r[~finite], equal_nan=True):
            bad.append(f"{k}: non-finite entries differ")
            continue
        g64, r64 = g[finite].astype(np.float64), r[finite].astype(np.float64)
        f = floor(k) if callable(floor) else floor
        e = float(np.linalg.norm(g64 - r64) / max(np.linalg.norm(r64), f, 1e-30))
        if not np.isfinite(e) or e > tol:
            bad.append(f"{k}: rel {e:.2e}")
        if e > worst:
            worst, worst_name = e, k
    rep.check(label, not bad, "; ".join(bad[:6] + [f"max rel {worst:.2e} ({worst_name})"]))


def run_models(rep, a, forge_train, bundles):
    for name in MODELS:
        if a.only and name not in a.only:
            continue
        bundle = os.path.join(bundles, name + ".forge")
        data = os.path.join(bundles, name + ".npz")
        if not rep.check(f"{name} bundle", os.path.exists(bundle), bundle):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            results = {}
            for device in ("cpu", "cuda"):
                rc, t, log, files = train(forge_train, bundle, data, device, tmp)
                if rep.check(f"{name} forge-train --device {device}", rc == 0,
                             f"{t:.1f}s {e2e.tail(log, 2) if rc == 0 else e2e.failure(rc, log, 8)}"):
                    results[device] = files
                    if device == "cuda":
                        warning = e2e.graph_capture_warning(log)
                        rep.check(f"{name} CUDA graph captured", not warning, warning)
            if name == PROFILED_MODEL and "cuda" in results:
                check_profile(rep, forge_train, bundle, data, tmp)
            if len(results) < 2:
                continue
            cpu, gpu = results["cpu"], results["cuda"]
            lc, lg = e2e.metric_losses(cpu["jsonl"]), e2e.metric_losses(gpu["jsonl"])
            if not rep.check(f"{name} steps", len(lc) == len(lg) == STEPS, f"{len(lc)}, {len(lg)}"):
                continue
            errs = [abs(g - c) / max(abs(c), 1e-30) for c, g in zip(lc, lg)]
            rep.check(f"{name} loss step 1", errs[0] <= TOL["loss1"],
                      f"cpu {lc[0]:.7f} cuda {lg[0]:.7f} rel {errs[0]:.2e}")
            rep.check(f"{name} losses 1..{STEPS}", max(errs) <= TOL["losses"],
                      f"max rel {max(errs):.2e} at step {int(np.argmax(errs)) + 1}; "
                      f"cpu {lc[-1]:.6f} cuda {lg[-1]:.6f} at step {STEPS}")
            cpu_grads = np.load(cpu["grads.npz"])
            total = float(np.sqrt(sum(np.sum(cpu_grads[k].astype(np.float64) ** 2)
                                      for k in cpu_grads.files)))
            bf16 = "--precision" in GENERATED_ARGS.get(name, [])
            grad_tol = max(TOL["grads1"], BF16_GRAD_TOL) if bf16 else TOL["grads1"]
            compare(rep, f"{name} grads step 1", np.load(gpu["grads.npz"]), cpu_grads,
                    grad_tol, ZERO_GRAD_FLOOR * total)
            cpu_params = np.load(cpu["params.npz"])
            momenta = [k for k in cpu_params.files if k.endswith(".momentum")]
            m_total = float(np.sqrt(sum(np.sum(cpu_params[k].astype(np.float64) ** 2)
                                        for k in momenta)))
            gpu_params = np.load(gpu["params.npz"])
            # A parameter whose gradient is zero but for rounding (an attention key bias:
            # softmax ignores a per-query shift) stays at its initial value plus noise; the
            # floor is 1% of the norm it would have at the model's RMS parameter size.
            plain = [k for k in cpu_params.files if k not in momenta]
            # (bf16 copies as the floats they hold, not their uint16 bits)
            p_sq = sum(float(np.sum(as_floats(k, cpu_params[k]).astype(np.float64) ** 2))
                       for k in plain)
            p_n = sum(cpu_params[k].size for k in plain)
            p_rms = float(np.sqrt(p_sq / max(p_n, 1)))
            compare(rep, f"{name} params step {STEPS}", gpu_params, cpu_params, TOL["params"],
                    lambda k: ZERO_GRAD_FLOOR * p_rms * float(np.sqrt(cpu_params[k].size)),
                    keys=plain)
            compare(rep, f"{name} momentum step {STEPS}", gpu_params, cpu_params,
                    max(TOL["momentum"], BF16_GRAD_TOL) if bf16 else TOL["momentum"],
                    ZERO_GRAD_FLOOR * m_total, keys=momenta)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--models-dir", default=os.path.join(HERE, "..", "..", "models"))
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--bundles", help="directory of compiled bundles and data (see the usage)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--forgec-arg", action="append", default=[],
                    help="an extra forgec argument (repeatable), e.g. --gemm-pad-min-flops=0")
    ap.add_argument("--tf32", action="store_true",
                    help="compile with TF32 matmuls/convolutions (TF32 tolerances)")
    a = ap.parse_args()
    if a.tf32:
        TOL.update(TF32_TOL)
    rep = Report()
    run_half = not a.compile_only
    if run_half and not e2e.gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed); the CUDA checks need one")
        return SKIP_EXIT
    tmp_root = None
    bundles = a.bundles
    if not bundles or a.compile_only:
        tools = e2e.find_tools(a, "test_gpu_models")
        if not tools:
            return 2
        forgec, forge_train = tools
        if not bundles:
            bundles = tmp_root = tempfile.mkdtemp(prefix="forge-gpu-")
        os.makedirs(bundles, exist_ok=True)
        prepare(rep, a, forgec, bundles)
    else:
        forge_train = a.forge_train or e2e.find_tool("forge-train", a.bin_dir)
    try:
        if run_half:
            run_models(rep, a, forge_train, bundles)
    finally:
        if tmp_root:
            shutil.rmtree(tmp_root, ignore_errors=True)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
