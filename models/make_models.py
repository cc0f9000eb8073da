#!/usr/bin/env python3
"""Produce Forge's small real-model set: ONNX files and their PyTorch reference outputs.

For every model NAME this writes, next to this script:
  NAME.onnx     the exported model, weights embedded, batch dim symbolic ("batch")
  NAME.ref.npz  reference inputs and outputs at batch 2, computed by PyTorch in float32
                (eval mode); every array is named exactly like the ONNX graph input or
                output it belongs to
and it (re)writes manifest.json: per model, the file names, graph input/output names,
exporter, opset and the error of ONNX Runtime against the reference (a check that the
export itself is faithful; ONNX Runtime is optional).

The models:
  mlp                    784-128-64-10 MLP with ReLU                  (TorchScript exporter)
  cnn                    2x (Conv-BN-ReLU-MaxPool), GlobalAvgPool, Linear; BatchNormalization
                         kept in the graph (training=PRESERVE, module in eval mode)
  gpt                    2-layer GPT: learned positions, causal mask, pre-LN, tanh-GELU MLP,
                         head tied to the token embedding                 (TorchScript exporter)
  gpt_dynamo             the same GPT (same weights) through the dynamo exporter
  bert                   2-layer post-LN BERT-style encoder, int64 attention_mask turned into
                         an additive mask inside the model, erf-GELU; outputs
                         last_hidden_state and pooled classifier logits
  hf_bert_tiny           transformers.BertModel built from a tiny BertConfig (no download),
                         eager attention                                 (TorchScript exporter)
  tv_mobilenet_v3_small  torchvision mobilenet_v3_small(width_mult=0.5, num_classes=10),
                         random init (no download)                       (TorchScript exporter)

Run (CPU only, deterministic, single thread):
  python -m venv /tmp/modelvenv && /tmp/modelvenv/bin/pip install -r models/requirements.txt
  /tmp/modelvenv/bin/python models/make_models.py [--only NAME ...] [--out-dir DIR]
"""
import argparse
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

OPSET = 17        # TorchScript exporter
REF_BATCH = 2     # batch of the reference arrays
TRACE_BATCH = 3   # batch used while exporting, so that no batch-2 constant can hide in the graph
VOCAB, SEQ, DMODEL, HEADS, LAYERS = 128, 32, 64, 4, 2


# --------------------------------------------------------------------------- models

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, h, t):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t),
                             persistent=False)
        # Written-out attention (what the ONNX exports and fixtures hold) unless set:
        # bench/bench_train.py times PyTorch both ways.
        self.sdpa = False

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.h, c // self.h).transpose(1, 2)
        k = k.view(b, t, self.h, c // self.h).transpose(1, 2)
        v = v.view(b, t, self.h, c // self.h).transpose(1, 2)
        if self.sdpa:  # the same attention as one op (PyTorch's flash attention on a GPU)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
            att = att.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, d, h, t):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, h, t)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The small GPT by default; bench/bench_train.py builds GPT-2 124M from it."""

    def __init__(self, vocab=VOCAB, seq=SEQ, d=DMODEL, heads=HEADS, layers=LAYERS):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([GPTBlock(d, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.register_buffer("pos", torch.arange(seq, dtype=torch.int64), persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(self.pos[:t])
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # head tied to the token embedding


class BertSelfAttention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x, add_mask):
        b, t, c = x.shape
        hd = c // self.h
        q = self.q(x).view(b, t, self.h, hd).permute(0, 2, 1, 3)
        k = self.k(x).view(b, t, self.h, hd).permute(0, 2, 3, 1)
        v = self.v(x).view(b, t, self.h, hd).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k) / math.sqrt(hd) + add_mask
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, t, c)
        return self.o(ctx)


class BertLayer(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.attn = BertSelfAttention(d, h)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.ff1 = nn.Linear(d, 2 * d)
        self.ff2 = nn.Linear(2 * d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, add_mask):
        x = self.ln1(x + self.attn(x, add_mask))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DMODEL)
        self.pos = nn.Embedding(SEQ, DMODEL)
        self.ln_emb = nn.LayerNorm(DMODEL, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(DMODEL, HEADS) for _ in range(LAYERS)])
        self.pooler = nn.Linear(DMODEL, DMODEL)
        self.classifier = nn.Linear(DMODEL, 2)
        self.register_buffer("position_ids", torch.arange(SEQ, dtype=torch.int64).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        x = self.ln_emb(self.tok(input_ids) + self.pos(self.position_ids[:, :t]))
        # [B,T] int64 (1 = attend, 0 = padding) -> additive [B,1,1,T] float mask
        m = attention_mask[:, None, None, :].to(torch.float32)
        add_mask = (1.0 - m) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, add_mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, self.classifier(pooled)


# --------------------------------------------------------------------------- inputs

def token_inputs(batch, gen):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=gen, dtype=torch.int64)


def bert_mask(batch):
    m = torch.ones(batch, SEQ, dtype=torch.int64)
    for i in range(1, batch):  # row 0 unpadded; row i has its last 8*i tokens padded
        m[i, SEQ - min(8 * i, SEQ - 1):] = 0
    return m


def image_inputs(batch, gen, hw):
    return torch.randn(batch, 3, hw, hw, generator=gen)


# --------------------------------------------------------------------------- export

def seeded(seed):
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed + 1000)


def warm_batchnorm(model, make_input, steps=4):
    """Give BatchNorm non-trivial affine parameters and running statistics (not the
    identity's 1/0 and 0 mean, 1 var), so that a BN wrongly dropped or mis-folded shows."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0.0, 0.1)
    model.train()
    with torch.no_grad():
        for _ in range(steps):
            model(make_input())
    model.eval()


def export_torchscript(model, args, path, input_names, output_names, preserve_training_ops=False):
    dyn = {n: {0: "batch"} for n in list(input_names) + list(output_names)}
    kwargs = {}
    if preserve_training_ops:
        # Keep BatchNormalization (training_mode=0) instead of folding it into the Conv, as the
        # eval-mode peephole would: a training compiler must see the BN parameters.
        kwargs["training"] = torch.onnx.TrainingMode.PRESERVE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, dynamo=False, opset_version=OPSET,
                          input_names=list(input_names), output_names=list(output_names),
                          dynamic_axes=dyn, do_constant_folding=True, **kwargs)


def export_dynamo(model, args, path, input_names, output_names):
    batch = torch.export.Dim("batch", min=1, max=1024)
    dynamic_shapes = tuple({0: batch} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, args, None, dynamo=True, input_names=list(input_names),
                                 output_names=list(output_names), dynamic_shapes=dynamic_shapes,
                                 external_data=False)
        prog.save(path, external_data=False)


def graph_io(path):
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    ins = [i.name for i in m.graph.input if i.name not in inits]
    outs = [o.name for o in m.graph.output]
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    onnx.checker.check_model(m)
    ops = sorted({n.op_type for n in m.graph.node})
    return ins, outs, opset, ops, m


def check_symbolic_batch(m, path):
    for vi in list(m.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].dim_param:
            raise SystemExit(f"{path}: input {vi.name} has a static dim 0 ({dims[0].dim_value})")


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def ort_check(path, feeds, refs):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    return {n: rel_err(o, refs[n]) for n, o in zip(names, outs)}


def build(name, out_dir):
    """Returns (module, export inputs at TRACE_BATCH, reference inputs at REF_BATCH,
    input names, output names, exporter, extra export kwargs)."""
    if name == "mlp":
        gen = seeded(1)
        model = MLP().eval()
        mk = lambda b: (torch.randn(b, 784, generator=gen),)
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["x"], ["logits"], "torchscript", {}
    if name == "cnn":
        gen = seeded(2)
        model = CNN()
        warm_batchnorm(model, lambda: image_inputs(8, gen, 32) * 2.0 + 0.5)
        mk = lambda b: (image_inputs(b, gen, 32),)
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["x"], ["logits"], "torchscript", \
            {"preserve_training_ops": True}
    if name in ("gpt", "gpt_dynamo"):
        gen = seeded(3)  # same seed: gpt_dynamo has exactly gpt's weights and inputs
        model = GPT().eval()
        mk = lambda b: (token_inputs(b, gen),)
        exporter = "dynamo" if name == "gpt_dynamo" else "torchscript"
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["input_ids"], ["logits"], exporter, {}
    if name == "bert":
        gen = seeded(4)
        model = Bert().eval()
        mk = lambda b: (token_inputs(b, gen), bert_mask(b))
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["input_ids", "attention_mask"], \
            ["last_hidden_state", "logits"], "torchscript", {}
    if name == "hf_bert_tiny":
        from transformers import BertConfig, BertModel
        gen = seeded(5)
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=DMODEL, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, intermediate_size=4 * DMODEL,
                         max_position_embeddings=SEQ, type_vocab_size=2)
        cfg._attn_implementation = "eager"
        inner = BertModel(cfg).eval()

        class Wrapped(nn.Module):  # plain tuple outputs, no ModelOutput dataclass
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                o = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
                return o.last_hidden_state, o.pooler_output

        model = Wrapped(inner).eval()
        mk = lambda b: (token_inputs(b, gen), bert_mask(b))
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["input_ids", "attention_mask"], \
            ["last_hidden_state", "pooler_output"], "torchscript", {}
    if name == "tv_mobilenet_v3_small":
        import torchvision
        gen = seeded(6)
        model = torchvision.models.mobilenet_v3_small(weights=None, width_mult=0.5, num_classes=10)
        # torchvision's init (Linear ~ N(0, 0.01), zero biases) leaves logits ~1e-5: use the
        # PyTorch default init instead, so that the outputs have a useful scale.
        for mod in model.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                mod.reset_parameters()
        warm_batchnorm(model, lambda: image_inputs(8, gen, 64))
        mk = lambda b: (image_inputs(b, gen, 64),)
        return model, mk(TRACE_BATCH), mk(REF_BATCH), ["x"], ["logits"], "torchscript", {}
    raise SystemExit(f"unknown model {name}")


ALL = ["mlp", "cnn", "gpt", "gpt_dynamo", "bert", "hf_bert_tiny", "tv_mobilenet_v3_small"]


def exporter_versions():
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "onnx": onnx.__version__,
         "numpy": np.__version__}
    for mod in ("onnxscript", "onnxruntime", "transformers", "torchvision"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--only", nargs="*", choices=ALL, help="models to (re)make; default all")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    manifest_path = os.path.join(a.out_dir, "manifest.json")
    manifest = {"models": {}}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    manifest["generated_by"] = "models/make_models.py"
    manifest["versions"] = exporter_versions()
    manifest["ref_batch"] = REF_BATCH

    failed = []
    for name in a.only or ALL:
        path = os.path.join(a.out_dir, name + ".onnx")
        ref_path = os.path.join(a.out_dir, name + ".ref.npz")
        try:
            model, trace_args, ref_args, in_names, out_names, exporter, kw = build(name, a.out_dir)
            model.eval()
            if exporter == "dynamo":
                export_dynamo(model, trace_args, path, in_names, out_names)
            else:
                export_torchscript(model, trace_args, path, in_names, out_names, **kw)
            g_in, g_out, opset, ops, m = graph_io(path)
            check_symbolic_batch(m, path)
            if g_in != in_names or g_out != out_names:
                raise SystemExit(f"{name}: graph io {g_in}->{g_out}, expected {in_names}->{out_names}")
            with torch.no_grad():
                outs = model(*ref_args)
            if isinstance(outs, torch.Tensor):
                outs = (outs,)
            arrays = {n: t.numpy() for n, t in zip(in_names, ref_args)}
            arrays.update({n: t.detach().numpy().astype(np.float32) for n, t in zip(out_names, outs)})
            np.savez(ref_path, **arrays)
            ort = ort_check(path, {n: arrays[n] for n in in_names}, arrays)
            size = os.path.getsize(path)
            manifest["models"][name] = {
                "onnx": name + ".onnx", "ref": name + ".ref.npz", "exporter": exporter,
                "opset": opset, "inputs": in_names, "outputs": out_names,
                "input_shapes": {n: list(arrays[n].shape) for n in in_names},
                "input_dtypes": {n: str(arrays[n].dtype) for n in in_names},
                "output_shapes": {n: list(arrays[n].shape) for n in out_names},
                "ops": ops, "onnx_bytes": size,
                "params": int(sum(p.numel() for p in model.parameters())),
                "onnxruntime_rel_err": ort,
            }
            print(f"{name:24s} {exporter:11s} opset {opset}  {size / 1024:7.1f} KiB  "
                  f"{len(ops):2d} op types  ort rel err {ort}")
            if size > 2 * 1024 * 1024:
                raise SystemExit(f"{name}: {size} bytes, over the 2 MiB budget")
        except Exception as e:  # keep going: report every model that cannot be made
            failed.append(name)
            print(f"{name:24s} FAILED: {type(e).__name__}: {e}", file=sys.stderr)

    manifest["models"] = dict(sorted(manifest["models"].items()))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    if failed:
        print("failed: " + " ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
