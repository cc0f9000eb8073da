//===- ElideCentredSums.cpp - sums of centred values are zero ----------------===//
//
// forge-elide-centred-sums: x minus its mean over axes A sums to exactly 0
// over any axes that include A. Attention's dk is centred over the keys
// (LibraryGradients.cpp: softmax ignores a shift of every key), and the qkv
// projection's bias gradient sums concat(dq, dk, dv) over every token: its k
// third is 0 (in exact arithmetic; the stored bf16 values sum to a residue),
// yet its kernel read all of dk for it (GPT-2 bf16: 25 MB a layer). The pass
// marks such a reduce_sum's `zero_outputs` = [begin, end) of its result:
// kernels write 0 there and the column-layout kernel does not read that
// piece's columns (Reduction.cpp); the CPU kernel writes 0 too.
//
// Invariants: only a reduce_sum outside regions whose input is a concat along
// the one axis it keeps (every other axis reduced, so the result's elements
// are the concat axis's positions); a piece counts when it is, through
// reshapes that keep the leading dims holding A, a "lines" region or a sub
// whose value is (cast) x minus reduce_mean(x) over A with keepdims, and A is
// reduced by the sum. One range a sum (the first centred piece). CUDA only,
// in placement: after forge-merge-reductions (whose multi_reduce kernels do
// not take the attribute), before forge-fold-attention-views (after which
// the concat is a view the pass no longer sees).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

namespace mlir::forge {
#define GEN_PASS_DEF_ELIDECENTREDSUMS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// Whether `sub` is x minus reduce_mean(x) over axes that `reduced` holds, with keepdims, in
/// floats, x read directly or through a widening cast: its values sum to 0 over those axes.
bool isCentring(Operation *sub, const llvm::SmallDenseSet<int64_t> &reduced) {
  if (!isa_and_nonnull<SubOp>(sub))
    return false;
  auto mean = sub->getOperand(1).getDefiningOp<ReduceMeanOp>();
  if (!mean || !mean.getKeepdims())
    return false;
  Value x = mean.getInput();
  auto shape = tensorOf(x);
  // Floats only: an integer mean truncates, and its residue does not sum to 0.
  if (!shape || !isa<FloatType>(shape.getElementType()) ||
      !isa<FloatType>(tensorOf(sub->getResult(0)).getElementType()))
    return false;
  Value lhs = sub->getOperand(0);
  if (auto convert = lhs.getDefiningOp<CastOp>()) {
    // A widening cast only (exact); a narrowing one rounds x before the sub.
    auto to = dyn_cast<FloatType>(tensorOf(convert.getResult()).getElementType());
    if (!to || to.getWidth() < cast<FloatType>(shape.getElementType()).getWidth())
      return false;
    lhs = convert.getInput();
  }
  if (lhs != x || tensorOf(sub->getResult(0)).getShape() != shape.getShape())
    return false;
  return llvm::all_of(mean.getAxes(), [&](int64_t a) { return reduced.contains(a); });
}

/// Whether `piece` (a concat operand) is centred over axes among `reduced`
/// (the sum's axes, in the piece's dims).
bool isCentredPiece(Value piece, llvm::SmallDenseSet<int64_t> reduced) {
  // Through reshapes that keep a prefix of dims: reduced axes inside it map
  // to themselves; those past it cannot hold A (A must lie in the prefix).
  while (auto reshape = piece.getDefiningOp<ReshapeOp>()) {
    auto in = tensorOf(reshape.getInput()), out = tensorOf(piece);
    if (!in || !out)
      return false;
    int64_t prefix = 0;
    while (prefix < std::min(in.getRank(), out.getRank()) &&
           in.getDimSize(prefix) == out.getDimSize(prefix))
      ++prefix;
    llvm::SmallDenseSet<int64_t> mapped;
    for (int64_t a : reduced)
      if (a < prefix)
        mapped.insert(a);
    reduced = std::move(mapped);
    piece = reshape.getInput();
  }
  // A "lines" region's value is its body's yield (the region's one result).
  if (auto region = piece.getDefiningOp<FusionOp>()) {
    if (region.getKind() != "lines" || region->getNumResults() != 1)
      return false;
    piece = region.getBlock().getTerminator()->getOperand(0);
  }
  return isCentring(piece.getDefiningOp(), reduced);
}

struct ElideCentredSumsPass : public mlir::forge::impl::ElideCentredSumsBase<ElideCentredSumsPass> {
  void runOnOperation() override {
    int marked = 0;
    getOperation().walk([&](ReduceSumOp sum) {
      if (sum.getZeroOutputs() || sum->getParentOfType<FusionOp>())
        return;
      auto concat = sum.getInput().getDefiningOp<ConcatOp>();
      auto shape = tensorOf(sum.getInput());
      if (!concat || !shape)
        return;
      int64_t rank = shape.getRank();
      int64_t axis = concat.getAxis(); // >= 0: the verifier refuses others
      llvm::SmallDenseSet<int64_t> reduced(sum.getAxes().begin(), sum.getAxes().end());
      // The result's elements are the concat axis's positions: every other axis reduced.
      for (int64_t d = 0; d < rank; ++d)
        if ((d == axis) == reduced.contains(d))
          return;
      int64_t offset = 0;
      for (Value piece : concat.getInputs()) {
        int64_t size = tensorOf(piece).getDimSize(axis);
        if (size > 0 && isCentredPiece(piece, reduced)) {
          sum.setZeroOutputsAttr(DenseI64ArrayAttr::get(sum.getContext(), {offset, offset + size}));
          ++marked;
          return;
        }
        offset += size;
      }
    });
    if (marked)
      getOperation().emitRemark() << "forge-elide-centred-sums: " << marked
                                  << " sum(s) with a centred piece written as 0 unread";
    else
      markAllAnalysesPreserved();
  }
};

} // namespace
