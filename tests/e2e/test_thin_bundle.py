#!/usr/bin/env python3
"""Thin bundles: forgec --weights external, forge-train --weights DIR (ctest e2e_thin_bundle).

models/mlp.onnx is re-saved with all initializers in one external-data file. Then:
  1. the graph file alone (no data file next to it) compiles with --weights external, and the
     bundle holds no parameter bytes (it is much smaller than the embedded one);
  2. trained with --weights DIR for 5 steps, its losses equal the embedded bundle's exactly;
  3. a bundle compiled where the data file was present records CRC-32s: a data file with one
     changed value is refused, naming the parameter and the file;
  4. without --weights the thin bundle is refused with a message naming --weights;
  5. --resume from a checkpoint needs no --weights.
"""
import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx

import forge_e2e as e2e
from forge_e2e import Report

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--models-dir", default=os.path.join(HERE, "..", "..", "models"))
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_thin_bundle")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        full, graph_only = os.path.join(tmp, "full"), os.path.join(tmp, "graph")
        os.makedirs(full)
        os.makedirs(graph_only)
        model = onnx.load(os.path.join(a.models_dir, "mlp.onnx"))
        onnx.save_model(model, os.path.join(full, "mlp.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="mlp.weights", size_threshold=0)
        shutil.copy(os.path.join(full, "mlp.onnx"), graph_only)  # the graph without its data
        rng = np.random.default_rng(0)
        data = os.path.join(tmp, "data.npz")
        np.savez(data, x=rng.standard_normal((40, 784)).astype(np.float32),
                 labels=rng.integers(0, 10, 40).astype(np.int64))
        common = ["--batch", "8", "--loss", "cross_entropy:logits,labels", "--optimizer", "adamw"]

        def compile_(src, out, *extra):
            rc, t, log = e2e.run([forgec, src] + common + list(extra) + ["-o", out])
            return rc, log

        thin, embedded, hashed = (os.path.join(tmp, n) for n in ("thin.forge", "embedded.forge",
                                                                "hashed.forge"))
        rc, log = compile_(os.path.join(graph_only, "mlp.onnx"), thin, "--weights", "external")
        rep.check("graph-only model compiles thin", rc == 0, e2e.tail(log))
        rc, log = compile_(os.path.join(a.models_dir, "mlp.onnx"), embedded)
        rep.check("embedded bundle compiles", rc == 0, e2e.tail(log))
        rc, log = compile_(os.path.join(full, "mlp.onnx"), hashed, "--weights", "external")
        rep.check("thin bundle with data present compiles", rc == 0, e2e.tail(log))
        if rep.failed:
            return rep.summary()
        weights = os.path.getsize(os.path.join(full, "mlp.weights"))
        rep.check("thin bundle holds no parameter bytes",
                  os.path.getsize(thin) + weights // 2 < os.path.getsize(embedded),
                  f"thin {os.path.getsize(thin)} B, embedded {os.path.getsize(embedded)} B, "
                  f"weights {weights} B")

        def train(bundle, name, *extra, steps=5):
            metrics = os.path.join(tmp, name + ".jsonl")
            rc, t, log = e2e.run([forge_train, bundle, "--data", data, "--steps", str(steps),
                                  "--no-shuffle", "--threads", "1", "--metrics", metrics,
                                  "--device", "cpu"] + list(extra))
            return rc, log, metrics

        rc, log, m_emb = train(embedded, "embedded")
        rc2, log2, m_thin = train(thin, "thin", "--weights", full)
        if rep.check("thin bundle trains with --weights", rc == 0 and rc2 == 0,
                     e2e.tail(log2)):
            embedded, from_weights = e2e.metric_losses(m_emb), e2e.metric_losses(m_thin)
            rep.check("losses equal the embedded bundle's", embedded == from_weights,
                      f"embedded {embedded} thin {from_weights}")
        rc, log, _ = train(thin, "missing")
        rep.check("refused without --weights", rc != 0 and "--weights" in log, e2e.tail(log, 2))

        corrupt = os.path.join(tmp, "corrupt")
        os.makedirs(corrupt)
        raw = bytearray(open(os.path.join(full, "mlp.weights"), "rb").read())
        raw[100] ^= 0x40
        open(os.path.join(corrupt, "mlp.weights"), "wb").write(bytes(raw))
        rc, log, _ = train(hashed, "corrupt", "--weights", corrupt)
        rep.check("changed weights file refused by CRC-32",
                  rc != 0 and "CRC-32" in log and "mlp.weights" in log, e2e.tail(log, 2))

        ckpt = os.path.join(tmp, "ckpt")
        rc, log, _ = train(thin, "ckpt", "--weights", full, "--ckpt-dir", ckpt)
        rc2, log2, _ = train(thin, "resumed", "--ckpt-dir", ckpt, "--resume", steps=7)
        rep.check("--resume needs no --weights", rc == 0 and rc2 == 0, e2e.tail(log2, 2))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
