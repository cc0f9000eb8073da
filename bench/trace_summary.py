#!/usr/bin/env python3
"""Per-step GPU time of a forge-train --profile trace (Chrome trace JSON), by instruction.

forge-train --profile times steps 3..7 instruction by instruction and writes each as a
complete event ("ph": "X") named by the instruction's op, whose category is its generated
kernel's name, the library (cuBLASLt, cuDNN), "memcpy", a host placement or "transfer"
(input uploads). This sums the events of all profiled steps by op, divides by the number
of steps, and prints the total per kind (library, generated kernel, copy, transfer) and
the top ops, so that a profile can be set beside PyTorch's (bench_train.py profile) and
recorded in RESULTS.md.

  trace_summary.py D/gpt2/forge_trace.json [--top 25] [--steps N] [--by op|kernel|node]

--by kernel sums by generated kernel (or library) name, --by node by the instruction's ONNX
node, each with the bytes it moves per step and the bandwidth they imply.

Also imported by bench_train.py `run` (the split of Forge's step into GEMM, attention and
the rest; MFU against the GPU's dense peak, #11 item 5). `--self-test` checks those helpers
on cases known by hand (ctest trace_summary_self_test, no GPU).
"""
import argparse
import collections
import json
import sys


def kind_of(cat):
    """An event's kind: its library (cuBLASLt, cuDNN, CUTLASS: the LM head's GEMM with its
    loss), memcpy, transfer, a host placement, or "kernel" (a generated kernel's name)."""
    if cat in ("cuBLASLt", "cuDNN", "CUTLASS", "memcpy", "transfer") or cat.startswith("host"):
        return cat
    return "kernel"


# What each kind is in a transformer's step (GEMMs run in cuBLASLt, attention in cuDNN's
# fused kernels; an unfused attention's matmuls and softmax rows count as GEMM and rest).
SPLIT = (("GEMM (cuBLASLt, CUTLASS)", ("cuBLASLt", "CUTLASS")), ("attention (cuDNN)", ("cuDNN",)),
         ("generated kernels", ("kernel",)), ("copies and transfers", ("memcpy", "transfer")))


def profiled_steps(events):
    """How many steps the complete events cover (their args.step values; 1 if none)."""
    return max(1, len({e.get("args", {}).get("step") for e in events
                       if e.get("ph") == "X"} - {None}))


def step_split(events, steps=None):
    """ms per step of each SPLIT group (and "host", if any) over the complete events
    (steps: their profiled_steps by default)."""
    steps = steps or profiled_steps(events)
    by_kind = collections.defaultdict(float)
    for e in events:
        if e.get("ph") == "X":
            by_kind[kind_of(e.get("cat", "?"))] += float(e.get("dur", 0.0))
    out = {group: sum(by_kind.pop(k, 0.0) for k in kinds) / steps / 1e3
           for group, kinds in SPLIT}
    host = sum(by_kind.values()) / steps / 1e3
    if host:
        out["host placements"] = host
    return out


def transformer_flops_per_token(params, layers, d_model, seq):
    """Training FLOPs a token of a decoder (PaLM's appendix B, as #11 counts MFU): 6 per
    parameter (forward and both gradients) plus 12 L d T for the attention scores and
    their product with V (counted whole, as if not causal)."""
    return 6 * params + 12 * layers * d_model * seq


def dense_peak(gpu, precision):
    """The GPU's dense tensor-core peak in FLOP/s for `precision` (bf16, fp16, fp8 (set
    against bf16's: its backward GEMMs are bf16) or tf32), at NVIDIA's boost clock; None for
    fp32 (no tensor cores) or a GPU not listed."""
    if precision not in ("bf16", "fp16", "fp8", "tf32"):
        return None
    bf16 = None
    if "H100" in gpu or "H200" in gpu:
        bf16 = 756e12 if "PCIe" in gpu else 835e12 if "NVL" in gpu else 989.4e12
    elif "A100" in gpu:
        bf16 = 312e12
    elif "L40S" in gpu:
        bf16 = 362.05e12
    if bf16 is None:
        return None
    return bf16 if precision != "tf32" else bf16 / 2


def self_test():
    failures = []

    def check(what, got, want):
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            failures.append(f"{what}: {got} != {want}")

    events = [{"ph": "X", "cat": "cuBLASLt", "dur": 3000.0, "args": {"step": 3}},
              {"ph": "X", "cat": "cuDNN", "dur": 1000.0, "args": {"step": 3}},
              {"ph": "X", "cat": "k3_fusion", "dur": 500.0, "args": {"step": 4}},
              {"ph": "X", "cat": "memcpy", "dur": 100.0, "args": {"step": 4}},
              {"ph": "X", "cat": "host (cpu)", "dur": 400.0, "args": {"step": 4}},
              {"ph": "M", "cat": "cuBLASLt", "dur": 9999.0, "args": {"step": 9}}]  # metadata
    check("profiled steps", profiled_steps(events), 2)
    got = step_split(events)
    for group, ms in (("GEMM (cuBLASLt, CUTLASS)", 1.5), ("attention (cuDNN)", 0.5),
                      ("generated kernels", 0.25), ("copies and transfers", 0.05),
                      ("host placements", 0.2)):
        check(group, got.get(group, -1), ms)
    # GPT-2 124M (124,439,808 parameters, 12 layers, d 768, T 1024): 859.7 MFLOP a token,
    # so #11's 600k tok/s on an H200 is 52% of its 989.4 TFLOP/s.
    f = transformer_flops_per_token(124439808, 12, 768, 1024)
    check("GPT-2 FLOPs a token", f, 6 * 124439808 + 12 * 12 * 768 * 1024)
    check("MFU at 600k tok/s", round(600e3 * f / dense_peak("NVIDIA H200", "bf16"), 3), 0.521)
    check("H100 PCIe bf16", dense_peak("NVIDIA H100 PCIe", "bf16"), 756e12)
    check("H100 SXM TF32", dense_peak("NVIDIA H100 80GB HBM3", "tf32"), 494.7e12)
    if dense_peak("Tesla T4", "bf16") is not None or dense_peak("NVIDIA H200", "fp32"):
        failures.append("an unlisted GPU or fp32 has a peak")
    for f_ in failures:
        print("FAIL " + f_)
    print("self-test: " + ("failed" if failures else "passed"))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, help="steps the trace profiled (default: the events' "
                    "distinct args.step values)")
    ap.add_argument("--by", choices=["op", "kernel", "node"], default="op",
                    help="what the top list sums by")
    ap.add_argument("--self-test", action="store_true",
                    help="check the split and MFU helpers (no trace)")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.trace:
        ap.error("a trace is needed (or --self-test)")
    with open(a.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_name = collections.defaultdict(lambda: [0.0, 0, 0.0])
    by_cat = collections.defaultdict(float)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "?")
        kind = kind_of(cat)
        args = e.get("args", {})
        label = {"op": e.get("name", "?"),
                 "kernel": f"{e.get('name', '?')} [{cat}]",
                 "node": f"{e.get('name', '?')} {args.get('node', '?')}"}[a.by]
        key = (label, kind)
        by_name[key][0] += float(e.get("dur", 0.0))  # microseconds
        by_name[key][1] += 1
        by_name[key][2] += float(args.get("bytes", 0.0))
        by_cat[kind] += float(e.get("dur", 0.0))
    if not by_name:
        print("no complete events in the trace", file=sys.stderr)
        return 1
    a.steps = a.steps or profiled_steps(events)
    total = sum(by_cat.values()) / a.steps
    print(f"{total / 1e3:.3f} ms of instructions per step over {a.steps} steps")
    for cat, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:10s} {us / a.steps / 1e3:8.3f} ms")
    print(f"top {a.top} (ms per step, instructions per step):")
    for (name, cat), (us, n, nbytes) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:a.top]:
        rate = f"{nbytes / (us * 1e6):6.2f} TB/s" if us > 0 and nbytes > 0 else " " * 11
        print(f"  {us / a.steps / 1e3:8.3f} ms  x{n // a.steps:<4d} {cat:8s} {rate}  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
