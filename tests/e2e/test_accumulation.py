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

Loop and unrolled forms (forgec --accumulate loop, the default, and --accumulate unroll): the
K=2 bundle must have the routine `accumulate` (forge-train --info) and its unrolled twin the
inputs x@0/x@1 and none; trained alike (no shuffle), their losses, step-1 gradients and final
parameters must be bit-identical (both sum (0 +) g0 + g1 in f32 in that order, then scale).
Checkpoints: the loop bundle trains 10 steps with a checkpoint, the unrolled one resumes from
it for 10 more; its losses of steps 11..20 must equal the loop's uninterrupted run bit for
bit (the accumulators are not in checkpoints: zero between steps).

Batch-size schedule (forgec --batch 8 --batch-schedule 16:5,32: 2 micro-batches a step for
steps 1..5, then 4): its losses of steps 1..5 must equal the fixed K=2 loop bundle's bit for
bit; a checkpoint after step 5 resumed by a fixed K=4 bundle (same global samples per step
as the schedule's largest) must continue with steps 6..10 equal to the schedule's own run bit
for bit (the sampler's position, the 1/K scaling and the first micro-batch's overwrite
follow K per step); `--epochs 2` must run 12 steps (epoch 0: 5 x 16 + 2 x 32 samples of 160,
the last 16 dropped; epoch 1: 5 x 32); forgec must refuse a size that is not a multiple of
--batch and --batch-schedule with --micro-batches, naming them.

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


def info(forge_train, bundle):
    _, _, out = e2e.run([forge_train, "--info", bundle], TIMEOUT_S)
    return out


def check_loop_vs_unrolled(rep, forge_train, opt, bundles, data, params, tmp):
    loop, unrolled = info(forge_train, bundles["k2"]), info(forge_train, bundles["k2u"])
    rep.check(f"{opt} loop bundle has the routine accumulate, x without @k",
              "accumulate:" in loop and "in  x f32[8," in loop and "x@0" not in loop,
              "forge-train --info lists: " + ", ".join(re.findall(r"^  (\w+):", loop, re.M)))
    rep.check(f"{opt} unrolled bundle has x@0, x@1 and no accumulate",
              "accumulate:" not in unrolled and "in  x@0" in unrolled and "in  x@1" in unrolled,
              "forge-train --info lists: " + ", ".join(re.findall(r"^  (\w+):", unrolled, re.M)))
    outs = {}
    for tag in ("k2", "k2u"):
        base = os.path.join(tmp, f"{opt}_{tag}_exact")
        outs[tag] = (base + ".jsonl", base + "_p.npz", base + "_g.npz")
        ok, log = run([forge_train, bundles[tag], "--data", data, "--no-shuffle",
                       "--steps", str(STEPS), "--threads", "1", "--metrics", outs[tag][0],
                       "--dump-params", outs[tag][1], "--dump-grads", outs[tag][2]])
        if not rep.check(f"{opt} {tag} exact run", ok, log or "ok"):
            return
    la, lb = read_losses(outs["k2"][0]), read_losses(outs["k2u"][0])
    same = (len(la) == STEPS and np.array([x[2] for x in la], np.float32).tobytes()
            == np.array([x[2] for x in lb], np.float32).tobytes())
    rep.check(f"{opt} loop == unrolled losses, bit for bit", same,
              f"{len(la)} steps; first: loop {la[0][1] if la else '-'}, "
              f"unrolled {lb[0][1] if lb else '-'}")
    for what, i in (("grads step 1", 2), ("params step 20", 1)):
        za, zb = np.load(outs["k2"][i]), np.load(outs["k2u"][i])
        differ = [n for n in params if n not in za.files or n not in zb.files
                  or za[n].tobytes() != zb[n].tobytes()]
        rep.check(f"{opt} loop == unrolled {what}, bit for bit", not differ,
                  f"differ: {differ}" if differ else f"{len(params)} tensors equal")
    # A checkpoint of the loop bundle resumes the unrolled one.
    ckpt = os.path.join(tmp, f"{opt}_ckpt")
    first = os.path.join(tmp, f"{opt}_first.jsonl")
    ok, log = run([forge_train, bundles["k2"], "--data", data, "--no-shuffle", "--steps", "10",
                   "--threads", "1", "--metrics", first, "--ckpt-dir", ckpt])
    if not rep.check(f"{opt} loop bundle 10 steps with a checkpoint", ok, log or "ok"):
        return
    ok, log = run([forge_train, bundles["k2u"], "--data", data, "--no-shuffle", "--steps",
                   str(STEPS), "--threads", "1", "--metrics", first, "--ckpt-dir", ckpt,
                   "--resume"])
    if not rep.check(f"{opt} unrolled bundle resumes the loop's checkpoint", ok, log or "ok"):
        return
    resumed = [x for x in read_losses(first) if x[0] > 10]
    full = [x for x in la if x[0] > 10]
    rep.check(f"{opt} resumed steps 11..{STEPS} == the loop's own, bit for bit",
              len(resumed) == STEPS - 10 and [x[2] for x in resumed] == [x[2] for x in full],
              f"{len(resumed)} steps; step 11: resumed {resumed[0][1] if resumed else '-'}, "
              f"uninterrupted {full[0][1] if full else '-'}")


def check_batch_schedule(rep, forgec, forge_train, d, m, data, tmp):
    model = os.path.join(d, "model.onnx")
    common = ["--target", "cpu", "--loss", "cross_entropy:logits,labels",
              "--optimizer", optimizer_spec(m["optimizer_hparams"])]
    bundles = {}
    for tag, extra in (("sched", ["--batch", "8", "--batch-schedule", "16:5,32"]),
                       ("k2", ["--batch", "8", "--micro-batches", "2"]),
                       ("k4", ["--batch", "8", "--micro-batches", "4"])):
        bundles[tag] = os.path.join(tmp, f"bs_{tag}.forge")
        ok, log = run([forgec, model, *common, *extra, "-o", bundles[tag]])
        if not rep.check(f"schedule: forgec {' '.join(extra)}", ok, log or "ok"):
            return
    for extra, want in ((["--batch-schedule", "16:5,36"], "36 is not a multiple of --batch 8"),
                        (["--batch-schedule", "16:5,32", "--micro-batches", "2"],
                         "drop --micro-batches")):
        rc, _, out = e2e.run([forgec, model, *common, "--batch", "8", *extra, "-o",
                              os.path.join(tmp, "bad.forge")], TIMEOUT_S)
        rep.check(f"schedule: forgec refuses {' '.join(extra)}", rc not in (0, None) and
                  want in out, e2e.tail(out, 1))
    metrics = {}
    for tag, steps in (("sched", STEPS), ("k2", 5)):
        metrics[tag] = os.path.join(tmp, f"bs_{tag}.jsonl")
        ok, log = run([forge_train, bundles[tag], "--data", data, "--no-shuffle", "--steps",
                       str(steps), "--threads", "1", "--metrics", metrics[tag]])
        if not rep.check(f"schedule: {tag} forge-train", ok, log or "ok"):
            return
    ls, l2 = read_losses(metrics["sched"]), read_losses(metrics["k2"])
    rep.check("schedule: steps 1..5 (2 micro-batches) == the K=2 bundle's, bit for bit",
              len(ls) == STEPS and [x[2] for x in ls[:5]] == [x[2] for x in l2],
              f"step 5: schedule {ls[4][1] if len(ls) > 4 else '-'}, "
              f"K=2 {l2[4][1] if len(l2) > 4 else '-'}")
    ckpt, resumed = os.path.join(tmp, "bs_ckpt"), os.path.join(tmp, "bs_resumed.jsonl")
    ok, log = run([forge_train, bundles["sched"], "--data", data, "--no-shuffle", "--steps",
                   "5", "--threads", "1", "--metrics", resumed, "--ckpt-dir", ckpt])
    ok = ok and run([forge_train, bundles["k4"], "--data", data, "--no-shuffle", "--steps",
                     str(STEPS), "--threads", "1", "--metrics", resumed, "--ckpt-dir", ckpt,
                     "--resume"])[0]
    if rep.check("schedule: 5 steps, then a K=4 bundle resumes the checkpoint", ok, log or "ok"):
        lr = [x for x in read_losses(resumed) if x[0] > 5]
        rep.check("schedule: steps 6..10 (4 micro-batches) == the resumed K=4 bundle's, "
                  "bit for bit", len(lr) == STEPS - 5 and
                  [x[2] for x in lr] == [x[2] for x in ls[5:]],
                  f"step 6: schedule {ls[5][1] if len(ls) > 5 else '-'}, "
                  f"K=4 {lr[0][1] if lr else '-'}")
    epochs = os.path.join(tmp, "bs_epochs.jsonl")
    ok, log = run([forge_train, bundles["sched"], "--data", data, "--no-shuffle", "--epochs",
                   "2", "--threads", "1", "--metrics", epochs])
    n = len(read_losses(epochs)) if ok else 0
    rep.check("schedule: --epochs 2 runs 12 steps (7 in epoch 0, 5 in epoch 1)", ok and n == 12,
              log or f"{n} steps")


def check_channels_last_loop(rep, forgec, forge_train, fixtures, tmp):
    """The cnn fixture (batch norms) in the loop, channels-last: forge-assign-layout expands
    its batch norms, so their running statistics are pointwise updates that no sum depends on;
    they belong to the micro-batch routine (each micro-batch updates them, as the NCHW op
    does). Trained 4 steps beside the NCHW loop bundle: losses and every parameter and running
    statistic within TOL (it once failed to compile: forge-split-accumulation found the
    optimizer's region reading the micro-batch's statistics)."""
    d = os.path.join(fixtures, "cnn_adamw")
    runs = {}
    for layout in ("nhwc", "nchw"):
        bundle = os.path.join(tmp, f"cnn_{layout}.forge")
        ok, why = run([forgec, os.path.join(d, "model.onnx"), "--target", "cpu", "--batch", "8",
                       "--micro-batches", "2", "--layout", layout, "--loss",
                       "cross_entropy:logits,labels", "--optimizer", "adamw:lr=1e-3", "-o",
                       bundle])
        if ok:
            metrics, params = (os.path.join(tmp, f"cnn_{layout}.{x}") for x in ("jsonl", "npz"))
            ok, why = run([forge_train, bundle, "--data", os.path.join(d, "batches.npz"),
                           "--no-shuffle", "--steps", "4", "--threads", "1", "--device", "cpu",
                           "--metrics", metrics, "--dump-params", params])
        runs[layout] = (metrics, params) if ok else why
    if not rep.check("cnn loop channels-last: compiles and trains", all(
            isinstance(r, tuple) for r in runs.values()), str(runs)):
        return
    (ma, pa), (mb, pb) = runs["nhwc"], runs["nchw"]
    la, lb = [x[2] for x in read_losses(ma)], [x[2] for x in read_losses(mb)]
    za, zb = np.load(pa), np.load(pb)
    worst = max(rel(za[n], zb[n]) for n in zb.files if not n.endswith("grad_accum"))
    running = [n for n in zb.files if "running" in n]
    err = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    rep.check("cnn loop channels-last == NCHW (losses, parameters, running statistics)",
              len(la) == len(lb) == 4 and err <= TOL and worst <= TOL and running and
              all(n in za.files for n in running),
              f"loss max rel {err:.1e}, tensors max rel {worst:.1e} ({len(running)} running "
              f"statistics); bound {TOL:g}")


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
            for tag, batch, micro, extra in (("k2", 8, 2, []), ("k1", 16, 1, []),
                                             ("k2u", 8, 2, ["--accumulate", "unroll"])):
                bundles[tag] = os.path.join(tmp, f"{opt}_{tag}.forge")
                ok, log = run([forgec, os.path.join(d, "model.onnx"), "--target", "cpu",
                               "--batch", str(batch), "--micro-batches", str(micro), *extra,
                               "--loss", "cross_entropy:logits,labels",
                               "--optimizer", optimizer_spec(m["optimizer_hparams"]),
                               "--expose-gradients", "-o", bundles[tag]])
                if not rep.check(f"{opt} forgec --batch {batch} --micro-batches {micro} {' '.join(extra)}".rstrip(), ok,
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
            check_loop_vs_unrolled(rep, forge_train, opt, bundles, data, params, tmp)
            if opt == "adamw":
                check_batch_schedule(rep, forgec, forge_train, d, m, data, tmp)

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
        check_channels_last_loop(rep, forgec, forge_train, a.fixtures_dir, tmp)
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
