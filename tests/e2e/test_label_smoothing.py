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

Probability targets (`cross_entropy:OUT,LABEL,probs`: the label input holds [N, C] class
probabilities, PyTorch's probability targets, for one-hot, mixup or distillation targets):
seeded soft rows (Dirichlet) trained against the same reference with that target matrix,
without and with smoothing 0.1 ((1 - s) q + s / C); one-hot rows equal the class-index loss
step for step (1e-6), and eval reports the same loss and accuracy (a row's most probable
class as its label); a probs bundle given index labels is refused by the data check.

ignore=N (PyTorch's ignore_index): rows labelled N have no term, the mean is over the others,
with smoothing 0 and 0.1 (an ignored row has no smoothing term either), and eval reports the
kept rows' loss and accuracy.

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


def reference(smoothing, probs=None, labels=None, ignore=None):
    """Per-step losses in float64; `probs`: [samples, C] target rows instead of the labels;
    `labels` replaces the fixture's, and rows whose label is `ignore` have no term (the mean
    and its gradient are over the other rows)."""
    p = {k: v.astype(np.float64) for k, v in np.load(os.path.join(FIXTURE, "init_params.npz")).items()}
    data = np.load(os.path.join(FIXTURE, "batches.npz"))
    bufs, losses = {}, []
    for step in range(STEPS):
        x = data["x"][step * BATCH:(step + 1) * BATCH].astype(np.float64)
        y = (data["labels"] if labels is None else labels)[step * BATCH:(step + 1) * BATCH]
        keep = np.ones(len(y), dtype=bool) if ignore is None else y != ignore
        y = np.where(keep, y, 0)
        h = x @ p["fc1.weight"].T + p["fc1.bias"]
        a = np.maximum(h, 0)
        z = a @ p["fc2.weight"].T + p["fc2.bias"]
        zs = z - z.max(1, keepdims=True)
        lp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
        n, c = z.shape
        if probs is None:
            q = np.zeros((n, c))
            q[np.arange(n), y] = 1
        else:
            q = probs[step * BATCH:(step + 1) * BATCH].astype(np.float64)
        target = (1 - smoothing) * q + smoothing / c
        terms = -(target * lp).sum(1)
        losses.append(terms[keep].mean())
        dz = (np.exp(lp) - target) * keep[:, None] / keep.sum()
        g = {"fc2.weight": dz.T @ a, "fc2.bias": dz.sum(0)}
        da = dz @ p["fc2.weight"] * (h > 0)
        g["fc1.weight"], g["fc1.bias"] = da.T @ x, da.sum(0)
        for k in p:
            bufs[k] = g[k] if k not in bufs else MOMENTUM * bufs[k] + g[k]
            p[k] = p[k] - LR * bufs[k]
    if ignore is None:
        return losses
    # The eval after the last step: every sample, kept rows only.
    y = labels
    z = np.maximum(data["x"] @ p["fc1.weight"].T + p["fc1.bias"], 0) @ p["fc2.weight"].T + p["fc2.bias"]
    zs = z - z.max(1, keepdims=True)
    lp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
    keep = y != ignore
    yk = np.where(keep, y, 0)
    eval_loss = -lp[np.arange(len(y)), yk][keep].mean()
    eval_acc = (z.argmax(1) == yk)[keep].mean()
    return losses, eval_loss, eval_acc


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
        def train(loss, tag, data=os.path.join(FIXTURE, "batches.npz"), extra=()):
            bundle = os.path.join(tmp, tag + ".forge")
            rc, _, log = e2e.run([forgec, os.path.join(FIXTURE, "model.onnx"), "--target", "cpu",
                                  "--batch", str(BATCH), "--loss", loss, "--optimizer",
                                  f"sgd:lr={LR},momentum={MOMENTUM}", "-o", bundle])
            if rc != 0:
                return None, e2e.failure(rc, log)
            metrics = os.path.join(tmp, tag + ".jsonl")
            rc, _, log = e2e.run([forge_train, bundle, "--data", data, "--no-shuffle",
                                  "--steps", str(STEPS), "--device", "cpu", "--metrics",
                                  metrics] + list(extra))
            if rc != 0:
                return None, e2e.failure(rc, log)
            return e2e.metric_losses(metrics), metrics
        for s in (0.1, 0.3):
            got, why = train(f"cross_entropy:logits,labels,smoothing={s}", f"s{s}")
            want = reference(s)
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf")) \
                if got and len(got) == STEPS else float("inf")
            rep.check(f"smoothing {s}", err <= TOL,
                      f"{STEPS} steps, max rel {err:.1e} (<= {TOL})" if got else why)
        # Probability targets: soft rows, then one-hot rows against class indices.
        arrays = dict(np.load(os.path.join(FIXTURE, "batches.npz")))
        soft = np.random.default_rng(7).dirichlet(np.ones(10), len(arrays["labels"]))
        soft_npz, onehot_npz = (os.path.join(tmp, f) for f in ("soft.npz", "onehot.npz"))
        np.savez(soft_npz, x=arrays["x"], labels=soft.astype(np.float32))
        np.savez(onehot_npz, x=arrays["x"],
                 labels=np.eye(10, dtype=np.float32)[arrays["labels"]])
        for s in (0.0, 0.1):
            got, why = train("cross_entropy:logits,labels,probs" +
                             (f",smoothing={s}" if s else ""), f"p{s}", soft_npz)
            want = reference(s, soft.astype(np.float32))
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf")) \
                if got and len(got) == STEPS else float("inf")
            rep.check(f"soft targets, smoothing {s}", err <= TOL,
                      f"{STEPS} steps, max rel {err:.1e} (<= {TOL})" if got else why)
        # ignore=-100 (padding of length buckets, PyTorch's ignore_index): every third label
        # ignored, and one batch with a single kept row; the eval loss is the kept rows' mean.
        ignored = arrays["labels"].astype(np.int64).copy()
        ignored[::3] = -100
        ignored[2 * BATCH:3 * BATCH] = -100
        ignored[2 * BATCH + 5] = arrays["labels"][2 * BATCH + 5]
        ignore_npz = os.path.join(tmp, "ignore.npz")
        np.savez(ignore_npz, x=arrays["x"], labels=ignored)
        # With smoothing an ignored row has no smoothing term either, the mean of both terms is
        # over the kept rows (PyTorch's label_smoothing beside ignore_index); the eval loss stays
        # the kept rows' plain cross-entropy.
        for s, tag, name, eval_name in (
                (0.0, "ignore", "ignore=-100",
                 "... eval: loss and accuracy over the kept labels (forge.label_count)"),
                (0.1, "ignore_s", "ignore=-100 with smoothing 0.1",
                 "... eval: the kept labels' plain loss and accuracy")):
            got, metrics = train("cross_entropy:logits,labels,ignore=-100" +
                                 (f",smoothing={s}" if s else ""), tag, ignore_npz,
                                 ["--eval-data", ignore_npz, "--eval-every", str(STEPS)])
            want, want_eval, want_acc = reference(s, labels=ignored, ignore=-100)
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf")) \
                if got and len(got) == STEPS else float("inf")
            rep.check(name, err <= TOL,
                      f"{STEPS} steps, max rel {err:.1e} (<= {TOL})" if got else metrics)
            if got:
                ev = [json.loads(line) for line in open(metrics) if "eval_loss" in line]
                rep.check(eval_name,
                          len(ev) == 1 and abs(ev[0]["eval_loss"] - want_eval) <= TOL * want_eval
                          and abs(ev[0]["eval_accuracy"] - want_acc) <= 1e-9,
                          f"{ev} vs loss {want_eval:.6g}, accuracy {want_acc:.6g}")
        evals = ["--eval-data", None, "--eval-every", str(STEPS)]
        runs = []
        for loss, data in (("cross_entropy:logits,labels,probs", onehot_npz),
                           ("cross_entropy:logits,labels", os.path.join(FIXTURE, "batches.npz"))):
            evals[1] = data
            runs.append(train(loss, "onehot" if "probs" in loss else "index", data, evals))
        if rep.check("one-hot targets and class indices train", all(r[0] for r in runs),
                     " | ".join(r[1] for r in runs if not r[0])):
            (a, ma), (b, mb) = runs
            err = max(abs(x - y) / abs(y) for x, y in zip(a, b))
            rep.check("one-hot targets == class indices, step for step", err <= 1e-6,
                      f"max rel {err:.1e} (<= 1e-6)")
            ea, eb = ([json.loads(line) for line in open(m) if "eval_loss" in line] for m in (ma, mb))
            rep.check("... and their eval loss and accuracy", len(ea) == len(eb) == 1 and
                      abs(ea[0]["eval_loss"] - eb[0]["eval_loss"]) <= 1e-6 * eb[0]["eval_loss"]
                      and ea[0]["eval_accuracy"] == eb[0]["eval_accuracy"] > 0,
                      f"{ea} vs {eb}")
        got, why = train("cross_entropy:logits,labels,probs", "wrong",
                         os.path.join(FIXTURE, "batches.npz"))
        rep.check("a probs bundle refuses class-index labels", got is None and "labels" in why,
                  why)
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
