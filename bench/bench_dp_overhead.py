#!/usr/bin/env python3
"""The cost of the partitioned program on one GPU (#14: <= 2%): a model's training step
compiled without collectives and with `--dp 1` (and `--dp 1 --zero 1`), timed in
alternating runs on the same GPU in one call.

`--dp 1` builds every collective of data parallelism for a group of one: the gradient
all-reduce in buckets on the collective stream, forked off the compute stream and joined
by events inside the step's CUDA graph, each bucket one NCCL group call (NCCL with world
size 1: the code path of D ranks). `--zero 1` adds ZeRO-1's reduce-scatter, part update
and all-gather. The figure is the median step time over --steps steps after --warmup,
per run; runs alternate (none, dp1[, zero1], none, ...) so drift hits every variant.

Stages (forgec runs where MLIR is, the timing where the GPU is; bench_train.py's export
makes the model and its seeded weights on both machines):
  bench_dp_overhead.py compile --dir D --forgec F [--models gpt2] [--precision bf16]
  bench_dp_overhead.py run     --dir D --forge-train F [--pairs 3] [--zero]
D/<model>/model.onnx comes from `bench_train.py export --dir D`; `run` writes
D/dp_overhead.json and prints a table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train as bt  # noqa: E402

VARIANTS = {"none": [], "dp1": ["--dp", "1"], "zero1": ["--dp", "1", "--zero", "1"]}


def compile_(a):
    for name in a.models:
        batch = bt.MODELS[name][0]
        d = os.path.join(a.dir, name)
        for variant, flags in VARIANTS.items():
            cmd = [a.forgec, os.path.join(d, "model.onnx"), "--target", "cuda:sm_90",
                   "--weights", "external" if name in bt.THIN else "embedded",
                   "--batch", str(batch), "--loss", "cross_entropy:logits,labels",
                   "--optimizer", f"adamw:lr={bt.LR},beta1={bt.BETAS[0]},beta2={bt.BETAS[1]},"
                                  f"eps={bt.EPS},weight_decay={bt.WD}",
                   "--precision", a.precision, "-o", os.path.join(d, f"{variant}.forge")] + flags
            subprocess.run(cmd, check=True)
            print(f"compiled {name} {variant}")


def run(a):
    results = {}
    variants = ["none", "dp1"] + (["zero1"] if a.zero else [])
    for name in a.models:
        d = os.path.join(a.dir, name)
        bt.make_data(a, name, d)
        times = {v: [] for v in variants}
        losses = {}
        for _ in range(a.pairs):
            for v in variants:
                dt, loss, _ = bt.time_forge(a, name, d, f"{v}.forge", profile=False)
                times[v].append(dt)
                losses[v] = loss
        rows = []
        for v in variants:
            med = statistics.median(times[v])
            base = statistics.median(times["none"])
            worst = max(abs(x - y) / abs(y) for x, y in zip(losses[v], losses["none"]))
            rows.append({"variant": v, "ms": [1e3 * x for x in times[v]], "median_ms": 1e3 * med,
                         "overhead_pct": 100.0 * (med / base - 1.0),
                         "worst_loss_rel_vs_none": worst})
        results[name] = rows
        print(f"{name} ({a.precision}): median step over {a.steps} steps after {a.warmup}, "
              f"{a.pairs} alternating runs each")
        print("| variant | runs (ms) | median | overhead | losses vs none |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['variant']} | {' / '.join(f'{x:.2f}' for x in r['ms'])} | "
                  f"{r['median_ms']:.2f} ms | {r['overhead_pct']:+.1f}% | "
                  f"{r['worst_loss_rel_vs_none']:.1e} |")
    with open(os.path.join(a.dir, "dp_overhead.json"), "w") as f:
        json.dump(results, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["compile", "run"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--models", nargs="*", default=["gpt2"])
    ap.add_argument("--forgec", default="forgec")
    ap.add_argument("--forge-train", default="forge-train")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--zero", action="store_true", help="also time --dp 1 --zero 1")
    a = ap.parse_args()
    {"compile": compile_, "run": run}[a.stage](a)


if __name__ == "__main__":
    main()
