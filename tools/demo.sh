#!/usr/bin/env bash
# The bundled demo: compile the bundled MLP and run it on the CPU, checking
# the result against PyTorch's reference output.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== forgec models/mlp.onnx -> $out/mlp.forge"
$bin/forgec models/mlp.onnx --inference-only --target cpu --batch 2 -o "$out/mlp.forge"
$bin/forge-train --info "$out/mlp.forge"
echo "== forge-train --forward on the reference batch"
$bin/forge-train "$out/mlp.forge" --forward --inputs models/mlp.ref.npz --outputs "$out/out.npz"
.venv/bin/python3 - "$out/out.npz" models/mlp.ref.npz <<'PY'
import sys, numpy as np
out, ref = np.load(sys.argv[1]), np.load(sys.argv[2])
for k in out.files:
    err = np.linalg.norm(out[k] - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30)
    print(f"{k}: shape {out[k].shape}, relative error vs PyTorch {err:.2e}")
    assert err < 1e-4, "mismatch"
print("demo OK")
PY
