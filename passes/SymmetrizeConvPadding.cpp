//===- SymmetrizeConvPadding.cpp - asymmetric conv padding as explicit pads -===//
//
// cuDNN pads each spatial dim by the same amount at both ends. A conv or
// conv_grad_weight whose pads differ (TF-style SAME padding with even windows
// or strides) becomes a constant-zero `pad` of its input by the difference,
// then the op with the smaller (now symmetric) pads; a conv_transpose (whose
// pads crop its output) gets the smaller pads and a negative `pad` (a crop) of
// the difference on its result. The ops' results are unchanged.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SYMMETRIZECONVPADDING
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// The symmetric part of `pads` (all begins, then all ends) and what is left
/// at each end; nullopt when `pads` is already symmetric.
struct PadSplit {
  SmallVector<int64_t> symmetric, extraBegin, extraEnd;
};
std::optional<PadSplit> splitPads(ArrayRef<int64_t> pads) {
  size_t spatial = pads.size() / 2;
  PadSplit s;
  bool asymmetric = false;
  for (size_t d = 0; d < spatial; ++d) {
    int64_t m = std::min(pads[d], pads[d + spatial]);
    s.symmetric.push_back(m);
    s.extraBegin.push_back(pads[d] - m);
    s.extraEnd.push_back(pads[d + spatial] - m);
    asymmetric |= pads[d] != pads[d + spatial];
  }
  if (!asymmetric)
    return std::nullopt;
  s.symmetric.append(SmallVector<int64_t>(s.symmetric));
  return s;
}

/// forge.pad of `value` (NC<spatial>) by `begin`/`end` on the spatial dims
/// (negative: crop), with zeros.
Value padSpatial(OpBuilder &b, Location loc, Value value, ArrayRef<int64_t> begin,
                 ArrayRef<int64_t> end, int64_t sign) {
  auto type = cast<RankedTensorType>(value.getType());
  SmallVector<int64_t> pads(2, 0), ends(2, 0), shape(type.getShape());
  for (size_t d = 0; d < begin.size(); ++d) {
    pads.push_back(sign * begin[d]);
    ends.push_back(sign * end[d]);
    shape[d + 2] += sign * (begin[d] + end[d]);
  }
  pads.append(ends);
  return b.create<PadOp>(loc, RankedTensorType::get(shape, type.getElementType()), value,
                         b.getDenseI64ArrayAttr(pads), b.getStringAttr("constant"),
                         b.getF64FloatAttr(0.0));
}

struct SymmetrizeConvPaddingPass
    : public mlir::forge::impl::SymmetrizeConvPaddingBase<SymmetrizeConvPaddingPass> {
  void runOnOperation() override {
    bool changed = false;
    getOperation().walk([&](Operation *op) {
      if (isa<ConvOp, ConvGradWeightOp>(op)) {
        auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
        auto split = pads ? splitPads(pads.asArrayRef()) : std::nullopt;
        if (!split)
          return;
        OpBuilder b(op);
        op->setOperand(0, padSpatial(b, op->getLoc(), op->getOperand(0), split->extraBegin,
                                     split->extraEnd, +1));
        op->setAttr("pads", b.getDenseI64ArrayAttr(split->symmetric));
        changed = true;
      } else if (auto ct = dyn_cast<ConvTransposeOp>(op)) {
        auto split = splitPads(ct.getPads());
        if (!split)
          return;
        OpBuilder b(op);
        auto type = cast<RankedTensorType>(ct.getType());
        SmallVector<int64_t> full(type.getShape());
        for (size_t d = 0; d < split->extraBegin.size(); ++d)
          full[d + 2] += split->extraBegin[d] + split->extraEnd[d];
        auto wide = cast<ConvTransposeOp>(b.clone(*op));
        wide.getResult().setType(RankedTensorType::get(full, type.getElementType()));
        wide.setPads(split->symmetric);
        Value cropped = padSpatial(b, op->getLoc(), wide.getResult(), split->extraBegin,
                                   split->extraEnd, -1);
        op->getResult(0).replaceAllUsesWith(cropped);
        op->erase();
        changed = true;
      }
    });
    if (!changed)
      markAllAnalysesPreserved();
  }
};
} // namespace
