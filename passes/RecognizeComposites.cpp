//===- RecognizeComposites.cpp - one op for what exporters decompose --------===//
//
// Exporters spell some ops as chains of elementwise ops (PyTorch below opset
// 20 writes the tanh GELU as 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
// One op is what later stages can reason about: its own gradient rule, and a
// GEMM epilogue that computes it. The chain's ops are left dead (the
// import-cleanup stage's dead-code elimination follows).
//
// A match needs the exact constants (within 1e-6, relative) as one-element
// forge.constant operands, and every intermediate read by the chain alone.
// Nothing is folded: initializers are still constants here.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/Builders.h"

#include <cmath>

namespace mlir::forge {
#define GEN_PASS_DEF_RECOGNIZECOMPOSITES
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// Whether `v` is a one-element constant equal to `want`.
bool isScalar(Value v, double want) {
  auto c = v.getDefiningOp<ConstantOp>();
  if (!c)
    return false;
  auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
  if (!dense || dense.getNumElements() != 1 || !isa<FloatType>(dense.getElementType()))
    return false;
  double got = (*dense.getValues<APFloat>().begin()).convertToDouble();
  return std::abs(got - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

/// The operand of the binary op defining `v` that is not `known` (either
/// order), or null; `v` must be read once (by the chain).
template <typename OpT> Value otherOperand(Value v, function_ref<bool(Value)> known) {
  auto op = v.getDefiningOp<OpT>();
  if (!op || !v.hasOneUse())
    return nullptr;
  if (known(op.getLhs()))
    return op.getRhs();
  if (known(op.getRhs()))
    return op.getLhs();
  return nullptr;
}

/// v = x * x * x (mul(x, mul(x, x)) in either order, or pow(x, 3)).
bool isCube(Value v, Value x) {
  if (auto pow = v.getDefiningOp<PowOp>())
    return v.hasOneUse() && pow.getLhs() == x && isScalar(pow.getRhs(), 3.0);
  Value sq = otherOperand<MulOp>(v, [&](Value u) { return u == x; });
  if (!sq)
    return false;
  auto square = sq.getDefiningOp<MulOp>();
  return square && sq.hasOneUse() && square.getLhs() == x && square.getRhs() == x;
}

/// v = 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)), the tail of the tanh GELU.
bool isTanhTail(Value v, Value x) {
  Value t = otherOperand<AddOp>(v, [](Value u) { return isScalar(u, 1.0); });
  auto tanh = t ? t.getDefiningOp<TanhOp>() : TanhOp();
  if (!tanh || !t.hasOneUse())
    return false;
  Value inner = otherOperand<MulOp>(tanh.getInput(),
                                    [](Value u) { return isScalar(u, std::sqrt(2.0 / M_PI)); });
  if (!inner)
    return false;
  Value w = otherOperand<AddOp>(inner, [&](Value u) { return u == x; });
  if (!w)
    return false;
  Value cube = otherOperand<MulOp>(w, [](Value u) { return isScalar(u, 0.044715); });
  return cube && isCube(cube, x);
}

/// The x of a tanh GELU rooted at `root`, 0.5 * (x * tail) or (0.5 * x) * tail
/// (any operand order), or null.
Value tanhGeluInput(MulOp root) {
  Type type = root.getType();
  for (auto [a, b] : {std::pair(root.getLhs(), root.getRhs()), std::pair(root.getRhs(), root.getLhs())}) {
    // 0.5 * (x * tail)
    if (isScalar(b, 0.5))
      if (auto m = a.getDefiningOp<MulOp>(); m && a.hasOneUse())
        for (auto [x, tail] : {std::pair(m.getLhs(), m.getRhs()), std::pair(m.getRhs(), m.getLhs())})
          if (x.getType() == type && isTanhTail(tail, x))
            return x;
    // (0.5 * x) * tail
    if (auto h = a.getDefiningOp<MulOp>(); h && a.hasOneUse())
      for (auto [x, half] : {std::pair(h.getLhs(), h.getRhs()), std::pair(h.getRhs(), h.getLhs())})
        if (x.getType() == type && isScalar(half, 0.5) && isTanhTail(b, x))
          return x;
  }
  return nullptr;
}

struct RecognizeCompositesPass
    : public mlir::forge::impl::RecognizeCompositesBase<RecognizeCompositesPass> {
  void runOnOperation() override {
    bool changed = false;
    SmallVector<MulOp> roots;
    getOperation().walk([&](MulOp op) { roots.push_back(op); });
    for (MulOp root : roots) {
      auto type = dyn_cast<RankedTensorType>(root.getType());
      if (!type || !isa<FloatType>(type.getElementType()))
        continue;
      Value x = tanhGeluInput(root);
      if (!x)
        continue;
      OpBuilder b(root);
      auto gelu = b.create<GeluOp>(root.getLoc(), root.getType(), x, b.getStringAttr("tanh"));
      root.getResult().replaceAllUsesWith(gelu.getResult());
      root.erase(); // the rest of the chain is dead now
      changed = true;
    }
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace
