#!/usr/bin/env python3
"""Give a Forge run's parameters back to the PyTorch module the ONNX came from
(docs/python.md): trainer.parameters() is keyed by initializer name, which for a PyTorch
export is the module's state_dict name. After training, the module with those weights
computes the held-out loss Forge's evaluate() reports (to float32 rounding); the check
fails otherwise. Needs torch.

  PYTHONPATH=build/python python python/examples/params_to_torch.py [--bundle FILE]
      (--bundle: compiled before, e.g. from models/digits_mlp.onnx, which has these layers)
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import forge
from train_from_dataloader import digits, export, mlp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", help="a compiled bundle of this MLP (skips export and compile)")
    a = ap.parse_args()
    module = mlp()
    with tempfile.TemporaryDirectory() as tmp:
        if a.bundle:
            bundle = forge.Bundle.load(a.bundle)
        else:
            onnx_path = os.path.join(tmp, "mlp.onnx")
            export(module, onnx_path)
            bundle = forge.compile(onnx_path, batch=32, loss="cross_entropy:logits,labels",
                                   optimizer="sgd:lr=0.1,momentum=0.9")
        trainer = forge.Trainer(bundle)
        x, y = digits("train")
        for s in range(200):
            i = (s * 32) % (len(x) - 32)
            trainer.step({"x": x[i:i + 32], "labels": y[i:i + 32]})
        params = trainer.parameters()
        module.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()},
                               strict=True)
        xt, yt = digits("test")
        with torch.no_grad():
            torch_loss = F.cross_entropy(module(xt), yt).item()
        forge_loss = trainer.evaluate({"x": xt, "labels": yt})["loss"]
        print(f"{len(params)} parameters loaded into the module ({', '.join(params)})")
        print(f"held-out loss: PyTorch module {torch_loss:.6f}, Forge {forge_loss:.6f}")
        if not np.isclose(torch_loss, forge_loss, rtol=1e-5):
            raise SystemExit("FAIL: the module's loss differs from Forge's")


if __name__ == "__main__":
    main()
