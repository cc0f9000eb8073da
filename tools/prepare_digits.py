#!/usr/bin/env python3
"""Write the README demo's data set and model: scikit-learn's handwritten digits + an MLP.

Writes (all committed; neither scikit-learn nor PyTorch is needed to use them):
  models/data/digits_train.npz  x float32 [1437, 64] in [0, 1], labels int64 [1437]
  models/data/digits_test.npz   x float32 [360, 64],            labels int64 [360]
  models/digits_mlp.onnx        MLP 64-128-64-10 (ReLU), input "x" [batch, 64] -> output
                                "logits" [batch, 10], batch dim symbolic, seeded PyTorch
                                default init, TorchScript exporter, opset 17
The data is sklearn.datasets.load_digits() (1797 8x8 images, pixel values 0..16), scaled
by 1/16, split by sklearn's train_test_split(test_size=360, stratify=labels,
random_state=0). The .npz files are plain np.savez (stored members, no compression), with
arrays named after the graph input they feed ("x") and the loss's label input ("labels").

--check also trains the MLP in PyTorch on the train split with the demo's recipe (below)
and prints the test accuracy, i.e. what Forge's demo should reach (same recipe, different
batch order, so not to the digit).

Run where scikit-learn and PyTorch are installed:
  /tmp/modelvenv/bin/pip install scikit-learn        # once
  /tmp/modelvenv/bin/python tools/prepare_digits.py [--check]
"""
import argparse
import io
import json
import os
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.normpath(os.path.join(HERE, "..", "models"))
TEST_SIZE = 360
SPLIT_SEED = 0
MODEL_SEED = 0
# The demo's recipe (also what --check runs in PyTorch):
RECIPE = {"optimizer": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
          "weight_decay": 0.01, "weight_decay_on": "weights (dim >= 2) only",
          "batch": 32, "steps": 1000, "shuffle": "seeded permutation per epoch",
          "loss": "cross_entropy:logits,labels"}


def make_data():
    import sklearn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=TEST_SIZE, stratify=y,
                                          random_state=SPLIT_SEED)
    return (np.ascontiguousarray(xtr), ytr), (np.ascontiguousarray(xte), yte), sklearn.__version__


def make_model():
    import torch
    import torch.nn as nn
    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def export(model, path):
    import onnx
    import torch
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Training mode, no constant folding: initializers keep their torch names
        # (0.weight, 0.bias, 2.weight, ...) and are never merged (see tools/gen_fixtures.py).
        torch.onnx.export(model, (torch.zeros(3, 64),), f, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    proto = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(proto)
    with open(path, "wb") as out:
        out.write(f.getvalue())
    return proto


def check(model, train, test):
    """Trains with RECIPE in PyTorch; returns (test accuracy, final train loss, seconds)."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": RECIPE["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=RECIPE["lr"],
                            betas=(RECIPE["beta1"], RECIPE["beta2"]), eps=RECIPE["eps"])
    xtr, ytr = torch.from_numpy(train[0]), torch.from_numpy(train[1])
    rng = np.random.default_rng(0)
    b, n = RECIPE["batch"], len(ytr)
    order, pos = rng.permutation(n), 0
    t0 = time.monotonic()
    for _ in range(RECIPE["steps"]):
        if pos + b > n:
            order, pos = rng.permutation(n), 0
        idx = torch.from_numpy(order[pos:pos + b])
        pos += b
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    secs = time.monotonic() - t0
    with torch.no_grad():
        acc = (model(torch.from_numpy(test[0])).argmax(1).numpy() == test[1]).mean()
    return float(acc), float(loss.item()), secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=MODELS)
    ap.add_argument("--check", action="store_true", help="train in PyTorch, print test accuracy")
    a = ap.parse_args()
    train, test, skl = make_data()
    data_dir = os.path.join(a.models_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    np.savez(os.path.join(data_dir, "digits_train.npz"), x=train[0], labels=train[1])
    np.savez(os.path.join(data_dir, "digits_test.npz"), x=test[0], labels=test[1])
    model = make_model()
    proto = export(model, os.path.join(a.models_dir, "digits_mlp.onnx"))
    import onnx
    import torch
    print(f"scikit-learn {skl}, torch {torch.__version__}, onnx {onnx.__version__}, "
          f"numpy {np.__version__}")
    print(f"train {train[0].shape} {np.bincount(train[1]).tolist()}; "
          f"test {test[0].shape} {np.bincount(test[1]).tolist()}")
    print("initializers:", [(i.name, list(i.dims)) for i in proto.graph.initializer])
    for fn in ("data/digits_train.npz", "data/digits_test.npz", "digits_mlp.onnx"):
        print(f"  models/{fn}: {os.path.getsize(os.path.join(a.models_dir, fn))} bytes")
    if a.check:
        acc, loss, secs = check(model, train, test)
        print(f"PyTorch, recipe {json.dumps(RECIPE)}: test accuracy {acc:.4f}, last train loss "
              f"{loss:.4f}, {secs:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
