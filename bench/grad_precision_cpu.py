#!/usr/bin/env python3
"""Forge's bf16 precision recipe, gradient by gradient, on the CPU (issue #11's numerics).

The gpt_adamw fixture (2 layers, d 32, 4 heads) is compiled for cuda:sm_90 with and without
--precision bf16 (--expose-gradients) and run one step on the CPU executor, which honours the
bundle's dtypes (every tensor the GPU would store in bf16 is rounded to bf16 here too) with
exact kernels (attention in double). Its gradients and PyTorch's (fp32, and CPU autocast bf16
as the nearest stand-in for CUDA autocast) are set against PyTorch's float64 gradient of the
same batch; prints each kind's median error over the layers. No check: a diagnostic that
separates what Forge's recipe rounds (this script) from what the GPU's kernels add
(test_bf16_numerics' gradient half on the GPU).

    PYTHONPATH= python bench/grad_precision_cpu.py --bin-dir build/bin   (needs torch)

The same bundles on the GPU (whose machines lack forgec): `--compile-only --bundles DIR` here,
then `--bundles DIR --forge-train F --device cuda` there; `--device both` prints the CPU and
the GPU runs of one bundle side by side (the difference is the GPU's kernels alone).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "models"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "gpt_adamw")
B = 4


def main():
    import torch
    from make_models import GPT
    import test_bf16_numerics as numerics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--bundles", help="where the bundles are written (--compile-only) or read")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--forge-train", help="default: BIN_DIR/forge-train")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "both"])
    a = ap.parse_args()
    forge_train = a.forge_train or os.path.join(a.bin_dir, "forge-train")
    z = np.load(os.path.join(FIXTURE, "batches.npz"))
    params = np.load(os.path.join(FIXTURE, "init_params.npz"))
    ids, labels = z["input_ids"][:B], z["labels"][:B]

    def compile_(out, precision):
        bundle = os.path.join(out, f"{precision}.forge")
        cmd = [os.path.join(a.bin_dir, "forgec"), os.path.join(FIXTURE, "model.onnx"), "--target",
               "cuda:sm_90", "--batch", str(B), "--loss", "cross_entropy:logits,labels",
               "--optimizer", "adamw:lr=1e-3", "--expose-gradients", "-o", bundle]
        if precision != "fp32":
            cmd += ["--precision", precision]
        subprocess.run(cmd, check=True, capture_output=True)

    def forge(tmp, precision, device):
        bundle = os.path.join(a.bundles or tmp, f"{precision}.forge")
        if not a.bundles:
            compile_(tmp, precision)
        grads = os.path.join(tmp, f"{precision}_{device}_grads.npz")
        r = subprocess.run([forge_train, bundle, "--data", batch,
                            "--no-shuffle", "--steps", "1", "--device", device, "--dump-grads",
                            grads], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"forge-train failed: {r.stdout[-400:]}{r.stderr[-400:]}")
        with np.load(grads) as g:
            return {k: g[k].astype(np.float64) for k in g.files}

    def torch_grads(dtype, autocast):
        # make_models' GPT with the fixture's sizes; its qkv has a bias the fixture's lacks:
        # zero, and left out of the comparison.
        m = GPT(vocab=64, seq=16, d=32, heads=4, layers=2)
        r = m.load_state_dict({k: torch.from_numpy(params[k]) for k in params.files},
                              strict=False)
        if r.unexpected_keys or any("qkv.bias" not in k for k in r.missing_keys):
            sys.exit(f"the fixture's parameters do not fit the model: {r}")
        with torch.no_grad():
            for blk in m.blocks:
                blk.attn.qkv.bias.zero_()
        m = m.to(dtype).train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = m(torch.from_numpy(ids))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), torch.from_numpy(labels).reshape(-1))
        loss.backward()
        return {n: q.grad.double().numpy() for n, q in m.named_parameters() if n in params.files}

    if a.compile_only:
        if not a.bundles:
            ap.error("--compile-only needs --bundles DIR")
        os.makedirs(a.bundles, exist_ok=True)
        for precision in ("bf16", "fp32"):
            compile_(a.bundles, precision)
        print(f"compiled into {a.bundles}")
        return 0
    devices = ["cpu", "cuda"] if a.device == "both" else [a.device]
    with tempfile.TemporaryDirectory() as tmp:
        batch = os.path.join(tmp, "batch.npz")
        np.savez(batch, input_ids=ids, labels=labels)
        ref = torch_grads(torch.float64, False)
        runs = {}
        for device in devices:
            suffix = f" ({device})" if len(devices) > 1 else ""
            runs[f"Forge bf16{suffix}"] = forge(tmp, "bf16", device)
        runs["CPU autocast"] = torch_grads(torch.float32, True)
        for device in devices:
            suffix = f" ({device})" if len(devices) > 1 else ""
            runs[f"Forge fp32{suffix}"] = forge(tmp, "fp32", device)
        runs["PyTorch fp32"] = torch_grads(torch.float32, False)
    for label, grads in runs.items():
        if set(grads) != set(ref):
            sys.exit(f"{label}: parameters differ from PyTorch's: {sorted(set(grads) ^ set(ref))}")
    errs = {k: numerics.grad_errors(v, ref) for k, v in runs.items()}
    print(f"error relative to float64, median over the layers ({B} samples of the fixture):")
    width = max(15, max(len(k) for k in runs) + 1)
    print(f"  {'kind':22s}" + "".join(f"{k:>{width}s}" for k in runs))
    for kind in sorted({numerics.tensor_kind(n) for n in ref}):
        names = [n for n in ref if numerics.tensor_kind(n) == kind]
        print(f"  {kind:22s}" + "".join(
            f"{np.median([errs[k][0][n] for n in names]):{width}.3e}" for k in runs))
    print(f"  {'all parameters':22s}" + "".join(f"{errs[k][1]:{width}.3e}" for k in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
