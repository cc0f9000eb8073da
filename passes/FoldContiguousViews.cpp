//===- FoldContiguousViews.cpp - slices and concats as byte ranges ---------===//
//
// A slice whose result is one contiguous run of its operand's elements (the
// leading rows of a padded weight's gradient, a chunk of the tokens for the
// loss head) is those bytes: it gets `forge.placement = "view"`, no
// instruction runs, and forge-plan-memory places its result in its operand's
// bytes at the slice's offset. A concat along its leading axis (every
// dimension before the axis of size 1) whose pieces are contiguous runs of
// its result, each made by an op for this concat alone, gets the view
// placement too: each maker writes its piece where the concat lies
// (forge-plan-memory plans the makers' results at the pieces' offsets). The
// loss head's chunks (forge-chunk-cross-entropy) are both: GPT-2 124M bf16
// sliced 4 x 2 of its inputs and concatenated its 4 input gradients, and
// sliced the padded LM head's gradient to the vocabulary (155 MB each step).
//
// Offsets must keep a bundle tensor's alignment (64 bytes). Not for a
// routine's arguments (persistent tensors lie outside the arena) nor its
// results (a buffer of their own); a piece made by a reshape or a view is
// already another tensor's bytes. CUDA placement, after
// forge-fold-attention-views (whose strided concats it leaves alone) and
// before the kernel generator, which would give them kernels.
//===----------------------------------------------------------------------===//
#include "Passes.h"
#include "StreamOrder.h"

#include "forge/Conversion/Conversion.h"
#include "forge/runtime/Bundle.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FOLDCONTIGUOUSVIEWS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

constexpr int64_t kAlign = static_cast<int64_t>(::forge::rt::kSectionAlignment);

bool returned(Value v) {
  return llvm::any_of(v.getUsers(), [](Operation *user) { return isa<func::ReturnOp>(user); });
}

/// The byte offset of `slice`'s result in its operand when the result is one
/// contiguous run of it (steps 1; full dims after the first sliced one, size-1
/// dims before it), else none.
std::optional<int64_t> contiguousOffset(SliceOp slice) {
  auto in = dyn_cast<RankedTensorType>(slice.getInput().getType());
  auto out = dyn_cast<RankedTensorType>(slice.getType());
  // The same element type: a slice may also convert (forge-assign-precision's
  // mixed storage), which a view of the bytes cannot.
  if (!in || !out || !in.hasStaticShape() || !out.hasStaticShape() || out.getNumElements() == 0 ||
      in.getElementType() != out.getElementType())
    return std::nullopt;
  if (llvm::any_of(slice.getSteps(), [](int64_t s) { return s != 1; }))
    return std::nullopt;
  const int64_t rank = in.getRank();
  int64_t first = rank; // the first dim the slice shortens
  for (int64_t d = 0; d < rank && first == rank; ++d)
    if (out.getDimSize(d) != in.getDimSize(d))
      first = d;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < first && out.getDimSize(d) != 1)
      return std::nullopt; // outer rows of the run apart
    if (d > first && out.getDimSize(d) != in.getDimSize(d))
      return std::nullopt; // inner rows cut short: runs apart
  }
  return sliceFirstElement(slice) *
         static_cast<int64_t>(::forge::rt::dtypeSize(dtypeFromType(in.getElementType())));
}

bool foldSlice(SliceOp slice) {
  // An op result in the arena (a large constant stays a constant).
  Operation *def = slice.getInput().getDefiningOp();
  if (!def || isa<ConstantOp>(def) || returned(slice.getResult()))
    return false;
  std::optional<int64_t> offset = contiguousOffset(slice);
  if (!offset || *offset % kAlign != 0)
    return false;
  slice->setAttr("forge.placement", StringAttr::get(slice.getContext(), "view"));
  return true;
}

bool foldConcat(ConcatOp concat) {
  if (isViewOp(concat))
    return false; // forge-fold-attention-views' strided pieces
  auto out = dyn_cast<RankedTensorType>(concat.getType());
  if (!out || !out.hasStaticShape() || out.getNumElements() == 0 || returned(concat.getResult()))
    return false;
  int64_t axis = static_cast<int64_t>(concat.getAxis());
  if (axis < 0)
    axis += out.getRank();
  for (int64_t d = 0; d < axis; ++d)
    if (out.getDimSize(d) != 1)
      return false; // pieces interleave
  if (!piecesAligned(out, axis, concat.getInputs().getTypes()))
    return false;
  for (Value piece : concat.getInputs()) {
    if (cast<RankedTensorType>(piece.getType()).getElementType() != out.getElementType())
      return false; // a converting concat
    Operation *maker = piece.getDefiningOp();
    if (!maker || maker->getBlock() != concat->getBlock() || !piece.hasOneUse() ||
        isa<ConstantOp, ReshapeOp>(maker) || isViewOp(maker) ||
        maker->hasAttr("forge.out_row_strides") || llvm::count(concat.getInputs(), piece) != 1)
      return false;
  }
  concat->setAttr("forge.placement", StringAttr::get(concat.getContext(), "view"));
  return true;
}

struct FoldContiguousViewsPass
    : public mlir::forge::impl::FoldContiguousViewsBase<FoldContiguousViewsPass> {
  void runOnOperation() override {
    bool changed = false;
    Block &body = getOperation().getBody().front();
    for (auto slice : llvm::to_vector(body.getOps<SliceOp>()))
      changed |= foldSlice(slice);
    for (auto concat : llvm::to_vector(body.getOps<ConcatOp>()))
      changed |= foldConcat(concat);
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace
