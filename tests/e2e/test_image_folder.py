#!/usr/bin/env python3
"""Image folders as training data (issue #13: forge-train --data DIR, decoded on the CPU).

Writes an ImageNet-style folder (class subfolders of JPEG and PNG files of several sizes,
Pillow-encoded, including JPEGs large enough for the DCT's 1/2..1/8 scaling), compiles the
cnn fixture (x [B, 3, 16, 16], 10 classes) for the CPU and checks:

  same as Pillow   training on the folder gives the losses of training on an .npz that
                   Pillow and numpy made from the same files (Pillow's decoder with its
                   draft() DCT scaling, then a float64 bilinear centre crop, normalized,
                   labels by class folder in name order): every step within REL. A wrong
                   channel order, layout, label, crop or normalization moves a loss by
                   percents
  LMDB             an LMDB of Caffe Datum records (raw BGR pixels and encoded images) in the
                   folder's order trains with the folder's losses (1e-6); a corrupt record and
                   an out-of-range label stop the run (the record named by its key)
  random crop      --random-resized-crop over 2 epochs (3 workers) against a reference whose
                   boxes come from its own Philox4x32 (keyed by seed, epoch, sample), Pillow
                   decodes with the same draft() shrink, float64 crops: every step within REL
  resize           the same with --image-resize 24 (the shorter side scaled to 24, then the
                   16x16 centre crop), ImageNet's mean/std and 3 data workers decoding
  augment pixels   a bundle compiled with --augment pixels,normalize=imagenet (u8 [B, H, W, 3]
                   pixels, normalized in the graph) trains on the folder with the losses of the
                   plain bundle on the reference made from the same pixels rounded to u8
  augment canvas   --augment pixels,normalize=imagenet,canvas=HxW (each decoded image in a u8
                   canvas, its crop box in x.crop, cropped in the graph by forge.resized_crop):
                   the plain bundle's losses on the folder (centre crop, random-resized crop,
                   1e-4), and with a canvas smaller than the larger images (shrunk to fit,
                   bilinear to u8) the plain bundle's on a float64 reference of that; refusals:
                   canvas without pixels, a canvas bundle on arrays without x.crop; --decode
                   gpu refused on the CPU, --decode auto there the same losses as cpu
  flip             --augment pixels,flip: a model blind to mirroring (global average pool +
                   linear) trains as without flip (1e-6); the cnn's losses change; two runs
                   of one bundle agree bit for bit
  learns           40 shuffled steps on two colour classes lower the loss below half its start
  bad records      a truncated JPEG (libjpeg's "premature end" warning) and a text file
                   named .jpg stop the run with the path and
                   sample index (--bad-records fail, the default); with --bad-records skip the
                   run finishes and warns once per bad file
  refusals         an empty class folder, a folder without class subfolders and a bundle whose
                   input is not an image ([B, 784]) are errors naming the folder or input

  test_image_folder.py [--bin-dir DIR | --forgec F --forge-train T]
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np

import forge_e2e as e2e

try:
    from PIL import Image
except ImportError:  # tools/requirements-test.txt installs Pillow
    print("FAIL: Pillow is not installed (pip install -r tools/requirements-test.txt)")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
H = W = 16
BATCH = 4
REL = 1e-4  # per-step loss, relative: f32 pixel arithmetic against float64
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def write_folder(root, rng, per_class=6, classes=("a_red", "b_green", "c_blue")):
    """Class c's images lean towards colour channel c; sizes from 9x13 to 150x97."""
    sizes = [(20, 17), (33, 16), (16, 40), (9, 13), (150, 97), (64, 130)]
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name))
        for i in range(per_class):
            w, h = sizes[i % len(sizes)]
            px = rng.integers(0, 120, size=(h, w, 3))
            px[:, :, c] += 120
            yy, xx = np.mgrid[0:h, 0:w]  # a gradient, so the crop's position matters
            px = np.clip(px + (xx * 40 // w)[:, :, None], 0, 255).astype(np.uint8)
            img = Image.fromarray(px, "RGB")
            if i % 3 == 2:
                img.save(os.path.join(root, name, f"img{i:02d}.png"))
            else:
                img.save(os.path.join(root, name, f"img{i:02d}.JPEG" if i == 1 else f"img{i:02d}.jpg"),
                         quality=90)
        with open(os.path.join(root, name, "notes.txt"), "w") as f:  # ignored
            f.write("not an image\n")


def folder_samples(root):
    classes = sorted(d for d in os.listdir(root)
                     if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
    out = []
    for c, name in enumerate(classes):
        files = sorted(f for f in os.listdir(os.path.join(root, name))
                       if os.path.splitext(f)[1].lower() in (".jpg", ".jpeg", ".png"))
        out += [(os.path.join(root, name, f), c) for f in files]
    return out


def fit_canvas(rgb, cw, ch):
    """A decoded image too large for a canvas of cw x ch, shrunk to fit as the canvas
    bundles' loader does: bilinear with half-pixel centres, f32 weights and values,
    rounded half up to u8."""
    rh, rw = rgb.shape[:2]
    if rw <= cw and rh <= ch:
        return rgb
    s = min(cw / rw, ch / rh)
    fw, fh = min(max(int(rw * s), 1), cw), min(max(int(rh * s), 1), ch)
    src = rgb.astype(np.float32)
    out = np.zeros((fh, fw, 3))
    for y in range(fh):
        sy = min(max((y + 0.5) / (fh / rh) - 0.5, 0.0), rh - 1.0)
        y0 = int(sy)
        y1, fy = min(y0 + 1, rh - 1), np.float32(sy - y0)
        for x in range(fw):
            sx = min(max((x + 0.5) / (fw / rw) - 0.5, 0.0), rw - 1.0)
            x0 = int(sx)
            x1, fx = min(x0 + 1, rw - 1), np.float32(sx - x0)
            top = src[y0, x0] + (src[y0, x1] - src[y0, x0]) * fx
            bottom = src[y1, x0] + (src[y1, x1] - src[y1, x0]) * fx
            out[y, x] = np.clip(np.floor((top + (bottom - top) * fy).astype(np.float64) + 0.5),
                                0, 255)
    return out


def reference_image(path, resize, mean, std, pixels=False, canvas=None):
    """The documented transform in float64: [3, H, W] (pixels: the crop rounded to u8 first,
    as the u8 input of an --augment pixels bundle gets it; canvas (cw, ch): the image decoded
    for a canvas bundle, shrunk by the DCT and then bilinearly to fit it)."""
    img = Image.open(path)
    w, h = img.size

    def scale_of(w, h):
        cover = max(W / w, H / h)
        s = resize / min(w, h) if resize > 0 else cover
        return max(s, cover)

    if img.format == "JPEG":
        s = scale_of(w, h)
        if canvas:
            s = min(s, canvas[0] / w, canvas[1] / h)
        need = (max(1, math.ceil(w * s - 1e-9)), max(1, math.ceil(h * s - 1e-9)))
        img.draft("RGB", need)  # the DCT shrink by 8, 4 or 2 that keeps `need`
    rgb = np.asarray(img.convert("RGB"), dtype=np.float64)
    if canvas:
        rgb = fit_canvas(rgb, *canvas)
    h, w = rgb.shape[:2]
    s = scale_of(w, h)
    off_x, off_y = (w * s - W) / 2, (h * s - H) / 2
    # pixels: rounded to u8, which takes forge-train's f32 arithmetic (weights as f32) to land
    # on the same side of every .5; float64 otherwise.
    ft = np.float32 if pixels else np.float64
    rgb = rgb.astype(ft)
    out = np.zeros((3, H, W), dtype=ft)
    for y in range(H):
        sy = min(max((y + off_y + 0.5) / s - 0.5, 0.0), h - 1.0)
        y0 = int(sy)
        y1, fy = min(y0 + 1, h - 1), ft(sy - y0)
        for x in range(W):
            sx = min(max((x + off_x + 0.5) / s - 0.5, 0.0), w - 1.0)
            x0 = int(sx)
            x1, fx = min(x0 + 1, w - 1), ft(sx - x0)
            top = rgb[y0, x0] + (rgb[y0, x1] - rgb[y0, x0]) * fx
            bottom = rgb[y1, x0] + (rgb[y1, x1] - rgb[y1, x0]) * fx
            out[:, y, x] = top + (bottom - top) * fy
    out = out.astype(np.float64)
    if pixels:
        out = np.clip(np.floor(out + 0.5), 0, 255)
    return (out / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]


M64 = (1 << 64) - 1


def philox4x32(c, k):
    """Philox4x32-10 (runtime/include/forge/runtime/Philox.h), for the crop draws."""
    c, k = list(c), list(k)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & 0xFFFFFFFF, p1 & 0xFFFFFFFF,
             ((p0 >> 32) ^ c[3] ^ k[1]) & 0xFFFFFFFF, p0 & 0xFFFFFFFF]
    return c


def random_box(w, h, sample, epoch, seed, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """--random-resized-crop's box (ImageFolderSource.cpp randomBox), independently."""
    area = float(w) * h
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(10):
        r = philox4x32([sample & 0xFFFFFFFF, sample >> 32, epoch & 0xFFFFFFFF, attempt],
                       [(seed & 0xFFFFFFFF) ^ 0x52524331, seed >> 32])
        u = [(x >> 8) / 16777216.0 for x in r]
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        ar = math.exp(lo + (hi - lo) * u[1])
        bw, bh = float(round(math.sqrt(target * ar))), float(round(math.sqrt(target / ar)))
        if 0 < bw <= w and 0 < bh <= h:
            return math.floor(u[2] * (w - bw + 1)), math.floor(u[3] * (h - bh + 1)), bw, bh
    raise AssertionError("the test's images always fit a box in 10 tries")


def reference_random_crop(path, sample, epoch, seed):
    """The random-resized crop of `path` in float64: [3, H, W], pixels / 255."""
    img = Image.open(path)
    w, h = img.size
    x0, y0, bw, bh = random_box(w, h, sample, epoch, seed)
    if img.format == "JPEG":
        s = max(W / bw, H / bh)
        img.draft("RGB", (max(1, math.ceil(w * s - 1e-9)), max(1, math.ceil(h * s - 1e-9))))
    rgb = np.asarray(img.convert("RGB"), dtype=np.float64)
    rh, rw = rgb.shape[:2]
    fx, fy = rw / w, rh / h
    sx_, sy_ = W / (bw * fx), H / (bh * fy)
    off_x, off_y = x0 * fx * sx_, y0 * fy * sy_
    out = np.zeros((3, H, W))
    for y in range(H):
        sy = min(max((y + off_y + 0.5) / sy_ - 0.5, 0.0), rh - 1.0)
        y0i = int(sy)
        y1, wy = min(y0i + 1, rh - 1), sy - y0i
        for x in range(W):
            sx = min(max((x + off_x + 0.5) / sx_ - 0.5, 0.0), rw - 1.0)
            x0i = int(sx)
            x1, wx = min(x0i + 1, rw - 1), sx - x0i
            top = rgb[y0i, x0i] + (rgb[y0i, x1] - rgb[y0i, x0i]) * wx
            bottom = rgb[y1, x0i] + (rgb[y1, x1] - rgb[y1, x0i]) * wx
            out[:, y, x] = top + (bottom - top) * wy
    return out / 255.0


def pb_varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def datum(label, encoded=None, raw=None):
    """A Caffe Datum (caffe.proto), encoded by hand: an encoded image's bytes, or raw
    [H, W, 3] RGB pixels stored as Caffe does (channels-first, BGR)."""
    def field(n, wire):
        return pb_varint(n << 3 | wire)
    out = bytearray()
    if raw is not None:
        h, w, _ = raw.shape
        data = np.ascontiguousarray(raw[:, :, ::-1].transpose(2, 0, 1)).tobytes()
        out += field(1, 0) + pb_varint(3) + field(2, 0) + pb_varint(h) + field(3, 0) + pb_varint(w)
    else:
        data = encoded
    out += field(4, 2) + pb_varint(len(data)) + data + field(5, 0) + pb_varint(label)
    if encoded is not None:
        out += field(7, 0) + pb_varint(1)
    return bytes(out)


def train(forge_train, bundle, data, tmp, tag, extra=(), steps=None):
    metrics = os.path.join(tmp, tag + ".jsonl")
    rc, _, log = e2e.run([forge_train, bundle, "--data", data, "--metrics", metrics,
                          "--device", "cpu", "--threads", "1"] +
                         (["--steps", str(steps)] if steps else ["--epochs", "1"]) + list(extra),
                         300)
    losses = e2e.metric_losses(metrics) if rc == 0 and os.path.exists(metrics) else []
    return rc, log, losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_image_folder")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="forge-images-") as tmp:
        bundle = os.path.join(tmp, "cnn.forge")
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                              "--target", "cpu", "--batch", str(BATCH),
                              "--loss", "cross_entropy:logits,labels",
                              "--optimizer", "sgd:lr=0.05,momentum=0.9", "-o", bundle])
        if not rep.check("forgec cnn", rc == 0, e2e.failure(rc, log)):
            return rep.summary()
        root = os.path.join(tmp, "train")
        write_folder(root, rng)
        samples = folder_samples(root)

        for label, resize, mean, std, extra in (
                ("same as Pillow", 0, (0, 0, 0), (1, 1, 1), ["--no-shuffle"]),
                ("resize", 24, IMAGENET_MEAN, IMAGENET_STD,
                 ["--no-shuffle", "--image-resize", "24", "--image-normalize", "imagenet",
                  "--workers", "3"])):
            x = np.stack([reference_image(p, resize, mean, std) for p, _ in samples])
            ref = os.path.join(tmp, f"ref{resize}.npz")
            np.savez(ref, x=x.astype(np.float32), labels=np.array([c for _, c in samples]))
            rc1, log1, got = train(forge_train, bundle, root, tmp, f"folder{resize}", extra)
            rc2, log2, want = train(forge_train, bundle, ref, tmp, f"npz{resize}", extra)
            ok = rc1 == 0 and rc2 == 0 and len(got) == len(want) == len(samples) // BATCH
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
            rep.check(label, ok and err <= REL,
                      f"{len(got)} steps, max rel {err:.2e} (<= {REL})" if ok else
                      f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)} | {got} {want}")

        # An LMDB of Caffe Datum records holding the folder's images in the folder's order:
        # small ones as raw BGR pixels (Pillow's decode), the rest as their encoded bytes;
        # training on it gives the folder's losses.
        import lmdb
        db = os.path.join(tmp, "train_lmdb")
        with lmdb.open(db, map_size=1 << 28) as env, env.begin(write=True) as txn:
            for i, (p, c) in enumerate(samples):
                img = Image.open(p)
                small = img.size[0] <= 2 * W and img.size[1] <= 2 * H  # no DCT shrink
                rec = (datum(c, raw=np.asarray(img.convert("RGB"))) if small
                       else datum(c, encoded=open(p, "rb").read()))
                txn.put(f"{i:08d}_{os.path.basename(p)}".encode(), rec)
        raw_count = sum(1 for p, _ in samples
                        if Image.open(p).size[0] <= 2 * W and Image.open(p).size[1] <= 2 * H)
        rc1, log1, got = train(forge_train, bundle, db, tmp, "lmdb", ["--no-shuffle"])
        rc2, log2, want = train(forge_train, bundle, root, tmp, "lmdb_folder", ["--no-shuffle"])
        ok = rc1 == 0 and rc2 == 0 and len(got) == len(want) == len(samples) // BATCH
        err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
        rep.check("LMDB of Datum records", ok and err <= 1e-6 and 0 < raw_count < len(samples),
                  f"{raw_count} raw + {len(samples) - raw_count} encoded records, {len(got)} "
                  f"steps, max rel {err:.2e} (<= 1e-6)" if ok else
                  f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)}")
        bad_db = os.path.join(tmp, "bad_lmdb")
        with lmdb.open(bad_db, map_size=1 << 24) as env, env.begin(write=True) as txn:
            for i, (p, c) in enumerate(samples[:8]):
                txn.put(f"{i:08d}".encode(), datum(c, encoded=open(p, "rb").read()))
            txn.put(b"00000002", datum(1, encoded=b"not a jpeg"))
            txn.put(b"00000005", datum(42, encoded=open(samples[5][0], "rb").read()))
        rc, _, log = e2e.run([forge_train, bundle, "--data", bad_db, "--device", "cpu",
                              "--no-shuffle", "--steps", "1"], 60)
        rep.check("LMDB bad record", rc not in (0, None) and "record '00000002'" in log and
                  "(sample 2 of" in log, e2e.tail(log, 1))
        rc, _, log = e2e.run([forge_train, bundle, "--data", bad_db, "--device", "cpu",
                              "--no-shuffle", "--steps", "2", "--bad-records", "skip"], 60)
        # (The source names the record when the bundle states its class count; this
        # bundle's loss kernel finds the target instead.)
        rep.check("LMDB label out of range", rc not in (0, None) and
                  ("record '00000005'" in log or "target 42" in log) and "[0, 10)" in log,
                  e2e.tail(log, 1))

        # --random-resized-crop: the boxes of two epochs (seed 7) against the reference's
        # own Philox draws, Pillow decodes and float64 crops; epoch e's first 16 samples are
        # rows [16 e, 16 e + 16) of the reference (4 steps per epoch, 2 samples dropped).
        per_epoch = len(samples) // BATCH * BATCH
        x = np.stack([reference_random_crop(p, i, e, 7) for e in (0, 1)
                      for i, (p, _) in enumerate(samples[:per_epoch])])
        ref = os.path.join(tmp, "ref_rrc.npz")
        np.savez(ref, x=x.astype(np.float32),
                 labels=np.array([c for _ in (0, 1) for _, c in samples[:per_epoch]]))
        rc1, log1, got = train(forge_train, bundle, root, tmp, "rrc",
                               ["--no-shuffle", "--seed", "7", "--random-resized-crop",
                                "--workers", "3"], steps=2 * per_epoch // BATCH)
        rc2, log2, want = train(forge_train, bundle, ref, tmp, "rrc_ref", ["--no-shuffle"])
        ok = rc1 == 0 and rc2 == 0 and len(got) == len(want) == 2 * per_epoch // BATCH
        err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
        rep.check("random-resized-crop", ok and err <= REL,
                  f"{len(got)} steps over 2 epochs, max rel {err:.2e} (<= {REL})" if ok else
                  f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)} | {got} {want}")
        rc, _, log = e2e.run([forge_train, bundle, "--data", root, "--device", "cpu",
                              "--steps", "1", "--crop-scale", "0.5,1"], 60)
        rep.check("--crop-scale alone", rc not in (0, None) and "--random-resized-crop" in log,
                  e2e.tail(log, 1))

        # --augment pixels,normalize=imagenet: the bundle takes u8 [B, H, W, 3] pixels and
        # normalizes them in the graph; its losses equal the plain bundle's on the reference
        # made from the same rounded pixels.
        aug = os.path.join(tmp, "cnn_u8.forge")
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                              "--target", "cpu", "--batch", str(BATCH),
                              "--loss", "cross_entropy:logits,labels",
                              "--optimizer", "sgd:lr=0.05,momentum=0.9",
                              "--augment", "pixels,normalize=imagenet", "-o", aug])
        if rep.check("forgec --augment", rc == 0, e2e.failure(rc, log)):
            x = np.stack([reference_image(p, 24, IMAGENET_MEAN, IMAGENET_STD, pixels=True)
                          for p, _ in samples])
            ref = os.path.join(tmp, "ref_u8.npz")
            np.savez(ref, x=x.astype(np.float32), labels=np.array([c for _, c in samples]))
            rc1, log1, got = train(forge_train, aug, root, tmp, "augment",
                                   ["--no-shuffle", "--image-resize", "24"])
            rc2, log2, want = train(forge_train, bundle, ref, tmp, "augment_ref", ["--no-shuffle"])
            ok = rc1 == 0 and rc2 == 0 and len(got) == len(want) == len(samples) // BATCH
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
            rep.check("augment pixels", ok and err <= REL,
                      f"{len(got)} steps, max rel {err:.2e} (<= {REL})" if ok else
                      f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)} | {got} {want}")
        # --augment ...,canvas=HxW: the bundle takes each decoded image in a u8 canvas and its
        # crop box (x.crop), and crops on the device (forge.resized_crop, f32 weights): the
        # plain bundle's losses on the same folder, with the CPU's crop (double geometry),
        # centre crop after --image-resize 24 and random-resized crops. A canvas too small for
        # the larger images (24 x 20) shrinks them to fit (the DCT, then bilinear to u8): the
        # plain bundle's losses on a float64 reference of that (fit_canvas).
        shrunk = np.stack([reference_image(p, 24, IMAGENET_MEAN, IMAGENET_STD, canvas=(24, 20))
                           for p, _ in samples])
        ref_shrunk = os.path.join(tmp, "ref_shrunk.npz")
        np.savez(ref_shrunk, x=shrunk.astype(np.float32), labels=np.array([c for _, c in samples]))
        for tag, canvas, extra, tol in (
                ("centre", "160x160", ["--no-shuffle", "--image-resize", "24", "--workers", "2"], REL),
                ("random", "160x160", ["--no-shuffle", "--seed", "7", "--random-resized-crop"], REL),
                ("shrunk", "20x24", ["--no-shuffle", "--image-resize", "24"], REL)):
            cv = os.path.join(tmp, f"cnn_canvas_{tag}.forge")
            rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                                  "--target", "cpu", "--batch", str(BATCH),
                                  "--loss", "cross_entropy:logits,labels",
                                  "--optimizer", "sgd:lr=0.05,momentum=0.9",
                                  "--augment", f"pixels,normalize=imagenet,canvas={canvas}",
                                  "-o", cv])
            if not rep.check(f"forgec --augment canvas={canvas}", rc == 0, e2e.failure(rc, log)):
                continue
            rc1, log1, got = train(forge_train, cv, root, tmp, f"canvas_{tag}", extra, steps=8)
            rc2, log2, want = train(forge_train, bundle,
                                    ref_shrunk if tag == "shrunk" else root, tmp,
                                    f"canvas_{tag}_ref",
                                    ["--no-shuffle"] if tag == "shrunk" else
                                    extra + ["--image-normalize", "imagenet"], steps=8)
            ok = rc1 == 0 and rc2 == 0 and len(got) == len(want) == 8
            err = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=float("inf"))
            rep.check(f"augment canvas: {tag}", ok and err <= tol,
                      f"8 steps, max rel {err:.2e} (<= {tol})" if ok else
                      f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)} | {got} {want}")
            if tag == "centre":  # the eval routine takes the canvas and its centre boxes too
                import json
                evals = []
                for b, extra_eval in ((cv, []), (bundle, ["--image-normalize", "imagenet"])):
                    m = os.path.join(tmp, f"canvas_eval_{len(evals)}.jsonl")
                    rc, _, log = e2e.run([forge_train, b, "--data", root, "--eval-data", root,
                                          "--device", "cpu", "--threads", "1", "--steps", "2",
                                          "--eval-every", "2", "--metrics", m,
                                          "--image-resize", "24", "--no-shuffle"] + extra_eval,
                                         300)
                    recs = [json.loads(x) for x in open(m)] if rc == 0 else []
                    evals.append(next((r["eval_loss"] for r in recs if "eval_loss" in r), None))
                ok = None not in evals
                rep.check("augment canvas: eval", ok and abs(evals[0] - evals[1]) <=
                          REL * abs(evals[1]),
                          f"eval loss {evals[0]} vs plain {evals[1]}" if ok else f"{evals}")
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                              "--target", "cpu", "--batch", str(BATCH), "--loss",
                              "cross_entropy:logits,labels", "--augment", "canvas=32x32", "-o", aug])
        rep.check("augment canvas without pixels", rc not in (0, None) and
                  "canvas=HxW takes pixels" in log, e2e.tail(log, 1))
        rc, _, log = e2e.run([forge_train, os.path.join(tmp, "cnn_canvas_centre.forge"), "--data",
                              os.path.join(tmp, "ref_u8.npz"), "--device", "cpu", "--steps", "1"],
                             60)
        rep.check("canvas bundle on arrays", rc not in (0, None) and "x.crop" in log,
                  e2e.tail(log, 1))
        # --decode: the CPU decodes no images on the device: gpu is refused, auto decodes here.
        cv = os.path.join(tmp, "cnn_canvas_centre.forge")
        rc, _, log = e2e.run([forge_train, cv, "--data", root, "--device", "cpu", "--steps", "1",
                              "--decode", "gpu"], 60)
        rep.check("--decode gpu on the CPU", rc not in (0, None) and "decodes no images" in log,
                  e2e.tail(log, 1))
        rc1, log1, got = train(forge_train, cv, root, tmp, "decode_auto",
                               ["--no-shuffle", "--decode", "auto"], steps=2)
        rc2, log2, want = train(forge_train, cv, root, tmp, "decode_cpu", ["--no-shuffle"], steps=2)
        rep.check("--decode auto on the CPU", rc1 == 0 and rc2 == 0 and got == want and
                  len(got) == 2 and "data workers decode every image" in log1,
                  f"{got} {want}" if rc1 == 0 and rc2 == 0 else
                  f"{e2e.failure(rc1, log1)} | {e2e.failure(rc2, log2)}")
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"),
                              "--target", "cpu", "--batch", str(BATCH), "--loss",
                              "cross_entropy:logits,labels", "--augment", "pixels,blur", "-o", aug])
        rep.check("augment unknown transform", rc not in (0, None) and
                  "unknown transform 'blur'" in log, e2e.tail(log, 1))
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "mlp_adamw", "model.onnx"),
                              "--target", "cpu", "--batch", "4", "--loss",
                              "cross_entropy:logits,labels", "--optimizer", "sgd:lr=0.1",
                              "--augment", "pixels", "-o", aug])
        rep.check("augment without an image input", rc not in (0, None) and
                  "0 rank-4 float inputs" in log, e2e.tail(log, 1))

        # flip: a model blind to mirroring (global average pool, then a linear layer) trains
        # the same with and without it; the cnn does not, and repeats itself.
        import onnx
        from onnx import helper as oh, TensorProto as OT, numpy_helper as onh
        gap = os.path.join(tmp, "gap.onnx")
        w = rng.standard_normal((10, 3)).astype(np.float32)
        g = oh.make_graph([oh.make_node("GlobalAveragePool", ["x"], ["p"]),
                           oh.make_node("Flatten", ["p"], ["f"]),
                           oh.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"],
                                        transB=1)], "gap",
                          [oh.make_tensor_value_info("x", OT.FLOAT, ["batch", 3, H, W])],
                          [oh.make_tensor_value_info("logits", OT.FLOAT, ["batch", 10])],
                          [onh.from_array(w, "fc.weight"),
                           onh.from_array(np.zeros(10, np.float32), "fc.bias")])
        onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), gap)
        runs = {}
        for model, onnx_path in (("gap", gap),
                                 ("cnn", os.path.join(FIXTURES, "cnn_sgd_momentum", "model.onnx"))):
            for tag, spec in (("plain", "pixels"), ("flip", "pixels,flip"), ("flip2", "pixels,flip")):
                out = os.path.join(tmp, f"{model}_{tag}.forge")
                rc, _, log = e2e.run([forgec, onnx_path, "--target", "cpu", "--batch", str(BATCH),
                                      "--loss", "cross_entropy:logits,labels",
                                      "--optimizer", "sgd:lr=0.05", "--augment", spec, "-o", out])
                if rc != 0:
                    runs[model, tag] = (None, e2e.failure(rc, log))
                    continue
                rc, log, losses = train(forge_train, out, root, tmp, f"{model}_{tag}",
                                        ["--no-shuffle"], steps=8)
                runs[model, tag] = (losses if rc == 0 else None, e2e.failure(rc, log))
        def cmp(a, b):
            la, lb = runs[a][0], runs[b][0]
            if not la or not lb or len(la) != len(lb):
                return None, f"{runs[a][1]} | {runs[b][1]}"
            return max(abs(x - y) / abs(y) for x, y in zip(la, lb)), ""
        e, why = cmp(("gap", "flip"), ("gap", "plain"))
        rep.check("flip: a mirror-blind model trains the same", e is not None and e <= 1e-6,
                  f"max rel {e:.1e} (<= 1e-6)" if e is not None else why)
        e, why = cmp(("cnn", "flip"), ("cnn", "plain"))
        rep.check("flip: the cnn's losses change", e is not None and e > 1e-4,
                  f"max rel {e:.1e} (> 1e-4)" if e is not None else why)
        e, why = cmp(("cnn", "flip"), ("cnn", "flip2"))
        rep.check("flip: repeatable", e == 0.0, f"max rel {e:.1e}" if e is not None else why)

        two = os.path.join(tmp, "two")
        write_folder(two, rng, per_class=8, classes=("red", "blue"))
        rc, log, losses = train(forge_train, bundle, two, tmp, "learns", steps=40)
        rep.check("learns", rc == 0 and len(losses) == 40 and
                  np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3]),
                  f"loss {np.mean(losses[:3]):.3f} -> {np.mean(losses[-5:]):.3f}" if losses
                  else e2e.failure(rc, log))

        # Bad records: a truncated JPEG and text under a .jpg name.
        bad = os.path.join(tmp, "bad")
        write_folder(bad, rng, per_class=4, classes=("red", "blue"))
        cut = os.path.join(bad, "red", "img01.JPEG")
        data = open(cut, "rb").read()
        open(cut, "wb").write(data[:len(data) * 9 // 10])  # libjpeg: "premature end" warning
        fake = os.path.join(bad, "red", "img03.jpg")
        open(fake, "w").write("hello\n")
        rc, _, log = e2e.run([forge_train, bundle, "--data", bad, "--device", "cpu",
                              "--no-shuffle", "--steps", "2"], 120)
        index = [p for p, _ in folder_samples(bad)].index(cut)
        rep.check("bad record fails", rc not in (0, None) and cut in log and
                  f"(sample {index} of" in log, e2e.failure(rc, log, 1))
        rc, _, log = e2e.run([forge_train, bundle, "--data", bad, "--device", "cpu",
                              "--no-shuffle", "--steps", "4",
                              "--bad-records", "skip"], 120)
        warned = [l for l in log.splitlines() if "skipping a bad record" in l]
        rep.check("bad records skipped", rc == 0 and len(warned) == 2 and
                  any(cut in l for l in warned) and any(fake in l for l in warned),
                  " | ".join(warned) if rc == 0 else e2e.failure(rc, log))

        # Refusals.
        empty = os.path.join(tmp, "empty")
        write_folder(empty, rng, per_class=2, classes=("a", "b"))
        os.makedirs(os.path.join(empty, "c_none"))
        rc, _, log = e2e.run([forge_train, bundle, "--data", empty, "--device", "cpu",
                              "--steps", "1"], 60)
        rep.check("empty class folder", rc not in (0, None) and "c_none" in log and
                  "holds no" in log, e2e.tail(log, 1))
        flat = os.path.join(tmp, "flat")
        os.makedirs(flat)
        Image.new("RGB", (8, 8)).save(os.path.join(flat, "x.png"))
        rc, _, log = e2e.run([forge_train, bundle, "--data", flat, "--device", "cpu",
                              "--steps", "1"], 60)
        rep.check("no class folders", rc not in (0, None) and flat in log and
                  "subfolder per class" in log, e2e.tail(log, 1))
        mlp = os.path.join(tmp, "mlp.forge")
        rc, _, log = e2e.run([forgec, os.path.join(FIXTURES, "mlp_adamw", "model.onnx"),
                              "--target", "cpu", "--batch", "4", "--loss",
                              "cross_entropy:logits,labels", "--optimizer", "sgd:lr=0.1", "-o",
                              mlp])
        rep.check("forgec mlp", rc == 0, e2e.failure(rc, log))
        rc, _, log = e2e.run([forge_train, mlp, "--data", root, "--device", "cpu", "--steps",
                              "1"], 60)
        rep.check("not an image input", rc not in (0, None) and "image input 'x'" in log,
                  e2e.tail(log, 1))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
