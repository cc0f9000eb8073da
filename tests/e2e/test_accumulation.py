#!/usr/bin/env python3
"""Gradient accumulation and run-to-run determinism (ctest e2e_accumulation).

Accumulation: the mlp fixture's model (tests/fixtures/mlp_*/model.onnx) is compiled twice per
optimizer (sgd_momentum and adamw, hyperparameters from the fixtures' manifest.json):
  forgec model.onnx --batch 8  --micro-batches 2 ... --expose-gradients -o T/k2.forge
  forgec model.onnx --batch 16 --micro-batches 1 ... --expose-gradients -o T/k1.forge
and both train 20 steps on the fixture's batches.npz (160 samples: 10 steps of 16 samples per
epoch, so the run crosses an epoch boundary) with --no-shuffle --threads 1. Step s of both
bundles consumes the same 16 samples (docs/forge-train.md: micro-batch k of the K=2 bundle
gets samples [8k, 8k+8) of the step as NAME@k), so the results may differ by fp32 summation
order only. Required, relative, per step / per tensor (norms L2 over the tensor, float64):
  losses            |k2 - k1| / |k1|                  <= 1e-5   (metrics.jsonl "loss")
  grads of step 1   ||k2 - k1|| / ||k1||              <= 1e-5   (--dump-grads)
  final parameters  ||k2 - k1|| / ||k1||              <= 1e-5   (--dump-params; parameters,
                                                                  not optimizer moments)
and the same with shuffling on and the same --seed for both bundles (both take 16 samples per
step, so the seeded permutation, a function of seed and epoch, is the same).

Determinism: the K=2 sgd bundle trains 25 steps with shuffling, --seed 7, --threads 2, twice:
the "loss" values of metrics.jsonl must be identical as JSON text and as floats (bit for
bit); --seed 8 must give a different sequence (the seed is used).

Usage:
  test_accumulation.py [--bin-dir DIR | --forgec F --forge-train F] [--fixtures-dir DIR]
                       [--keep]
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
Needs numpy only.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import Report, optimizer_spec, rel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
TIMEOUT_S = 300
TOL = 1e-5  # fp32 summation-order differences only
STEPS = 20
OPTIMIZERS = ("sgd_momentum", "adamw")


def run(cmd):
    """(ok, '' or why it failed)."""
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    return rc == 0, ("" if rc == 0 else e2e.failure(rc, out))


LOSS_RE = re.compile(r'"loss": ([^,}]*)')


def read_losses(path):
    """[(step, loss text as written, loss as float)] in file order."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out.append((int(rec["step"]), LOSS_RE.search(line).group(1), rec["loss"]))
    return out


def compare_runs(rep, label, a, b, params):
    """a, b: (metrics, params npz, grads npz) of the K=2 and K=1 runs."""
    la, lb = read_losses(a[0]), read_losses(b[0])
    steps = list(range(1, STEPS + 1))
    if [s for s, _, _ in la] != steps or [s for s, _, _ in lb] != steps:
        rep.check(f"{label} losses", False, "metrics.jsonl does not have steps 1..20")
    else:
        errs = [abs(x[2] - y[2]) / abs(y[2]) for x, y in zip(la, lb)]
        k = int(np.argmax(errs))
        rep.check(f"{label} losses", max(errs) <= TOL,
                  f"max rel {max(errs):.2e} at step {k + 1} (K=2 {la[k][2]:.7f}, "
                  f"K=1 {lb[k][2]:.7f}); bound {TOL:g}")
    for what, ia, names in (("grads step 1", 2, params), ("params step 20", 1, params)):
        za, zb = np.load(a[ia]), np.load(b[ia])
        problems, worst, worst_name = [], 0.0, None
        for n in names:
            if n not in za.files or n not in zb.files:
                problems.append(f"{n} missing")
                continue
            e = rel(za[n], zb[n])
            if e > worst:
                worst, worst_name = e, n
            if not e <= TOL:
                problems.append(f"{n}: rel {e:.2e}")
        rep.check(f"{label} {what}", not problems,
                  "; ".join(problems + [f"max rel {worst:.2e} ({worst_name}); bound {TOL:g}"]))


def main():
    ap = argparse.ArgumentParser(description="Forge e2e: micro-batch accumulation == one large "
                                             "batch; same seed => identical losses")
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=DEFAULT_FIXTURES)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_accumulation")
    if not tools:
        return 2
    forgec, forge_train = tools

    rep = Report()
    tmp = tempfile.mkdtemp(prefix="forge-accum-")
    try:
        k2_sgd = None
        for opt in OPTIMIZERS:
            d = os.path.join(a.fixtures_dir, f"mlp_{opt}")
            with open(os.path.join(d, "manifest.json")) as f:
                m = json.load(f)
            params = m["parameters"]
            data = os.path.join(d, "batches.npz")
            bundles = {}
            for tag, batch, micro in (("k2", 8, 2), ("k1", 16, 1)):
                bundles[tag] = os.path.join(tmp, f"{opt}_{tag}.forge")
                ok, log = run([forgec, os.path.join(d, "model.onnx"), "--target", "cpu",
                               "--batch", str(batch), "--micro-batches", str(micro),
                               "--loss", "cross_entropy:logits,labels",
                               "--optimizer", optimizer_spec(m["optimizer_hparams"]),
                               "--expose-gradients", "-o", bundles[tag]])
                if not rep.check(f"{opt} forgec --batch {batch} --micro-batches {micro}", ok,
                                 log or "ok"):
                    bundles = None
                    break
            if not bundles:
                continue
            if opt == "sgd_momentum":
                k2_sgd = bundles["k2"]
            for order, flags in (("no-shuffle", ["--no-shuffle"]),
                                 ("shuffle seed 5", ["--seed", "5"])):
                outs = {}
                for tag in ("k2", "k1"):
                    base = os.path.join(tmp, f"{opt}_{tag}_{order.replace(' ', '_')}")
                    outs[tag] = (base + ".jsonl", base + "_p.npz", base + "_g.npz")
                    ok, log = run([forge_train, bundles[tag], "--data", data, *flags,
                                   "--steps", str(STEPS), "--threads", "1",
                                   "--metrics", outs[tag][0], "--dump-params", outs[tag][1],
                                   "--dump-grads", outs[tag][2]])
                    if not rep.check(f"{opt} {tag} {order} forge-train", ok, log or "ok"):
                        outs = None
                        break
                if outs:
                    compare_runs(rep, f"{opt} {order} K=2x8 vs K=1x16", outs["k2"], outs["k1"],
                                 params)

        # Same seed, same thread count => bit-identical losses; another seed differs.
        if k2_sgd:
            data = os.path.join(a.fixtures_dir, "mlp_sgd_momentum", "batches.npz")
            seqs = {}
            for tag, seed in (("a", 7), ("b", 7), ("c", 8)):
                path = os.path.join(tmp, f"det_{tag}.jsonl")
                ok, log = run([forge_train, k2_sgd, "--data", data, "--seed", str(seed),
                               "--steps", "25", "--threads", "2", "--metrics", path])
                if not rep.check(f"determinism run {tag} (--seed {seed})", ok, log or "ok"):
                    break
                seqs[tag] = read_losses(path)
            if len(seqs) == 3:
                sa, sb, sc = seqs["a"], seqs["b"], seqs["c"]
                same_text = [x[1] for x in sa] == [x[1] for x in sb]
                same_bits = (np.array([x[2] for x in sa], np.float32).tobytes()
                             == np.array([x[2] for x in sb], np.float32).tobytes())
                diffs = [s for (s, _, x), (_, _, y) in zip(sa, sb) if x != y]
                rep.check("same seed => identical losses", len(sa) == 25 and same_text
                          and same_bits,
                          f"25 steps, JSON text equal: {same_text}, float32 bits equal: "
                          f"{same_bits}" + (f"; differ at steps {diffs[:5]}" if diffs else ""))
                rep.check("another seed => other losses",
                          [x[2] for x in sa] != [x[2] for x in sc],
                          f"--seed 7 step 1 loss {sa[0][1]}, --seed 8 {sc[0][1]}")
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
