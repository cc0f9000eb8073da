//===- GradientBuilder.h - forge op construction for gradient rules -------===//
//
// A small builder the gradient rules (compiler/lib/Autodiff) and the training
// graph builder use to create forge ops by name with inferred result types.
//
// Invariants:
//   * every op is created at the wrapped OpBuilder's insertion point with one
//     Location (the forward op's), and is type-inferred and verified before
//     it is kept: a rule can never leave an ill-typed op behind;
//   * errors are sticky: a failed creation emits one diagnostic, returns null,
//     and every later call with a null operand returns null without another
//     diagnostic, so a rule can chain calls and check `failed()` once;
//   * helpers that would be identities (same-shape sum-to-shape, reshape to
//     the same shape, cast to the same type) create nothing.
//
// An MLIR-heavy header: include it only from compiler-side code.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_AUTODIFF_GRADIENTBUILDER_H
#define FORGE_AUTODIFF_GRADIENTBUILDER_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

namespace mlir::forge {

/// True when `v` is a ranked tensor with a float element type (the values
/// gradients flow through).
bool isFloatTensor(Value v);

class GradientBuilder {
public:
  GradientBuilder(OpBuilder &builder, Location loc) : b(builder), loc(loc) {}

  OpBuilder &builder() { return b; }
  Location getLoc() const { return loc; }
  /// Whether any creation failed (a diagnostic was emitted).
  bool failed() const { return hasFailed; }
  LogicalResult status() const { return hasFailed ? failure() : success(); }

  /// Creates `forge.<name>` with `operands` (all present) and inherent
  /// attributes `attrs`; returns its results, or nothing when an operand is
  /// null or inference or verification fails.
  SmallVector<Value> create(StringRef name, ValueRange operands,
                            ArrayRef<NamedAttribute> attrs = {});
  /// create() for single-result ops (null on failure).
  Value create1(StringRef name, ValueRange operands, ArrayRef<NamedAttribute> attrs = {});

  // Attributes in the dialect's conventions (F64Attr, I64Attr, BoolAttr, ...).
  NamedAttribute attr(StringRef name, bool value);
  NamedAttribute attr(StringRef name, int64_t value);
  NamedAttribute attr(StringRef name, double value);
  NamedAttribute attr(StringRef name, ArrayRef<int64_t> values);
  NamedAttribute attr(StringRef name, StringRef value);
  NamedAttribute attr(StringRef name, Type value);
  NamedAttribute attr(StringRef name, Attribute value);

  // Constants.
  /// A rank-0 constant of element type `element`.
  Value scalar(Type element, double value);
  /// A rank-0 constant with `like`'s element type.
  Value scalarLike(Value like, double value);
  /// A splat constant of `type`.
  Value splat(RankedTensorType type, double value);

  // Elementwise (NumPy broadcasting).
  Value add(Value a, Value c) { return create1("add", {a, c}); }
  Value sub(Value a, Value c) { return create1("sub", {a, c}); }
  Value mul(Value a, Value c) { return create1("mul", {a, c}); }
  Value div(Value a, Value c) { return create1("div", {a, c}); }
  Value pow(Value a, Value c) { return create1("pow", {a, c}); }
  Value neg(Value a) { return create1("neg", {a}); }
  Value exp(Value a) { return create1("exp", {a}); }
  Value log(Value a) { return create1("log", {a}); }
  Value sqrt(Value a) { return create1("sqrt", {a}); }
  Value reciprocal(Value a) { return create1("reciprocal", {a}); }
  Value tanh(Value a) { return create1("tanh", {a}); }
  Value sigmoid(Value a) { return create1("sigmoid", {a}); }
  Value erf(Value a) { return create1("erf", {a}); }
  Value sin(Value a) { return create1("sin", {a}); }
  Value cos(Value a) { return create1("cos", {a}); }
  Value sinh(Value a) { return create1("sinh", {a}); }
  Value cosh(Value a) { return create1("cosh", {a}); }
  /// a * value, a + value (value a scalar of a's element type).
  Value mulScalar(Value a, double value);
  Value addScalar(Value a, double value);
  Value less(Value a, Value c) { return create1("less", {a, c}); }
  Value greater(Value a, Value c) { return create1("greater", {a, c}); }
  Value lessEqual(Value a, Value c) { return create1("less_equal", {a, c}); }
  Value greaterEqual(Value a, Value c) { return create1("greater_equal", {a, c}); }
  Value equal(Value a, Value c) { return create1("equal", {a, c}); }
  Value logicalAnd(Value a, Value c) { return create1("and", {a, c}); }
  Value where(Value cond, Value x, Value y) { return create1("where", {cond, x, y}); }
  /// `a` converted to element type `element` (no op when it already is).
  Value castTo(Value a, Type element);
  /// where(cond, g, 0).
  Value maskedOrZero(Value cond, Value g);

  // Shapes.
  /// `a` with `shape` (no op when it already has it).
  Value reshape(Value a, ArrayRef<int64_t> shape);
  Value transpose(Value a, ArrayRef<int64_t> perm);
  /// Swaps the last two dims.
  Value transposeLast2(Value a);
  Value broadcastTo(Value a, ArrayRef<int64_t> shape);
  Value reduceSum(Value a, ArrayRef<int64_t> axes, bool keepdims);
  /// Reverses NumPy broadcasting: sums `g` over the dims where `target` was
  /// broadcast (leading dims and size-1 dims) and reshapes to `target`'s shape,
  /// then casts to its element type. No op when the types already agree.
  Value sumToType(Value g, Type target);
  Value matmul(Value a, Value c) { return create1("matmul", {a, c}); }
  Value slice(Value a, ArrayRef<int64_t> starts, ArrayRef<int64_t> ends, ArrayRef<int64_t> steps);
  Value padConstant(Value a, ArrayRef<int64_t> pads);
  Value concat(ValueRange values, int64_t axis);

private:
  OpBuilder &b;
  Location loc;
  bool hasFailed = false;
};

} // namespace mlir::forge

#endif // FORGE_AUTODIFF_GRADIENTBUILDER_H
