#!/usr/bin/env python3
"""bf16, fp16 and fp8 training (forgec --precision bf16|fp16|fp8, forge-assign-precision; fp16
with dynamic loss scaling; fp8: bf16 with float8 E4M3 forward GEMMs scaled per tensor) against
PyTorch's fp32 run of the fixtures in tests/fixtures/ (ctest e2e_precision).

For the adamw fixtures (mlp, gpt, cnn), each precision P, on the CPU (or --target/--device on
a GPU):
  forgec model.onnx --precision P --batch B --loss cross_entropy:logits,labels ...
  forge-train T/m.forge --data batches.npz --no-shuffle --steps 20 --threads 1 \
         --metrics T/metrics.jsonl --dump-params T/params20.npz
Checks:
  in_effect       the bundle stores tensors in P: the dump holds a '<param>.P' copy of
                  every weight some GEMM reads (forge.copy_of), and the losses differ from
                  PyTorch's fp32 ones (an fp32 run matches them to 1e-4: test_parity.py)
  copies_exact    every copy equals its fp32 master rounded to P (round to nearest even),
                  bit for bit, after 20 steps: the optimizer's update writes both
  masters_fp32    the masters and optimizer moments stay fp32 in the dump
  losses          per step |forge - torch| / |torch| <= 5e-3 (bf16 keeps 8 significant bits,
                  2^-8 = 3.9e-3 per rounding; the logits, the loss and the residual stream stay
                  f32; measured on the CPU: <= 5.1e-4)
  resume_exact    (mlp) 10 steps, a checkpoint, --resume to 20: the checkpoint holds no
                  '.bf16' copy, the resumed run's copies equal bf16(master) at step 20 (they
                  are derived from the masters on resume), and its losses of steps 11-20
                  equal the uninterrupted run's bit for bit on the CPU, within 1e-3 relative
                  on a GPU (its cuBLASLt algorithms are timed per process and its split
                  reductions add atomically: the last bits differ run to run, and 10 steps
                  of training grow them; measured 4.4e-5 and 1.2e-4 on an H200)
  params_step20   per parameter ||forge - torch|| / ||torch|| <= 3e-2 (measured <= 1.2e-2:
                  small vectors such as a norm's bias, whose 20 updates see bf16 gradients),
                  all parameters together within a third of it; a small parameter that
                  starts at zero <= SIGN_PARAM_TOL (see there: one flipped gradient sign);
                  the cnn's CUDA bundle (bf16/f16 convolutions, on a GPU or on the CPU)
                  <= CONV_PARAM_TOL = 0.2 (PyTorch's
                  autocast: 0.155; Forge on an H200: 0.115 bf16, 0.029-0.082 fp16)
  loss_scale      (fp16) every step reports the scale it used (65536 at first) and whether it
                  skipped; at most 2 of the 20 steps skip
  overflow_skips  (mlp, fp16, --loss-scale dynamic:init=1e30) the first step's gradients
                  overflow: it reports skipped, its parameters and moments are exactly the
                  initial ones, and the scale halves every step until steps go through
  float8_gemms    (fp8; mlp and gpt, whose GEMMs have K and N multiples of 16) forgec's remark
                  names at least one GEMM run in float8; the copies above are the bf16 ones,
                  and losses / params_step20 take FP8_LOSS_TOL / FP8_PARAM_TOL (E4M3 keeps 4
                  significant bits; measured on the CPU: losses <= 8.2e-4, parameters <= 0.122:
                  blocks.0.ln1.bias, a small vector whose Adam steps follow its gradient's sign)
  fp8-e5m2        (gpt) --precision fp8 --fp8-gradients e5m2: the backward of every
                  float8 product in float8 too (E5M2 output gradients beside E4M3 weights and
                  inputs, transposed copies): float8_gemms also asks forgec's remark for at
                  least one gradient GEMM reading E5M2; the checks above with FP8_LOSS_TOL and
                  FP8_E5M2_PARAM_TOL (E5M2 keeps 3 significant bits, 2^-3 per rounding of
                  each output gradient; measured on the CPU: losses <= 6.7e-4, parameters
                  <= 0.179: blocks.0.ln1.bias again, whose gradient now comes through the
                  E5M2 data gradient of the qkv GEMM)
  bf16-aux        (gpt) --precision bf16 --gemm-aux-epilogues (bf16's default on CUDA; the
                  bf16 case above gives --gemm-aux-epilogues=false): the MLP's GEMM saves its
                  pre-activation for the backward (cuBLASLt's GELU_AUX, stored in D's bf16)
                  and the gradient GEMM reads it (DGELU); the bf16 checks above (CUDA
                  bundles; the CPU target has no GEMM epilogues and compiles it as bf16)
GPU machines have no forgec: --compile-only --bundles DIR compiles the bundles into DIR here,
and --bundles DIR alone later trains them there (--device cuda; exit 77, skipped, without a GPU).
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import Report, optimizer_spec, rel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
TIMEOUT_S = 600
LOSS_TOL = 5e-3
PARAM_TOL = 3e-2
FP8_LOSS_TOL = 1e-2
FP8_PARAM_TOL = 0.15
FP8_E5M2_PARAM_TOL = 0.25
# The cnn on a GPU: forge-assign-layout runs its convolutions channels-last on cuDNN in
# bf16/f16 (on the CPU they stay f32). PyTorch's own autocast bf16 lands 0.155 from the fp32
# parameters on this fixture (features.1.bias, a BN bias whose 20 Adam steps follow its
# gradient's sign; bench/fixture_autocast_cnn.py), so 3e-2 would ask more than PyTorch does.
CONV_PARAM_TOL = 0.2
# --gemm-aux-epilogues in bf16: the MLP's bias is added in the GEMM as a bf16 copy (cuBLASLt
# takes no f32 bias beside a bf16 D; PyTorch's autocast rounds it too) and the GELU's input
# is saved as bf16(x W + b) rather than recomputed from bf16(x W) + b. blocks.0.ln1.bias, a
# small vector whose Adam steps follow its gradient's sign, moves most: 5.05e-2 on the CPU.
AUX_PARAM_TOL = 0.08
# A small parameter that starts at zero (a norm's or a projection's bias, < SIGN_PARAM_SIZE
# elements): Adam's first steps move each element by ~lr sign(g), so one near-zero gradient
# element whose sign bf16 noise flips is a 2 lr error in a vector of a few lr: on the gpt
# fixture, blocks.0.ln1.bias (32 elements) ends 6.5e-2 from fp32 on an H200 from ONE element
# (its fp32 gradient +6.8e-5, 1.2% of the tensor's largest; cuDNN's bf16 attention gives
# -7.2e-7, PyTorch autocast's +9.1e-6: both ~1% noise of the largest; bench/RESULTS.md, sixth
# session). Such vectors take SIGN_PARAM_TOL; every other parameter keeps the precision's
# bound, and all of them together (one relative norm over the concatenation) a third of it.
SIGN_PARAM_SIZE = 256
SIGN_PARAM_TOL = 0.1
FIXTURES = ["mlp_adamw", "gpt_adamw", "cnn_adamw"]
# Fixtures with a GEMM float8 takes (K and N multiples of 16); the cnn's are convolutions.
FP8_FIXTURES = ("mlp_adamw", "gpt_adamw")
# ... and with a float8 product whose backward GEMMs E5M2 takes: the mlp's one float8 product
# (fc1) reads the data (no dX) and sums its bias gradient in its dW GEMM's BGRAD epilogue,
# which stays bf16.
FP8_E5M2_FIXTURES = ("gpt_adamw",)
# --gemm-aux-epilogues: the fixtures with a GEMM followed by GELU.
AUX_FIXTURES = ("gpt_adamw",)


def bf16_round(x):
    """float32 -> the float32 value of its bf16 rounding (nearest even), as the runtime does."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(nan, np.float32(np.nan), out)


def bf16_values(raw):
    """A dumped bf16 tensor (NumPy has no bf16: raw uint16 bits) as float32."""
    return (np.asarray(raw).astype(np.uint32) << 16).view(np.float32)


def copy_bits(raw, prec):
    """A dumped low-precision copy's 16-bit patterns (bf16: raw bits; fp16: NumPy float16)."""
    raw = np.asarray(raw)
    return raw.astype(np.uint16) if prec == "bf16" else raw.view(np.uint16)


def rounded_bits(master, prec):
    """The 16-bit patterns of an f32 master rounded to nearest even in `prec`."""
    if prec == "bf16":
        return (bf16_round(master).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(master, dtype=np.float32).astype(np.float16).view(np.uint16)


def is_fp8(prec):
    return prec.startswith("fp8")


def precision_args(prec):
    """forgec's flags for a precision of this test (fp8-e5m2: fp8 with E5M2 gradients)."""
    if prec == "fp8-e5m2":
        return ["--precision", "fp8", "--fp8-gradients", "e5m2"]
    if prec == "bf16-aux":
        return ["--precision", "bf16", "--gemm-aux-epilogues"]
    if prec == "bf16":  # the plain GEMMs (bf16's CUDA default has the aux epilogues: bf16-aux)
        return ["--precision", "bf16", "--gemm-aux-epilogues=false"]
    return ["--precision", prec]


def compile_fixture(rep, name, fdir, forgec, target, bundle, prec, extra=()):
    m = json.load(open(os.path.join(fdir, "manifest.json")))
    cmd = [forgec, os.path.join(fdir, "model.onnx"), "--target", target, "--batch",
           str(m["batch_size"]), "--loss", "cross_entropy:logits,labels", "--optimizer",
           optimizer_spec(m["optimizer_hparams"]), *precision_args(prec), "-o", bundle, *extra]
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    ok = rep.check(f"{name} compile", rc == 0, e2e.failure(rc, out) if rc else "")
    if ok and is_fp8(prec):
        # forgec's remark, kept beside the bundle for the half that trains it.
        found = re.search(r"(\d+) GEMM\(s\) run in float8", out)
        grads = re.search(r"(\d+) gradient GEMM\(s\) read E5M2", out)
        with open(bundle + ".float8", "w") as f:
            f.write(f"{found.group(1) if found else 0} {grads.group(1) if grads else 0}")
    return ok


def check_float8(rep, name, bundle, prec):
    try:
        n, grads = (int(x) for x in open(bundle + ".float8").read().split())
    except (OSError, ValueError):
        n = grads = 0
    want_grads = prec == "fp8-e5m2"
    rep.check(f"{name} float8_gemms", n >= 1 and (grads >= 1) == want_grads,
              f"{n} forward GEMM(s) in float8, {grads} gradient GEMM(s) reading E5M2 "
              f"(forgec's remark; {'>= 1' if want_grads else 'none'} wanted)")


def check_fixture(rep, name, fdir, bundle, forge_train, device, tmp, prec, target="cpu"):
    m = json.load(open(os.path.join(fdir, "manifest.json")))
    metrics = os.path.join(tmp, f"{name}.jsonl")
    params = os.path.join(tmp, f"{name}.params20.npz")
    cmd = [forge_train, bundle, "--data", os.path.join(fdir, "batches.npz"), "--no-shuffle",
           "--steps", str(m["steps"]), "--threads", "1", "--device", device,
           "--metrics", metrics, "--dump-params", params]
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    if not rep.check(f"{name} train", rc == 0, e2e.failure(rc, out) if rc else ""):
        return
    losses = np.array(e2e.metric_losses(metrics))
    torch_losses = np.load(os.path.join(fdir, "losses.npy"))
    dump = dict(np.load(params))
    init = dict(np.load(os.path.join(fdir, "init_params.npz")))
    # fp8 keeps bf16 copies (and float8 ones per step); bf16-aux is bf16.
    copy_prec = "bf16" if is_fp8(prec) or prec == "bf16-aux" else prec
    suffix = "." + copy_prec
    copies = sorted(k for k in dump if k.endswith(suffix))
    masters = [k[: -len(suffix)] for k in copies]
    differs = losses.shape == torch_losses.shape and not np.allclose(losses, torch_losses,
                                                                     rtol=1e-6, atol=0)
    rep.check(f"{name} in_effect", len(copies) > 0 and all(k in init for k in masters)
              and differs,
              f"{len(copies)} copies ({', '.join(copies[:3])}...), losses differ from fp32: "
              f"{differs}")
    bad = []
    for c, mname in zip(copies, masters):
        got, want = copy_bits(dump[c], copy_prec), rounded_bits(dump[mname], copy_prec)
        if got.shape != want.shape or not np.array_equal(got, want):
            bad.append(c)
    rep.check(f"{name} copies_exact", copies and not bad,
              f"{len(copies) - len(bad)}/{len(copies)} copies equal {copy_prec}(master)"
              + (f"; differ: {', '.join(bad[:4])}" if bad else ""))
    wide = [k for k in dump if not k.endswith(suffix) and dump[k].dtype != np.float32
            and not k.startswith("forge.")]
    rep.check(f"{name} masters_fp32", not wide,
              "every master and moment f32" if not wide else f"not f32: {', '.join(wide[:4])}")
    if losses.shape != torch_losses.shape:
        rep.check(f"{name} losses", False, f"{losses.shape} losses, torch {torch_losses.shape}")
        return
    worst = float(np.max(np.abs(losses - torch_losses) / np.abs(torch_losses)))
    loss_tol = FP8_LOSS_TOL if is_fp8(prec) else LOSS_TOL
    rep.check(f"{name} losses", worst <= loss_tol, f"max rel {worst:.2e} (<= {loss_tol:g})")
    if prec == "fp16":
        recs = [json.loads(l) for l in open(metrics) if l.strip()]
        scales = [r.get("loss_scale") for r in recs]
        skipped = sum(int(r.get("skipped", 0)) for r in recs)
        rep.check(f"{name} loss_scale", all(x is not None for x in scales) and
                  scales[0] == 65536.0 and skipped <= 2,
                  f"scales {scales[0]} .. {scales[-1]}, {skipped} of {len(recs)} steps skipped")
    if name.startswith("mlp") and prec == "bf16":
        check_resume(rep, name, fdir, bundle, forge_train, device, tmp, losses, m["steps"], prec)
    torch_params = dict(np.load(os.path.join(fdir, "params_step20.npz")))
    errs = {k: rel(dump[k], v) for k, v in torch_params.items() if k in dump}
    param_tol = (FP8_E5M2_PARAM_TOL if prec == "fp8-e5m2" else FP8_PARAM_TOL if prec == "fp8"
                 else AUX_PARAM_TOL if prec == "bf16-aux"
                 else CONV_PARAM_TOL if name.startswith("cnn") and
                 (device == "cuda" or target.startswith("cuda")) else PARAM_TOL)
    sign_led = {k for k in errs if k in init and init[k].size < SIGN_PARAM_SIZE
                and not np.any(init[k])}
    tol_of = {k: max(param_tol, SIGN_PARAM_TOL) if k in sign_led else param_tol for k in errs}
    over = sorted((k for k in errs if errs[k] > tol_of[k]), key=lambda k: -errs[k])
    worst_p = max(errs.values()) if errs else float("inf")
    which = max(errs, key=errs.get) if errs else "none"
    keys = sorted(errs)
    whole = rel(np.concatenate([dump[k].ravel() for k in keys]),
                np.concatenate([torch_params[k].ravel() for k in keys])) if keys else 1.0
    rep.check(f"{name} params_step20", errs and not over and whole <= param_tol / 3 and
              len(errs) == len(torch_params),
              f"{len(errs)}/{len(torch_params)} parameters, all together {whole:.2e} "
              f"(<= {param_tol / 3:.2g}), worst "
              f"{worst_p:.2e} ({which}) (<= {param_tol:g}; {len(sign_led)} small zero-started "
              f"<= {max(param_tol, SIGN_PARAM_TOL):g})"
              + (f"; over: {', '.join(f'{k} {errs[k]:.2e}' for k in over[:3])}" if over else ""))


def check_overflow(rep, name, fdir, bundle, forge_train, device, tmp):
    """fp16 with an initial scale of 1e30: the first step overflows and must change nothing."""
    metrics = os.path.join(tmp, f"{name}.overflow.jsonl")
    params = os.path.join(tmp, f"{name}.overflow.npz")
    cmd = [forge_train, bundle, "--data", os.path.join(fdir, "batches.npz"), "--no-shuffle",
           "--threads", "1", "--device", device, "--metrics", metrics, "--steps", "1",
           "--dump-params", params]
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    if rc != 0:
        rep.check(f"{name} overflow_skips", False, e2e.failure(rc, out))
        return
    rec = [json.loads(l) for l in open(metrics) if l.strip()][0]
    dump = dict(np.load(params))
    init = dict(np.load(os.path.join(fdir, "init_params.npz")))
    changed = [k for k, v in init.items() if k not in dump or not np.array_equal(dump[k], v)]
    moments = [k for k in dump if k.endswith((".exp_avg", ".exp_avg_sq")) and np.any(dump[k])]
    # Then 200 steps from the start: the scale halves until a step goes through.
    cmd[cmd.index("--steps") + 1] = "200"
    cmd = cmd[:-2]
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    recs = [json.loads(l) for l in open(metrics) if l.strip()] if rc == 0 else []
    first_ok = next((r["step"] for r in recs if not r["skipped"]), None)
    halving = all(abs(recs[i]["loss_scale"] - 1e30 / 2 ** i) <= 1e-6 * 1e30 / 2 ** i
                  for i in range((first_ok or 1) - 1))
    rep.check(f"{name} overflow_skips", rec.get("skipped") == 1 and abs(rec.get("loss_scale", 0) - 1e30) <= 1e24
              and not changed and not moments and first_ok is not None and halving,
              f"step 1 skipped={rec.get('skipped')} at scale {rec.get('loss_scale')}; parameters "
              f"changed: {changed[:3]}; moments non-zero: {moments[:3]}; first update at step "
              f"{first_ok}, the scale halving every skipped step: {halving}")


def check_resume(rep, name, fdir, bundle, forge_train, device, tmp, losses, steps, prec):
    ckpt = os.path.join(tmp, f"{name}.ckpt")
    metrics = os.path.join(tmp, f"{name}.resume.jsonl")
    base = [forge_train, bundle, "--data", os.path.join(fdir, "batches.npz"), "--no-shuffle",
            "--threads", "1", "--device", device, "--metrics", metrics, "--ckpt-dir", ckpt]
    half = steps // 2
    params = os.path.join(tmp, f"{name}.resume.params.npz")
    for extra in (["--steps", str(half), "--ckpt-every", str(half)],
                  ["--steps", str(steps), "--resume", "--dump-params", params]):
        rc, _, out = e2e.run(base + extra, TIMEOUT_S)
        if rc != 0:
            rep.check(f"{name} resume_exact", False, e2e.failure(rc, out))
            return
    resumed = np.array(e2e.metric_losses(metrics))
    files = [f for f in os.listdir(ckpt) if f.endswith(".forgeckpt")]
    members = list(np.load(os.path.join(ckpt, sorted(files)[0])).keys()) if files else []
    suffix = "." + prec
    copies = [k for k in members if k.endswith(suffix)]
    dump = dict(np.load(params))
    derived = [k for k in dump if k.endswith(suffix)]
    stale = [k for k in derived if not np.array_equal(
        copy_bits(dump[k], prec), rounded_bits(dump[k[: -len(suffix)]], prec))]
    worst = (float(np.max(np.abs(resumed - losses) / np.abs(losses)))
             if resumed.shape == losses.shape else float("inf"))
    same = worst == 0.0 if device == "cpu" else worst <= 1e-3
    rep.check(f"{name} resume_exact", same and members and not copies and derived and not stale,
              f"losses after a resume at step {half}: max rel {worst:.2e} "
              f"({'bit for bit' if device == 'cpu' else '<= 1e-3'}); {len(members)} checkpoint "
              f"members, copies among them: {copies[:3]}; {len(derived) - len(stale)}/"
              f"{len(derived)} copies equal bf16(master) after the resumed run")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=DEFAULT_FIXTURES)
    ap.add_argument("--target", default="cpu")
    e2e.add_half_args(ap)
    ap.add_argument("fixtures", nargs="*", default=FIXTURES)
    a = ap.parse_args()
    setup = e2e.halves(ap, a, "test_precision.py")
    if isinstance(setup, int):
        return setup
    forgec, forge_train, replay = setup
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        out = a.bundles or tmp
        os.makedirs(out, exist_ok=True)
        for prec in ("bf16", "fp16", "fp8", "fp8-e5m2", "bf16-aux"):
            for fixture in a.fixtures:
                if (is_fp8(prec) and fixture not in FP8_FIXTURES or
                        prec == "fp8-e5m2" and fixture not in FP8_E5M2_FIXTURES or
                        prec == "bf16-aux" and fixture not in AUX_FIXTURES):
                    continue
                fdir = os.path.join(a.fixtures_dir, fixture)
                name = f"{fixture} {prec}"
                bundle = os.path.join(out, f"{fixture}.{prec}.forge")
                if replay or compile_fixture(rep, name, fdir, forgec, a.target, bundle, prec):
                    if is_fp8(prec):
                        check_float8(rep, name, bundle, prec)
                    if not a.compile_only:
                        check_fixture(rep, name, fdir, bundle, forge_train, a.device, tmp, prec,
                                      a.target)
                if prec != "fp16" or not fixture.startswith("mlp"):
                    continue
                bundle = os.path.join(out, f"{fixture}.overflow.forge")
                if replay or compile_fixture(rep, f"{fixture} fp16 overflow", fdir, forgec,
                                             a.target, bundle, prec,
                                             ("--loss-scale", "dynamic:init=1e30")):
                    if not a.compile_only:
                        check_overflow(rep, f"{fixture} fp16", fdir, bundle, forge_train,
                                       a.device, tmp)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
