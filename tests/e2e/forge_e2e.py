"""Helpers shared by the e2e scripts (test_*.py in this directory).

The scripts run as `python3 tests/e2e/test_X.py`, so this directory is sys.path[0] and
`import forge_e2e` finds this file. Needs numpy only.
"""
import os
import shutil
import subprocess
import sys
import time

import numpy as np

# The bundled models (models/) -> (forgec --loss spec, how the label array is made from the
# reference outputs: class indices or regression targets). Shared by the e2e and GPU tests.
MODEL_LOSSES = {
    "mlp": ("cross_entropy:logits,labels", "classes"),
    "cnn": ("cross_entropy:logits,labels", "classes"),
    "gpt": ("cross_entropy:logits,labels", "classes"),
    "gpt_dynamo": ("cross_entropy:logits,labels", "classes"),
    "bert": ("cross_entropy:logits,labels", "classes"),
    "hf_bert_tiny": ("mse:pooler_output,target", "regression"),
    "tv_mobilenet_v3_small": ("cross_entropy:logits,labels", "classes"),
}


def gpu_present():
    """True when nvidia-smi lists a GPU (the GPU tests skip with exit 77 otherwise)."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False



def find_tool(name, bin_dir):
    """The executable `name` in bin_dir (None if absent there), else on PATH."""
    if bin_dir:
        p = os.path.join(bin_dir, name)
        return p if os.access(p, os.X_OK) else None
    return shutil.which(name)


def add_tool_args(ap):
    """--bin-dir, --forgec, --forge-train on an argparse parser (see find_tools)."""
    ap.add_argument("--bin-dir", default=os.environ.get("FORGE_BIN_DIR"),
                    help="directory holding forgec and forge-train (default: $FORGE_BIN_DIR, "
                         "else PATH)")
    ap.add_argument("--forgec", help="path of forgec (overrides --bin-dir)")
    ap.add_argument("--forge-train", help="path of forge-train (overrides --bin-dir)")


def find_tools(a, script):
    """(forgec, forge_train) from add_tool_args' options; None after a message on stderr
    when either is missing or not executable."""
    forgec = a.forgec or find_tool("forgec", a.bin_dir)
    forge_train = a.forge_train or find_tool("forge-train", a.bin_dir)
    if not forgec or not forge_train or not all(os.access(t, os.X_OK)
                                                for t in (forgec, forge_train)):
        print(f"{script}: need executable forgec and forge-train (--forgec/--forge-train, or in "
              f"{a.bin_dir or 'PATH'}); have forgec={forgec}, forge-train={forge_train}",
              file=sys.stderr)
        return None
    return forgec, forge_train


def replay_tools(script):
    """(forgec, forge_train, forge_replay) from the command line (add_tool_args and
    --forge-replay, default next to forgec), or None after a message on stderr."""
    import argparse
    ap = argparse.ArgumentParser(description=script)
    add_tool_args(ap)
    ap.add_argument("--forge-replay", help="path of forge-replay (default: next to forgec)")
    a = ap.parse_args()
    tools = find_tools(a, script)
    if not tools:
        return None
    replay = a.forge_replay or os.path.join(os.path.dirname(tools[0]), "forge-replay")
    if not os.access(replay, os.X_OK):
        print(f"{script}: need forge-replay ({replay})", file=sys.stderr)
        return None
    return tools[0], tools[1], replay


def tools_for_halves(a, script):
    """(forgec, forge_train) for a test with a compile half and a run half: with --bundles and
    without --compile-only only forge-train is needed (forgec is None); None after a message."""
    if a.bundles and not a.compile_only:
        forge_train = a.forge_train or find_tool("forge-train", a.bin_dir)
        if not forge_train:
            print(f"{script}: need forge-train (--forge-train or --bin-dir)", file=sys.stderr)
            return None
        return None, forge_train
    return find_tools(a, script)


def add_half_args(ap):
    """--device, --bundles and --compile-only on a parser, for a test whose bundles are
    compiled here and trained where the GPU is (see halves)."""
    ap.add_argument("--device", default="cpu", help="forge-train --device")
    ap.add_argument("--bundles", help="directory of the compiled bundles (see the usage)")
    ap.add_argument("--compile-only", action="store_true")


def halves(ap, a, script):
    """After add_half_args and parsing: (forgec, forge_train, replay), where replay means
    train the bundles of --bundles only (forgec None); or an exit status: 2 when a tool is
    missing, 77 (skipped) for --device cuda without a GPU. --compile-only needs --bundles."""
    if a.compile_only and not a.bundles:
        ap.error("--compile-only needs --bundles DIR")
    tools = tools_for_halves(a, script)
    if not tools:
        return 2
    if a.device == "cuda" and not a.compile_only and not gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed)")
        return 77
    return tools[0], tools[1], bool(a.bundles and not a.compile_only)


def tail(text, n=4):
    """The last n non-blank lines of text, joined with ' | '."""
    return " | ".join([l for l in text.strip().splitlines() if l.strip()][-n:])


def run(cmd, timeout=None):
    """Runs cmd with stderr folded into stdout: (returncode, seconds, output).

    returncode is None when cmd ran past timeout seconds; output then ends with a
    'timed out after ...' line (after whatever cmd printed)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, time.monotonic() - t0, f"{out}\ntimed out after {timeout}s: {' '.join(cmd)}"
    return p.returncode, time.monotonic() - t0, p.stdout


def metric_losses(path):
    """The losses of a forge-train --metrics JSONL file, one per logged step."""
    import json
    return [json.loads(line)["loss"] for line in open(path) if line.strip()]


def graph_capture_warning(out):
    """forge-train's warning that it could not capture a CUDA graph ('' if none).

    The run then still trains, launch by launch, so only this line shows it."""
    return next((l for l in out.splitlines() if "CUDA graph capture" in l), "")


def failure(rc, out, n=4):
    """One line on why a run() failed: 'exit N: <last n lines>' (a timeout's own line)."""
    return tail(out, n) if rc is None else f"exit {rc}: {tail(out, n)}"


def keep_only_checkpoint(ckpt_dir, name):
    """Removes every checkpoint in ckpt_dir but `name` (a file, or a sharded checkpoint's
    directory of rank files) and points `latest` at it, as if the run had stopped there."""
    for f in os.listdir(ckpt_dir):
        if f.startswith("ckpt-") and f != name:
            path = os.path.join(ckpt_dir, f)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    with open(os.path.join(ckpt_dir, "latest"), "w") as f:
        f.write(name + "\n")


def sharded_checkpoint(ckpt_dir, name, ranks):
    """Whether ckpt_dir/name is a sharded checkpoint: a directory of one file per rank."""
    path = os.path.join(ckpt_dir, name)
    want = {f"rank-{r:05d}-of-{ranks:05d}.forgeckpt" for r in range(ranks)}
    return os.path.isdir(path) and set(os.listdir(path)) == want


def rel(a, b):
    """||a - b|| / ||b|| (L2, float64; ||a - b|| when b is all zeros)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


def optimizer_spec(h):
    """manifest optimizer_hparams -> forgec --optimizer (compiler/lib/Train's spelling)."""
    if h["type"] == "adamw":
        return (f"adamw:lr={h['lr']!r},beta1={h['beta1']!r},beta2={h['beta2']!r},"
                f"eps={h['eps']!r},weight_decay={h['weight_decay']!r}")
    if h["type"] == "sgd":
        return (f"sgd:lr={h['lr']!r},momentum={h['momentum']!r},"
                f"nesterov={int(h['nesterov'])},weight_decay={h['weight_decay']!r}")
    raise ValueError(f"unknown optimizer type {h['type']}")


class Report:
    """PASS/FAIL lines and their counts."""

    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, name, ok, msg):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def summary(self):
        """Prints 'N passed, N failed'; the exit status (1 if anything failed)."""
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def replay_check_main(doc, compile_cases, replay_cases):
    """main() of a check whose cases are compiled by forgec (here) and replayed by
    forge-replay on a device (here or on a GPU machine without MLIR):
      --forgec F [--bundles DIR] [--compile-only]   compile_cases(rep, forgec, bundles)
      --replay R --device cpu|cuda [--bundles DIR]   replay_cases(rep, replay, bundles, device)
    Exits 77 (skipped) for --device cuda without a GPU."""
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--forgec")
    ap.add_argument("--replay")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bundles", help="compiled cases (written with --compile-only)")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not a.compile_only and not gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed)")
        return 77
    rep = Report()
    with tempfile.TemporaryDirectory(prefix="forge-replay-check-") as tmp:
        bundles = a.bundles or tmp
        if a.forgec:
            compile_cases(rep, a.forgec, bundles)
        if not a.compile_only:
            replay_cases(rep, a.replay, bundles, a.device)
    return rep.summary()


def halves_main(a, compile_half, run_half, prefix=None, skip="SKIP: no GPU"):
    """The end of main() for a GPU test whose bundles are compiled here and trained where the
    GPU is (the GPU machines have no forgec), after parsing its --bundles and --compile-only:
      (no --bundles)               both halves here (the compile half alone with
                                   --compile-only), the bundles in a temporary directory
      --compile-only --bundles DIR compile_half(rep, DIR, tmp) only (it creates DIR)
      --bundles DIR                run_half(rep, DIR, tmp) only
    tmp is a scratch directory (prefix `prefix`), removed after. compile_half may stop the test
    by returning its exit status. Without a GPU the run half prints `skip` and the status is 77
    (ctest's SKIP_RETURN_CODE); otherwise Report.summary()'s ('N passed, N failed')."""
    import tempfile
    rep = Report()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = a.bundles or tmp
        if a.compile_only or not a.bundles:
            status = compile_half(rep, out, tmp)
            if status is not None:
                return status
            if a.compile_only:
                return rep.summary()
        if not gpu_present():
            print(skip)
            return 77
        run_half(rep, out, tmp)
    return rep.summary()
