#!/usr/bin/env python3
"""Channels-last inference bundles (#12: forgec --inference-only --layout nhwc).

The cnn fixture (two 3x3 convolutions with batch norms, pooling, a linear head) is compiled
for cuda:sm_90 as an inference bundle twice, --layout nchw and --layout nhwc, and both run
`forge-train --forward` on the same 4 images. Required:
  layout     the nhwc bundle's convolutions are channels_last and the only transpose left is
             the image's (the weights' transposes fold: they are constants in inference)
  outputs    the nhwc logits equal the nchw ones within 1e-5 of their largest magnitude (the
             same arithmetic in another memory order), on the CPU, and with --device cuda on
             the GPU (cuDNN's NHWC kernels against its NCHW ones, fp32)

  test_inference_layout.py [--bin-dir DIR | --forgec F --forge-train T] [--device cpu|cuda]
                           [--bundles DIR [--compile-only]] [--fixtures-dir DIR]
"""
import argparse
import glob
import os
import re
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=os.path.join(HERE, "..", "fixtures"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--bundles", help="keep the bundles here (with --compile-only: only compile)")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not a.compile_only and not e2e.gpu_present():
        print("SKIP: no GPU")
        return 77
    tools = e2e.tools_for_halves(a, "test_inference_layout")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    fixture = os.path.join(a.fixtures_dir, "cnn_sgd_momentum")
    with tempfile.TemporaryDirectory(prefix="forge-layout-") as tmp:
        out = a.bundles or tmp
        os.makedirs(out, exist_ok=True)
        images = os.path.join(out, "images.npz")
        if forgec:
            np.savez(images, x=np.load(os.path.join(fixture, "batches.npz"))["x"][:4])
            for layout in ("nchw", "nhwc"):
                dump = os.path.join(tmp, f"dump_{layout}")
                rc, _, log = e2e.run([forgec, os.path.join(fixture, "model.onnx"),
                                      "--inference-only", "--target", "cuda:sm_90", "--batch",
                                      "4", "--layout", layout, "-o",
                                      os.path.join(out, f"{layout}.forge"), "--dump-dir", dump],
                                     300)
                if not rep.check(f"forgec --layout {layout}", rc == 0, e2e.failure(rc, log)):
                    return rep.summary()
                if layout == "nhwc":
                    plan = sorted(glob.glob(os.path.join(dump, "*-forge-plan-memory.mlir")))
                    text = open(plan[-1]).read() if plan else ""
                    convs = text.count("forge.conv ")
                    last = len(re.findall(r"forge\.conv [^\n]*channels_last = true", text))
                    transposes = text.count("forge.transpose ")
                    rep.check("nhwc: channels-last convolutions, one transpose (the image's)",
                              convs == 2 and last == 2 and transposes == 1,
                              f"{convs} convs, {last} channels_last, {transposes} transposes")
            if a.compile_only:
                return rep.summary()
        outs = {}
        for layout in ("nchw", "nhwc"):
            path = os.path.join(tmp, f"out_{layout}.npz")
            rc, _, log = e2e.run([forge_train, os.path.join(out, f"{layout}.forge"), "--forward",
                                  "--inputs", images, "--outputs", path, "--device", a.device],
                                 300)
            if rep.check(f"forge-train --forward {layout} on {a.device}", rc == 0,
                         e2e.failure(rc, log)):
                outs[layout] = np.load(path)["logits"]
        if len(outs) == 2:
            ref, got = outs["nchw"], outs["nhwc"]
            err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
            rep.check(f"nhwc logits == nchw on {a.device}",
                      got.shape == ref.shape and err <= TOL,
                      f"{got.shape} vs {ref.shape}, max error {err:.2e} of the largest (<= {TOL:g})")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
