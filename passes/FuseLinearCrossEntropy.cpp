//===- FuseLinearCrossEntropy.cpp - the LM head's GEMM with its loss --------===//
//
// forge-fuse-linear-cross-entropy: a language model's head is a matmul
// x w^T ([N, K] by [C, K], bf16) whose f32 logits [N, C] only a
// cross_entropy_with_grad reads, writing a bf16 gradient. The GEMM writes
// 4 bytes a logit and the loss kernel reads them back (GPT-2 B16: 3.3 GB
// each way a step, 2.15 + 1.81 ms on an H100). Both become one
// linear_cross_entropy_with_grad, which the runtime runs as a CUTLASS GEMM
// whose epilogue writes each logit's exp(x - m) in f16 (m the maximum of the
// row's 128 columns that subtile holds) and the (m, sum) pairs, then a
// streaming kernel making lse, the loss and the gradient over those bytes
// (runtime/lib/cuda/LinearCrossEntropy.h; bench/lm_head_epilogue_probe.cu:
// 3.39 ms against 3.96).
//
// Invariants: the values are the two ops' to the gradient's bf16 rounding
// (f16 exp(x - m) keeps 2^-11 of each probability, as the on-chip loss
// kernel's own e; lse and the loss from f32 pairs and an f32 dot product for
// the target's logit); only the form the runtime's kernels take: 2-D bf16 x
// and w (w read transposed), an f32 logits tensor with no other reader, a
// bf16 gradient, K and C multiples of 8 (TMA's 16-byte rows). The pipeline
// runs it for cuda:sm_90 only (the kernels are sm_90a code), after the loss
// head's chunking and merge (each chunk's pair fuses) and before placement.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FUSELINEARCROSSENTROPY
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// The matmul whose logits `ce` alone reads (directly, or through a reshape that only
/// merges its leading dims: [B, T, C] -> [B T, C], an unchunked head), in the form the
/// runtime takes; null otherwise. `flat` is that reshape, if any.
MatMulOp fusibleHead(CrossEntropyWithGradOp ce, ReshapeOp *flat = nullptr) {
  Value logitsIn = ce.getLogits();
  auto reshape = logitsIn.getDefiningOp<ReshapeOp>();
  if (reshape) {
    if (!reshape.getResult().hasOneUse())
      return {};
    logitsIn = reshape.getInput();
  }
  auto mm = logitsIn.getDefiningOp<MatMulOp>();
  if (!mm || !mm.getResult().hasOneUse() || mm->getBlock() != ce->getBlock() ||
      ce->getParentOfType<FusionOp>() ||
      !isLinearCrossEntropyForm(mm, ce.getLogits().getType(), ce.getResult().getType()))
    return {};
  auto loss = tensorOf(ce.getLoss()), dy = tensorOf(ce.getGradOutput());
  if (!loss || !dy || !loss.getElementType().isF32() || !dy.getElementType().isF32())
    return {};
  if (flat)
    *flat = reshape;
  return mm;
}

} // namespace

bool mlir::forge::isLinearCrossEntropyForm(Operation *product, Type logitsType, Type gradient) {
  auto mm = dyn_cast_or_null<MatMulOp>(product);
  if (!mm || mm.getTransA() || !mm.getTransB())
    return false;
  auto x = tensorOf(mm.getLhs()), w = tensorOf(mm.getRhs());
  auto logits = dyn_cast<RankedTensorType>(logitsType);
  auto grad = dyn_cast<RankedTensorType>(gradient);
  if (!x || !w || !logits || !grad || x.getRank() < 2 || w.getRank() != 2 ||
      logits.getRank() != 2 || !x.hasStaticShape() || !w.hasStaticShape() ||
      !logits.hasStaticShape())
    return false;
  if (!x.getElementType().isBF16() || !w.getElementType().isBF16() ||
      !logits.getElementType().isF32() || !grad.getElementType().isBF16())
    return false;
  const int64_t k = x.getDimSize(x.getRank() - 1), c = w.getDimSize(0);
  // The logits' rows are x's rows in order: x [..., K] flattened (a reshape of a row-major
  // [B, T, C] to [B T, C] keeps each row's C values together and in order).
  if (w.getDimSize(1) != k || logits.getDimSize(0) * k != x.getNumElements() ||
      logits.getDimSize(1) != c)
    return false;
  return k % 8 == 0 && c % 8 == 0 && logits.getDimSize(0) >= 1;
}

namespace {

struct FuseLinearCrossEntropyPass
    : public mlir::forge::impl::FuseLinearCrossEntropyBase<FuseLinearCrossEntropyPass> {
  using FuseLinearCrossEntropyBase::FuseLinearCrossEntropyBase;
  void runOnOperation() override {
    struct Head {
      CrossEntropyWithGradOp ce;
      MatMulOp mm;
      ReshapeOp flat;
    };
    SmallVector<Head> heads;
    getOperation().walk([&](CrossEntropyWithGradOp ce) {
      ReshapeOp flat;
      if (MatMulOp mm = fusibleHead(ce, &flat))
        heads.push_back({ce, mm, flat});
    });
    if (heads.empty())
      return markAllAnalysesPreserved();
    // Each head's ops are its own (single uses): rewriting one leaves the others' matches.
    for (auto [ce, mm, flat] : heads) {
      OpBuilder b(ce);
      // At the loss's place: x and w come before the matmul, which comes before it.
      Value x = mm.getLhs();
      auto xType = tensorOf(x);
      if (xType.getRank() != 2) { // x's rows as the logits' rows: [B, T, K] -> [B T, K]
        const int64_t rows = tensorOf(ce.getLogits()).getDimSize(0);
        const int64_t k = xType.getDimSize(xType.getRank() - 1);
        x = b.create<ReshapeOp>(ce.getLoc(), xType.clone({rows, k}), x,
                                b.getDenseI64ArrayAttr({rows, k}));
      }
      auto fused = b.create<LinearCrossEntropyWithGradOp>(
          ce.getLoc(), TypeRange{ce.getLoss().getType(), ce.getResult().getType()}, x, mm.getRhs(),
          ce.getTarget(), ce.getGradOutput(), ce.getReductionAttr(), ce.getClassesAttr());
      ce.getLoss().replaceAllUsesWith(fused.getLoss());
      ce.getResult().replaceAllUsesWith(fused.getResult());
      ce.erase();
      if (flat)
        flat.erase();
      mm.erase();
    }
  }
};

} // namespace
