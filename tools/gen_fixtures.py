#!/usr/bin/env python3
"""Record PyTorch training runs that Forge's end-to-end parity tests must reproduce.

For each model (mlp, cnn, gpt) and each optimizer (adamw, sgd_momentum) this writes
tests/fixtures/<model>_<optimizer>/:

  model.onnx            the model WITHOUT a loss (graph input x or input_ids -> output
                        logits), TorchScript exporter, opset 17, exported in training mode
                        with constant folding off (initializers keep their torch names,
                        none merged, ties kept); its initializers are the initial state
  batches.npz           the 20 batches, stacked along dim 0: array <input name> [20*B, ...]
                        and labels [20*B, ...]; step k (1-based) uses rows (k-1)*B .. k*B-1
  init_params.npz       initial value of every trainable initializer (== model.onnx's)
  logits_step1.npy      forward output on batch 1 with the initial weights (float32)
  losses.npy            float64 [20]: the loss of step k on batch k, before update k
  grads_step1.npz       d loss_1 / d param for every trainable initializer (before any update,
                        before weight decay), in the initializer's own layout
  params_step20.npz     every trainable initializer after 20 optimizer steps
  buffers_step20_torch.npz  (cnn only) BatchNorm running_mean/running_var after 20 steps,
                        PyTorch semantics (running_var updated with the UNBIASED batch variance)
  buffers_step20_onnx.npz   (cnn only) the same under the ONNX BatchNormalization spec
                        (running_var updated with the BIASED batch variance, as onnx.reference does)
  manifest.json         names, shapes, roles and weight-decay flags of the initializers, the
                        torch-name -> initializer-name mapping, hyperparameters, loss definition,
                        tolerances, versions, and how far this float32 run is from a float64 run

The files of model.onnx, batches.npz, init_params.npz and logits_step1.npy are identical in
the two optimizer directories of a model (git stores them once). Everything is seeded,
single-threaded, CPU-only and deterministic: two runs give identical arrays.

Run where PyTorch is installed (it is never needed to run the tests):
  /tmp/modelvenv/bin/python tools/gen_fixtures.py [--only mlp cnn gpt] [--out-dir DIR]
Format and semantics for the test author: tests/e2e/README.md.
"""
import argparse
import copy
import io
import json
import math
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

OPSET = 17
STEPS = 20
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "fixtures"))
MAX_TOTAL_BYTES = 5 * 1024 * 1024

OPTIMIZERS = {
    # Forge spellings: --optimizer adamw:lr=1e-3,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.01
    "adamw": {"type": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
              "weight_decay": 0.01, "amsgrad": False,
              "weight_decay_applies_to": "params with dim >= 2 (roles weight, embedding); "
                                         "not biases, norm scales, norm biases"},
    # --optimizer sgd:lr=0.05,momentum=0.9
    "sgd_momentum": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.0,
                     "nesterov": False, "weight_decay": 0.0},
}

# Tolerances the parity test applies (fp32 Forge vs these fp32 PyTorch numbers); the manifest
# also records how far the fp32 PyTorch run itself is from a float64 PyTorch run.
TOLERANCES = {
    "metric": "per step for losses: |a-b|/|b|; per array otherwise: ||a-b||_2/||b||_2",
    "losses_rel": 1e-4, "logits_step1_rel": 1e-4, "grads_step1_rel": 1e-4,
    "params_step20_rel": 1e-4,
    "params_step20_delta_rel": 1e-3,
    "delta_metric": "||(a-p0)-(b-p0)||_2/||b-p0||_2 per array, p0 = init_params; an "
                    "advisory, stricter check of the update itself",
    "buffers_step20_rel": 1e-4,
}


# --------------------------------------------------------------------------- models

class MLP(nn.Module):
    """64-32-10, ReLU."""
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    """2x (Conv3x3 no bias - BatchNorm - ReLU - MaxPool2), global average pool, Linear.
    The convolutions have no bias: a bias right before BatchNorm has an exactly-zero true
    gradient, and its float32 gradient is rounding noise that Adam would amplify."""
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


VOCAB, SEQ, DMODEL, HEADS, LAYERS = 64, 16, 32, 4, 2


class CausalSelfAttention(nn.Module):
    """qkv has no bias: the key bias has an exactly-zero true gradient (softmax is invariant
    to a per-row shift), and its rounding-noise gradient would make Adam's update arbitrary."""
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DMODEL, 3 * DMODEL, bias=False)
        self.proj = nn.Linear(DMODEL, DMODEL)
        self.register_buffer("causal", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool))
                             .view(1, 1, SEQ, SEQ), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        hd = c // HEADS
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, HEADS, hd).transpose(1, 2)
        k = k.view(b, t, HEADS, hd).transpose(1, 2)
        v = v.view(b, t, HEADS, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DMODEL)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(DMODEL)
        self.mlp = nn.Sequential(nn.Linear(DMODEL, 4 * DMODEL), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * DMODEL, DMODEL))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """2 layers, d=32, 4 heads, vocab 64, seq 16, learned positions, pre-LN, tanh-GELU,
    causal; the output head is tied to the token embedding (one initializer, wte.weight,
    used by a Gather and, through a Transpose, by the head MatMul)."""
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DMODEL)
        self.wpe = nn.Embedding(SEQ, DMODEL)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(DMODEL)
        self.register_buffer("pos", torch.arange(SEQ, dtype=torch.int64), persistent=False)
        # GPT-2's embedding init; nn.Embedding's N(0, 1) with the tied head gives logits with
        # std ~6 and an initial loss of ~21 instead of ~ln(64).
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(self.pos[:t])
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


# --------------------------------------------------------------------------- data

def mlp_data(gen, n):
    x = torch.randn(n, 64, generator=gen)
    teacher = torch.randn(64, 10, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def cnn_data(gen, n):
    x = torch.randn(n, 3, 16, 16, generator=gen)
    feats = F.adaptive_avg_pool2d(x, 2).flatten(1)  # [n, 12]: per channel, per quadrant
    teacher = torch.randn(12, 10, generator=gen)
    return x, (feats @ teacher).argmax(dim=1)


def gpt_data(gen, n):
    """Sequences t_{i+1} = (t_i + s) mod VOCAB with random start and stride s in 1..4;
    input = tokens 0..15, labels = tokens 1..16 (next-token prediction)."""
    start = torch.randint(0, VOCAB, (n, 1), generator=gen)
    stride = torch.randint(1, 5, (n, 1), generator=gen)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


MODELS = {
    # name: (constructor, data fn, batch, input name, seed)
    "mlp": (MLP, mlp_data, 8, "x", 11),
    "cnn": (CNN, cnn_data, 4, "x", 12),
    "gpt": (GPT, gpt_data, 4, "input_ids", 13),
}


def loss_fn(logits, labels):
    """Forge's cross_entropy:logits,labels — classes on the last axis, mean over all other
    positions (the batch; for GPT all B*T tokens)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


# --------------------------------------------------------------------------- roles

def assign_roles(model):
    """torch parameter/buffer name -> role, by module type (never by position)."""
    roles = {}
    for mname, mod in model.named_modules():
        pre = mname + "." if mname else ""
        for pname, _ in mod.named_parameters(recurse=False):
            full = pre + pname
            if isinstance(mod, (nn.Linear, nn.Conv2d)):
                role = "weight" if pname == "weight" else "bias"
            elif isinstance(mod, (nn.LayerNorm, nn.modules.batchnorm._BatchNorm)):
                role = "norm_scale" if pname == "weight" else "norm_bias"
            elif isinstance(mod, nn.Embedding):
                role = "embedding"
            else:
                raise SystemExit(f"no role rule for {full} in {type(mod).__name__}")
            roles.setdefault(full, role)  # a tied parameter keeps its first owner's role
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            # Forge's role name for both (compiler/lib/Train: "running_stat"): state, not trained
            roles[pre + "running_mean"] = "running_stat"
            roles[pre + "running_var"] = "running_stat"
    return roles


def decays(role):
    return role in ("weight", "embedding")


# --------------------------------------------------------------------------- export

def export(model, trace_args, input_name):
    """TorchScript export in training mode, constant folding off. Returns the ModelProto.
    Exports a deep copy: tracing in training mode runs a forward, which would update the
    BatchNorm running statistics and num_batches_tracked of the model itself."""
    m = copy.deepcopy(model).train()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, trace_args, f, dynamo=False, opset_version=OPSET,
                          input_names=[input_name], output_names=["logits"],
                          dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    proto = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(proto)
    return proto, f.getvalue()


def map_initializers(proto, model, roles):
    """Maps every torch parameter/BN buffer to the ONNX initializer holding its initial value:
    by exact name and equal value first, else by equal value (possibly transposed). Every float
    initializer must be claimed. Returns a list of entries in ONNX initializer order."""
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    order = [i.name for i in proto.graph.initializer]
    tensors = dict(model.named_parameters())
    for n, b in model.named_buffers():
        if n in roles:
            tensors[n] = b
    claimed, entries = {}, {}
    for tname, t in tensors.items():
        val = t.detach().numpy()
        how = None
        if (roles.get(tname) == "running_stat" and tname in inits
                and inits[tname].shape == val.shape and not np.array_equal(inits[tname], val)):
            # Tracing in training mode runs BatchNorm forwards that update the running
            # statistics before they are written: the ONNX holds the post-trace values. They
            # are the run's initial state: copy them into the model.
            with torch.no_grad():
                t.copy_(torch.from_numpy(inits[tname].copy()))
            val = t.detach().numpy()
            entries_note = "name; value taken from the ONNX (updated by the export's trace)"
        else:
            entries_note = None
        if tname in inits and inits[tname].shape == val.shape and np.array_equal(inits[tname], val):
            iname, how = tname, "name+value"
        else:
            for iname, arr in inits.items():
                if iname in claimed:
                    continue
                if arr.shape == val.shape and np.array_equal(arr, val):
                    how = "value"
                    break
                if arr.ndim == 2 and arr.shape == val.T.shape and np.array_equal(arr, val.T):
                    how = "value_transposed"
                    break
        if how is None:
            raise SystemExit(f"torch tensor {tname} {tuple(val.shape)} not found among the "
                             f"exported initializers {sorted(inits)}")
        if iname in claimed:
            raise SystemExit(f"initializer {iname} claimed by {claimed[iname]} and {tname}")
        claimed[iname] = tname
        role = roles[tname]
        if entries_note and how == "name+value":
            how = entries_note
        entries[iname] = {"name": iname, "torch_name": tname, "match": how,
                          "transposed": how == "value_transposed",
                          "shape": list(inits[iname].shape), "dtype": str(inits[iname].dtype),
                          "role": role,
                          "trainable": role != "running_stat",
                          "weight_decay": decays(role)}
    unclaimed = [n for n, a in inits.items() if a.dtype.kind == "f" and n not in claimed]
    if unclaimed:
        raise SystemExit(f"float initializers that are no parameter or buffer: {unclaimed}")
    return [entries[n] for n in order if n in entries]


def uses(proto, name):
    return sorted({n.op_type for n in proto.graph.node if name in n.input})


# --------------------------------------------------------------------------- training

def make_optimizer(model, opt):
    if opt == "adamw":
        h = OPTIMIZERS[opt]
        decay, no_decay = [], []
        roles = assign_roles(model)
        for n, p in model.named_parameters():
            (decay if decays(roles[n]) else no_decay).append(p)
            assert decays(roles[n]) == (p.dim() >= 2), n  # the role rule == the dim rule here
        groups = [{"params": decay, "weight_decay": h["weight_decay"]},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                                 amsgrad=False, foreach=False, fused=False)
    h = OPTIMIZERS[opt]
    return torch.optim.SGD(model.parameters(), lr=h["lr"], momentum=h["momentum"],
                           dampening=h["dampening"], nesterov=h["nesterov"],
                           weight_decay=h["weight_decay"], foreach=False)


class OnnxBnShadow:
    """Tracks BatchNorm running statistics the way the ONNX spec (and onnx.reference) updates
    them: running = momentum_onnx * running + (1 - momentum_onnx) * batch_stat, with the
    biased batch variance. PyTorch uses the unbiased variance for running_var instead."""
    def __init__(self, model):
        self.state, self.handles = {}, []
        for name, mod in model.named_modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                self.state[name] = [mod.running_mean.detach().clone(), mod.running_var.detach().clone()]
                self.handles.append(mod.register_forward_pre_hook(self._hook(name, mod)))

    def _hook(self, name, mod):
        def hook(_, inputs):
            if not mod.training:
                return
            x = inputs[0].detach()
            axes = [0] + list(range(2, x.dim()))
            mean = x.mean(dim=axes)
            var = x.var(dim=axes, unbiased=False)
            mom = 1.0 - mod.momentum  # ONNX momentum attribute
            rm, rv = self.state[name]
            self.state[name] = [rm * mom + mean * (1 - mom), rv * mom + var * (1 - mom)]
        return hook

    def arrays(self, prefix_map):
        out = {}
        for name, (rm, rv) in self.state.items():
            out[prefix_map[name + ".running_mean"]] = rm.numpy().astype(np.float32)
            out[prefix_map[name + ".running_var"]] = rv.numpy().astype(np.float32)
        return out


def train(model, opt_name, xs, ys, batch, dtype):
    """Runs STEPS steps. Returns (logits of step 1, losses, grads after backward 1,
    final model, onnx-semantics BN shadow)."""
    model = copy.deepcopy(model).to(dtype).train()
    shadow = OnnxBnShadow(model)
    opt = make_optimizer(model, opt_name)
    losses, grads1, logits1 = [], None, None
    for k in range(STEPS):
        x = xs[k * batch:(k + 1) * batch]
        y = ys[k * batch:(k + 1) * batch]
        if x.is_floating_point():
            x = x.to(dtype)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = loss_fn(logits, y)
        loss.backward()
        if k == 0:
            logits1 = logits.detach().clone()
            grads1 = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
    return logits1, np.array(losses, dtype=np.float64), grads1, model, shadow


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


# --------------------------------------------------------------------------- main

def versions():
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "onnx": onnx.__version__,
         "numpy": np.__version__}
    try:
        import onnxruntime
        v["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return v


def ort_logits(model_bytes, input_name, x):
    """ONNX Runtime's forward of the exported model (None if unavailable/unsupported)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime not installed"
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        return sess.run(["logits"], {input_name: x})[0], None
    except Exception as e:  # e.g. BatchNormalization training_mode=1 in a non-training build
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def save_npz(path, arrays):
    np.savez(path, **arrays)


def build_model(name):
    ctor, data_fn, batch, input_name, seed = MODELS[name]
    torch.manual_seed(seed)
    model = ctor()
    gen = torch.Generator().manual_seed(seed + 1000)
    xs, ys = data_fn(gen, STEPS * batch)
    # Trace at another batch size, so that no batch-sized constant can hide in the graph.
    trace = data_fn(torch.Generator().manual_seed(seed + 2000), batch + 1)[0]
    return model, xs, ys.to(torch.int64), batch, input_name, trace


def make(name, out_dir, vers):
    model, xs, ys, batch, input_name, trace = build_model(name)
    roles = assign_roles(model)
    proto, model_bytes = export(model, (trace,), input_name)
    entries = map_initializers(proto, model, roles)
    t2i = {e["torch_name"]: e["name"] for e in entries}
    params = [e for e in entries if e["trainable"]]
    buffers = [e for e in entries if not e["trainable"]]
    for e in entries:
        e["used_by"] = uses(proto, e["name"])

    def to_init_layout(torch_name, arr):
        e = next(e for e in entries if e["torch_name"] == torch_name)
        return np.ascontiguousarray(arr.T if e["transposed"] else arr).astype(np.float32)

    init = {e["name"]: numpy_helper.to_array(next(i for i in proto.graph.initializer
                                                  if i.name == e["name"])) for e in params}
    batches = {input_name: xs.numpy(), "labels": ys.numpy()}
    ort_out, ort_note = ort_logits(model_bytes, input_name, xs[:batch].numpy())
    written = []
    for opt_name in OPTIMIZERS:
        d = os.path.join(out_dir, f"{name}_{opt_name}")
        os.makedirs(d, exist_ok=True)
        logits1, losses, grads1, final, shadow = train(model, opt_name, xs, ys, batch, torch.float32)
        l64, losses64, grads64, final64, _ = train(model, opt_name, xs, ys, batch, torch.float64)

        grads = {t2i[n]: to_init_layout(n, g.numpy()) for n, g in grads1.items()}
        p20 = {t2i[n]: to_init_layout(n, p.detach().numpy()) for n, p in final.named_parameters()}
        g64 = {t2i[n]: to_init_layout(n, g.numpy()) for n, g in grads64.items()}
        p64 = {t2i[n]: to_init_layout(n, p.detach().numpy()) for n, p in final64.named_parameters()}
        tparams = dict(model.named_parameters())
        for e in params:  # the torch run must have started from model.onnx's values
            assert np.array_equal(init[e["name"]],
                                  to_init_layout(e["torch_name"],
                                                 tparams[e["torch_name"]].detach().numpy())), e["name"]
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(model_bytes)
        save_npz(os.path.join(d, "batches.npz"), batches)
        save_npz(os.path.join(d, "init_params.npz"), init)
        np.save(os.path.join(d, "logits_step1.npy"), logits1.numpy().astype(np.float32))
        np.save(os.path.join(d, "losses.npy"), losses)
        save_npz(os.path.join(d, "grads_step1.npz"), grads)
        save_npz(os.path.join(d, "params_step20.npz"), p20)
        files = ["model.onnx", "batches.npz", "init_params.npz", "logits_step1.npy", "losses.npy",
                 "grads_step1.npz", "params_step20.npz"]
        buf_torch = buf_onnx = None
        if buffers:
            buf_torch = {t2i[n]: b.detach().numpy().astype(np.float32)
                         for n, b in final.named_buffers() if n in t2i}
            buf_onnx = shadow.arrays(t2i)
            save_npz(os.path.join(d, "buffers_step20_torch.npz"), buf_torch)
            save_npz(os.path.join(d, "buffers_step20_onnx.npz"), buf_onnx)
            files += ["buffers_step20_torch.npz", "buffers_step20_onnx.npz"]

        fp64 = {
            "what": "this float32 PyTorch run vs the same run in float64 (same init, same "
                    "batches), with the parity metrics; shows the slack under the tolerances",
            "logits_step1_rel": rel(logits1.numpy(), l64.numpy()),
            "losses_rel_max": float(np.max(np.abs(losses - losses64) / np.abs(losses64))),
            "grads_step1_rel_max": max(rel(grads[k], g64[k]) for k in grads),
            "params_step20_rel_max": max(rel(p20[k], p64[k]) for k in p20),
            "params_step20_delta_rel_max": max(rel(p20[k] - init[k], p64[k] - init[k]) for k in p20),
        }
        fp64["params_step20_delta_rel_worst"] = max(
            p20, key=lambda k: rel(p20[k] - init[k], p64[k] - init[k]))
        bn_note = None
        if buffers:
            fp64["buffers_torch_vs_onnx_semantics_rel_max"] = max(
                rel(buf_torch[k], buf_onnx[k]) for k in buf_torch)
            bn_note = ("model.onnx has BatchNormalization(training_mode=1, momentum=0.9 "
                       "[= 1 - torch's 0.1], epsilon=1e-5) with 3 outputs; outputs 1 and 2 (the "
                       "updated running mean/var) are not graph outputs and nothing in the graph "
                       "writes them back: the trainer must carry them as state. The forward uses "
                       "batch statistics (biased variance). PyTorch updates running_var with the "
                       "unbiased variance (n/(n-1) factor), the ONNX spec with the biased one: "
                       "buffers_step20_torch.npz vs buffers_step20_onnx.npz. Losses, gradients "
                       "and parameters do not depend on the running statistics.")
        manifest = {
            "generated_by": "tools/gen_fixtures.py",
            "model": name, "optimizer": opt_name, "steps": STEPS, "batch_size": batch,
            "files": files,
            "onnx": {"exporter": "torchscript", "opset": OPSET,
                     "training": "TrainingMode.TRAINING", "do_constant_folding": False,
                     "inputs": [input_name], "outputs": ["logits"],
                     "symbolic_dims": {input_name: {"0": "batch"}, "logits": {"0": "batch"}},
                     "traced_at_batch": int(trace.shape[0]),
                     "op_types": sorted({n.op_type for n in proto.graph.node}),
                     "bytes": len(model_bytes)},
            "data": {"file": "batches.npz",
                     "arrays": {input_name: {"shape": list(xs.shape), "dtype": str(batches[input_name].dtype)},
                                "labels": {"shape": list(ys.shape), "dtype": "int64"}},
                     "layout": f"stacked along dim 0: step k (1-based) uses rows "
                               f"[(k-1)*{batch}, k*{batch}); read in order, no shuffling"},
            "loss": {"forge": "--loss cross_entropy:logits,labels",
                     "definition": "softmax cross-entropy, classes on the last axis of logits, "
                                   "integer labels, mean over all other positions"
                                   + (" (all B*T tokens)" if name == "gpt" else " (the batch)"),
                     "losses_npy": "float64 [steps]; losses[k-1] = loss of step k on batch k "
                                   "with the parameters before update k (values are float32 "
                                   "losses widened to float64)"},
            "optimizer_hparams": OPTIMIZERS[opt_name],
            "optimizer_torch": ("torch.optim.AdamW(two groups: weight_decay=0.01 for "
                                "weight/embedding, 0 for the rest; foreach=False)"
                                if opt_name == "adamw" else
                                "torch.optim.SGD(lr=0.05, momentum=0.9, dampening=0, "
                                "nesterov=False, weight_decay=0, foreach=False)"),
            "lr_schedule": "constant", "grad_clip": None, "grad_accumulation": 1,
            "initializers": entries,
            "parameters": [e["name"] for e in params],
            "state_buffers": [e["name"] for e in buffers],
            "batchnorm": bn_note,
            "tolerances": TOLERANCES,
            "fp32_vs_fp64": fp64,
            "onnxruntime_logits_step1_rel": (rel(ort_out, logits1.numpy())
                                             if ort_out is not None else None),
            "onnxruntime_note": ort_note,
            "versions": vers,
        }
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        size = sum(os.path.getsize(os.path.join(d, fn)) for fn in files + ["manifest.json"])
        written.append(d)
        print(f"{name}_{opt_name:13s} {size / 1024:7.1f} KiB  loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}  fp64: loss {fp64['losses_rel_max']:.1e} grad "
              f"{fp64['grads_step1_rel_max']:.1e} p20 {fp64['params_step20_rel_max']:.1e} "
              f"dp20 {fp64['params_step20_delta_rel_max']:.1e}  ort {manifest['onnxruntime_logits_step1_rel']}"
              + (f"  bn torch/onnx {fp64['buffers_torch_vs_onnx_semantics_rel_max']:.1e}" if buffers else ""))
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models; default all")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    vers = versions()
    for name in a.only or list(MODELS):
        make(name, a.out_dir, vers)
    total = sum(os.path.getsize(os.path.join(dp, f))
                for dp, _, fs in os.walk(a.out_dir) for f in fs)
    print(f"total {total / 1024:.1f} KiB in {a.out_dir}")
    if total > MAX_TOTAL_BYTES:
        print(f"over the {MAX_TOTAL_BYTES} byte budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
