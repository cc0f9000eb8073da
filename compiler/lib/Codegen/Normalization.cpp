//===- Normalization.cpp - normalization kernels ----------------------------===//
//
// layer_norm, batch_norm (inference and training) and group_norm, forward and
// backward; statistics in f32 (Body::moments), as the CPU kernels compute them.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

namespace {
/// Where column c of a layer-norm row (the dims from `axis` on, `normShape`)
/// finds its element of a scale, bias or their gradient that broadcasts to
/// the row (NumPy rules); nullopt when `param` does not broadcast to it.
std::optional<std::function<Value(Body &, Value)>> paramIndex(RankedTensorType param,
                                                            ArrayRef<int64_t> normShape) {
  int64_t cols = 1;
  for (int64_t d : normShape)
    cols *= d;
  if (param.getNumElements() == cols)
    return [](Body &, Value c) { return c; };
  if (param.getRank() > static_cast<int64_t>(normShape.size()))
    return std::nullopt;
  for (int64_t d = 0; d < param.getRank(); ++d) {
    int64_t size = param.getDimSize(d), to = normShape[normShape.size() - param.getRank() + d];
    if (size != 1 && size != to)
      return std::nullopt;
  }
  SmallVector<int64_t> strides = broadcastStrides(param.getShape(), normShape);
  SmallVector<int64_t> dims(normShape);
  return [strides, dims](Body &k, Value c) {
    Value at = k.idx(0), rest = c;
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      if (strides[d] != 0)
        at = k.add(at, k.mul(k.rem(rest, dims[d]), k.idx(strides[d])));
      rest = k.div(rest, dims[d]);
    }
    return at;
  };
}
/// The mean and 1/sqrt(var + eps) of a row held in registers (`xv`, one
/// value per column a thread holds), as Body::moments computes them: the
/// mean, then the centered variance. `reduce` sums a term over the row.
std::pair<Value, Value> rowMoments(Body &k, ArrayRef<Value> xv, double cols, double eps,
                                   function_ref<Value(function_ref<Value(int64_t)>)> reduce) {
  OpBuilder &b = k.b;
  Type f32 = b.getF32Type();
  Value invCols = k.fconst(f32, 1.0 / cols);
  Value mean = b.create<arith::MulFOp>(k.loc, reduce([&](int64_t t) { return xv[t]; }), invCols);
  Value var = b.create<arith::MulFOp>(k.loc, reduce([&](int64_t t) {
                                        Value d = b.create<arith::SubFOp>(k.loc, xv[t], mean);
                                        return b.create<arith::MulFOp>(k.loc, d, d).getResult();
                                      }),
                                      invCols);
  Value rstd = b.create<math::RsqrtOp>(
      k.loc, b.create<arith::AddFOp>(k.loc, var, k.fconst(f32, eps)));
  return {mean, rstd};
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::layerNormKernel(Operation *op,
                                                                   StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  int64_t axis = normalizedAxis(op, in.getRank());
  if (!(elem.isF32() || elem.isF16() || elem.isBF16()) || axis < 0 || axis >= in.getRank())
    return std::nullopt;
  int64_t cols = 1;
  for (int64_t d = axis; d < in.getRank(); ++d)
    cols *= in.getDimSize(d);
  int64_t rows = cols ? in.getNumElements() / cols : 0;
  ArrayRef<int64_t> normShape = in.getShape().drop_front(axis);
  SmallVector<std::function<Value(Body &, Value)>> at; // scale, bias
  for (unsigned i = 1; i < op->getNumOperands(); ++i) {
    auto index = paramIndex(tensorType(op->getOperand(i)), normShape);
    if (!index || tensorType(op->getOperand(i)).getElementType() != elem)
      return std::nullopt;
    at.push_back(*index);
  }
  if (rows == 0)
    return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  bool hasBias = op->getNumOperands() == 3;
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value out = fn.getArgument(op->getNumOperands());
  Value base = k.mul(k.bid(), k.idx(cols));
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto subf = [&](Value x, Value y) -> Value { return b.create<arith::SubFOp>(k.loc, x, y); };
  auto mulf = [&](Value x, Value y) -> Value { return b.create<arith::MulFOp>(k.loc, x, y); };
  auto x = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  // Rows of at most kRowCache columns per thread stay in registers: one read
  // of x instead of three (mean, variance, output), with the same sums.
  int64_t perThread = (cols + block - 1) / block;
  if (perThread <= kRowCache) {
    bool ragged = cols % block != 0;
    Value zero = k.fconst(f32, 0.0);
    SmallVector<Value> col, valid, xv;
    for (int64_t t = 0; t < perThread; ++t) {
      col.push_back(k.add(k.tid(), k.idx(t * block)));
      valid.push_back(ragged && t == perThread - 1 ? k.ult(col.back(), k.idx(cols)) : Value());
      xv.push_back(k.valueIf(valid[t], [&] { return x(col[t]); }, zero));
    }
    auto reduce = [&](function_ref<Value(int64_t)> term) {
      return k.reduceColumns(valid, block / kWarp, sh, zero, addf, term);
    };
    auto [mean, rstd] = rowMoments(k, xv, static_cast<double>(cols), eps, reduce);
    for (int64_t t = 0; t < perThread; ++t) {
      auto store = [&] {
        Value y = mulf(mulf(subf(xv[t], mean), rstd),
                       k.load(fn.getArgument(1), at[0](k, col[t]), elem));
        if (hasBias)
          y = addf(y, k.load(fn.getArgument(2), at[1](k, col[t]), elem));
        k.store(y, out, k.add(base, col[t]), elem);
      };
      k.ifThen(valid[t], store);
    }
    b.create<gpu::ReturnOp>(k.loc);
    return KernelLaunch{name.str(), rows, block};
  }
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, x);
  k.loop(k.tid(), k.idx(cols), k.idx(block), [&](Value c) {
    Value y = mulf(mulf(subf(x(c), mean), rstd), k.load(fn.getArgument(1), at[0](k, c), elem));
    if (hasBias)
      y = addf(y, k.load(fn.getArgument(2), at[1](k, c), elem));
    k.store(y, out, k.add(base, c), elem);
  });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

std::optional<KernelLaunch>
KernelGenerator::Impl::layerNormGradKernel(Operation *op, StringRef name, FusionOp epilogue) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  int64_t axis = normalizedAxis(op, in.getRank());
  if (!elem.isF32() || axis < 0 || axis >= in.getRank())
    return std::nullopt; // dscale/dbias accumulate with f32 atomics
  int64_t cols = 1;
  for (int64_t d = axis; d < in.getRank(); ++d)
    cols *= in.getDimSize(d);
  int64_t rows = cols ? in.getNumElements() / cols : 0;
  ArrayRef<int64_t> normShape = in.getShape().drop_front(axis);
  bool wantDx = op->getAttrOfType<BoolAttr>("input_grad").getValue();
  bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
  bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
  // Element of the scale, dscale and dbias (each with its own broadcast) of column c.
  auto scaleAt = paramIndex(tensorType(op->getOperand(1)), normShape);
  unsigned result = wantDx ? 1 : 0;
  auto dscaleAt = wantScale ? paramIndex(tensorType(op->getResult(result)), normShape) : scaleAt;
  auto dbiasAt = wantBias ? paramIndex(tensorType(op->getResult(result + wantScale)), normShape)
                          : scaleAt;
  if (rows == 0 || !scaleAt || !dscaleAt || !dbiasAt)
    return std::nullopt;
  // A norm_grad region (forge-fuse-norm-grad-epilogues): its results are the
  // norm's dscale/dbias, the epilogue's column sums (accumulated as dscale
  // is) and values of x's shape (written per element), dx itself among them
  // when other ops read it too (its computed value, memoized for the body).
  // Its arguments are the region's inputs (x, scale, dy first), then results.
  enum Role { Dense, Sum, Scale, Bias };
  SmallVector<Role> roles;
  Block *body = epilogue ? &epilogue.getBlock() : nullptr;
  if (epilogue) {
    if (!wantDx)
      return std::nullopt;
    for (Operation &inner : body->without_terminator())
      if (!faultOf(&inner).empty())
        return std::nullopt; // a fused kernel has no fault flag
    for (Value v : body->getTerminator()->getOperands()) {
      if (wantScale && v == op->getResult(1))
        roles.push_back(Scale);
      else if (wantBias && v == op->getResult(1 + wantScale))
        roles.push_back(Bias);
      else if (isa_and_nonnull<ReduceSumOp>(v.getDefiningOp()))
        roles.push_back(Sum);
      else if (tensorType(v).getShape() == in.getShape())
        roles.push_back(Dense);
      else
        return std::nullopt;
      if (roles.back() == Sum && !tensorType(v).getElementType().isF32())
        return std::nullopt; // added with f32 atomics
    }
    for (BlockArgument arg : body->getArguments().drop_front(3)) {
      auto t = tensorType(arg);
      if (!(t.getNumElements() == 1 || t.getShape() == in.getShape() ||
            (t.getRank() == 1 && t.getDimSize(0) == cols)))
        return std::nullopt;
    }
  }
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(epilogue ? epilogue.getOperation() : op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  unsigned next = 3;
  Value dx, dscale, dbias;
  if (epilogue) {
    const unsigned firstResult = epilogue->getNumOperands();
    for (auto [r, role] : llvm::enumerate(roles)) {
      if (role == Scale)
        dscale = fn.getArgument(firstResult + r);
      if (role == Bias)
        dbias = fn.getArgument(firstResult + r);
    }
  } else {
    dx = wantDx ? fn.getArgument(next++) : Value();
    dscale = wantScale ? fn.getArgument(next++) : Value();
    dbias = wantBias ? fn.getArgument(next++) : Value();
  }
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto subf = [&](Value x, Value y) -> Value { return b.create<arith::SubFOp>(k.loc, x, y); };
  auto mulf = [&](Value x, Value y) -> Value { return b.create<arith::MulFOp>(k.loc, x, y); };
  Value zero = k.fconst(f32, 0.0), invCols = k.fconst(f32, 1.0 / static_cast<double>(cols));

  // Rows of at most kRowCache columns per thread: a block takes `perBlock`
  // consecutive rows, holds each row in registers (one read of x and dy),
  // and sums dscale/dbias for its columns over its rows in registers: one
  // atomic per column and block instead of one per element (16384 rows of
  // GPT-2 hammered 768 addresses with 25M atomics per call). About 4 blocks
  // per SM: those per-block atomics on the same 2 x cols addresses were
  // still what bounded GPT-2's norms' gradients (16 blocks per SM: 1.95 ms
  // per step, 4: 1.70; halving the barriers changed nothing).
  int64_t perThread = (cols + block - 1) / block;
  if (perThread <= kRowCache) {
    int64_t perBlock = std::clamp<int64_t>(rows / (4 * target.typicalSMs), 1, 64);
    int64_t grid = (rows + perBlock - 1) / perBlock;
    bool ragged = cols % block != 0;
    SmallVector<Value> col, valid, wv;
    for (int64_t t = 0; t < perThread; ++t) {
      col.push_back(k.add(k.tid(), k.idx(t * block)));
      valid.push_back(ragged && t == perThread - 1 ? k.ult(col.back(), k.idx(cols)) : Value());
    }
    // A load of column t, zero past the row's end.
    auto guarded = [&](int64_t t, function_ref<Value()> load) {
      return k.valueIf(valid[t], load, zero);
    };
    for (int64_t t = 0; t < perThread; ++t)
      wv.push_back(guarded(t, [&] { return k.load(fn.getArgument(1), (*scaleAt)(k, col[t]), elem); }));
    auto reduce = [&](function_ref<Value(int64_t)> term) {
      return k.reduceColumns(valid, block / kWarp, sh, zero, addf, term);
    };
    Value first = k.mul(k.bid(), k.idx(perBlock));
    Value last = b.create<arith::MinUIOp>(k.loc, k.add(first, k.idx(perBlock)), k.idx(rows));
    // Row `row`'s x then dy, perThread each (every block has a row: grid = rows / perBlock, rounded
    // up). An epilogue's inputs of x's shape are loaded with x and dy, ahead (stored form; columns
    // past the row's end read its last one, their values never stored or added).
    SmallVector<unsigned> fullArgs;
    if (epilogue)
      for (BlockArgument arg : body->getArguments().drop_front(3))
        if (tensorType(arg).getShape() == in.getShape())
          fullArgs.push_back(arg.getArgNumber());
    auto clamped = [&](int64_t t) {
      return valid[t] ? Value(b.create<arith::MinUIOp>(k.loc, col[t], k.idx(cols - 1))) : col[t];
    };
    auto loadRow = [&](Value row, SmallVectorImpl<Value> &out) {
      Value base = k.mul(row, k.idx(cols));
      for (unsigned a : {0u, 2u})
        for (int64_t t = 0; t < perThread; ++t)
          out.push_back(guarded(t, [&] { return k.load(fn.getArgument(a), k.add(base, col[t]), elem); }));
      for (unsigned a : fullArgs)
        for (int64_t t = 0; t < perThread; ++t)
          out.push_back(
              b.create<memref::LoadOp>(k.loc, fn.getArgument(a), k.add(base, clamped(t))));
    };
    const int64_t rowValues = (2 + static_cast<int64_t>(fullArgs.size())) * perThread;
    // dscale then dbias partial sums, then the current row's x and dy: each
    // iteration loads the next row before the current one's four block
    // reductions, so its loads are in flight during them (one row at a time
    // left GPT-2's norms' gradients at ~1.8 TB/s). Then the epilogue's
    // column sums, perThread each.
    const int64_t numSums = llvm::count(roles, Sum);
    SmallVector<Value> init(2 * perThread, zero);
    loadRow(first, init);
    init.append(numSums * perThread, zero);
    // An epilogue's input at column t of the row at `base` (columns past
    // the row's end read its last one: their values are never stored or
    // added).
    auto epilogueArg = [&](BlockArgument arg, int64_t t, ValueRange rowNow) -> Value {
      unsigned a = arg.getArgNumber();
      if (a == 0)
        return rowNow[t];
      if (a == 1)
        return wv[t];
      if (a == 2)
        return rowNow[perThread + t];
      if (auto f = llvm::find(fullArgs, a); f != fullArgs.end())
        return rowNow[(2 + (f - fullArgs.begin())) * perThread + t];
      int64_t n = tensorType(arg).getNumElements(); // a column's, or a scalar
      return b.create<memref::LoadOp>(k.loc, fn.getArgument(a), n == 1 ? k.idx(0) : clamped(t));
    };
    Value lastRow = b.create<arith::SubIOp>(k.loc, last, k.idx(1));
    bool failed = false; // an epilogue op without a scalar form
    auto loop = b.create<scf::ForOp>(
        k.loc, first, last, k.idx(1), init,
        [&](OpBuilder &nb, Location l, Value row, ValueRange carried) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          Value base = k.mul(row, k.idx(cols));
          // The next row (the last row again past the end: loaded, unused).
          SmallVector<Value> ahead;
          loadRow(b.create<arith::MinUIOp>(l, k.add(row, k.idx(1)), lastRow), ahead);
          ValueRange acc = carried.take_front(2 * perThread);
          SmallVector<Value> xv(carried.slice(2 * perThread, perThread));
          SmallVector<Value> dyv(carried.slice(3 * perThread, perThread)), xh;
          ValueRange rowNow = carried.slice(2 * perThread, rowValues);
          ValueRange sums = carried.drop_front(2 * perThread + rowValues);
          SmallVector<Value> nextSums(sums);
          auto [mean, rstd] = rowMoments(k, xv, static_cast<double>(cols), eps, reduce);
          for (int64_t t = 0; t < perThread; ++t)
            xh.push_back(mulf(subf(xv[t], mean), rstd));
          if (wantDx) {
            Value m1 = mulf(reduce([&](int64_t t) { return mulf(dyv[t], wv[t]); }), invCols);
            Value m2 = mulf(reduce([&](int64_t t) { return mulf(mulf(dyv[t], wv[t]), xh[t]); }),
                            invCols);
            for (int64_t t = 0; t < perThread; ++t) {
              Value dxv = mulf(rstd, subf(subf(mulf(dyv[t], wv[t]), m1), mulf(xh[t], m2)));
              if (!epilogue) {
                k.ifThen(valid[t], [&] { k.store(dxv, dx, k.add(base, col[t]), elem); });
                continue;
              }
              // The epilogue at this element: its ops once each (dx is f32:
              // its stored form), the dense results stored, the sums' terms
              // added (0 past the row's end).
              llvm::DenseMap<Value, Value> stored;
              stored[op->getResult(0)] = dxv;
              auto load = [&](BlockArgument arg) { return epilogueArg(arg, t, rowNow); };
              Operation *yield = body->getTerminator();
              int64_t s = 0;
              for (auto [r, role] : llvm::enumerate(roles)) {
                Value v = yield->getOperand(r);
                if (role == Dense) {
                  Value sv = evalBodyValue(k, v, stored, load);
                  if (!sv) {
                    failed = true;
                    continue;
                  }
                  Value mem = fn.getArgument(epilogue->getNumOperands() + r);
                  k.ifThen(valid[t],
                           [&] { b.create<memref::StoreOp>(k.loc, sv, mem, k.add(base, col[t])); });
                } else if (role == Sum) {
                  Value in = v.getDefiningOp()->getOperand(0);
                  Value sv = evalBodyValue(k, in, stored, load);
                  if (!sv) {
                    failed = true;
                    continue;
                  }
                  Value term = k.toCompute(sv, tensorType(in).getElementType());
                  if (valid[t])
                    term = b.create<arith::SelectOp>(k.loc, valid[t], term, zero);
                  nextSums[s * perThread + t] = addf(sums[s * perThread + t], term);
                  ++s;
                }
              }
            }
          }
          SmallVector<Value> next;
          for (int64_t t = 0; t < perThread; ++t)
            next.push_back(addf(acc[t], mulf(dyv[t], xh[t])));
          for (int64_t t = 0; t < perThread; ++t)
            next.push_back(addf(acc[perThread + t], dyv[t]));
          llvm::append_range(next, ahead);
          llvm::append_range(next, nextSums);
          b.create<scf::YieldOp>(l, next);
        });
    if (failed) {
      fn.erase();
      return std::nullopt;
    }
    for (int64_t t = 0; t < perThread; ++t) {
      auto flush = [&] {
        if (wantScale)
          b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, loop.getResult(t),
                                        dscale, ValueRange{(*dscaleAt)(k, col[t])});
        if (wantBias)
          b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf,
                                        loop.getResult(perThread + t), dbias,
                                        ValueRange{(*dbiasAt)(k, col[t])});
      };
      k.ifThen(valid[t], flush);
    }
    // The epilogue's column sums: one atomic per column and block.
    for (int64_t s = 0, r = 0; r < static_cast<int64_t>(roles.size()); ++r) {
      if (roles[r] != Sum)
        continue;
      Value mem = fn.getArgument(epilogue->getNumOperands() + r);
      for (int64_t t = 0; t < perThread; ++t)
        k.ifThen(valid[t], [&] {
          b.create<memref::AtomicRMWOp>(
              k.loc, arith::AtomicRMWKind::addf,
              loop.getResult(2 * perThread + rowValues + s * perThread + t), mem,
              ValueRange{col[t]});
        });
      ++s;
    }
    b.create<gpu::ReturnOp>(k.loc);
    KernelLaunch launch{name.str(), grid, block};
    if (epilogue) { // the sums zeroed, the dense results written whole
      for (auto [r, role] : llvm::enumerate(roles))
        if (role != Dense)
          launch.zeroOnly.push_back(static_cast<unsigned>(r));
      launch.zeroOutputs = !launch.zeroOnly.empty();
      if (launch.zeroOnly.size() == roles.size())
        launch.zeroOnly.clear(); // every output zeroed
      return launch;
    }
    launch.zeroOutputs = wantScale || wantBias;
    if (wantDx && launch.zeroOutputs) // dx is written whole (see below)
      for (unsigned r = 1; r < 1u + wantScale + wantBias; ++r)
        launch.zeroOnly.push_back(r);
    return launch;
  }
  if (epilogue) { // rows too long for registers (forge-fuse-norm-grad-epilogues refuses them)
    fn.erase();
    return std::nullopt;
  }

  Value base = k.mul(k.bid(), k.idx(cols));
  auto x = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  auto w = [&](Value c) { return k.load(fn.getArgument(1), (*scaleAt)(k, c), elem); };
  auto dy = [&](Value c) { return k.load(fn.getArgument(2), k.add(base, c), elem); };
  auto rowSum = [&](function_ref<Value(Value)> term) {
    return k.blockAccumulate(cols, block, sh, zero, addf, term);
  };
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, x);
  auto xhat = [&](Value c) { return mulf(subf(x(c), mean), rstd); };
  Value m1, m2;
  if (wantDx) {
    m1 = mulf(rowSum([&](Value c) { return mulf(dy(c), w(c)); }), invCols);
    m2 = mulf(rowSum([&](Value c) { return mulf(mulf(dy(c), w(c)), xhat(c)); }), invCols);
  }
  b.create<scf::ForOp>(
      k.loc, k.tid(), k.idx(cols), k.idx(block), ValueRange{},
      [&](OpBuilder &nb, Location l, Value c, ValueRange) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        Value g0 = dy(c), xh = xhat(c);
        if (wantDx)
          k.store(mulf(rstd, subf(subf(mulf(g0, w(c)), m1), mulf(xh, m2))), dx, k.add(base, c),
                  elem);
        if (wantScale)
          b.create<memref::AtomicRMWOp>(l, arith::AtomicRMWKind::addf, mulf(g0, xh), dscale,
                                        ValueRange{(*dscaleAt)(k, c)});
        if (wantBias)
          b.create<memref::AtomicRMWOp>(l, arith::AtomicRMWKind::addf, g0, dbias,
                                        ValueRange{(*dbiasAt)(k, c)});
        b.create<scf::YieldOp>(l);
      });
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), rows, block};
  launch.zeroOutputs = wantScale || wantBias;
  if (wantDx && launch.zeroOutputs) // dx is written whole: its memset (50 MB for GPT-2's) is spared
    for (unsigned r = 1; r < 1u + wantScale + wantBias; ++r)
      launch.zeroOnly.push_back(r);
  return launch;
}

std::optional<KernelLaunch> KernelGenerator::Impl::batchNormKernel(Operation *op,
                                                                   StringRef name) {
  // (x - mean[c]) * scale[c] / sqrt(var[c] + eps) + bias[c], c = dim 1.
  auto x = tensorType(op->getResult(0));
  Type elem = x.getElementType();
  if (x.getRank() < 2 || !(elem.isF32() || elem.isF16() || elem.isBF16()))
    return std::nullopt;
  int64_t c = x.getDimSize(1), plane = x.getNumElements() / std::max<int64_t>(1, x.getDimSize(0) * c);
  for (unsigned i = 1; i < 5; ++i)
    if (tensorType(op->getOperand(i)).getNumElements() != c)
      return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  return elementKernel(name, flatArgs(op), x.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value ch = k.rem(k.div(i, plane), c);
                         auto param = [&](unsigned a) { return k.load(fn.getArgument(a), ch, elem); };
                         OpBuilder &b = k.b;
                         Value inv = b.create<math::RsqrtOp>(
                             k.loc, b.create<arith::AddFOp>(k.loc, param(4),
                                                            k.fconst(b.getF32Type(), eps)));
                         Value xc = b.create<arith::SubFOp>(k.loc, k.load(fn.getArgument(0), i, elem),
                                                            param(3));
                         Value y = b.create<arith::AddFOp>(
                             k.loc, b.create<arith::MulFOp>(
                                        k.loc, b.create<arith::MulFOp>(k.loc, xc, inv), param(1)),
                             param(2));
                         k.store(y, fn.getArgument(5), i, elem);
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::batchNormTrainingKernel(Operation *op,
                                                                           StringRef name,
                                                                           bool grad,
                                                                           FusionOp fusion) {
  // One block per channel. One pass reads the channel's x (and dy) and sums
  // s = x - K, s*s (and dy, dy*s), K the channel's first element: shifted sums
  // keep E[s^2] - E[s]^2 from cancelling (K lies within the data, so E[s] is
  // of the order of the spread). Biased variance, as ONNX and the CPU kernel.
  // A second pass writes the normalized output (training) or dx (grad), whose
  // dscale/dbias follow from the same sums: sum(dy * (x - mean)) = sum(dy*s) -
  // E[s] * sum(dy). Planes whose size divides by 4 are read and written as
  // 16-byte vectors (an image's plane is contiguous per sample and channel).
  // In a batch_norm region the output pass evaluates the epilogue per element
  // instead of storing the normalized value (forward), or both passes
  // evaluate the prologue that computes dy (gradient: a ReLU's mask).
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  if (x.getRank() < 2 || !elem.isF32())
    return std::nullopt;
  int64_t n = x.getDimSize(0), c = x.getDimSize(1), plane = 1;
  for (int64_t d = 2; d < x.getRank(); ++d)
    plane *= x.getDimSize(d);
  int64_t count = n * plane;
  if (count == 0 || tensorType(op->getOperand(1)).getNumElements() != c)
    return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t lanes = plane % kVector == 0 ? kVector : 1;
  int64_t units = count / lanes, unitsPerPlane = plane / lanes; // per channel
  // Few channels are few blocks: give each the most threads a block can have,
  // so the memory system sees enough loads in flight.
  int64_t block = c < 2 * target.typicalSMs ? std::min<int64_t>(1024, std::max<int64_t>(kWarp, (units + kWarp - 1) / kWarp * kWarp))
                                            : chooseBlockSize(target, units, 32, kWarp * 4);
  bool wantDx = grad && op->getAttrOfType<BoolAttr>("input_grad").getValue();
  int64_t elements = x.getNumElements();
  // Kernel arguments: the op's operands then results, or the region's inputs
  // then results. Image-sized ones are vectors of `lanes` elements when lanes
  // > 1 (16 bytes of f32; a mask's 4 bytes): a thread's unit is one access.
  SmallVector<Value> argValues;
  if (fusion) {
    llvm::append_range(argValues, fusion.getInputs());
    llvm::append_range(argValues, fusion.getResults());
    // The prologue's or epilogue's inputs: the image's shape or one element.
    for (BlockArgument arg : fusion.getBlock().getArguments())
      if (llvm::any_of(arg.getUsers(), [&](Operation *u) { return u != op; }) &&
          tensorType(arg).getNumElements() != elements && tensorType(arg).getNumElements() != 1)
        return std::nullopt;
  } else {
    llvm::append_range(argValues, op->getOperands());
    llvm::append_range(argValues, op->getResults());
  }
  auto imageSized = [&](Value v) { return tensorType(v).getNumElements() == elements; };
  SmallVector<Type> args;
  for (Value v : argValues) {
    Type e = tensorType(v).getElementType();
    args.push_back(flatMemref(e, tensorType(v).getNumElements(),
                              /*vector=*/lanes > 1 && imageSized(v), lanes));
  }
  // The kernel argument of the op's operand j (a body argument in a region).
  auto operandArg = [&](unsigned j) -> unsigned {
    return fusion ? cast<BlockArgument>(op->getOperand(j)).getArgNumber() : j;
  };
  unsigned firstResult = fusion ? fusion.getInputs().size() : op->getNumOperands();
  unsigned numOut = argValues.size() - firstResult;
  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value ch = k.bid();
  auto at = [&](Value u) { // unit u of channel ch: (n * C + ch) * unitsPerPlane + j
    return k.add(k.mul(k.add(k.mul(k.div(u, unitsPerPlane), k.idx(c)), ch), k.idx(unitsPerPlane)),
                 k.rem(u, unitsPerPlane));
  };
  auto addf = [&](Value a, Value d) -> Value { return b.create<arith::AddFOp>(k.loc, a, d); };
  auto subf = [&](Value a, Value d) -> Value { return b.create<arith::SubFOp>(k.loc, a, d); };
  auto mulf = [&](Value a, Value d) -> Value { return b.create<arith::MulFOp>(k.loc, a, d); };
  auto vectorArg = [](Value mem) {
    return isa<VectorType>(cast<MemRefType>(mem.getType()).getElementType());
  };
  // The lanes of unit u of kernel argument m (storage form): image-sized
  // arguments at the unit's elements, one-element ones at 0.
  auto loadLanes = [&](unsigned m, Value u) -> SmallVector<Value> {
    Value mem = fn.getArgument(m);
    SmallVector<Value> vals;
    if (!imageSized(argValues[m])) {
      vals.assign(lanes, b.create<memref::LoadOp>(k.loc, mem, k.idx(0)));
    } else if (vectorArg(mem)) {
      Value v = b.create<memref::LoadOp>(k.loc, mem, at(u));
      for (int64_t l = 0; l < lanes; ++l)
        vals.push_back(b.create<vector::ExtractOp>(k.loc, v, l));
    } else {
      Value base = k.mul(at(u), k.idx(lanes));
      for (int64_t l = 0; l < lanes; ++l)
        vals.push_back(b.create<memref::LoadOp>(k.loc, mem, k.add(base, k.idx(l))));
    }
    return vals;
  };
  auto storeLanes = [&](ArrayRef<Value> vals, unsigned m, Value u) {
    Value mem = fn.getArgument(m);
    if (vectorArg(mem)) {
      Value v = b.create<vector::FromElementsOp>(
          k.loc, cast<VectorType>(cast<MemRefType>(mem.getType()).getElementType()), vals);
      b.create<memref::StoreOp>(k.loc, v, mem, at(u));
      return;
    }
    Value base = k.mul(at(u), k.idx(lanes));
    for (int64_t l = 0; l < lanes; ++l)
      b.create<memref::StoreOp>(k.loc, vals[l], mem, k.add(base, k.idx(l)));
  };
  // Region body values at one unit: each argument's lanes loaded once.
  bool ok = true;
  struct UnitValues {
    llvm::DenseMap<unsigned, SmallVector<Value>> lanesOf;
  };
  auto evalLane = [&](UnitValues &unit, Value u, Value v, int64_t i,
                      llvm::DenseMap<Value, Value> &stored) -> Value {
    Value r = evalBodyValue(k, v, stored, [&](BlockArgument arg) {
      unsigned m = arg.getArgNumber();
      auto it = unit.lanesOf.find(m);
      if (it == unit.lanesOf.end())
        it = unit.lanesOf.try_emplace(m, loadLanes(m, u)).first;
      return it->second[i];
    });
    if (!r) {
      ok = false;
      return k.fconst(f32, 0.0);
    }
    return r;
  };
  // dy's lanes at unit u: loaded, or the prologue evaluated.
  auto dyLanes = [&](Value u) -> SmallVector<Value> {
    if (!fusion)
      return loadLanes(2, u);
    UnitValues unit;
    SmallVector<Value> out;
    for (int64_t i = 0; i < lanes; ++i) {
      llvm::DenseMap<Value, Value> stored;
      out.push_back(evalLane(unit, u, op->getOperand(2), i, stored));
    }
    return out;
  };
  Value zero = k.fconst(f32, 0.0), invCount = k.fconst(f32, 1.0 / static_cast<double>(count));
  Value shift = loadLanes(operandArg(0), k.idx(0))[0];
  // The one pass: per-thread sums, then across the block. Each iteration
  // takes `unroll` units (u, u + block, ...) and issues all their loads
  // before it adds: a channel of few blocks (64 channels: 64 of 132 SMs)
  // needs several loads in flight per thread to approach the memory's
  // bandwidth. Units past the end load the last unit and add nothing; the
  // additions keep the order of one unit per iteration (the same bits).
  int64_t unroll = std::clamp<int64_t>(units / block, 1, 4);
  Value lastUnit = k.idx(units - 1);
  auto unitAt = [&](Value u, int64_t j) -> std::pair<Value, Value> { // (clamped unit, in range)
    Value uj = k.add(u, k.idx(j * block));
    return {b.create<arith::MinUIOp>(k.loc, uj, lastUnit), k.ult(uj, k.idx(units))};
  };
  // The output pass likewise: `body(unit)` loads a unit and returns what
  // computes and stores it; the stores of units past the end are skipped.
  auto forEach = [&](function_ref<std::function<void()>(Value)> body) {
    k.loop(k.tid(), k.idx(units), k.idx(block * unroll), [&](Value u) {
      SmallVector<std::function<void()>> stores;
      SmallVector<Value> inRange;
      for (int64_t j = 0; j < unroll; ++j) {
        auto [uj, valid] = unitAt(u, j);
        stores.push_back(body(uj));
        inRange.push_back(valid);
      }
      for (int64_t j = 0; j < unroll; ++j) {
        if (j == 0)
          stores[j]();
        else
          k.ifThen(inRange[j], stores[j]);
      }
    });
  };
  SmallVector<Value> init(grad ? 4 : 2, zero);
  auto pass = b.create<scf::ForOp>(
      k.loc, k.tid(), k.idx(units), k.idx(block * unroll), init,
      [&](OpBuilder &nb, Location l, Value u, ValueRange acc) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        SmallVector<Value> sums(acc.begin(), acc.end());
        SmallVector<SmallVector<Value>> xs(unroll), dys(unroll);
        SmallVector<Value> inRange(unroll);
        for (int64_t j = 0; j < unroll; ++j) {
          auto [uj, valid] = unitAt(u, j);
          inRange[j] = valid;
          xs[j] = loadLanes(operandArg(0), uj);
          if (grad)
            dys[j] = dyLanes(uj);
        }
        for (int64_t j = 0; j < unroll; ++j) {
          SmallVector<Value> next = sums;
          for (int64_t i = 0; i < lanes; ++i) {
            Value d = subf(xs[j][i], shift);
            next[0] = addf(next[0], d);
            next[1] = addf(next[1], mulf(d, d));
            if (grad) {
              next[2] = addf(next[2], dys[j][i]);
              next[3] = addf(next[3], mulf(dys[j][i], d));
            }
          }
          for (size_t t = 0; t < sums.size(); ++t)
            sums[t] = j == 0 ? next[t] // u itself is always in range
                             : b.create<arith::SelectOp>(k.loc, inRange[j], next[t], sums[t]);
        }
        b.create<scf::YieldOp>(l, sums);
      });
  SmallVector<Value> total;
  for (Value v : pass.getResults())
    total.push_back(k.blockReduce(v, block / kWarp, sh, zero, addf));
  Value meanShifted = mulf(total[0], invCount);
  Value var = b.create<arith::MaximumFOp>(
      k.loc, subf(mulf(total[1], invCount), mulf(meanShifted, meanShifted)), zero);
  Value mean = addf(shift, meanShifted);
  Value rstd = b.create<math::RsqrtOp>(k.loc, addf(var, k.fconst(f32, eps)));
  Value scale = k.load(fn.getArgument(operandArg(1)), ch, elem);
  Value first = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0));
  if (!grad) { // (x, scale, bias, running_mean, running_var) -> (y, new_mean, new_var)
    double momentum = op->getAttrOfType<FloatAttr>("momentum").getValueAsDouble();
    // unbiased_var (PyTorch): the running variance takes count / (count - 1) times the
    // batch's (biased) variance.
    auto unbiased = op->getAttrOfType<BoolAttr>("unbiased_var");
    double correction = unbiased && unbiased.getValue() && count > 1
                            ? static_cast<double>(count) / static_cast<double>(count - 1)
                            : 1.0;
    Value bias = k.load(fn.getArgument(operandArg(2)), ch, elem);
    Value a = mulf(scale, rstd);
    forEach([&](Value u) -> std::function<void()> {
      SmallVector<Value> xs = loadLanes(operandArg(0), u);
      // The epilogue's image-sized arguments, loaded with x.
      auto unit = std::make_shared<UnitValues>();
      if (fusion)
        for (BlockArgument arg : fusion.getBlock().getArguments())
          if (imageSized(arg) && llvm::any_of(arg.getUsers(), [&](Operation *o) { return o != op; }))
            unit->lanesOf[arg.getArgNumber()] = loadLanes(arg.getArgNumber(), u);
      return [&, xs, unit, u]() {
        SmallVector<Value> ys;
        for (Value xv : xs)
          ys.push_back(addf(mulf(subf(xv, mean), a), bias));
        if (!fusion)
          return storeLanes(ys, firstResult, u);
        // The epilogue's values (the region's results but the statistics).
        auto yielded = fusion.getBlock().getTerminator()->getOperands();
        SmallVector<SmallVector<Value>> outs(numOut - 2);
        for (int64_t i = 0; i < lanes; ++i) {
          llvm::DenseMap<Value, Value> stored;
          stored[op->getResult(0)] = ys[i];
          for (unsigned r = 0; r + 2 < numOut; ++r)
            outs[r].push_back(evalLane(*unit, u, yielded[r], i, stored));
        }
        for (unsigned r = 0; r + 2 < numOut; ++r)
          storeLanes(outs[r], firstResult + r, u);
      };
    });
    k.ifThen(first, [&] {
      Value m = k.fconst(f32, momentum), m1 = k.fconst(f32, 1.0 - momentum);
      Value v1 = k.fconst(f32, correction * (1.0 - momentum));
      Value rm = k.load(fn.getArgument(operandArg(3)), ch, elem);
      Value rv = k.load(fn.getArgument(operandArg(4)), ch, elem);
      k.store(addf(mulf(rm, m), mulf(mean, m1)), fn.getArgument(firstResult + numOut - 2), ch, elem);
      k.store(addf(mulf(rv, m), mulf(var, v1)), fn.getArgument(firstResult + numOut - 1), ch, elem);
    });
  } else { // (x, scale, dy) -> dx?, dscale?, dbias?
    bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
    bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
    Value sumDy = total[2];
    Value sumDyXhat = mulf(subf(total[3], mulf(meanShifted, sumDy)), rstd);
    unsigned next = firstResult;
    unsigned dx = wantDx ? next++ : 0;
    Value dscale = wantScale ? fn.getArgument(next++) : Value();
    Value dbias = wantBias ? fn.getArgument(next++) : Value();
    if (wantDx) {
      Value a = mulf(scale, rstd), mdy = mulf(sumDy, invCount), mdyx = mulf(sumDyXhat, invCount);
      forEach([&](Value u) -> std::function<void()> {
        SmallVector<Value> xs = loadLanes(operandArg(0), u), dys = dyLanes(u);
        return [&, xs, dys, u]() {
          SmallVector<Value> out;
          for (int64_t i = 0; i < lanes; ++i) {
            Value xhat = mulf(subf(xs[i], mean), rstd);
            out.push_back(mulf(a, subf(subf(dys[i], mdy), mulf(xhat, mdyx))));
          }
          storeLanes(out, dx, u);
        };
      });
    }
    k.ifThen(first, [&] {
      if (wantScale)
        k.store(sumDyXhat, dscale, ch, elem);
      if (wantBias)
        k.store(sumDy, dbias, ch, elem);
    });
  }
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), c, block};
}

/// group_norm (and its gradient): one block per (sample, group), whose
/// channels are contiguous in NCHW, so a row is cols = C/G * spatial
/// consecutive elements; element j belongs to channel g*C/G + j/spatial. The
/// gradient's dscale/dbias accumulate with f32 atomics into zeroed outputs.
std::optional<KernelLaunch> KernelGenerator::Impl::groupNormKernel(Operation *op, StringRef name,
                                                                   bool grad) {
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  auto groupsAttr = op->getAttrOfType<IntegerAttr>("num_groups");
  if (x.getRank() < 2 || !elem.isF32() || !groupsAttr || x.getNumElements() == 0)
    return std::nullopt;
  int64_t n = x.getDimSize(0), c = x.getDimSize(1), groups = groupsAttr.getInt();
  if (groups <= 0 || c % groups != 0 || tensorType(op->getOperand(1)).getNumElements() != c)
    return std::nullopt;
  int64_t spatial = x.getNumElements() / (n * c), cg = c / groups, cols = cg * spatial;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value row = k.bid();
  Value base = k.mul(row, k.idx(cols));
  Value firstChannel = k.mul(k.rem(row, groups), k.idx(cg));
  auto channel = [&](Value j) { return k.add(firstChannel, k.div(j, spatial)); };
  auto addf = [&](Value a, Value d) -> Value { return b.create<arith::AddFOp>(k.loc, a, d); };
  auto subf = [&](Value a, Value d) -> Value { return b.create<arith::SubFOp>(k.loc, a, d); };
  auto mulf = [&](Value a, Value d) -> Value { return b.create<arith::MulFOp>(k.loc, a, d); };
  Value zero = k.fconst(f32, 0.0), invCols = k.fconst(f32, 1.0 / static_cast<double>(cols));
  auto xAt = [&](Value j) { return k.load(fn.getArgument(0), k.add(base, j), elem); };
  auto scaleAt = [&](Value j) { return k.load(fn.getArgument(1), channel(j), elem); };
  auto rowSum = [&](function_ref<Value(Value)> term) {
    Value acc = k.loopAcc(k.tid(), cols, k.idx(block), zero,
                          [&](Value j, Value a) { return addf(a, term(j)); });
    return k.blockReduce(acc, block / kWarp, sh, zero, addf);
  };
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, xAt);
  auto xhat = [&](Value j) { return mulf(subf(xAt(j), mean), rstd); };
  auto forEach = [&](function_ref<void(Value)> body) {
    k.loop(k.tid(), k.idx(cols), k.idx(block), body);
  };
  KernelLaunch launch{name.str(), n * groups, block};
  if (!grad) { // (x, scale, bias) -> y
    forEach([&](Value j) {
      Value y = addf(mulf(xhat(j), scaleAt(j)), k.load(fn.getArgument(2), channel(j), elem));
      k.store(y, fn.getArgument(3), k.add(base, j), elem);
    });
  } else { // (x, scale, dy) -> dx?, dscale?, dbias?
    bool wantDx = op->getAttrOfType<BoolAttr>("input_grad").getValue();
    bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
    bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
    unsigned next = 3;
    Value dx = wantDx ? fn.getArgument(next++) : Value();
    Value dscale = wantScale ? fn.getArgument(next++) : Value();
    Value dbias = wantBias ? fn.getArgument(next++) : Value();
    auto dyAt = [&](Value j) { return k.load(fn.getArgument(2), k.add(base, j), elem); };
    Value m1, m2;
    if (wantDx) {
      m1 = mulf(rowSum([&](Value j) { return mulf(dyAt(j), scaleAt(j)); }), invCols);
      m2 = mulf(rowSum([&](Value j) { return mulf(mulf(dyAt(j), scaleAt(j)), xhat(j)); }), invCols);
    }
    forEach([&](Value j) {
      Value g0 = dyAt(j), xh = xhat(j);
      if (wantDx)
        k.store(mulf(rstd, subf(subf(mulf(g0, scaleAt(j)), m1), mulf(xh, m2))), dx,
                k.add(base, j), elem);
      if (wantScale)
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, mulf(g0, xh), dscale,
                                      ValueRange{channel(j)});
      if (wantBias)
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g0, dbias,
                                      ValueRange{channel(j)});
    });
    launch.zeroOutputs = wantScale || wantBias;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return launch;
}
