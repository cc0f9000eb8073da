#!/usr/bin/env python3
"""Every generated kernel of the bundled models accesses global memory coalesced (ctest
e2e_coalescing; issue #12 item 2). No GPU needed: the check reads the kernels' index
expressions.

Each model in models/ (forge_e2e.MODEL_LOSSES) is compiled for cuda:sm_90 in fp32, TF32 with
the NHWC layout, bf16 and fp16 (loss scaling's regions; --dump-dir), and `forge-opt --forge-check-coalescing=report` runs
over the stage after forge-generate-kernels. The pass evaluates every global load, store and
atomic's index for the 32 threads of a warp and calls an access coalesced when the warp's
indices form one contiguous range (or two ascending runs, the second from the lowest index: a
broadcast row read across its end). Checked:
  1. the pass finds kernels and accesses (its report counts them: a check that sees nothing
     fails);
  2. no access is strided, apart from the op kinds in KNOWN below, each with its reason;
     a KNOWN entry that no longer occurs fails too (the list must shrink with the code).
A negative case (a transposing kernel, strided on one side by construction) shows the check
can fail: tests/lit/passes/check-coalescing.mlir.
"""
import argparse
import glob
import os
import re
import sys
import tempfile

import forge_e2e as e2e
from forge_e2e import Report

HERE = os.path.dirname(os.path.abspath(__file__))

# Kernels that read or write strided today, by the op they come from, each with its reason:
# known gaps (issue #12 item 2 stays open while this is not empty), not exemptions from the
# check. A kind not listed fails the test; a listed kind that no longer occurs fails too.
KNOWN = {
    # Empty: the last entries, channels-first (NCHW) max pools and their gradients (strict
    # fp32: adjacent outputs' windows are `stride` apart), now stage their input rows in
    # shared memory (lit generate-kernels-pooling). An op kind whose kernels cannot be made
    # coalesced goes here with its reason.
}

RESULT_RE = re.compile(r"kernel (\w+): (\d+) coalesced, (\d+) broadcast, (\d+) data-dependent, "
                       r"(\d+) strided")
ERROR_RE = re.compile(r"kernel (\w+): (\S+) on a global memref is not coalesced")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--forge-opt", help="path of forge-opt (default: next to forgec)")
    ap.add_argument("--models-dir", default=os.path.join(HERE, "..", "..", "models"))
    a = ap.parse_args()
    forgec = a.forgec or e2e.find_tool("forgec", a.bin_dir)
    forge_opt = a.forge_opt or (forgec and os.path.join(os.path.dirname(forgec), "forge-opt"))
    if not forgec or not forge_opt or not os.access(forge_opt, os.X_OK):
        print("test_coalescing: forgec and forge-opt are needed", file=sys.stderr)
        return 2
    rep = Report()
    seen_known = set()
    variants = [("fp32", []), ("tf32-nhwc", ["--tf32", "--layout", "nhwc"]),
                ("bf16", ["--precision", "bf16"]), ("fp16", ["--precision", "fp16"])]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (loss, _) in e2e.MODEL_LOSSES.items():
            onnx_path = os.path.join(a.models_dir, name + ".onnx")
            for variant, flags in variants:
                case = f"{name} {variant}"
                dump = os.path.join(tmp, f"{name}-{variant}")
                rc, _, log = e2e.run([forgec, onnx_path, "--target", "cuda:sm_90", "--batch", "4",
                                      "--loss", loss, "--optimizer", "adamw", "--dump-dir", dump,
                                      "-o", os.path.join(tmp, "m.forge")] + flags)
                if rc != 0:
                    rep.check(case, False, "forgec failed: " + e2e.tail(log))
                    continue
                stage = glob.glob(os.path.join(dump, "*-forge-generate-kernels.mlir"))
                if len(stage) != 1:
                    rep.check(case, False, f"no forge-generate-kernels dump in {dump}")
                    continue
                rc, _, out = e2e.run([forge_opt, "--forge-check-coalescing=report", stage[0],
                                      "-o", os.devnull])
                counts = RESULT_RE.findall(out)
                kernels = {k for k, *_ in counts}
                accesses = sum(int(c) + int(b) + int(d) + int(s) for _, c, b, d, s in counts)
                if not kernels or not accesses:
                    rep.check(case, False, "the check saw no kernels or no accesses: "
                              + e2e.tail(out))
                    continue
                # The op each failing kernel comes from (its name: k<N>_<op>).
                bad = {}
                for kernel, op in ERROR_RE.findall(out):
                    kind = kernel.split("_", 1)[1]
                    bad.setdefault(kind, set()).add(kernel)
                unknown = {k: v for k, v in bad.items() if k not in KNOWN}
                seen_known |= set(bad) & set(KNOWN)
                coalesced = sum(int(c) for _, c, *_ in counts)
                rep.check(case, not unknown and (rc == 0) == (not bad),
                          f"{len(kernels)} kernels, {accesses} global accesses ({coalesced} "
                          f"coalesced); strided: " +
                          (", ".join(f"{k} x{len(v)}" for k, v in sorted(bad.items())) or "none")
                          + (f"; NOT KNOWN: {sorted(unknown)}" if unknown else ""))
    stale = set(KNOWN) - seen_known
    rep.check("every KNOWN entry still occurs", not stale,
              f"no longer strided: {sorted(stale)}" if stale else f"{sorted(KNOWN)}")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
