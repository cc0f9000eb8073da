//===- ForgeBuilder.h - forge ops built by value ---------------------------===//
//
// Builds forge pointwise ops, scalars, sums and casts at one location with
// inferred result types: what the train-step construction (the optimizer and
// the loss) and forge-assign-layout (expanded batch norms) write their math
// with. Included by those two only (it pulls in the ops' declarations).
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
  Value add(Value x, Value y) { return b.create<AddOp>(loc, x, y); }
  Value sub(Value x, Value y) { return b.create<SubOp>(loc, x, y); }
  Value mul(Value x, Value y) { return b.create<MulOp>(loc, x, y); }
  Value div(Value x, Value y) { return b.create<DivOp>(loc, x, y); }
  Value max(Value x, Value y) { return b.create<MaxOp>(loc, x, y); }
  Value sqrt(Value x) { return b.create<SqrtOp>(loc, x); }
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

} // namespace mlir::forge
