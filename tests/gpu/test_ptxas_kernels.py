#!/usr/bin/env python3
"""Every generated kernel of the bundled models assembles with ptxas (ctest ptxas_kernels).

Runs in CI (no GPU needed). For each model in models/:
  forgec M.onnx --target cuda:sm_90 --batch 8 --loss ... --optimizer adamw --dump-dir D
then `ptxas -arch=sm_90` on each D/kernels/NAME.ptx (the PTX of one kernel, as a user reads
it). Fails on any ptxas error, on a model that produces no kernel, and when ptxas is missing
(the check cannot be done without it: install the CUDA toolkit or set CUDA_HOME).
Also checks that the dump holds NAME.mlir next to every NAME.ptx, that the f32 elementwise
kernels use 16-byte vector accesses somewhere (ld.global.v4 / st.global.v4), and that the
CUDA executor takes every library call's stated problem (`forge-replay --check-library`, no
GPU needed: each matmul/gemm's cuBLASLt problem against its tensors).
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import forge_e2e as e2e  # noqa: E402
from forge_e2e import Report  # noqa: E402

LOSSES = {name: loss for name, (loss, _) in e2e.MODEL_LOSSES.items()}


def find_ptxas():
    found = shutil.which("ptxas")
    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if not found and d and os.access(os.path.join(d, "bin", "ptxas"), os.X_OK):
            found = os.path.join(d, "bin", "ptxas")
    return found


def assemble(ptxas, path):
    out = path[:-4] + ".cubin"
    r = subprocess.run([ptxas, "-arch=sm_90", path, "-o", out], capture_output=True, text=True)
    return path, r.returncode, (r.stdout + r.stderr).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--models-dir", required=True)
    a = ap.parse_args()
    rep = Report()
    ptxas = find_ptxas()
    if not rep.check("ptxas", ptxas is not None, ptxas or "not found (PATH, $CUDA_HOME/bin, "
                                                         "/usr/local/cuda/bin)"):
        return rep.summary()
    tools = e2e.find_tools(a, "test_ptxas_kernels")
    if not tools:
        return 2
    forgec = tools[0]
    replay = e2e.find_tool("forge-replay", a.bin_dir or os.path.dirname(forgec))
    if not rep.check("forge-replay", replay is not None, replay or "not found"):
        return rep.summary()
    total, vector_kernels = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, loss in LOSSES.items():
            dump = os.path.join(tmp, name)
            rc, t, log = e2e.run([forgec, os.path.join(a.models_dir, name + ".onnx"), "--target",
                                  "cuda:sm_90", "--batch", "8", "--loss", loss, "--optimizer",
                                  "adamw", "--dump-dir", dump, "-o",
                                  os.path.join(tmp, name + ".forge")], 900)
            if not rep.check(f"{name} forgec --target cuda:sm_90", rc == 0,
                             f"{t:.1f}s" if rc == 0 else e2e.failure(rc, log)):
                continue
            rc, _, log = e2e.run([replay, "--check-library", os.path.join(tmp, name + ".forge")],
                                 120)
            rep.check(f"{name} library calls", rc == 0, e2e.tail(log))
            kdir = os.path.join(dump, "kernels")
            ptx = sorted(f for f in os.listdir(kdir) if f.endswith(".ptx")) \
                if os.path.isdir(kdir) else []
            missing_mlir = [f for f in ptx if not os.path.exists(os.path.join(kdir, f[:-4] +
                                                                              ".mlir"))]
            rep.check(f"{name} kernel dumps", ptx and not missing_mlir,
                      f"{len(ptx)} kernels" + (f"; no .mlir for {missing_mlir[:3]}"
                                               if missing_mlir else ""))
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                results = list(pool.map(lambda f: assemble(ptxas, os.path.join(kdir, f)), ptx))
            failed = [(os.path.basename(p), log) for p, rc, log in results if rc != 0]
            rep.check(f"{name} ptxas -arch=sm_90", not failed,
                      f"{len(ptx) - len(failed)}/{len(ptx)} kernels assemble" +
                      "".join(f"\n  {f}: {log[:300]}" for f, log in failed[:5]))
            total += len(ptx)
            for f in ptx:
                text = open(os.path.join(kdir, f)).read()
                if "ld.global.v4" in text and "st.global.v4" in text:
                    vector_kernels += 1
    rep.check("16-byte vector accesses", vector_kernels > 0,
              f"{vector_kernels} of {total} kernels load and store with .v4")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
