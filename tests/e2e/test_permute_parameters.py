#!/usr/bin/env python3
"""Weights stored in the convolutions' layout (forge-permute-parameters; issue #12 item 1:
"a conv net has at most the one transpose at its input").

tests/models/resnet18_dynamo.onnx (torchvision ResNet-18, dynamo export) compiled for
cuda:sm_90 in bf16 (channels-last) with the default --permute-parameters and with
--permute-parameters=false, each bundle run on the CPU executor (which runs CUDA bundles op by
op). Checked:
  * the permuted step has no weight or weight-gradient transposes left: per routine, at least
    one launch fewer per conv weight (read) and per weight gradient (train_step), counting the
    convs whose kernel is not 1x1 (a 1x1 weight's transpose is a reshape already);
  * both train identically (the same ops on the same values in another order of storage:
    rel <= 1e-6 per step);
  * checkpoints are canonical (ONNX layout): one written by the permuted bundle resumes in the
    unpermuted one and continues its trajectory, and the reverse;
  * --dump-params and the ONNX export give the ONNX shapes and the same values as the
    unpermuted run;
  * under --dp 2 (CPU ranks) the weights stay permuted (the all_reduce is element by element)
    and train as the ONNX-layout bundle does;
  * a thin bundle (--weights external: initial weights read from the model's external data
    file, canonical) trains as the embedded one does.

  test_permute_parameters.py [--bin-dir DIR | --forgec F --forge-train T]
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.normpath(os.path.join(HERE, "..", "models", "resnet18_dynamo.onnx"))
BATCH, STEPS = 4, 4
LOSS = "cross_entropy:logits,labels"
OPT = "adamw:lr=0.001,weight_decay=0.01"
TOL = 1e-6


def launches(summary):
    """{routine: launches} of the last stage in a --dump-dir summary.txt."""
    last = [line for line in open(summary) if line.strip()][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", last.split("by routine:")[1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_permute_parameters")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-permute-") as tmp:
        p = lambda name: os.path.join(tmp, name)
        rng = np.random.default_rng(0)
        np.savez(p("data.npz"), x=rng.standard_normal((4 * BATCH, 3, 32, 32)).astype(np.float32),
                 labels=rng.integers(0, 10, 4 * BATCH).astype(np.int64))

        def compile(out, extra, model=MODEL):
            return e2e.run([forgec, model, "--target", "cuda:sm_90", "--precision", "bf16",
                            "--batch", str(BATCH), "--loss", LOSS, "--optimizer", OPT, "-o", out]
                           + extra)

        for tag, extra in (("perm", []), ("plain", ["--permute-parameters=false"])):
            rc, _, log = compile(p(tag + ".forge"), ["--dump-dir", p(tag)] + extra)
            if not rep.check(f"compile ({tag})", rc == 0, e2e.failure(rc, log)):
                return rep.summary()
        # Convs whose weight transpose moves data (a 1x1 kernel's is a reshape, a view).
        m = onnx.load(MODEL)
        dims = {t.name: list(t.dims) for t in m.graph.initializer}
        convs = sum(1 for n in m.graph.node if n.op_type == "Conv" and
                    dims.get(n.input[1], [0, 0, 1, 1])[2:] != [1, 1])
        lp, lu = launches(p("perm/summary.txt")), launches(p("plain/summary.txt"))
        rep.check("no weight or weight-gradient transposes: a launch fewer per conv weight and "
                  "per gradient", lu["train_step"] - lp["train_step"] >= 2 * convs and
                  lu["eval"] - lp["eval"] >= convs,
                  f"{convs} convs; train_step {lu['train_step']} -> {lp['train_step']}, eval "
                  f"{lu['eval']} -> {lp['eval']}")

        def train(bundle, tag, steps=STEPS, extra=()):
            metrics = p(tag + ".jsonl")
            rc, _, log = e2e.run([forge_train, bundle, "--data", p("data.npz"), "--no-shuffle",
                                  "--steps", str(steps), "--device", "cpu", "--metrics",
                                  metrics] + list(extra))
            if rc != 0:
                return None, e2e.failure(rc, log)
            return e2e.metric_losses(metrics), ""

        perm, why = train(p("perm.forge"), "perm", extra=["--dump-params", p("perm_params.npz"),
                                                          "--export-onnx", p("perm.onnx")])
        plain, why2 = train(p("plain.forge"), "plain",
                            extra=["--dump-params", p("plain_params.npz"),
                                   "--export-onnx", p("plain.onnx")])
        if not rep.check("both train", perm and plain, why or why2):
            return rep.summary()
        err = max(abs(x - y) / abs(y) for x, y in zip(perm, plain))
        rep.check("the permuted step trains as the ONNX-layout one", err <= TOL,
                  f"{STEPS} steps, max rel {err:.1e} (<= {TOL}): {perm}")

        a_, b_ = np.load(p("perm_params.npz")), np.load(p("plain_params.npz"))
        bad = [k for k in b_.files if k not in a_.files or a_[k].shape != b_[k].shape or
               e2e.rel(a_[k], b_[k]) > 1e-5]
        rep.check("--dump-params: ONNX shapes and the same values", not bad and
                  len(a_.files) == len(b_.files), f"{len(b_.files)} arrays; differing: {bad[:4]}")
        ea = {t.name: numpy_helper.to_array(t) for t in onnx.load(p("perm.onnx")).graph.initializer}
        eb = {t.name: numpy_helper.to_array(t) for t in onnx.load(p("plain.onnx")).graph.initializer}
        bad = [k for k in eb if k not in ea or ea[k].shape != eb[k].shape or
               e2e.rel(ea[k], eb[k]) > 1e-5]
        rep.check("--export-onnx: the same initializers", not bad and len(ea) == len(eb),
                  f"{len(eb)} initializers; differing: {bad[:4]}")

        # Checkpoints hold the ONNX layout: either bundle resumes the other's.
        for src, dst in (("perm", "plain"), ("plain", "perm")):
            ckpt = p("ckpt_" + src)
            shutil.rmtree(ckpt, ignore_errors=True)
            first, why = train(p(src + ".forge"), src + "_half", 2,
                               ["--ckpt-dir", ckpt, "--ckpt-every", "2"])
            rest, why2 = train(p(dst + ".forge"), dst + "_rest", STEPS,
                               ["--ckpt-dir", ckpt, "--resume"])
            ok = first and rest and len(rest) == STEPS - 2
            err = max(abs(x - y) / abs(y) for x, y in zip(rest, plain[2:])) if ok else 1
            rep.check(f"a checkpoint of the {src} bundle resumes in the {dst} one", ok and
                      err <= TOL, f"max rel {err:.1e} (<= {TOL})" if ok else why or why2)

        # Data parallelism (--dp 2, CPU ranks over Gloo): the gradients' all_reduce works
        # element by element, so the weights stay permuted; both layouts train alike.
        runs = {}
        for tag, extra in (("dp_perm", []), ("dp_plain", ["--permute-parameters=false"])):
            rc, _, log = e2e.run([forgec, MODEL, "--target", "cuda:sm_90", "--precision", "bf16",
                                  "--batch", str(BATCH // 2), "--dp", "2", "--loss", LOSS,
                                  "--optimizer", OPT, "--dump-dir", p(tag), "-o",
                                  p(tag + ".forge")] + extra)
            if rc != 0:
                runs[tag] = (None, e2e.failure(rc, log))
                continue
            runs[tag] = train(p(tag + ".forge"), tag, 3, ["--nproc", "2"])
        (dp, why), (dq, why2) = runs["dp_perm"], runs["dp_plain"]
        if rep.check("--dp 2 bundles train on CPU ranks", dp and dq, why or why2):
            fewer = launches(p("dp_plain/summary.txt"))["train_step"] - \
                launches(p("dp_perm/summary.txt"))["train_step"]
            err = max(abs(x - y) / abs(y) for x, y in zip(dp, dq))
            # The gradients' transposes go but their conversion to f32 for the all_reduce
            # (which the transpose did as it copied) stays a kernel: a launch fewer per weight.
            rep.check("... the weights stay permuted under --dp and train as the ONNX layout",
                      fewer >= convs and err <= TOL,
                      f"{fewer} launches fewer, max rel {err:.1e} (<= {TOL})")

        # A thin bundle: the initial weights come canonical from the external data file.
        ext = p("ext")
        os.makedirs(ext)
        m = onnx.load(MODEL)
        onnx.save_model(m, os.path.join(ext, "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.weights", size_threshold=0)
        rc, _, log = compile(p("thin.forge"), ["--weights", "external"],
                             model=os.path.join(ext, "model.onnx"))
        if rep.check("compile a thin permuted bundle", rc == 0, e2e.failure(rc, log)):
            thin, why = train(p("thin.forge"), "thin", extra=["--weights", ext])
            ok = thin is not None and len(thin) == STEPS
            err = max(abs(x - y) / abs(y) for x, y in zip(thin, plain)) if ok else 1
            rep.check("... and trains as the embedded one", ok and err <= TOL,
                      f"max rel {err:.1e} (<= {TOL})" if ok else why)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
