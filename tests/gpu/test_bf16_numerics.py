#!/usr/bin/env python3
"""bf16 numerics on GPT-2 124M (issue #11): Forge's bf16 trajectory against its fp32 one, and
against the gap PyTorch's autocast leaves to PyTorch's fp32, on a fixed stream of real text.

Two halves (the GPU machines have no forgec; both need PyTorch and onnx):
  here:  test_bf16_numerics.py --compile-only --bundles DIR --forgec F
         exports GPT-2 124M (bench/bench_train.py's model with GPT-2's initialization: normal
         std 0.02, residual projections 0.02 / sqrt(2 x 12), zero biases; seeded) as a thin
         ONNX into DIR/export and compiles the four bundles
  there: test_bf16_numerics.py --bundles DIR --forge-train F [--steps 200] [--samples 5]
         exports the same weights again (seeded; forgec recorded their CRC), builds the text
         stream, and trains from those weights on the same batches:
           Forge fp32 (no TF32); Forge --precision bf16, once with --attention-backward
           deterministic and --samples times with the default fast (atomic dq) backward;
           PyTorch fp32 (no TF32); PyTorch autocast bf16, once with written-out attention and
           --samples times with F.scaled_dot_product_attention (flash attention: bf16 P and
           dS, as Forge's cuDNN)
         then a few batches' gradients at weights PyTorch trained in fp32 (fp32_grads.forge and
         bf16_grads.forge: --expose-gradients, compiled without the weights file so that they
         load those weights) against PyTorch's fp32, autocast and float64 ones,
         and exits 77 (skipped) without a GPU.
The text: this repository's own prose and code as of commit TEXT_COMMIT (README.md; docs/,
compiler/, passes/, runtime/, tools/, bench/, models/: .md, .td, .cpp, .h, .py; ~2.4 MB), read
with `git show` by the compile half into DIR/text.bin, so that every run trains on the same
bytes whatever the tree has become (the working tree's text changed with every commit, and
runs of different sessions were not comparable). Sorted by path, as bytes: token ids 0-255 of
GPT-2's vocabulary, a byte-level language model on real text (the stream cycles after ~2.3k
samples; 200 steps take 3.2k). Sample i is the 1024 bytes from offset i * 1024 (cycling), its
labels the next bytes.
AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, no weight decay (Forge and PyTorch then agree on
what decays), global gradient norm clipped to 1, batch 16, constant rate.
Why samples. A bf16 run's distance from fp32 is mostly chaos: each step's rounding perturbs
the trajectory, and where it goes depends on every bit of arithmetic order. Two runs of one
arithmetic that differ only in the order of cuDNN's atomic dq additions (Forge's
--attention-backward fast; PyTorch's flash attention backward does the same) land 0.18% to
0.39% from fp32 in their mean window gap (RESULTS, thirtieth session), while Forge's
deterministic bundles and autocast sat within 0.05% of each other. A per-window comparison of
single runs at a +0.1% margin therefore reported which side the dice favoured, so the check
compares the two distributions instead: each run's gap is the mean over the windows of
|bf16 - fp32| / fp32, and the runs of each side are its samples.
Checks on 20-step window means of the loss, steps 21-200 (9 windows):
  fp32_agrees     Forge fp32 within 1% of PyTorch fp32 in every window (the runs are comparable)
  bf16_within_1pc every Forge bf16 run within 1% of Forge fp32 in every window
  samples_differ  the --attention-backward fast runs and the SDPA runs are samples: no two of
                  one side have the same losses (else the test below would count one run twice)
  not_worse       Forge bf16 is not further from fp32 than PyTorch autocast: the one-sided exact
                  rank test (Mann-Whitney U over every relabelling of the pooled runs) of the
                  Forge runs' gaps against autocast's (written-out attention and SDPA runs)
                  rejects "Forge no worse" only at p < 0.01. Each side pools its variants of
                  one precision recipe (Forge: the bundle as compiled and the fast backward;
                  autocast: written-out and SDPA attention), taken as exchangeable draws. It
                  detects a systematic loss of precision (a 2x larger gap fails ~97% of the
                  time at 6 runs a side, by simulation with the observed spread), not a
                  difference inside the spread (a 20% larger gap passes most of the time);
                  fewer than 5 runs a side cannot reach p < 0.01, and the check says so (FAIL).
  grads_named     (the gradient half, chaos-free) Forge's --dump-grads names every parameter
                  PyTorch has, and no other
  grads_fp32_agree at weights PyTorch trained GRAD_AT fp32 steps, --grad-batches batches: Forge
                  fp32's distance from float64 (PyTorch, the same weights and batch) is at most
                  twice PyTorch fp32's, over all parameters
  grads_closer    Forge bf16's distance from float64 is at most autocast's (the better of
                  written-out and SDPA) over all parameters, and in every kind of parameter
                  (qkv weight, ln1 bias, ...: the median over the layers) too. Each side is set
                  against float64, not its own fp32: the norms' and biases' gradients are sums
                  with heavy cancellation, where two fp32 implementations differ by ~2e-3
Prints one line per check, the window table of the deterministic runs, each run's gap, the
medians, the issue's literal per-window comparison of the single deterministic runs (printed
only), and 'N passed, N failed'; writes DIR/numerics.json.
`--self-test` checks the rank test alone (no GPU, no PyTorch; ctest numerics_rank_test).
Printed only, not checked: --variant LABEL=BUNDLE[+forge-train option or NAME=value...] runs
another bf16 bundle, option or environment (e.g. bf16.forge+--attention-backward=deterministic,
or bf16.forge+FORGE_MATMUL_LIBRARY=cublaslt) beside the same runs; --reuse FILE takes the fp32
runs and the written-out autocast run from an earlier numerics.json on this GPU kind.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_train  # noqa: E402
import forge_e2e as e2e  # noqa: E402
from forge_e2e import Report  # noqa: E402

B, T = 16, 1024
LR, BETAS, EPS = 3e-4, (0.9, 0.95), 1e-8
WINDOW, FIRST = 20, 20
SKIP_EXIT = 77
ALPHA = 0.01  # not_worse's significance level
GRAD_AT = 100  # grads_closer's weights: PyTorch fp32 after this many steps


CLIP = 1.0


def gpt2_model():
    """GPT-2 124M with GPT-2's initialization (seeded): logits start near uniform (loss ~10.8)
    instead of the default init's ~460, which sends every run into a different chaotic path."""
    import math
    import torch
    model = bench_train.build("gpt2")
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "ln" in name:
                p.fill_(1.0)
            elif name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                p.normal_(0.0, 0.02 / math.sqrt(2 * 12))
            else:
                p.normal_(0.0, 0.02)
    return model


def export(d, model=None):
    """The thin ONNX (model.onnx + model.weights) of model (default gpt2_model()) into d: the
    float initializers in model.weights, the rest (the causal mask, positions) in the graph,
    so that a bundle compiled without the weights file (no CRC: the gradient bundles) loads
    any weights of this layout."""
    import onnx
    from onnx import external_data_helper as ext
    import torch
    os.makedirs(d, exist_ok=True)
    model = (model or gpt2_model()).cpu().train()
    path, weights = os.path.join(d, "model.onnx"), os.path.join(d, "model.weights")
    torch.onnx.export(model, (torch.randint(0, 256, (2, T)),), path, input_names=["ids"],
                      output_names=["logits"], dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                      dynamic_axes={"ids": {0: "batch"}, "logits": {0: "batch"}})
    if os.path.exists(weights):
        os.remove(weights)
    proto = onnx.load(path)
    ext.convert_model_to_external_data(proto, all_tensors_to_one_file=True,
                                       location="model.weights", size_threshold=1024)
    for t in proto.graph.initializer:
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                               onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE):
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    onnx.save_model(proto, path)
    return path


def compile_half(a, rep):
    os.makedirs(a.bundles, exist_ok=True)
    nbytes, nfiles = write_text(os.path.join(a.bundles, "text.bin"))
    rep.check("text", nbytes > 1 << 20, f"{nbytes} bytes from {nfiles} files at {TEXT_COMMIT}")
    onnx_path = export(os.path.join(a.bundles, "export"))
    for name, extra in (("fp32", []), ("bf16", ["--precision", "bf16"])):
        cmd = [a.forgec, onnx_path, "--target", "cuda:sm_90", "--weights", "external", "--batch",
               str(B), "--loss", "cross_entropy:logits,labels", "--optimizer",
               f"adamw:lr={LR},beta1={BETAS[0]},beta2={BETAS[1]},eps={EPS},weight_decay=0",
               "--clip-grad-norm", str(CLIP), "-o", os.path.join(a.bundles, f"{name}.forge")] + extra
        rc, _, out = e2e.run(cmd, 600)
        rep.check(f"compile {name}", rc == 0, e2e.failure(rc, out) if rc else "")
    # The gradient bundles: --expose-gradients, compiled while the weights file is away, so
    # that they record no CRC and load the weights PyTorch trained there (grads_closer).
    weights = os.path.join(a.bundles, "export", "model.weights")
    os.rename(weights, weights + ".away")
    try:
        for name, extra in (("fp32", []), ("bf16", ["--precision", "bf16"])):
            cmd = [a.forgec, onnx_path, "--target", "cuda:sm_90", "--weights", "external",
                   "--batch", str(B), "--loss", "cross_entropy:logits,labels", "--optimizer",
                   f"adamw:lr={LR}", "--expose-gradients",
                   "-o", os.path.join(a.bundles, f"{name}_grads.forge")] + extra
            rc, _, out = e2e.run(cmd, 600)
            rep.check(f"compile {name}_grads", rc == 0, e2e.failure(rc, out) if rc else "")
    finally:
        os.rename(weights + ".away", weights)


# The tree whose text the model trains on (the seventh session's end).
TEXT_COMMIT = "cc8a4f0"
TEXT_TOPS = ("README.md", "docs/", "compiler/", "passes/", "runtime/", "tools/", "bench/",
             "models/")


def write_text(path):
    """The text at TEXT_COMMIT, from git (the compile half runs in a clone)."""
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "-r", "--name-only", TEXT_COMMIT],
                           check=True, capture_output=True, text=True).stdout.split()
    files = sorted(n for n in names if (n == "README.md" or n.startswith(TEXT_TOPS[1:]))
                   and n.endswith((".md", ".td", ".cpp", ".h", ".py")))
    data = b"".join(subprocess.run(["git", "-C", ROOT, "show", f"{TEXT_COMMIT}:{n}"], check=True,
                                   capture_output=True).stdout for n in files)
    with open(path, "wb") as f:
        f.write(data)
    return len(data), len(files)


def text_stream(bundles):
    path = os.path.join(bundles, "text.bin")
    if not os.path.isfile(path):
        sys.exit(f"{path} is missing: the compile half (--compile-only) writes it")
    data = open(path, "rb").read()
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64), TEXT_COMMIT


def make_data(path, steps, bundles):
    text, nfiles = text_stream(bundles)
    n = steps * B
    starts = (np.arange(n) * T) % (len(text) - T - 1)
    idx = starts[:, None] + np.arange(T + 1)[None, :]
    seq = text[idx]
    np.savez(path, ids=seq[:, :T], labels=seq[:, 1:])
    return len(text), nfiles


def forge_losses(a, bundle, data, weights, steps, tmp, extra=(), env=None):
    metrics = os.path.join(tmp, os.path.basename(bundle) + ".jsonl")  # forge-train truncates it
    cmd = bench_train.env_prefix(env or {}) + [
        a.forge_train, bundle, "--data", data, "--no-shuffle", "--steps", str(steps), "--device",
        "cuda", "--weights", weights, "--metrics", metrics, "--log-every", str(steps)] + list(extra)
    rc, _, out = e2e.run(cmd, 1800)
    if rc != 0:
        raise RuntimeError(e2e.failure(rc, out, 8))
    return e2e.metric_losses(metrics)


def torch_run(data, steps, autocast=False, sdpa=False):
    """gpt2_model() (seeded: the exported weights) trained `steps` AdamW steps (no TF32) on
    the batches of data, autocast bf16 or fp32, with PyTorch's flash attention (sdpa, as
    Forge's cuDNN) or written out: (the model, its losses)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = gpt2_model().cuda().train()
    for m in model.modules():
        if hasattr(m, "sdpa"):
            m.sdpa = sdpa
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    d = np.load(data)
    ids, labels = torch.from_numpy(d["ids"]).cuda(), torch.from_numpy(d["labels"]).cuda()
    loss_fn = torch.nn.CrossEntropyLoss()
    out = []
    for s in range(steps):
        x, y = ids[s * B:(s + 1) * B], labels[s * B:(s + 1) * B]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(x).reshape(-1, 50257), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        out.append(float(loss.detach()))
    del opt
    torch.cuda.empty_cache()  # forge-train runs share the GPU
    return model, out


def torch_losses(data, steps, autocast, sdpa=False):
    import torch
    model, out = torch_run(data, steps, autocast, sdpa)
    del model
    torch.cuda.empty_cache()
    return out


def windows(losses):
    v = np.asarray(losses, dtype=np.float64)
    return [float(v[i:i + WINDOW].mean()) for i in range(FIRST, len(v) - WINDOW + 1, WINDOW)]


def torch_train(data, steps):
    """gpt2_model() after `steps` fp32 steps: the weights at which grads_closer compares
    gradients (a trained model's, not the init's)."""
    return torch_run(data, steps)[0]


def torch_grads(model, ids, labels, autocast, sdpa, parts=1):
    """Every parameter's gradient (float64 numpy, by name) of one batch's mean loss, and the
    loss; parts > 1 runs the batch in that many equal slices and averages (float64's
    written-out attention would not fit at once)."""
    import torch
    for m in model.modules():
        if hasattr(m, "sdpa"):
            m.sdpa = sdpa
    model.zero_grad(set_to_none=True)
    n, total = ids.shape[0] // parts, 0.0
    for i in range(parts):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids[i * n:(i + 1) * n])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50257),
                                                     labels[i * n:(i + 1) * n].reshape(-1))
        (loss / parts).backward()
        total += loss.detach().item() / parts
        del logits, loss
    grads = {n: p.grad.double().cpu().numpy() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads, total


def grad_errors(got, ref):
    """Per tensor ||got - ref|| / ||ref||, and over all tensors at once."""
    per = {n: float(np.linalg.norm(got[n] - ref[n]) / max(np.linalg.norm(ref[n]), 1e-30))
           for n in ref}
    total = float(np.sqrt(sum(np.sum((got[n] - ref[n]) ** 2) for n in ref)
                          / sum(np.sum(ref[n] ** 2) for n in ref)))
    return per, total


def tensor_kind(name):
    """The kind a parameter's errors are summarized by (blocks.N. dropped)."""
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blocks" else name


def batch_grads(a, model, tmp, wdir, ids, labels):
    """One batch's gradients and losses: Forge's fp32 and bf16 gradient bundles (and
    --grads-variant ones) through --dump-grads, PyTorch fp32, autocast, autocast + SDPA and
    float64 (model returns to float32 after)."""
    import torch
    batch = os.path.join(tmp, "grad_batch.npz")
    np.savez(batch, ids=ids, labels=labels)
    grads, losses = {}, {}
    runs = [(f"forge_{n}", f"{n}_grads.forge") for n in ("fp32", "bf16")] + [
        (f"variant_{label}", bundle) for label, bundle in a.grads_variants]
    for name, spec in runs:
        bundle, extra, env = bench_train.split_runtime_options(spec)
        out = os.path.join(tmp, f"grads_{name}.npz")
        cmd = bench_train.env_prefix(env) + [
            a.forge_train, os.path.join(a.bundles, bundle), "--data", batch, "--no-shuffle",
            "--steps", "1", "--device", "cuda", "--weights", wdir, "--dump-grads", out,
            "--metrics", out + ".jsonl"] + extra
        rc, _, log = e2e.run(cmd, 600)
        if rc != 0:
            raise RuntimeError(e2e.failure(rc, log, 8))
        losses[name] = e2e.metric_losses(out + ".jsonl")[0]
        with np.load(out) as z:
            grads[name] = {k: z[k].astype(np.float64) for k in z.files}
    tids, tlabels = torch.from_numpy(ids).cuda(), torch.from_numpy(labels).cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, autocast, sdpa in (("torch_fp32", False, False), ("torch_autocast", True, False),
                                 ("torch_autocast_sdpa", True, True)):
        grads[name], losses[name] = torch_grads(model, tids, tlabels, autocast, sdpa)
    model.double()
    grads["f64"], losses["f64"] = torch_grads(model, tids, tlabels, False, False, parts=4)
    model.float()
    torch.cuda.empty_cache()
    return grads, losses


def grad_check(a, rep, tmp, data):
    """grads_fp32_agree / grads_closer: the gradients of --grad-batches batches at weights
    trained GRAD_AT fp32 steps, each run's against float64 (PyTorch, the same weights and
    batch). No trajectory, so no chaos: this measures what the precision assignment keeps.
    Each side is set against the float64 gradient, not against its own fp32 run: the norms'
    and biases' gradients are sums with heavy cancellation, where two fp32 implementations
    differ by ~2e-3 (RESULTS, thirty-first session), as much as bf16 rounding adds. Several
    batches: one batch's error in a small sum is one draw of its rounding."""
    model = torch_train(data, GRAD_AT)
    wdir = os.path.join(tmp, "trained")
    export(wdir, model)
    model = model.cuda()
    d = np.load(data)
    cols = [("forge_bf16", "Forge bf16"), ("torch_autocast", "autocast"),
            ("torch_autocast_sdpa", "+SDPA"), ("forge_fp32", "Forge fp32"),
            ("torch_fp32", "PyTorch fp32")] + [
        (f"variant_{label}", label) for label, _ in a.grads_variants]
    per = {k: [] for k, _ in cols}    # per batch: tensor -> error
    total = {k: [] for k, _ in cols}  # per batch: the error over all tensors
    ldev = {k: [] for k, _ in cols}   # per batch: the loss's relative deviation
    thirds = {k: {"q": [], "v": []} for k, _ in cols}
    for b in range(a.grad_batches):
        sl = slice((GRAD_AT + b) * B, (GRAD_AT + b + 1) * B)
        grads, losses = batch_grads(a, model, tmp, wdir, d["ids"][sl], d["labels"][sl])
        ref = grads["f64"]
        if b == 0:
            missing = sorted({n for k, _ in cols for n in set(ref) ^ set(grads[k])})
            rep.check("grads_named", not missing,
                      f"parameters in some runs only: {missing}" if missing else
                      f"{len(ref)} parameters' gradients in every run")
            if missing:
                return None
            names = list(ref)
        for k, _ in cols:
            p, t = grad_errors(grads[k], ref)
            per[k].append(p)
            total[k].append(t)
            ldev[k].append(abs(losses[k] - losses["f64"]) / losses["f64"])
            for part, third in (("q", 0), ("v", 2)):  # k's true gradient is 0: no ratio
                errs = []
                for n in names:
                    if tensor_kind(n) == "attn.qkv.bias":
                        c = ref[n].shape[0] // 3
                        r = ref[n][third * c:(third + 1) * c]
                        g = grads[k][n][third * c:(third + 1) * c]
                        errs.append(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
                thirds[k][part].append(float(np.median(errs)))
        del grads
    nb = a.grad_batches
    print(f"the batches' loss against float64 (the forward's deviation, mean of {nb}): "
          + ", ".join(f"{label} {np.mean(ldev[k]):.2e}" for k, label in cols))
    print(f"gradients of {nb} batch(es) at step {GRAD_AT} (weights PyTorch trained in fp32), "
          f"error relative to float64's, median over the layers and batches per kind:")
    print("  kind                    " + "".join(f"{label:>14s}" for _, label in cols))
    kinds = sorted({tensor_kind(n) for n in names})
    med = {}
    for kind in kinds:
        ns = [n for n in names if tensor_kind(n) == kind]
        med[kind] = {k: float(np.median([e[n] for e in per[k] for n in ns])) for k, _ in cols}
        print(f"  {kind:24s}" + "".join(f"{med[kind][k]:14.3e}" for k, _ in cols))
    mean_total = {k: float(np.mean(total[k])) for k, _ in cols}
    print(f"  {'all parameters (mean)':24s}" + "".join(f"{mean_total[k]:14.3e}" for k, _ in cols))
    for part in ("q", "v"):  # printed only
        print(f"  {'attn.qkv.bias, ' + part + ' third':24s}" + "".join(
            f"{np.median(thirds[k][part]):14.3e}" for k, _ in cols))
    for kind in ("ln1.bias", "mlp.0.bias"):  # printed only: by layer, median over batches
        ns = sorted((n for n in names if tensor_kind(n) == kind),
                    key=lambda n: int(n.split(".")[1]))
        for k, label in cols[:3]:
            print(f"  {kind} by layer, {label}: "
                  + " ".join(f"{np.median([e[n] for e in per[k]]):.2e}" for n in ns))
    fp32_worst = max(mean_total["forge_fp32"], mean_total["torch_fp32"])
    rep.check("grads_fp32_agree", mean_total["forge_fp32"] <= 2 * mean_total["torch_fp32"] + 1e-6,
              f"Forge fp32 {mean_total['forge_fp32']:.2e} vs PyTorch fp32 "
              f"{mean_total['torch_fp32']:.2e} from float64 over all gradients (Forge's <= 2x "
              f"PyTorch's)")
    mine = mean_total["forge_bf16"]
    best = min(mean_total["torch_autocast"], mean_total["torch_autocast_sdpa"])
    worse = [kind for kind in kinds if med[kind]["forge_bf16"]
             > min(med[kind]["torch_autocast"], med[kind]["torch_autocast_sdpa"])]
    rep.check("grads_closer", mine <= best and not worse,
              f"Forge bf16 {mine:.3e} vs autocast's better {best:.3e} from float64 over all "
              f"gradients (fp32's: {fp32_worst:.1e}); kinds where Forge's median error is above "
              f"the better autocast's: {worse or 'none'}")
    return {"loss_deviation": ldev, "totals": total, "medians_by_kind": med}


def rank_test(xs, ys):
    """One-sided exact Mann-Whitney test that xs are larger than ys: U counts the pairs
    (x, y) with x > y (ties one half); p is the share of the C(n+m, n) ways of labelling n of
    the pooled values 'x' whose U is at least the observed one."""
    from itertools import combinations
    pooled = list(xs) + list(ys)
    n = len(xs)

    def u(idx):
        chosen = set(idx)
        a = [pooled[i] for i in idx]
        b = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        return sum((x > y) + 0.5 * (x == y) for x in a for y in b)

    observed = u(range(n))
    labellings = list(combinations(range(len(pooled)), n))
    return observed, sum(u(c) >= observed for c in labellings) / len(labellings)


def self_test(rep):
    """The rank test on cases whose answers are known by hand."""
    u, p = rank_test([3.0, 4.0], [1.0, 2.0])  # every x above every y: 1 of C(4,2) = 6
    rep.check("rank_all_above", u == 4 and abs(p - 1 / 6) < 1e-12, f"U {u}, p {p:.4f}")
    u, p = rank_test([1.0, 2.0], [3.0, 4.0])  # every x below: every labelling has U >= 0
    rep.check("rank_all_below", u == 0 and p == 1.0, f"U {u}, p {p:.4f}")
    u, p = rank_test([1.0, 4.0], [2.0, 3.0])  # U = 2 of 4; labellings with U >= 2: 4 of 6
    rep.check("rank_interleaved", u == 2 and abs(p - 4 / 6) < 1e-12, f"U {u}, p {p:.4f}")
    u, p = rank_test([2.0, 2.0], [2.0, 2.0])  # ties count one half: always U = 2
    rep.check("rank_ties", u == 2 and p == 1.0, f"U {u}, p {p:.4f}")
    xs = [0.50, 0.52, 0.55, 0.58, 0.60, 0.61]  # a 2x larger gap, six runs a side
    ys = [0.22, 0.25, 0.26, 0.28, 0.30, 0.36]
    u, p = rank_test(xs, ys)
    rep.check("rank_detects_2x", u == 36 and p < ALPHA, f"U {u}, p {p:.5f} (< {ALPHA})")
    xs = [0.24, 0.27, 0.29, 0.31, 0.33, 0.40]  # the thirtieth session's spread
    u, p = rank_test(xs, ys)
    rep.check("rank_spread_passes", p >= ALPHA, f"U {u}, p {p:.4f} (>= {ALPHA})")


def run_half(a, rep):
    if not e2e.gpu_present():
        print("SKIP: no GPU (nvidia-smi -L failed)")
        return False
    grads = not a.skip_grads and a.steps >= GRAD_AT + a.grad_batches
    missing = [b for b in ("fp32_grads.forge", "bf16_grads.forge")
               if grads and not os.path.isfile(os.path.join(a.bundles, b))]
    if missing:  # a compile half from before the gradient half
        sys.exit(f"{a.bundles}: no {', '.join(missing)} (the compile half makes them; "
                 "--skip-grads runs the trajectories alone)")
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "export")
        if not a.grads_only:  # the gradient half exports the weights it trains
            export(weights)
        data = os.path.join(tmp, "text.npz")
        nbytes, commit = make_data(data, a.steps, a.bundles)
        print(f"text: {nbytes} bytes (the tree at {commit}); {a.steps} steps of "
              f"{B} x {T} tokens", flush=True)
        if a.grads_only:
            result = grad_check(a, rep, tmp, data)
            with open(os.path.join(a.bundles, "numerics.json"), "w") as f:
                json.dump({"gradients": result}, f, indent=1)
            return True
        runs = {}
        if a.reuse:  # the fp32 and PyTorch runs of an earlier run's numerics.json
            with open(a.reuse) as f:
                old = json.load(f)["runs"]
            runs = {k: v[:a.steps] for k, v in old.items()
                    if k in ("forge_fp32", "torch_fp32", "torch_autocast")}
            if any(len(v) < a.steps for v in runs.values()):
                sys.exit(f"{a.reuse}: its runs have fewer than --steps {a.steps} steps")
            print(f"reused from {a.reuse}: {', '.join(runs)}", flush=True)
        fast = ["--attention-backward", "fast"]
        forge_runs = [("forge_fp32", "fp32", [])] + [
            ("forge_bf16", "bf16", ["--attention-backward", "deterministic"])] + [
            (f"forge_bf16_fast{i}", "bf16", fast) for i in range(1, a.samples + 1)]
        for name, bundle, extra in forge_runs:
            if name in runs:
                continue
            runs[name] = forge_losses(a, os.path.join(a.bundles, f"{bundle}.forge"), data,
                                      weights, a.steps, tmp, extra)
            print(f"{name}: last loss {runs[name][-1]:.4f}", flush=True)
        torch_runs = [("torch_fp32", False, False), ("torch_autocast", True, False)] + [
            (f"torch_autocast_sdpa{i}", True, True) for i in range(1, a.samples + 1)]
        for name, autocast, sdpa in torch_runs:
            if name in runs:
                continue
            runs[name] = torch_losses(data, a.steps, autocast, sdpa)
            print(f"{name}: last loss {runs[name][-1]:.4f}", flush=True)
        # Printed only: other bf16 bundles or forge-train options, each beside the same runs.
        for label, spec in a.variants:
            bundle, extra, env = bench_train.split_runtime_options(spec)
            runs[f"variant_{label}"] = forge_losses(a, os.path.join(a.bundles, bundle), data,
                                                    weights, a.steps, tmp, extra, env)
            print(f"variant {label}: last loss {runs[f'variant_{label}'][-1]:.4f}", flush=True)
        grad_result = None
        if not grads:
            print(f"gradients not compared (--skip-grads, or --steps < {GRAD_AT} + "
                  f"--grad-batches)")
        else:
            grad_result = grad_check(a, rep, tmp, data)
    w = {k: windows(v) for k, v in runs.items()}
    rel = lambda x, y: [abs(p - q) / abs(q) for p, q in zip(x, y)]  # noqa: E731
    agree = rel(w["forge_fp32"], w["torch_fp32"])
    gaps = {k: rel(v, w["torch_fp32" if k.startswith("torch_") else "forge_fp32"])
            for k, v in w.items() if k not in ("forge_fp32", "torch_fp32")}
    forge_gap, torch_gap = gaps["forge_bf16"], gaps["torch_autocast"]
    print("window  forge_fp32  forge_bf16  torch_fp32  autocast   forge gap  autocast gap"
          "  autocast+SDPA gap (first run)")
    for i in range(len(forge_gap)):
        lo = FIRST + i * WINDOW + 1
        print(f"{lo:3d}-{lo + WINDOW - 1:3d} {w['forge_fp32'][i]:10.4f} {w['forge_bf16'][i]:11.4f} "
              f"{w['torch_fp32'][i]:11.4f} {w['torch_autocast'][i]:9.4f}   {forge_gap[i]:9.2%} "
              f"{torch_gap[i]:12.2%} {gaps['torch_autocast_sdpa1'][i]:18.2%}")
    for label, _ in a.variants:
        gap = gaps[f"variant_{label}"]
        print(f"variant {label}: gap to Forge fp32 by window "
              + " ".join(f"{g:.2%}" for g in gap) + f"; mean {np.mean(gap):.3%} (printed only)")
    forge_keys = ["forge_bf16"] + [f"forge_bf16_fast{i}" for i in range(1, a.samples + 1)]
    torch_keys = ["torch_autocast"] + [f"torch_autocast_sdpa{i}" for i in range(1, a.samples + 1)]
    fmean = [float(np.mean(gaps[k])) for k in forge_keys]
    tmean = [float(np.mean(gaps[k])) for k in torch_keys]
    print("mean gap over the windows, each run: Forge bf16 "
          + ", ".join(f"{g:.3%}" for g in fmean) + " (the first deterministic, then fast); "
          "autocast " + ", ".join(f"{g:.3%}" for g in tmean) + " (written-out, then SDPA)")
    print(f"medians: Forge {np.median(fmean):.3%}, autocast {np.median(tmean):.3%}")
    # The literal per-window form on the single deterministic runs (printed only: it
    # compares two draws whose own spread is larger than its 0.1% margin).
    literal = sum(f > t + 1e-3 for f, t in zip(forge_gap, torch_gap))
    print(f"per window, Forge bf16 above autocast + 0.1% (single runs, printed only): "
          f"{literal} of {len(forge_gap)}")
    n = len(forge_gap)
    rep.check("fp32_agrees", n > 0 and max(agree) <= 0.01,
              f"Forge fp32 vs PyTorch fp32: max window rel {max(agree):.2%} (<= 1%)")
    worst = max(max(gaps[k]) for k in forge_keys)
    rep.check("bf16_within_1pc", n > 0 and worst <= 0.01,
              f"Forge bf16, {len(forge_keys)} runs vs fp32: max window rel {worst:.2%} (<= 1%)")
    same = [(x, y) for side in (forge_keys[1:], torch_keys[1:])
            for i, x in enumerate(side) for y in side[i + 1:] if runs[x] == runs[y]]
    rep.check("samples_differ", not same,
              f"identical runs: {same}" if same else
              f"{a.samples} fast runs and {a.samples} SDPA runs, all different")
    u, p = rank_test(fmean, tmean)
    # The smallest p the runs can give: below ALPHA only from 5 runs a side (--samples 4).
    floor = 1 / math.comb(len(fmean) + len(tmean), len(fmean))
    rep.check("not_worse", n > 0 and p >= ALPHA and floor < ALPHA,
              f"Forge's gaps above autocast's in U = {u:g} of {len(fmean) * len(tmean)} pairs; "
              f"one-sided p = {p:.4f} (fails below {ALPHA})" if floor < ALPHA else
              f"undecided: {len(fmean)} runs a side cannot give p < {ALPHA} (smallest "
              f"{floor:.3f}); --samples 4 or more")
    with open(os.path.join(a.bundles, "numerics.json"), "w") as f:
        json.dump({"runs": runs, "windows": w, "gaps": gaps, "forge_mean_gaps": fmean,
                   "autocast_mean_gaps": tmean, "rank_u": u, "rank_p": p,
                   "fp32_agreement": agree, "gradients": grad_result}, f, indent=1)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundles")
    ap.add_argument("--samples", type=int, default=5,
                    help="Forge --attention-backward fast runs and PyTorch SDPA runs, each a "
                         "sample of its side's spread (1-7)")
    ap.add_argument("--grads-variant", action="append", default=[],
                    help="LABEL=BUNDLE[+forge-train option...]: another bf16 bundle compiled "
                         "like bf16_grads.forge "
                         "(--expose-gradients, no weights file); its gradient errors printed "
                         "beside the checked ones (not checked)")
    ap.add_argument("--grad-batches", type=int, default=4,
                    help="batches whose gradients grads_closer compares (1-16)")
    ap.add_argument("--grads-only", action="store_true",
                    help="only the gradient half (no trajectories)")
    ap.add_argument("--skip-grads", action="store_true",
                    help="leave out grads_fp32_agree and grads_closer (bundles of an older "
                         "compile half, without the *_grads.forge bundles)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the rank test on known cases and exit (no GPU needed)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--forgec")
    ap.add_argument("--forge-train", default="forge-train")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reuse", help="numerics.json of an earlier run on this GPU kind: its Forge "
                    "fp32, PyTorch fp32 and written-out autocast losses stand in for new runs (a "
                    "quicker look at bf16 variants; the SDPA runs are new)")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=BUNDLE[+forge-train option or NAME=value...]: another bf16 "
                         "run, its gaps "
                         "printed beside the checked ones (not checked)")
    a = ap.parse_args()
    a.variants = [tuple(v.split("=", 1)) for v in a.variant]  # (label, bundle[+options])
    a.grads_variants = [tuple(v.split("=", 1)) for v in a.grads_variant]
    glabels = [v[0] for v in a.grads_variants]
    if any(len(v) != 2 for v in a.grads_variants) or len(set(glabels)) != len(glabels):
        ap.error("--grads-variant takes LABEL=BUNDLE[+option...], each LABEL once")
    labels = [v[0] for v in a.variants]
    if any(len(v) != 2 for v in a.variants) or len(set(labels)) != len(labels):
        ap.error("--variant takes LABEL=BUNDLE[+option...], each LABEL once")
    rep = Report()
    if a.self_test:
        self_test(rep)
        return rep.summary()
    if not a.bundles:
        ap.error("--bundles is needed")
    if not 1 <= a.samples <= 7:
        ap.error("--samples takes 1 to 7")
    if not 1 <= a.grad_batches <= 16:
        ap.error("--grad-batches takes 1 to 16")
    if a.grads_only and not a.compile_only and (a.skip_grads or a.steps < GRAD_AT + a.grad_batches):
        ap.error(f"--grads-only needs the gradients (no --skip-grads, --steps >= {GRAD_AT} + "
                 "--grad-batches)")
    if a.compile_only:
        if not a.forgec:
            ap.error("--compile-only needs --forgec")
        compile_half(a, rep)
    elif not run_half(a, rep):
        return SKIP_EXIT
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
