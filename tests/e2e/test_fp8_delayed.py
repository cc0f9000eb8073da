#!/usr/bin/env python3
"""fp8 with delayed scaling (forgec --precision fp8 --fp8-scaling delayed --fp8-history H,
forge-assign-precision) on the gpt fixture (tests/fixtures/gpt_adamw), against an independent
float64 NumPy computation of the amaxes and PyTorch's fp32 losses (ctest e2e_fp8_delayed).

Delayed scaling scales each activation a float8 GEMM reads by the largest amax of its last H
steps: a state tensor '<gemm>.fp8_amax_history' [H] per activation, a ring whose slot
(step - 1) mod H the step fills with the activation's own amax, initially [448, 0, ...] (the
first step scales by 1). Weights and data inputs keep current scaling (no history).

Bundles (H = 4): delayed, and current scaling for comparison, both for --target (cpu default;
cuda:sm_90 bundles run on the CPU executor too). Checks:
  histories     forgec's remark counts N >= 1 activations with delayed scaling; every
                checkpoint holds exactly N '*.fp8_amax_history' tensors of shape [4] and none
                is a parameter's
  ring          a run of 6 steps checkpointing every step: step s changes only slot
                (s - 1) mod 4 of each history (step 0: the initial [448, 0, 0, 0]), and that
                slot becomes a positive finite amax
  amax_ref      the history of blocks.0's qkv GEMM (its lhs: ln1's output, stored bf16): at
                every step s its slot equals max|bf16(layer_norm(wte[ids] + wpe))| over batch
                s with step s-1's parameters (the checkpoints; float64 NumPy), within one bf16
                ulp (2^-7 relative: the CPU's f32 layer norm may round the largest element
                the other way)
  losses        20 steps against PyTorch's fp32 losses: per step rel <= 1e-2 (as test_precision's
                fp8: E4M3 keeps 4 significant bits), parameters after 20 steps <= 0.15
  in_effect     the losses differ from current scaling's (the first step alone scales by 1)
  resume_exact  3 steps and a checkpoint, then --resume to 6: the histories come back from the
                checkpoint and steps 4-6 repeat the uninterrupted run's losses bit for bit on
                the CPU (within 1e-3 on a GPU)
  dp ...        (CPU) --dp 2 with 2 samples a rank, two CPU ranks (--nproc 2): the same
                histories, ring and amax_ref checks, the amax of each slot being the global
                batch's (the ranks reduce their amaxes with a max: rank 0's checkpoint would
                hold only its half's otherwise), and the 6 losses equal the one-process run's
                within 1e-3: the gradients' mean over ranks reassociates (parameters 1e-5 apart
                after 4 steps), and an amax that lands one bf16 ulp apart changes that tensor's
                float8 scale (measured 7.1e-5 with the CPU target's bundle from step 5, where
                two rings' slots differ by an ulp; 1.2e-7 with the CUDA bundle)
GPU machines have no forgec: --compile-only --bundles DIR compiles here, --bundles DIR alone
trains there (--device cuda; exit 77, skipped, without a GPU).
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
HISTORY = 4
LOSS_TOL = 1e-2
PARAM_TOL = 0.15
DP_LOSS_TOL = 1e-3
LN_EPS = 1e-5  # nn.LayerNorm's default (tools/gen_fixtures.py's GPT)
SUFFIX = ".fp8_amax_history"
REF_HISTORY = "/blocks.0/attn/qkv/MatMul" + SUFFIX


def bf16_round(x):
    """float64/float32 -> the float64 value of its float32 then bf16 rounding (nearest even)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)


def ln1_amax(params, ids):
    """max |bf16(ln1(wte[ids] + wpe[:T]))| of blocks.0, in float64."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    x = p["wte.weight"][ids] + p["wpe.weight"][: ids.shape[1]]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + LN_EPS) * p["blocks.0.ln1.weight"] + p["blocks.0.ln1.bias"]
    return float(np.max(np.abs(bf16_round(y))))


def compile_bundle(rep, fdir, forgec, target, bundle, scaling, ranks=1):
    m = json.load(open(os.path.join(fdir, "manifest.json")))
    cmd = [forgec, os.path.join(fdir, "model.onnx"), "--target", target, "--batch",
           str(m["batch_size"] // ranks), "--loss", "cross_entropy:logits,labels", "--optimizer",
           optimizer_spec(m["optimizer_hparams"]), "--precision", "fp8", "--fp8-scaling",
           scaling, "--fp8-history", str(HISTORY), "-o", bundle]
    if ranks > 1:
        cmd += ["--dp", str(ranks)]
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    ok = rep.check(f"compile {scaling}" + (f" --dp {ranks}" if ranks > 1 else ""), rc == 0,
                   e2e.failure(rc, out) if rc else "")
    if ok and scaling == "delayed":
        found = re.search(r"(\d+) of them with delayed scaling", out)
        with open(bundle + ".delayed", "w") as f:
            f.write(found.group(1) if found else "0")
    return ok


def train(fdir, forge_train, bundle, device, steps, metrics, extra=()):
    cmd = [forge_train, bundle, "--data", os.path.join(fdir, "batches.npz"), "--no-shuffle",
           "--threads", "1", "--device", device, "--steps", str(steps), "--metrics", metrics,
           *extra]
    return e2e.run(cmd, TIMEOUT_S)


def checkpoints(ckpt_dir):
    """{step: {name: array}} of the checkpoints ckpt-<step>.forgeckpt in ckpt_dir (.npz files)."""
    out = {}
    for f in os.listdir(ckpt_dir):
        found = re.fullmatch(r"ckpt-(\d+)\.forgeckpt", f)
        if found:
            # Members are '<kind>/<name>' (param/..., state/...): keyed by name here.
            members = np.load(os.path.join(ckpt_dir, f))
            out[int(found.group(1))] = {k.split("/", 1)[1] if k.split("/", 1)[0] in
                                        ("param", "state") else k: members[k] for k in members}
    return out


def check_histories_and_ring(rep, fdir, forge_train, bundle, device, tmp, tag="", launch=()):
    """The checks histories, ring and amax_ref on a 6-step run of `bundle`; its losses."""
    try:
        expected = int(open(bundle + ".delayed").read())
    except (OSError, ValueError):
        expected = 0
    ckpt = os.path.join(tmp, tag + "ring")
    metrics = os.path.join(tmp, tag + "ring.jsonl")
    rc, _, out = train(fdir, forge_train, bundle, device, 6, metrics,
                       ["--ckpt-dir", ckpt, "--ckpt-every", "1", *launch])
    if not rep.check(f"{tag}ring train", rc == 0, e2e.failure(rc, out) if rc else ""):
        return None
    ckpts = checkpoints(ckpt)
    init = dict(np.load(os.path.join(fdir, "init_params.npz")))
    names = sorted(k for k in ckpts.get(1, {}) if k.endswith(SUFFIX))
    shapes_ok = all(sorted(k for k in c if k.endswith(SUFFIX)) == names and
                    all(c[k].shape == (HISTORY,) for k in names) for c in ckpts.values())
    rep.check(f"{tag}histories", expected >= 1 and len(names) == expected and shapes_ok and
              sorted(ckpts) == list(range(1, 7)) and
              not any(k[: -len(SUFFIX)] in init for k in names) and REF_HISTORY in names,
              f"{len(names)} histories in the checkpoints (forgec: {expected} activations with "
              f"delayed scaling), shapes [{HISTORY}]: {shapes_ok}; checkpoints {sorted(ckpts)}; "
              f"{', '.join(names[:2])}...")
    if not names or sorted(ckpts) != list(range(1, 7)):
        return None
    # ring: step s writes slot (s - 1) mod H only.
    start = np.array([448.0] + [0.0] * (HISTORY - 1), dtype=np.float32)
    bad = []
    for name in names:
        prev = start
        for s in range(1, 7):
            cur = ckpts[s][name]
            slot = (s - 1) % HISTORY
            others = [i for i in range(HISTORY) if i != slot]
            if not (np.array_equal(cur[others], prev[others]) and np.isfinite(cur[slot]) and
                    cur[slot] > 0 and cur[slot] < 448):
                bad.append(f"{name} step {s}: {prev} -> {cur}")
            prev = cur
    rep.check(f"{tag}ring", not bad, f"{len(names)} histories x 6 steps each change only slot "
              f"(step - 1) mod {HISTORY}" if not bad else "; ".join(bad[:2]))
    # amax_ref: the slot against NumPy's amax of ln1's output.
    batches = np.load(os.path.join(fdir, "batches.npz"))
    b = json.load(open(os.path.join(fdir, "manifest.json")))["batch_size"]
    worst, detail = 0.0, []
    for s in range(1, 7):
        params = init if s == 1 else ckpts[s - 1]
        ids = batches["input_ids"][(s - 1) * b: s * b]
        want = ln1_amax({k: params[k] for k in init}, ids)
        got = float(ckpts[s][REF_HISTORY][(s - 1) % HISTORY])
        err = abs(got - want) / want
        worst = max(worst, err)
        detail.append(f"{got:.5g}/{want:.5g}")
    rep.check(f"{tag}amax_ref", worst <= 2.0 ** -7,
              f"slot vs NumPy per step (forge/numpy): {' '.join(detail)}; max rel {worst:.2e} "
              f"(<= {2.0 ** -7:.2e})")
    return np.array(e2e.metric_losses(metrics))


def check_losses(rep, fdir, forge_train, delayed, current, device, tmp):
    runs = {}
    for tag, bundle in (("delayed", delayed), ("current", current)):
        metrics = os.path.join(tmp, f"{tag}.jsonl")
        params = os.path.join(tmp, f"{tag}.npz")
        rc, _, out = train(fdir, forge_train, bundle, device, 20, metrics,
                           ["--dump-params", params])
        if not rep.check(f"train {tag}", rc == 0, e2e.failure(rc, out) if rc else ""):
            return None
        runs[tag] = (np.array(e2e.metric_losses(metrics)), dict(np.load(params)))
    losses, dump = runs["delayed"]
    torch_losses = np.load(os.path.join(fdir, "losses.npy"))
    if losses.shape != torch_losses.shape:
        rep.check("losses", False, f"{losses.shape} losses, torch {torch_losses.shape}")
        return None
    worst = float(np.max(np.abs(losses - torch_losses) / np.abs(torch_losses)))
    torch_params = dict(np.load(os.path.join(fdir, "params_step20.npz")))
    errs = {k: rel(dump[k], v) for k, v in torch_params.items() if k in dump}
    worst_p = max(errs.values()) if errs else float("inf")
    rep.check("losses", worst <= LOSS_TOL and len(errs) == len(torch_params) and
              worst_p <= PARAM_TOL,
              f"losses max rel {worst:.2e} (<= {LOSS_TOL:g}); {len(errs)}/{len(torch_params)} "
              f"parameters max rel {worst_p:.2e} (<= {PARAM_TOL:g})")
    other = runs["current"][0]
    differs = other.shape == losses.shape and not np.array_equal(other, losses)
    rep.check("in_effect", differs,
              f"step 1: delayed {losses[0]:.7g}, current {other[0]:.7g}; max |diff| "
              f"{float(np.max(np.abs(other - losses))) if other.shape == losses.shape else -1:.2e}")
    return losses


def check_resume(rep, fdir, forge_train, bundle, device, tmp, losses):
    ckpt = os.path.join(tmp, "resume")
    metrics = os.path.join(tmp, "resume.jsonl")
    for extra in (["--steps", "3", "--ckpt-every", "3"], ["--steps", "6", "--resume"]):
        cmd = [forge_train, bundle, "--data", os.path.join(fdir, "batches.npz"), "--no-shuffle",
               "--threads", "1", "--device", device, "--metrics", metrics, "--ckpt-dir", ckpt,
               *extra]
        rc, _, out = e2e.run(cmd, TIMEOUT_S)
        if rc != 0:
            rep.check("resume_exact", False, e2e.failure(rc, out))
            return
    resumed = np.array(e2e.metric_losses(metrics))
    members = checkpoints(ckpt).get(3, {})
    saved = [k for k in members if k.endswith(SUFFIX)]
    want = losses[3:6]
    got = resumed[-3:] if resumed.size >= 3 else resumed
    worst = (float(np.max(np.abs(got - want) / np.abs(want)))
             if got.shape == want.shape else float("inf"))
    same = worst == 0.0 if device == "cpu" else worst <= 1e-3
    rep.check("resume_exact", same and saved,
              f"steps 4-6 after a resume at step 3: max rel {worst:.2e} "
              f"({'bit for bit' if device == 'cpu' else '<= 1e-3'}); {len(saved)} histories "
              f"in the checkpoint")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=DEFAULT_FIXTURES)
    ap.add_argument("--target", default="cpu")
    e2e.add_half_args(ap)
    a = ap.parse_args()
    setup = e2e.halves(ap, a, "test_fp8_delayed.py")
    if isinstance(setup, int):
        return setup
    forgec, forge_train, replay = setup
    rep = Report()
    fdir = os.path.join(a.fixtures_dir, "gpt_adamw")
    with tempfile.TemporaryDirectory() as tmp:
        out = a.bundles or tmp
        os.makedirs(out, exist_ok=True)
        delayed = os.path.join(out, "gpt.fp8_delayed.forge")
        current = os.path.join(out, "gpt.fp8_current.forge")
        dp = os.path.join(out, "gpt.fp8_delayed_dp2.forge")
        ok = replay or (compile_bundle(rep, fdir, forgec, a.target, delayed, "delayed") and
                        compile_bundle(rep, fdir, forgec, a.target, current, "current") and
                        (a.device == "cuda" or
                         compile_bundle(rep, fdir, forgec, a.target, dp, "delayed", ranks=2)))
        if ok and not a.compile_only:
            ring = check_histories_and_ring(rep, fdir, forge_train, delayed, a.device, tmp)
            losses = check_losses(rep, fdir, forge_train, delayed, current, a.device, tmp)
            if losses is not None:
                check_resume(rep, fdir, forge_train, delayed, a.device, tmp, losses)
            if a.device == "cpu":  # two CPU ranks (one GPU cannot hold two NCCL ranks)
                ranks = check_histories_and_ring(rep, fdir, forge_train, dp, a.device, tmp,
                                                 tag="dp ", launch=["--nproc", "2", "--ckpt-format", "whole"])
                if ring is not None and ranks is not None:
                    worst = (float(np.max(np.abs(ranks - ring) / np.abs(ring)))
                             if ranks.shape == ring.shape else float("inf"))
                    rep.check("dp equals_one_process", worst <= DP_LOSS_TOL,
                              f"6 losses of 2 ranks x 2 samples vs 1 process x 4: max rel "
                              f"{worst:.2e} (<= {DP_LOSS_TOL:g})")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
