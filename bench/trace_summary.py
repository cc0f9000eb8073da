#!/usr/bin/env python3
"""Per-step GPU time of a forge-train --profile trace (Chrome trace JSON), by instruction.

forge-train --profile times steps 3..7 instruction by instruction and writes each as a
complete event ("ph": "X") named by the instruction's op, whose category is its generated
kernel's name, the library (cuBLASLt, cuDNN), "memcpy", a host placement or "transfer"
(input uploads). This sums the events of all profiled steps by op, divides by the number
of steps, and prints the total per kind (library, generated kernel, copy, transfer) and
the top ops, so that a profile can be set beside PyTorch's (bench_train.py profile) and
recorded in RESULTS.md.

  trace_summary.py D/gpt2/forge_trace.json [--top 25] [--steps 5] [--by op|kernel|node]

--by kernel sums by generated kernel (or library) name, --by node by the instruction's ONNX
node, each with the bytes it moves per step and the bandwidth they imply.
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, default=5, help="steps the trace profiled")
    ap.add_argument("--by", choices=["op", "kernel", "node"], default="op",
                    help="what the top list sums by")
    a = ap.parse_args()
    with open(a.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_name = collections.defaultdict(lambda: [0.0, 0, 0.0])
    by_cat = collections.defaultdict(float)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "?")
        kind = cat if cat in ("cuBLASLt", "cuDNN", "memcpy", "transfer") or \
            cat.startswith("host") else "kernel"
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
