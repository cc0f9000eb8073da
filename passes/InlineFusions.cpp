//===- InlineFusions.cpp - fusion regions without a kernel -> their ops ----===//
#include "Passes.h"

namespace mlir::forge {
#define GEN_PASS_DEF_INLINEFUSIONS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {
struct InlineFusionsPass : public mlir::forge::impl::InlineFusionsBase<InlineFusionsPass> {
  void runOnOperation() override {
    SmallVector<FusionOp> regions;
    for (auto fusion : getOperation().getBody().getOps<FusionOp>())
      if (!fusion->hasAttr("forge.launch"))
        regions.push_back(fusion);
    for (FusionOp fusion : regions)
      fusion.inlineBody();
    if (regions.empty())
      markAllAnalysesPreserved();
  }
};
} // namespace
