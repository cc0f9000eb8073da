#!/usr/bin/env python3
"""Generate tests/models/: small real models as the PyTorch ONNX exporters write them.

What it makes (next to this script, or in --out-dir):
  NAME.onnx       one model through one exporter. Every architecture in ARCHS is exported
                  twice: NAME = ARCH_ts (TorchScript exporter, torch.onnx.export(dynamo=False),
                  opset 17, constant folding on, eval mode) and NAME = ARCH_dynamo
                  (torch.onnx.export(dynamo=True), its default opset and optimizer). Dim 0 of
                  every graph input/output is symbolic ("batch"); traced at batch 3.
  NAME.ref.npz    the reference at batch 2: the inputs (named like the graph inputs), the
                  ONNX Runtime outputs of NAME.onnx (named like the graph outputs) and
                  PyTorch's own outputs ("torch.<output>"). The test compares Forge with ONNX
                  Runtime; manifest.json records ORT vs PyTorch (the export's own error).
  ARCH.train.onnx, ARCH.batches.npz   for the training subset (TRAIN_ARCHS): the model
                  exported the way tools/gen_fixtures.py does it for training (TorchScript,
                  opset 17, training=TrainingMode.TRAINING, do_constant_folding=False, so the
                  initializers are the torch parameters, ties kept; dropout probability 0),
                  and TRAIN_STEPS fixed batches of TRAIN_BATCH stacked along dim 0 (inputs
                  and "labels"). PyTorch trains the same model in fp32 for TRAIN_STEPS SGD
                  steps on these batches in order; the per-step losses (before each update)
                  go to manifest.json, with the fp32-vs-fp64 PyTorch loss difference.
  manifest.json   per model: exporter, opset, inputs/outputs with shapes and dtypes, the
                  symbolic dims of the graph, op types, parameter count, file size,
                  ORT-vs-PyTorch error, the forgec --loss spec that training would use, and
                  (training subset) the training files, optimizer spec and losses.

Everything is random init built from config objects (nothing downloaded), seeded per
architecture, CPU-only, single-threaded and deterministic. A model whose ONNX file exceeds
MAX_ONNX_BYTES fails; the whole directory must stay under MAX_TOTAL_BYTES.

Run (needs torch, torchvision, transformers, onnx, onnxscript, onnxruntime; the tests
never need them):
  python tests/models/make_suite.py [--only ARCH ...] [--out-dir DIR]
"""
import argparse
import copy
import io
import json
import os
import re
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TS_OPSET = 17
REF_BATCH = 2
TRACE_BATCH = 3
VOCAB, SEQ = 128, 16
IMG = 32
TRAIN_BATCH, TRAIN_STEPS = 4, 10
SGD = {"lr": 0.1, "momentum": 0.9}
FORGE_SGD = f"sgd:lr={SGD['lr']!r},momentum={SGD['momentum']!r},nesterov=0,weight_decay=0.0"
MAX_ONNX_BYTES = 1024 * 1024
MAX_TOTAL_BYTES = 15 * 1024 * 1024


# --------------------------------------------------------------------------- plain torch models

class CNNBN(nn.Module):
    """2x (Conv3x3 no bias - BatchNorm - ReLU - MaxPool2) 3->8->16, global avg pool, Linear."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class LSTMClassifier(nn.Module):
    """Embedding(128, 32) -> nn.LSTM(32, 32, 1 layer, batch_first) -> last step -> Linear(32, 4)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=1, batch_first=True)
        self.fc = nn.Linear(32, 4)

    def forward(self, input_ids):
        y, _ = self.lstm(self.emb(input_ids))
        return self.fc(y[:, -1])


class Outputs(nn.Module):
    """A transformers model with plain tensor outputs (no ModelOutput, no cache). Called with
    (pixel_values) or (input_ids, attention_mask); explicit parameters, not *args, so that the
    dynamo exporter's dynamic_shapes match them one to one."""

    def __init__(self, m, fields):
        super().__init__()
        self.m, self.fields = m, fields

    def forward(self, x, attention_mask=None):
        kw = {} if attention_mask is None else {"attention_mask": attention_mask}
        o = self.m(x, return_dict=True, **kw)
        outs = tuple(getattr(o, f) for f in self.fields)
        return outs[0] if len(outs) == 1 else outs


# --------------------------------------------------------------------------- architectures

def small_resnet18():
    """torchvision's ResNet (BasicBlock, layers [2,2,2,2] = resnet18) at 1/8 width
    (8,16,32,64 channels): torchvision hard-codes 64..512, so its __init__ is re-done here with
    its own _make_layer/BasicBlock and forward."""
    from torchvision.models.resnet import ResNet, BasicBlock

    class SmallResNet(ResNet):
        def __init__(self, widths=(8, 16, 32, 64), num_classes=10):
            nn.Module.__init__(self)
            self._norm_layer = nn.BatchNorm2d
            self.inplanes, self.dilation, self.groups, self.base_width = widths[0], 1, 1, 64
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(BasicBlock, widths[0], 2)
            self.layer2 = self._make_layer(BasicBlock, widths[1], 2, stride=2)
            self.layer3 = self._make_layer(BasicBlock, widths[2], 2, stride=2)
            self.layer4 = self._make_layer(BasicBlock, widths[3], 2, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[3], num_classes)

    return SmallResNet()


def hf(cls_name, cfg_name, fields, **cfg):
    import transformers
    config = getattr(transformers, cfg_name)(**cfg)
    model = getattr(transformers, cls_name)(config)
    return Outputs(model, fields)


def image(b, gen):
    return (torch.randn(b, 3, IMG, IMG, generator=gen),)


def image16(b, gen):
    return (torch.randn(b, 3, 16, 16, generator=gen),)


def tokens(b, gen):
    return (torch.randint(0, VOCAB, (b, SEQ), generator=gen, dtype=torch.int64),)


def pad_mask(b):
    m = torch.ones(b, SEQ, dtype=torch.int64)
    for i in range(1, b):  # row 0 unpadded, row i has its last 4*i tokens padded
        m[i, SEQ - min(4 * i, SEQ - 1):] = 0
    return m


def tokens_mask(b, gen):
    return tokens(b, gen) + (pad_mask(b),)


NO_DROPOUT_BERT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# ARCH -> (seed, builder, inputs(batch, gen), input names, output names, forgec --loss,
#          source). The loss spec is what a training compile uses (cross_entropy: int64
#          class labels on the last axis of the output; mse: a float target like the output).
ARCHS = {
    "cnn_bn": (21, CNNBN, image16, ["x"], ["logits"], "cross_entropy:logits,labels", "torch.nn"),
    "resnet18": (22, small_resnet18, image, ["x"], ["logits"], "cross_entropy:logits,labels",
                 "torchvision ResNet(BasicBlock,[2,2,2,2]) at 1/8 width"),
    "mobilenet_v3_small": (
        23, lambda: __import__("torchvision").models.mobilenet_v3_small(
            weights=None, width_mult=0.25, num_classes=10, dropout=0.0),
        image, ["x"], ["logits"], "cross_entropy:logits,labels",
        "torchvision mobilenet_v3_small(width_mult=0.25)"),
    "efficientnet_b0": (24, lambda: tiny_efficientnet(), image, ["x"], ["logits"],
                        "cross_entropy:logits,labels",
                        "torchvision EfficientNet with efficientnet_b0's config at width 0.25, depth 0.25"),
    "convnext": (25, lambda: tiny_convnext(), image, ["x"], ["logits"],
                 "cross_entropy:logits,labels",
                 "torchvision ConvNeXt, 3 stages 16/32/64 channels, 1 block each"),
    "vit": (26, lambda: hf("ViTForImageClassification", "ViTConfig", ["logits"], image_size=IMG,
                           patch_size=8, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128, num_labels=10,
                           **NO_DROPOUT_BERT),
            image, ["pixel_values"], ["logits"], "cross_entropy:logits,labels",
            "transformers ViTForImageClassification"),
    "bert_cls": (27, lambda: hf("BertForSequenceClassification", "BertConfig", ["logits"],
                                vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=128,
                                max_position_embeddings=SEQ, num_labels=2, classifier_dropout=0.0,
                                **NO_DROPOUT_BERT),
                 tokens_mask, ["input_ids", "attention_mask"], ["logits"],
                 "cross_entropy:logits,labels", "transformers BertForSequenceClassification"),
    "distilbert_cls": (28, lambda: hf("DistilBertForSequenceClassification", "DistilBertConfig",
                                      ["logits"], vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                                      hidden_dim=128, max_position_embeddings=SEQ, num_labels=3,
                                      dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0),
                       tokens_mask, ["input_ids", "attention_mask"], ["logits"],
                       "cross_entropy:logits,labels",
                       "transformers DistilBertForSequenceClassification"),
    "gpt2": (29, lambda: hf("GPT2LMHeadModel", "GPT2Config", ["logits"], vocab_size=VOCAB,
                            n_positions=SEQ, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False),
             tokens_mask, ["input_ids", "attention_mask"], ["logits"],
             "cross_entropy:logits,labels", "transformers GPT2LMHeadModel (head tied to wte)"),
    "llama": (30, lambda: hf("LlamaForCausalLM", "LlamaConfig", ["logits"], vocab_size=VOCAB,
                             hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, attention_dropout=0.0, use_cache=False,
                             tie_word_embeddings=False),
              tokens_mask, ["input_ids", "attention_mask"], ["logits"],
              "cross_entropy:logits,labels", "transformers LlamaForCausalLM (RMSNorm, rotary, SiLU-gated MLP, GQA 4q/2kv heads)"),
    "t5_encoder": (31, lambda: hf("T5EncoderModel", "T5Config", ["last_hidden_state"],
                                  vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                  num_heads=4, relative_attention_num_buckets=8,
                                  dropout_rate=0.0, use_cache=False),
                   tokens_mask, ["input_ids", "attention_mask"], ["last_hidden_state"],
                   "mse:last_hidden_state,target",
                   "transformers T5EncoderModel (relative position buckets, T5LayerNorm)"),
    "lstm": (32, LSTMClassifier, tokens, ["input_ids"], ["logits"], "cross_entropy:logits,labels",
             "torch.nn LSTM classifier"),
}


def tiny_efficientnet():
    from torchvision.models import efficientnet
    setting, last = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25,
                                                    depth_mult=0.25)
    return efficientnet.EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0,
                                     num_classes=10, last_channel=last)


def tiny_convnext():
    from torchvision.models.convnext import ConvNeXt, CNBlockConfig
    cfg = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)]
    return ConvNeXt(cfg, stochastic_depth_prob=0.0, layer_scale=0.5, num_classes=10)


# --------------------------------------------------------------------------- training data

def train_data(arch, gen, n):
    """(inputs tuple, int64 labels) for n samples of the training subset."""
    if arch == "cnn_bn":
        x = torch.randn(n, 3, 16, 16, generator=gen)
        teacher = torch.randn(12, 10, generator=gen)
        return (x,), (F.adaptive_avg_pool2d(x, 2).flatten(1) @ teacher).argmax(dim=1)
    if arch in ("gpt2", "llama"):  # next token of t_{i+1} = (t_i + s) mod VOCAB
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        stride = torch.randint(1, 5, (n, 1), generator=gen)
        seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
        return (seq[:, :-1].contiguous(), torch.ones(n, SEQ, dtype=torch.int64)), \
            seq[:, 1:].contiguous()
    if arch == "bert_cls":
        ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
        mask = torch.ones(n, SEQ, dtype=torch.int64)
        mask[1::2, SEQ - 5:] = 0
        return (ids, mask), (ids[:, 0] >= VOCAB // 2).to(torch.int64)
    if arch == "lstm":
        ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
        return (ids,), ids[:, -1] % 4
    raise KeyError(arch)


TRAIN_ARCHS = ["cnn_bn", "bert_cls", "gpt2", "llama", "lstm"]


def loss_fn(out, labels):
    """Forge's cross_entropy:logits,labels: classes on the last axis, mean over the rest."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


def torch_train(model, xs, ys, dtype):
    model = copy.deepcopy(model).to(dtype).train()
    opt = torch.optim.SGD(model.parameters(), lr=SGD["lr"], momentum=SGD["momentum"],
                          foreach=False)
    losses = []
    for k in range(TRAIN_STEPS):
        sl = slice(k * TRAIN_BATCH, (k + 1) * TRAIN_BATCH)
        args = tuple(x[sl].to(dtype) if x.is_floating_point() else x[sl] for x in xs)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(*args), ys[sl])
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


# --------------------------------------------------------------------------- export

def export_ts(model, args, in_names, out_names, training=False):
    f = io.BytesIO()
    kw = {}
    if training:
        kw = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    else:  # the default eval-mode export (BatchNormalization folded into the Conv)
        kw = dict(do_constant_folding=True)
    dyn = {n: {0: "batch"} for n in in_names + out_names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False, opset_version=TS_OPSET,
                          input_names=in_names, output_names=out_names, dynamic_axes=dyn, **kw)
    return f.getvalue()


def export_dynamo(model, args, in_names, out_names):
    batch = torch.export.Dim("batch", min=1, max=1024)
    dyn = tuple({0: batch} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, args, None, dynamo=True, input_names=in_names,
                                 output_names=out_names, dynamic_shapes=dyn,
                                 external_data=False, verbose=False)
    return prog.model_proto.SerializeToString()


def graph_info(data):
    m = onnx.load_from_string(data)
    onnx.checker.check_model(m)
    inits = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]

    def sym(vis):
        out = {}
        for vi in vis:
            d = {str(k): dim.dim_param for k, dim in enumerate(vi.type.tensor_type.shape.dim)
                 if dim.dim_param}
            if d:
                out[vi.name] = d
        return out

    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    ops = set()

    def walk(g):
        for n in g.node:
            ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(m.graph)
    return {"inputs": [i.name for i in ins], "outputs": [o.name for o in m.graph.output],
            "symbolic_dims": {**sym(ins), **sym(m.graph.output)}, "opset": opset,
            "ops": sorted(ops), "initializers": len(inits)}


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


def ort_run(data, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def describe(e):
    """'Type: first line' of an exception and of its root cause."""
    def one(x):
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(x)).strip()  # the exporter's colours
        return f"{type(x).__name__}: {text.splitlines()[0][:240] if text else ''}"
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    return one(e) if root is e else f"{one(e)} <- {one(root)}"


def warm_batchnorm(model, make_input, steps=3):
    """Non-trivial BN affine parameters and running statistics (not 1/0, 0/1), so that a BN
    dropped or mis-folded shows in the outputs."""
    has_bn = False
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                has_bn = True
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0.0, 0.1)
    if has_bn:
        model.train()
        with torch.no_grad():
            for _ in range(steps):
                model(*make_input())
    model.eval()


def make_arch(arch, out_dir, manifest):
    seed, builder, mk, in_names, out_names, loss, source = ARCHS[arch]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    model = builder()
    if arch in ("mobilenet_v3_small", "efficientnet_b0"):
        # torchvision's classifier init (N(0, 0.01), zero bias) leaves logits ~1e-3: use the
        # PyTorch default init for Conv/Linear so that the outputs have a useful scale.
        for mod in model.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                mod.reset_parameters()
    warm_batchnorm(model, lambda: mk(8, gen))
    model.eval()
    trace_args = mk(TRACE_BATCH, gen)
    ref_args = mk(REF_BATCH, gen)
    with torch.no_grad():
        touts = model(*ref_args)
    touts = (touts,) if isinstance(touts, torch.Tensor) else tuple(touts)
    feeds = {n: t.numpy() for n, t in zip(in_names, ref_args)}
    nparams = int(sum(p.numel() for p in model.parameters()))
    results = []
    for exporter in ("ts", "dynamo"):
        name = f"{arch}_{exporter}"
        try:
            if exporter == "ts":
                if arch == "cnn_bn":  # BN kept as BatchNormalization(training_mode=0)
                    f = io.BytesIO()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        torch.onnx.export(model, trace_args, f, dynamo=False,
                                          opset_version=TS_OPSET, input_names=in_names,
                                          output_names=out_names,
                                          dynamic_axes={n: {0: "batch"} for n in in_names + out_names},
                                          training=torch.onnx.TrainingMode.PRESERVE)
                    data = f.getvalue()
                else:
                    data = export_ts(model, trace_args, in_names, out_names)
            else:
                data = export_dynamo(model, trace_args, in_names, out_names)
            model.eval()
            info = graph_info(data)
            if info["inputs"] != in_names or info["outputs"] != out_names:
                raise RuntimeError(f"graph io {info['inputs']} -> {info['outputs']}, expected "
                                   f"{in_names} -> {out_names}")
            if len(data) > MAX_ONNX_BYTES:
                raise RuntimeError(f"{len(data)} bytes > {MAX_ONNX_BYTES}")
            ort_outs = ort_run(data, feeds)
            arrays = dict(feeds)
            arrays.update({n: np.asarray(ort_outs[n], dtype=np.float32) for n in out_names})
            arrays.update({f"torch.{n}": t.detach().numpy().astype(np.float32)
                           for n, t in zip(out_names, touts)})
            with open(os.path.join(out_dir, name + ".onnx"), "wb") as fh:
                fh.write(data)
            np.savez(os.path.join(out_dir, name + ".ref.npz"), **arrays)
            entry = {
                "arch": arch, "source": source,
                "exporter": "torchscript" if exporter == "ts" else "dynamo",
                "export": ("torch.onnx.export(dynamo=False, opset_version=17, do_constant_folding=True"
                           + (", training=PRESERVE" if arch == "cnn_bn" else "") + ")"
                           if exporter == "ts" else
                           "torch.onnx.export(dynamo=True, default opset and optimize)"),
                "onnx": name + ".onnx", "ref": name + ".ref.npz", "onnx_bytes": len(data),
                **info,
                "input_shapes": {n: list(feeds[n].shape) for n in in_names},
                "input_dtypes": {n: str(feeds[n].dtype) for n in in_names},
                "output_shapes": {n: list(arrays[n].shape) for n in out_names},
                "params": nparams,
                "ref_batch": REF_BATCH, "traced_at_batch": TRACE_BATCH,
                "onnxruntime_vs_torch_rel": {n: rel(arrays[n], arrays[f"torch.{n}"])
                                             for n in out_names},
                "loss": loss,
            }

            manifest["models"][name] = entry
            results.append(name)
            print(f"{name:26s} opset {info['opset']:2d} {len(data) / 1024:7.1f} KiB "
                  f"{len(info['ops']):2d} ops  ort-vs-torch "
                  f"{max(entry['onnxruntime_vs_torch_rel'].values()):.1e}", flush=True)
        except Exception as e:  # report every model that cannot be made, keep going
            msg = describe(e)
            manifest["models"].pop(name, None)
            manifest["export_failures"][name] = msg
            print(f"{name:26s} EXPORT FAILED: {msg}", file=sys.stderr, flush=True)

    if arch in TRAIN_ARCHS:
        try:
            make_training(arch, model, in_names, out_names, loss, out_dir, manifest, seed)
        except Exception as e:
            msg = describe(e)
            manifest["training"].pop(arch, None)
            manifest["export_failures"][arch + ".train"] = msg
            print(f"{arch + '.train':26s} EXPORT FAILED: {msg}", file=sys.stderr, flush=True)
    return results


def make_training(arch, model, in_names, out_names, loss, out_dir, manifest, seed):
    gen = torch.Generator().manual_seed(seed + 2000)
    xs, ys = train_data(arch, gen, TRAIN_BATCH * TRAIN_STEPS)
    trace = train_data(arch, torch.Generator().manual_seed(seed + 3000), TRAIN_BATCH + 1)[0]
    data = export_ts(copy.deepcopy(model).train(), trace, in_names, out_names, training=True)
    info = graph_info(data)
    if len(data) > MAX_ONNX_BYTES:
        raise RuntimeError(f"{len(data)} bytes > {MAX_ONNX_BYTES}")
    # the torch run starts from exactly the ONNX initializers (BN running stats may have been
    # moved by the training-mode trace; they do not affect the losses)
    losses32 = torch_train(model, xs, ys, torch.float32)
    losses64 = torch_train(model, xs, ys, torch.float64)
    ort_note = None
    try:
        o = ort_run(data, {n: x[:TRAIN_BATCH].numpy() for n, x in zip(in_names, xs)})
        m = copy.deepcopy(model).train()
        with torch.no_grad():
            t = m(*(x[:TRAIN_BATCH] for x in xs))
        ort_note = rel(o[out_names[0]], t.numpy())
    except Exception as e:
        ort_note = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    with open(os.path.join(out_dir, arch + ".train.onnx"), "wb") as fh:
        fh.write(data)
    batches = {n: x.numpy() for n, x in zip(in_names, xs)}
    batches["labels"] = ys.numpy()
    np.savez(os.path.join(out_dir, arch + ".batches.npz"), **batches)
    manifest["training"][arch] = {
        "onnx": arch + ".train.onnx", "data": arch + ".batches.npz",
        "export": "torch.onnx.export(dynamo=False, opset_version=17, "
                  "training=TrainingMode.TRAINING, do_constant_folding=False); dropout p=0",
        "onnx_bytes": len(data), **info,
        "batch": TRAIN_BATCH, "steps": TRAIN_STEPS, "loss": loss,
        "optimizer": FORGE_SGD,
        "optimizer_torch": f"torch.optim.SGD(lr={SGD['lr']}, momentum={SGD['momentum']}, "
                           "dampening=0, nesterov=False, weight_decay=0, foreach=False)",
        "data_layout": f"stacked along dim 0: step k (1-based) uses rows "
                       f"[(k-1)*{TRAIN_BATCH}, k*{TRAIN_BATCH}), in order",
        "losses": losses32,
        "losses_note": "PyTorch fp32, loss of step k on batch k before update k",
        "fp32_vs_fp64_losses_rel_max": max(abs(a - b) / abs(b) for a, b in zip(losses32, losses64)),
        "onnxruntime_vs_torch_train_forward_rel": ort_note,
    }
    print(f"{arch + '.train':26s} {len(data) / 1024:7.1f} KiB  loss {losses32[0]:.4f} -> "
          f"{losses32[-1]:.4f}  fp64 {manifest['training'][arch]['fp32_vs_fp64_losses_rel_max']:.1e}"
          f"  ort {ort_note}", flush=True)


def versions():
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "onnx": onnx.__version__,
         "numpy": np.__version__}
    for mod in ("onnxscript", "onnxruntime", "transformers", "torchvision"):
        v[mod] = __import__(mod).__version__
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=HERE)
    ap.add_argument("--only", nargs="*", choices=list(ARCHS), help="architectures (default all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    path = os.path.join(a.out_dir, "manifest.json")
    manifest = {"models": {}, "training": {}, "export_failures": {}}
    if a.only and os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
    manifest.update({"generated_by": "tests/models/make_suite.py", "versions": versions(),
                     "ref_batch": REF_BATCH})
    for arch in a.only or list(ARCHS):
        for e in ("_ts", "_dynamo", ".train"):
            manifest["export_failures"].pop(arch + e, None)
        make_arch(arch, a.out_dir, manifest)
    for k in ("models", "training", "export_failures"):
        manifest[k] = dict(sorted(manifest[k].items()))
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out_dir, f)) for f in os.listdir(a.out_dir))
    print(f"total {total / 1024 / 1024:.2f} MiB; export failures: "
          f"{sorted(manifest['export_failures']) or 'none'}")
    if total > MAX_TOTAL_BYTES:
        print(f"over the {MAX_TOTAL_BYTES} byte budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
