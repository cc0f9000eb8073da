//===- Loss.cpp - classifier losses -----------------------------------------===//
//
// nll_loss and cross_entropy (a row kernel per sample: log-sum-exp and the
// target's logit, never a materialized softmax), forward and backward, and
// cross_entropy_with_grad (both in one row kernel).
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

namespace {
/// The upstream gradient a cross-entropy row's gradient scales by: dy of the
/// row (reduction "none") or the scalar dy, divided by the rows for "mean".
Value rowUpstream(Body &k, Value dy, StringRef reduction, Value row, int64_t rows, Type elem) {
  Value g = k.load(dy, reduction == "none" ? row : k.idx(0), elem);
  if (reduction != "mean")
    return g;
  return k.b.create<arith::DivFOp>(k.loc, g, k.fconst(k.b.getF32Type(), double(rows)));
}

/// Where a row's target class tc sits among its 4-wide vectors: vector
/// tc / 4 and, per lane l, whether tc % 4 == l.
struct TargetLanes {
  Value vector;
  SmallVector<Value, kVector> lane;
};
TargetLanes targetLanes(Body &k, Value tc) {
  TargetLanes t{k.div(tc, kVector), {}};
  Value which = k.rem(tc, kVector);
  for (int64_t l = 0; l < kVector; ++l)
    t.lane.push_back(k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, which, k.idx(l)));
  return t;
}

/// The target's logit: lane tc % 4 of vector tc / 4 of the row at vector
/// `base` of `logits` (a memref of 4-wide vectors). With `lanes`, also the
/// target's TargetLanes, made on the way (the load issued first).
Value targetLogit(Body &k, Value logits, Value base, Value tc, TargetLanes *lanes = nullptr) {
  OpBuilder &b = k.b;
  Value at = k.div(tc, kVector);
  Value vec = b.create<memref::LoadOp>(k.loc, logits, k.add(base, at));
  Value which = k.rem(tc, kVector);
  auto isLane = [&](int64_t l) -> Value {
    Value is = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, which, k.idx(l));
    if (lanes)
      lanes->lane.push_back(is);
    return is;
  };
  Value xt = b.create<vector::ExtractOp>(k.loc, vec, 0);
  if (lanes) {
    lanes->vector = at;
    isLane(0);
  }
  for (int64_t l = 1; l < kVector; ++l)
    xt =
        b.create<arith::SelectOp>(k.loc, isLane(l), b.create<vector::ExtractOp>(k.loc, vec, l), xt);
  return xt;
}

/// Two partial log-sum-exps (m, s), s the sum of exp(x - m), as one; an empty
/// pair is (-inf, 0).
std::pair<Value, Value> combineLse(Body &k, Value m1, Value s1, Value m2, Value s2) {
  OpBuilder &b = k.b;
  Value m = b.create<arith::MaximumFOp>(k.loc, m1, m2);
  Value empty = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OEQ, m,
                                        k.fconst(b.getF32Type(), -INFINITY));
  auto scaled = [&](Value mi, Value si) -> Value {
    return b.create<arith::MulFOp>(k.loc, si, k.expViaExp2(b.create<arith::SubFOp>(k.loc, mi, m)));
  };
  Value sum = b.create<arith::AddFOp>(k.loc, scaled(m1, s1), scaled(m2, s2));
  return {m, b.create<arith::SelectOp>(k.loc, empty, k.fconst(b.getF32Type(), 0.0), sum)};
}

/// (m, s) combined across the warp (every lane gets it).
void warpCombineLse(Body &k, Value &m, Value &s) {
  for (int32_t offset = 16; offset >= 1; offset /= 2) {
    auto shuffle = [&](Value v) -> Value {
      return k.b
          .create<gpu::ShuffleOp>(k.loc, v, k.i32(offset), k.i32(kWarp), gpu::ShuffleMode::XOR)
          .getShuffleResult();
    };
    Value om = shuffle(m), os = shuffle(s);
    std::tie(m, s) = combineLse(k, m, s, om, os);
  }
}

/// (m, s) combined across the block of `warps` warps through `shM`/`shS`
/// (a slot a warp from `slot0`; one barrier): every thread gets it.
void blockCombineLse(Body &k, Value &m, Value &s, int64_t warps, Value shM, Value shS,
                     Value slot0) {
  OpBuilder &b = k.b;
  warpCombineLse(k, m, s);
  if (warps == 1)
    return;
  Value t = k.tid();
  Value laneId = k.rem(t, kWarp), warp = k.div(t, kWarp);
  k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, laneId, k.idx(0)), [&] {
    b.create<memref::StoreOp>(k.loc, m, shM, k.add(slot0, warp));
    b.create<memref::StoreOp>(k.loc, s, shS, k.add(slot0, warp));
  });
  b.create<gpu::BarrierOp>(k.loc);
  Value slot = k.add(slot0, b.create<arith::MinUIOp>(k.loc, laneId, k.idx(warps - 1)));
  Value present = k.ult(laneId, k.idx(warps));
  Type f32 = b.getF32Type();
  m = b.create<arith::SelectOp>(k.loc, present, b.create<memref::LoadOp>(k.loc, shM, slot),
                                k.fconst(f32, -INFINITY));
  s = b.create<arith::SelectOp>(k.loc, present, b.create<memref::LoadOp>(k.loc, shS, slot),
                                k.fconst(f32, 0.0));
  warpCombineLse(k, m, s);
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  auto reduction = op->getAttrOfType<StringAttr>("reduction");
  bool weighted = op->getNumOperands() == 3;
  if (in.getRank() < 2 || !in.getElementType().isF32() || !reduction ||
      in.getNumElements() == 0 ||
      (weighted && !tensorType(op->getOperand(2)).getElementType().isF32()))
    return std::nullopt;
  // Positions p = (sample, extra dims...) of the [N, C, d...] input: N*D of them,
  // class t of position p at (p / D * C + t) * D + p % D.
  int64_t c = in.getDimSize(1), n = in.getNumElements() / c;
  int64_t inner = n / in.getDimSize(0);
  auto xIndex = [&](Body &k, Value p, Value t) {
    if (inner == 1)
      return k.add(k.mul(p, k.idx(c)), t);
    return k.add(k.mul(k.add(k.mul(k.div(p, inner), k.idx(c)), t), k.idx(inner)), k.rem(p, inner));
  };
  auto ignore = op->getAttrOfType<IntegerAttr>("ignore_index");
  bool mean = reduction.getValue() == "mean";
  // A counted target's weight (1 without weights) and class (clamped in range).
  auto targetOf = [&](Body &k, gpu::GPUFuncOp fn, Value row) {
    OpBuilder &b = k.b;
    auto [raw, tc] = loadTarget(k, fn.getArgument(1), row, c);
    Value counted = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    if (ignore)
      counted = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne, raw,
                                        intConst(k, raw.getType(), ignore.getInt()));
    // Out of range (compared in the target's own width, before the clamp).
    Value outside = targetOutside(k, raw, c);
    k.fault(b.create<arith::AndIOp>(k.loc, counted, outside));
    Value w = weighted ? Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(2), tc))
                       : k.fconst(b.getF32Type(), 1.0);
    w = b.create<arith::SelectOp>(k.loc, counted, w, k.fconst(b.getF32Type(), 0.0));
    return std::pair<Value, Value>{tc, w};
  };
  if (reduction.getValue() == "none")
    return elementKernel(name, flatArgs(op), n, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value row) {
      auto [tc, w] = targetOf(k, fn, row);
      Value x = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), xIndex(k, row, tc));
      Value y = k.b.create<arith::MulFOp>(k.loc, k.b.create<arith::NegFOp>(k.loc, x), w);
      k.b.create<memref::StoreOp>(k.loc, y, fn.getArgument(op->getNumOperands()), row);
    });
  if (reduction.getValue() != "mean" && reduction.getValue() != "sum")
    return std::nullopt;
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, n, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value zero = k.fconst(f32, 0.0), one = k.fconst(f32, 1.0);
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  Type pairType = f32;
  (void)pairType;
  (void)one;
  // Per thread: (sum of -w[t] x[n, t[n]], sum of the counted targets' weights); then block sums.
  auto loop = b.create<scf::ForOp>(
      k.loc, k.tid(), k.idx(n), k.idx(block), ValueRange{zero, zero},
      [&](OpBuilder &nb, Location l, Value row, ValueRange acc) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        auto [tc, w] = targetOf(k, fn, row);
        Value x = b.create<memref::LoadOp>(l, fn.getArgument(0), xIndex(k, row, tc));
        Value term = b.create<arith::MulFOp>(l, b.create<arith::NegFOp>(l, x), w);
        b.create<scf::YieldOp>(l, ValueRange{addf(acc[0], term), addf(acc[1], w)});
      });
  Value sum = k.blockReduce(loop.getResult(0), block / kWarp, sh, zero, addf);
  Value count = k.blockReduce(loop.getResult(1), block / kWarp, sh, zero, addf);
  k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
    Value v = mean ? Value(b.create<arith::DivFOp>(k.loc, sum, count)) : sum;
    b.create<memref::StoreOp>(k.loc, v, fn.getArgument(op->getNumOperands()), k.idx(0));
  });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), 1, block};
}

/// cross_entropy (logits, target) -> (loss, lse), cross_entropy_grad
/// (logits, lse, target, dy) -> dlogits and cross_entropy_with_grad (logits,
/// target, dy) -> (loss, dlogits): one block per row of [N, C] logits, block
/// reductions as the row kernels. The statistics read the row twice (max,
/// then the sum of exponentials); the gradient reads it once more and writes
/// g * (exp(x - lse) - [c == target]). With both, the row's second and third
/// reads hit L2 and lse stays in registers; a barrier between the statistics
/// and the gradient orders every read of the row before its first write, so
/// the gradient may be written over the logits (forge-plan-memory).
std::optional<KernelLaunch> KernelGenerator::Impl::crossEntropyKernel(Operation *op,
                                                                      StringRef name,
                                                                      CrossEntropyMode mode) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() != 2 || !(elem.isF32() || elem.isF16() || elem.isBF16()) ||
      in.getNumElements() == 0)
    return std::nullopt;
  const bool stats = mode != CrossEntropyMode::Gradient;
  const bool grad = mode != CrossEntropyMode::Forward;
  // A row holds `stride` values, of which the first `cols` are logits (the
  // rest padding: ignored, their gradient zero).
  int64_t rows = in.getDimSize(0), stride = in.getDimSize(1), cols = stride;
  if (auto classes = op->getAttrOfType<IntegerAttr>("classes")) {
    cols = classes.getInt();
    if (cols < 1 || cols > stride)
      return std::nullopt;
  }
  StringRef reduction;
  if (grad) {
    auto r = op->getAttrOfType<StringAttr>("reduction");
    if (!r)
      return std::nullopt;
    reduction = r.getValue();
  }
  // Arguments per mode: (logits, target, loss, lse), (logits, lse, target,
  // dy, d), (logits, target, dy, loss, d).
  CrossEntropyArgs args;
  switch (mode) {
  case CrossEntropyMode::Forward:
    args = {/*target=*/1, /*lse=*/-1, /*dy=*/-1, /*loss=*/2, /*lseOut=*/3, /*d=*/-1};
    break;
  case CrossEntropyMode::Gradient:
    args = {2, 1, 3, -1, -1, 4};
    break;
  case CrossEntropyMode::Both:
    args = {1, -1, 2, 3, -1, 4};
    break;
  }
  // The vector variant loads the logits as f32 vectors and stores the loss
  // and lse as f32 (the gradient may be stored low: forge-assign-precision).
  bool statsF32 = !stats || (tensorType(op->getResult(0)).getElementType().isF32() &&
                             (args.lseOut < 0 || tensorType(op->getResult(1)).getElementType().isF32()));
  if (elem.isF32() && statsF32 && stride % kVector == 0)
    return crossEntropyVectorKernel(op, name, mode, args, rows, stride, cols, reduction);
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value row = k.bid();
  Value base = k.mul(row, k.idx(stride));
  auto ld = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, a, c); };
  auto subf = [&](Value a, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, a, c); };
  auto expf = [&](Value a) -> Value { return k.expViaExp2(a); };
  Value zero = k.fconst(f32, 0.0);
  auto [raw, tc] = loadTarget(k, fn.getArgument(args.target), row, cols);
  Value lse;
  if (stats) {
    Value xt = ld(tc); // before the gradient may overwrite it
    auto maxf = [&](Value a, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, a, c); };
    Value m = k.blockAccumulate(cols, block, sh, k.fconst(f32, -INFINITY), maxf, ld);
    Value s = k.blockAccumulate(cols, block, sh, zero, addf,
                                [&](Value c) { return expf(subf(ld(c), m)); });
    lse = addf(m, b.create<math::LogOp>(k.loc, s));
    Value outside = targetOutside(k, raw, cols);
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
      k.fault(outside);
      k.store(subf(lse, xt), fn.getArgument(args.loss), row,
              tensorType(op->getResult(0)).getElementType());
      if (args.lseOut >= 0)
        k.store(lse, fn.getArgument(args.lseOut), row, elem);
    });
  } else {
    lse = k.load(fn.getArgument(args.lse), row, elem);
  }
  if (grad) {
    // Every read of the statistics (the target's logit too) before the
    // gradient may overwrite the row in place (one barrier per row).
    if (stats)
      b.create<gpu::BarrierOp>(k.loc);
    Value g = rowUpstream(k, fn.getArgument(args.dy), reduction, row, rows, elem);
    Value one = k.fconst(f32, 1.0);
    Value d = fn.getArgument(args.d);
    k.loop(k.tid(), k.idx(cols), k.idx(block), [&](Value c) {
      Value p = expf(subf(ld(c), lse));
      Value hit = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, c, tc);
      p = b.create<arith::SelectOp>(k.loc, hit, subf(p, one), p);
      k.store(b.create<arith::MulFOp>(k.loc, g, p), d, k.add(base, c), elem);
    });
    if (stride > cols) // the padding's gradient
      k.loop(k.add(k.tid(), k.idx(cols)), k.idx(stride), k.idx(block),
             [&](Value c) { k.store(zero, d, k.add(base, c), elem); });
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossGradKernel(Operation *op,
                                                                     StringRef name) {
  auto out = tensorType(op->getResult(0));
  auto reduction = op->getAttrOfType<StringAttr>("reduction");
  if (out.getRank() < 2 || !out.getElementType().isF32() || !reduction ||
      out.getNumElements() == 0)
    return std::nullopt;
  // The mean's denominator is the batch size only without weights and ignore_index.
  if (out.getRank() != 2 || op->getNumOperands() != 2 || op->hasAttr("ignore_index") ||
      (reduction.getValue() != "mean" && reduction.getValue() != "sum") ||
      tensorType(op->getOperand(0)).getNumElements() != 1)
    return nllLossGradRowKernel(op, name);
  int64_t n = out.getDimSize(0), c = out.getDimSize(1);
  double scale = reduction.getValue() == "mean" ? -1.0 / static_cast<double>(n) : -1.0;
  return elementKernel(name, flatArgs(op), n * c, op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value row = k.div(i, c), col = k.rem(i, c);
                         Value raw = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(1), row);
                         // In the target's width: a 32-bit `index` would wrap an int64 target.
                         Value colT = k.b.create<arith::IndexCastOp>(k.loc, raw.getType(), col);
                         Value hit = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq,
                                                               raw, colT);
                         Value dy = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0));
                         Type f32 = k.b.getF32Type();
                         Value g = k.b.create<arith::MulFOp>(k.loc, dy, k.fconst(f32, scale));
                         Value v = k.b.create<arith::SelectOp>(k.loc, hit, g, k.fconst(f32, 0.0));
                         k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(2), i);
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossGradRowKernel(Operation *op,
                                                                        StringRef name) {
  // The general form (weights, ignore_index, extra dims, reduction none): a
  // grid-stride loop over dx. dx[p, c] is zero but at c = t[p], which gets
  // -w[t] dy (dy[p] for reduction none), divided for the mean by the counted
  // targets' total weight. Each block sums that total once, so the grid is
  // capped (a few blocks per SM): the work stays linear in the number of
  // targets (a [N, C, 512, 512] segmentation loss has millions of them).
  auto out = tensorType(op->getResult(0));
  StringRef reduction = op->getAttrOfType<StringAttr>("reduction").getValue();
  bool weighted = op->getNumOperands() == 3;
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return std::nullopt;
  if (weighted && !tensorType(op->getOperand(2)).getElementType().isF32())
    return std::nullopt;
  // Positions p of [N, C, d...] as in nllLossKernel: n = N*D of them; element
  // i of dx is ((p / D) * C + c) * D + p % D.
  int64_t c = out.getDimSize(1), n = out.getNumElements() / c;
  int64_t inner = n / out.getDimSize(0), total = out.getNumElements();
  auto ignore = op->getAttrOfType<IntegerAttr>("ignore_index");
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, total, 32, kWarp * 4);
  int64_t grid = std::clamp<int64_t>((total + block - 1) / block, 1, 4 * target.typicalSMs);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value zero = k.fconst(f32, 0.0);
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto weightOf = [&](Value p) -> std::pair<Value, Value> { // (class, weight or 0)
    auto [raw, tc] = loadTarget(k, fn.getArgument(1), p, c);
    Value w = weighted ? Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(2), tc))
                       : k.fconst(f32, 1.0);
    if (ignore) {
      Value counted = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne, raw,
                                              intConst(k, raw.getType(), ignore.getInt()));
      w = b.create<arith::SelectOp>(k.loc, counted, w, zero);
    }
    return {tc, w};
  };
  Value sum; // the mean's denominator
  if (reduction == "mean")
    sum = k.blockAccumulate(n, block, sh, zero, addf,
                            [&](Value m) { return weightOf(m).second; });
  Value dyAll = reduction == "none"
                    ? Value()
                    : Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0)));
  Value dx = fn.getArgument(op->getNumOperands());
  k.gridStride(total, [&](Value i) {
    Value col = k.rem(k.div(i, inner), c);
    Value p = inner == 1 ? k.div(i, c) : k.add(k.mul(k.div(i, c * inner), k.idx(inner)),
                                               k.rem(i, inner));
    auto [t, w] = weightOf(p);
    Value dy = dyAll ? dyAll : Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), p));
    Value g = b.create<arith::MulFOp>(k.loc, b.create<arith::NegFOp>(k.loc, dy), w);
    if (sum)
      g = b.create<arith::DivFOp>(k.loc, g, sum);
    Value hit = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, col, t);
    b.create<memref::StoreOp>(k.loc, b.create<arith::SelectOp>(k.loc, hit, g, zero), dx, i);
  });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

/// cross_entropy(_grad, _with_grad) over f32 rows whose stride divides by 4
/// (GPT-2's padded vocabulary): 16-byte vector loads and stores. The
/// statistics take one pass (online softmax: each thread keeps a running max
/// and the sum of exponentials relative to it; pairs combine as (max(m1, m2),
/// s1 e^(m1-m) + s2 e^(m2-m)) across the block), so the forward reads the
/// row once. Columns from `cols` on (padding) count as -inf; their gradient is
/// 0. In-place as crossEntropyKernel (a barrier between the passes). Both
/// with a bf16 gradient over wide rows go to crossEntropyOnChipKernel first.
///
/// With both over wide rows (a vocabulary: GPT-2's rows are 201 KB), the row's
/// second read must hit L2, so few rows may be in flight: one block of 1024
/// threads per SM loops over the rows (132 rows, 26 MB, within the H200's 50
/// MB L2; one block per row of 128 threads kept ~2,100 rows in flight and read
/// every row twice from memory: 2.2 ms per GPT-2 step against 2.3 for the two
/// separate kernels). Each thread issues kUnroll vector loads before using
/// them, so that 132 blocks keep enough bytes in flight. Per logit each pass
/// spends ~9-12 PTX instructions (exp2, one select a lane, compares a vector;
/// ~21-23 with libdevice's expf and a column compare a lane, at the same 2.2
/// TB/s on an H100: the kernel is not instruction-bound).
std::optional<KernelLaunch>
KernelGenerator::Impl::crossEntropyVectorKernel(Operation *op, StringRef name,
                                                CrossEntropyMode mode, CrossEntropyArgs a,
                                                int64_t rows, int64_t stride, int64_t cols,
                                                StringRef reduction) {
  const bool stats = mode != CrossEntropyMode::Gradient;
  const bool grad = mode != CrossEntropyMode::Forward;
  if (mode == CrossEntropyMode::Both)
    if (auto onChip = crossEntropyOnChipKernel(op, name, a, rows, stride, cols, reduction))
      return onChip;
  Type f32 = Float32Type::get(context);
  int64_t vectors = stride / kVector;
  SmallVector<Type> args = flatArgs(op);
  args[0] = flatMemref(f32, rows * stride, /*vector=*/true);
  // The gradient may be stored in bf16/f16 (forge-assign-precision): 4 lanes
  // rounded together, one 8-byte store.
  Type outElem = tensorType(op->getResult(op->getNumResults() - 1)).getElementType();
  if (grad)
    args[a.d] = flatMemref(outElem, rows * stride, /*vector=*/true);
  Type smem = sharedBuffer(kWarp, f32);
  constexpr int64_t kUnroll = 4, kPersistentBlock = 1024;
  const bool persistent = mode == CrossEntropyMode::Both &&
                          vectors >= kUnroll * kPersistentBlock && rows > target.typicalSMs;
  int64_t block = persistent ? kPersistentBlock : chooseBlockSize(target, vectors, 32, 2 * kWarp * 4);
  int64_t grid = persistent ? target.typicalSMs : rows;
  int64_t unroll = persistent ? kUnroll : 1;
  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {smem, smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value shM = fn.getWorkgroupAttributions()[0], shS = fn.getWorkgroupAttributions()[1];
  auto addf = [&](Value x, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, x, c); };
  auto subf = [&](Value x, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, x, c); };
  auto mulf = [&](Value x, Value c) -> Value { return b.create<arith::MulFOp>(k.loc, x, c); };
  auto maxf = [&](Value x, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, x, c); };
  auto expf = [&](Value x) -> Value { return k.expViaExp2(x); };
  auto lane = [&](Value vec, int64_t l) -> Value {
    return b.create<vector::ExtractOp>(k.loc, vec, l);
  };
  Value zero = k.fconst(f32, 0.0), ninf = k.fconst(f32, -INFINITY);
  // Whether lane l of vector v is a logit (null: always), from two compares
  // a vector: lane l is a logit iff v < cols / 4, or v == cols / 4 and
  // l < cols % 4 (one compare a lane made the loops instruction-bound).
  struct LogitLanes {
    Value below, upTo; // v < cols / 4, v <= cols / 4
    Value lane(int64_t l) const { return l < rem ? upTo : below; }
    int64_t rem;
  };
  auto logitLanes = [&](Value v) -> LogitLanes {
    if (cols == stride)
      return {Value(), Value(), 0};
    int64_t full = cols / kVector, rem = cols % kVector;
    return {k.ult(v, k.idx(full)), rem ? k.ult(v, k.idx(full + 1)) : Value(), rem};
  };
  // for v = tid; v < vectors; v += unroll * block: body(the unroll vectors
  // v + u block, each with whether it is in the row (null: always)).
  auto forVectors = [&](ValueRange init,
                        function_ref<SmallVector<Value>(ArrayRef<Value>, ArrayRef<Value>,
                                                        ValueRange)>
                            body) {
    return b.create<scf::ForOp>(
        k.loc, k.tid(), k.idx(vectors), k.idx(unroll * block), init,
        [&](OpBuilder &nb, Location l, Value v, ValueRange acc) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          SmallVector<Value> vs{v}, in{Value()};
          for (int64_t u = 1; u < unroll; ++u) {
            vs.push_back(k.add(v, k.idx(u * block)));
            in.push_back(k.ult(vs.back(), k.idx(vectors)));
          }
          b.create<scf::YieldOp>(l, body(vs, in, acc));
        });
  };
  // The unroll vectors at `vs` of the row at `base`, loaded before any is
  // used (a vector past the row's end reads the row's last one).
  auto loadVectors = [&](Value base, ArrayRef<Value> vs, ArrayRef<Value> in) {
    SmallVector<Value> out;
    for (auto [v, ok] : llvm::zip(vs, in)) {
      Value at = ok ? b.create<arith::MinUIOp>(k.loc, v, k.idx(vectors - 1)).getResult() : v;
      out.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.add(base, at)));
    }
    return out;
  };

  auto emitRow = [&](Value row) {
    Value base = k.mul(row, k.idx(vectors));
    auto [raw, tc] = loadTarget(k, fn.getArgument(a.target), row, cols);
    Value lse;
    if (stats) {
      // The target's logit, read before the gradient may overwrite it.
      Value xt = targetLogit(k, fn.getArgument(0), base, tc);
      auto loop = forVectors(
          ValueRange{ninf, zero}, [&](ArrayRef<Value> vs, ArrayRef<Value> in, ValueRange acc) {
            SmallVector<Value> vecs = loadVectors(base, vs, in);
            SmallVector<Value> xs;
            Value m = acc[0];
            for (auto [v, ok, vec] : llvm::zip(vs, in, vecs)) {
              // A vector past the row's end (!ok) is past cols / 4 too.
              LogitLanes logits = logitLanes(v);
              for (int64_t i = 0; i < kVector; ++i) {
                Value x = lane(vec, i);
                if (Value keep = logits.below ? logits.lane(i) : ok)
                  x = b.create<arith::SelectOp>(k.loc, keep, x, ninf);
                xs.push_back(x);
                m = maxf(m, x);
              }
            }
            Value empty = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OEQ, m, ninf);
            Value sum = mulf(acc[1], expf(subf(acc[0], m)));
            for (Value x : xs)
              sum = addf(sum, expf(subf(x, m)));
            sum = b.create<arith::SelectOp>(k.loc, empty, zero, sum);
            return SmallVector<Value>{m, sum};
          });
      Value m = loop.getResult(0), sum = loop.getResult(1);
      // Across the warp, then the warps through shared memory.
      blockCombineLse(k, m, sum, block / kWarp, shM, shS, k.idx(0));
      lse = addf(m, b.create<math::LogOp>(k.loc, sum));
      Value outside = targetOutside(k, raw, cols);
      k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
        k.fault(outside);
        b.create<memref::StoreOp>(k.loc, subf(lse, xt), fn.getArgument(a.loss), row);
        if (a.lseOut >= 0)
          b.create<memref::StoreOp>(k.loc, lse, fn.getArgument(a.lseOut), row);
      });
    } else {
      lse = k.load(fn.getArgument(a.lse), row, f32);
    }
    if (grad) {
      // Every read of the statistics (the target's logit, the shared
      // partials) before the gradient may overwrite the row in place or the
      // next row's statistics reuse the shared memory (one barrier per row).
      if (stats)
        b.create<gpu::BarrierOp>(k.loc);
      Value g = rowUpstream(k, fn.getArgument(a.dy), reduction, row, rows, f32);
      Value one = k.fconst(f32, 1.0);
      // Per lane whether it is the target's (once a row), per vector
      // whether it is the target's.
      TargetLanes target = targetLanes(k, tc);
      forVectors(ValueRange{}, [&](ArrayRef<Value> vs, ArrayRef<Value> in, ValueRange) {
        SmallVector<Value> vecs = loadVectors(base, vs, in);
        for (auto [v, ok, vec] : llvm::zip(vs, in, vecs)) {
          SmallVector<Value> out;
          LogitLanes logits = logitLanes(v);
          Value atTarget =
              b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, v, target.vector);
          for (int64_t i = 0; i < kVector; ++i) {
            Value p = expf(subf(lane(vec, i), lse));
            Value hit = b.create<arith::AndIOp>(k.loc, atTarget, target.lane[i]);
            p = b.create<arith::SelectOp>(k.loc, hit, subf(p, one), p);
            Value d = mulf(g, p);
            if (logits.below)
              d = b.create<arith::SelectOp>(k.loc, logits.lane(i), d, zero);
            out.push_back(d);
          }
          Value result =
              b.create<vector::FromElementsOp>(k.loc, VectorType::get({kVector}, f32), out);
          if (outElem != f32)
            result = b.create<arith::TruncFOp>(k.loc, VectorType::get({kVector}, outElem), result);
          auto store = [&] {
            b.create<memref::StoreOp>(k.loc, result, fn.getArgument(a.d), k.add(base, v));
          };
          if (ok)
            k.ifThen(ok, store);
          else
            store();
        }
        return SmallVector<Value>{};
      });
    }
  };

  if (persistent) {
    k.loop(k.bid(), k.idx(rows), k.idx(grid), emitRow);
  } else {
    emitRow(k.bid());
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

/// cross_entropy_with_grad with a bf16 gradient, the whole row on chip: a
/// persistent kernel of two 512-thread blocks an SM (the one's reductions
/// and stores beside the other's reads), a row a block at a time. A thread
/// reads its vectors of the row (v = tid + 512 u) in groups of 4, takes the
/// group's maximum mg and stores e = exp(x - mg) as f16 in the block's
/// dynamic shared memory (in [0, 1]: 2^-11 relative down to 2^-14, under the
/// bf16 gradient's own 2^-9; below, f16's subnormals, an absolute error of
/// at most 2^-25 of the group's largest probability), keeping mg in a
/// register and folding (mg, sum e)
/// into its (m, s). After the block's (M, S) the gradient is
/// e exp(mg - M) g / S from shared memory, except the target's,
/// g (exp(x_t - lse) - 1) from x_t in f32 (the one logit with cancellation).
/// One exponential a logit and the row read once from HBM: 1.65 ms for
/// GPT-2's 16384 x 50304 logits on an H100 against 2.17 for the vector
/// kernel's two reads and two exponentials (bench/cross_entropy_probe.cu,
/// variants 9b and 1; 2.99 TB/s, the stream roofline 2.95).
/// Invariants: a thread reads back only the shared vectors it wrote; the
/// block's partials are double-buffered by row parity (a warp writes row
/// r + 2's only after row r + 1's barrier, which every warp reaches after
/// reading row r's), so a row takes one barrier.
std::optional<KernelLaunch>
KernelGenerator::Impl::crossEntropyOnChipKernel(Operation *op, StringRef name, CrossEntropyArgs a,
                                                int64_t rows, int64_t stride, int64_t cols,
                                                StringRef reduction) {
  constexpr int64_t kBlock = 512, kGroup = 4, kBlocksPerSM = 2;
  Type outElem = tensorType(op->getResult(1)).getElementType();
  const int64_t vectors = stride / kVector;
  const int64_t sharedBytes = vectors * kVector * 2; // f16 e
  const int64_t staticBytes = 2 * (2 * kWarp) * 4;   // (m, s) partials, two rows' worth
  // Two blocks an SM, each with the 1 KiB the system reserves; rows wide
  // enough to matter (the vector kernel's persistent form) and more rows
  // than blocks.
  if (!outElem.isBF16() || vectors < 4 * kBlock || rows <= kBlocksPerSM * target.typicalSMs ||
      kBlocksPerSM * (sharedBytes + staticBytes + 1024) > target.sharedBytesPerSM)
    return std::nullopt;
  const int64_t per = (vectors + kBlock - 1) / kBlock, groups = (per + kGroup - 1) / kGroup;
  const int64_t grid = kBlocksPerSM * target.typicalSMs;
  Type f32 = Float32Type::get(context), f16 = Float16Type::get(context);
  SmallVector<Type> args = flatArgs(op);
  args[0] = flatMemref(f32, rows * stride, /*vector=*/true);
  args[a.d] = flatMemref(outElem, rows * stride, /*vector=*/true);
  OpBuilder b(context);
  Type partials = sharedBuffer(2 * kWarp, f32);
  auto fn = newKernel(b, name, args, kBlock, {partials, partials});
  // At most 64 registers a thread, so that two blocks fit (PTX .minnctapersm).
  fn->setAttr("nvvm.minctasm", b.getI32IntegerAttr(kBlocksPerSM));
  Body k = Body::of(b, op->getLoc(), fn);
  Value shM = fn.getWorkgroupAttributions()[0], shS = fn.getWorkgroupAttributions()[1];
  auto workgroup = gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup);
  Value bytes = b.create<gpu::DynamicSharedMemoryOp>(
      k.loc, MemRefType::get({ShapedType::kDynamic}, b.getI8Type(), AffineMap{}, workgroup));
  VectorType f32x4 = VectorType::get({kVector}, f32), f16x4 = VectorType::get({kVector}, f16);
  Value eBuf =
      b.create<memref::ViewOp>(k.loc, MemRefType::get({vectors}, f16x4, AffineMap{}, workgroup),
                               bytes, k.idx(0), ValueRange{});
  auto addf = [&](Value x, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, x, c); };
  auto mulf = [&](Value x, Value c) -> Value { return b.create<arith::MulFOp>(k.loc, x, c); };
  auto subf = [&](Value x, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, x, c); };
  auto lane = [&](Value vec, int64_t l) -> Value {
    return b.create<vector::ExtractOp>(k.loc, vec, l);
  };
  auto isNegInf = [&](Value x) -> Value {
    return b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OEQ, x, k.fconst(f32, -INFINITY));
  };
  Value zero = k.fconst(f32, 0.0), ninf = k.fconst(f32, -INFINITY);
  Value log2e = k.fconst(f32, M_LOG2E);
  // Vector u of a thread's share: its index and whether it is in the row
  // (null: always).
  auto vectorAt = [&](int64_t u) -> std::pair<Value, Value> {
    Value v = k.add(k.tid(), k.idx(u * kBlock));
    return {v, (u + 1) * kBlock > vectors ? k.ult(v, k.idx(vectors)) : Value()};
  };
  // Whether lane l of a thread's vector u (at v) is a logit, given whether v
  // is in the row: v < cols / 4, or v == cols / 4 and l < cols % 4 (vectors
  // past the row's end are past cols / 4 too). Only the last u or two can
  // hold padding: the others need no compare (null: a logit).
  auto logitLane = [&](int64_t u, Value v, Value in, int64_t l) -> Value {
    int64_t full = cols / kVector, rem = cols % kVector;
    if (cols == stride || (u + 1) * kBlock <= full)
      return in;
    return k.ult(v, k.idx(l < rem ? full + 1 : full));
  };

  k.loop(k.bid(), k.idx(rows), k.idx(grid), [&](Value row) {
    Value base = k.mul(row, k.idx(vectors));
    auto [raw, tc] = loadTarget(k, fn.getArgument(a.target), row, cols);
    TargetLanes target;
    Value xt = targetLogit(k, fn.getArgument(0), base, tc, &target);
    // Pass 1: the row from HBM, e into shared memory, (m, s) per thread.
    Value m = ninf, s = zero;
    SmallVector<Value> groupMax;
    for (int64_t gi = 0; gi < groups; ++gi) {
      SmallVector<std::pair<Value, Value>> at;
      SmallVector<Value> vecs;
      const int64_t u0 = gi * kGroup;
      for (int64_t u = u0; u < std::min(per, (gi + 1) * kGroup); ++u) {
        at.push_back(vectorAt(u));
        auto [v, in] = at.back();
        Value from = in ? b.create<arith::MinUIOp>(k.loc, v, k.idx(vectors - 1)).getResult() : v;
        vecs.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.add(base, from)));
      }
      SmallVector<Value> xs;
      Value gm = ninf;
      for (auto [i, p, vec] : llvm::enumerate(at, vecs))
        for (int64_t l = 0; l < kVector; ++l) {
          Value x = lane(vec, l);
          if (Value keep = logitLane(u0 + static_cast<int64_t>(i), p.first, p.second, l))
            x = b.create<arith::SelectOp>(k.loc, keep, x, ninf);
          xs.push_back(x);
          gm = b.create<arith::MaximumFOp>(k.loc, gm, x);
        }
      // exp2(x log2(e) - gm log2(e)) in one fma; an all-padding group has e = 0.
      Value shift = b.create<arith::SelectOp>(k.loc, isNegInf(gm), zero, mulf(gm, log2e));
      shift = b.create<arith::NegFOp>(k.loc, shift);
      Value sum = zero;
      for (auto [i, p] : llvm::enumerate(at)) {
        SmallVector<Value> es;
        for (int64_t l = 0; l < kVector; ++l) {
          Value e = b.create<math::Exp2Op>(
              k.loc, b.create<LLVM::FMAOp>(k.loc, xs[i * kVector + l], log2e, shift));
          es.push_back(e);
          sum = addf(sum, e);
        }
        Value ev = b.create<arith::TruncFOp>(k.loc, f16x4,
                                             b.create<vector::FromElementsOp>(k.loc, f32x4, es));
        Value v = p.first;
        k.ifThen(p.second, [&] { b.create<memref::StoreOp>(k.loc, ev, eBuf, v); });
      }
      groupMax.push_back(gm);
      std::tie(m, s) = combineLse(k, m, s, gm, sum);
    }
    // The block's (M, S), partials in the row parity's half.
    Value slot0 = k.mul(k.rem(k.div(row, grid), 2), k.idx(kWarp));
    blockCombineLse(k, m, s, kBlock / kWarp, shM, shS, slot0);
    Value lse = addf(m, b.create<math::LogOp>(k.loc, s));
    Value g = rowUpstream(k, fn.getArgument(a.dy), reduction, row, rows, f32);
    Value gs = b.create<arith::DivFOp>(k.loc, g, s);
    Value outside = targetOutside(k, raw, cols);
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
      k.fault(outside);
      b.create<memref::StoreOp>(k.loc, subf(lse, xt), fn.getArgument(a.loss), row);
    });
    Value dt = mulf(g, subf(k.expViaExp2(subf(xt, lse)), k.fconst(f32, 1.0)));
    // Pass 2: the gradient from shared memory.
    for (int64_t gi = 0; gi < groups; ++gi) {
      Value f = b.create<arith::SelectOp>(k.loc, isNegInf(groupMax[gi]), zero,
                                          mulf(k.expViaExp2(subf(groupMax[gi], m)), gs));
      for (int64_t u = gi * kGroup; u < std::min(per, (gi + 1) * kGroup); ++u) {
        auto [v, in] = vectorAt(u);
        k.ifThen(in, [&] {
          Value ev = b.create<arith::ExtFOp>(k.loc, f32x4,
                                             b.create<memref::LoadOp>(k.loc, eBuf, v).getResult());
          Value atTarget =
              b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, v, target.vector);
          SmallVector<Value> out;
          for (int64_t l = 0; l < kVector; ++l) {
            Value hit = b.create<arith::AndIOp>(k.loc, atTarget, target.lane[l]);
            Value d = b.create<arith::SelectOp>(k.loc, hit, dt, mulf(lane(ev, l), f));
            // Padding's gradient is 0 even where f is not finite (a non-finite logit).
            if (Value keep = cols != stride ? logitLane(u, v, in, l) : Value())
              d = b.create<arith::SelectOp>(k.loc, keep, d, zero);
            out.push_back(d);
          }
          Value d = b.create<arith::TruncFOp>(k.loc, VectorType::get({kVector}, outElem),
                                              b.create<vector::FromElementsOp>(k.loc, f32x4, out));
          b.create<memref::StoreOp>(k.loc, d, fn.getArgument(a.d), k.add(base, v));
        });
      }
    }
  });
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, kBlock};
  launch.sharedBytes = sharedBytes;
  return launch;
}
