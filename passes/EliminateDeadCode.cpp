//===- EliminateDeadCode.cpp - erase unused side-effect-free ops ------------===//
#include "Passes.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::forge {
#define GEN_PASS_DEF_ELIMINATEDEADCODE
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;

namespace {
struct EliminateDeadCodePass
    : public mlir::forge::impl::EliminateDeadCodeBase<EliminateDeadCodePass> {
  void runOnOperation() override {
    bool changed = false;
    for (Block &block : getOperation().getBody()) {
      // Reverse order: erasing a user can make its producers dead in the same sweep.
      for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block))) {
        if (op.hasTrait<OpTrait::IsTerminator>() || !op.use_empty() || !isMemoryEffectFree(&op))
          continue;
        op.erase();
        changed = true;
      }
    }
    if (!changed)
      markAllAnalysesPreserved();
  }
};
} // namespace
