"""Forge from Python: compile an ONNX model into a training bundle and train it.

    import forge
    bundle = forge.compile("mlp.onnx", batch=32, loss="cross_entropy:logits,labels",
                           optimizer="adamw:lr=1e-3")
    trainer = forge.Trainer(bundle)                 # device="cuda" on a GPU
    for x, y in loader:                             # NumPy arrays or CPU tensors (DLPack)
        metrics = trainer.step({"x": x, "labels": y})
    trainer.save_checkpoint("ckpt.forgeckpt")
    trainer.export_onnx("trained.onnx")

`compile` runs forgec (the same options, the same errors: a failure raises
CompileError with forgec's message); `Trainer` is the runtime forge-train runs, bound
in-process (forge._forge), so a bundle trained here follows forge-train's trajectory
bit for bit given the same data order, seed and thread count. docs/python.md has the guide.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._forge import ForgeError
from . import _forge

__all__ = ["compile", "Bundle", "Trainer", "ForgeError", "CompileError", "forgec_path"]

PathLike = Union[str, "os.PathLike[str]"]


class CompileError(ForgeError):
    """forgec refused the model or the options; the message is forgec's."""


def forgec_path() -> str:
    """The forgec this package runs: $FORGEC, the one installed with the package
    (forge/bin/forgec), the build tree's, or the first on PATH."""
    env = os.environ.get("FORGEC")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "bin", "forgec")
    if os.access(packaged, os.X_OK):
        return packaged
    try:
        from ._build_paths import FORGEC  # the build tree (python/CMakeLists.txt)

        if os.access(FORGEC, os.X_OK):
            return FORGEC
    except ImportError:
        pass
    found = shutil.which("forgec")
    if found:
        return found
    raise ForgeError("forgec not found: set $FORGEC, install the package with pip, or put "
                     "forgec on PATH")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _option_args(options: Mapping[str, Any]) -> List[str]:
    """forgec flags from keyword arguments: batch=32 -> --batch=32; True -> a bare flag;
    False/None -> nothing; a list -> the flag repeated; a dict -> NAME=VALUE per item
    (dim={"seq": 128} -> --dim=seq=128; shape={"x": (8, 3)} -> --shape=x=8,3)."""
    args: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = _flag(key)
        if value is True:
            args.append(flag)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(v, (list, tuple)):
                    v = ",".join(str(d) for d in v)
                args.append(f"{flag}={k}={v}")
        elif isinstance(value, (list, tuple)):
            args.extend(f"{flag}={v}" for v in value)
        else:
            args.append(f"{flag}={value}")
    return args


class Bundle:
    """A compiled .forge bundle (forgec's output), opened and validated.

    `path` is its file; a bundle that `compile` wrote to a temporary file lives as long
    as this object: `save` copies it somewhere lasting."""

    def __init__(self, path: PathLike, *, _keep: Optional[tempfile.TemporaryDirectory] = None,
                 _source: Optional[str] = None):
        self._native = _forge.Bundle(os.fspath(path))
        self._keep = _keep  # the temporary directory of a compiled bundle (and its source)
        self._source = _source

    @classmethod
    def load(cls, path: PathLike) -> "Bundle":
        """Opens the bundle at `path` (ForgeError names what is wrong with it)."""
        return cls(path)

    def save(self, path: PathLike) -> None:
        """Copies the bundle to `path` (atomically: a temporary file, then a rename)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        shutil.copyfile(self.path, tmp)
        os.replace(tmp, path)

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def routines(self) -> List[str]:
        """'train_step' and 'eval' for a training bundle, 'forward' for inference."""
        return self._native.routines

    @property
    def build_options(self) -> Dict[str, str]:
        """What forgec recorded: target, batch, loss, optimizer, source model, ..."""
        return self._native.build_options

    @property
    def source_onnx(self) -> Optional[str]:
        """The ONNX model the bundle was compiled from (for Trainer.export_onnx)."""
        return self._source or self.build_options.get("source_onnx") or None

    def inputs(self, routine: str = "train_step") -> List[tuple]:
        """[(name, dtype, shape)] of a routine's inputs."""
        return self._native.inputs(routine)

    def outputs(self, routine: str = "train_step") -> List[tuple]:
        """[(name, dtype, shape)] of a routine's outputs."""
        return self._native.outputs(routine)

    def __repr__(self) -> str:
        return f"forge.Bundle({self.path!r}, routines={self.routines})"


def compile(model: Any, output: Optional[PathLike] = None, *, target: str = "cpu",
            batch: Union[int, str, None] = None, loss: Optional[str] = None,
            optimizer: Optional[str] = None, precision: Optional[str] = None,
            **options: Any) -> Bundle:
    """Compiles an ONNX model into a bundle with forgec.

    `model` is a path or an onnx.ModelProto (anything with SerializeToString()).
    `output` is where the bundle goes (default: a temporary file owned by the Bundle).
    Every other forgec option is a keyword: lr_schedule="cosine:warmup=100,total=3000",
    micro_batches=4, inference_only=True, dim={"seq": 128}, dump_dir="dumps", ...
    Raises CompileError with forgec's message when forgec refuses."""
    keep = tempfile.TemporaryDirectory(prefix="forge-")
    source: Optional[str] = None
    if hasattr(model, "SerializeToString"):
        source = os.path.join(keep.name, "model.onnx")
        with open(source, "wb") as f:
            f.write(model.SerializeToString())
    else:
        source = os.path.abspath(os.fspath(model))
    out = os.fspath(output) if output is not None else os.path.join(keep.name, "model.forge")
    opts: Dict[str, Any] = {"target": target, "batch": batch, "loss": loss,
                            "optimizer": optimizer, "precision": precision}
    opts.update(options)
    cmd = [forgec_path(), source, "-o", out] + _option_args(opts)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip() or
                   f"forgec exited with status {proc.returncode}")
        raise CompileError(message)
    return Bundle(out, _keep=keep if output is None or source.startswith(keep.name) else None,
                  _source=source)


def _concat_batches(batches: Union[Mapping[str, Any], Iterable[Mapping[str, Any]]]
                    ) -> Dict[str, Any]:
    """One dict of arrays from a dict or from an iterable of dicts (concatenated on dim 0)."""
    import numpy as np

    if isinstance(batches, Mapping):
        return dict(batches)
    parts: Dict[str, list] = {}
    for b in batches:
        for k, v in b.items():
            parts.setdefault(k, []).append(np.asarray(v) if not hasattr(v, "__dlpack__")
                                           else np.from_dlpack(v))
    if not parts:
        raise ForgeError("evaluate(batches): no batches")
    return {k: np.concatenate(v, axis=0) for k, v in parts.items()}


def _image_options(resize, normalize, mean, std, random_resized_crop, crop_scale, bad_records,
                  decode) -> Dict[str, Any]:
    """forge-train's image-folder options as the native Trainer takes them."""
    if normalize not in (None, "none", "imagenet"):
        raise ValueError(f"image_normalize must be 'imagenet' or None, not {normalize!r}")
    if bad_records not in ("fail", "skip"):
        raise ValueError(f"bad_records must be 'fail' or 'skip', not {bad_records!r}")
    if decode not in ("cpu", "gpu", "auto"):
        raise ValueError(f"decode must be 'cpu', 'gpu' or 'auto', not {decode!r}")
    if normalize == "imagenet":
        mean = mean if mean is not None else _forge.IMAGENET_MEAN
        std = std if std is not None else _forge.IMAGENET_STD
    return {"image_resize": int(resize), "image_mean": [float(v) for v in mean or ()],
            "image_std": [float(v) for v in std or ()],
            "random_resized_crop": bool(random_resized_crop),
            "crop_scale": [float(v) for v in crop_scale or ()],
            "skip_bad_records": bad_records == "skip", "decode": decode}


class Trainer:
    """Trains a bundle: forge-train's engine, in this process.

    device: "cpu", "cuda", "cuda:N" or "auto". data / eval_data: files as forge-train's
    --data / --eval-data take them (.npz, NAME=FILE.npy, token shards, image folders);
    without `data`, every step takes its batch as an argument. seed, shuffle, threads,
    workers, prefetch, cuda_graphs: as forge-train's options. weights: the directory of
    a thin bundle's external data. doc_separator: token shards as documents ending at that
    token id, batched by length into the bundle's length buckets (forge-train's
    --doc-separator). Image folders, as forge-train's options: image_resize (the shorter
    side before the centre crop), image_normalize ("imagenet") or image_mean/image_std
    (3 values each, float inputs), random_resized_crop and crop_scale=(min, max) (the
    training data; eval keeps the centre crop), bad_records ("fail" or "skip"), decode
    ("cpu", "gpu" or "auto": JPEGs decoded on the GPU, for canvas bundles).
    attention_backward: cuDNN's fused attention backward on CUDA, "fast" (its atomic dq,
    as PyTorch's flash backward) or "deterministic" (bit-identical gradients run to run,
    slower), as forge-train's --attention-backward."""

    def __init__(self, bundle: Union[Bundle, PathLike], device: str = "cpu", *,
                 data: Union[PathLike, Sequence[PathLike], None] = None,
                 eval_data: Union[PathLike, Sequence[PathLike], None] = None,
                 seed: int = 0, shuffle: bool = True, threads: int = 0, workers: int = 0,
                 prefetch: int = 2, cuda_graphs: bool = True, weights: Optional[PathLike] = None,
                 token_dtype: str = "u16", doc_separator: Optional[int] = None,
                 image_resize: int = 0, image_normalize: Optional[str] = None,
                 image_mean: Optional[Sequence[float]] = None,
                 image_std: Optional[Sequence[float]] = None,
                 random_resized_crop: bool = False,
                 crop_scale: Optional[Sequence[float]] = None,
                 bad_records: str = "fail", decode: str = "cpu",
                 attention_backward: str = "fast"):
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle(bundle)

        def paths(p: Union[PathLike, Sequence[PathLike], None]) -> List[str]:
            if p is None:
                return []
            if isinstance(p, (str, os.PathLike)):
                return [os.fspath(p)]
            return [os.fspath(x) for x in p]

        self._native = _forge.Trainer(self.bundle._native, device=device, data=paths(data),
                                      eval_data=paths(eval_data), seed=seed, shuffle=shuffle,
                                      threads=threads, workers=workers, prefetch=prefetch,
                                      cuda_graphs=cuda_graphs,
                                      weights=os.fspath(weights) if weights else "",
                                      token_dtype=token_dtype,
                                      doc_separator=-1 if doc_separator is None
                                      else int(doc_separator), **_image_options(
                                          image_resize, image_normalize, image_mean, image_std,
                                          random_resized_crop, crop_scale, bad_records,
                                          decode), attention_backward=attention_backward)

    def step(self, batch: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """One optimizer step; returns {"step", "loss", "lr"?, "grad_norm"?, "loss_scale"?,
        "skipped"?, "input_seconds", "length"?, "tokens"?} (length, tokens: a step of
        documents, doc_separator: its length bucket and its labelled tokens).

        With `batch` (input name -> array with samples_per_step rows: NumPy, or any CPU
        tensor with __dlpack__, read in place), the step trains on it; without, on the
        next samples of `data`. Arrays are checked as forge-train checks data files (dtype,
        shape, label range), and a mismatch raises ForgeError naming the input."""
        return self._native.step(dict(batch) if batch is not None else None)

    def evaluate(self, batches: Union[Mapping[str, Any], Iterable[Mapping[str, Any]], None]
                 = None) -> Dict[str, Any]:
        """Mean loss (and accuracy) of the eval routine over `batches` (a dict of arrays,
        or an iterable of such dicts, concatenated; any number of samples: a last partial
        batch counts with weight 0 padding) or over `eval_data`. Parameters are unchanged.
        The given batches become the trainer's eval data."""
        return self._native.evaluate(_concat_batches(batches) if batches is not None else None)

    def save_checkpoint(self, path: PathLike) -> str:
        """Writes parameters, optimizer state, step and data position atomically and returns
        the file. `path` is a file, or a directory (an existing one, or a path ending in
        "/"): then the layout of forge-train --ckpt-dir (ckpt-<step>.forgeckpt and
        `latest`), so that forge-train --ckpt-dir DIR --resume continues from it."""
        p = os.fspath(path)
        return self._native.save_checkpoint(p, os.path.isdir(p) or p.endswith(os.sep))

    def resume(self, path: PathLike) -> Optional[int]:
        """Restores a checkpoint of this bundle: a file (forge-train's or save_checkpoint's)
        or a checkpoint directory's newest valid one (corrupt files are skipped with a
        warning). Returns the step it continues from (None: the directory holds none).
        A checkpoint of another bundle raises ForgeError; parameters are unchanged then."""
        p = os.fspath(path)
        step, warns = self._native.resume(p, os.path.isdir(p))
        for w in warns:
            warnings.warn(w, stacklevel=2)
        return step

    def export_onnx(self, path: PathLike, onnx_model: Optional[PathLike] = None) -> List[str]:
        """Writes the source ONNX model (or `onnx_model`) with the trained values of its
        initializers to `path`; returns the names replaced."""
        source = os.fspath(onnx_model) if onnx_model else self.bundle.source_onnx
        if not source:
            raise ForgeError("export_onnx: the bundle does not record its source model; pass "
                             "onnx_model=PATH")
        return self._native.export_onnx(os.fspath(path), source)

    def parameters(self) -> Dict[str, Any]:
        """Trained parameters by initializer name (a PyTorch export's state_dict names) as
        NumPy arrays (copies; bf16 widened to float32)."""
        return self._native.tensors(False)

    def state(self) -> Dict[str, Any]:
        """Every persistent tensor by name: parameters, optimizer moments, running
        statistics (copies)."""
        return self._native.tensors(True)

    @property
    def fields(self) -> List[tuple]:
        """[(name, dtype, batch shape)] of the arrays a step takes."""
        return self._native.fields

    @property
    def steps_done(self) -> int:
        return self._native.steps_done

    @property
    def batch_size(self) -> int:
        return self._native.batch_size

    @property
    def micro_batches(self) -> int:
        return self._native.micro_batches

    @property
    def samples_per_step(self) -> int:
        """Rows the next step's batch holds: micro_batches x batch_size (with a
        batch-size schedule, forgec --batch-schedule, the next step's size)."""
        return self._native.samples_per_step

    @property
    def device(self) -> str:
        return self._native.device
