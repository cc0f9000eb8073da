//===- Indexing.cpp - data-movement kernels ---------------------------------===//
//
// Kernels that move elements by computed indices: gather/scatter and their
// gradients, gather_elements/scatter_elements, concat/split, pad/tile/trilu,
// slice and pad gradients, one_hot. Indices are checked (Body::fault) and
// clamped as the CPU kernels do.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

namespace mlir::forge::kernelgen {
/// [P, A, Q] around `axis` of `shape`.
std::array<int64_t, 3> aroundAxis(ArrayRef<int64_t> shape, int64_t axis) {
  int64_t p = 1, q = 1;
  for (int64_t d = 0; d < axis; ++d)
    p *= shape[d];
  for (int64_t d = axis + 1; d < static_cast<int64_t>(shape.size()); ++d)
    q *= shape[d];
  return {p, shape[axis], q};
}

int64_t normalizedAxis(Operation *op, int64_t rank) {
  int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
  return axis < 0 ? axis + rank : axis;
}

/// Input index of padded position `s` (output index minus the begin pad) in a
/// dim of extent n, as the CPU's padSourceIndex; constant mode clamps and
/// clears `valid` outside.
Value padSource(Body &k, Value s, int64_t n, StringRef mode, Value &valid) {
  OpBuilder &b = k.b;
  auto srem = [&](Value a, int64_t m) { // ((a % m) + m) % m on signed values
    Value r = b.create<arith::RemSIOp>(k.loc, a, k.idx(m));
    return b.create<arith::RemSIOp>(k.loc, k.add(r, k.idx(m)), k.idx(m));
  };
  auto clampIdx = [&](Value v) {
    return b.create<arith::MinSIOp>(k.loc, b.create<arith::MaxSIOp>(k.loc, v, k.idx(0)),
                                    k.idx(n - 1));
  };
  if (mode == "constant") {
    Value lo = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, s, k.idx(0));
    Value hi = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, s, k.idx(n));
    valid = b.create<arith::AndIOp>(k.loc, valid, b.create<arith::AndIOp>(k.loc, lo, hi));
    return clampIdx(s);
  }
  if (mode == "edge")
    return clampIdx(s);
  if (mode == "wrap")
    return srem(s, n);
  if (n == 1) // reflect
    return k.idx(0);
  int64_t period = 2 * (n - 1);
  Value r = srem(s, period);
  Value back = b.create<arith::SubIOp>(k.loc, k.idx(period), r);
  Value over = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, r, k.idx(n));
  return b.create<arith::SelectOp>(k.loc, over, back, r);
}

/// An index operand value as `index`, negative values counted from `size`. One
/// outside [-size, size) is a fault (Body::fault); it is then clamped into
/// [0, size) so that the kernel still reads and writes in bounds. The check and
/// the clamp happen in the index's own width: kernels use a 32-bit `index`, so
/// casting first would make an int64 index 2^32 + 3 read element 3 silently.
Value loadIndex(Body &k, Value memref, Value at, int64_t size) {
  Value raw = k.b.create<memref::LoadOp>(k.loc, memref, at);
  Type t = raw.getType();
  auto c = [&](int64_t v) { return intConst(k, t, v); };
  Value neg = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, raw, c(0));
  Value i = k.b.create<arith::SelectOp>(k.loc, neg, k.b.create<arith::AddIOp>(k.loc, raw, c(size)),
                                        raw);
  k.fault(k.b.create<arith::OrIOp>(
      k.loc, k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, i, c(0)),
      k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, i, c(size))));
  i = k.b.create<arith::MaxSIOp>(k.loc, i, c(0));
  i = k.b.create<arith::MinSIOp>(k.loc, i, c(size - 1));
  return k.b.create<arith::IndexCastOp>(k.loc, k.b.getIndexType(), i);
}

/// A class target of nll_loss (or its gradient): the raw value and the class
/// clamped into [0, classes) as `index`, clamped in the target's own width
/// (see loadIndex). Whether the raw value was in range is the caller's check.
std::pair<Value, Value> loadTarget(Body &k, Value memref, Value at, int64_t classes) {
  Value raw = k.b.create<memref::LoadOp>(k.loc, memref, at);
  Type t = raw.getType();
  Value tc = k.b.create<arith::MaxSIOp>(k.loc, raw, intConst(k, t, 0));
  tc = k.b.create<arith::MinSIOp>(k.loc, tc, intConst(k, t, classes - 1));
  return {raw, k.b.create<arith::IndexCastOp>(k.loc, k.b.getIndexType(), tc)};
}

Value targetOutside(Body &k, Value raw, int64_t classes) {
  Type t = raw.getType();
  return k.b.create<arith::OrIOp>(
      k.loc, k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, raw, intConst(k, t, 0)),
      k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, raw, intConst(k, t, classes)));
}
} // namespace mlir::forge::kernelgen

namespace {
/// Element i of a gather (out[i] = src[at]) or of its gradient (dsrc[at] +=
/// dy[i], with f32 atomics into the zeroed output); operands (src or dy,
/// indices, result).
void gatherOrScatter(Body &k, gpu::GPUFuncOp fn, Value i, Value at, bool grad) {
  if (grad) {
    Value g = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
    k.b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g, fn.getArgument(2),
                                    ValueRange{at});
  } else {
    // A table stored in another float type than the result (forge-assign-
    // precision: an f32 embedding gathered into bf16 rows) converts per element.
    auto src = cast<MemRefType>(fn.getArgument(0).getType()).getElementType();
    auto dst = cast<MemRefType>(fn.getArgument(2).getType()).getElementType();
    if (src != dst && isa<FloatType>(src) && isa<FloatType>(dst)) {
      k.store(k.load(fn.getArgument(0), at, src), fn.getArgument(2), i, dst);
      return;
    }
    Value v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), at);
    k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(2), i);
  }
}

/// The vector width of a concat or split moving `whole` (its one side) from
/// or into `parts` (extents `sizes` along an axis with `q` elements after
/// it): 4 when 4 consecutive elements of `whole` lie in one part
/// contiguously (q divides by 4, or the axis is innermost and every extent
/// divides by 4) and every type is f32, bf16 or f16 (converted through f32
/// where they differ); else 1.
int64_t concatSplitWidth(Type whole, TypeRange parts, int64_t q, ArrayRef<int64_t> sizes) {
  auto halfOrF32 = [](Type t) { return t.isF32() || t.isBF16() || t.isF16(); };
  bool types = halfOrF32(whole) && llvm::all_of(parts, [&](Type t) {
    return halfOrF32(cast<RankedTensorType>(t).getElementType());
  });
  bool contiguous = q % kVector == 0 ||
                    (q == 1 && llvm::all_of(sizes, [](int64_t s) { return s % kVector == 0; }));
  return types && contiguous ? kVector : 1;
}

/// Flat memref arguments as memrefs of 4-element vectors of their element
/// types (every operand and result moved a vector at a time).
void vectorizeArgs(SmallVectorImpl<Type> &args) {
  for (Type &t : args) {
    auto m = cast<MemRefType>(t);
    t = MemRefType::get({m.getNumElements() / kVector},
                        VectorType::get({kVector}, m.getElementType()));
  }
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::gatherKernel(Operation *op, StringRef name,
                                                                bool grad) {
  auto src = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  auto indices = tensorType(op->getOperand(1));
  ArrayRef<int64_t> dataShape = grad ? out.getShape() : src.getShape();
  int64_t axis = normalizedAxis(op, static_cast<int64_t>(dataShape.size()));
  if (axis < 0 || axis >= static_cast<int64_t>(dataShape.size()))
    return std::nullopt;
  auto [p, a, q] = aroundAxis(dataShape, axis);
  int64_t ni = indices.getNumElements();
  if (a == 0 || ni == 0 || q == 0 || p == 0)
    return std::nullopt;
  if (grad && !out.getElementType().isF32())
    return std::nullopt; // atomic f32 adds only
  // Iterate over the gathered elements (p, j, q): the output of gather, the
  // incoming gradient of gather_grad (scatter-added into zeros).
  KernelLaunch l = elementKernel(
      name, flatArgs(op), p * ni * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        Value qi = k.rem(i, q), r = k.div(i, q);
        Value j = k.rem(r, ni), pi = k.div(r, ni);
        Value t = loadIndex(k, fn.getArgument(1), j, a);
        Value at = k.add(k.mul(k.add(k.mul(pi, k.idx(a)), t), k.idx(q)), qi);
        gatherOrScatter(k, fn, i, at, grad);
      });
  l.zeroOutputs = grad;
  return l;
}

std::optional<KernelLaunch> KernelGenerator::Impl::concatKernel(Operation *op, StringRef name) {
  auto out = tensorType(op->getResult(0));
  int64_t axis = normalizedAxis(op, out.getRank());
  auto [p, total, q] = aroundAxis(out.getShape(), axis);
  SmallVector<int64_t> sizes, offsets;
  int64_t at = 0;
  for (Value v : op->getOperands()) {
    sizes.push_back(tensorType(v).getDimSize(axis));
    offsets.push_back(at);
    at += sizes.back();
  }
  if (out.getNumElements() == 0 || llvm::is_contained(sizes, 0))
    return std::nullopt;
  unsigned n = op->getNumOperands();
  // Each output element (or 4-element vector) reads only the input whose
  // range holds its axis coordinate, picked by a binary tree of branches on
  // that coordinate (a warp's elements mostly lie in one input). Vectors when
  // 4 consecutive output elements lie in one input, contiguously: q divides
  // by 4, or the axis is innermost and every input's extent divides by 4.
  Type elem = out.getElementType();
  // Inputs stored in another float type than the output (forge-assign-
  // precision: a bf16 gradient concatenated from f32 ones): each element, or
  // 4-lane vector, through its f32 compute value.
  bool mixed = llvm::any_of(op->getOperandTypes(), [&](Type t) {
    return cast<RankedTensorType>(t).getElementType() != elem;
  });
  int64_t width = concatSplitWidth(elem, op->getOperandTypes(), q, sizes);
  SmallVector<Type> args = flatArgs(op);
  if (width > 1)
    vectorizeArgs(args);
  Type f32 = Float32Type::get(op->getContext());
  Type valueType = width > 1 ? Type(VectorType::get({width}, mixed ? f32 : elem))
                   : mixed   ? Body::computeTypeOf(elem)
                             : cast<MemRefType>(args[n]).getElementType();
  return elementKernel(
      name, args, out.getNumElements() / width, op->getLoc(),
      [&](Body &k, gpu::GPUFuncOp fn, Value unit) {
        Value i = width > 1 ? k.mul(unit, k.idx(width)) : unit;
        Value qi = k.rem(i, q), r = k.div(i, q);
        Value a = k.rem(r, total), pi = k.div(r, total);
        std::function<Value(unsigned, unsigned)> pick = [&](unsigned lo, unsigned hi) -> Value {
          if (hi - lo == 1) {
            Value local = k.b.create<arith::SubIOp>(k.loc, a, k.idx(offsets[lo]));
            Value src = k.add(k.mul(k.add(k.mul(pi, k.idx(sizes[lo])), local), k.idx(q)), qi);
            if (width > 1)
              src = k.div(src, width);
            if (mixed && width > 1) {
              Value v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(lo), src);
              if (!tensorType(op->getOperand(lo)).getElementType().isF32())
                v = k.b.create<arith::ExtFOp>(k.loc, valueType, v);
              return v;
            }
            if (mixed)
              return k.load(fn.getArgument(lo), src,
                            tensorType(op->getOperand(lo)).getElementType());
            return k.b.create<memref::LoadOp>(k.loc, fn.getArgument(lo), src);
          }
          unsigned mid = (lo + hi) / 2;
          auto branch = k.b.create<scf::IfOp>(k.loc, TypeRange{valueType},
                                              k.ult(a, k.idx(offsets[mid])), true);
          OpBuilder::InsertionGuard g(k.b);
          k.b.setInsertionPointToStart(&branch.getThenRegion().front());
          k.b.create<scf::YieldOp>(k.loc, pick(lo, mid));
          k.b.setInsertionPointToStart(&branch.getElseRegion().front());
          k.b.create<scf::YieldOp>(k.loc, pick(mid, hi));
          return branch.getResult(0);
        };
        Value v = pick(0, n);
        if (mixed && width > 1) {
          if (!elem.isF32())
            v = k.b.create<arith::TruncFOp>(k.loc, VectorType::get({width}, elem), v);
          k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(n), unit);
        } else if (mixed)
          k.store(v, fn.getArgument(n), i, elem);
        else
          k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(n), width > 1 ? unit : i);
      });
}

std::optional<KernelLaunch> KernelGenerator::Impl::splitKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, total, q] = aroundAxis(in.getShape(), axis);
  SmallVector<int64_t> sizes, offsets;
  int64_t at = 0;
  for (Value v : op->getResults()) {
    sizes.push_back(tensorType(v).getDimSize(axis));
    offsets.push_back(at);
    at += sizes.back();
  }
  if (in.getNumElements() == 0 || at != total)
    return std::nullopt;
  // One pass over the input; each element is stored into the output whose
  // range holds its axis coordinate. Outputs stored in another float type
  // (forge-assign-precision) convert on the store. 4-element vectors when 4
  // consecutive input elements go to one output contiguously (q divides by
  // 4, or the axis is innermost and every output's extent divides by 4), as
  // concat does: a transformer's qkv split moves 8- or 16-byte vectors, one
  // index computation per vector instead of per element.
  Type elem = in.getElementType();
  bool mixed = llvm::any_of(op->getResults(),
                            [&](Value v) { return tensorType(v).getElementType() != elem; });
  int64_t width = concatSplitWidth(elem, op->getResultTypes(), q, sizes);
  SmallVector<Type> args = flatArgs(op);
  if (width > 1)
    vectorizeArgs(args);
  return elementKernel(
      name, args, in.getNumElements() / width, op->getLoc(),
      [&](Body &k, gpu::GPUFuncOp fn, Value unit) {
        Value i = width > 1 ? k.mul(unit, k.idx(width)) : unit;
        Value qi = k.rem(i, q), r = k.div(i, q);
        Value a = k.rem(r, total), pi = k.div(r, total);
        Value v;
        if (width > 1)
          v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), unit);
        else
          v = mixed ? k.load(fn.getArgument(0), i, elem)
                    : k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
        for (unsigned j = 0; j < sizes.size(); ++j) {
          if (sizes[j] == 0)
            continue;
          Value lo =
              k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, a, k.idx(offsets[j]));
          Value hi = k.ult(a, k.idx(offsets[j] + sizes[j]));
          k.ifThen(k.b.create<arith::AndIOp>(k.loc, lo, hi), [&] {
            Value local = k.b.create<arith::SubIOp>(k.loc, a, k.idx(offsets[j]));
            Value dst = k.add(k.mul(k.add(k.mul(pi, k.idx(sizes[j])), local), k.idx(q)), qi);
            Type outElem = tensorType(op->getResult(j)).getElementType();
            if (width > 1) {
              Value w = v;
              if (outElem != elem) { // through f32: bf16 <-> f16 has no direct conversion
                Type f32 = Float32Type::get(op->getContext());
                if (!elem.isF32())
                  w = k.b.create<arith::ExtFOp>(k.loc, VectorType::get({width}, f32), w);
                if (!outElem.isF32())
                  w = k.b.create<arith::TruncFOp>(k.loc, VectorType::get({width}, outElem), w);
              }
              k.b.create<memref::StoreOp>(k.loc, w, fn.getArgument(1 + j), k.div(dst, width));
            } else if (mixed) {
              k.store(v, fn.getArgument(1 + j), dst, elem);
            } else {
              k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(1 + j), dst);
            }
          });
        }
      });
}

/// slice_grad (a strided store into zeros) and pad_grad (every grad_output
/// element adds into the input element its forward pad copied; f32 atomics),
/// one thread per grad_output element.
std::optional<KernelLaunch> KernelGenerator::Impl::scatterGradKernel(Operation *op,
                                                                     StringRef name) {
  auto dy = tensorType(op->getOperand(0)), dx = tensorType(op->getResult(0));
  int64_t rank = dy.getRank();
  bool pad = isa<PadGradOp>(op);
  if (rank == 0 || dy.getNumElements() == 0 || dx.getNumElements() == 0 ||
      (pad && !dx.getElementType().isF32()))
    return std::nullopt;
  SmallVector<int64_t> dxStrides = contiguousStrides(dx.getShape());
  ArrayRef<int64_t> shape = dy.getShape();
  KernelLaunch l = elementKernel(name, flatArgs(op), dy.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value rest = i, at = k.idx(0);
    Value valid = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    for (int64_t d = rank - 1; d >= 0; --d) {
      Value id = d == 0 ? rest : k.rem(rest, shape[d]);
      if (d > 0)
        rest = k.div(rest, shape[d]);
      Value src;
      if (pad) {
        auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
        Value s = b.create<arith::SubIOp>(k.loc, id, k.idx(pads[d]));
        src = padSource(k, s, dx.getDimSize(d), op->getAttrOfType<StringAttr>("mode").getValue(),
                        valid);
      } else {
        auto starts = op->getAttrOfType<DenseI64ArrayAttr>("starts");
        auto steps = op->getAttrOfType<DenseI64ArrayAttr>("steps");
        src = k.add(k.idx(starts[d]), k.mul(id, k.idx(steps[d])));
      }
      at = k.add(at, k.mul(src, k.idx(dxStrides[d])));
    }
    Value g = b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
    if (pad)
      k.ifThen(valid, [&] {
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g, fn.getArgument(1),
                                      ValueRange{at});
      });
    else
      b.create<memref::StoreOp>(k.loc, g, fn.getArgument(1), at);
  });
  l.zeroOutputs = true;
  return l;
}

/// The fill value `value` (an f64 attribute) in `elem`'s storage, converted as
/// the CPU's scalarBytes does: bool is value != 0, integers saturate (NaN gives
/// 0, fractions truncate toward zero), floats round to nearest.
static Value fillConstant(Body &k, Type elem, Type storage, double value) {
  if (auto ft = dyn_cast<FloatType>(storage))
    return k.fconst(ft, value);
  if (elem.isInteger(1))
    return intConst(k, storage, value != 0.0);
  unsigned w = storage.getIntOrFloatBitWidth();
  APInt bits(w, 0);
  if (!std::isnan(value)) {
    if (isUnsignedInt(elem)) {
      double hi = std::ldexp(1.0, static_cast<int>(w));
      bits = value <= 0 ? APInt::getMinValue(w)
             : value >= hi ? APInt::getMaxValue(w)
                           : APInt(w, static_cast<uint64_t>(value));
    } else {
      double lim = std::ldexp(1.0, static_cast<int>(w) - 1);
      bits = value <= -lim ? APInt::getSignedMinValue(w)
             : value >= lim ? APInt::getSignedMaxValue(w)
                            : APInt(w, static_cast<uint64_t>(static_cast<int64_t>(value)), true);
    }
  }
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(storage, bits));
}

/// The offset in `data` of element i of a gather_elements/scatter_elements
/// index tensor of `shape`: i's coordinates with dim `axis` replaced by the
/// index stored at i (checked and clamped, loadIndex).
static Value elementsTarget(Body &k, Value indices, Value i, ArrayRef<int64_t> shape, int64_t axis,
                            RankedTensorType data) {
  SmallVector<int64_t> dataStrides = contiguousStrides(data.getShape());
  Value rest = i, at = k.idx(0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    Value id = d == 0 ? rest : k.rem(rest, shape[d]);
    if (d > 0)
      rest = k.div(rest, shape[d]);
    if (d == axis)
      id = loadIndex(k, indices, i, data.getDimSize(axis));
    at = k.add(at, k.mul(id, k.idx(dataStrides[d])));
  }
  return at;
}

/// gather_elements: out[i] = data[i with dim `axis` replaced by indices[i]];
/// its gradient scatter-adds (f32 atomics into zeroed outputs).
std::optional<KernelLaunch> KernelGenerator::Impl::gatherElementsKernel(Operation *op,
                                                                        StringRef name,
                                                                        bool grad) {
  auto idxType = tensorType(op->getOperand(1));
  auto data = tensorType(grad ? op->getResult(0) : op->getOperand(0));
  int64_t rank = idxType.getRank();
  int64_t axis = normalizedAxis(op, rank);
  if (rank == 0 || data.getRank() != rank || axis < 0 || axis >= rank ||
      idxType.getNumElements() == 0 || data.getNumElements() == 0 ||
      (grad && !data.getElementType().isF32()))
    return std::nullopt;
  ArrayRef<int64_t> shape = idxType.getShape();
  KernelLaunch l = elementKernel(name, flatArgs(op), idxType.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    Value at = elementsTarget(k, fn.getArgument(1), i, shape, axis, data);
    gatherOrScatter(k, fn, i, at, grad);
  });
  l.zeroOutputs = grad;
  return l;
}

/// scatter_elements: the output starts as a copy of the input (the runtime
/// copies it before the launch, KernelLaunch::copyInput), then one thread per
/// update writes it (none) or combines it atomically (add: atomic add for f32,
/// f64 and integers; mul, max, min: compare-and-swap loops), at the position of
/// the update with dim `axis` replaced by its index. f16/bf16 reductions have
/// no kernel (the host runs them).
std::optional<KernelLaunch> KernelGenerator::Impl::scatterElementsKernel(Operation *op,
                                                                        StringRef name) {
  auto data = tensorType(op->getOperand(0)), idxType = tensorType(op->getOperand(1));
  StringRef reduction = op->getAttrOfType<StringAttr>("reduction").getValue();
  Type elem = data.getElementType();
  int64_t rank = idxType.getRank();
  int64_t axis = normalizedAxis(op, rank);
  if (rank == 0 || axis < 0 || axis >= rank || idxType.getNumElements() == 0 ||
      data.getNumElements() == 0)
    return std::nullopt;
  bool fl = isFloat(elem);
  if (reduction != "none" &&
      (elem.isInteger(1) || (fl && !elem.isF32() && !elem.isF64()) || isFloat8(elem)))
    return std::nullopt;
  ArrayRef<int64_t> shape = idxType.getShape();
  bool isUnsigned = isUnsignedInt(elem);
  // A compare-and-swap loop swaps integers (LLVM's cmpxchg takes no floats):
  // float mul/max/min see the data and updates as same-width integers and
  // bitcast around the arithmetic.
  bool viaBits = fl && reduction != "none" && reduction != "add";
  Type bitsType = fl ? Type(IntegerType::get(context, elem.getIntOrFloatBitWidth())) : Type();
  SmallVector<Type> args = flatArgs(op);
  if (viaBits)
    for (unsigned a : {0u, 2u, 3u})
      args[a] = flatMemref(bitsType, a == 2 ? idxType.getNumElements() : data.getNumElements());
  KernelLaunch l = elementKernel(name, args, idxType.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value at = elementsTarget(k, fn.getArgument(1), i, shape, axis, data);
    Value out = fn.getArgument(3);
    Value u = b.create<memref::LoadOp>(k.loc, fn.getArgument(2), i); // storage type
    if (reduction == "none") {
      b.create<memref::StoreOp>(k.loc, u, out, at);
      return;
    }
    if (reduction == "add") {
      b.create<memref::AtomicRMWOp>(k.loc, fl ? arith::AtomicRMWKind::addf
                                              : arith::AtomicRMWKind::addi,
                                    u, out, ValueRange{at});
      return;
    }
    auto atomic = b.create<memref::GenericAtomicRMWOp>(k.loc, out, ValueRange{at});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(atomic.getBody());
    Value cur = atomic.getCurrentValue(), next;
    if (viaBits) {
      cur = b.create<arith::BitcastOp>(k.loc, elem, cur);
      u = b.create<arith::BitcastOp>(k.loc, elem, u);
    }
    if (reduction == "mul")
      next = fl ? Value(b.create<arith::MulFOp>(k.loc, cur, u))
                : Value(b.create<arith::MulIOp>(k.loc, cur, u));
    else if (fl) // max/min as the CPU: the update replaces only when strictly beyond
      next = b.create<arith::SelectOp>(
          k.loc,
          b.create<arith::CmpFOp>(k.loc, reduction == "max" ? arith::CmpFPredicate::OGT
                                                            : arith::CmpFPredicate::OLT,
                                  u, cur),
          u, cur);
    else
      next = reduction == "max"
                 ? (isUnsigned ? Value(b.create<arith::MaxUIOp>(k.loc, cur, u))
                               : Value(b.create<arith::MaxSIOp>(k.loc, cur, u)))
                 : (isUnsigned ? Value(b.create<arith::MinUIOp>(k.loc, cur, u))
                               : Value(b.create<arith::MinSIOp>(k.loc, cur, u)));
    if (viaBits)
      next = b.create<arith::BitcastOp>(k.loc, bitsType, next);
    b.create<memref::AtomicYieldOp>(k.loc, next);
  });
  l.copyInput = true;
  return l;
}

/// one_hot: one thread per output element [outer, depth, inner]: `on` where the
/// element's class equals its index (converted to int64 as the CPU does: floats
/// truncate and saturate, NaN is 0; negative counts from depth's end; out of
/// range matches nothing), else `off`; on/off converted as the CPU's scalarBytes.
std::optional<KernelLaunch> KernelGenerator::Impl::oneHotKernel(Operation *op, StringRef name) {
  auto idx = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  Type idxElem = idx.getElementType(), elem = out.getElementType();
  int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
  int64_t depth = op->getAttrOfType<IntegerAttr>("depth").getInt();
  if (out.getNumElements() == 0 || idxElem.isInteger(1) || isFloat8(idxElem) || isFloat8(elem))
    return std::nullopt;
  auto [outer, d, inner] = aroundAxis(out.getShape(), axis);
  if (d != depth)
    return std::nullopt;
  double on = op->getAttrOfType<FloatAttr>("on_value").getValueAsDouble();
  double off = op->getAttrOfType<FloatAttr>("off_value").getValueAsDouble();
  Type storage = storageType(elem);
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Type i64 = b.getI64Type();
    Value in = k.rem(i, inner), c = k.rem(k.div(i, inner), depth), o = k.div(i, inner * depth);
    Value v = k.load(fn.getArgument(0), k.add(k.mul(o, k.idx(inner)), in), idxElem);
    if (isFloat(v.getType()))
      v = floatToInt(k, v, i64, false);
    else if (v.getType().getIntOrFloatBitWidth() < 64)
      v = isUnsignedInt(idxElem) ? Value(b.create<arith::ExtUIOp>(k.loc, i64, v))
                                 : Value(b.create<arith::ExtSIOp>(k.loc, i64, v));
    Value negative = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, v, intConst(k, i64, 0));
    v = b.create<arith::SelectOp>(k.loc, negative,
                                  b.create<arith::AddIOp>(k.loc, v, intConst(k, i64, depth)), v);
    Value hit = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, v,
                                        b.create<arith::IndexCastOp>(k.loc, i64, c));
    Value r = b.create<arith::SelectOp>(k.loc, hit, fillConstant(k, elem, storage, on),
                                        fillConstant(k, elem, storage, off));
    b.create<memref::StoreOp>(k.loc, r, fn.getArgument(1), i);
  });
}

/// resized_crop: one thread per output element (c fastest, as the result is laid
/// out), its two taps per axis and their weights computed in f32 in the CPU
/// kernel's order of operations; the four texels are byte loads near each other
/// (consecutive threads move by boxW / width pixels), the store is consecutive.
std::optional<KernelLaunch> KernelGenerator::Impl::resizedCropKernel(Operation *op,
                                                                     StringRef name) {
  auto canvas = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  if (out.getNumElements() == 0 || !canvas.hasStaticShape() || !out.hasStaticShape())
    return std::nullopt;
  const int64_t ch = canvas.getDimSize(1), cw = canvas.getDimSize(2), c = canvas.getDimSize(3);
  const int64_t height = out.getDimSize(1), width = out.getDimSize(2);
  Type u8 = canvas.getElementType();
  return elementKernel(
      name, flatArgs(op), out.getNumElements(), op->getLoc(),
      [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        OpBuilder &b = k.b;
        Type f32 = b.getF32Type(), i64 = b.getI64Type();
        auto f = [&](double v) { return k.fconst(f32, v); };
        auto toFloat = [&](Value index) {
          return b.create<arith::UIToFPOp>(k.loc, f32,
                                           b.create<arith::IndexCastUIOp>(k.loc, i64, index));
        };
        auto toIndex = [&](Value v) { // v >= 0: truncation is floor
          return b.create<arith::IndexCastUIOp>(k.loc, b.getIndexType(),
                                                b.create<arith::FPToSIOp>(k.loc, i64, v));
        };
        Value cc = k.rem(i, c), x = k.rem(k.div(i, c), width),
              y = k.rem(k.div(i, c * width), height);
        Value bb = k.div(i, c * width * height);
        Value g0 = k.mul(bb, k.idx(6));
        auto geo = [&](int64_t j) {
          return b.create<memref::LoadOp>(k.loc, fn.getArgument(1), k.add(g0, k.idx(j)))
              .getResult();
        };
        // (first tap, second tap, weight) along one axis, as the CPU kernel's tap().
        auto tap = [&](Value pos, Value origin, Value box, int64_t size, Value extent,
                       int64_t limit) {
          Value last = b.create<arith::SubFOp>(
              k.loc,
              b.create<arith::MinimumFOp>(k.loc, b.create<arith::MaximumFOp>(k.loc, extent, f(1.0)),
                                          f(static_cast<double>(limit))),
              f(1.0));
          Value t = b.create<arith::MulFOp>(
              k.loc, b.create<arith::AddFOp>(k.loc, toFloat(pos), f(0.5)), box);
          t = b.create<arith::DivFOp>(k.loc, t, f(static_cast<double>(size)));
          t = b.create<arith::SubFOp>(k.loc, b.create<arith::AddFOp>(k.loc, origin, t), f(0.5));
          Value s = b.create<arith::MinimumFOp>(
              k.loc, b.create<arith::MaximumFOp>(k.loc, t, f(0.0)), last);
          Value lo = toIndex(s);
          Value hi = b.create<arith::MinUIOp>(k.loc, k.add(lo, k.idx(1)), toIndex(last));
          Value w = b.create<arith::SubFOp>(k.loc, s, toFloat(lo));
          return std::tuple<Value, Value, Value>{lo, hi, w};
        };
        auto [x0, x1, fx] = tap(x, geo(0), geo(2), width, geo(4), cw);
        auto [y0, y1, fy] = tap(y, geo(1), geo(3), height, geo(5), ch);
        Value plane = k.mul(bb, k.idx(ch));
        auto texel = [&](Value row, Value col) {
          Value at = k.add(k.mul(k.add(k.mul(k.add(plane, row), k.idx(cw)), col), k.idx(c)), cc);
          return b.create<arith::UIToFPOp>(k.loc, f32, k.load(fn.getArgument(0), at, u8))
              .getResult();
        };
        auto mix = [&](Value a, Value d, Value w) { // a + (d - a) * w
          return b.create<arith::AddFOp>(
              k.loc, a, b.create<arith::MulFOp>(k.loc, b.create<arith::SubFOp>(k.loc, d, a), w));
        };
        Value top = mix(texel(y0, x0), texel(y0, x1), fx);
        Value bottom = mix(texel(y1, x0), texel(y1, x1), fx);
        k.store(mix(top, bottom, fy), fn.getArgument(2), i, out.getElementType());
      });
}

/// pad, tile and trilu: one thread per output element, its source position
/// computed per dimension (the CPU kernels' padSourceIndex / modulo / triangle
/// test), no coalescing (the per-dimension maps are not affine).
std::optional<KernelLaunch> KernelGenerator::Impl::remapKernel(Operation *op, StringRef name) {
  StringRef opName = op->getName().stripDialect();
  auto in = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  Type elem = in.getElementType();
  int64_t rank = in.getRank();
  if (out.getNumElements() == 0 || in.getNumElements() == 0 || rank == 0)
    return std::nullopt;
  SmallVector<int64_t> inStrides = contiguousStrides(in.getShape());
  ArrayRef<int64_t> inShape = in.getShape(), outShape = out.getShape();
  Type storage = storageType(elem);
  // A constant pad of leading dims only, rows a multiple of 4 (the LM head's
  // weight padded to aligned rows, f32 master -> bf16): 4-element vectors,
  // each all from one input row or all the pad value (16-byte f32 loads; a
  // thread per element ran at 1.24 TB/s on an H200).
  auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
  auto halfOrF32 = [](Type t) { return t.isF32() || t.isBF16() || t.isF16(); };
  if (isa<PadOp>(op) && op->getAttrOfType<StringAttr>("mode").getValue() == "constant" &&
      pads[rank - 1] == 0 && pads[2 * rank - 1] == 0 && inShape[rank - 1] % kVector == 0 &&
      halfOrF32(elem) && halfOrF32(out.getElementType()) &&
      llvm::all_of(pads.asArrayRef(), [](int64_t p) { return p >= 0; })) {
    SmallVector<Type> args = flatArgs(op);
    vectorizeArgs(args);
    Type f32 = Float32Type::get(context);
    auto vf32 = VectorType::get({kVector}, f32);
    Type outElem = out.getElementType();
    double value = op->getAttrOfType<FloatAttr>("value").getValueAsDouble();
    return elementKernel(
        name, args, out.getNumElements() / kVector, op->getLoc(),
        [&](Body &k, gpu::GPUFuncOp fn, Value u) {
          OpBuilder &b = k.b;
          Value rest = k.mul(u, k.idx(kVector)),
                valid = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
          Value src = k.rem(rest, outShape[rank - 1]); // the column: not padded
          rest = k.div(rest, outShape[rank - 1]);
          for (int64_t d = rank - 2; d >= 0; --d) {
            Value o = d == 0 ? rest : k.rem(rest, outShape[d]);
            if (d > 0)
              rest = k.div(rest, outShape[d]);
            Value sd = b.create<arith::SubIOp>(k.loc, o, k.idx(pads[d]));
            valid = b.create<arith::AndIOp>(
                k.loc, valid,
                b.create<arith::AndIOp>(
                    k.loc, b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, sd, k.idx(0)),
                    k.ult(sd, k.idx(inShape[d]))));
            // Clamped into the input (a padded row reads row 0, then is replaced).
            Value clamped = b.create<arith::MinSIOp>(
                k.loc, b.create<arith::MaxSIOp>(k.loc, sd, k.idx(0)), k.idx(inShape[d] - 1));
            src = k.add(src, k.mul(clamped, k.idx(inStrides[d])));
          }
          Value v = b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.div(src, kVector));
          if (elem != outElem) { // through f32
            if (!elem.isF32())
              v = b.create<arith::ExtFOp>(k.loc, vf32, v);
            if (!outElem.isF32())
              v = b.create<arith::TruncFOp>(k.loc, VectorType::get({kVector}, outElem), v);
          }
          // The pad value rounded once to the output's type, as the scalar form's.
          auto vout = VectorType::get({kVector}, outElem);
          Value fill = b.create<arith::ConstantOp>(
              k.loc, DenseElementsAttr::get(vout, b.getFloatAttr(outElem, value).getValue()));
          v = b.create<arith::SelectOp>(k.loc, valid, v, fill);
          b.create<memref::StoreOp>(k.loc, v, fn.getArgument(1), u);
        });
  }
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    SmallVector<Value> o(rank);
    Value rest = i;
    for (int64_t d = rank - 1; d >= 0; --d) {
      o[d] = d == 0 ? rest : k.rem(rest, outShape[d]);
      if (d > 0)
        rest = k.div(rest, outShape[d]);
    }
    Value valid = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    Value src = k.idx(0);
    if (isa<PadOp>(op)) {
      auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
      StringRef mode = op->getAttrOfType<StringAttr>("mode").getValue();
      for (int64_t d = 0; d < rank; ++d) {
        Value s = b.create<arith::SubIOp>(k.loc, o[d], k.idx(pads[d]));
        src = k.add(src, k.mul(padSource(k, s, inShape[d], mode, valid), k.idx(inStrides[d])));
      }
    } else if (isa<TileOp>(op)) {
      for (int64_t d = 0; d < rank; ++d)
        src = k.add(src, k.mul(k.rem(o[d], inShape[d]), k.idx(inStrides[d])));
    } else { // trilu over the last two dims: keep c - r >= k (upper) or <= k (lower)
      src = i;
      bool upper = op->getAttrOfType<BoolAttr>("upper").getValue();
      int64_t kk = op->getAttrOfType<IntegerAttr>("k").getInt();
      Value diff = b.create<arith::SubIOp>(k.loc, o[rank - 1], o[rank - 2]);
      valid = b.create<arith::CmpIOp>(
          k.loc, upper ? arith::CmpIPredicate::sge : arith::CmpIPredicate::sle, diff, k.idx(kk));
    }
    Type outElem = out.getElementType();
    if (outElem != elem) {
      // Stored in another float type (forge-assign-precision: a padded f32
      // weight read by bf16 GEMMs): through the compute value.
      Value v = k.load(fn.getArgument(0), src, elem);
      if (opName != "tile") {
        double value = isa<PadOp>(op) ? op->getAttrOfType<FloatAttr>("value").getValueAsDouble() : 0.0;
        v = b.create<arith::SelectOp>(k.loc, valid, v, k.fconst(v.getType(), value));
      }
      k.store(v, fn.getArgument(1), i, outElem);
      return;
    }
    Value v = b.create<memref::LoadOp>(k.loc, fn.getArgument(0), src);
    if (opName != "tile") {
      double value = isa<PadOp>(op) ? op->getAttrOfType<FloatAttr>("value").getValueAsDouble() : 0.0;
      v = b.create<arith::SelectOp>(k.loc, valid, v, fillConstant(k, elem, storage, value));
    }
    b.create<memref::StoreOp>(k.loc, v, fn.getArgument(1), i);
  });
}
