#!/usr/bin/env python3
"""Dropout trains as dropout: Philox masks keyed by (seed, step, element), the same on every
device, identity in evaluation.

The model is loss = ReduceSum(Dropout(x, ratio, training_mode=1) * w) with x = ones [1, 4096]
and w [4096] initialized to ones, so d loss / d w is the scaled mask itself: 1/(1-ratio) where
an element is kept, 0 where it is dropped. With SGD lr=1 the parameters after step 2 give step
2's mask too (w2 = 1 - g1 - g2, exact in float for ratio 0.5 and 0.2). Checks, per ratio:
  values      every gradient element is 0 or exactly 1/(1-ratio)           (scaling)
  keep rate   |kept/4096 - (1-ratio)| <= 4 sigma of a Binomial(4096, 1-ratio)
  steps       step 2's mask differs from step 1's (the step is part of the counter)
  repeat      a second run gives the bit-identical step-1 mask (no hidden state)
  eval        the eval loss after step 2 equals sum(w2) (evaluation does not drop)
  layers      two Dropout nodes in one model draw different masks (their own seeds)
  splits      (CPU) a sample's mask depends on its place in the step's global batch only: one
              batch of 4, 2 micro-batches of 2, 2 data-parallel ranks (forge-train --nproc 2)
              of 2, and 2 ranks x 2 micro-batches of 1 train the same step bit for bit. Row s
              of x is 2^s, so the update of w (SGD lr=1, loss = sum) spells out every sample's
              mask: w0 - w1 = 2 * sum_s 2^s mask_s, divided by K x D (the averaging).
With --device cuda (tests/gpu, gpu_dropout), step 1's mask on the GPU must equal the CPU's bit for bit.

  test_dropout.py [--bin-dir DIR | --forgec F --forge-train T] [--device cpu|cuda]
                  [--bundles DIR --compile-only]   (compile here for a GPU machine)
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

N = 4096


def model(path, ratio, layers=1):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits = [], [numpy_helper.from_array(np.ones(N, np.float32), "w")]
    src = "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array(np.array(ratio, np.float32), f"ratio{k}"))
        inits.append(numpy_helper.from_array(np.array(True), f"train{k}"))
        nodes.append(helper.make_node("Dropout", [src, f"ratio{k}", f"train{k}"], [f"d{k}"],
                                      name=f"drop{k}"))
        src = f"d{k}"
    nodes += [helper.make_node("Mul", [src, "w"], ["p"], name="scale"),
              helper.make_node("ReduceSum", ["p"], ["loss"], name="sum", keepdims=0)]
    graph = helper.make_graph(nodes, "dropout",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


CASES = {"r50": (0.5, 1), "r20": (0.2, 1), "two": (0.5, 2)}


def batch_model(path):
    """loss = ReduceSum(Dropout(x, 0.5) * w), x [batch, N] (symbolic batch), w [N] ones."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.ones(N, np.float32), "w"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "train")]
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], name="drop"),
             helper.make_node("Mul", ["d", "w"], ["p"], name="scale"),
             helper.make_node("ReduceSum", ["p"], ["loss"], name="sum", keepdims=0)]
    graph = helper.make_graph(nodes, "dropout_batch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", N])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


# (tag, batch, micro-batches, data-parallel ranks): each step takes the same 4 samples.
SPLITS = [("b4", 4, 1, 1), ("k2", 2, 2, 1), ("d2", 2, 1, 2), ("d2k2", 1, 2, 2)]


def check_splits(rep, forgec, forge_train, out):
    onnx_path = os.path.join(out, "batch.onnx")
    batch_model(onnx_path)
    data = os.path.join(out, "rows.npz")
    np.savez(data, x=np.repeat(2.0 ** np.arange(4, dtype=np.float32)[:, None], N, axis=1))
    updates = {}
    for tag, b, k, d in SPLITS:
        bundle = os.path.join(out, f"split_{tag}.forge")
        rc, t, log = e2e.run([forgec, onnx_path, "--batch", str(b), "--micro-batches", str(k),
                              *(["--dp", str(d)] if d > 1 else []), "--loss", "output:loss",
                              "--optimizer", "sgd:lr=1", "-o", bundle])
        if not rep.check(f"splits: forgec {tag}", rc == 0, e2e.failure(rc, log)):
            continue
        params = os.path.join(out, f"split_{tag}.p.npz")
        rc, t, log = e2e.run([forge_train, bundle, "--data", data, "--no-shuffle", "--steps", "1",
                              "--dump-params", params,
                              *(["--nproc", str(d)] if d > 1 else [])])
        if rep.check(f"splits: forge-train {tag}", rc == 0, e2e.failure(rc, log)):
            updates[tag] = (np.float32(1) - np.load(params)["w"]) * np.float32(k * d)
    if "b4" not in updates:
        return
    ref = updates["b4"]
    bits = ref / np.float32(2)  # sum_s 2^s mask_s, an integer in [0, 15]
    rep.check("splits: the one-batch update spells out 4 masks", np.all(bits == np.round(bits))
              and bits.min() >= 0 and bits.max() <= 15 and len(np.unique(bits)) > 8,
              f"values {np.unique(bits)[:8]}")
    for tag, u in updates.items():
        if tag != "b4":
            rep.check(f"splits: {tag} draws the one batch's masks (bit for bit)",
                      np.array_equal(u, ref), f"{np.count_nonzero(u != ref)} of {N} differ")


def compile_all(rep, forgec, out, target):
    for name, (ratio, layers) in CASES.items():
        onnx_path = os.path.join(out, f"{name}.onnx")
        model(onnx_path, ratio, layers)
        rc, t, log = e2e.run([forgec, onnx_path, "--loss", "output:loss", "--optimizer", "sgd:lr=1",
                              "--expose-gradients", "--target", target,
                              "-o", os.path.join(out, f"{name}.forge")])
        rep.check(f"{name} forgec", rc == 0, e2e.failure(rc, log))
    np.savez(os.path.join(out, "data.npz"), x=np.ones((1, N), np.float32))


def train(forge_train, out, name, tag, device, steps, extra=()):
    data = os.path.join(out, "data.npz")
    grads, params = os.path.join(out, f"{tag}.g.npz"), os.path.join(out, f"{tag}.p.npz")
    metrics = os.path.join(out, f"{tag}.jsonl")
    rc, t, log = e2e.run([forge_train, os.path.join(out, f"{name}.forge"), "--data", data,
                          "--steps", str(steps), "--device", device, "--dump-grads", grads,
                          "--dump-params", params, "--metrics", metrics, *extra])
    return rc, log, grads, params, metrics


def check(rep, forge_train, out, device):
    for name, (ratio, layers) in CASES.items():
        scale = np.float32(1.0 / (1.0 - ratio))
        rc, log, g, p, m = train(forge_train, out, name, f"{name}.a", device, 2,
                                 ("--eval-data", os.path.join(out, "data.npz"), "--eval-every", "2"))
        if not rep.check(f"{name} forge-train on {device}", rc == 0, e2e.failure(rc, log)):
            continue
        g1 = np.load(g)["w"]
        w2 = np.load(p)["w"]
        g2 = (np.float32(1) - w2) - g1
        if layers == 1:
            for step, gs in ((1, g1), (2, g2)):
                ok_values = np.all((gs == 0) | (gs == scale))
                kept = int(np.count_nonzero(gs))
                sigma = math.sqrt(N * ratio * (1 - ratio))
                rep.check(f"{name} step {step} values are 0 or 1/(1-ratio)", ok_values,
                          f"distinct {np.unique(gs)[:6]}")
                rep.check(f"{name} step {step} keep rate", abs(kept - N * (1 - ratio)) <= 4 * sigma,
                          f"kept {kept}/{N}, expected {N * (1 - ratio):.0f} +- {4 * sigma:.0f}")
            rep.check(f"{name} steps draw different masks", not np.array_equal(g1 != 0, g2 != 0),
                      f"{np.count_nonzero((g1 != 0) != (g2 != 0))} elements differ")
            evals = [r for r in map(__import__("json").loads, open(m)) if "eval_loss" in r]
            rep.check(f"{name} eval does not drop", len(evals) == 1 and
                      abs(evals[0]["eval_loss"] - float(w2.astype(np.float64).sum()))
                      <= 1e-6 * float(np.abs(w2).sum()),
                      f"eval {evals[0]['eval_loss'] if evals else None}, sum(w2) {w2.sum()}")
        else:  # two layers: the product of two independent masks (keep rate 1/4)
            kept = int(np.count_nonzero(g1))
            sigma = math.sqrt(N * 0.25 * 0.75)
            rep.check(f"{name} two Dropouts draw independent masks",
                      np.all((g1 == 0) | (g1 == scale * scale)) and abs(kept - N / 4) <= 4 * sigma,
                      f"kept {kept}/{N}, expected {N / 4:.0f} +- {4 * sigma:.0f}")
        rc, log, gb, _, _ = train(forge_train, out, name, f"{name}.b", device, 1)
        rep.check(f"{name} a second run repeats step 1's mask bit for bit",
                  rc == 0 and np.array_equal(np.load(gb)["w"], g1), e2e.failure(rc, log))
        if device == "cuda":
            rc, log, gc, _, _ = train(forge_train, out, name, f"{name}.cpu", "cpu", 1)
            same = rc == 0 and np.array_equal(np.load(gc)["w"], g1)
            rep.check(f"{name} CUDA mask == CPU mask (bit for bit)", same,
                      e2e.failure(rc, log) if rc else
                      f"{np.count_nonzero(np.load(gc)['w'] != g1)} elements differ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bundles", help="compiled cases (written with --compile-only)")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not a.compile_only and not e2e.gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed)")
        return 77
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-dropout-") as tmp:
        out = a.bundles or tmp
        os.makedirs(out, exist_ok=True)
        if not (a.bundles and not a.compile_only):  # compile unless running prebuilt bundles
            forgec = a.forgec or e2e.find_tool("forgec", a.bin_dir)
            compile_all(rep, forgec, out, "cuda:sm_90" if a.device == "cuda" or a.compile_only
                        else "cpu")
        if not a.compile_only:
            forge_train = a.forge_train or e2e.find_tool("forge-train", a.bin_dir)
            check(rep, forge_train, out, a.device)
            if a.device == "cpu":
                check_splits(rep, a.forgec or e2e.find_tool("forgec", a.bin_dir), forge_train,
                             out)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
