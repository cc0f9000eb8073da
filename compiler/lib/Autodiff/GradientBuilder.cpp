//===- GradientBuilder.cpp - forge op construction for gradient rules -----===//
//
// Ops are built generically (OperationState + the op's own type inference),
// like the importer's NodeImporter::create: the ODS builders abort when
// inference fails, and a rule bug must become a diagnostic, not a crash.
//
//===----------------------------------------------------------------------===//
#include "forge/Autodiff/GradientBuilder.h"

#include "forge/Dialect/ForgeDialect.h"

#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace mlir::forge;

bool mlir::forge::isFloatTensor(Value v) {
  auto t = v ? dyn_cast<RankedTensorType>(v.getType()) : RankedTensorType();
  return t && isa<FloatType>(t.getElementType());
}

SmallVector<Value> GradientBuilder::create(StringRef name, ValueRange operands,
                                           ArrayRef<NamedAttribute> attrs) {
  // A failed creation returns no results at all; callers check failed().
  auto nulls = []() { return SmallVector<Value>(); };
  if (llvm::any_of(operands, [](Value v) { return !v; })) {
    hasFailed = true; // an earlier failure already reported
    return nulls();
  }
  auto built = buildForgeOp(b, loc, name, operands, attrs, [&]() {
    return emitError(loc) << "internal: gradient rule: ";
  });
  if (::mlir::failed(built)) {
    hasFailed = true;
    return nulls();
  }
  return SmallVector<Value>((*built)->getResults());
}

Value GradientBuilder::create1(StringRef name, ValueRange operands,
                               ArrayRef<NamedAttribute> attrs) {
  SmallVector<Value> results = create(name, operands, attrs);
  return results.empty() ? Value() : results.front();
}

NamedAttribute GradientBuilder::attr(StringRef name, bool value) {
  return b.getNamedAttr(name, b.getBoolAttr(value));
}
NamedAttribute GradientBuilder::attr(StringRef name, int64_t value) {
  return b.getNamedAttr(name, b.getI64IntegerAttr(value));
}
NamedAttribute GradientBuilder::attr(StringRef name, double value) {
  return b.getNamedAttr(name, b.getF64FloatAttr(value));
}
NamedAttribute GradientBuilder::attr(StringRef name, ArrayRef<int64_t> values) {
  return b.getNamedAttr(name, b.getDenseI64ArrayAttr(values));
}
NamedAttribute GradientBuilder::attr(StringRef name, StringRef value) {
  return b.getNamedAttr(name, b.getStringAttr(value));
}
NamedAttribute GradientBuilder::attr(StringRef name, Type value) {
  return b.getNamedAttr(name, TypeAttr::get(value));
}
NamedAttribute GradientBuilder::attr(StringRef name, Attribute value) {
  return b.getNamedAttr(name, value);
}

Value GradientBuilder::splat(RankedTensorType type, double value) {
  Type element = type.getElementType();
  Attribute v = isa<FloatType>(element) ? Attribute(b.getFloatAttr(element, value))
                                        : Attribute(b.getIntegerAttr(element, (int64_t)value));
  return b.create<ConstantOp>(loc, DenseElementsAttr::get(type, v));
}

Value GradientBuilder::scalar(Type element, double value) {
  return splat(RankedTensorType::get({}, element), value);
}

Value GradientBuilder::scalarLike(Value like, double value) {
  if (!like)
    return {};
  return scalar(cast<RankedTensorType>(like.getType()).getElementType(), value);
}

Value GradientBuilder::mulScalar(Value a, double value) {
  if (value == 1.0)
    return a;
  return mul(a, scalarLike(a, value));
}

Value GradientBuilder::addScalar(Value a, double value) { return add(a, scalarLike(a, value)); }

Value GradientBuilder::castTo(Value a, Type element) {
  if (!a || cast<RankedTensorType>(a.getType()).getElementType() == element)
    return a;
  return create1("cast", {a}, {attr("to", element)});
}

Value GradientBuilder::maskedOrZero(Value cond, Value g) {
  return where(cond, g, scalarLike(g, 0.0));
}

Value GradientBuilder::reshape(Value a, ArrayRef<int64_t> shape) {
  if (!a || cast<RankedTensorType>(a.getType()).getShape() == shape)
    return a;
  return create1("reshape", {a}, {attr("shape", shape)});
}

Value GradientBuilder::transpose(Value a, ArrayRef<int64_t> perm) {
  return create1("transpose", {a}, {attr("perm", perm)});
}

Value GradientBuilder::transposeLast2(Value a) {
  if (!a)
    return a;
  int64_t rank = cast<RankedTensorType>(a.getType()).getRank();
  SmallVector<int64_t> perm = llvm::to_vector(llvm::seq<int64_t>(0, rank));
  std::swap(perm[rank - 1], perm[rank - 2]);
  return transpose(a, perm);
}

Value GradientBuilder::broadcastTo(Value a, ArrayRef<int64_t> shape) {
  if (!a || cast<RankedTensorType>(a.getType()).getShape() == shape)
    return a;
  return create1("broadcast", {a}, {attr("shape", shape)});
}

Value GradientBuilder::reduceSum(Value a, ArrayRef<int64_t> axes, bool keepdims) {
  return create1("reduce_sum", {a}, {attr("axes", axes), attr("keepdims", keepdims)});
}

Value GradientBuilder::sumToType(Value g, Type target) {
  if (!g || g.getType() == target)
    return g;
  auto src = cast<RankedTensorType>(g.getType());
  auto dst = cast<RankedTensorType>(target);
  int64_t lead = src.getRank() - dst.getRank();
  SmallVector<int64_t> axes;
  for (int64_t d = 0; d < src.getRank(); ++d) {
    int64_t j = d - lead;
    if (j < 0 ? src.getDimSize(d) != 1 : dst.getDimSize(j) == 1 && src.getDimSize(d) != 1)
      axes.push_back(d);
  }
  Value sum = axes.empty() ? g : reduceSum(g, axes, /*keepdims=*/true);
  return castTo(reshape(sum, dst.getShape()), dst.getElementType());
}

Value GradientBuilder::slice(Value a, ArrayRef<int64_t> starts, ArrayRef<int64_t> ends,
                             ArrayRef<int64_t> steps) {
  return create1("slice", {a}, {attr("starts", starts), attr("ends", ends), attr("steps", steps)});
}

Value GradientBuilder::padConstant(Value a, ArrayRef<int64_t> pads) {
  return create1("pad", {a},
                 {attr("pads", pads), attr("mode", StringRef("constant")), attr("value", 0.0)});
}

Value GradientBuilder::concat(ValueRange values, int64_t axis) {
  if (values.size() == 1)
    return values.front();
  return create1("concat", values, {attr("axis", axis)});
}
