//===- RuleUtils.h - shared helpers of the gradient rule files ------------===//
//
// Private to compiler/lib/Autodiff. Every rule defines
// `OP::buildGradientRule` (declared for each differentiable op by Forge_Op)
// and is called only through DifferentiableOpInterface::buildGradient, which
// guarantees: at least one result gradient is non-null, some result and some
// operand are float tensors; and checks afterwards that exactly one gradient
// per operand was appended, each null or of the operand's type.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_LIB_AUTODIFF_RULEUTILS_H
#define FORGE_LIB_AUTODIFF_RULEUTILS_H

#include "forge/Autodiff/GradientBuilder.h"
#include "forge/Dialect/ForgeDialect.h"

#define FORGE_GRADIENT(OP)                                                                         \
  ::llvm::LogicalResult mlir::forge::OP::buildGradientRule(                                        \
      ::mlir::OpBuilder &builder, ::mlir::ValueRange resultGrads,                                  \
      ::llvm::SmallVectorImpl<::mlir::Value> &operandGrads)

namespace mlir::forge::autodiff {

inline RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }
inline ArrayRef<int64_t> shapeOf(Value v) { return tensorType(v).getShape(); }
inline Type elementOf(Value v) { return tensorType(v).getElementType(); }

/// `make()` summed back to `operand`'s (broadcast) type, or null without
/// building anything when `operand` is not a float tensor.
template <typename Make> Value gradientFor(GradientBuilder &gb, Value operand, Make &&make) {
  if (!isFloatTensor(operand))
    return Value();
  return gb.sumToType(make(), operand.getType());
}

/// `v` (same element count) reshaped and cast to `type` (per-channel
/// parameters of any shape holding C elements).
inline Value asType(GradientBuilder &gb, Value v, Type type) {
  auto t = cast<RankedTensorType>(type);
  return gb.castTo(gb.reshape(v, t.getShape()), t.getElementType());
}

} // namespace mlir::forge::autodiff

#endif // FORGE_LIB_AUTODIFF_RULEUTILS_H
