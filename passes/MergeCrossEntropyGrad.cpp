//===- MergeCrossEntropyGrad.cpp - a classifier's loss and gradient in one op -===//
//
// cross_entropy(logits, t) -> (loss, lse) and cross_entropy_grad(logits, lse,
// t, g) -> d each read all of the logits from memory: GPT-2's 3.3 GB (f32,
// B16) twice per step. Where g does not depend on the loss (it is the
// backward pass's seed: 1/K times a loss scale, or the chunked head's g/N),
// both become one cross_entropy_with_grad at the loss's place, whose row
// kernel reads each row for its statistics and again, from L2, for its
// gradient; lse is never stored.
//
// Invariants: every value is the one the two ops compute (the same per-row
// formulas, lse in registers instead of a stored f32); g's producers that
// come after the loss (pure ops, none of which reads the loss) move before
// it, in their order; the pair is merged only when lse has no other reader
// and the logits, target and classes are the same. After the loss head's
// chunking (forge-chunk-cross-entropy matches the separate pair).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::forge {
#define GEN_PASS_DEF_MERGECROSSENTROPYGRAD
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

struct MergeLossAndGradient : public OpRewritePattern<CrossEntropyGradOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(CrossEntropyGradOp grad,
                                PatternRewriter &rewriter) const override {
    auto ce = grad.getLse().getDefiningOp<CrossEntropyOp>();
    if (!ce)
      return rewriter.notifyMatchFailure(grad, "the lse is not a cross_entropy's");
    if (ce.getLogits() != grad.getLogits() || ce.getTarget() != grad.getTarget() ||
        ce.getClassesAttr() != grad.getClassesAttr())
      return rewriter.notifyMatchFailure(
          grad, "other logits, target or classes than its cross_entropy's");
    if (!ce.getLse().hasOneUse())
      return rewriter.notifyMatchFailure(grad, "the lse has another reader");
    Block *block = ce->getBlock();
    if (grad->getBlock() != block)
      return rewriter.notifyMatchFailure(grad, "the loss and its gradient are in two blocks");
    // g's producers in this block from the loss on: they must not read the
    // loss, and must be free to move (pure, no region reading values from
    // above).
    llvm::SetVector<Operation *> producers;
    SmallVector<Value> worklist{grad.getGradOutput()};
    while (!worklist.empty()) {
      Operation *def = worklist.pop_back_val().getDefiningOp();
      if (!def || def->getBlock() != block || def->isBeforeInBlock(ce) ||
          producers.contains(def))
        continue;
      if (def == ce.getOperation())
        return rewriter.notifyMatchFailure(grad, "grad_output depends on the loss");
      if (!isMemoryEffectFree(def) ||
          (def->getNumRegions() != 0 && !def->hasTrait<OpTrait::IsIsolatedFromAbove>()))
        return rewriter.notifyMatchFailure(grad, "grad_output's producers cannot move");
      producers.insert(def);
      llvm::append_range(worklist, def->getOperands());
    }
    SmallVector<Operation *> ordered(producers.begin(), producers.end());
    llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    for (Operation *op : ordered)
      rewriter.moveOpBefore(op, ce);

    rewriter.setInsertionPoint(ce);
    auto merged = rewriter.create<CrossEntropyWithGradOp>(
        ce.getLoc(), TypeRange{ce.getLoss().getType(), grad.getType()}, ce.getLogits(),
        ce.getTarget(), grad.getGradOutput(), grad.getReductionAttr(), ce.getClassesAttr());
    rewriter.replaceOp(grad, merged.getResult());
    rewriter.replaceAllUsesWith(ce.getLoss(), merged.getLoss());
    rewriter.eraseOp(ce);
    return success();
  }
};

struct MergeCrossEntropyGradPass
    : public mlir::forge::impl::MergeCrossEntropyGradBase<MergeCrossEntropyGradPass> {
  using MergeCrossEntropyGradBase::MergeCrossEntropyGradBase;
  void runOnOperation() override {
    SmallVector<Operation *> grads;
    getOperation().walk([&](CrossEntropyGradOp op) { grads.push_back(op); });
    if (grads.empty())
      return markAllAnalysesPreserved();
    RewritePatternSet patterns(&getContext());
    patterns.add<MergeLossAndGradient>(&getContext());
    FrozenRewritePatternSet frozen(std::move(patterns));
    GreedyRewriteConfig config;
    config.strictMode = GreedyRewriteStrictness::ExistingOps;
    bool changed = false;
    if (failed(applyOpPatternsAndFold(grads, frozen, config, &changed)))
      return signalPassFailure();
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace
