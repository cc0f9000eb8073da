#!/usr/bin/env bash
# The e2e suites with forge-train built with ASan + UBSan (cmake --preset asan-runtime &&
# ninja -C build-asan-runtime) and forgec from the default build: every bundle, data file,
# checkpoint, resume and export path the suites drive through forge-train runs under the
# sanitizers. Sanitizer reports go to files (ASAN_OPTIONS log_path), so that a report in a
# run a test expects to fail is not mistaken for the expected failure: any report fails
# this script. Usage: tools/asan-e2e.sh [SUITE...]   (default: all below; issue #18)
set -u
cd "$(dirname "$0")/.."
py=${FORGE_PYTHON:-.venv/bin/python}
forgec=${FORGEC:-$PWD/build/bin/forgec}
train=${FORGE_TRAIN:-$PWD/build-asan-runtime/bin/forge-train}
for t in "$forgec" "$train"; do
  [ -x "$t" ] || { echo "asan-e2e: $t is missing (build it first)" >&2; exit 2; }
done
logs=$(mktemp -d /tmp/forge-asan-e2e.XXXXXX)
export ASAN_OPTIONS="detect_leaks=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
# One bin dir for suites that take --bin-dir only: the default build's tools, the ASan forge-train.
mkdir -p "$logs/bin"
for t in "$(dirname "$forgec")"/*; do ln -s "$t" "$logs/bin/"; done
ln -sf "$train" "$logs/bin/forge-train"
tools=(--bin-dir "$logs/bin")
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(models overfit parity parity_gpt precision accumulation
  optimizers thin_bundle untie dropout eval_export image_folder input_pipeline batch_auto
  data_parallel tensor_parallel pipeline_parallel)
status=0
for s in "${suites[@]}"; do
  case $s in
    models) args=(tests/e2e/test_models.py "${tools[@]}" --models-dir models) ;;
    overfit) args=(tests/e2e/test_overfit.py "${tools[@]}" --models-dir models) ;;
    parity) args=(tests/e2e/test_parity.py "${tools[@]}" --strict-delta --fixtures-dir tests/fixtures) ;;
    parity_gpt) args=(tests/e2e/test_parity.py gpt_adamw "${tools[@]}" --fixtures-dir tests/fixtures) ;;
    *) args=("tests/e2e/test_$s.py" "${tools[@]}") ;;
  esac
  start=$SECONDS
  out=$("$py" "${args[@]}" 2>&1)
  rc=$?
  echo "$s: rc $rc, $((SECONDS - start)) s, $(echo "$out" | tail -1)"
  [ $rc -eq 0 ] || { status=1; echo "$out" | grep -E "^FAIL" | head -5; }
done
# (Not `ls asan* ubsan*`: that fails when either kind is absent, and hid ASan reports.)
if compgen -G "$logs/asan*" > /dev/null || compgen -G "$logs/ubsan*" > /dev/null; then
  echo "sanitizer reports:"; head -30 "$logs"/asan* "$logs"/ubsan* 2>/dev/null; status=1
else
  echo "no sanitizer reports"
fi
rm -rf "$logs"
exit $status
