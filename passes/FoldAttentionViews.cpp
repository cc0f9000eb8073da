//===- FoldAttentionViews.cpp - cuDNN attention reads q/k/v in place -------===//
//
// A fused qkv projection [B, T, 3 * H * D] is split along its last axis into
// q, k and v, each reshaped to [B, T, H, D] (layout "bshd") for cuDNN's
// attention: the split is a kernel that copies the whole projection (GPT-2
// 124M: 12 of them, 0.59 ms of a 34.5 ms bf16 step on an H200). cuDNN takes
// strided operands: q, k and v can be read where the projection wrote them,
// each token's row N = 3 * H * D elements after the previous one.
//
// When every reader of every piece of a split along the last axis is a
// reshape that only splits that axis into [H, D], and every reader of those
// is a cuDNN attention or attention_grad in layout bshd (as its q, k or v),
// the split gets `forge.placement = "view"`: it runs no instruction, its
// results are its operand's bytes at the pieces' offsets (forge-plan-memory),
// and each attention op gets `forge.row_strides = [q, k, v]`, the elements
// between consecutive tokens of each operand (N for a piece, H * D for a
// packed tensor). Runs at placement, after forge-select-library (which marks
// the cuDNN attention ops) and before the kernel generator (which would give
// the split a kernel).
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/runtime/Bundle.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FOLDATTENTIONVIEWS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

bool isCudnnAttention(Operation *op) {
  if (!isa<AttentionOp, AttentionGradOp>(op))
    return false;
  auto library = op->getAttrOfType<StringAttr>("forge.library");
  auto layout = op->getAttrOfType<StringAttr>("layout");
  return library && library.getValue() == "cudnn" && layout && layout.getValue() == "bshd";
}

/// The token stride of q/k/v operand `v` of a bshd attention: its row size
/// (H * D) unless it is a view of a folded split.
int64_t ownRow(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getDimSize(2) * t.getDimSize(3);
}

struct FoldAttentionViewsPass
    : public mlir::forge::impl::FoldAttentionViewsBase<FoldAttentionViewsPass> {
  void runOnOperation() override {
    DenseMap<Value, int64_t> rowOf; // a q/k/v view -> elements between its tokens
    SmallVector<Operation *> attentions;
    for (auto split : llvm::to_vector(getOperation().getBody().getOps<SplitOp>())) {
      std::optional<int64_t> row = foldable(split);
      if (!row)
        continue;
      split->setAttr("forge.placement", StringAttr::get(&getContext(), "view"));
      for (Value piece : split->getResults())
        for (Operation *reshape : piece.getUsers())
          rowOf[reshape->getResult(0)] = *row;
    }
    if (rowOf.empty()) {
      markAllAnalysesPreserved();
      return;
    }
    getOperation().walk([&](Operation *op) {
      if (!isCudnnAttention(op))
        return;
      SmallVector<int64_t> rows;
      bool any = false;
      for (unsigned i = 0; i < 3; ++i) {
        Value v = op->getOperand(i);
        auto it = rowOf.find(v);
        any |= it != rowOf.end();
        rows.push_back(it != rowOf.end() ? it->second : ownRow(v));
      }
      if (any)
        op->setAttr("forge.row_strides", DenseI64ArrayAttr::get(&getContext(), rows));
    });
  }

  /// The token stride (the operand's last dimension) when `split` can be a
  /// view, else none.
  std::optional<int64_t> foldable(SplitOp split) {
    auto in = dyn_cast<RankedTensorType>(split.getInput().getType());
    if (!in || !in.hasStaticShape() || in.getRank() != 3)
      return std::nullopt;
    int64_t axis = static_cast<int64_t>(split.getAxis());
    if (axis < 0)
      axis += in.getRank();
    if (axis != in.getRank() - 1)
      return std::nullopt;
    // cuDNN wants 16-byte aligned strides, and a bundle's tensors start on the
    // arena's alignment (64 bytes): every piece's start. (GPT-2's pieces are
    // 1,536 bytes apart; a tensor-parallel rank's gpt fixture has 32.)
    const int64_t bytes = std::max<int64_t>(in.getElementTypeBitWidth() / 8, 1);
    if (in.getDimSize(2) * bytes % 16 != 0)
      return std::nullopt;
    int64_t start = 0;
    for (Value piece : split->getResults()) {
      auto pt = cast<RankedTensorType>(piece.getType());
      if (piece.use_empty() || start % static_cast<int64_t>(::forge::rt::kSectionAlignment) != 0)
        return std::nullopt;
      start += pt.getDimSize(2) * bytes;
      for (Operation *user : piece.getUsers()) {
        auto reshape = dyn_cast<ReshapeOp>(user);
        if (!reshape)
          return std::nullopt;
        auto rt = cast<RankedTensorType>(reshape.getType());
        // [B, T, n] -> [B, T, H, D]: the tokens keep their rows.
        if (rt.getRank() != 4 || rt.getDimSize(0) != pt.getDimSize(0) ||
            rt.getDimSize(1) != pt.getDimSize(1) ||
            rt.getDimSize(2) * rt.getDimSize(3) != pt.getDimSize(2))
          return std::nullopt;
        if (reshape->use_empty())
          return std::nullopt;
        for (OpOperand &use : reshape->getUses())
          if (!isCudnnAttention(use.getOwner()) || use.getOperandNumber() > 2)
            return std::nullopt;
      }
    }
    return in.getDimSize(2);
  }
};

} // namespace
