#!/usr/bin/env python3
"""forge-fuse-column-sums on a model where it fires (ctest e2e_fuse_column_sums).

A bias gradient whose GEMM is too big for cuBLASLt's BGRAD epilogue (forge-fuse keeps that
for products under 2^28 FLOPs or with k <= max(m, n)) is a standalone column sum of the loop
region that makes its input; the pass makes that region a column_reduce region computing the
sum as it writes its result. The model: a two-layer MLP made here with onnx.helper, x [2048,
256] -> Linear(256, 256) -> GELU (tanh) -> Linear(256, 16), cross-entropy: the first layer's
bias gradient sums the GELU gradient over 2048 rows (2 * 256 * 256 * 2048 = 2^28 FLOPs of
weight gradient, k > m, n). Each variant (fp32; bf16; fp32 with --micro-batches 2, whose
sums feed the accumulation loop's accumulators; fp32 with --dp 2, two CPU ranks whose sums
feed the gradient all_reduce) compiled for cuda:sm_90 with the pass (default) and with
--fuse-column-sums=false, both trained 4 steps on the same batches by the CPU's kernels (or
--device cuda on a GPU). Checks, per variant:
  fires        forgec's remark counts >= 1 fused column sum; the =false bundle has none
  launches     the fused bundle's routines have fewer instructions (forge-train --info)
  same_result  losses of the 4 steps and every parameter after them equal between the two
               bundles: bit for bit on the CPU (the region's body runs op by op, the sum in
               the same order); within 1e-5 relative on a GPU (the column kernel adds its
               partial sums atomically in any order)
GPU machines have no forgec: --compile-only --bundles DIR compiles the bundles into DIR here,
and --bundles DIR alone later trains them there (--device cuda; exit 77 without a GPU).
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import os
import re
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

ROWS, D, HIDDEN, CLASSES, STEPS = 2048, 256, 256, 16, 4
TIMEOUT_S = 600


def make_model(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((HIDDEN, D)) / 16).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(HIDDEN) / 16).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((CLASSES, HIDDEN)) / 16).astype(np.float32), "w2"),
             numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Gelu", ["h"], ["g"], approximate="tanh", name="gelu"),
             helper.make_node("Gemm", ["g", "w2", "b2"], ["logits"], transB=1, name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    e2e.add_tool_args(ap)
    e2e.add_half_args(ap)
    a = ap.parse_args()
    setup = e2e.halves(ap, a, "test_fuse_column_sums.py")
    if isinstance(setup, int):
        return setup
    forgec, forge_train, replay = setup
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-colsums-") as tmp:
        out = a.bundles or tmp
        os.makedirs(out, exist_ok=True)
        # The batches are made where they are used (seeded: the same on every machine), so
        # that only the bundles travel to a GPU machine.
        model, data = os.path.join(out, "mlp.onnx"), os.path.join(tmp, "data.npz")
        if not replay:
            make_model(model)
        if not a.compile_only:
            rng = np.random.default_rng(1)
            np.savez(data, x=rng.standard_normal((2 * STEPS * ROWS, D)).astype(np.float32),
                     labels=rng.integers(0, CLASSES, 2 * STEPS * ROWS).astype(np.int64))
        # bf16 without the aux epilogues (its default has them: DGELU_BGRAD then takes the
        # GELU gradient and its bias sum into the GEMM, and no column sum is left to fuse).
        variants = [("fp32", "fp32", [], []), ("bf16", "bf16", ["--gemm-aux-epilogues=false"], []),
                    ("loop", "fp32", ["--micro-batches", "2"], []),
                    ("dp", "fp32", ["--dp", "2"], ["--nproc", "2"])]
        if a.device == "cuda":  # one GPU: the --dp variant needs two
            variants = variants[:3]
        for prec, precision, flags, launch in variants:
            bundles = {}
            for tag, extra in (("fused", []), ("plain", ["--fuse-column-sums=false"])):
                bundle = os.path.join(out, f"{prec}.{tag}.forge")
                bundles[tag] = bundle
                if replay:
                    continue
                rc, _, log = e2e.run([forgec, model, "--target", "cuda:sm_90", "--precision",
                                      precision, "--batch", str(ROWS), "--loss",
                                      "cross_entropy:logits,labels", "--optimizer", "adamw:lr=0.01",
                                      "-o", bundle, *flags, *extra], TIMEOUT_S)
                if not rep.check(f"{prec} compile {tag}", rc == 0, e2e.failure(rc, log) if rc else ""):
                    return rep.summary()
                found = re.search(r"(\d+) column sum kernel\(s\) ride", log)
                with open(bundle + ".fused", "w") as f:
                    f.write(found.group(1) if found else "0")
            counts = {t: int(open(b + ".fused").read()) for t, b in bundles.items()}
            rep.check(f"{prec} fires", counts["fused"] >= 1 and counts["plain"] == 0,
                      f"{counts['fused']} column sum(s) fused; {counts['plain']} with =false")
            if a.compile_only:
                continue
            launches, runs = {}, {}
            for tag, bundle in bundles.items():
                rc, _, info = e2e.run([forge_train, bundle, "--info"], TIMEOUT_S)
                # Every routine's (the loop's sums are @accumulate's).
                found = re.findall(r"^\s+\S+: (\d+) instructions", info, re.M)
                launches[tag] = sum(int(n) for n in found) if found else -1
                metrics = os.path.join(tmp, f"{prec}.{tag}.jsonl")
                params = os.path.join(tmp, f"{prec}.{tag}.npz")
                rc, _, log = e2e.run([forge_train, bundle, "--data", data, "--no-shuffle",
                                      "--steps", str(STEPS), "--threads", "1", "--device", a.device,
                                      "--metrics", metrics, "--dump-params", params, *launch],
                                     TIMEOUT_S)
                if not rep.check(f"{prec} train {tag}", rc == 0, e2e.failure(rc, log) if rc else ""):
                    return rep.summary()
                runs[tag] = (np.array(e2e.metric_losses(metrics)), dict(np.load(params)))
            rep.check(f"{prec} launches", 0 < launches["fused"] < launches["plain"],
                      f"instructions of all routines: fused {launches['fused']}, plain "
                      f"{launches['plain']}")
            (lf, pf), (lp, pp) = runs["fused"], runs["plain"]
            tol = 0.0 if a.device == "cpu" else 1e-5
            worst = max([float(np.max(np.abs(lf - lp) / np.abs(lp)))] +
                        [e2e.rel(pf[k], pp[k]) for k in pp if pp[k].dtype == np.float32])
            rep.check(f"{prec} same_result", lf.shape == lp.shape == (STEPS,) and
                      set(pf) == set(pp) and worst <= tol,
                      f"losses {lf.tolist()} vs {lp.tolist()}; max rel over losses and "
                      f"{len(pp)} dumped tensors {worst:.2e} (<= {tol:g})")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
