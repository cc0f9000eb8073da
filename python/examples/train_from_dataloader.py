#!/usr/bin/env python3
"""Train a Forge bundle from a torch.utils.data.DataLoader (docs/python.md).

A PyTorch MLP is exported to ONNX, compiled with forge.compile, and trained by
forge.Trainer on batches a DataLoader yields (CPU tensors, taken through DLPack without a
copy); the held-out accuracy is printed. Needs torch (not needed by Forge itself).

  PYTHONPATH=build/python python python/examples/train_from_dataloader.py [--device cuda]
      [--bundle FILE]   a bundle compiled before (e.g. on a machine with forgec, from
                        models/digits_mlp.onnx: the same layers) instead of compiling here
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import forge

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def digits(split):
    with np.load(os.path.join(ROOT, "models", "data", f"digits_{split}.npz")) as d:
        return torch.from_numpy(d["x"]), torch.from_numpy(d["labels"])


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def export(module, path):
    torch.onnx.export(module, (torch.zeros(2, 64),), path, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}},
                      dynamo=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--bundle", help="a compiled bundle of this MLP (skips export and compile)")
    a = ap.parse_args()
    batch = 32
    with tempfile.TemporaryDirectory() as tmp:
        if a.bundle:
            bundle = forge.Bundle.load(a.bundle)
        else:
            onnx_path = os.path.join(tmp, "mlp.onnx")
            export(mlp(), onnx_path)
            bundle = forge.compile(onnx_path, batch=batch, loss="cross_entropy:logits,labels",
                                   optimizer="adamw:lr=2e-3",
                                   target="cuda:sm_90" if a.device.startswith("cuda") else "cpu")
        trainer = forge.Trainer(bundle, device=a.device)
        # drop_last: a bundle has a fixed batch (forgec --batch); pin_memory speeds the
        # upload when training on the GPU.
        loader = DataLoader(TensorDataset(*digits("train")), batch_size=batch, shuffle=True,
                            drop_last=True, pin_memory=a.device.startswith("cuda"),
                            generator=torch.Generator().manual_seed(0))
        for epoch in range(a.epochs):
            for x, y in loader:
                m = trainer.step({"x": x, "labels": y})
            print(f"epoch {epoch + 1}: step {m['step']}, loss {m['loss']:.4f}")
        x, y = digits("test")
        e = trainer.evaluate({"x": x, "labels": y})
        print(f"held-out: loss {e['loss']:.4f}, accuracy {100 * e['accuracy']:.2f}% "
              f"({e['samples']} samples)")
        if e["accuracy"] < 0.9:
            raise SystemExit("FAIL: accuracy below 90%")


if __name__ == "__main__":
    main()
