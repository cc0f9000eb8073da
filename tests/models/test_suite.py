#!/usr/bin/env python3
"""Real exported models through Forge (ctest models_suite, label e2e). Needs numpy only.

For every model NAME in tests/models/manifest.json (written by make_suite.py) four stages:
  forward       forgec NAME.onnx --inference-only --target cpu --batch 2 -o T/NAME.fwd.forge
                forge-train T/NAME.fwd.forge --forward --inputs T/NAME.in.npz --outputs T/NAME.out.npz
                every graph output vs the ONNX Runtime output in NAME.ref.npz:
                ||forge - ort||_2 / ||ort||_2 <= 1e-4 (float64 norms over the whole tensor)
  compile_cpu   forgec NAME.onnx --target cpu --batch 2 --loss SPEC --optimizer sgd:... (exit 0)
  compile_cuda  the same with --target cuda:sm_90 (compile only: no GPU is needed)
and for the training subset (manifest "training": ARCH.train.onnx, a TorchScript export in
training mode, constant folding off) the stage `train` of ARCH_ts:
  train         forgec ARCH.train.onnx --target cpu --batch 4 --loss SPEC --optimizer SPEC
                forge-train BUNDLE --data ARCH.batches.npz --no-shuffle --steps 10 --threads 1
                            --metrics T/metrics.jsonl
                per step |forge - torch| / |torch| <= 1e-4 against PyTorch's fp32 losses
                (the manifest records fp32-vs-fp64 PyTorch, ~1e-7: two orders of slack)

Known gaps are explicit: KNOWN_GAPS maps "NAME" (every stage of NAME fails) or "NAME:STAGE"
(that stage fails) to the reason, quoting the first error line forgec/forge-train prints. Such
a check is reported XFAIL with its reason and the actual error; if it passes (XPASS) the test
FAILS, so the table stays exact. An XFAIL whose current first error line is not quoted in
its reason is flagged "stale reason" (a failure with --strict-gaps). A stage that fails and is
not listed is a FAIL. Stages after a failed forgec import of the same file still run (each
reports its own error).

Usage:
  test_suite.py [--bin-dir DIR | --forgec F --forge-train F] [--models-dir DIR] [--tol 1e-4]
                [--loss-tol 1e-4] [--strict-gaps] [--keep] [NAME ...]
Prints one line per check, then a table per model and 'N passed, N xfail, N failed'; exit
status 1 on any FAIL or XPASS (77 never: nothing here needs a GPU).
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "e2e")))
import forge_e2e as e2e  # noqa: E402  (tests/e2e/forge_e2e.py: tool lookup, run, rel)

STAGES = ("forward", "compile_cpu", "compile_cuda", "train")
TIMEOUT_S = 300

# Models (or single stages) that fail today, with the first error line Forge prints. Keep it
# exact: a listed check that passes fails the test (XPASS).
# (Empty since issue #9 added GatherND, Sin/Cos and LSTM; add an entry, with the quoted error,
# only for a gap that is tracked in an issue.)
KNOWN_GAPS = {}


def first_error(out):
    """The first line that reports an error (from 'error' on), with up to 4 indented
    continuation lines (e.g. the list of unsupported ops), joined by ' | '."""
    lines = [l.rstrip() for l in out.splitlines()]
    for i, l in enumerate(lines):
        m = re.search(r"\berror\b", l, re.IGNORECASE)
        if m:
            msg = [l[m.start():].strip()]
            for c in lines[i + 1:i + 5]:
                if c.startswith((" ", "\t")) and c.strip():
                    msg.append(c.strip())
                else:
                    break
            return " | ".join(msg)
    return e2e.tail(out, 2) or "(no output)"


def error_signature(msg):
    """What a KNOWN_GAPS reason must quote of a tool failure `msg` (from run()): for
    'N unsupported op(s)' the op list ('unsupported ops: Cos, Sin'), else the first error line
    without the tool name, 'error: ' and the file name. None for a non-tool failure (numbers)."""
    m = re.match(r"(forgec|forge-train): (.*)", msg)
    if not m:
        return None
    parts = m.group(2).split(" | ")
    first = re.sub(r"^error:\s*", "", parts[0])
    first = re.sub(r"^\S+\.(onnx|forge|npz): ", "", first)
    if re.match(r"\d+ unsupported ops?:", first):
        return "unsupported ops: " + ", ".join(p.split()[0] for p in parts[1:])
    return first


def run(cmd):
    """(ok, seconds, output or the first error line)."""
    rc, t, out = e2e.run(cmd, TIMEOUT_S)
    if rc == 0:
        return True, t, out
    why = f"timed out after {TIMEOUT_S}s" if rc is None else first_error(out)
    return False, t, f"{os.path.basename(cmd[0])}: {why}"


def stage_forward(name, info, d, tmp, tools, a):
    forgec, train = tools
    ref = np.load(os.path.join(d, info["ref"]))
    missing = [n for n in info["inputs"] + info["outputs"] if n not in ref.files]
    if missing:
        return False, f"{info['ref']} lacks {missing}"
    bundle = os.path.join(tmp, name + ".fwd.forge")
    ok, t1, log = run([forgec, os.path.join(d, info["onnx"]), "--inference-only", "--target",
                       "cpu", "--batch", str(info["ref_batch"]), "-o", bundle])
    if not ok:
        return False, log
    in_npz = os.path.join(tmp, name + ".in.npz")
    np.savez(in_npz, **{n: ref[n] for n in info["inputs"]})
    out_npz = os.path.join(tmp, name + ".out.npz")
    ok, t2, log = run([train, bundle, "--forward", "--inputs", in_npz, "--outputs", out_npz])
    if not ok:
        return False, log
    got = np.load(out_npz)
    problems, parts = [], []
    for n in info["outputs"]:
        if n not in got.files:
            problems.append(f"output {n} missing (got {sorted(got.files)})")
            continue
        if got[n].shape != ref[n].shape:
            problems.append(f"{n}: shape {list(got[n].shape)} != {list(ref[n].shape)}")
            continue
        if not np.all(np.isfinite(got[n])):
            problems.append(f"{n}: {int(np.sum(~np.isfinite(got[n])))} non-finite values")
            continue
        err = e2e.rel(got[n], ref[n])
        parts.append(f"{n} rel {err:.1e}")
        if not err <= a.tol:
            problems.append(f"{n}: rel {err:.2e} > {a.tol:g} vs onnxruntime")
    msg = "; ".join(problems + parts) + f" ({t1 + t2:.1f}s)"
    return not problems, msg


def stage_compile(name, info, d, tmp, tools, a, target):
    bundle = os.path.join(tmp, f"{name}.{target.replace(':', '_')}.forge")
    ok, t, log = run([tools[0], os.path.join(d, info["onnx"]), "--target", target, "--batch",
                      str(info["ref_batch"]), "--loss", info["loss"], "--optimizer",
                      a.optimizer, "-o", bundle])
    return ok, (f"--loss {info['loss']} ({t:.1f}s)" if ok else log)


def stage_train(name, tr, d, tmp, tools, a):
    forgec, train = tools
    bundle = os.path.join(tmp, name + ".train.forge")
    ok, t1, log = run([forgec, os.path.join(d, tr["onnx"]), "--target", "cpu", "--batch",
                       str(tr["batch"]), "--loss", tr["loss"], "--optimizer", tr["optimizer"],
                       "-o", bundle])
    if not ok:
        return False, log
    metrics = os.path.join(tmp, name + ".metrics.jsonl")
    ok, t2, log = run([train, bundle, "--data", os.path.join(d, tr["data"]), "--no-shuffle",
                       "--steps", str(tr["steps"]), "--threads", "1", "--metrics", metrics])
    if not ok:
        return False, log
    got = e2e.metric_losses(metrics) if os.path.exists(metrics) else []
    ref = tr["losses"]
    if len(got) != len(ref):
        return False, f"{len(got)} losses in --metrics, expected {len(ref)}"
    errs = [abs(g - r) / abs(r) for g, r in zip(got, ref)]
    k = int(np.argmax(errs))
    msg = (f"{len(ref)} steps, max rel {errs[k]:.1e} at step {k + 1} (forge {got[k]:.6f}, "
           f"torch {ref[k]:.6f}); loss {ref[0]:.4f} -> {ref[-1]:.4f} ({t1 + t2:.1f}s)")
    if not all(np.isfinite(got)):
        return False, "non-finite loss; " + msg
    return max(errs) <= a.loss_tol, msg


def expected_gap(name, stage):
    return KNOWN_GAPS.get(f"{name}:{stage}") or KNOWN_GAPS.get(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models (default: all in the manifest)")
    e2e.add_tool_args(ap)
    ap.add_argument("--models-dir", default=HERE)
    ap.add_argument("--tol", type=float, default=1e-4, help="forward: max relative L2 error")
    ap.add_argument("--loss-tol", type=float, default=1e-4, help="train: max relative loss error")
    ap.add_argument("--optimizer", default="sgd:lr=0.1,momentum=0.9,nesterov=0,weight_decay=0.0",
                    help="forgec --optimizer of the compile_* stages")
    ap.add_argument("--strict-gaps", action="store_true",
                    help="fail an XFAIL whose reason does not quote the current first error")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    tools = e2e.find_tools(a, "models_suite")
    if not tools:
        return 2
    with open(os.path.join(a.models_dir, "manifest.json")) as f:
        manifest = json.load(f)
    models, training = manifest["models"], manifest.get("training", {})
    names = a.names or list(models)
    unknown = [n for n in names if n not in models]
    stale = [k for k in KNOWN_GAPS if k.split(":")[0] not in models
             or (":" in k and k.split(":")[1] not in STAGES)]
    if unknown or stale:
        print(f"models_suite: unknown model(s) {unknown}; KNOWN_GAPS keys naming no model or "
              f"stage: {stale}", file=sys.stderr)
        return 2

    for n, why in sorted(manifest.get("export_failures", {}).items()):
        print(f"NOTE {n}: not in the suite, PyTorch could not export it: {why}")
    counts = {"PASS": 0, "XFAIL": 0, "FAIL": 0, "XPASS": 0}
    table, stale_reasons, gaps_shown = {}, [], set()
    tmp = tempfile.mkdtemp(prefix="forge-models-suite-")
    t0 = time.monotonic()
    try:
        for name in names:
            info = dict(models[name])
            info.setdefault("ref_batch", manifest.get("ref_batch", 2))
            arch = info.get("arch")
            tr = training.get(arch) if name.endswith("_ts") else None
            row = {}
            for stage in STAGES:
                if stage == "train" and tr is None:
                    continue
                try:
                    if stage == "forward":
                        ok, msg = stage_forward(name, info, a.models_dir, tmp, tools, a)
                    elif stage == "compile_cpu":
                        ok, msg = stage_compile(name, info, a.models_dir, tmp, tools, a, "cpu")
                    elif stage == "compile_cuda":
                        ok, msg = stage_compile(name, info, a.models_dir, tmp, tools, a,
                                                "cuda:sm_90")
                    else:
                        ok, msg = stage_train(name, tr, a.models_dir, tmp, tools, a)
                except Exception as e:  # a broken file fails this check, not the run
                    ok, msg = False, f"{type(e).__name__}: {e}"
                gap = expected_gap(name, stage)
                if gap is None:
                    status = "PASS" if ok else "FAIL"
                    line = msg
                elif ok:
                    status, line = "XPASS", f"listed in KNOWN_GAPS ({gap}) but passes: {msg}"
                else:
                    shown = gap if gap not in gaps_shown else "same gap"
                    gaps_shown.add(gap)
                    status, line = "XFAIL", f"{msg} (KNOWN_GAPS: {shown})"
                    quoted = error_signature(msg)
                    if quoted is not None and quoted not in gap:
                        stale_reasons.append(f"{name}:{stage}: reason does not quote "
                                             f"the current error '{quoted}'")
                        line += " [stale reason]"
                        if a.strict_gaps:
                            status = "FAIL"
                counts[status] += 1
                row[stage] = "pass" if ok else ("XFAIL" if status == "XFAIL" else "FAIL")
                print(f"{status} {name}:{stage}: {line}", flush=True)
            table[name] = row
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\nmodel                      " + " ".join(f"{s:12s}" for s in STAGES))
    for name, row in table.items():
        print(f"{name:26s} " + " ".join(f"{row.get(s, '-'):12s}" for s in STAGES))
    for s in stale_reasons:
        print("stale:", s)
    print(f"{counts['PASS']} passed, {counts['XFAIL']} xfail, {counts['FAIL']} failed, "
          f"{counts['XPASS']} xpass ({time.monotonic() - t0:.0f}s)")
    return 1 if counts["FAIL"] or counts["XPASS"] else 0


if __name__ == "__main__":
    sys.exit(main())
