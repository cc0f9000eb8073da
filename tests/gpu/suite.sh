#!/usr/bin/env bash
# Every GPU suite in two halves, for GPU machines without MLIR (tests/gpu/README.md).
#
#   tests/gpu/suite.sh compile DIR   here (built tree in build/): compiles every suite's bundles
#                                    for cuda:sm_90 into DIR, with forge-train, forge-replay and
#                                    the shared libraries Ubuntu lacks (DIR/bin, DIR/lib)
#   tests/gpu/suite.sh kit DIR       here: forge-train, forge-replay, the GPU gtests and the shared
#                                    libraries only (DIR/bin, DIR/lib), for bench/ calls
#   tests/gpu/suite.sh run DIR [SUITE...]   on the GPU machine, from the repository root: runs
#                                    them all (or the named ones) and ends with one line per
#                                    suite (its "N passed, N failed")
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?usage: suite.sh compile|kit|run DIR [SUITE...]}
dir=${2:?usage: suite.sh compile|kit|run DIR [SUITE...]}
shift 2
only=("$@")
py=${FORGE_PYTHON:-python3}

if [ "$mode" = compile ] || [ "$mode" = kit ]; then
  set -e
  b=build/bin
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
  # Stripped: a call carries at most 64 MiB (carry the suites in two or three calls).
  strip -o "$dir/bin/forge-train" "$b/forge-train"
  strip -o "$dir/bin/forge-replay" "$b/forge-replay"
  # cuDNN fused attention against a float64 reference (a unit test that skips without a GPU).
  [ -x build/tests/unit/AttentionGpuTest ] && strip -o "$dir/bin/AttentionGpuTest" build/tests/unit/AttentionGpuTest
  # cuDNN convolutions against the CPU executor (gtest; run with each cuDNN API).
  [ -x build/tests/unit/ConvGpuTest ] && strip -o "$dir/bin/ConvGpuTest" build/tests/unit/ConvGpuTest
  # The LM head's CUTLASS GEMM with its loss against float64 (built with CUTLASS only).
  [ -x build/tests/unit/LinearCrossEntropyGpuTest ] &&
    strip -o "$dir/bin/LinearCrossEntropyGpuTest" build/tests/unit/LinearCrossEntropyGpuTest
  # Libraries the GPU image lacks (not libc/libstdc++/libgcc: Ubuntu's are newer; not
  # OpenBLAS, protobuf 3.21, zlib or the CUDA libraries, which the image has).
  for lib in $(ldd "$b/forge-train" "$b/forge-replay" | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*) ;;
      libopenblas*|libgfortran*|libquadmath*|libprotobuf.so.32*|libz.so*) ;;
      libcuda*|libcublas*|libcudnn*|libnccl*|libnvidia*|libnvrtc*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  if [ "$mode" = kit ]; then
    du -sh "$dir"
    exit 0
  fi
  $py tests/gpu/test_gpu_models.py --compile-only --bundles "$dir/gpu_models" --bin-dir "$b"
  $py tests/gpu/test_gpu_models.py --compile-only --bundles "$dir/gpu_models_tf32" --bin-dir "$b" --tf32
  # Every misaligned GEMM padded (forge-pad-contractions pads big ones only).
  $py tests/gpu/test_gpu_models.py --compile-only --bundles "$dir/gpu_models_padded" --bin-dir "$b" \
      --forgec-arg=--gemm-pad-min-flops=0
  $py tests/e2e/test_parity.py --bin-dir "$b" --target cuda:sm_90 --bundles "$dir/parity" --compile-only
  onnx_data=$($py -c "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data', 'node'))")
  "$b/forge-conformance" /usr/share/libonnx-testdata/data/node "$onnx_data" --target cuda:sm_90 \
      --emit-dir "$dir/conf" > "$dir/conformance-here.txt" || true
  FORGE_GRADCHECK_EMIT_DIR="$PWD/$dir/grad" build/tests/unit-compiler/GradientCheckTest > /dev/null
  $py tests/gpu/test_data_faults.py --forgec "$b/forgec" --bundles "$dir/faults" --compile-only
  $py tests/gpu/test_float8_casts.py --forgec "$b/forgec" --bundles "$dir/float8" --compile-only
  $py tests/e2e/test_dropout.py --bin-dir "$b" --bundles "$dir/dropout" --compile-only
  $py tests/e2e/test_inference_layout.py --bin-dir "$b" --bundles "$dir/inference_layout" --compile-only
  $py tests/e2e/test_precision.py --bin-dir "$b" --target cuda:sm_90 --bundles "$dir/precision" --compile-only
  $py tests/e2e/test_fp8_delayed.py --bin-dir "$b" --target cuda:sm_90 --bundles "$dir/fp8_delayed" --compile-only
  $py tests/e2e/test_fuse_column_sums.py --bin-dir "$b" --bundles "$dir/fuse_column_sums" --compile-only
  $py tests/gpu/test_masked_attention.py --forgec "$b/forgec" --bundles "$dir/masked_attention" --compile-only
  $py tests/e2e/test_input_pipeline.py --bin-dir "$b" --bundles "$dir/input_pipeline" --compile-only
  $py tests/gpu/test_canvas_crop.py --bin-dir "$b" --bundles "$dir/canvas_crop" --compile-only
  $py tests/gpu/test_data_parallel_gpu.py --bin-dir "$b" --bundles "$dir/data_parallel" --compile-only
  $py tests/gpu/test_length_buckets_gpu.py --bin-dir "$b" --bundles "$dir/length_buckets" --compile-only
  # Every library call's stated cuBLASLt problem is checked here, without a GPU, the same
  # way the CUDA executor checks it: a refusal shows before device time is spent.
  find "$dir" -name '*.forge' -print0 | xargs -0 "$b/forge-replay" --check-library > "$dir/check-library.txt" 2>&1 \
    || { grep -v '^check-library:' "$dir/check-library.txt" | head -20; echo "suite.sh: library calls refused" >&2; exit 1; }
  # nvJPEG (forge-train --decode gpu dlopens it; the GPU image's Python lacks the wheel).
  nvjpeg=$(ls .venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvjpeg.so.13 2>/dev/null | head -1)
  [ -n "$nvjpeg" ] && cp -L "$nvjpeg" "$dir/lib/"
  du -sh "$dir"
  exit 0
fi

[ "$mode" = run ] || { echo "usage: suite.sh compile|kit|run DIR" >&2; exit 2; }
. tests/gpu/device_env.sh "$dir"
ft="$dir/bin/forge-train" rp="$dir/bin/forge-replay"
summary=()
suite() { # name, command...
  local name=$1; shift
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $name " ]]; then return; fi
  echo "=== $name"
  local out; out=$("$@" 2>&1); local rc=$?
  echo "$out" | grep -E "^FAIL" | cut -c1-600   # every failure, then the end
  echo "$out" | tail -n 40
  summary+=("$name: rc $rc; $(echo "$out" | grep -E '[0-9]+ passed' | tail -n 1)")
}
suite gpu_models $py tests/gpu/test_gpu_models.py --bundles "$dir/gpu_models" --forge-train "$ft"
suite gpu_models_tf32 $py tests/gpu/test_gpu_models.py --bundles "$dir/gpu_models_tf32" --forge-train "$ft" --tf32
suite gpu_models_padded $py tests/gpu/test_gpu_models.py --bundles "$dir/gpu_models_padded" --forge-train "$ft"
suite gpu_parity $py tests/e2e/test_parity.py --bundles "$dir/parity" --forge-train "$ft" --target cuda:sm_90 --device cuda --strict-delta
suite gpu_conformance "$rp" "$dir/conf" --device cuda
suite gpu_gradients "$rp" "$dir/grad" --device cuda
suite gpu_data_faults $py tests/gpu/test_data_faults.py --bundles "$dir/faults" --replay "$rp" --device cuda
suite gpu_float8_casts $py tests/gpu/test_float8_casts.py --bundles "$dir/float8" --replay "$rp" --device cuda
suite gpu_dropout $py tests/e2e/test_dropout.py --bundles "$dir/dropout" --forge-train "$ft" --device cuda
suite gpu_inference_layout $py tests/e2e/test_inference_layout.py --bundles "$dir/inference_layout" --forge-train "$ft" --device cuda
suite gpu_precision $py tests/e2e/test_precision.py --bundles "$dir/precision" --forge-train "$ft" --device cuda
suite gpu_fp8_delayed $py tests/e2e/test_fp8_delayed.py --bundles "$dir/fp8_delayed" --forge-train "$ft" --device cuda
suite gpu_fuse_column_sums $py tests/e2e/test_fuse_column_sums.py --bundles "$dir/fuse_column_sums" --forge-train "$ft" --device cuda
suite gpu_masked_attention $py tests/gpu/test_masked_attention.py --bundles "$dir/masked_attention" --forge-train "$ft"
suite gpu_input_pipeline $py tests/e2e/test_input_pipeline.py --bundles "$dir/input_pipeline" --forge-train "$ft" --device cuda
suite gpu_canvas_crop $py tests/gpu/test_canvas_crop.py --bundles "$dir/canvas_crop" --forge-train "$ft"
suite gpu_data_parallel $py tests/gpu/test_data_parallel_gpu.py --bundles "$dir/data_parallel" --forge-train "$ft"
suite gpu_length_buckets $py tests/gpu/test_length_buckets_gpu.py --bundles "$dir/length_buckets" --forge-train "$ft"
# gtest binaries (skipped without a GPU): their summary as "N passed, N failed".
gtest_suite() { # name, binary, env...
  local name=$1 bin=$2; shift 2
  [ -x "$bin" ] || return 0
  suite "$name" env "$@" bash -c 'out=$("$1" 2>&1); rc=$?; echo "$out"
    p=$(echo "$out" | sed -n "s/^\[  PASSED  \] \([0-9]*\) test.*/\1/p")
    f=$(echo "$out" | sed -n "s/^\[  FAILED  \] \([0-9]*\) test.*/\1/p")
    echo "${p:-0} passed, ${f:-0} failed"; exit $rc' _ "$bin"
}
# cuDNN fused attention (AttentionGpuTest).
gtest_suite gpu_attention "$dir/bin/AttentionGpuTest"
# cuDNN convolutions against the CPU: the default APIs (graph for bf16), all on the legacy
# API, and TF32 on the graph API too.
gtest_suite gpu_convolution "$dir/bin/ConvGpuTest"
gtest_suite gpu_convolution_legacy "$dir/bin/ConvGpuTest" FORGE_CONV_API=legacy
gtest_suite gpu_convolution_graph "$dir/bin/ConvGpuTest" FORGE_CONV_API=graph
# The LM head's CUTLASS GEMM and streaming loss (LinearCrossEntropyGpuTest).
gtest_suite gpu_linear_cross_entropy "$dir/bin/LinearCrossEntropyGpuTest"
echo "=== summary"
printf '%s\n' "${summary[@]}"
