#!/usr/bin/env python3
"""forgec --batch auto: the largest batch whose planned device memory fits (issue #13 item 4).

Compiles tests/fixtures/mlp_adamw for cuda:sm_90 (no GPU needed: the plan is static) and reads
each bundle's plan from `forge-train --info` ("device plan: N bytes ... + W bytes of GEMM
workspace"), the bytes the CUDA executor allocates in one piece. Checks:

  multiple of 8     --device-memory 200MB: forgec names a batch B, a multiple of 8, stored in
                    the bundle's options; B's plan fits in 90% of 200 MB and B + 8's (compiled
                    with --batch B+8) does not
  below 8           a memory between the plans of batches 3 and 4 (from their own compiles):
                    B = 3, and the bundle trains 2 steps on the CPU
  recipe            batch = "auto" in a --recipe file works the same
  samples per step  --samples-per-step 4096 with a memory between the plans of 4096 x 1 and
                    2048 x 2 (from their own compiles): micro-batch 2048, 2 micro-batches in
                    the accumulation loop (bundle options batch, micro_batches, accumulate),
                    the plan fits; with more memory 4096 x 1; the 2048 x 2 bundle trains 2
                    steps on the CPU; --samples-per-step without --batch auto, with
                    --micro-batches, or too little memory fail naming the problem
  recompute auto    the gpt fixture at batch 512: with a memory between its plans with and
                    without recomputation forgec recomputes the attention probabilities (and
                    that plan fits); with more memory it does not; the choice is stored
  errors            a memory below batch 1's plan, --batch auto without --device-memory, a size
                    that is not one, --device-memory without --batch auto or --recompute auto,
                    --recompute auto without --device-memory, and a model whose input has a
                    fixed batch dimension fail with a message naming the problem

  test_batch_auto.py [--bin-dir DIR | --forgec F --forge-train T]
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

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.normpath(os.path.join(HERE, "..", "fixtures", "mlp_adamw"))
SHARE = 0.9  # the share of --device-memory a plan may take


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_batch_auto")
    if not tools:
        return 2
    forgec, forge_train = tools
    m = json.load(open(os.path.join(FIXTURE, "manifest.json")))
    rep = e2e.Report()
    base = [forgec, os.path.join(FIXTURE, "model.onnx"), "--target", "cuda:sm_90",
            "--loss", "cross_entropy:logits,labels",
            "--optimizer", e2e.optimizer_spec(m["optimizer_hparams"])]

    with tempfile.TemporaryDirectory(prefix="forge-batch-auto-") as tmp:
        def compile_(label, extra, name):
            out = os.path.join(tmp, name)
            rc, _, log = e2e.run(base + list(extra) + ["-o", out])
            return rc, log, out

        def plan(bundle):
            """(planned bytes incl. the workspace, batch option) from forge-train --info."""
            rc, _, info = e2e.run([forge_train, bundle, "--info"])
            p = re.search(r"device plan:\s+(\d+) bytes .*\+ (\d+) bytes of GEMM workspace", info)
            b = re.search(r"option:\s+batch = (\d+)", info)
            if rc != 0 or not p or not b:
                return None, None
            return int(p.group(1)) + int(p.group(2)), int(b.group(1))

        def chosen(log):
            g = re.search(r"--batch auto: (\d+) \(", log)
            return int(g.group(1)) if g else None

        # Multiple of 8.
        mem = 200_000_000
        rc, log, out = compile_("auto", ["--batch", "auto", "--device-memory", "200MB"], "a.forge")
        b = chosen(log)
        if rep.check("--batch auto --device-memory 200MB", rc == 0 and b is not None,
                     e2e.tail(log, 1)):
            bytes_b, opt = plan(out)
            rep.check("batch is a multiple of 8, stored in the bundle", b % 8 == 0 and opt == b,
                      f"B = {b}, bundle option batch = {opt}")
            rep.check("B's plan fits", bytes_b is not None and bytes_b <= SHARE * mem,
                      f"{bytes_b} bytes <= {SHARE * mem:.0f}")
            rc2, log2, out2 = compile_("next", ["--batch", str(b + 8)], "next.forge")
            bytes_n, _ = plan(out2) if rc2 == 0 else (None, None)
            rep.check("B + 8's plan does not fit", bytes_n is not None and bytes_n > SHARE * mem,
                      f"{bytes_n} bytes > {SHARE * mem:.0f}" if bytes_n else e2e.tail(log2, 1))

        # Below 8: a memory between the plans of batches 3 and 4.
        plans = {}
        for n in (3, 4):
            rc, log, out = compile_(f"b{n}", ["--batch", str(n)], f"b{n}.forge")
            plans[n] = plan(out)[0] if rc == 0 else None
        if rep.check("plans of batches 3 and 4", None not in plans.values() and
                     plans[3] < plans[4], f"{plans}"):
            mem = int((plans[3] + plans[4]) / 2 / SHARE)
            rc, log, out = compile_("small", ["--batch", "auto", "--device-memory", str(mem)],
                                    "small.forge")
            b = chosen(log)
            rep.check(f"--device-memory {mem}: batch 3", rc == 0 and b == 3, e2e.tail(log, 1))
            if rc == 0 and b == 3:
                metrics = os.path.join(tmp, "small.jsonl")
                rc, _, tlog = e2e.run([forge_train, out, "--data",
                                       os.path.join(FIXTURE, "batches.npz"), "--steps", "2",
                                       "--device", "cpu", "--metrics", metrics])
                ok = rc == 0 and len(e2e.metric_losses(metrics)) == 2 and \
                    all(np.isfinite(e2e.metric_losses(metrics)))
                rep.check("the batch-3 bundle trains 2 steps on the CPU", ok, e2e.tail(tlog, 1))

        # --samples-per-step: the largest micro-batch dividing it that fits, the rest
        # accumulated in the loop.
        def options(bundle):
            rc, _, info = e2e.run([forge_train, bundle, "--info"])
            return dict(re.findall(r"option:\s+(\S+) = (\S+)", info)) if rc == 0 else {}
        sps = {}
        for b, k in ((4096, 1), (2048, 2)):
            rc, log, out = compile_(f"sps{b}", ["--batch", str(b), "--micro-batches", str(k)],
                                    f"sps{b}.forge")
            sps[b] = plan(out)[0] if rc == 0 else None
        if rep.check("plans of 4096 x 1 and 2048 x 2", None not in sps.values() and
                     sps[2048] < sps[4096], f"{sps}"):
            mem = int((sps[2048] + sps[4096]) / 2 / SHARE)
            rc, log, out = compile_("sps", ["--batch", "auto", "--samples-per-step", "4096",
                                            "--device-memory", str(mem)], "sps.forge")
            o = options(out) if rc == 0 else {}
            rep.check(f"--samples-per-step 4096 --device-memory {mem}: 2048 x 2 in the loop",
                      rc == 0 and o.get("batch") == "2048" and o.get("micro_batches") == "2"
                      and o.get("accumulate") == "loop" and "2048 x 2 micro-batches" in log,
                      e2e.tail(log, 1))
            bytes_b, _ = plan(out) if rc == 0 else (None, None)
            rep.check("its plan fits", bytes_b is not None and bytes_b <= SHARE * mem,
                      f"{bytes_b} bytes <= {SHARE * mem:.0f}")
            if rc == 0:
                data = os.path.join(tmp, "sps.npz")
                rng = np.random.default_rng(0)
                np.savez(data, x=rng.standard_normal((8192, 64)).astype(np.float32),
                         labels=rng.integers(0, 10, size=8192).astype(np.int64))
                metrics = os.path.join(tmp, "sps.jsonl")
                rc2, _, tlog = e2e.run([forge_train, out, "--data", data, "--steps", "2",
                                        "--device", "cpu", "--metrics", metrics])
                ok = rc2 == 0 and len(e2e.metric_losses(metrics)) == 2 and \
                    all(np.isfinite(e2e.metric_losses(metrics)))
                rep.check("the 2048 x 2 bundle trains 2 steps on the CPU", ok, e2e.tail(tlog, 1))
            rc, log, out = compile_("sps big", ["--batch", "auto", "--samples-per-step", "4096",
                                                "--device-memory", "200MB"], "spsbig.forge")
            o = options(out) if rc == 0 else {}
            rep.check("--samples-per-step 4096 --device-memory 200MB: 4096 x 1",
                      rc == 0 and o.get("batch") == "4096" and o.get("micro_batches") == "1",
                      e2e.tail(log, 1))

        # Recipe.
        recipe = os.path.join(tmp, "r.toml")
        with open(recipe, "w") as f:
            f.write('batch = "auto"\n')
        rc, log, out = compile_("recipe", ["--recipe", recipe, "--device-memory", "200MB"],
                                "r.forge")
        rep.check('recipe batch = "auto"', rc == 0 and chosen(log) is not None and
                  plan(out)[1] == chosen(log), e2e.tail(log, 1))

        # Errors.
        for label, extra, want in [
                ("memory below batch 1", ["--batch", "auto", "--device-memory", "1MB"],
                 "even a batch of 1 plans"),
                ("no --device-memory", ["--batch", "auto"], "--batch auto needs --device-memory"),
                ("not a size", ["--batch", "auto", "--device-memory", "lots"],
                 "--device-memory 'lots': expected a size"),
                ("--device-memory alone", ["--batch", "8", "--device-memory", "80GB"],
                 "--device-memory applies to --batch auto and --recompute auto"),
                ("--recompute auto without --device-memory", ["--batch", "8", "--recompute",
                                                              "auto"],
                 "--recompute auto needs --device-memory"),
                ("--batch 0", ["--batch", "0"], "--batch must be a positive number"),
                ("--samples-per-step without --batch auto", ["--batch", "8",
                                                             "--samples-per-step", "64"],
                 "--samples-per-step picks the micro-batch with --batch auto"),
                ("--samples-per-step with --micro-batches",
                 ["--batch", "auto", "--device-memory", "80GB", "--samples-per-step", "64",
                  "--micro-batches", "2"], "not with --micro-batches"),
                ("--samples-per-step with too little memory",
                 ["--batch", "auto", "--device-memory", "20MB", "--samples-per-step", "64"],
                 "even a micro-batch of 1 plans")]:
            rc, log, _ = compile_(label, extra, "bad.forge")
            rep.check(f"error: {label}", rc not in (0, None) and want in log, e2e.tail(log, 1))

        # --recompute auto on the gpt fixture (unfused fp32 attention on cuda:sm_90) at batch
        # 512: its plan is ~78 MB without recomputation and ~74 MB with; 90% of 84 MB lies
        # between them, 90% of 200 MB above both. Each choice is stored in the bundle.
        gpt = os.path.join(HERE, "..", "fixtures", "gpt_adamw", "model.onnx")
        recomputed = {}
        for mem in ("84MB", "200MB"):
            out = os.path.join(tmp, f"gpt_{mem}.forge")
            rc, _, log = e2e.run([forgec, gpt, "--target", "cuda:sm_90", "--batch", "512",
                                  "--recompute", "auto", "--device-memory", mem,
                                  "--loss", "cross_entropy:logits,labels", "--optimizer", "sgd",
                                  "-o", out], 300)
            rc2, _, info = e2e.run([forge_train, out, "--info"])
            said = re.search(r"--recompute auto: (\w+)", log)
            stored = re.search(r"option:\s+recompute = (\w+)", info)
            p = re.search(r"device plan:\s+(\d+) bytes .*\+ (\d+) bytes of GEMM workspace", info)
            recomputed[mem] = (rc == 0 and rc2 == 0 and said and stored and p and
                               said.group(1) == stored.group(1) and
                               (said.group(1), int(p.group(1)) + int(p.group(2))))
        mb = 1000 * 1000
        rep.check("--recompute auto at 84MB: attention, and its plan fits",
                  bool(recomputed["84MB"]) and recomputed["84MB"][0] == "attention" and
                  recomputed["84MB"][1] <= SHARE * 84 * mb, str(recomputed["84MB"]))
        rep.check("--recompute auto at 200MB: none (it fits without)",
                  bool(recomputed["200MB"]) and recomputed["200MB"][0] == "none" and
                  recomputed["200MB"][1] > SHARE * 84 * mb, str(recomputed["200MB"]))

        # A model whose input has a fixed batch dimension: --batch changes nothing, so the
        # search must stop at once instead of doubling forever.
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        fixed = os.path.join(tmp, "fixed.onnx")
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["logits"], name="mm")], "fixed",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 3])],
            [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), fixed)
        rc, _, log = e2e.run([forgec, fixed, "--target", "cuda:sm_90", "--batch", "auto",
                              "--device-memory", "1GB", "--loss", "cross_entropy:logits,labels",
                              "--optimizer", "sgd", "-o", os.path.join(tmp, "fixed.forge")], 120)
        rep.check("error: a fixed batch dimension", rc not in (0, None) and
                  "the plan does not grow with the batch" in log, e2e.tail(log, 1))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
