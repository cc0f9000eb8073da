#!/usr/bin/env python3
"""Training-step benchmark: Forge vs PyTorch eager vs torch.compile on one GPU, one run.

For each model: the PyTorch module (seeded) is exported to ONNX with its initial weights,
compiled by forgec for cuda:sm_90, and trained from the same weights on the same batches with
the same optimizer (AdamW, lr 1e-3, weight decay 0.01) by forge-train and by PyTorch (eager and
torch.compile), fp32 with TF32 off (--tf32: on for both). Reported: the median step time over
--steps steps after --warmup steps, samples/s, and the first --check losses of Forge against
eager PyTorch (relative error); GPU memory; Forge's profiled step by kind (GEMM, attention,
generated kernels, copies) and, for GPT-2, each side's MFU (6 N + 12 L d T FLOPs a token
against the GPU's dense peak for the precision: trace_summary.dense_peak).

forgec needs MLIR, which the GPU machines lack, so the stages can run on different machines:
  bench_train.py export  --dir D [--models ...]      # PyTorch: model.onnx (+ model.weights)
  bench_train.py compile --dir D --forgec F          # Forge: D/<model>/model.forge
  bench_train.py run     --dir D --forge-train F     # GPU: times all three, writes D/results.json
  bench_train.py profile --dir D [--models ...]      # GPU: PyTorch's top kernels per step
`all` runs the three in order (a machine with PyTorch, forgec and a GPU). GPT-2 and ResNet-50
are exported with their weights in an external-data file (model.weights) and compiled as thin
bundles (forgec --weights external): only the small graph and bundle travel, and `export` on
the GPU machine writes the same weights again (same PyTorch, same seed).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

MODELS = {
    # name: (batch, input shape without batch (tokens: (T,)), classes / vocabulary, batches)
    "mlp": (256, (784,), 10, 40),
    "gpt2": (16, (1024,), 50257, 4),          # GPT-2 124M: 12 layers, 12 heads, d 768
    "resnet50": (128, (3, 224, 224), 1000, 2),
    # MobileNetV2 (depthwise separable convolutions, ReLU6): issue #12's depthwise-class model.
    "mobilenet_v2": (128, (3, 224, 224), 1000, 2),
}
THIN = {"gpt2", "resnet50", "mobilenet_v2"}
CONV_NETS = {"resnet50", "mobilenet_v2"}


def gpt2():
    """GPT-2 124M (12 layers, 12 heads, d 768, T 1024; pre-LN, learned positions, tanh-GELU,
    head tied to the token embedding): models/make_models.py's GPT at GPT-2 size."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
    from make_models import GPT
    return GPT(vocab=50257, **GPT2)


GPT2 = {"seq": 1024, "d": 768, "heads": 12, "layers": 12}


LR, WD, BETAS, EPS = 1e-3, 0.01, (0.9, 0.999), 1e-8


def build(name):
    import torch
    torch.manual_seed(0)
    if name == "mlp":  # MLP 784-1024-1024-10
        return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10))
    if name == "gpt2":
        return gpt2()
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50(weights=None)
    if name == "mobilenet_v2":
        import torchvision
        return torchvision.models.mobilenet_v2(weights=None)
    raise ValueError(name)


def input_name(name):
    return "ids" if name == "gpt2" else "x"


def export(a):
    import onnx
    import torch
    for name in a.models:
        batch, shape, classes, _ = MODELS[name]
        d = os.path.join(a.dir, name)
        os.makedirs(d, exist_ok=True)
        model = build(name)
        model.train()
        if name == "gpt2":
            x = torch.randint(0, classes, (2,) + shape)
        else:
            x = torch.randn((2,) + shape)
        path = os.path.join(d, "model.onnx")
        # Training mode kept: BatchNormalization stays (not folded into the convolutions).
        torch.onnx.export(model, (x,), path, input_names=[input_name(name)],
                          output_names=["logits"], dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                          dynamic_axes={input_name(name): {0: "batch"}, "logits": {0: "batch"}})
        if name in THIN:  # the weights in model.weights, the graph alone in model.onnx
            m = onnx.load(path)
            # Some PyTorch versions already write external data next to the model; onnx
            # appends to an existing file, so start it afresh (offsets must start at 0 on
            # every machine that exports).
            weights = os.path.join(d, "model.weights")
            if os.path.exists(weights):
                os.remove(weights)
            onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="model.weights", size_threshold=1024)
        print(f"exported {name} to {d}")


def make_data(a, name, d):
    """`batches` distinct batches, seeded, made where they are used (they need not travel);
    both sides cycle through them in file order."""
    path = os.path.join(d, "data.npz")
    batch, shape, classes, batches = MODELS[name]
    n = batch * batches
    if os.path.exists(path) and len(np.load(path)["labels"]) == n:
        return
    rng = np.random.default_rng(0)
    if name == "gpt2":
        ids = rng.integers(0, classes, size=(n,) + shape)
        np.savez(path, ids=ids.astype(np.int64),
                 labels=np.roll(ids, -1, axis=1).astype(np.int64))
    else:
        np.savez(path, x=rng.standard_normal((n,) + shape).astype(np.float32),
                 labels=rng.integers(0, classes, size=n).astype(np.int64))


def compile_(a):
    for name in a.models:
        batch = MODELS[name][0]
        d = os.path.join(a.dir, name)
        cmd = [a.forgec, os.path.join(d, "model.onnx"), "--target", "cuda:sm_90",
               "--weights", "external" if name in THIN else "embedded",
               "--batch", str(batch), "--loss", "cross_entropy:logits,labels",
               "--optimizer", f"adamw:lr={LR},beta1={BETAS[0]},beta2={BETAS[1]},eps={EPS},"
                              f"weight_decay={WD}", "-o", os.path.join(d, "model.forge")]
        if a.tf32:
            cmd.append("--tf32")
        if a.precision != "fp32":
            cmd += ["--precision", a.precision]
        subprocess.run(cmd, check=True)
        print(f"compiled {name}")


ENV_RE = re.compile(r"[A-Z_][A-Z0-9_]*=")


def split_runtime_options(spec):
    """'model.forge+--attention-backward=fast+FORGE_MATMUL_LIBRARY=cublaslt' ->
    ('model.forge', ['--attention-backward=fast'], {'FORGE_MATMUL_LIBRARY': 'cublaslt'}):
    after '+' signs that precede a dash, forge-train options; after those that precede an
    upper-case NAME=, its environment (a '+' in a path stays)."""
    bundle, *extra = re.split(r"\+(?=-|[A-Z_][A-Z0-9_]*=)", spec)
    env = dict(e.split("=", 1) for e in extra if ENV_RE.match(e))
    return bundle, [e for e in extra if not ENV_RE.match(e)], env


def env_prefix(env):
    """`env` as a command prefix (env NAME=value ...), for runners that take no environment."""
    return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []


def time_forge(a, name, d, bundle="model.forge", profile=True):
    """Median step time of D/<bundle> (with --profile: its trace, steps 3-7 left out).
    `bundle` may carry forge-train options after '+' signs (`ab`'s runtime variants:
    model.forge+--attention-backward=fast); --forge-train-arg options apply to every run."""
    bundle, extra, env = split_runtime_options(bundle)
    tag = "".join(c if c.isalnum() else "_"
                  for c in "".join(extra) + "".join(f"{k}{v}" for k, v in env.items()))
    metrics = os.path.join(d, (bundle.replace(".forge", tag + ".jsonl")
                               if bundle != "model.forge" or tag else "forge.jsonl"))
    steps = a.warmup + a.steps
    cmd = [a.forge_train, os.path.join(d, bundle), "--data", os.path.join(d, "data.npz"),
           "--no-shuffle", "--steps", str(steps), "--device", "cuda", "--metrics", metrics,
           "--log-every", str(steps)]
    if profile:
        cmd += ["--profile", os.path.join(d, "forge_trace.json")]
    if name in THIN:
        cmd += ["--weights", d]
    cmd += a.forge_train_arg + extra
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    recs = [json.loads(line) for line in open(metrics)]
    t = [r["time_s"] for r in recs]
    dts = [t[i] - t[i - 1] for i in range(a.warmup, len(t))]
    # --profile times steps 3..7 instruction by instruction (slower): leave them out.
    dts = [dt for i, dt in enumerate(dts, start=a.warmup + 1) if not (profile and 3 <= i <= 7)]
    return statistics.median(dts), [r["loss"] for r in recs], out.stdout + out.stderr


PLAN_RE = re.compile(r"\(plan ([0-9.]+) (GiB|MiB)\)")


def forge_device_bytes(log):
    """What forge-train allocated on the GPU (its progress line's "plan": the arena,
    parameters, optimizer state and library workspace, one cudaMalloc), or None. The
    counterpart of PyTorch's max_memory_allocated (tensors only, not the CUDA context)."""
    m = PLAN_RE.findall(log)
    if not m:
        return None
    value, unit = m[-1]
    return float(value) * (1 << 30 if unit == "GiB" else 1 << 20)


def torch_step(a, name, d, compiled, sdpa=False):
    """PyTorch's training step for `name` (seeded model, AdamW) and its data on the GPU;
    sdpa: GPT-2's attention as F.scaled_dot_product_attention (flash attention, what a
    PyTorch user writes) instead of the written-out softmax the ONNX export holds."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    classes = MODELS[name][2]
    model = build(name).cuda().train()
    for m in model.modules():
        if hasattr(m, "sdpa"):
            m.sdpa = sdpa
    # bf16: autocast and the fused AdamW, what PyTorch users run (fp32 masters either way).
    bf16 = a.precision in ("bf16", "fp8")  # fp8: PyTorch's baseline is bf16
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                            fused=bf16)
    data = np.load(os.path.join(d, "data.npz"))
    x = torch.from_numpy(data[input_name(name)]).cuda()
    y = torch.from_numpy(data["labels"]).cuda()
    # On tensor cores a conv net runs channels-last, as PyTorch recommends for AMP (and as
    # forgec's --layout auto does).
    if name in CONV_NETS and (bf16 or a.tf32):
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(xb).reshape(-1, classes), yb.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return (torch.compile(step) if compiled else step), x, y


def time_torch(a, name, d, compiled, sdpa=False):
    import torch
    batch, _, _, batches = MODELS[name]
    # One `step` code object serves every model: without a reset, dynamo's recompile
    # limit can leave a later model running eagerly under torch.compile (ResNet-50 after
    # GPT-2 timed as eager, 62 ms, against 38 compiled on its own).
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    fn, x, y = torch_step(a, name, d, compiled, sdpa)
    torch.cuda.reset_peak_memory_stats()
    losses, dts = [], []
    for i in range(a.warmup + a.steps):
        j = i % batches
        xb, yb = x[j * batch:(j + 1) * batch], y[j * batch:(j + 1) * batch]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = fn(xb, yb)
        losses.append(float(loss.detach()))  # the read-back synchronizes, as forge-train's does
        dts.append(time.perf_counter() - t0)
    return statistics.median(dts[a.warmup:]), losses, torch.cuda.max_memory_allocated()


def profile(a):
    """PyTorch's side of a profile: torch.compile's (and eager's; GPT-2 also compiled with
    F.scaled_dot_product_attention) top CUDA kernels per step,
    and the share of step time in cuBLAS/cuDNN kernels, to set beside forge-train's
    --profile trace (`run` writes it to D/<model>/forge_trace.json)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    lib = ("gemm", "xmma", "cutlass", "nvjet", "cudnn", "conv", "wgrad", "dgrad", "cublas")
    for name in a.models:
        d = os.path.join(a.dir, name)
        make_data(a, name, d)
        variants = [(True, False), (False, False)] + ([(True, True)] if name == "gpt2" else [])
        for compiled, sdpa in variants:
            batch = MODELS[name][0]
            torch._dynamo.reset()  # as in time_torch
            torch.cuda.empty_cache()
            fn, x, y = torch_step(a, name, d, compiled, sdpa)
            x, y = x[:batch], y[:batch]
            for _ in range(a.warmup):
                fn(x, y)
            torch.cuda.synchronize()
            steps = 5
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    fn(x, y)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    t, n = kernels.get(e.name, (0.0, 0))
                    kernels[e.name] = (t + e.device_time, n + 1)
            total = sum(t for t, _ in kernels.values())
            in_lib = sum(t for k, (t, _) in kernels.items() if any(w in k.lower() for w in lib))
            label = ("compile" if compiled else "eager") + (" with SDPA" if sdpa else "")
            print(f"{name} {label}: {total / steps / 1e3:.1f} ms of kernels per step, "
                  f"{100 * in_lib / max(total, 1e-9):.1f}% in cuBLAS/cuDNN; "
                  f"{sum(n for _, n in kernels.values()) // steps} kernels per step")
            for k, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:a.top]:
                print(f"  {t / steps / 1e3:8.3f} ms  x{n // steps:<4d} {k[:110]}")
            del fn
            torch.cuda.empty_cache()


def report_split_and_mfu(a, name, d, results, step_s):
    """#11 item 5: Forge's profiled step split into GEMM, attention and the rest
    (trace_summary.step_split over its --profile trace), and for GPT-2 each
    side's MFU: tokens/s x (6 N + 12 L d T) FLOPs a token against the GPU's dense peak."""
    import trace_summary
    rec = results["models"][name]
    trace = os.path.join(d, "forge_trace.json")
    if os.path.exists(trace):
        with open(trace) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        split = trace_summary.step_split(events)
        total = sum(split.values())
        rec["forge_split_ms"] = split
        print(f"{'':8s} forge step by kind (profiled, {total:.2f} ms of instructions): " +
              " | ".join(f"{k} {ms:.2f} ms ({100 * ms / total:.0f}%)" for k, ms in split.items()))
    if name != "gpt2":
        return
    model = build(name)
    params = sum(p.numel() for p in model.parameters())
    per_token = trace_summary.transformer_flops_per_token(params, GPT2["layers"], GPT2["d"],
                                                          GPT2["seq"])
    kind = "tf32" if a.tf32 and a.precision == "fp32" else a.precision
    peak = trace_summary.dense_peak(results["gpu"], kind)
    tokens = MODELS[name][0] * GPT2["seq"]
    rec["flops_per_token"] = per_token
    if peak is None:
        print(f"{'':8s} MFU: no dense tensor-core peak known for {kind} on {results['gpu']}")
        return
    mfu = {k: tokens / dt * per_token / peak for k, dt in step_s.items() if dt}
    rec["mfu"] = mfu
    print(f"{'':8s} MFU ({per_token / 1e6:.1f} MFLOP a token, {peak / 1e12:.1f} TFLOP/s dense "
          f"{kind}): " +
          " | ".join(f"{k} {100 * v:.1f}% ({tokens / step_s[k] / 1e3:.0f}k tok/s)"
                     for k, v in mfu.items()))


def run(a):
    import torch
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "tf32": a.tf32, "precision": a.precision, "warmup": a.warmup, "steps": a.steps, "models": {}}
    for name in a.models:
        d = os.path.join(a.dir, name)
        batch = MODELS[name][0]
        make_data(a, name, d)
        f_dt, f_losses, log = time_forge(a, name, d)
        e_dt, e_losses, e_peak = time_torch(a, name, d, False)
        c_dt, _, c_peak = time_torch(a, name, d, True)
        # GPT-2 also with PyTorch's fused attention (the stronger baseline).
        s_dt, s_peak = None, None
        if name == "gpt2":
            s_dt, _, s_peak = time_torch(a, name, d, True, sdpa=True)
        f_peak = forge_device_bytes(log)
        k = min(a.check, len(f_losses), len(e_losses))
        rel = max(abs(f - e) / abs(e) for f, e in zip(f_losses[:k], e_losses[:k]))
        top = log[log.find("top instructions:"):].strip() if "top instructions:" in log else ""
        results["models"][name] = {
            "batch": batch, "forge_ms": 1e3 * f_dt, "eager_ms": 1e3 * e_dt,
            "compile_ms": 1e3 * c_dt, "forge_samples_s": batch / f_dt,
            "eager_samples_s": batch / e_dt, "compile_samples_s": batch / c_dt,
            "first_losses_max_rel": rel, "forge_losses": f_losses[:k],
            "eager_losses": e_losses[:k], "forge_last_loss": f_losses[-1],
            "eager_last_loss": e_losses[-1], "forge_top": top,
            "forge_device_bytes": f_peak, "eager_peak_bytes": e_peak,
            "compile_peak_bytes": c_peak,
            "compile_sdpa_ms": 1e3 * s_dt if s_dt else None, "compile_sdpa_peak_bytes": s_peak}
        print(f"{name:8s} B={batch}: forge {1e3 * f_dt:8.3f} ms | eager {1e3 * e_dt:8.3f} ms | "
              f"compile {1e3 * c_dt:8.3f} ms | first {k} losses max rel {rel:.2e} | "
              f"last loss forge {f_losses[-1]:.4g} eager {e_losses[-1]:.4g}")
        if s_dt:
            print(f"{'':8s} compile with SDPA {1e3 * s_dt:8.3f} ms "
                  f"(forge {s_dt / f_dt:.3f}x its speed)")
        gb = lambda b: f"{b / 1e9:.2f} GB" if b is not None else "?"
        print(f"{'':8s} GPU memory: forge {gb(f_peak)} (allocated) | eager {gb(e_peak)} | "
              f"compile {gb(c_peak)} (peak allocated)"
              + (f" | compile with SDPA {gb(s_peak)}" if s_peak else ""))
        if top:
            print("  forge " + top.replace("\n", "\n  "))
        report_split_and_mfu(a, name, d, results, {"forge": f_dt, "eager": e_dt,
                                                   "compile": c_dt, "compile with SDPA": s_dt})
        with open(os.path.join(a.dir, "results.json"), "w") as f:  # after every model
            json.dump(results, f, indent=1)


def ab(a):
    """Bundles of one model timed in alternating rounds (the A/B of a compiler change: each
    compiled here from the same export, e.g. with and without --fuse-column-sums=false), with
    forge-train alone in the call: the median step of each round, each bundle's median over
    the rounds and its first losses (which should agree to the precision's tolerance)."""
    for name in a.models:
        d = os.path.join(a.dir, name)
        make_data(a, name, d)
        times = {b: [] for b in a.bundles}
        losses = {}
        for r in range(a.rounds):
            for b in a.bundles:
                dt, ls, _ = time_forge(a, name, d, b, profile=False)
                times[b].append(1e3 * dt)
                losses[b] = ls[: a.check]
                print(f"{name} round {r + 1}: {b} {1e3 * dt:.3f} ms/step", flush=True)
        first = a.bundles[0]
        for b in a.bundles:
            # How far its first losses are from the first bundle's (a compiler change that
            # keeps the arithmetic should stay at the run-to-run level, ~1e-5 in bf16).
            k = min(len(losses[b]), len(losses[first]))
            drift = max((abs(x - y) / abs(y) for x, y in zip(losses[b][:k], losses[first][:k])
                         if y), default=0.0)
            print(f"{name} {b}: median {statistics.median(times[b]):.3f} ms "
                  f"({' / '.join(f'{t:.3f}' for t in times[b])}); first losses "
                  f"{[round(x, 6) for x in losses[b]]}"
                  + (f"; max rel {drift:.1e} from {first}'s" if b != first else ""), flush=True)


def self_test():
    """`--self-test` (ctest bench_train_self_test): `ab`'s bundle specs on cases by hand."""
    cases = {
        "model.forge": ("model.forge", [], {}),
        "model.forge+--attention-backward=fast": ("model.forge", ["--attention-backward=fast"], {}),
        "m.forge+FORGE_MATMUL_LIBRARY=cublaslt+--max-stream-pins=64":
            ("m.forge", ["--max-stream-pins=64"], {"FORGE_MATMUL_LIBRARY": "cublaslt"}),
        "a+b/m.forge+A_1=x=y": ("a+b/m.forge", [], {"A_1": "x=y"}),  # '+' in a path, '=' in a value
        "m.forge+lower=1": ("m.forge+lower=1", [], {}),  # not an option nor NAME=: the path's
    }
    for spec, want in cases.items():
        got = split_runtime_options(spec)
        assert got == want, f"{spec}: {got} != {want}"
    assert env_prefix({"A": "1", "B": "x y"}) == ["env", "A=1", "B=x y"] and env_prefix({}) == []
    print("self-test: passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["export", "compile", "run", "profile", "ab", "all"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--forgec", default="forgec")
    ap.add_argument("--forge-train", default="forge-train")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--check", type=int, default=5, help="first losses compared with eager")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp8"],
                    help="bf16: forgec --precision bf16; PyTorch under autocast bf16 with the "
                         "fused AdamW. fp8: forgec --precision fp8 (float8 forward GEMMs), "
                         "PyTorch as bf16 (its float8 training needs torchao)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed by `profile`")
    ap.add_argument("--bundles", nargs="*", default=["model.forge"],
                    help="`ab`: bundle files in DIR/<model>/ timed in alternating rounds, each "
                         "optionally with forge-train options or its environment after '+' "
                         "(model.forge+--attention-backward=deterministic, "
                         "model.forge+FORGE_MATMUL_LIBRARY=cublaslt)")
    ap.add_argument("--rounds", type=int, default=3, help="`ab`: rounds over --bundles")
    ap.add_argument("--forge-train-arg", action="append", default=[],
                    help="an option for every forge-train run (repeat; e.g. "
                         "--forge-train-arg=--attention-backward=deterministic)")
    a = ap.parse_args()
    if a.stage == "profile":
        profile(a)
        return 0
    if a.stage == "ab":
        ab(a)
        return 0
    for stage, fn in (("export", export), ("compile", compile_), ("run", run)):
        if a.stage in (stage, "all"):
            fn(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
