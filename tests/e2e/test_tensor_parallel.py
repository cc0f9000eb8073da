#!/usr/bin/env python3
"""Tensor parallelism on CPU ranks (forgec --tp T [--dp D], forge-train --nproc D*T).

For each case the fixture's model is compiled twice:
  forgec model.onnx --batch B --tp T [--dp D] -o T/tp.forge    (per data-parallel rank: B)
  forgec model.onnx --batch D*B               -o T/one.forge   (one process)
and trained 20 steps from the fixture's batches with the same seed: the ranks' loss
trajectory (rank 0's metrics) equals the single process's within 1e-5 relative, and so do
the parameters rank 0 dumps (gathered whole from the ranks' slices). The ranks of one
tensor-parallel group read the same batch; the D groups take the global batch's shares.

Cases: mlp_adamw T=2 (with gradient clipping: the norm sums the slices' squares over the
group); mlp_adamw D=2 x T=2 (four ranks), and the same with ZeRO-1 (--zero 1: the optimizer
state of the parameters left whole by --tp split over the D ranks); gpt_adamw T=2 (each
block's MLP, PyTorch Linears imported as MatMul of a transposed weight, split over 2 ranks,
and its vocabulary: the tied embedding's rows and the logits' classes, the cross-entropy
computed on the split logits; the dump shows the logits output as this rank's 32 of 64
classes; with label smoothing, and with ignore=N beside it); cnn_adamw T=2 (nothing but its
classifier head to split: its 10 classes).
Checkpoints hold whole tensors: the T=2 run's step-10 checkpoint resumes in one process
with the unsplit bundle, and steps 11-20 match. Errors: a --tp bundle without a group
names --tp and --nproc; a model with nothing to split (the cnn with an mse loss: no pair and
no classes) is refused by forgec.

Usage:
  test_tensor_parallel.py [--bin-dir DIR | --forgec F --forge-train T] [--fixtures-dir DIR]
"""
import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from test_data_parallel import compile_, train, worst_rel

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20
TOL = 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=os.path.join(HERE, "..", "fixtures"))
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_tensor_parallel")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    # (fixture, tensor-parallel size, data-parallel size, batch per data-parallel rank,
    # flags of both bundles, flags of the partitioned one only)
    cases = [("mlp_adamw", 2, 1, 8, ["--clip-grad-norm", "0.5"], []),
             ("mlp_adamw", 2, 2, 4, [], []), ("mlp_adamw", 2, 2, 4, [], ["--zero", "1"]),
             ("gpt_adamw", 2, 1, 4, [], []), ("cnn_adamw", 2, 1, 4, [], [])]
    t2_run = None  # (checkpoint directory, losses) of the mlp T=2 run
    with tempfile.TemporaryDirectory(prefix="forge-tp-") as tmp:
        for fixture_name, t, d, b, flags, own in cases:
            fixture = os.path.join(a.fixtures_dir, fixture_name)
            data = os.path.join(fixture, "batches.npz")
            tag = f"{fixture_name} --tp {t}" + (f" --dp {d}" if d > 1 else "") + \
                (" " + " ".join(own) if own else "")
            z = ("z" if own else "") + fixture_name[:3]
            tp, one = (os.path.join(tmp, f"tp{t}dp{d}{z}_{x}.forge") for x in ("tp", "one"))
            extra = ["--tp", str(t)] + (["--dp", str(d)] if d > 1 else []) + flags + own
            rc1, log1 = compile_(forgec, fixture, tp, b, extra)
            rc2, log2 = compile_(forgec, fixture, one, d * b, flags)
            if not rep.check(f"{tag}: forgec", rc1 == 0 and rc2 == 0,
                             e2e.failure(rc1, log1) if rc1 else e2e.failure(rc2, log2)):
                continue
            # Each rank holds less of the parameters: the split ones by 1/T (gpt: the MLPs and
            # the attentions' q/k/v and output projections of both blocks).
            pb = []
            for bundle in (tp, one):
                _, _, info = e2e.run([forge_train, "--info", bundle], 60)
                m = re.search(r"(\d+) parameter \((\d+) bytes\)", info)
                pb.append(int(m.group(2)) if m else -1)
            rep.check(f"{tag}: parameters split", 0 < pb[0] < pb[1],
                      f"{pb[0]} bytes per rank vs {pb[1]} whole")
            if fixture_name == "gpt_adamw":  # the vocabulary: the logits are this rank's classes
                dump = os.path.join(tmp, "gpt-dump")
                rc, log = compile_(forgec, fixture, os.path.join(tmp, "gptdump.forge"), b,
                                   extra + ["--dump-dir", dump])
                names = sorted(os.listdir(dump)) if os.path.isdir(dump) else []
                shard = [n for n in names if n.endswith("forge-shard-tensor-parallel.mlir")]
                text = open(os.path.join(dump, shard[0])).read() if shard else ""
                rep.check(f"{tag}: the vocabulary is split (logits: 32 of 64 classes)",
                          rc == 0 and f"tensor<{b}x16x32xf32> {{forge.name = \"logits\", "
                          "forge.shard = {axis = 2 : i64, group = \"tp\", size = 2 : i64}}" in text
                          and "forge.shard %0 {axis = 0 : i64, group = \"tp\", size = 2 : i64} : "
                          "(tensor<64x32xf32>) -> tensor<32x32xf32>" in text,
                          e2e.failure(rc, log) if rc else str(shard))
            ckpt = os.path.join(tmp, f"ckpt{t}{d}{z}")
            resume = d == 1 and fixture_name == "mlp_adamw"
            exported = os.path.join(tmp, f"tp{t}{d}{z}.onnx")
            rc, log, losses, params = train(
                forge_train, tp, data, tmp, f"tp{t}{d}{z}",
                ["--nproc", str(t * d), "--steps", str(STEPS)] +
                (["--ckpt-dir", ckpt, "--ckpt-every", "10", "--export-onnx", exported]
                 if resume else []))
            if not rep.check(f"{tag}: forge-train --nproc {t * d}", rc == 0, e2e.failure(rc, log)):
                continue
            rep.check(f"{tag}: the layout is reported",
                      f"{d} data-parallel x {t} tensor-parallel" in log, e2e.tail(log, 3))
            rc, log, ref_losses, ref_params = train(forge_train, one, data, tmp, f"one{t}{d}",
                                                    ["--steps", str(STEPS)])
            if not rep.check(f"{tag}: one process, batch {d * b}", rc == 0, e2e.failure(rc, log)):
                continue
            w = worst_rel(losses, ref_losses)
            rep.check(f"{tag}: losses == one process", len(losses) == STEPS and w <= TOL,
                      f"{len(losses)} steps, worst rel {w:.2e} (<= {TOL:g}), last "
                      f"{losses[-1]!r} vs {ref_losses[-1]!r}")
            shapes_ok = set(params) == set(ref_params) and all(
                params[n].shape == ref_params[n].shape for n in ref_params)
            worst = max(e2e.rel(params[n], ref_params[n]) for n in ref_params) if shapes_ok \
                else float("inf")
            rep.check(f"{tag}: whole parameters == one process", shapes_ok and worst <= TOL,
                      f"{len(params)} tensors, shapes "
                      f"{ {n: params[n].shape for n in params} if not shapes_ok else 'equal'}, "
                      f"worst rel {worst:.2e}")
            if resume:  # --export-onnx writes the whole trained tensors too
                import onnx
                from onnx import numpy_helper
                inits = {i.name: numpy_helper.to_array(i)
                         for i in onnx.load(exported).graph.initializer} \
                    if os.path.exists(exported) else {}
                same = [n for n in params if n in inits and inits[n].shape == params[n].shape
                        and np.array_equal(inits[n], params[n])]
                rep.check(f"{tag}: --export-onnx holds the whole trained parameters",
                          len(same) == 4 and len(same) == len([n for n in params
                                                               if n in inits]),
                          f"{len(same)} equal of {sorted(inits)}")
                files = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
                if not rep.check(f"{tag}: the ranks wrote sharded checkpoints (a file each)",
                                 all(e2e.sharded_checkpoint(ckpt, f"ckpt-{s}.forgeckpt", t * d)
                                     for s in (10, 20)), str(files)):
                    continue
                t2_run = (ckpt, losses)
                e2e.keep_only_checkpoint(ckpt, "ckpt-10.forgeckpt")
                rc, log, res_losses, res_params = train(
                    forge_train, one, data, tmp, "resumed",
                    ["--steps", str(STEPS), "--ckpt-dir", ckpt, "--resume"])
                if rep.check(f"{tag}: resume the T={t} checkpoint in one process", rc == 0,
                             e2e.failure(rc, log)):
                    w = worst_rel(res_losses[-10:], losses[-10:])
                    rep.check(f"{tag}: resumed losses 11-20 == the T={t} run's",
                              len(res_losses) >= 10 and w <= TOL, f"worst rel {w:.2e}")
                    worst = max(e2e.rel(res_params[n], params[n]) for n in params)
                    rep.check(f"{tag}: resumed parameters == the T={t} run's", worst <= TOL,
                              f"worst rel {worst:.2e}")

        # The T=2 run's sharded step-10 checkpoint on another layout: D=2 x T=2 with ZeRO-1
        # (4 ranks, global batch 8 as before, the same clipping), each rank joining the
        # pieces it needs.
        z22 = os.path.join(tmp, "resume22.forge")
        rc, log = compile_(forgec, os.path.join(a.fixtures_dir, "mlp_adamw"), z22, 4,
                           ["--tp", "2", "--dp", "2", "--zero", "1", "--clip-grad-norm", "0.5"])
        if rep.check("a T=2 run and a D=2 x T=2 bundle to resume it on",
                     t2_run is not None and rc == 0, e2e.failure(rc, log)):
            ckpt, t2_losses = t2_run
            e2e.keep_only_checkpoint(ckpt, "ckpt-10.forgeckpt")
            data = os.path.join(a.fixtures_dir, "mlp_adamw", "batches.npz")
            rc, log, res_losses, _ = train(forge_train, z22, data, tmp, "resumed22",
                                           ["--nproc", "4", "--steps", str(STEPS), "--ckpt-dir",
                                            ckpt, "--resume"])
            if rep.check("resume the T=2 sharded checkpoint on D=2 x T=2 with ZeRO-1", rc == 0
                         and "resumed from" in log, e2e.failure(rc, log)):
                w = worst_rel(res_losses[-10:], t2_losses[-10:])
                rep.check("... losses 11-20 == the T=2 run's", len(res_losses) >= 10 and
                          w <= TOL, f"worst rel {w:.2e}")
                # Its final checkpoint: 4 ranks' files, each piece once (ZeRO's parts of the
                # replicated fc2.bias state on the first tensor-parallel place only).
                rep.check("... and its own checkpoint is sharded over the 4 ranks",
                          e2e.sharded_checkpoint(ckpt, "ckpt-20.forgeckpt", 4),
                          str(sorted(os.listdir(ckpt))))
            # A rank's file alone is not a checkpoint; a missing rank's file is found.
            part = os.path.join(ckpt, "ckpt-20.forgeckpt", "rank-00003-of-00004.forgeckpt")
            if os.path.exists(part):
                os.remove(part)
                rc, log, _, _ = train(forge_train, z22, data, tmp, "resumed22b",
                                      ["--nproc", "4", "--steps", str(STEPS + 2), "--ckpt-dir",
                                       ckpt, "--resume"])
                rep.check("a sharded checkpoint missing a rank's file is skipped, saying so",
                          rc == 0 and "rank 3's file of 4 is missing" in log and
                          "resumed from" in log and "at step 10" in log, e2e.tail(log, 4))

        # Errors.
        fixture = os.path.join(a.fixtures_dir, "mlp_adamw")
        data = os.path.join(fixture, "batches.npz")
        tp2 = os.path.join(tmp, "tp2dp1mlp_tp.forge")
        # Evaluation runs the split forward on every rank: the same eval losses.
        one2 = os.path.join(tmp, "tp2dp1mlp_one.forge")
        runs = [e2e.run([forge_train, bundle, "--data", data, "--eval-data", data, "--eval-every",
                         "5", "--steps", "10", "--threads", "1", "--seed", "3"] + extra, 120)
                for bundle, extra in ((tp2, ["--nproc", "2"]), (one2, []))]
        ev = [[float(x) for x in re.findall(r"eval loss ([0-9.eE+-]+)", log)]
              for _, _, log in runs]
        rep.check("mlp_adamw --tp 2: eval losses == one process",
                  all(rc == 0 for rc, _, _ in runs) and len(ev[0]) == 2 and len(ev[1]) == 2 and
                  all(abs(a - b) <= TOL * abs(b) for a, b in zip(*ev)), str(ev))
        # The vocabulary-parallel loss with label smoothing (its class mean summed over the
        # group) and its eval (loss and accuracy from the split logits), gpt T=2 vs one process;
        # then with ignore=-100 on every fifth label (length buckets' padding: no term, no
        # smoothing term, the means over the kept rows, eval weighted by their count).
        gpt = os.path.join(a.fixtures_dir, "gpt_adamw")
        arrays = dict(np.load(os.path.join(gpt, "batches.npz")))
        labels = arrays["labels"].astype(np.int64).copy()
        labels.reshape(-1)[::5] = -100
        ignored = os.path.join(tmp, "gpt_ignored.npz")
        np.savez(ignored, **{**arrays, "labels": labels})
        for what, loss, gdata in (
                ("smoothing", "cross_entropy:logits,labels,smoothing=0.1",
                 os.path.join(gpt, "batches.npz")),
                ("smoothing with ignore", "cross_entropy:logits,labels,smoothing=0.1,ignore=-100",
                 ignored)):
            runs = []
            for name, extra in (("gs_tp", ["--tp", "2"]), ("gs_one", [])):
                bundle = os.path.join(tmp, name + ".forge")
                rc, _, log = e2e.run([forgec, os.path.join(gpt, "model.onnx"), "--batch", "4",
                                      "--loss", loss, "--optimizer", "adamw:lr=0.01", "-o",
                                      bundle] + extra, 300)
                if not rep.check(f"gpt {what} {' '.join(extra) or 'one'}: forgec", rc == 0,
                                 e2e.failure(rc, log)):
                    break
                metrics = os.path.join(tmp, name + ".jsonl")
                runs.append(e2e.run([forge_train, bundle, "--data", gdata, "--eval-data", gdata,
                                     "--eval-every", "5", "--steps", "10", "--threads", "1",
                                     "--seed", "3", "--metrics", metrics] +
                                    (["--nproc", "2"] if extra else []), 300) + (metrics,))
            if len(runs) == 2 and rep.check(f"gpt {what} --tp 2 and one process: forge-train",
                                            all(r[0] == 0 for r in runs),
                                            "; ".join(e2e.failure(r[0], r[2]) for r in runs)):
                rows = [[json.loads(line) for line in open(r[3])] for r in runs]
                keys = ("loss", "eval_loss", "eval_accuracy")
                got = [[(row[k]) for row in rs for k in keys if k in row] for rs in rows]
                evals = sum(1 for row in rows[0] if "eval_loss" in row)
                w = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(*got)),
                        default=float("inf"))
                rep.check(f"gpt {what} --tp 2: losses, eval losses and accuracies == one process",
                          len(got[0]) == len(got[1]) == 10 + 2 * evals and evals == 2 and w <= TOL,
                          f"{len(got[0])} vs {len(got[1])} values, {evals} evals, worst rel {w:.2e}")
        rc, _, log = e2e.run([forge_train, tp2, "--data", data, "--steps", "2"], 120)
        rep.check("tp bundle without a group", rc not in (0, None) and "--tp 2" in log and
                  "--nproc" in log, e2e.tail(log, 2))
        rc, _, log = e2e.run([forge_train, tp2, "--data", data, "--steps", "2", "--nproc", "3"],
                             120)
        rep.check("--nproc 3 for a --tp 2 bundle", rc not in (0, None) and "this run has 3" in log,
                  e2e.tail(log, 2))
        cnn = os.path.join(a.fixtures_dir, "cnn_adamw", "model.onnx")
        rc, _, log = e2e.run([forgec, cnn, "--batch", "4", "--loss", "mse:logits,target",
                              "--optimizer", "adamw", "--tp", "2",
                              "-o", os.path.join(tmp, "cnn.forge")], 300)
        rep.check("forgec --tp on a model without a matmul pair or classes", rc not in (0, None)
                  and "no pair of matmuls to split" in log, e2e.tail(log, 2))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
