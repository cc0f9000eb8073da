#!/usr/bin/env python3
"""End-to-end check of the real-model set in models/: import + CPU forward vs. PyTorch.

For each model NAME listed in models/manifest.json (written by models/make_models.py):
  forgec NAME.onnx --inference-only --target cpu --batch 2 -o TMP/NAME.forge
  forge-train TMP/NAME.forge --forward --inputs TMP/NAME.in.npz --outputs TMP/NAME.out.npz
and every output is compared with NAME.ref.npz: ||out - ref|| / ||ref|| <= 1e-4 (the max
absolute difference is reported too). Needs numpy only.

Usage:
  test_models.py [--bin-dir DIR] [--forgec F] [--forge-train F] [--models-dir DIR]
                 [--tol 1e-4] [--keep] [NAME ...]
Each binary is --forgec / --forge-train if given, else found in --bin-dir (or $FORGE_BIN_DIR),
else on PATH. One line per model is
printed, then 'N passed, N failed'; the exit status is non-zero if any model failed.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import tail

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODELS_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "models"))
STEP_TIMEOUT_S = 600


def run(cmd):
    """(ok, seconds, combined output, or why it failed)."""
    rc, t, out = e2e.run(cmd, STEP_TIMEOUT_S)
    return rc == 0, t, (out if rc == 0 else e2e.failure(rc, out, 6))


def compare(out, ref):
    """(relative L2 error, max absolute difference)."""
    diff = np.asarray(out, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    return e2e.rel(out, ref), (float(np.max(np.abs(diff))) if diff.size else 0.0)


def check_model(name, info, models_dir, tmp, forgec, forge_train, tol, batch):
    """Returns (ok, message)."""
    onnx_path = os.path.join(models_dir, info["onnx"])
    ref = np.load(os.path.join(models_dir, info["ref"]))
    missing = [n for n in info["inputs"] + info["outputs"] if n not in ref.files]
    if missing:
        return False, f"reference {info['ref']} lacks {missing}"

    bundle = os.path.join(tmp, name + ".forge")
    ok, t_compile, log = run([forgec, onnx_path, "--inference-only", "--target", "cpu",
                              "--batch", str(batch), "-o", bundle])
    if not ok:
        return False, f"forgec failed: {tail(log, 6)}"

    # Inputs only: forge-train would warn about (and ignore) the reference outputs.
    in_npz = os.path.join(tmp, name + ".in.npz")
    np.savez(in_npz, **{n: ref[n] for n in info["inputs"]})
    out_npz = os.path.join(tmp, name + ".out.npz")
    ok, t_run, log = run([forge_train, bundle, "--forward", "--inputs", in_npz,
                          "--outputs", out_npz])
    if not ok:
        return False, f"forge-train failed: {tail(log, 6)}"
    if not os.path.exists(out_npz):
        return False, f"forge-train wrote no {out_npz}: {tail(log, 6)}"

    got = np.load(out_npz)
    problems, parts = [], []
    for n in info["outputs"]:
        if n not in got.files:
            problems.append(f"output '{n}' missing (forge-train wrote {sorted(got.files)})")
            continue
        o, r = got[n], ref[n]
        if o.shape != r.shape:
            problems.append(f"{n}: shape {list(o.shape)} != reference {list(r.shape)}")
            continue
        if not np.all(np.isfinite(o)):
            problems.append(f"{n}: {int(np.sum(~np.isfinite(o)))} non-finite values")
            continue
        rel, mad = compare(o, r)
        parts.append(f"{n} rel {rel:.2e} maxabs {mad:.2e}")
        if not rel <= tol:
            problems.append(f"{n}: rel err {rel:.3e} > {tol:g} (max abs diff {mad:.3e})")
    timing = f"compile {t_compile:.1f}s, run {t_run:.1f}s"
    if problems:
        return False, "; ".join(problems + parts) + f" ({timing})"
    return True, ", ".join(parts) + f" ({timing})"


def main():
    ap = argparse.ArgumentParser(description="Forge e2e: real models, CPU forward vs. PyTorch")
    ap.add_argument("names", nargs="*", help="models to check (default: all in the manifest)")
    e2e.add_tool_args(ap)
    ap.add_argument("--models-dir", default=DEFAULT_MODELS_DIR)
    ap.add_argument("--tol", type=float, default=1e-4, help="max relative error (L2)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()

    tools = e2e.find_tools(a, "e2e_models")
    if not tools:
        return 2
    forgec, forge_train = tools

    with open(os.path.join(a.models_dir, "manifest.json")) as f:
        manifest = json.load(f)
    models = manifest["models"]
    batch = int(manifest.get("ref_batch", 2))
    names = a.names or list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        print(f"e2e_models: unknown model(s) {unknown}; known: {list(models)}", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="forge-e2e-models-")
    passed, failed = [], []
    try:
        for name in names:
            try:
                ok, msg = check_model(name, models[name], a.models_dir, tmp, forgec, forge_train,
                                      a.tol, batch)
            except Exception as e:  # a broken npz etc. fails this model, not the run
                ok, msg = False, f"{type(e).__name__}: {e}"
            (passed if ok else failed).append(name)
            print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
