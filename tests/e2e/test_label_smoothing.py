#!/usr/bin/env python3
"""Cross-entropy with label smoothing (issue #13 item 2: forgec --loss cross_entropy:OUT,LABEL,smoothing=S).

Trains tests/fixtures/mlp_sgd_momentum's MLP (64-32-10, ReLU; SGD with momentum 0.9, lr 0.05,
batch 8, its batches in file order) for STEPS steps with smoothing 0.1 and 0.3 and checks every
step's loss against a float64 numpy reference of the same training (forward, the smoothed loss
(1 - s) NLL + s mean_c(-log p), as PyTorch's label_smoothing, its gradient softmax - (1 - s)
onehot - s / C, backward, PyTorch's momentum update): relative error <= TOL per step. The
losses after the first step depend on the gradient, so the backward of the smoothing term is
checked too. Also: smoothing=0 compiles to the plain loss (equal losses), and a smoothing
outside [0, 1) is refused with the value named.

  test_label_smoothing.py [--bin-dir DIR | --forgec F --forge-train T]
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.normpath(os.path.join(HERE, "..", "fixtures", "mlp_sgd_momentum"))
STEPS, BATCH, LR, MOMENTUM = 6, 8, 0.05, 0.9
TOL = 1e-5


def reference(smoothing):
    p = {k: v.astype(np.float64) for k, v in np.load(os.path.join(FIXTURE, "init_params.npz")).items()}
    data = np.load(os.path.join(FIXTURE, "batches.npz"))
    bufs, losses = {}, []
    for step in range(STEPS):
        x = data["x"][step * BATCH:(step + 1) * BATCH].astype(np.float64)
        y = data["labels"][step * BATCH:(step + 1) * BATCH]
        h = x @ p["fc1.weight"].T + p["fc1.bias"]
        a = np.maximum(h, 0)
        z = a @ p["fc2.weight"].T + p["fc2.bias"]
        zs = z - z.max(1, keepdims=True)
        lp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
        n, c = z.shape
        nll = -lp[np.arange(n), y].mean()
        losses.append((1 - smoothing) * nll + smoothing * -lp.mean())
        target = np.full((n, c), smoothing / c)
        target[np.arange(n), y] += 1 - smoothing
        dz = (np.exp(lp) - target) / n
        g = {"fc2.weight": dz.T @ a, "fc2.bias": dz.sum(0)}
        da = dz @ p["fc2.weight"] * (h > 0)
        g["fc1.weight"], g["fc1.bias"] = da.T @ x, da.sum(0)
        for k in p:
            bufs[k] = g[k] if k not in bufs else MOMENTUM * bufs[k] + g[k]
            p[k] = p[k] - LR * bufs[k]
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_label_smoothing")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-smoothing-") as tmp:
        def train(loss, tag):
            bundle = os.path.join(tmp, tag + ".forge")
            rc, _, log = e2e.run([forgec, os.path.join(FIXTURE, "model.onnx"), "--target", "cpu",
                                  "--batch", str(BATCH), "--loss", loss, "--optimizer",
                                  f"sgd:lr={LR},momentum={MOMENTUM}", "-o", bundle])
            if rc != 0:
                return None, e2e.failure(rc, log)
            metrics = os.path.join(tmp, tag + ".jsonl")
            rc, _, log = e2e.run([forge_train, bundle, "--data",
                                  os.path.join(FIXTURE, "batches.npz"), "--no-shuffle",
                                  "--steps", str(STEPS), "--device", "cpu", "--metrics", metrics])
            if rc != 0:
                return None, e2e.failure(rc, log)
            return e2e.metric_losses(metrics), ""
        for s in (0.1, 0.3):
            got, why = train(f"cross_entropy:logits,labels,smoothing={s}", f"s{s}")
            want = reference(s)
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf")) \
                if got and len(got) == STEPS else float("inf")
            rep.check(f"smoothing {s}", err <= TOL,
                      f"{STEPS} steps, max rel {err:.1e} (<= {TOL})" if got else why)
        plain, why1 = train("cross_entropy:logits,labels", "plain")
        zero, why2 = train("cross_entropy:logits,labels,smoothing=0", "zero")
        rep.check("smoothing 0 is the plain loss", plain is not None and plain == zero,
                  f"{plain} vs {zero}" if plain else why1 or why2)
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURE, "model.onnx"), "--target", "cpu",
                              "--batch", "8", "--loss", "cross_entropy:logits,labels,smoothing=1",
                              "--optimizer", "sgd", "-o", os.path.join(tmp, "bad.forge")])
        rep.check("smoothing 1 refused", rc not in (0, None) and "0 <= S < 1, not '1'" in log,
                  e2e.tail(log, 1))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
