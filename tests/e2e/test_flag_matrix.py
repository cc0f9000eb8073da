#!/usr/bin/env python3
"""CUDA bundles under every partitioning, accumulation, stream and GEMM-epilogue flag
(ctest e2e_flag_matrix).

The placement-stage passes (forge-merge-scalar-regions, forge-fold-attention-views) and the
schedule see what the graph stages made of a model: data/tensor/pipeline parallel stages,
ZeRO shards, accumulation routines, recomputed attention, a second compute stream, the
GEMMs' aux epilogues (GELU_AUX/DGELU beside low-precision outputs). For the
gpt fixture (TorchScript export), the bundled gpt_dynamo (dynamo export), the mlp fixture
and the cnn fixture (channels-last convolutions, batch norms, weights stored permuted), in
bf16 and fp16 (and the two GPTs in fp8 with delayed scaling: amax histories, their slots'
region, with --dp their max over the ranks), each flag set is compiled for cuda:sm_90.
Checked:
  1. forgec either succeeds or refuses with an `error:` line naming the reason (a flag
     combination it does not support yet); never a crash or an internal error;
  2. every bundle it makes passes `forge-replay --check-library`: each library call's
     problem as the CUDA executor checks it, tensor alignment, and no two instructions
     that may run at once on different streams touching the same bytes, one writing
     (a folded qkv split's pieces 32 bytes apart under --tp 2 failed here once).
No GPU needed. The GPU side of these bundles is the gpu_* suites'.
"""
import os
import sys
import tempfile

import forge_e2e as e2e
from forge_e2e import Report

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
MODELS = [os.path.join(ROOT, "tests", "fixtures", "gpt_adamw", "model.onnx"),
          os.path.join(ROOT, "models", "gpt_dynamo.onnx"),
          os.path.join(ROOT, "tests", "fixtures", "mlp_adamw", "model.onnx"),
          os.path.join(ROOT, "tests", "fixtures", "cnn_adamw", "model.onnx")]
FLAGS = [[], ["--dp", "2"], ["--tp", "2"], ["--pp", "2"], ["--micro-batches", "2"],
         ["--recompute", "attention"], ["--dp", "2", "--zero", "1"],
         ["--compute-streams", "2", "--stream-memory-growth", "1000"],
         ["--batch-schedule", "8:2,16"], ["--gemm-aux-epilogues"], ["--low-norm-gradients"]]
CRASH = ("Stack dump", "internal error", "Segmentation fault", "PLEASE submit")


def main():
    tools = e2e.replay_tools("test_flag_matrix")
    if not tools:
        return 2
    forgec, _, replay = tools
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        bundles, refused = [], 0
        for model in MODELS:
            short = os.path.basename(os.path.dirname(model)) if model.endswith("model.onnx") \
                else os.path.basename(model)[:-5]
            precisions = {"bf16": ["--precision", "bf16"], "fp16": ["--precision", "fp16"]}
            if "gpt" in short:
                precisions["fp8d"] = ["--precision", "fp8", "--fp8-scaling", "delayed"]
            for prec, prec_flags in precisions.items():
                for flags in FLAGS:
                    case = f"{short} {prec} {' '.join(flags) or '(plain)'}"
                    out = os.path.join(tmp, f"b{len(bundles) + refused}.forge")
                    rc, _, log = e2e.run([forgec, model, "--target", "cuda:sm_90", "--batch", "8",
                                          "--loss", "cross_entropy:logits,labels",
                                          "--optimizer", "adamw:lr=1e-3", *prec_flags,
                                          "-o", out] + flags, 600)
                    if rc == 0:
                        bundles.append((case, out))
                        continue
                    clear = "error:" in log and not any(c in log for c in CRASH)
                    rep.check(f"{case}: refused with a reason", clear, e2e.tail(log, 3))
                    refused += clear
        rep.check(f"{len(bundles)} of {len(bundles) + refused} flag sets compile "
                  "(the rest refused by name)", len(bundles) >= 2 * len(MODELS) * 5,
                  f"{refused} refused")
        for case, path in bundles:
            rc, _, log = e2e.run([replay, "--check-library", path], 600)
            rep.check(f"{case}: forge-replay --check-library", rc == 0, e2e.tail(log, 3))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
