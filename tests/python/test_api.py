"""The forge Python package (python/forge) against forge-train (issue #19).

The reference for every trajectory is forge-train itself on the same bundle, data, seed and
thread count: the package binds the same runtime, so losses (float32, as forge-train's
--metrics prints them: shortest round-trip) and parameters (--dump-params) must match bit
for bit. Run by ctest (python_api; python_api_gpu with --device cuda), or in two halves for a GPU
machine without forgec (tests/gpu/suite.sh; conftest.py's options):

  FORGEC=... FORGE_TRAIN=... PYTHONPATH=build/python python -m pytest tests/python [--device cuda]
  ... pytest tests/python --device cuda --bundles DIR --compile-only     # here
  ... pytest tests/python --device cuda --bundles DIR                    # there
"""
import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import forge

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "digits_mlp.onnx")
TRAIN = os.path.join(ROOT, "models", "data", "digits_train.npz")
TEST = os.path.join(ROOT, "models", "data", "digits_test.npz")
LOSS = "cross_entropy:logits,labels"
B = 32


def forge_train():
    return os.environ.get("FORGE_TRAIN") or shutil.which("forge-train")


def run_forge_train(args, tmp_path, tag):
    """forge-train with `args`; returns its --metrics records."""
    metrics = tmp_path / f"{tag}.jsonl"
    proc = subprocess.run([forge_train(), *map(str, args), "--metrics", str(metrics)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in open(metrics)]


def f32(v):
    return np.float32(v)


@pytest.fixture(scope="module")
def digits():
    with np.load(TRAIN) as d:
        return {k: d[k] for k in d.files}


def adamw_bundle(bundles):
    return bundles.get("adamw", MODEL, batch=B, loss=LOSS, optimizer="adamw:lr=1e-3",
                       clip_grad_norm=1.0)


@pytest.fixture
def bundle(bundles):
    b = adamw_bundle(bundles)
    bundles.ready()
    return b


def make_trainer(bundle, device, **kw):
    kw.setdefault("threads", 1)
    return forge.Trainer(bundle, device=device, **kw)


# --- the trajectory equals forge-train's ------------------------------------------------

def test_data_trajectory_equals_forge_train(bundle, device, tmp_path):
    steps, seed = 12, 7
    ref = run_forge_train([bundle.path, "--data", TRAIN, "--seed", seed, "--threads", 1,
                           "--steps", steps, "--device", device,
                           "--dump-params", tmp_path / "ref.npz"], tmp_path, "ref")
    tr = make_trainer(bundle, device, data=TRAIN, seed=seed)
    got = [tr.step() for _ in range(steps)]
    assert [g["step"] for g in got] == list(range(1, steps + 1))
    assert [f32(g["loss"]) for g in got] == [f32(r["loss"]) for r in ref]
    assert [f32(g["grad_norm"]) for g in got] == [f32(r["grad_norm"]) for r in ref]
    params = tr.parameters()
    with np.load(tmp_path / "ref.npz") as want:
        inits = {i.name for i in onnx.load(MODEL).graph.initializer}
        assert set(params) == inits  # the ONNX initializer (state_dict) names
        for name, value in params.items():
            np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_batches_from_python_equal_the_data_file(bundle, device, digits, tmp_path):
    """step(batch) with the rows forge-train --no-shuffle visits: the same losses."""
    steps = 8
    ref = run_forge_train([bundle.path, "--data", TRAIN, "--no-shuffle", "--threads", 1,
                           "--steps", steps, "--device", device], tmp_path, "noshuffle")
    tr = make_trainer(bundle, device)
    losses = []
    for s in range(steps):
        batch = {k: v[s * B:(s + 1) * B] for k, v in digits.items()}
        losses.append(f32(tr.step(batch)["loss"]))
    assert losses == [f32(r["loss"]) for r in ref]
    assert tr.steps_done == steps


class DLPackOnly:
    """A tensor that offers only the DLPack protocol (as a PyTorch CPU tensor does)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_and_strided_batches(bundle, device, digits):
    """DLPack objects and non-contiguous arrays train exactly as contiguous NumPy."""
    first = {k: v[:B] for k, v in digits.items()}
    a = make_trainer(bundle, device)
    want = [a.step(first)["loss"], a.step(first)["loss"]]
    b = make_trainer(bundle, device)
    # x as the transpose of a transposed copy (strides reversed), labels through DLPack.
    x_strided = np.ascontiguousarray(first["x"].T).T
    assert not x_strided.flags.c_contiguous
    got = [b.step({"x": x_strided, "labels": DLPackOnly(first["labels"])})["loss"],
           b.step({"x": DLPackOnly(first["x"]), "labels": first["labels"]})["loss"]]
    assert got == want


def test_torch_tensors(bundle, device, digits):
    """PyTorch CPU tensors (DLPack) train as NumPy does; CUDA tensors too on the GPU (device
    to device), and are refused by a CPU trainer. Needs torch (not a test dependency:
    skipped where it is missing)."""
    torch = pytest.importorskip("torch")
    first = {k: v[:B] for k, v in digits.items()}
    want = make_trainer(bundle, device).step(first)["loss"]
    tr = make_trainer(bundle, device)
    assert tr.step({k: torch.from_numpy(v) for k, v in first.items()})["loss"] == want
    if not torch.cuda.is_available():
        return
    on_gpu = {k: torch.from_numpy(v).cuda() for k, v in first.items()}
    if device == "cpu":
        with pytest.raises(forge.ForgeError, match="reads inputs from host memory only"):
            tr.step(on_gpu)
        return
    # CUDA tensors are copied device to device: the same step as from host memory.
    g = make_trainer(bundle, device)
    assert g.step(on_gpu)["loss"] == want
    with pytest.raises(forge.ForgeError, match="'x' is not C-contiguous"):
        g.step({"x": on_gpu["x"].t().contiguous().t(), "labels": on_gpu["labels"]})
    with pytest.raises(forge.ForgeError, match="all host or all CUDA"):
        g.step({"x": on_gpu["x"], "labels": first["labels"]})
    with pytest.raises(forge.ForgeError, match="'x' is f64 .* needs f32"):
        g.step({"x": on_gpu["x"].double(), "labels": on_gpu["labels"]})
    assert g.steps_done == 1
    assert g.step(first)["step"] == 2  # host batches again after device ones


def test_micro_batches(bundles, device, digits, tmp_path):
    """A bundle with 2 micro-batches takes 2 x B rows per step, as forge-train does."""
    bundle = bundles.get("micro", MODEL, batch=16, loss=LOSS, optimizer="sgd:lr=0.1",
                         micro_batches=2)
    bundles.ready()
    # The accumulation loop (forgec --accumulate loop, the default): one micro-batch's
    # inputs, run twice a step; train_step reads no data.
    assert "accumulate" in bundle.routines
    assert bundle.inputs("accumulate")[0][0] == "x"
    assert [i[0] for i in bundle.inputs()] == ["forge.step"]
    ref = run_forge_train([bundle.path, "--data", TRAIN, "--no-shuffle", "--threads", 1,
                           "--steps", 3, "--device", device], tmp_path, "micro")
    tr = make_trainer(bundle, device)
    assert tr.samples_per_step == 32 and tr.micro_batches == 2
    got = [f32(tr.step({k: v[s * 32:(s + 1) * 32] for k, v in digits.items()})["loss"])
           for s in range(3)]
    assert got == [f32(r["loss"]) for r in ref]


# --- evaluation, checkpoints, export -----------------------------------------------------

def test_evaluate_equals_forge_train(bundle, device, tmp_path):
    ref = run_forge_train([bundle.path, "--data", TRAIN, "--eval-data", TEST, "--threads", 1,
                           "--steps", 5, "--eval-every", 5, "--device", device],
                          tmp_path, "eval")
    tr = make_trainer(bundle, device, data=TRAIN, eval_data=TEST)
    for _ in range(5):
        tr.step()
    e = tr.evaluate()
    assert e["samples"] == 360 and e["batches"] == 12  # 360 = 11 x 32 + 8: a partial batch
    # forge-train prints doubles with 9 significant digits: the same digits.
    assert float(f'{e["loss"]:.9g}') == ref[-1]["eval_loss"]
    assert float(f'{e["accuracy"]:.9g}') == ref[-1]["eval_accuracy"]
    # The same samples as a list of uneven batches: the same result.
    with np.load(TEST) as t:
        test = {k: t[k] for k in t.files}
    parts = [{k: v[i:i + 100] for k, v in test.items()} for i in range(0, 360, 100)]
    e2 = tr.evaluate(parts)
    assert e2["samples"] == 360
    assert e2["loss"] == pytest.approx(e["loss"], rel=1e-12)
    assert e2["accuracy"] == e["accuracy"]
    assert tr.steps_done == 5  # evaluation does not train


def test_checkpoint_resume_is_exact(bundle, device, tmp_path):
    full = make_trainer(bundle, device, data=TRAIN, seed=3)
    losses = [full.step()["loss"] for _ in range(6)]
    part = make_trainer(bundle, device, data=TRAIN, seed=3)
    for _ in range(3):
        part.step()
    path = part.save_checkpoint(tmp_path / "c.forgeckpt")
    fresh = make_trainer(bundle, device, data=TRAIN, seed=3)
    assert fresh.resume(path) == 3
    assert [fresh.step()["loss"] for _ in range(3)] == losses[3:]


def test_checkpoints_cross_between_python_and_forge_train(bundle, device, tmp_path):
    """forge-train resumes Python's checkpoint directory, and Python resumes forge-train's."""
    ref = run_forge_train([bundle.path, "--data", TRAIN, "--threads", 1, "--steps", 6,
                           "--device", device], tmp_path, "full")
    tr = make_trainer(bundle, device, data=TRAIN)
    for _ in range(3):
        tr.step()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tr.save_checkpoint(ckpt)
    rest = run_forge_train([bundle.path, "--data", TRAIN, "--threads", 1, "--steps", 6,
                            "--device", device, "--ckpt-dir", ckpt, "--resume"],
                           tmp_path, "rest")
    assert [r["step"] for r in rest] == [4, 5, 6]
    assert [f32(r["loss"]) for r in rest] == [f32(r["loss"]) for r in ref[3:]]
    # forge-train's directory (now with its step-6 checkpoint) back into Python.
    back = make_trainer(bundle, device, data=TRAIN)
    assert back.resume(ckpt) == 6
    assert back.step()["step"] == 7


def test_export_onnx_and_parameters(bundle, device, digits, tmp_path):
    tr = make_trainer(bundle, device)
    for s in range(3):
        tr.step({k: v[s * B:(s + 1) * B] for k, v in digits.items()})
    out = tmp_path / "trained.onnx"
    replaced = tr.export_onnx(out)
    params = tr.parameters()
    assert sorted(replaced) == sorted(params)
    exported = {i.name: numpy_helper.to_array(i) for i in onnx.load(out).graph.initializer}
    for name, value in params.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    initial = {i.name: numpy_helper.to_array(i) for i in onnx.load(MODEL).graph.initializer}
    assert any(not np.array_equal(initial[n], params[n]) for n in params)  # it trained
    state = tr.state()
    assert set(params) < set(state)  # AdamW's moments as well


def test_compile_from_modelproto_and_save_load(forgec, device, target, digits, tmp_path):
    model = onnx.load(MODEL)
    b = forge.compile(model, batch=B, target=target, loss=LOSS, optimizer="sgd:lr=0.05")
    dest = tmp_path / "saved.forge"
    b.save(dest)
    again = forge.Bundle.load(dest)
    assert again.routines == ["train_step", "eval"]
    assert again.inputs() == b.inputs()
    batch = {k: v[:B] for k, v in digits.items()}
    assert (make_trainer(b, device).step(batch)["loss"] ==
            make_trainer(again, device).step(batch)["loss"])
    # The ModelProto's temporary file lives with the bundle: export needs no onnx_model.
    t = make_trainer(b, device)
    t.step(batch)
    assert t.export_onnx(tmp_path / "e.onnx")


# --- errors carry the runtime's and forgec's messages --------------------------------------

def test_compile_errors_raise_with_forgec_message(forgec, target):
    with pytest.raises(forge.CompileError, match="--batch"):
        forge.compile(MODEL, batch=0, target=target, loss=LOSS, optimizer="sgd")
    with pytest.raises(forge.CompileError, match="nope"):
        forge.compile(MODEL, batch=B, target=target, loss="cross_entropy:nope,labels",
                      optimizer="sgd")
    with pytest.raises(forge.CompileError):
        forge.compile(os.path.join(HERE, "no-such-model.onnx"), batch=B, target=target)
    assert issubclass(forge.CompileError, forge.ForgeError)


def test_bad_batches_raise_naming_the_input(bundle, device, digits, tmp_path):
    tr = make_trainer(bundle, device)
    ok = {k: v[:B] for k, v in digits.items()}
    with pytest.raises(forge.ForgeError, match="31 samples, a step takes 32"):
        tr.step({k: v[:31] for k, v in ok.items()})
    with pytest.raises(forge.ForgeError, match="'x' has dtype f64"):
        tr.step({"x": ok["x"].astype(np.float64), "labels": ok["labels"]})
    with pytest.raises(forge.ForgeError, match="no array for the bundle input 'labels'"):
        tr.step({"x": ok["x"]})
    bad = ok["labels"].copy()
    bad[5] = 10
    # Caught by the loss kernel (this bundle records no class count for a check up front);
    # the CPU's names the position, the GPU's the kernel.
    with pytest.raises(forge.ForgeError,
                       match="target 10 at position 5 is outside" if device == "cpu"
                       else "a target class is outside"):
        tr.step({"x": ok["x"], "labels": bad})
    with pytest.raises(forge.ForgeError, match="'x' is not an array"):
        tr.step({"x": "not an array", "labels": ok["labels"]})
    assert tr.steps_done == 0  # nothing trained
    if device == "cpu":
        assert tr.step(ok)["step"] == 1  # the CPU stops at the fault, before any update
    else:
        # The GPU finds the fault after the step ran: the trainer refuses to go on from
        # parameters that may hold a partial update; a new one resumes a checkpoint.
        with pytest.raises(forge.ForgeError,
                           match="step 1 failed on the device.*new trainer.*checkpoint"):
            tr.step(ok)
        good = make_trainer(bundle, device)
        good.step(ok)
        path = good.save_checkpoint(tmp_path / "good.forgeckpt")
        fresh = make_trainer(bundle, device)
        assert fresh.resume(path) == 1
        assert fresh.step(ok)["step"] == 2
    with pytest.raises(forge.ForgeError, match="no training data"):
        tr.step()


def test_bad_files_raise(bundles, device, tmp_path):
    bundle = adamw_bundle(bundles)
    other = bundles.get("other", MODEL, batch=16, loss=LOSS, optimizer="sgd:lr=0.1")
    bundles.ready()
    corrupt = tmp_path / "corrupt.forge"
    corrupt.write_bytes(open(bundle.path, "rb").read()[:100])
    with pytest.raises(forge.ForgeError, match="corrupt.forge"):
        forge.Bundle.load(corrupt)
    with pytest.raises(forge.ForgeError, match="mlp.ref.npz: no array for the bundle input 'labels'"):
        make_trainer(bundle, device, data=os.path.join(ROOT, "models", "mlp.ref.npz"))
    # A checkpoint of another bundle is refused and changes nothing.
    o = make_trainer(other, device, data=TRAIN)
    o.step()
    path = o.save_checkpoint(tmp_path / "other.forgeckpt")
    tr = make_trainer(bundle, device, data=TRAIN)
    before = tr.parameters()
    with pytest.raises(forge.ForgeError, match="other.forgeckpt"):
        tr.resume(path)
    for k, v in tr.parameters().items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(forge.ForgeError, match="no-such"):
        tr.resume(tmp_path / "no-such.forgeckpt")


# --- length buckets: documents batched by length, as forge-train does ------------------------

def test_length_buckets_equal_forge_train(forgec, device, target, tmp_path):
    """models/gpt.onnx with a symbolic sequence dim, compiled with length_buckets; documents
    (token shards split after token 0) train through the package as through forge-train
    --doc-separator 0: the same losses and buckets, bit for bit."""
    if target != "cpu":
        pytest.skip("the bucketed GPU run is forge-train's (tests/e2e/test_length_buckets.py)")
    model = onnx.load(os.path.join(ROOT, "models", "gpt.onnx"))
    del model.graph.value_info[:]
    for v in list(model.graph.input[:1]) + list(model.graph.output):
        d = v.type.tensor_type.shape.dim[1]
        d.ClearField("dim_value")
        d.dim_param = "seq"
    rng = np.random.default_rng(5)
    tokens = []
    for n in rng.integers(2, 40, 120):
        tokens += list(rng.integers(1, 128, n - 1)) + [0]
    shard = tmp_path / "docs.bin"
    np.asarray(tokens, dtype=np.uint16).tofile(shard)
    b = forge.compile(model, tmp_path / "b.forge", batch=4, target=target,
                      loss="cross_entropy:logits,labels,ignore=-100", optimizer="adamw:lr=3e-3",
                      length_buckets="seq=8,16,32")
    assert b.routines == ["train_step", "eval", "train_step@len8", "eval@len8",
                          "train_step@len16", "eval@len16"]
    tr = make_trainer(b, device, data=shard, doc_separator=0, seed=4)
    got = [tr.step() for _ in range(6)]
    ref = run_forge_train([tmp_path / "b.forge", "--data", shard, "--doc-separator", 0,
                           "--steps", 6, "--device", device, "--threads", 1, "--seed", 4],
                          tmp_path, "buckets")
    assert [f32(r["loss"]) for r in got] == [f32(r["loss"]) for r in ref]
    assert [r["length"] for r in got] == [r["length"] for r in ref]
    assert len({r["length"] for r in got}) >= 2
    assert all(0 < r["tokens"] <= 4 * r["length"] for r in got)


# --- image folders ------------------------------------------------------------------------

def write_images(root):
    """Two classes of small JPEG/PNG images of several sizes (Pillow)."""
    from PIL import Image
    rng = np.random.default_rng(11)
    for c in range(2):
        os.makedirs(root / f"c{c}")
        for i, (w, h) in enumerate([(20, 17), (33, 16), (16, 40), (45, 37)]):
            px = rng.integers(0, 120, size=(h, w, 3))
            px[:, :, c] += 120
            img = Image.fromarray(px.astype(np.uint8), "RGB")
            img.save(root / f"c{c}" / (f"{i}.png" if i == 2 else f"{i}.jpg"))


def test_image_folder_options_equal_forge_train(forgec, device, target, tmp_path):
    """An image folder through the package with forge-train's image options: the plain
    cnn (f32 input, centre crop after image_resize, ImageNet normalization) and a canvas
    bundle (forgec --augment pixels,normalize=imagenet,canvas=HxW: the crop in the graph)
    with random-resized crops train as forge-train does with the same flags, bit for bit;
    bad option values raise."""
    if target != "cpu":
        pytest.skip("the GPU image runs are tests/gpu/test_canvas_crop.py's")
    images = tmp_path / "images"
    write_images(images)
    model = os.path.join(ROOT, "tests", "fixtures", "cnn_sgd_momentum", "model.onnx")
    plain = forge.compile(model, tmp_path / "plain.forge", batch=4, target=target,
                          loss="cross_entropy:logits,labels", optimizer="sgd:lr=0.05")
    canvas = forge.compile(model, tmp_path / "canvas.forge", batch=4, target=target,
                           loss="cross_entropy:logits,labels", optimizer="sgd:lr=0.05",
                           augment="pixels,normalize=imagenet,canvas=40x48")
    for b, kw, flags in (
            (plain, dict(image_resize=24, image_normalize="imagenet"),
             ["--image-resize", 24, "--image-normalize", "imagenet"]),
            (canvas, dict(random_resized_crop=True, crop_scale=(0.3, 1.0)),
             ["--random-resized-crop", "--crop-scale", "0.3,1.0"])):
        tr = make_trainer(b, device, data=images, seed=7, shuffle=False, **kw)
        got = [tr.step()["loss"] for _ in range(4)]
        ref = run_forge_train([b.path, "--data", images, "--seed", 7, "--no-shuffle",
                               "--steps", 4, "--device", device, "--threads", 1, *flags],
                              tmp_path, os.path.basename(b.path))
        assert [f32(v) for v in got] == [f32(r["loss"]) for r in ref]
    with pytest.raises(forge.ForgeError, match="crop_scale applies to random_resized_crop"):
        make_trainer(canvas, device, data=images, crop_scale=(0.5, 1.0))
    with pytest.raises(forge.ForgeError, match="decodes no images"):
        make_trainer(canvas, device, data=images, decode="gpu")
    with pytest.raises(ValueError, match="decode must be"):
        make_trainer(canvas, device, data=images, decode="nvjpeg")
    with pytest.raises(ValueError, match="attention_backward must be 'fast' or 'deterministic'"):
        make_trainer(canvas, device, data=images, attention_backward="atomic")
