#!/usr/bin/env python3
"""Training parity with PyTorch on the fixtures in tests/fixtures/ (ctest e2e_parity).

For every fixture tests/fixtures/<model>_<optimizer>/ (format: tests/e2e/README.md):
  forgec model.onnx --target cpu --batch B --loss cross_entropy:logits,labels \
         --optimizer <from manifest.json> --expose-gradients -o T/m.forge
  forge-train T/m.forge --data batches.npz --no-shuffle --steps 20 --threads 1 \
         --metrics T/metrics.jsonl --dump-params T/params20.npz --dump-grads T/grads1.npz
and the forward alone (the CNN's BatchNormalization has training_mode=1: batch statistics):
  forgec model.onnx --inference-only --target cpu --batch B -o T/fwd.forge
  forge-train T/fwd.forge --forward --inputs T/batch1.npz --outputs T/out.npz
then compares with PyTorch's numbers. Tolerances (TOLERANCES below; every manifest.json must
state the same ones, so regenerating the fixtures cannot loosen them silently). Everything is
fp32 on both sides; the bounds leave two orders of magnitude above fp32 rounding (the
fixtures record fp32-vs-fp64 PyTorch at <= 1.1e-6):
  losses        per step |forge - torch| / |torch|            <= 1e-4   (metrics.jsonl "loss")
  grads_step1   per parameter ||forge - torch|| / ||torch||    <= 1e-4   (--dump-grads)
  params_step20 per parameter ||forge - torch|| / ||torch||    <= 1e-4   (--dump-params)
                and, advisory unless --strict-delta, the update itself:
                ||(forge - p0) - (torch - p0)|| / ||torch - p0|| <= 1e-3
  running stats (cnn) against buffers_step20_torch.npz (the model's producer is PyTorch, so
                forgec updates running_var with the unbiased batch variance), and with
                --batchnorm-running-var biased against buffers_step20_onnx.npz (ONNX's rule);
                the two semantics differ by ~2e-3, and each run must match its own
  logits_step1  ||forge - torch|| / ||torch||                  <= 1e-4
Norms are L2 over the whole tensor, computed in float64.

Formats used:
  metrics.jsonl  one JSON object per step with "step" (1-based) and "loss"
  params20.npz   every parameter and state tensor by name (ONNX initializer names; also the
                 optimizer moments NAME.exp_avg/.exp_avg_sq/.momentum, ignored here)
  grads1.npz     d loss / d parameter of step 1 (forge.grad.NAME outputs), keyed by NAME

Usage:
  test_parity.py [--bin-dir DIR | --forgec F --forge-train F] [--fixtures-dir DIR]
                 [--target cpu|cuda:sm_90] [--device cpu|cuda] [--bundles DIR [--compile-only]]
                 [--self-check] [--keep] [--strict-delta] [FIXTURE ...]
--target/--device run the same checks on a GPU (tests/gpu), or a CUDA target's bundles on the
CPU (ctest e2e_parity_cuda_bundles: fp32 attention unfused, and the gpt fixtures' --recompute
attention variant, which a CUDA target alone has). Where forgec cannot run (the GPU
machines have no MLIR), --compile-only --bundles DIR compiles every bundle into DIR here, and
--bundles DIR alone later runs forge-train on those bundles without forgec.
--self-check only validates the fixture files (numpy only; no Forge binaries needed).
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import Report, optimizer_spec, rel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
TIMEOUT_S = 600

# The bounds this test applies (see the docstring); manifest.json must agree.
# forge-chunk-cross-entropy on the gpt fixtures: their logits [64, 64] f32 (16 KiB) in 3
# chunks of 22, 22 and 20 rows.
CHUNK_BYTES = 6000
CHUNKED = ("--loss-chunk-bytes", str(CHUNK_BYTES))
# forge-assign-layout on the conv fixtures: channels-last convolutions, batch norms expanded
# into column sums (the same tolerances: a reordering of fp32 sums).
NHWC = ("--layout", "nhwc")
# forge-rematerialize on the gpt fixtures: attention probabilities recomputed in the backward
# pass (bit-identical ops). For CUDA targets only: fp32 attention stays unfused there, while
# the CPU target forms one attention op (nothing to recompute: forgec remarks it).
RECOMPUTE = ("--recompute", "attention")
TOLERANCES = {
    "losses_rel": 1e-4,             # per step, |a-b|/|b|
    "logits_step1_rel": 1e-4,       # ||a-b||/||b||
    "grads_step1_rel": 1e-4,        # per parameter, ||a-b||/||b||
    "params_step20_rel": 1e-4,      # per parameter, ||a-b||/||b||
    "params_step20_delta_rel": 1e-3,  # advisory (--strict-delta): per parameter, on p - p0
    "buffers_step20_rel": 1e-4,     # per BN running statistic, ||a-b||/||b||
}


# --------------------------------------------------------------------------- helpers

def run(cmd):
    """(ok, seconds, last lines of the output, or why it failed)."""
    rc, t, out = e2e.run(cmd, TIMEOUT_S)
    return rc == 0, t, (e2e.tail(out, 6) if rc == 0 else e2e.failure(rc, out, 6))


def compare_arrays(rep, label, got, ref, tol, init=None, delta_tol=None, strict_delta=False):
    """Per-array relative L2 error; every key of ref must be in got with the same shape."""
    problems, worst, worst_name, dworst, dworst_name = [], 0.0, None, 0.0, None
    for k in ref.files:
        if k not in got.files:
            problems.append(f"{k} missing")
            continue
        g, r = got[k], ref[k]
        if g.shape != r.shape:
            problems.append(f"{k}: shape {list(g.shape)} != {list(r.shape)}")
            continue
        if not np.all(np.isfinite(g)):
            problems.append(f"{k}: non-finite values")
            continue
        e = rel(g, r)
        if e > worst:
            worst, worst_name = e, k
        if e > tol:
            problems.append(f"{k}: rel {e:.2e} > {tol:g}")
        if init is not None and k in init.files:
            d = rel(g - init[k], r - init[k])
            if d > dworst:
                dworst, dworst_name = d, k
            if strict_delta and d > delta_tol:
                problems.append(f"{k}: update rel {d:.2e} > {delta_tol:g}")
    msg = f"max rel {worst:.2e} ({worst_name})"
    if init is not None:
        msg += f", max update rel {dworst:.2e} ({dworst_name})"
        if delta_tol is not None and dworst > delta_tol and not strict_delta:
            msg += f" [advisory: > {delta_tol:g}]"
    extra = sorted(set(got.files) - set(ref.files))
    if extra:
        msg += f"; also got {extra[:6]}{'...' if len(extra) > 6 else ''}"
    return rep.check(label, not problems, "; ".join(problems[:8] + [msg]))


# --------------------------------------------------------------------------- fixture checks

def load_fixture(d):
    with open(os.path.join(d, "manifest.json")) as f:
        return json.load(f)


def self_check(rep, name, d, m):
    """The fixture is complete and consistent with its manifest (numpy only)."""
    problems = []
    for fn in m["files"]:
        if not os.path.exists(os.path.join(d, fn)):
            problems.append(f"{fn} missing")
    if problems:
        return rep.check(f"{name} files", False, "; ".join(problems))
    b, steps = m["batch_size"], m["steps"]
    data = np.load(os.path.join(d, "batches.npz"))
    for arr, info in m["data"]["arrays"].items():
        if arr not in data.files or list(data[arr].shape) != info["shape"] \
                or str(data[arr].dtype) != info["dtype"] or data[arr].shape[0] != b * steps:
            problems.append(f"batches.npz:{arr} does not match the manifest")
    losses = np.load(os.path.join(d, "losses.npy"))
    if losses.shape != (steps,) or losses.dtype != np.float64 or not np.all(np.isfinite(losses)):
        problems.append(f"losses.npy: {losses.dtype} {losses.shape}")
    params = set(m["parameters"])
    for fn in ("init_params.npz", "grads_step1.npz", "params_step20.npz"):
        z = np.load(os.path.join(d, fn))
        if set(z.files) != params:
            problems.append(f"{fn}: keys {sorted(set(z.files) ^ params)} differ from the manifest")
        shapes = {e["name"]: e["shape"] for e in m["initializers"]}
        for k in z.files:
            if list(z[k].shape) != shapes.get(k) or z[k].dtype != np.float32:
                problems.append(f"{fn}:{k} {z[k].dtype} {list(z[k].shape)}")
    for fn in ("buffers_step20_torch.npz", "buffers_step20_onnx.npz"):
        if fn in m["files"]:
            z = np.load(os.path.join(d, fn))
            if set(z.files) != set(m["state_buffers"]):
                problems.append(f"{fn}: keys differ from state_buffers")
    for k, v in TOLERANCES.items():
        if m.get("tolerances", {}).get(k) != v:
            problems.append(f"manifest tolerance {k} = {m.get('tolerances', {}).get(k)}, this "
                            f"test applies {v}")
    return rep.check(f"{name} fixture", not problems,
                     "; ".join(problems) or f"{len(params)} parameters, {steps} steps of {b}")


# --------------------------------------------------------------------------- forge

class Setup:
    """Where bundles come from and where they run (see the usage)."""

    def __init__(self, forgec, forge_train, target="cpu", device="cpu", bundles=None,
                 compile_only=False):
        self.forgec, self.forge_train = forgec, forge_train
        self.target, self.device = target, device
        self.bundles, self.compile_only = bundles, compile_only

    def bundle_path(self, tmp, fixture, name):
        return os.path.join(tmp if not self.bundles else os.path.join(self.bundles, fixture),
                            name)

    def compile(self, rep, label, name, fixture, tmp, args):
        """The bundle `fixture`/`name`: compiled by forgec into tmp (or --bundles), or, with
        --bundles and no --compile-only, the one compiled earlier. None on failure."""
        bundle = self.bundle_path(tmp, fixture, name)
        os.makedirs(os.path.dirname(bundle), exist_ok=True)
        if self.bundles and not self.compile_only:
            return bundle if rep.check(label, os.path.exists(bundle), f"prebuilt {bundle}") \
                else None
        ok, t, log = run([self.forgec] + args + ["--target", self.target, "-o", bundle])
        return bundle if rep.check(label, ok, f"{t:.1f}s {log}") else None

    def train(self, args):
        return run([self.forge_train] + args + ["--device", self.device])


def run_forge(rep, name, d, m, tmp, setup, variant="", extra=()):
    """Compiles (with the gradients exposed) and trains 20 steps in file order on one thread.
    Returns the paths of (metrics, params20, grads1), None on failure."""
    data = os.path.join(d, "batches.npz")
    bundle = setup.compile(rep, f"{name}{variant} forgec", f"m{variant}.forge", name, tmp,
                           [os.path.join(d, "model.onnx"), "--batch", str(m["batch_size"]),
                            "--loss", "cross_entropy:logits,labels",
                            "--optimizer", optimizer_spec(m["optimizer_hparams"]),
                            "--expose-gradients", *extra])
    if bundle is None or setup.compile_only:
        return None
    metrics = os.path.join(tmp, f"metrics{variant}.jsonl")
    params20 = os.path.join(tmp, f"params20{variant}.npz")
    grads1 = os.path.join(tmp, f"grads1{variant}.npz")
    ok, t, log = setup.train([bundle, "--data", data, "--no-shuffle",
                              "--steps", str(m["steps"]), "--threads", "1", "--metrics", metrics,
                              "--dump-params", params20, "--dump-grads", grads1])
    if not rep.check(f"{name} forge-train --steps {m['steps']}", ok, f"{t:.1f}s {log}"):
        return None
    if setup.device == "cuda":
        warning = e2e.graph_capture_warning(log)
        rep.check(f"{name} CUDA graph captured", not warning, warning)
    return metrics, params20, grads1


def read_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "loss" in rec and "step" in rec:
                    losses[int(rec["step"])] = float(rec["loss"])
    return losses


def variants(m, setup):
    """(bundle suffix, forgec flags, label, why the bundle would equal m.forge) of the passes
    a fixture also runs with: the loss head in row chunks (forge-chunk-cross-entropy; forgec
    remarks a head it leaves), attention probabilities recomputed (forge-rematerialize; CUDA
    targets), the conv nets channels-last (forge-assign-layout)."""
    out = []
    if m["model"] == "gpt":
        out.append(("_chunked", CHUNKED, f"--loss-chunk-bytes {CHUNK_BYTES}",
                    "the loss head was not chunked"))
        if setup.target.startswith("cuda"):
            out.append(("_recompute", RECOMPUTE, "--recompute attention",
                        "nothing was recomputed"))
    if m["state_buffers"]:
        out.append(("_nhwc", NHWC, "--layout nhwc", "the layout pass changed nothing"))
    return out


def check_fixture(rep, name, d, tmp, setup, strict_delta):
    m = load_fixture(d)
    if not self_check(rep, name, d, m):
        return
    check_forward(rep, name, d, m, tmp, setup)
    out = run_forge(rep, name, d, m, tmp, setup)
    if out is None:
        if setup.compile_only and m["state_buffers"]:  # the biased variant's bundle too
            run_forge(rep, name, d, m, tmp, setup, "_biased", ("--batchnorm-running-var", "biased"))
        for variant, extra, _, _ in variants(m, setup) if setup.compile_only else ():
            run_forge(rep, name, d, m, tmp, setup, variant, extra)
        return
    compare_run(rep, name, d, m, out, strict_delta)
    for variant, extra, label, why_same in variants(m, setup):
        # A pass's variant against the same PyTorch numbers; its bundle must differ from
        # m.forge (the pass ran).
        got = run_forge(rep, name, d, m, tmp, setup, variant, extra)
        if got is not None:
            bundles = [setup.bundle_path(tmp, name, b) for b in ("m.forge", f"m{variant}.forge")]
            same = [open(b, "rb").read() for b in bundles]
            rep.check(f"{name} {label} bundle differs", same[0] != same[1],
                      "differs from m.forge" if same[0] != same[1] else
                      f"same bytes as m.forge: {why_same}")
            compare_run(rep, f"{name} {label}", d, m, got, strict_delta)
    if m["state_buffers"]:  # ONNX's biased rule on request
        out = run_forge(rep, name, d, m, tmp, setup, "_biased",
                        ("--batchnorm-running-var", "biased"))
        if out is not None and os.path.exists(out[1]):
            check_running_stats(rep, f"{name} --batchnorm-running-var biased", d, m,
                                np.load(out[1]), "onnx")


def compare_run(rep, name, d, m, out, strict_delta):
    """One run's losses, step-1 gradients and step-20 parameters against PyTorch's."""
    tol = TOLERANCES
    metrics, params20, grads1 = out

    ref_losses = np.load(os.path.join(d, "losses.npy"))
    got = read_losses(metrics) if os.path.exists(metrics) else {}
    missing = [k for k in range(1, m["steps"] + 1) if k not in got]
    if missing:
        rep.check(f"{name} losses", False, f"metrics.jsonl lacks steps {missing[:5]}...")
    else:
        errs = [abs(got[k] - ref_losses[k - 1]) / abs(ref_losses[k - 1])
                for k in range(1, m["steps"] + 1)]
        worst = int(np.argmax(errs))
        rep.check(f"{name} losses", max(errs) <= tol["losses_rel"],
                  f"max rel {max(errs):.2e} at step {worst + 1} (forge {got[worst + 1]:.6f}, "
                  f"torch {ref_losses[worst]:.6f}); step 1 rel {errs[0]:.2e}")

    if not os.path.exists(grads1):
        rep.check(f"{name} grads_step1", False, "--dump-grads wrote no file")
    else:
        compare_arrays(rep, f"{name} grads_step1", np.load(grads1),
                       np.load(os.path.join(d, "grads_step1.npz")), tol["grads_step1_rel"])

    if not os.path.exists(params20):
        rep.check(f"{name} params_step20", False, "--dump-params wrote no file")
    else:
        got_p = np.load(params20)
        compare_arrays(rep, f"{name} params_step20", got_p,
                       np.load(os.path.join(d, "params_step20.npz")), tol["params_step20_rel"],
                       init=np.load(os.path.join(d, "init_params.npz")),
                       delta_tol=tol["params_step20_delta_rel"], strict_delta=strict_delta)
        if m["state_buffers"]:
            check_running_stats(rep, name, d, m, got_p, "torch")


def check_running_stats(rep, name, d, m, got_p, expected):
    """BatchNorm running statistics after 20 steps against the fixture of the `expected`
    semantics ("torch": unbiased running variance, "onnx": biased); the other must not match
    better (they differ by ~2e-3)."""
    have = [k for k in m["state_buffers"] if k in got_p.files]
    if not have:
        rep.check(f"{name} running stats", False,
                  f"--dump-params wrote none of {m['state_buffers']}")
        return
    res = {}
    for sem in ("onnx", "torch"):
        ref = np.load(os.path.join(d, f"buffers_step20_{sem}.npz"))
        res[sem] = max(rel(got_p[k], ref[k]) for k in have)
    other = "torch" if expected == "onnx" else "onnx"
    rep.check(f"{name} running stats ({expected} semantics)",
              res[expected] <= TOLERANCES["buffers_step20_rel"] and res[expected] < res[other],
              f"rel {res[expected]:.2e} (vs the {other} semantics {res[other]:.2e})")


def check_forward(rep, name, d, m, tmp, setup):
    """The forward alone on batch 1 with the initial weights (--inference-only). The CNN's
    BatchNormalization has training_mode=1, so it uses batch statistics here too."""
    tol = TOLERANCES
    fwd = setup.compile(rep, f"{name} forgec --inference-only", "fwd.forge", name, tmp,
                        [os.path.join(d, "model.onnx"), "--inference-only",
                         "--batch", str(m["batch_size"])])
    if fwd is not None and not setup.compile_only:
        inp = m["onnx"]["inputs"][0]
        data = np.load(os.path.join(d, "batches.npz"))
        b1 = os.path.join(tmp, "batch1.npz")
        np.savez(b1, **{inp: data[inp][:m["batch_size"]]})
        outp = os.path.join(tmp, "out.npz")
        ok, _, log = setup.train([fwd, "--forward", "--inputs", b1, "--outputs", outp])
        if rep.check(f"{name} forward", ok, log) and os.path.exists(outp):
            e = rel(np.load(outp)["logits"], np.load(os.path.join(d, "logits_step1.npy")))
            rep.check(f"{name} logits_step1", e <= tol["logits_step1_rel"], f"rel {e:.2e}")


def main():
    ap = argparse.ArgumentParser(description="Forge e2e: training parity with PyTorch fixtures")
    ap.add_argument("names", nargs="*", help="fixtures (default: all in --fixtures-dir)")
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=DEFAULT_FIXTURES)
    ap.add_argument("--self-check", action="store_true", help="only validate the fixture files")
    ap.add_argument("--strict-delta", action="store_true",
                    help="fail (not just report) when the update-relative error exceeds its bound")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--target", default="cpu", help="forgec --target")
    e2e.add_half_args(ap)
    a = ap.parse_args()
    names = a.names or sorted(n for n in os.listdir(a.fixtures_dir)
                              if os.path.exists(os.path.join(a.fixtures_dir, n, "manifest.json")))
    rep = Report()
    if a.self_check:
        for n in names:
            d = os.path.join(a.fixtures_dir, n)
            self_check(rep, n, d, load_fixture(d))
    else:
        halves = e2e.halves(ap, a, "test_parity")  # forgec None: a run half alone
        if isinstance(halves, int):
            return halves
        forgec, forge_train, _ = halves
        setup = Setup(forgec, forge_train, a.target, a.device, a.bundles, a.compile_only)
        tmp_root = tempfile.mkdtemp(prefix="forge-parity-")
        try:
            for n in names:
                tmp = os.path.join(tmp_root, n)
                os.makedirs(tmp)
                try:
                    check_fixture(rep, n, os.path.join(a.fixtures_dir, n), tmp, setup,
                                  a.strict_delta)
                except Exception as e:  # a broken file fails this fixture, not the run
                    rep.check(n, False, f"{type(e).__name__}: {e}")
        finally:
            if a.keep:
                print(f"kept {tmp_root}")
            else:
                shutil.rmtree(tmp_root, ignore_errors=True)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
