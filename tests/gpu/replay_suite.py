#!/usr/bin/env python3
"""Conformance or gradient-check bundles on the GPU against the CPU (ctest gpu_conformance,
gpu_gradients; label gpu). Exits 77 (skipped) without a GPU.

  replay_suite.py conformance --runner forge-conformance --replay forge-replay DATA_DIR...
      forge-conformance DATA_DIR... --target cuda:sm_90 --emit-dir T  (runs on the CPU too)
      forge-replay T --device cuda   (each output vs ONNX's reference and vs the CPU's)
  replay_suite.py gradients --gradcheck GradientCheckTest --replay forge-replay
      FORGE_GRADCHECK_EMIT_DIR=T GradientCheckTest   (float32 cases, CUDA bundles)
      forge-replay T --device cuda   (every gradient vs the CPU's, 1e-4 relative)
On a GPU machine without MLIR, run the emitting half here and forge-replay there
(tests/gpu/README.md).
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from forge_e2e import gpu_present  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("suite", choices=["conformance", "gradients"])
    ap.add_argument("--runner")
    ap.add_argument("--gradcheck")
    ap.add_argument("--replay", required=True)
    ap.add_argument("data", nargs="*")
    a = ap.parse_intermixed_args()
    if not gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed)")
        return 77
    with tempfile.TemporaryDirectory(prefix="forge-replay-") as tmp:
        if a.suite == "conformance":
            data = [d for d in a.data if os.path.isdir(d)]
            emit = subprocess.run([a.runner] + data + ["--target", "cuda:sm_90",
                                                       "--emit-dir", tmp])
        else:
            emit = subprocess.run([a.gradcheck], env=dict(os.environ,
                                                          FORGE_GRADCHECK_EMIT_DIR=tmp))
        if emit.returncode != 0:
            print(f"emitting the bundles failed (exit {emit.returncode})")
            return 1
        return subprocess.run([a.replay, tmp, "--device", "cuda"]).returncode


if __name__ == "__main__":
    sys.exit(main())
