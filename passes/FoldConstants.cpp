//===- FoldConstants.cpp - evaluate all-constant forge ops -----------------===//
//
// Invariant: a folded op is replaced by constants bit-identical to what the
// runtime computes for it, because both use the same CPU kernel.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Conversion/Conversion.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FOLDCONSTANTS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {
struct FoldConstantsPass : public mlir::forge::impl::FoldConstantsBase<FoldConstantsPass> {
  using FoldConstantsBase::FoldConstantsBase;

  void runOnOperation() override {
    OpBuilder builder(&getContext());
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) { ops.push_back(op); });
    bool changed = false;
    for (Operation *op : ops) {
      if (!isa<ForgeOpInterface>(op) || isa<ConstantOp>(op) || op->getNumOperands() == 0)
        continue;
      SmallVector<Attribute> operands;
      bool allConstant = true;
      for (Value v : op->getOperands()) {
        auto c = v.getDefiningOp<ConstantOp>();
        allConstant &= bool(c);
        operands.push_back(c ? c.getValue() : Attribute());
      }
      int64_t resultElements = 0;
      for (Type t : op->getResultTypes())
        resultElements += cast<RankedTensorType>(t).getNumElements();
      if (!allConstant || resultElements > maxElements)
        continue;
      auto folded = evaluateOnConstants(op, operands);
      if (failed(folded)) {
        // No CPU kernel or invalid data: left for run time. A large result
        // may also have failed to allocate: say so rather than stay silent.
        if (resultElements > kMaxFoldElements)
          op->emitWarning() << "not folded: evaluating a result of " << resultElements
                            << " elements at compile time failed (out of memory?); it is "
                               "computed at run time";
        continue;
      }
      builder.setInsertionPoint(op);
      for (auto [result, value] : llvm::zip(op->getResults(), *folded))
        result.replaceAllUsesWith(builder.create<ConstantOp>(op->getLoc(), value));
      op->erase();
      changed = true;
    }
    if (!changed)
      markAllAnalysesPreserved();
  }
};
} // namespace
