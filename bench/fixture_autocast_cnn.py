#!/usr/bin/env python3
"""PyTorch's own bf16 on the cnn fixture: how far autocast lands from the fp32 parameters.

tests/e2e/test_precision.py bounds Forge's cnn parameters after the fixture's 20 AdamW steps
(relative L2 per parameter against PyTorch fp32, params_step20.npz). On a GPU Forge runs the
cnn's convolutions in bf16 (channels-last, forge-assign-layout); this script trains the same
model (tools/gen_fixtures.py's CNN), initial weights, batches and optimizer on the CPU, in fp32
(which must reproduce params_step20.npz to ~1e-6: a check of the script) and under
torch.autocast(bfloat16) (convolutions in bf16), and prints each run's worst parameter.
Measured 2026-12-02: fp32 1.5e-6, autocast 0.155 (features.1.bias).

Usage: fixture_autocast_cnn.py [--fixture tests/fixtures/cnn_adamw]   (needs torch)
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import gen_fixtures as g  # noqa: E402


def train(d, autocast):
    init = np.load(os.path.join(d, "init_params.npz"))
    data = np.load(os.path.join(d, "batches.npz"))
    model = g.CNN()
    state = model.state_dict()
    for k in state:
        if k in init.files:
            state[k] = torch.from_numpy(init[k])
    model.load_state_dict(state)
    opt = g.make_optimizer(model, "adamw")
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["labels"])
    batch = 4
    for s in range(20):
        j = s % (len(x) // batch)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = g.loss_fn(model(x[j * batch:(j + 1) * batch]), y[j * batch:(j + 1) * batch])
        loss.backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", default=os.path.join(HERE, "..", "tests", "fixtures", "cnn_adamw"))
    a = ap.parse_args()
    ref = np.load(os.path.join(a.fixture, "params_step20.npz"))
    for autocast in (False, True):
        got = train(a.fixture, autocast)
        errs = {k: float(np.linalg.norm(got[k] - ref[k]) / np.linalg.norm(ref[k]))
                for k in ref.files if k in got and "running" not in k}
        worst = max(errs, key=errs.get)
        print(f"{'autocast bf16' if autocast else 'fp32'}: worst {errs[worst]:.3g} ({worst})")


if __name__ == "__main__":
    main()
