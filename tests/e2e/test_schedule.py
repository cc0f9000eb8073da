#!/usr/bin/env python3
"""forge-schedule's streams end to end without a GPU (ctest e2e_schedule; issue #17).

The mlp, cnn and gpt fixtures are compiled for cuda:sm_90 with one compute stream and with
`--compute-streams 2` (the gpt also with `--dp 2`: a collective stream beside them). Checked:
  1. every bundle's schedule is free of races against its memory plan: `forge-replay
     --check-library` (besides the library calls) finds no two instructions that may run at
     once on different streams and touch the same bytes, one writing them
     (checkScheduleRaces; tests/unit/BundleTest.cpp ScheduleRaces shows it can fail);
  2. the second stream is used where it pays (the mlp's weight gradients beside its data
     gradients: `forge-train --info` lists compute.1 with instructions), so check 1 is not
     vacuous, and cuDNN calls stay on the compute stream (the runtime refuses them elsewhere);
  3. the CPU executor runs the same order: 5 training steps of each bundle on the CPU give
     the one-stream bundle's losses and parameters bit for bit.
The GPU side (the same bundles against the CPU on an H200) is tests/gpu/test_gpu_models.py
with --forgec-arg=--compute-streams=2.
"""
import os
import re
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import Report

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
STREAMS_RE = re.compile(r"^  (\w+): .*\n    streams (.*);", re.M)


def main():
    tools = e2e.replay_tools("test_schedule")
    if not tools:
        return 2
    forgec, forge_train, replay = tools
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        bundles = {}
        # Two compute streams where they cost memory too (--stream-memory-growth): the mlp's
        # weight gradients beside its data gradients (+9% of its small estimated peak), the
        # cnn's and gpt's backward passes on both, checked for races and run on the CPU.
        # The gpt in bf16 too: cuDNN attention reads q/k/v as views of the qkv projection
        # (forge-fold-attention-views), whose readers wait for the projection's stream.
        for fx, extra in (("mlp_adamw", ["--stream-memory-growth", "1000"]),
                          ("cnn_adamw", ["--stream-memory-growth", "1000"]),
                          ("gpt_adamw", ["--stream-memory-growth", "1000"]),
                          ("gpt_adamw", ["--precision", "bf16", "--stream-memory-growth", "1000"]),
                          ("gpt_adamw", ["--dp", "2", "--stream-memory-growth", "1000"])):
            for streams in (1, 2):
                tag = "_dp2" if "--dp" in extra else "_bf16" if "bf16" in extra else ""
                name = f"{fx}{tag}_s{streams}"
                out = os.path.join(tmp, name + ".forge")
                rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, fx, "model.onnx"),
                                      "--target", "cuda:sm_90", "--batch", "8",
                                      "--loss", "cross_entropy:logits,labels",
                                      "--optimizer", "adamw:lr=1e-3",
                                      "--compute-streams", str(streams), "-o", out] + extra, 600)
                if rep.check(f"{name} forgec", rc == 0, e2e.failure(rc, log)):
                    bundles[name] = out

        # 1. No races.
        rc, _, log = e2e.run([replay, "--check-library"] + sorted(bundles.values()), 600)
        rep.check(f"forge-replay --check-library over {len(bundles)} bundles (library calls, "
                  f"races between streams)", rc == 0, e2e.tail(log, 6))

        # 2. The streams each bundle uses.
        for name, path in sorted(bundles.items()):
            rc, _, info = e2e.run([forge_train, path, "--info"], 60)
            used = dict(STREAMS_RE.findall(info))
            train = used.get("train_step", "compute only")
            if name.endswith("_s2"):
                m = re.search(r"compute\.1 (\d+)", train)
                rep.check(f"{name}: train_step puts work on compute.1 ({train})",
                          bool(m) and int(m.group(1)) > 0, "forge-train --info")
            if name.endswith("_s1"):
                rep.check(f"{name}: one compute stream ({train})", "compute." not in info,
                          "forge-train --info")
            if name.startswith("gpt_adamw_dp2"):
                rep.check(f"{name}: collectives on their stream ({train})",
                          "collective" in train, "forge-train --info")
            print(f"  {name}: train_step streams: {train}")

        # 3. The CPU runs the same order: bit-identical training.
        for fx in ("mlp_adamw", "cnn_adamw", "gpt_adamw", "gpt_adamw_bf16"):
            runs = {}
            for streams in (1, 2):
                name = f"{fx}_s{streams}"
                if name not in bundles:
                    continue
                metrics = os.path.join(tmp, name + ".jsonl")
                params = os.path.join(tmp, name + ".params.npz")
                rc, _, log = e2e.run([forge_train, bundles[name], "--data",
                                      os.path.join(FIXTURES, fx.replace("_bf16", ""),
                                                   "batches.npz"), "--steps", "5",
                                      "--seed", "3", "--threads", "1", "--device", "cpu",
                                      "--metrics", metrics, "--dump-params", params], 600)
                if rep.check(f"{name} forge-train --device cpu", rc == 0, e2e.failure(rc, log)):
                    runs[streams] = (e2e.metric_losses(metrics), np.load(params))
            if len(runs) == 2:
                (l1, p1), (l2, p2) = runs[1], runs[2]
                same = (l1 == l2 and len(l1) == 5 and set(p1.files) == set(p2.files)
                        and all(np.array_equal(p1[k], p2[k]) for k in p1.files))
                rep.check(f"{fx}: 2 compute streams train as 1 on the CPU, bit for bit "
                          f"(5 steps, {len(p1.files)} parameters)", same, f"{l1} vs {l2}")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
