#!/usr/bin/env python3
"""The bundle's PTX module is its kernels lowered one by one (ctest e2e_kernel_ptx).

forgec lowers a CUDA bundle's kernels in chunks, one per hardware thread, and merges LLVM's
PTX modules (mergePtxModules; MergePtxTest covers the merge on hand-written PTX). Here, on a
real module: tests/models/resnet18_dynamo.onnx in bf16 for cuda:sm_90 with --dump-dir, whose
kernels.ptx is the module as bundled (ptxas assembled it, or forgec would have failed) and
kernels/NAME.ptx each kernel lowered alone. Checks:
  compile      forgec succeeds (ptxas accepts the merged module when it is installed)
  kernels      kernels.ptx defines exactly the kernels of kernels/ (>= 32, enough for two chunks
               at 16 kernels a chunk), each once
  same_code    each kernel's code in kernels.ptx equals its lone lowering, up to the numbering
               LLVM gives per module (basic-block labels $L__BB<f>_<b>, call sequence comments)
  helpers      each helper function and variable is defined once
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import os
import re
import sys
import tempfile

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.normpath(os.path.join(HERE, "..", "models", "resnet18_dynamo.onnx"))
ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)


def normalized(code):
    """A kernel's code without the numbering that depends on its place in a module."""
    code = re.sub(r"\$L__BB\d+_", "$L__BB_", code)
    return re.sub(r"callseq \d+", "callseq N", code)


def kernels_of(ptx):
    """{name: normalized code} of the kernels of a PTX module (entry line to closing brace)."""
    out = {}
    for m in ENTRY.finditer(ptx):
        end = ptx.find("\n}\n", m.start())
        out.setdefault(m.group(1), []).append(normalized(ptx[m.start(): end]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_kernel_ptx.py")
    if not tools:
        return 2
    forgec, _ = tools
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-ptx-") as tmp:
        dump = os.path.join(tmp, "dump")
        rc, _, log = e2e.run([forgec, MODEL, "--target", "cuda:sm_90", "--precision", "bf16",
                              "--batch", "4", "--loss", "cross_entropy:logits,labels",
                              "--optimizer", "adamw", "-o", os.path.join(tmp, "m.forge"),
                              "--dump-dir", dump])
        if not rep.check("compile", rc == 0, e2e.failure(rc, log) if rc else ""):
            return rep.summary()
        merged = open(os.path.join(dump, "kernels.ptx")).read()
        bundled = kernels_of(merged)
        alone = {}
        kdir = os.path.join(dump, "kernels")
        for f in sorted(os.listdir(kdir)):
            if f.endswith(".ptx"):
                for name, codes in kernels_of(open(os.path.join(kdir, f)).read()).items():
                    alone.setdefault(name, []).extend(codes)
        twice = [k for k, v in bundled.items() if len(v) != 1]
        rep.check("kernels", set(bundled) == set(alone) and len(alone) >= 32 and not twice,
                  f"{len(bundled)} kernels in kernels.ptx, {len(alone)} in kernels/; "
                  f"missing {sorted(set(alone) - set(bundled))[:3]}, extra "
                  f"{sorted(set(bundled) - set(alone))[:3]}, twice {twice[:3]}")
        differ = [k for k in alone if k in bundled and bundled[k][0] != alone[k][0]]
        rep.check("same_code", not differ and bundled,
                  f"{len(alone) - len(differ)}/{len(alone)} kernels equal their lone lowering"
                  + (f"; differ: {differ[:4]}" if differ else ""))
        helpers = re.findall(r"^\.(?:visible |weak )?(?:func|global|const)\b[^\n]*?(\w+)\s*[\(\[]",
                             merged, re.M)
        defined = [h for h in helpers if helpers.count(h) > 2]
        rep.check("helpers", not defined,
                  f"{len(set(helpers))} helper symbol(s) ({', '.join(sorted(set(helpers))[:3])}), "
                  f"none defined twice" if not defined else f"repeated: {sorted(set(defined))}")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
