#!/usr/bin/env python3
"""Length buckets on the GPU (issue #13 item 5), pipelined like any other steps.

tests/e2e/test_length_buckets.py checks the buckets' semantics on the CPU. This runs the same
model (models/gpt.onnx with a symbolic sequence dim) compiled for cuda:sm_90 with
--length-buckets seq=8,16,32, on documents of mixed lengths (every bucket, and consecutive
steps of one bucket and of two), with an evaluation every 8 steps:

  pipelined     the default GPU run launches step s+1 before step s's loss is read back (its
                progress line says so), also when the two steps are of different buckets (the
                older step's loss is then its routine's last run, not the one before): its
                losses, buckets and evaluations equal a --no-pipeline run's (rel <= REL_PIPE:
                the same kernels in the same order, cuBLASLt's first heuristic algorithm in
                both processes (FORGE_MATMUL_TUNING=off); a step reading another step's loss
                differs by percents)
  vs the CPU    the same bundle on the CPU executor: losses and evaluations within REL
  loop          the same with --micro-batches 2 (accumulate@len<T> twice, then
                train_step@len<T>): pipelined == --no-pipeline, and the GPU vs the CPU

  test_length_buckets_gpu.py [--bin-dir DIR | --forgec F --forge-train T] [--bundles DIR
                             [--compile-only]]
Without a GPU it prints SKIP and exits 77 (after --compile-only's compile). Prints one line per
check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import forge_e2e as e2e  # noqa: E402
import test_length_buckets as lb  # noqa: E402

REL, REL_PIPE = 1e-4, 1e-6
# Timed GEMM algorithms differ between processes (Matmul.cpp): one choice in every run.
os.environ["FORGE_MATMUL_TUNING"] = "off"
STEPS = 24
BUNDLES = (("plain", lb.BATCH, []), ("loop", lb.BATCH // 2, ["--micro-batches", "2"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--bundles")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()

    def compile_half(rep, out, tmp):
        tools = e2e.find_tools(a, "test_length_buckets_gpu")
        if not tools:
            return 2
        os.makedirs(out, exist_ok=True)
        model = os.path.join(tmp, "gpt_seq.onnx")
        lb.symbolic_seq(model)
        rng = np.random.default_rng(7)
        lb.documents(os.path.join(out, "mixed.bin"), rng.integers(2, 60, 400), 3)
        lb.documents(os.path.join(out, "eval.bin"), rng.integers(2, 40, 40), 2)
        for tag, batch, extra in BUNDLES:
            rc, _, log = e2e.run([tools[0], model, "--target", "cuda:sm_90", "--batch",
                                  str(batch), "--loss", lb.LOSS, "--optimizer", lb.OPT,
                                  "--length-buckets", "seq=8,16,32",
                                  "-o", os.path.join(out, f"{tag}.forge")] + extra)
            if not rep.check(f"forgec {tag} --length-buckets seq=8,16,32", rc == 0,
                             e2e.failure(rc, log)):
                return rep.summary()

    def run_half(rep, out, tmp):
        forge_train = a.forge_train or e2e.find_tool("forge-train", a.bin_dir)

        def train(bundle, tag, device, extra=()):
            metrics = os.path.join(tmp, f"{tag}.jsonl")
            rc, _, log = e2e.run([forge_train, os.path.join(out, f"{bundle}.forge"), "--data",
                                  os.path.join(out, "mixed.bin"), "--doc-separator",
                                  str(lb.SEP), "--steps", str(STEPS), "--device", device,
                                  "--seed", "3", "--metrics", metrics, "--eval-data",
                                  os.path.join(out, "eval.bin"), "--eval-every", "8"]
                                 + list(extra), 600)
            if rc != 0:
                return None, e2e.failure(rc, log)
            return [json.loads(line) for line in open(metrics) if line.strip()], log

        def compare(got, want, tol):
            """max rel over the step losses and evaluations, or None if the steps differ."""
            steps_g = [r for r in got if "loss" in r]
            steps_w = [r for r in want if "loss" in r]
            if len(steps_g) != len(steps_w) or len(steps_g) != STEPS or \
                    [r.get("length") for r in steps_g] != [r.get("length") for r in steps_w]:
                return None
            pairs = [(g["loss"], w["loss"]) for g, w in zip(steps_g, steps_w)]
            evals_g = [r["eval_loss"] for r in got if "eval_loss" in r]
            evals_w = [r["eval_loss"] for r in want if "eval_loss" in r]
            if len(evals_g) != len(evals_w) or not evals_g:
                return None
            pairs += list(zip(evals_g, evals_w))
            return max(e2e.rel(g, w) for g, w in pairs)

        for tag, _, _ in BUNDLES:
            piped, log = train(tag, f"{tag}_pipe", "cuda")
            quiet, why = train(tag, f"{tag}_quiet", "cuda", ["--no-pipeline"])
            cpu, why2 = train(tag, f"{tag}_cpu", "cpu")
            if not rep.check(f"{tag}: trains on the GPU (pipelined and not) and on the CPU",
                             piped and quiet and cpu,
                             " | ".join(m for r, m in ((piped, log), (quiet, why), (cpu, why2))
                                        if not r)):
                continue
            lengths = [r["length"] for r in piped if "loss" in r]
            same = sum(x == y for x, y in zip(lengths, lengths[1:]))
            rep.check(f"{tag}: every bucket, steps of one bucket and of two in a row",
                      sorted(set(lengths)) == [8, 16, 32] and 0 < same < len(lengths) - 1,
                      f"lengths {lengths}")
            rep.check(f"{tag}: the GPU run is pipelined", "steps pipelined" in log,
                      e2e.tail(log, 3))
            err = compare(piped, quiet, REL_PIPE)
            rep.check(f"{tag}: pipelined == --no-pipeline (losses, buckets, evaluations)",
                      err is not None and err <= REL_PIPE,
                      f"max rel {err:.1e} (<= {REL_PIPE})" if err is not None else
                      "the steps or buckets differ")
            err = compare(piped, cpu, REL)
            rep.check(f"{tag}: the GPU vs the CPU", err is not None and err <= REL,
                      f"max rel {err:.1e} (<= {REL})" if err is not None else
                      "the steps or buckets differ")

    return e2e.halves_main(a, compile_half, run_half, prefix="forge-buckets-gpu-")


if __name__ == "__main__":
    sys.exit(main())
