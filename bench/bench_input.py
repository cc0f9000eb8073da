#!/usr/bin/env python3
"""Input pipeline benchmark (issue #13): a conv net trained from a folder of JPEGs against the
same bundle fed from in-memory arrays, on one GPU.

  bench_input.py images --dir D [--count 640] [--classes 64]
      writes an ImageNet-like folder D/CLASS/N.jpg (Pillow, quality 85; sizes 320-500 x
      240-400 pixels, smooth colour fields with noise, ~30 KB each), seeded
  bench_input.py run --forge-train FT --bundle B.forge [--weights DIR] --images D --npz X.npz
      [--workers 8 16] [--prefetch 0 2 4] [--steps 40] [--warmup 10]
      trains B from X.npz (its arrays: the GPU's own speed) and from D with each --workers
      count (forge-train --image-resize 256 --image-normalize imagenet: decode, scale, centre
      crop on the CPU workers), and with --augmented A.forge (B compiled with forgec --augment
      pixels,normalize=imagenet[,flip]: u8 pixels, normalized on the GPU) from D with each
      --workers count and --prefetch depth, centre crops and --random-resized-crop; with
      --canvas C.forge (B compiled with forgec --augment pixels,normalize=imagenet,canvas=HxW:
      the crop on the GPU) from D with each --workers count, the JPEGs decoded by the
      workers (--decode cpu) and by nvJPEG (--decode gpu), random-resized crops; prints one
      line per run: median step time after the warm-up, images/s, and forge-train's
      input-stall line (how long the compute stream waited for its batches)

The folder's images are decoded every step (no cache of decoded pixels), so the CPU's decode
rate is what is measured; the files themselves sit in the page cache after the first epoch.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import numpy as np


def images(a):
    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(a.count):
        c = i % a.classes
        d = os.path.join(a.dir, f"class{c:03d}")
        os.makedirs(d, exist_ok=True)
        w, h = int(rng.integers(320, 501)), int(rng.integers(240, 401))
        yy, xx = np.mgrid[0:h, 0:w]
        base = rng.uniform(0, 255, size=3)
        freq = rng.uniform(0.005, 0.05, size=(3, 2))
        px = np.stack([base[k] / 2 + 60 * np.sin(xx * freq[k, 0] + yy * freq[k, 1])
                       for k in range(3)], axis=-1)
        px += rng.normal(0, 12, size=px.shape)
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8), "RGB").save(
            os.path.join(d, f"{i:05d}.jpg"), quality=85)


STALL_RE = re.compile(r"input stall: .*")
DECODER_RE = re.compile(r"JPEGs decoded on the device \(([^)]*)\)")  # --decode gpu's backend


def train(a, data, extra, tag):
    metrics = f"/tmp/bench_input_{tag}.jsonl"
    steps = a.warmup + a.steps
    cmd = [a.forge_train, a.bundle, "--data", data, "--steps", str(steps), "--device", "cuda",
           "--metrics", metrics, "--log-every", str(steps)] + extra
    if a.weights:
        cmd += ["--weights", a.weights]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        return None, log
    t = [json.loads(line)["time_s"] for line in open(metrics)]
    dt = statistics.median(t[i] - t[i - 1] for i in range(a.warmup, len(t)))
    return dt, log


def run(a):
    batch = None
    rows = []
    dt, log = train(a, a.npz, [], "npz")
    rows.append(("arrays (.npz)", dt, log))
    for w in a.workers:
        dt, log = train(a, a.images, ["--workers", str(w), "--image-resize", "256",
                                      "--image-normalize", "imagenet"], f"jpeg{w}")
        rows.append((f"JPEG folder, --workers {w}", dt, log))
    if a.augmented:
        bundle, a.bundle = a.bundle, a.augmented
        for w in a.workers:
            for extra in ([], ["--random-resized-crop"]):
                for pf in a.prefetch:
                    dt, log = train(a, a.images, ["--workers", str(w), "--image-resize", "256",
                                                  "--prefetch", str(pf)] + extra, "aug")
                    rows.append((f"JPEG folder, --workers {w} --prefetch {pf}, u8 pixels "
                                 f"(--augment bundle) {' '.join(extra)}", dt, log))
        a.bundle = bundle
    if a.canvas:
        bundle, a.bundle = a.bundle, a.canvas
        for w in a.workers:
            for decode in ("cpu", "gpu"):
                dt, log = train(a, a.images, ["--workers", str(w), "--image-resize", "256",
                                              "--random-resized-crop", "--decode", decode],
                                f"canvas_{decode}")
                rows.append((f"JPEG folder, --workers {w}, canvas bundle (crop on the GPU), "
                             f"--decode {decode} --random-resized-crop", dt, log))
        a.bundle = bundle
    batch = len(np.load(a.npz)["labels"]) // a.npz_batches if a.npz_batches else None
    for label, dt, log in rows:
        if dt is None:
            print(f"{label}: FAILED {log.strip().splitlines()[-1:]}")
            continue
        stall = STALL_RE.findall(log)
        decoder = DECODER_RE.findall(log)
        rate = f", {batch / dt:.0f} img/s" if batch else ""
        print(f"{label}: {dt * 1e3:.2f} ms/step{rate}; {stall[-1] if stall else 'no stall line'}"
              + (f"; decoder: {decoder[-1]}" if decoder else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("images")
    p.add_argument("--dir", required=True)
    p.add_argument("--count", type=int, default=640)
    p.add_argument("--classes", type=int, default=64)
    p = sub.add_parser("run")
    p.add_argument("--forge-train", required=True)
    p.add_argument("--bundle", required=True)
    p.add_argument("--weights")
    p.add_argument("--images", required=True)
    p.add_argument("--npz", required=True)
    p.add_argument("--augmented", help="the bundle compiled with forgec --augment pixels,...")
    p.add_argument("--canvas", help="the bundle compiled with forgec --augment "
                                    "pixels,...,canvas=HxW (crops on the GPU; --decode cpu/gpu)")
    p.add_argument("--npz-batches", type=int, default=2, help="batches in --npz (images/s)")
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    p.add_argument("--prefetch", type=int, nargs="+", default=[2],
                   help="forge-train --prefetch depths for the --augmented runs")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    images(a) if a.cmd == "images" else run(a)


if __name__ == "__main__":
    sys.exit(main())
