#!/usr/bin/env python3
"""PyTorch fixture for a model exported as most users export it: torch.onnx.export in eval
mode (its default). Writes tests/fixtures/evalexport_cnn/ for tests/e2e/test_eval_export.py.

The model (Conv-BatchNorm-ReLU-pool, Linear-LayerNorm-ReLU, two 8x8 Linears, head) has equal
initial values the exporter merges into shared initializers with Identity nodes (the zero
biases and LayerNorm weights/biases), and a BatchNorm whose running statistics PyTorch updates
with the UNBIASED batch variance. PyTorch trains it 10 SGD steps (train mode, fixed batches,
fp32), then evaluates it (eval mode: running statistics) on a held-out batch.

Files:
  model.onnx        the eval-mode export (dynamo=False, opset 17, constant folding off so the
                    BatchNorm is not folded into the convolution)
  batches.npz       x [80, 3, 8, 8], labels [80]: step k uses rows 8k..8k+7
  heldout.npz       x [8, 3, 8, 8]: the evaluation batch
  losses.npy        PyTorch's loss at each of the 10 steps
  eval_logits.npy   PyTorch's eval-mode logits on heldout.npz after the 10 steps
  evalexport.json   versions, hyper-parameters, the merged initializers found in the export
                    (not manifest.json: test_parity.py takes every dir with one as its own)

Run (needs torch and onnx; CPU, deterministic):
  python tools/gen_eval_export_fixture.py [--out-dir tests/fixtures/evalexport_cnn]
"""
import argparse
import io
import json
import os
import sys
import warnings

import numpy as np
import onnx
import torch
from torch import nn

STEPS, BATCH, LR = 10, 8, 0.1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        for m in (self.conv, self.fc1, self.fc2, self.fc3, self.head):
            nn.init.zeros_(m.bias)  # equal values: the eval-mode export merges them

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        h = torch.relu(self.ln(self.fc1(h)))
        h = torch.tanh(self.fc3(torch.tanh(self.fc2(h))))
        return self.head(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "tests", "fixtures",
                                                      "evalexport_cnn"))
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = Net()
    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS * BATCH, 3, 8, 8, generator=gen)
    ys = torch.randint(0, 3, (STEPS * BATCH,), generator=gen)
    heldout = torch.randn(BATCH, 3, 8, 8, generator=gen)

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Constant folding off: on, it folds the eval-mode BatchNorm into the convolution
        # (then there is no BatchNorm left to train). Deduplication happens either way.
        torch.onnx.export(model.eval(), (xs[:BATCH],), f, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"], do_constant_folding=False,
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    proto = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(proto)
    merged = {n.output[0]: n.input[0] for n in proto.graph.node
              if n.op_type == "Identity" and n.input[0] in {i.name for i in proto.graph.initializer}}
    if len(merged) < 3:
        sys.exit(f"expected the export to merge equal initializers, found {merged}")

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for k in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xs[k * BATCH:(k + 1) * BATCH]),
                                           ys[k * BATCH:(k + 1) * BATCH])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        eval_logits = model(heldout).numpy()

    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "model.onnx"), "wb") as out:
        out.write(f.getvalue())
    np.savez(os.path.join(a.out_dir, "batches.npz"), x=xs.numpy(), labels=ys.numpy())
    np.savez(os.path.join(a.out_dir, "heldout.npz"), x=heldout.numpy())
    np.save(os.path.join(a.out_dir, "losses.npy"), np.array(losses, np.float64))
    np.save(os.path.join(a.out_dir, "eval_logits.npy"), eval_logits.astype(np.float32))
    manifest = {"generated_by": "tools/gen_eval_export_fixture.py", "steps": STEPS,
                "batch_size": BATCH, "optimizer": f"sgd:lr={LR}", "exporter": "torchscript eval",
                "merged_initializers": merged, "producer": proto.producer_name,
                "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                             "numpy": np.__version__}}
    with open(os.path.join(a.out_dir, "evalexport.json"), "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
    print(f"wrote {a.out_dir}: merged {merged}; losses {losses[0]:.5f} -> {losses[-1]:.5f}")


if __name__ == "__main__":
    main()
