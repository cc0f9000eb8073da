#!/usr/bin/env python3
"""Image crops on the GPU (issue #13: forgec --augment pixels,canvas=HxW, forge.resized_crop).

Writes an image folder (JPEG and PNG files of several sizes, some larger than the canvas),
compiles the cnn fixture for cuda:sm_90 with --augment pixels,normalize=imagenet,canvas=40x48
(fp32 and bf16) and trains each bundle 8 steps on the folder with the GPU and with the CPU
(forge-train runs a CUDA bundle's instructions on the CPU kernels too):

  centre    the centre crop after --image-resize 24: GPU losses within REL of the CPU's
  random    --random-resized-crop (seed 7, 2 workers): the same boxes, the same losses
  bf16      the bf16 bundle (the crop stored in bf16): within REL_BF16 of the CPU's
  nvjpeg    --decode gpu on a folder of small smooth 4:4:4 baseline JPEGs (every one fits the
            canvas, none shrunk by the DCT): nvJPEG decodes them on the GPU (the progress
            line says so) and the losses are within REL_DECODE of the CPU decoder's run on
            the GPU (two decoders' IDCTs differ by a level here and there; a wrong pitch,
            offset or channel order moves the losses by percents); the same with a folder
            of 4:2:0, 4:2:2 and grayscale JPEGs; --decode gpu on the CPU is refused

The CPU kernel computes what the generated one does (f32 taps and weights); the GPU may fuse
a multiply-add (NVPTX contracts), so a tap's weight differs in its last bits: REL allows
that, and a wrong tap, channel or box moves a loss by percents (test_image_folder.py's
flip check: 3e-2).

  test_canvas_crop.py [--bin-dir DIR | --forgec F --forge-train T] [--bundles DIR
                      [--compile-only]]
Without a GPU it prints SKIP and exits 77 (after --compile-only's compile). Prints one line
per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import forge_e2e as e2e  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
REL, REL_BF16, REL_DECODE = 1e-4, 2e-3, 2e-3
CASES = (("centre", "fp32", ["--no-shuffle", "--image-resize", "24"]),
         ("random", "fp32", ["--no-shuffle", "--seed", "7", "--random-resized-crop",
                             "--workers", "2"]),
         ("bf16", "bf16", ["--no-shuffle", "--seed", "7", "--random-resized-crop"]))


def write_folder(root):
    from PIL import Image
    rng = np.random.default_rng(3)
    sizes = [(20, 17), (33, 16), (16, 40), (90, 61), (150, 97), (64, 130)]
    for c, name in enumerate(("a", "b", "c")):
        os.makedirs(os.path.join(root, name))
        for i, (w, h) in enumerate(sizes):
            px = rng.integers(0, 120, size=(h, w, 3))
            px[:, :, c] += 120
            xx = np.mgrid[0:h, 0:w][1]
            px = np.clip(px + (xx * 40 // w)[:, :, None], 0, 255).astype(np.uint8)
            img = Image.fromarray(px, "RGB")
            img.save(os.path.join(root, name, f"{i}.png" if i % 3 == 2 else f"{i}.jpg"))


def write_smooth_folder(root, chroma=False):
    """Small smooth images (<= 40 x 32: they fit the 40x48 canvas whole and the centre crop
    after --image-resize 24 leaves the DCT nothing to shrink), quality 95: 4:4:4, or with
    `chroma` 4:2:0, 4:2:2 and grayscale ones (chroma upsampled, gray replicated to RGB)."""
    from PIL import Image
    rng = np.random.default_rng(5)
    sizes = [(40, 32), (36, 30), (48, 40), (44, 26), (30, 30), (46, 38)]
    for c, name in enumerate(("a", "b", "c")):
        os.makedirs(os.path.join(root, name))
        for i, (w, h) in enumerate(sizes):
            yy, xx = np.mgrid[0:h, 0:w]
            base = rng.uniform(40, 200, size=3)
            base[c] += 40
            px = np.stack([base[k] + 30 * np.sin(xx * (0.1 + 0.05 * k) + yy * 0.07)
                           for k in range(3)], axis=-1)
            img = Image.fromarray(np.clip(px, 0, 255).astype(np.uint8), "RGB")
            if not chroma:
                img.save(os.path.join(root, name, f"{i}.jpg"), quality=95, subsampling=0)
            elif i % 3 == 2:
                img.convert("L").save(os.path.join(root, name, f"{i}.jpg"), quality=95)
            else:  # 4:2:0 and 4:2:2, as most cameras and ImageNet's files are
                img.save(os.path.join(root, name, f"{i}.jpg"), quality=95,
                         subsampling=2 if i % 3 == 0 else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--bundles")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()

    def compile_half(rep, out, tmp):
        tools = e2e.find_tools(a, "test_canvas_crop")
        if not tools:
            return 2
        forgec = tools[0]
        os.makedirs(out, exist_ok=True)
        write_folder(os.path.join(out, "images"))
        write_smooth_folder(os.path.join(out, "smooth"))
        write_smooth_folder(os.path.join(out, "chroma"), chroma=True)
        for precision in ("fp32", "bf16"):
            rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                                  "--target", "cuda:sm_90", "--batch", "4",
                                  "--loss", "cross_entropy:logits,labels",
                                  "--optimizer", "sgd:lr=0.05,momentum=0.9",
                                  "--precision", precision,
                                  "--augment", "pixels,normalize=imagenet,canvas=40x48",
                                  "-o", os.path.join(out, f"canvas_{precision}.forge")])
            if not rep.check(f"forgec canvas {precision}", rc == 0, e2e.failure(rc, log)):
                return rep.summary()

    def run_half(rep, out, tmp):
        forge_train = a.forge_train or e2e.find_tool("forge-train", a.bin_dir)
        for tag, precision, extra in CASES:
            bundle = os.path.join(out, f"canvas_{precision}.forge")
            runs = {}
            for device in ("cuda", "cpu"):
                metrics = os.path.join(tmp, f"{tag}_{device}.jsonl")
                rc, _, log = e2e.run([forge_train, bundle, "--data", os.path.join(out, "images"),
                                      "--device", device, "--steps", "8", "--metrics", metrics]
                                     + extra, 300)
                runs[device] = (e2e.metric_losses(metrics) if rc == 0 else [],
                                e2e.failure(rc, log))
            got, want = runs["cuda"][0], runs["cpu"][0]
            ok = len(got) == len(want) == 8
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
            tol = REL_BF16 if precision == "bf16" else REL
            rep.check(f"canvas {tag}: GPU vs CPU", ok and err <= tol,
                      f"8 steps, max rel {err:.2e} (<= {tol})" if ok else
                      f"{runs['cuda'][1]} | {runs['cpu'][1]}")
        # nvJPEG: the same bundle on the GPU with the JPEGs decoded there and on the CPU.
        bundle = os.path.join(out, "canvas_fp32.forge")
        for folder, what in (("smooth", "4:4:4"), ("chroma", "4:2:0, 4:2:2 and grayscale")):
            runs = {}
            for decode in ("gpu", "cpu"):
                metrics = os.path.join(tmp, f"decode_{folder}_{decode}.jsonl")
                rc, _, log = e2e.run([forge_train, bundle, "--data", os.path.join(out, folder),
                                      "--device", "cuda", "--steps", "8", "--metrics", metrics,
                                      "--no-shuffle", "--image-resize", "24", "--decode",
                                      decode], 300)
                runs[decode] = (e2e.metric_losses(metrics) if rc == 0 else [], log, rc)
            got, want = runs["gpu"][0], runs["cpu"][0]
            ok = len(got) == len(want) == 8
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
            said = "JPEGs decoded on the device (nvJPEG" in runs["gpu"][1]
            rep.check(f"nvjpeg ({what}): --decode gpu vs the CPU decoder",
                      ok and err <= REL_DECODE and said,
                      f"8 steps, max rel {err:.2e} (<= {REL_DECODE}); progress line names "
                      f"nvJPEG: {said}" if ok else
                      f"{e2e.failure(runs['gpu'][2], runs['gpu'][1])} | "
                      f"{e2e.failure(runs['cpu'][2], runs['cpu'][1])}")
        rc, _, log = e2e.run([forge_train, bundle, "--data", os.path.join(out, "smooth"),
                              "--device", "cpu", "--steps", "1", "--decode", "gpu"], 120)
        rep.check("nvjpeg: --decode gpu on the CPU refused", rc not in (0, None) and
                  "decodes no images" in log, e2e.tail(log, 1))

    return e2e.halves_main(a, compile_half, run_half, prefix="forge-canvas-")


if __name__ == "__main__":
    sys.exit(main())
