//===- ForgeBuilder.h - forge ops built by value ---------------------------===//
//
// Builds forge pointwise ops, scalars, sums and casts at one location with
// inferred result types: what the train-step construction (the optimizer and
// the loss), forge-assign-layout (expanded batch norms) and
// forge-shard-tensor-parallel (the vocabulary-parallel embedding) write their
// math with. Included by those only (it pulls in the ops' declarations).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "forge/Dialect/ForgeDialect.h"
#include "mlir/IR/Builders.h"

#include <algorithm>

namespace mlir::forge {

class ForgeBuilder {
public:
  ForgeBuilder(OpBuilder &b, Location loc) : b(b), loc(loc) {}
  OpBuilder &b;
  Location loc;

  /// A rank-0 constant of `element` (f32 when null).
  Value scalar(double v, Type element = {}) {
    element = element ? element : b.getF32Type();
    auto type = RankedTensorType::get({}, element);
    return b.create<ConstantOp>(loc, DenseElementsAttr::get(type, b.getFloatAttr(element, v)));
  }
  /// A rank-0 integer constant of `element` (i64 when null).
  Value intScalar(int64_t v, Type element = {}) {
    element = element ? element : b.getI64Type();
    auto type = RankedTensorType::get({}, element);
    return b.create<ConstantOp>(loc, DenseElementsAttr::get(type, b.getIntegerAttr(element, v)));
  }
  /// This rank's `r * stride` as a [1] i64 tensor, r its place in the `size`
  /// ranks of `group`: forge.rank_slice of the constant [0, stride, ..]. A
  /// vocabulary-parallel shard's first class (stride: the classes per rank).
  Value rankOffset(StringRef group, int64_t size, int64_t stride) {
    SmallVector<int64_t> offsets;
    for (int64_t r = 0; r < size; ++r)
      offsets.push_back(r * stride);
    auto whole = RankedTensorType::get({size}, b.getI64Type());
    Value c = b.create<ConstantOp>(loc, DenseElementsAttr::get(whole, ArrayRef<int64_t>(offsets)));
    return b.create<RankSliceOp>(loc, RankedTensorType::get({1}, b.getI64Type()), c, group, size)
        .getResult();
  }
  Value add(Value x, Value y) { return b.create<AddOp>(loc, x, y); }
  Value sub(Value x, Value y) { return b.create<SubOp>(loc, x, y); }
  Value mul(Value x, Value y) { return b.create<MulOp>(loc, x, y); }
  Value div(Value x, Value y) { return b.create<DivOp>(loc, x, y); }
  Value max(Value x, Value y) { return b.create<MaxOp>(loc, x, y); }
  Value sqrt(Value x) { return b.create<SqrtOp>(loc, x); }
  Value exp(Value x) { return b.create<ExpOp>(loc, x); }
  Value log(Value x) { return b.create<LogOp>(loc, x); }
  Value where(Value c, Value x, Value y) { return b.create<WhereOp>(loc, c, x, y); }
  Value less(Value x, Value y) { return b.create<LessOp>(loc, x, y); }
  Value greater(Value x, Value y) { return b.create<GreaterOp>(loc, x, y); }
  Value logicalAnd(Value x, Value y) { return b.create<AndOp>(loc, x, y); }
  Value reduceSum(Value x, ArrayRef<int64_t> axes, bool keepdims) {
    return b.create<ReduceSumOp>(loc, x, b.getDenseI64ArrayAttr(axes), b.getBoolAttr(keepdims));
  }
  Value reduceMax(Value x, ArrayRef<int64_t> axes, bool keepdims) {
    return b.create<ReduceMaxOp>(loc, x, b.getDenseI64ArrayAttr(axes), b.getBoolAttr(keepdims));
  }
  /// Whether 0 <= x < n, for integer x (a class index and a shard's width).
  Value inRange(Value x, int64_t n) {
    Type e = elementOf(x);
    return logicalAnd(greater(x, intScalar(-1, e)), less(x, intScalar(n, e)));
  }
  Value reciprocal(Value x) { return b.create<ReciprocalOp>(loc, x); }
  Value mulScalar(Value x, double s) { return mul(x, scalar(s, elementOf(x))); }
  Value sumAll(Value x) {
    auto type = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < type.getRank(); ++d)
      axes.push_back(d);
    if (axes.empty())
      return x;
    return b.create<ReduceSumOp>(loc, x, b.getDenseI64ArrayAttr(axes), b.getBoolAttr(false));
  }
  Value meanAll(Value x) {
    auto type = cast<RankedTensorType>(x.getType());
    return mulScalar(sumAll(x), 1.0 / std::max<int64_t>(1, type.getNumElements()));
  }
  Value reshape(Value x, ArrayRef<int64_t> shape) {
    if (cast<RankedTensorType>(x.getType()).getShape() == shape)
      return x;
    return b.create<ReshapeOp>(loc, x, b.getDenseI64ArrayAttr(shape));
  }
  Value castTo(Value x, Type element) {
    if (elementOf(x) == element)
      return x;
    return b.create<CastOp>(loc, x, TypeAttr::get(element), b.getBoolAttr(true));
  }
  static Type elementOf(Value v) { return cast<RankedTensorType>(v.getType()).getElementType(); }
};

/// The `forge.shard` attribute of a value split over a group of ranks
/// ({axis, group, size}, and blocks when > 1): on a split parameter and its
/// state (forge-build-train-step) and on a logits output split by vocabulary
/// (forge-shard-tensor-parallel).
inline DictionaryAttr shardSpec(Builder &b, int64_t axis, StringRef group, int64_t size,
                                int64_t blocks = 1) {
  SmallVector<NamedAttribute> attrs = {b.getNamedAttr("axis", b.getI64IntegerAttr(axis)),
                                       b.getNamedAttr("group", b.getStringAttr(group)),
                                       b.getNamedAttr("size", b.getI64IntegerAttr(size))};
  if (blocks > 1)
    attrs.push_back(b.getNamedAttr("blocks", b.getI64IntegerAttr(blocks)));
  return b.getDictionaryAttr(attrs);
}

} // namespace mlir::forge
