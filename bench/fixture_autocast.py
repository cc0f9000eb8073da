#!/usr/bin/env python3
"""PyTorch's own bf16 on the gpt fixture: how far autocast lands from the fp32 parameters.

tests/e2e/test_precision.py (and tests/gpu's gpu_precision) require Forge's bf16 parameters after
the gpt fixture's 20 AdamW steps to lie within 3e-2 (relative L2 norm, per parameter) of
PyTorch's fp32 ones (params_step20.npz). This script measures what PyTorch itself reaches on
the same fixture, same initial weights (init_params.npz), same batches and optimizer, under
`torch.autocast(bfloat16)` with fp32 master weights, for each attention form:

  explicit  the fixture model's own code: scores, masked_fill, softmax, @ v (bf16 matmuls)
  flash     F.scaled_dot_product_attention(is_causal=True) on the flash backend
  cudnn     the same on cuDNN's fused attention (what Forge runs)
  efficient the same on the memory-efficient backend

Prints, per form, the losses' max relative gap and the parameters' worst relative error (and
blocks.0.ln1.bias's, the parameter Forge's bf16 run misses the 3e-2 bound on). GPU only.

Usage: fixture_autocast.py [--fixture tests/fixtures/gpt_adamw] [--json OUT]
"""
import argparse
import json
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import gen_fixtures as fx  # noqa: E402  the fixture's model, as it was generated

DEVICE = "cuda"


def sdpa_forward(form):
    """CausalSelfAttention.forward of tools/gen_fixtures.py with its masked softmax replaced
    by F.scaled_dot_product_attention on the `form` backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[form]

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, fx.HEADS, c // fx.HEADS).transpose(1, 2) for z in (q, k, v))
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
    return forward


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(form, fixture, manifest):
    torch.manual_seed(0)
    model = fx.GPT()
    if form != "explicit":
        for blk in model.blocks:
            blk.attn.forward = types.MethodType(sdpa_forward(form), blk.attn)
    model = model.to(DEVICE)
    init = np.load(os.path.join(fixture, "init_params.npz"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[n]))
    h = manifest["optimizer_hparams"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=h["lr"],
                            betas=(h["beta1"], h["beta2"]), eps=h["eps"])
    data = np.load(os.path.join(fixture, "batches.npz"))
    xs = torch.from_numpy(data["input_ids"]).to(DEVICE)
    ys = torch.from_numpy(data["labels"]).to(DEVICE)
    batch, losses = manifest["batch_size"], []
    for k in range(manifest["steps"]):
        x, y = xs[k * batch:(k + 1) * batch], ys[k * batch:(k + 1) * batch]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, fx.VOCAB), y.reshape(-1))
        loss.backward()
        if k == 0:
            grads1 = {n: p.grad.detach().float().cpu().numpy() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
    ref_losses = np.load(os.path.join(fixture, "losses.npy"))
    ref = np.load(os.path.join(fixture, "params_step20.npz"))
    errs = {n: rel(p.detach().cpu().numpy(), ref[n]) for n, p in model.named_parameters()}
    worst = max(errs, key=errs.get)
    return {"losses_max_rel": float(np.max(np.abs(np.array(losses) - ref_losses) /
                                           np.abs(ref_losses))),
            "params_worst": worst, "params_worst_rel": errs[worst],
            "ln1_bias_rel": errs["blocks.0.ln1.bias"], "params_rel": errs, "grads1": grads1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default=os.path.join(HERE, "..", "tests", "fixtures", "gpt_adamw"))
    ap.add_argument("--json")
    ap.add_argument("--cpu", action="store_true", help="CPU autocast (to try the script)")
    ap.add_argument("--grads-dir", help="write each form's step-1 gradients there (npz)")
    a = ap.parse_args()
    global DEVICE
    DEVICE = "cpu" if a.cpu else "cuda"
    if not torch.cuda.is_available() and not a.cpu:
        print("no GPU")
        return 77
    manifest = json.load(open(os.path.join(a.fixture, "manifest.json")))
    out = {"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "forms": {}}
    for form in ("explicit", "flash", "cudnn", "efficient"):
        try:
            r = run(form, a.fixture, manifest)
        except RuntimeError as e:  # a backend that does not take this shape
            print(f"{form:9s}: not run ({str(e).splitlines()[0][:100]})")
            continue
        if a.grads_dir:  # step 1's gradients, for comparing with forge-train --dump-grads
            np.savez(os.path.join(a.grads_dir, f"grads1_{form}.npz"), **r.pop("grads1"))
        else:
            r.pop("grads1")
        out["forms"][form] = r
        print(f"{form:9s}: losses max rel {r['losses_max_rel']:.2e} | params worst "
              f"{r['params_worst_rel']:.2e} ({r['params_worst']}) | blocks.0.ln1.bias "
              f"{r['ln1_bias_rel']:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
