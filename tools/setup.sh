#!/usr/bin/env bash
# Sets up a fresh Debian bookworm / Ubuntu 24.04 machine for Forge and builds it.
#   tools/setup.sh          install, build, run the bundled demo
#   tools/setup.sh --test   install, build, run the whole test suite
# Idempotent: installs only missing packages; reuses build/ and ccache.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=demo
case "${1:-}" in
  --test) mode=test ;;
  --build-only) mode=build ;;
  "" ) ;;
  *) echo "usage: tools/setup.sh [--test|--build-only]" >&2; exit 2 ;;
esac

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  libonnx-dev libonnx-testdata libprotobuf-dev protobuf-compiler
  libopenblas-dev libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev zlib1g-dev libzstd-dev libturbojpeg0-dev libpng-dev liblmdb-dev libgloo-dev
  python3 python3-venv python3-pip python3-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python tooling for tests and model scripts lives in a venv (PEP 668).
if [ ! -x .venv/bin/python3 ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python3 -c "import numpy, onnx, PIL, lmdb, nanobind, pytest" 2>/dev/null; then
  .venv/bin/pip install -q -r tools/requirements-test.txt
fi

# Where CUDA is present, the header-only cuDNN frontend (fused attention): the
# nvidia-cudnn-frontend wheel's include/, found by CMake at configure time and never
# copied into the tree (DESIGN.md §3). Headers only: --no-deps skips its Python stack.
if [ -d /usr/local/cuda ] || command -v nvcc >/dev/null 2>&1; then
  if ! ls .venv/lib/python3*/site-packages/include/cudnn_frontend.h >/dev/null 2>&1; then
    .venv/bin/pip install -q --no-deps nvidia-cudnn-frontend==1.32.0 ||
      echo "warning: nvidia-cudnn-frontend not installed; CUDA bundles with fused attention will be refused" >&2
  fi
  # CUTLASS's headers (the runtime's sm90 GEMMs with fused epilogues, timed beside
  # cuBLASLt's): the nvidia-cutlass wheel's cutlass_library/source, headers only.
  if ! ls .venv/lib/python3*/site-packages/cutlass_library/source/include/cutlass/cutlass.h >/dev/null 2>&1; then
    .venv/bin/pip install -q --no-deps nvidia-cutlass==4.2.0.0 ||
      echo "warning: nvidia-cutlass not installed; every matmul will run on cuBLASLt" >&2
  fi
  # nvJPEG's header (forge-train --decode gpu; the library is dlopen'd at run time).
  if ! ls .venv/lib/python3*/site-packages/nvidia/cu13/include/nvjpeg.h >/dev/null 2>&1; then
    .venv/bin/pip install -q --no-deps nvidia-nvjpeg==13.3.2.43 ||
      echo "warning: nvidia-nvjpeg not installed; forge-train --decode gpu will be refused" >&2
  fi
fi

export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
# Share cache hits between clones at different paths (CI, worktrees).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
jobs=${FORGE_JOBS:-2}
cmake --preset default -DFORGE_PYTHON="$PWD/.venv/bin/python3" >/dev/null
cmake --build --preset default -j "$jobs"

case "$mode" in
  demo) exec tools/demo.sh ;;
  test) exec ctest --preset default -j "$jobs" ;;
  build) ;;
esac
