#!/usr/bin/env python3
"""How much TF32 in the forward convolutions moves models/cnn.onnx's step-1 gradients.

gpu_models_tf32 (tests/gpu/test_gpu_models.py --tf32) compares the cnn's step-1 gradients on
the GPU with the CPU's fp32 within 2e-3. With the convolutions on cuDNN's graph API
(FORGE_CONV_API=graph) they came out 2.5-4.9% off (features.1.bias 4.5e-2), with every one of
the 8 engines cuDNN offers, while each engine's forward output agrees with the CPU within
2.7e-4 (ConvGpuTest). This script computes the model's gradients in float64 on the CPU with
and without the forward convolutions' operands rounded to TF32 (10 mantissa bits, nearest
even; the backward exact), for conv 1, conv 2 and both, and prints the test's metric per
parameter: ||tf32 - exact|| / max(||exact||, 1e-2 ||all gradients||).
Measured 2026-12-03 on the gpu_models_tf32 batch: conv 2 alone gives features.1.bias 4.5e-2,
features.1.weight 4.3e-2, features.4.weight 2.9e-2, features.0.weight 2.5e-2, features.5.bias
6.3e-3 (the GPU's figures with conv 1 on an exact FMA engine, to two digits); both convs
3.3-4.9e-2 (the GPU's other group). So the graph API computes genuine TF32, which this model
amplifies through batch norm (its early gradients are small differences); the legacy
heuristics pick exact FMA algorithms for these small convolutions, and PyTorch's TF32 run
lands within 6.8e-4 for the same reason.

Usage: tf32_sensitivity_cnn.py --data BUNDLES/gpu_models_tf32/cnn.npz   (needs torch, onnx;
the .npz is what `test_gpu_models.py --compile-only --tf32` writes: the first 8 samples are
step 1's batch)
"""
import argparse
import os

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def tf32(t):
    """Rounds to TF32 (10 mantissa bits, nearest even) through float32's bits."""
    a = t.float().contiguous().view(torch.int32)
    a = (a + 0x0FFF + ((a >> 13) & 1)) & ~0x1FFF
    return a.view(torch.float32).double()


class RoundIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return tf32(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Conv(nn.Conv2d):
    round_operands = False

    def forward(self, x):
        if self.round_operands:
            return F.conv2d(RoundIn.apply(x), RoundIn.apply(self.weight), self.bias, padding=1)
        return super().forward(x)


class CNN(nn.Module):  # models/make_models.py's CNN
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            Conv(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            Conv(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "cnn.onnx"))
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(a.model).graph.initializer}
    data = np.load(a.data)
    x, y = data["x"][:a.batch], data["labels"][:a.batch]

    def grads(rounded):
        m = CNN().double()
        m.load_state_dict({k: torch.from_numpy(v.copy()).double() for k, v in init.items()})
        m.features[0].round_operands = 0 in rounded
        m.features[4].round_operands = 1 in rounded
        m.train()
        F.cross_entropy(m(torch.from_numpy(x).double()), torch.from_numpy(y)).backward()
        return {n: p.grad.numpy().copy() for n, p in m.named_parameters()}

    exact = grads(())
    total = np.sqrt(sum((g ** 2).sum() for g in exact.values()))
    for label, rounded in (("conv 1", (0,)), ("conv 2", (1,)), ("both", (0, 1))):
        got = grads(rounded)
        errs = {n: np.linalg.norm(got[n] - exact[n]) / max(np.linalg.norm(exact[n]), 1e-2 * total)
                for n in exact}
        print(f"TF32 {label}: " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()))


if __name__ == "__main__":
    main()
