#!/usr/bin/env python3
"""Exporters' masked attention on cuDNN: HF BERT, GPT-2 and LLaMA trained in bf16 (ctest-free GPU
check, suite gpu_masked_attention).

tests/models/ARCH.train.onnx (bert_cls, gpt2, llama: torch.onnx exports of HF models with an
attention_mask input; their attention is torch's SDPA decomposition with a boolean mask turned
additive and a NaN guard after the softmax) compiled for CUDA in bf16:
  forgec ARCH.train.onnx --target cuda:sm_90 --precision bf16 --batch 4 --loss ... --optimizer ...
forge-recognize-composites must fuse every layer's attention with the mask as its bias, and
forge-select-library must hand each to cuDNN (checked here, from the dump, when compiling).
On the GPU the bundle trains 10 steps on the manifest's batches on both devices (the CPU runs a
CUDA bundle's ops with its own kernels, exact f32 attention over the same bf16 tensors):
  losses  every step finite; |gpu - cpu| / |cpu| <= 1e-2 (cuDNN rounds P and dS to bf16);
          |gpu - torch| / |torch| <= 2e-2 against PyTorch's fp32 losses (tests/models/manifest.json)
Without --bundles both halves run here (ctest gpu_masked_attention). Apart (the GPU machines have
no forgec):
  test_masked_attention.py --compile-only --bundles DIR --forgec F     (here)
  test_masked_attention.py --bundles DIR --forge-train F               (on the GPU machine)
Prints one line per check and 'N passed, N failed'; exit 1 if anything failed; without a GPU the
run half prints SKIP and exits 77.
"""
import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import forge_e2e as e2e  # noqa: E402

MODELS_DIR = os.path.normpath(os.path.join(HERE, "..", "models"))
ARCHS = ("bert_cls", "gpt2", "llama")
GPU_CPU_TOL = 1e-2
TORCH_TOL = 2e-2
LAYERS = 2  # every tests/models transformer has two


def compile_arch(rep, arch, tr, forgec, out):
    bundle = os.path.join(out, f"{arch}.forge")
    with tempfile.TemporaryDirectory() as dump:
        rc, _, log = e2e.run([forgec, os.path.join(MODELS_DIR, tr["onnx"]), "--target", "cuda:sm_90",
                              "--precision", "bf16", "--batch", str(tr["batch"]), "--loss",
                              tr["loss"], "--optimizer", tr["optimizer"], "-o", bundle,
                              "--dump-dir", dump], 600)
        if not rep.check(f"{arch} forgec --precision bf16", rc == 0, e2e.failure(rc, log) if rc else ""):
            return
        final = sorted(f for f in os.listdir(dump) if f.endswith("-forge-plan-memory.mlir"))
        text = open(os.path.join(dump, final[-1])).read() if final else ""
    # attention(q, k, v, bias) and attention_grad(q, k, v, o, lse, do, bias), marked for cuDNN.
    fwd = [l for l in text.splitlines() if re.search(r"= forge\.attention ", l)]
    bwd = [l for l in text.splitlines() if re.search(r"= forge\.attention_grad ", l)]
    biased = lambda lines, n: [l for l in lines if 'forge.library = "cudnn"' in l and
                               len(l.split(" : (")[1].split(") ->")[0].split(", tensor")) == n]
    # Each layer's attention in @train_step and @eval, its gradient in @train_step.
    rep.check(f"{arch} fused masked attention", len(biased(fwd, 4)) == 2 * LAYERS and
              len(biased(bwd, 7)) == LAYERS,
              f"{len(biased(fwd, 4))}/{len(fwd)} attention and {len(biased(bwd, 7))}/{len(bwd)} "
              f"attention_grad with a bias on cuDNN (want {2 * LAYERS} and {LAYERS})")


def train(ft, bundle, data, device, steps, tmp, tag):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    rc, _, log = e2e.run([ft, bundle, "--data", data, "--no-shuffle", "--steps", str(steps),
                          "--threads", "1", "--device", device, "--metrics", metrics], 600)
    if rc != 0:
        return None, e2e.failure(rc, log)
    return e2e.metric_losses(metrics), ""


def run_arch(rep, arch, tr, ft, out, tmp):
    bundle = os.path.join(out, f"{arch}.forge")
    if not rep.check(f"{arch} bundle", os.path.exists(bundle), bundle):
        return
    data = os.path.join(MODELS_DIR, tr["data"])
    got = {}
    for device in ("cuda", "cpu"):
        losses, why = train(ft, bundle, data, device, tr["steps"], tmp, f"{arch}.{device}")
        if not rep.check(f"{arch} forge-train --device {device}", losses is not None, why):
            return
        got[device] = np.array(losses, dtype=np.float64)
    gpu, cpu, ref = got["cuda"], got["cpu"], np.array(tr["losses"], dtype=np.float64)
    rep.check(f"{arch} losses finite", bool(np.all(np.isfinite(gpu))), f"{gpu}")
    rel_cpu = float(np.max(np.abs(gpu - cpu) / np.abs(cpu)))
    rel_ref = float(np.max(np.abs(gpu - ref) / np.abs(ref)))
    rep.check(f"{arch} gpu vs cpu", rel_cpu <= GPU_CPU_TOL,
              f"max rel {rel_cpu:.2e} (<= {GPU_CPU_TOL:g}); losses {gpu[0]:.4f} -> {gpu[-1]:.4f}")
    rep.check(f"{arch} gpu vs torch fp32", rel_ref <= TORCH_TOL,
              f"max rel {rel_ref:.2e} (<= {TORCH_TOL:g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles")
    ap.add_argument("--compile-only", action="store_true")
    e2e.add_tool_args(ap)
    ap.add_argument("archs", nargs="*", default=list(ARCHS))
    a = ap.parse_args()
    training = json.load(open(os.path.join(MODELS_DIR, "manifest.json")))["training"]
    if a.compile_only and not a.bundles:
        ap.error("--compile-only needs --bundles DIR")
    if a.compile_only:  # forgec alone
        forgec, forge_train = a.forgec or e2e.find_tool("forgec", a.bin_dir), None
        if not forgec:
            print("test_masked_attention.py: need forgec (--forgec or --bin-dir)", file=sys.stderr)
            return 2
    else:
        tools = e2e.tools_for_halves(a, "test_masked_attention.py")
        if not tools:
            return 2
        forgec, forge_train = tools

    def compile_half(rep, bundles, tmp):
        os.makedirs(bundles, exist_ok=True)
        for arch in a.archs:
            compile_arch(rep, arch, training[arch], forgec, bundles)

    def run_half(rep, bundles, tmp):
        for arch in a.archs:
            run_arch(rep, arch, training[arch], forge_train, bundles, tmp)

    return e2e.halves_main(a, compile_half, run_half, skip="SKIP: no GPU (nvidia-smi -L failed)")


if __name__ == "__main__":
    sys.exit(main())
