#!/usr/bin/env python3
"""Every bundled model compiles into a training bundle and overfits one batch.

Issue: "Each model from the foundation issue's models/ set compiles into a
training bundle and overfits a fixed small batch (loss falls by >= 90% within
200 steps) on the CPU."

For each model: forgec with a loss on one of its outputs, then forge-train on a
data set that is exactly one batch (no shuffling), 200 steps; the test reads
the metrics JSONL and requires loss[last] <= 0.1 * loss[first]. Needs numpy only.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

BATCH = 2
STEPS = 200

MODELS = e2e.MODEL_LOSSES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    forgec = os.path.join(args.bin_dir, "forgec")
    forge_train = os.path.join(args.bin_dir, "forge-train")
    manifest = json.load(open(os.path.join(args.models_dir, "manifest.json")))["models"]
    rng = np.random.default_rng(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (loss, kind) in MODELS.items():
            if args.only and name != args.only:
                continue
            ref = np.load(os.path.join(args.models_dir, name + ".ref.npz"))
            info = manifest[name]
            data = {k: ref[k][:BATCH] for k in info["inputs"]}
            output = loss.split(":")[1].split(",")[0]
            label = loss.split(",")[1]
            out = ref[output][:BATCH]
            if kind == "classes":
                data[label] = rng.integers(0, out.shape[-1], size=out.shape[:-1]).astype(np.int64)
            else:
                # pooler_output is tanh-bounded: targets inside (-1, 1) are reachable
                data[label] = rng.uniform(-0.9, 0.9, size=out.shape).astype(out.dtype)
            data_path = os.path.join(tmp, name + ".npz")
            np.savez(data_path, **data)
            bundle = os.path.join(tmp, name + ".forge")
            rc, _, log = e2e.run([forgec, os.path.join(args.models_dir, name + ".onnx"),
                                  "--batch", str(BATCH), "--loss", loss, "--optimizer", "adam:lr=3e-3",
                                  "-o", bundle])
            if rc != 0:
                print(f"FAIL {name}: forgec: {log.strip()[-2000:]}")
                failures += 1
                continue
            metrics = os.path.join(tmp, name + ".jsonl")
            rc, _, log = e2e.run([forge_train, bundle, "--data", data_path, "--steps", str(STEPS),
                                  "--no-shuffle", "--threads", "2", "--metrics", metrics, "--log-every", "1000"])
            if rc != 0:
                print(f"FAIL {name}: forge-train: {log.strip()[-2000:]}")
                failures += 1
                continue
            losses = e2e.metric_losses(metrics)
            first, last = losses[0], losses[-1]
            ok = len(losses) == STEPS and first is not None and last is not None and last <= 0.1 * first
            print(f"{'PASS' if ok else 'FAIL'} {name}: loss {first:.4g} -> {last:.4g} "
                  f"({100 * (1 - last / first):.1f}% lower) in {len(losses)} steps")
            failures += not ok
    print(f"{len(MODELS) - failures if not args.only else 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
