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
//
// The backward pass concatenates the gradients the other way: dq, dk and dv
// ([B, T, H, D], reshaped to [B, T, H * D]) into the projection's gradient
// [B, T, 3 * H * D], a kernel copying it all again (0.59 ms a step). When
// every piece of such a concat (along the last axis) is a reshape read only
// by it of a value read only by that reshape, made by a cuDNN
// attention_grad in layout bshd (one of its results) or by a loop region
// (its one result), the concat gets
// `forge.placement = "view"` too: its operands are its own bytes at the
// pieces' offsets (forge-plan-memory), and each maker writes its piece with
// a token stride of the concat's row: `forge.out_row_strides`, per result
// (0: packed), which cuDNN takes as output strides and the kernel generator
// as the loop's output map. (dk's centring, a loop region or a lines region
// with its mean, reads cuDNN's packed dk and writes its piece.)
//===----------------------------------------------------------------------===//
#include "Passes.h"

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
    bool concats = false;
    for (auto concat : llvm::to_vector(getOperation().getBody().getOps<ConcatOp>()))
      concats |= foldConcat(concat);
    if (rowOf.empty()) {
      if (!concats)
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

  /// Makes `concat` a view whose pieces their makers write in place, when
  /// they can (the header's conditions); whether it did.
  bool foldConcat(ConcatOp concat) {
    auto out = dyn_cast<RankedTensorType>(concat.getType());
    const int64_t axis = static_cast<int64_t>(concat.getAxis());
    if (!out || !out.hasStaticShape() || out.getRank() != 3 || (axis != 2 && axis != -1))
      return false;
    const int64_t row = out.getDimSize(2);
    const int64_t bytes = std::max<int64_t>(out.getElementTypeBitWidth() / 8, 1);
    if (row * bytes % 16 != 0) // cuDNN's strides, as for the split
      return false;
    for (Operation *user : concat->getUsers())
      if (isa<func::ReturnOp>(user)) // an output is a buffer of its own
        return false;
    struct Maker {
      Operation *op;
      unsigned result;
    };
    SmallVector<Maker> makers;
    if (!piecesAligned(out, 2, concat.getInputs().getTypes()))
      return false;
    for (Value in : concat.getInputs()) {
      auto pt = cast<RankedTensorType>(in.getType());
      auto reshape = in.getDefiningOp<ReshapeOp>();
      if (!reshape || !in.hasOneUse() || reshape->getBlock() != concat->getBlock())
        return false;
      Value made = reshape.getInput();
      auto mt = cast<RankedTensorType>(made.getType());
      // [B, T, H, D] -> [B, T, H * D]: the tokens keep their rows.
      if (!made.hasOneUse() || mt.getRank() != 4 || mt.getElementType() != out.getElementType() ||
          pt.getElementType() != out.getElementType() || mt.getDimSize(0) != pt.getDimSize(0) ||
          mt.getDimSize(1) != pt.getDimSize(1) ||
          mt.getDimSize(2) * mt.getDimSize(3) != pt.getDimSize(2))
        return false;
      auto result = dyn_cast<OpResult>(made);
      if (!result || result.getOwner()->getBlock() != concat->getBlock())
        return false;
      Operation *maker = result.getOwner();
      if (isCudnnAttention(maker)) {
        if (!isa<AttentionGradOp>(maker) || result.getResultNumber() > 2)
          return false;
      } else if (auto loop = dyn_cast<FusionOp>(maker)) {
        // A loop region, or a lines region (dk's centring with its mean, forge-fuse-line-
        // reductions): both kernels write through forge.out_row_strides.
        if ((loop.getKind() != "loop" && loop.getKind() != "lines") || loop.isViewRegion() ||
            loop->getNumResults() != 1 || loop.getIterationShape() != mt.getShape())
          return false;
      } else {
        return false;
      }
      makers.push_back({maker, result.getResultNumber()});
    }
    MLIRContext *ctx = &getContext();
    concat->setAttr("forge.placement", StringAttr::get(ctx, "view"));
    for (const Maker &m : makers) {
      SmallVector<int64_t> rows(m.op->getNumResults(), 0);
      if (auto old = m.op->getAttrOfType<DenseI64ArrayAttr>("forge.out_row_strides"))
        rows.assign(old.asArrayRef().begin(), old.asArrayRef().end());
      rows[m.result] = row;
      m.op->setAttr("forge.out_row_strides", DenseI64ArrayAttr::get(ctx, rows));
    }
    return true;
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
    if (!piecesAligned(in, 2, split->getResultTypes()))
      return std::nullopt;
    for (Value piece : split->getResults()) {
      auto pt = cast<RankedTensorType>(piece.getType());
      if (piece.use_empty())
        return std::nullopt;
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
