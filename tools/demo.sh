#!/usr/bin/env bash
# The bundled demo: train an MLP on scikit-learn's handwritten digits (real data,
# models/data/, see models/README.md) and check that it reaches at least 95% test
# accuracy - on the CPU, or on the GPU when one is present (nvidia-smi sees it and
# the build has the CUDA device); then run the bundled PyTorch-exported MLP forward
# and compare with PyTorch's reference output.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

target=cpu
device=cpu
if cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) &&
   [ -n "$cap" ]; then
  arch="sm_${cap/./}"
  case "$arch" in
    sm_80|sm_89|sm_90) target="cuda:$arch"; device=cuda ;;
    *) target="cuda:sm_90"; device=cuda ;;  # newer GPUs JIT the sm_90 PTX
  esac
fi
echo "== forgec: models/digits_mlp.onnx -> training bundle (batch 32, AdamW, --target $target)"
$bin/forgec models/digits_mlp.onnx --batch 32 --loss cross_entropy:logits,labels \
  --optimizer adamw:lr=1e-3 --lr-schedule cosine:warmup=100,total=3000,min_ratio=0.05 \
  --target "$target" -o "$out/digits.forge"
echo "== forge-train: 3000 steps (~67 epochs) on 1437 digits, evaluated on 360 held-out digits"
$bin/forge-train "$out/digits.forge" --data models/data/digits_train.npz \
  --eval-data models/data/digits_test.npz --steps 3000 --eval-every 500 --seed 0 \
  --device "$device" --metrics "$out/metrics.jsonl" --log-every 500
.venv/bin/python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
evals = [m for m in map(json.loads, open(sys.argv[1])) if m.get("eval_accuracy") is not None]
acc = evals[-1]["eval_accuracy"]
print(f"final test accuracy: {100 * acc:.1f}% (goal >= 95%)")
assert acc >= 0.95, "demo did not reach 95% test accuracy"
PY

echo "== forward pass of the PyTorch-exported MLP vs PyTorch's output"
$bin/forgec models/mlp.onnx --inference-only --target cpu --batch 2 -o "$out/mlp.forge"
$bin/forge-train "$out/mlp.forge" --forward --inputs models/mlp.ref.npz --outputs "$out/out.npz"
.venv/bin/python3 - "$out/out.npz" models/mlp.ref.npz <<'PY'
import sys, numpy as np
out, ref = np.load(sys.argv[1]), np.load(sys.argv[2])
for k in out.files:
    err = np.linalg.norm(out[k] - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30)
    print(f"{k}: relative error vs PyTorch {err:.2e}")
    assert err < 1e-4, "mismatch"
print("demo OK")
PY
