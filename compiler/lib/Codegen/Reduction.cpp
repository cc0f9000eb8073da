//===- Reduction.cpp - reductions and row kernels ---------------------------===//
//
// reduce_{sum,mean,max,min,prod,l2}. "Row" layout (the innermost input
// dimension is reduced): one block per output element, threads stride over the
// reduced elements (coalesced), then a warp-shuffle + shared memory block
// reduction. "Column" layout: 32 outputs per block across lanes (coalesced),
// 8 warps split the reduced range, partials combined through shared memory.
// Row kernels: softmax, log_softmax and their gradients over the last axis,
// one block per row. Also argmax, top_k and cumsum.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

#include <functional>


std::optional<ReduceKind> kernelgen::reduceKind(Operation *op) {
  auto addf = [](Body &k, Value a, Value c) -> Value { return k.b.create<arith::AddFOp>(k.loc, a, c); };
  if (isa<ReduceSumOp>(op))
    return ReduceKind{addf, 0.0};
  if (isa<ReduceMeanOp>(op))
    return ReduceKind{addf, 0.0, false, true};
  if (isa<ReduceL2Op>(op))
    return ReduceKind{addf, 0.0, true, false, true};
  if (isa<ReduceProdOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MulFOp>(k.loc, a, c);
                      },
                      1.0};
  if (isa<ReduceMaxOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MaximumFOp>(k.loc, a, c);
                      },
                      -INFINITY};
  if (isa<ReduceMinOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MinimumFOp>(k.loc, a, c);
                      },
                      INFINITY};
  return std::nullopt;
}

namespace {
/// Index of the element at (kept index o, reduced index r): the sum over both
/// groups' dimensions of unravelled index times stride.
struct DimGroup {
  SmallVector<int64_t> sizes, strides;
  int64_t count() const {
    int64_t c = 1;
    for (int64_t s : sizes)
      c *= s;
    return c;
  }
  Value offset(Body &k, Value linear) const {
    if (sizes.empty())
      return k.idx(0);
    if (sizes.size() == 1)
      return strides[0] == 1 ? linear : k.mul(linear, k.idx(strides[0]));
    Value at = k.idx(0), rest = linear;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      Value i = d == 0 ? rest : k.rem(rest, sizes[d]);
      if (d > 0)
        rest = k.div(rest, sizes[d]);
      at = k.add(at, k.mul(i, k.idx(strides[d])));
    }
    return at;
  }
};
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::reduceKernel(Operation *op, StringRef name) {
  auto kind = reduceKind(op);
  auto inType = tensorType(op->getOperand(0));
  auto outType = tensorType(op->getResult(0));
  auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes");
  // [begin, end) of the result that is 0 (forge-elide-centred-sums): written as 0, and where
  // whole output blocks of the column layout lie inside it, not read at all.
  auto zeroOutputs = op->getAttrOfType<DenseI64ArrayAttr>("zero_outputs");
  Type elem = inType.getElementType();
  // The result may be stored in another float type (forge-assign-precision:
  // a bf16 gradient summed into an f32 bias gradient).
  Type outElem = outType.getElementType();
  if (!kind || !axes || !isFloat(elem) || !isFloat(outElem) ||
      (outElem != elem && (isFloat8(elem) || isFloat8(outElem))) || inType.getNumElements() == 0)
    return std::nullopt;

  // Kept and reduced dimension groups (size-1 dims dropped, adjacent dims of
  // one class merged: they are contiguous in the input).
  DimGroup kept, reduced;
  SmallVector<int64_t> strides = contiguousStrides(inType.getShape());
  int lastClass = -1;
  for (int64_t d = 0; d < inType.getRank(); ++d) {
    int64_t size = inType.getDimSize(d);
    if (size == 1)
      continue;
    int cls = llvm::is_contained(axes.asArrayRef(), d) ? 1 : 0;
    DimGroup &g = cls ? reduced : kept;
    if (cls == lastClass) {
      g.sizes.back() *= size;
      g.strides.back() = strides[d];
    } else {
      g.sizes.push_back(size);
      g.strides.push_back(strides[d]);
    }
    lastClass = cls;
  }
  int64_t outputs = kept.count(), count = reduced.count();
  bool rowLayout = lastClass == 1; // the innermost (contiguous) dim is reduced
  Type accType = computeType(elem); // the accumulator: f32, or f64 for f64
  // Columns in vectors: a lane takes 4 consecutive outputs of one contiguous
  // kept group (8-byte bf16 / 16-byte f32 loads; a warp then reads 128
  // outputs of a row, where 32 bf16 outputs were 64 bytes per load: the
  // bias gradients of [tokens, features] ran at ~1.8 TB/s). With kept dims
  // outside the reduced ones too ([B, T, C] over T: dk's mean over the keys
  // ran at 1.4 TB/s), the contiguous group must hold whole warps of vectors,
  // so that a warp's 128 outputs are one run of memory (else one output per
  // lane, or the chunked form below for groups that are not whole warps).
  const bool contiguousOutputs = !rowLayout && !kept.sizes.empty() && kept.strides.back() == 1;
  const int64_t lanes =
      contiguousOutputs && (elem.isF32() || elem.isBF16() || elem.isF16()) &&
              (kept.sizes.size() == 1 ? outputs % kVector == 0
                                      : kept.sizes.back() % (kWarp * kVector) == 0)
          ? kVector
          : 1;
  // Channels-last pooling ([N, H, W, C] over H and W) with C not a multiple
  // of 32: 32 consecutive outputs would straddle images (runs of C elements
  // a warp). Instead a warp takes `cw` channels of one image (cw = C when it
  // divides 32, else 32, C in chunks of 32) and 32 / cw rows of them per
  // load: 32 consecutive elements. The innermost kept group must be the
  // contiguous one and the reduced rows directly outside it.
  const int64_t channels = kept.sizes.empty() ? 0 : kept.sizes.back();
  const bool chunked = !rowLayout && lanes == 1 && kept.sizes.size() >= 2 &&
                       kept.strides.back() == 1 && !reduced.sizes.empty() &&
                       reduced.strides.back() == channels && channels % kWarp != 0;
  // Channels-first sums ([N, C, H, W] over N, H and W) with planes of
  // run = H * W < 32 elements (a power of two): a block per output would
  // read runs of `run` elements a warp. Instead a warp takes 32 / run
  // channels' planes of one image at once (32 consecutive elements), lanes of
  // a channel combine by shuffles, warps take images in turn.
  const int64_t run = reduced.sizes.empty() ? 0 : reduced.sizes.back();
  const bool planes = rowLayout && !kept.sizes.empty() && reduced.strides.back() == 1 &&
                      run > 1 && run < kWarp && kWarp % run == 0 &&
                      kept.strides.back() == run && reduced.sizes.size() >= 2;
  const int64_t cw = planes ? kWarp / run
                     : chunked && kWarp % channels == 0 ? channels
                                                        : kWarp;
  const int64_t chunks = chunked || planes ? (channels + cw - 1) / cw : 0;
  Type smem = sharedBuffer(rowLayout && !planes ? kWarp : 256 * lanes, accType);
  int64_t block = rowLayout && !planes ? chooseBlockSize(target, count, 32, kWarp * 4) : 256;
  int64_t outBlocks = chunked || planes ? outputs / channels * chunks
                      : rowLayout      ? outputs
                                       : (outputs + kWarp * lanes - 1) / (kWarp * lanes);
  // Column layout over one kept group (output index = element offset): the output blocks
  // wholly inside zero_outputs are not launched (their outputs stay as the launch's memset
  // left them; so only with split sums, below).
  int64_t skipFirst = 0, skipBlocks = 0;
  const int64_t colPerBlock = kWarp * lanes;
  if (zeroOutputs && !rowLayout && !chunked && !planes && kept.sizes.size() == 1) {
    int64_t begin = zeroOutputs[0], end = zeroOutputs[1];
    skipFirst = (begin + colPerBlock - 1) / colPerBlock;
    // At least one block stays (a range over every block: it writes the zeros itself).
    skipBlocks = std::clamp<int64_t>(end / colPerBlock - skipFirst, 0, outBlocks - 1);
    outBlocks -= skipBlocks;
  }
  if (outBlocks > (int64_t(1) << 31) - 1)
    return std::nullopt;
  // Too few output blocks to fill the GPU: split the reduced range over more
  // blocks, whose partial sums are added atomically (f32 or f64 sums and means;
  // the order of the additions, and so the last bits, may vary run to run).
  bool additive = (isa<ReduceSumOp>(op) || isa<ReduceMeanOp>(op)) && outElem == accType;
  int64_t perBlock = (rowLayout ? block : block / kWarp) * 16; // reduced elements per chunk, at least
  int64_t splits = 1;
  if (additive && outBlocks < 2 * target.typicalSMs)
    splits = std::clamp<int64_t>(std::min<int64_t>(4 * target.typicalSMs / outBlocks,
                                                   (count + perBlock - 1) / perBlock),
                                 1, 65535);
  if (skipBlocks && splits == 1) { // no memset: every block is launched and writes its zeros
    outBlocks += skipBlocks;
    skipBlocks = 0;
  }
  int64_t chunk = (count + splits - 1) / splits;
  int64_t grid = outBlocks * splits;

  OpBuilder b(context);
  auto fn = newKernel(b, name, {flatMemref(elem, inType.getNumElements(), lanes > 1),
                                flatMemref(outElem, outType.getNumElements())},
                      block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value in = fn.getArgument(0), out = fn.getArgument(1), sh = fn.getWorkgroupAttributions()[0];
  Value identity = k.fconst(accType, kind->identity);
  auto combine = [&](Value a, Value c) { return kind->combine(k, a, c); };
  auto element = [&](Value base, Value r) {
    Value x = k.load(in, k.add(base, reduced.offset(k, r)), elem);
    return kind->square ? Value(b.create<arith::MulFOp>(k.loc, x, x)) : x;
  };
  auto finish = [&](Value acc, Value o) {
    if (zeroOutputs) {
      Value inside = b.create<arith::AndIOp>(
          k.loc, k.ult(o, k.idx(zeroOutputs[1])),
          b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::uge, o, k.idx(zeroOutputs[0])));
      acc = b.create<arith::SelectOp>(k.loc, inside, k.fconst(accType, 0.0), acc);
    }
    if (kind->mean)
      acc = b.create<arith::DivFOp>(k.loc, acc, k.fconst(accType, static_cast<double>(count)));
    if (kind->sqrt)
      acc = b.create<math::SqrtOp>(k.loc, acc);
    if (splits > 1)
      b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, acc, out, ValueRange{o});
    else
      k.store(acc, out, o, outElem);
  };
  // This block's output block and its chunk [rBegin, rEnd) of the reduced range.
  Value outBlock = splits > 1 ? k.rem(k.bid(), outBlocks) : k.bid();
  Value rBegin = splits > 1 ? k.mul(k.div(k.bid(), outBlocks), k.idx(chunk)) : k.idx(0);
  Value rEnd = splits > 1 ? Value(b.create<arith::MinUIOp>(k.loc, k.add(rBegin, k.idx(chunk)),
                                                           k.idx(count)))
                          : k.idx(count);

  // Thread t < cw, where `mine` holds: its channel's total over the warps'
  // partials (sh[w * cw + t]), finished at output o.
  auto warpTotals = [&](int64_t warps, Value mine, Value o) {
    Value t = k.tid();
    k.ifThen(mine, [&] {
      Value total = b.create<memref::LoadOp>(k.loc, sh, t);
      for (int64_t w = 1; w < warps; ++w)
        total = combine(total, b.create<memref::LoadOp>(k.loc, sh, k.add(t, k.idx(w * cw))));
      finish(total, o);
    });
  };
  if (planes) {
    // Output block: (outer kept index, chunk of cw channels); lane l: element
    // l % run of channel chunk * cw + l / run; warp w: reduced rows (images)
    // w, w + warps, ... of the block's share.
    const int64_t warps = block / kWarp, rowsO = count / run;
    DimGroup outer = kept, images = reduced;
    outer.sizes.pop_back();
    outer.strides.pop_back();
    images.sizes.pop_back();
    images.strides.pop_back();
    const int64_t chunkO = (rowsO + splits - 1) / splits;
    Value t = k.tid();
    Value lane = k.rem(t, kWarp), warp = k.div(t, kWarp);
    Value n = k.div(outBlock, chunks);
    Value c = k.add(k.mul(k.rem(outBlock, chunks), k.idx(cw)), k.div(lane, run));
    Value valid = channels % cw != 0 ? k.ult(c, k.idx(channels)) : Value();
    Value base = k.add(k.add(outer.offset(k, n), k.mul(c, k.idx(kept.strides.back()))),
                       k.rem(lane, run));
    Value oBegin = splits > 1 ? k.mul(k.div(k.bid(), outBlocks), k.idx(chunkO)) : k.idx(0);
    Value oEnd = splits > 1 ? Value(b.create<arith::MinUIOp>(k.loc, k.add(oBegin, k.idx(chunkO)),
                                                             k.idx(rowsO)))
                            : k.idx(rowsO);
    Value acc = k.loopAcc(k.add(oBegin, warp), oEnd, k.idx(warps), identity, [&](Value r, Value a) {
      return k.valueIf(
          valid,
          [&] {
            Value x = k.load(in, k.add(base, images.offset(k, r)), elem);
            return combine(a, kind->square ? Value(b.create<arith::MulFOp>(k.loc, x, x)) : x);
          },
          a);
    });
    acc = k.butterfly(acc, 1, run, combine);
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.rem(lane, run), k.idx(0)),
             [&] {
               b.create<memref::StoreOp>(k.loc, acc, sh,
                                         k.add(k.mul(warp, k.idx(cw)), k.div(lane, run)));
             });
    b.create<gpu::BarrierOp>(k.loc);
    // Thread q < cw: channel chunk * cw + q, over the warps.
    Value cq = k.add(k.mul(k.rem(outBlock, chunks), k.idx(cw)), t);
    Value mine = k.ult(t, k.idx(cw));
    if (channels % cw != 0)
      mine = b.create<arith::AndIOp>(k.loc, mine, k.ult(cq, k.idx(channels)));
    warpTotals(warps, mine, k.add(k.mul(n, k.idx(channels)), cq));
  } else if (chunked) {
    // Output block: (image n, chunk of cw channels); lane l: channel
    // chunk * cw + l % cw of row group l / cw; warps take row groups in turn.
    const int64_t groups = kWarp / cw, warps = block / kWarp;
    DimGroup outer = kept;
    outer.sizes.pop_back();
    outer.strides.pop_back();
    Value t = k.tid();
    Value lane = k.rem(t, kWarp), warp = k.div(t, kWarp);
    Value n = k.div(outBlock, chunks);
    Value c = k.add(k.mul(k.rem(outBlock, chunks), k.idx(cw)), k.rem(lane, cw));
    Value valid = channels % cw != 0 ? k.ult(c, k.idx(channels)) : Value();
    Value base = k.add(outer.offset(k, n), c);
    Value acc = k.loopAcc(k.add(rBegin, k.add(k.mul(warp, k.idx(groups)), k.div(lane, cw))),
                          rEnd, k.idx(warps * groups), identity, [&](Value r, Value a) {
                            return k.valueIf(valid, [&] { return combine(a, element(base, r)); },
                                             a);
                          });
    // Lanes of one channel (cw, 2 cw, ... apart), then the warps.
    acc = k.butterfly(acc, cw, kWarp, combine);
    k.ifThen(k.ult(lane, k.idx(cw)),
             [&] { b.create<memref::StoreOp>(k.loc, acc, sh, k.add(k.mul(warp, k.idx(cw)), lane)); });
    b.create<gpu::BarrierOp>(k.loc);
    Value mine = k.ult(t, k.idx(cw));
    if (valid)
      mine = b.create<arith::AndIOp>(k.loc, mine, valid);
    warpTotals(warps, mine, k.add(k.mul(n, k.idx(channels)), c));
  } else if (rowLayout) {
    Value o = outBlock;
    Value base = kept.offset(k, o);
    Value acc = k.loopAcc(k.add(rBegin, k.tid()), rEnd, k.idx(block), identity,
                          [&](Value r, Value a) { return combine(a, element(base, r)); });
    acc = k.blockReduce(acc, block / kWarp, sh, identity, combine);
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)),
             [&] { finish(acc, o); });
  } else {
    // lanes: 32 threads of `lanes` consecutive outputs each (4 in one vector
    // load of each row when `lanes` is 4); warps: slices of the reduced
    // range. Shared memory holds the accumulators output by output:
    // sh[l * block + t].
    Value t = k.tid();
    Value lane = k.rem(t, kWarp), warp = k.div(t, kWarp);
    if (skipBlocks) // past the skipped blocks of zero_outputs
      outBlock = b.create<arith::SelectOp>(
          k.loc,
          b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::uge, outBlock, k.idx(skipFirst)),
          k.add(outBlock, k.idx(skipBlocks)), outBlock);
    Value o = k.add(k.mul(outBlock, k.idx(kWarp)), lane); // the thread's first output
    if (lanes > 1)
      o = k.mul(o, k.idx(lanes));
    Value oc = b.create<arith::MinUIOp>(k.loc, o, k.idx(outputs - lanes));
    // The input offset of output oc (with lanes, the first of its vector: the
    // contiguous group holds whole vectors, so they are adjacent in memory).
    Value base = kept.offset(k, oc);
    auto plus = [&](Value v, int64_t offset) { return offset ? k.add(v, k.idx(offset)) : v; };
    // The thread's outputs' elements of reduced row r.
    auto rowValues = [&](Value r) -> SmallVector<Value> {
      if (lanes == 1)
        return {element(base, r)};
      Value v =
          b.create<memref::LoadOp>(k.loc, in, k.div(k.add(base, reduced.offset(k, r)), lanes));
      SmallVector<Value> xs;
      for (int64_t l = 0; l < lanes; ++l) {
        Value x = k.toCompute(b.create<vector::ExtractOp>(k.loc, v, l), elem);
        xs.push_back(kind->square ? Value(b.create<arith::MulFOp>(k.loc, x, x)) : x);
      }
      return xs;
    };
    // Each iteration takes `unroll` of the warp's rows (r, r + warps, ...)
    // and loads them all before it combines: one load in flight per thread
    // left the bias gradients of [tokens, features] at ~2.7 TB/s. Rows past
    // the chunk load a row inside it and combine nothing; the order of the
    // combines is the one-row-per-iteration order (the same bits).
    int64_t warps = block / kWarp, unroll = 4;
    Value lastRow = k.b.create<arith::SubIOp>(k.loc, rEnd, k.idx(1));
    SmallVector<Value> init(lanes, identity);
    auto loop = b.create<scf::ForOp>(
        k.loc, k.add(rBegin, warp), rEnd, k.idx(warps * unroll), init,
        [&](OpBuilder &nb, Location l, Value r, ValueRange acc) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          SmallVector<SmallVector<Value>> rows;
          SmallVector<Value> inRange;
          for (int64_t j = 0; j < unroll; ++j) {
            Value rj = k.add(r, k.idx(j * warps));
            inRange.push_back(k.ult(rj, rEnd));
            rows.push_back(rowValues(b.create<arith::MinUIOp>(k.loc, rj, lastRow)));
          }
          SmallVector<Value> next(acc.begin(), acc.end());
          for (int64_t j = 0; j < unroll; ++j)
            for (int64_t ln = 0; ln < lanes; ++ln)
              next[ln] = j == 0 ? combine(next[ln], rows[j][ln])
                                : b.create<arith::SelectOp>(k.loc, inRange[j],
                                                            combine(next[ln], rows[j][ln]),
                                                            next[ln]);
          b.create<scf::YieldOp>(l, next);
        });
    for (int64_t ln = 0; ln < lanes; ++ln)
      b.create<memref::StoreOp>(k.loc, loop.getResult(ln), sh, plus(t, ln * block));
    b.create<gpu::BarrierOp>(k.loc);
    // The block's kWarp * lanes outputs, one per thread (output q of the
    // block by thread q): adjacent threads write adjacent outputs (coalesced;
    // warp 0 alone, `lanes` outputs per thread, wrote with stride `lanes`).
    const int64_t perBlock = kWarp * lanes;
    for (int64_t q0 = 0; q0 < perBlock; q0 += block) {
      Value q = plus(t, q0);
      Value owner = k.div(q, lanes), ln = k.rem(q, lanes);
      Value oq = k.add(k.mul(outBlock, k.idx(perBlock)), q);
      Value mine = b.create<arith::AndIOp>(k.loc, k.ult(q, k.idx(perBlock)),
                                           k.ult(oq, k.idx(outputs)));
      k.ifThen(mine, [&] {
        Value at = k.add(k.mul(ln, k.idx(block)), owner);
        Value total = b.create<memref::LoadOp>(k.loc, sh, at);
        for (int64_t w = 1; w < warps; ++w)
          total = combine(total, b.create<memref::LoadOp>(k.loc, sh, plus(at, w * kWarp)));
        finish(total, oq);
      });
    }
  }
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, block};
  launch.zeroOutputs = splits > 1;
  return launch;
}

namespace {
/// How a row kernel reads and writes its row: `load(j, c)` is operand j of
/// the row op at column c (an f32 compute value), `store(c, v)` takes the row
/// op's value v at column c.
struct RowAccess {
  function_ref<Value(unsigned, Value)> load;
  function_ref<void(Value, Value)> store;
};

/// One row of a softmax-family op: the block's threads take columns tid,
/// tid + block, ...; reductions combine per thread in that order, then across
/// the block (so both forms below give the same bits). Rows of at most
/// kRowCache * block columns are loaded once into registers; longer rows are
/// read again per pass. False for an op that is not a row op.
bool emitRowBody(Body &k, Operation *op, int64_t cols, int64_t block, Value sh, RowAccess io) {
  OpBuilder &b = k.b;
  Type f32 = b.getF32Type();
  auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, a, c); };
  auto maxf = [&](Value a, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, a, c); };
  auto mulf = [&](Value a, Value c) -> Value { return b.create<arith::MulFOp>(k.loc, a, c); };
  auto subf = [&](Value a, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, a, c); };
  auto expf = [&](Value a) -> Value { return b.create<math::ExpOp>(k.loc, a); };
  Value zero = k.fconst(f32, 0.0), ninf = k.fconst(f32, -INFINITY);

  // A position in the row: column c, and t-th column of this thread when cached.
  struct Pos {
    Value c;
    int64_t t;
  };
  int64_t perThread = (cols + block - 1) / block;
  bool cached = perThread <= kRowCache;
  bool ragged = cols % block != 0;
  SmallVector<Pos> positions;
  SmallVector<Value> valid; // null: always in range
  SmallVector<SmallVector<Value>> cache(op->getNumOperands());
  if (cached) {
    for (int64_t t = 0; t < perThread; ++t) {
      Value c = k.add(k.tid(), k.idx(t * block));
      positions.push_back({c, t});
      valid.push_back(ragged && t == perThread - 1 ? k.ult(c, k.idx(cols)) : Value());
    }
    for (unsigned j = 0; j < op->getNumOperands(); ++j)
      for (int64_t t = 0; t < perThread; ++t)
        cache[j].push_back(
            k.valueIf(valid[t], [&] { return io.load(j, positions[t].c); }, zero));
  }
  auto x = [&](unsigned j, Pos p) { return cached ? cache[j][p.t] : io.load(j, p.c); };
  auto reduce = [&](Value identity, function_ref<Value(Value, Value)> combine,
                    function_ref<Value(Pos)> term) {
    if (!cached)
      return k.blockAccumulate(cols, block, sh, identity, combine,
                               [&](Value c) { return term({c, -1}); });
    return k.reduceColumns(valid, block / kWarp, sh, identity, combine,
                           [&](int64_t t) { return term(positions[t]); });
  };
  auto write = [&](function_ref<Value(Pos)> value) {
    if (cached) {
      for (int64_t t = 0; t < perThread; ++t) {
        k.ifThen(valid[t], [&] { io.store(positions[t].c, value(positions[t])); });
      }
      return;
    }
    k.loop(k.tid(), k.idx(cols), k.idx(block), [&](Value c) { io.store(c, value({c, -1})); });
  };

  if (isa<SoftmaxOp>(op) || isa<LogSoftmaxOp>(op)) {
    Value m = reduce(ninf, maxf, [&](Pos p) { return x(0, p); });
    Value s = reduce(zero, addf, [&](Pos p) { return expf(subf(x(0, p), m)); });
    if (isa<SoftmaxOp>(op)) {
      Value inv = b.create<arith::DivFOp>(k.loc, k.fconst(f32, 1.0), s);
      write([&](Pos p) { return mulf(expf(subf(x(0, p), m)), inv); });
    } else {
      Value shift = addf(m, b.create<math::LogOp>(k.loc, s));
      write([&](Pos p) { return subf(x(0, p), shift); });
    }
  } else if (isa<SoftmaxGradOp>(op)) { // (y, dy): y * (dy - sum(dy * y))
    Value d = reduce(zero, addf, [&](Pos p) { return mulf(x(0, p), x(1, p)); });
    write([&](Pos p) { return mulf(x(0, p), subf(x(1, p), d)); });
  } else if (isa<LogSoftmaxGradOp>(op)) { // (y, dy): dy - exp(y) * sum(dy)
    Value s = reduce(zero, addf, [&](Pos p) { return x(1, p); });
    write([&](Pos p) { return subf(x(1, p), mulf(expf(x(0, p)), s)); });
  } else {
    return false;
  }
  return true;
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::rowKernel(Operation *op, StringRef name) {
  auto inType = tensorType(op->getOperand(0));
  auto axis = op->getAttrOfType<IntegerAttr>("axis");
  Type elem = inType.getElementType();
  if (!axis || !(elem.isF32() || elem.isF16() || elem.isBF16()) || inType.getRank() == 0 ||
      inType.getNumElements() == 0)
    return std::nullopt;
  int64_t ax = axis.getInt() < 0 ? axis.getInt() + inType.getRank() : axis.getInt();
  if (ax < 0 || ax >= inType.getRank())
    return std::nullopt;
  for (Value v : op->getOperands())
    if (tensorType(v) != inType)
      return std::nullopt;
  // A row is the `axis` dim at one (outer, inner) position: element c of row r
  // is at (r / inner * cols + c) * inner + r % inner (inner = 1: contiguous rows).
  int64_t cols = inType.getDimSize(ax), rows = inType.getNumElements() / cols;
  int64_t inner = 1;
  for (int64_t d = ax + 1; d < inType.getRank(); ++d)
    inner *= inType.getDimSize(d);
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  SmallVector<Type> args;
  for (Value v : op->getOperands())
    args.push_back(flatMemref(elem, tensorType(v).getNumElements()));
  args.push_back(flatMemref(elem, inType.getNumElements()));

  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value out = fn.getArgument(op->getNumOperands());
  Value row = k.bid();
  Value base = inner == 1 ? k.mul(row, k.idx(cols))
                          : k.add(k.mul(k.div(row, inner), k.idx(cols * inner)), k.rem(row, inner));
  auto at = [&](Value c) { return k.add(base, inner == 1 ? c : k.mul(c, k.idx(inner))); };
  auto load = [&](unsigned j, Value c) { return k.load(fn.getArgument(j), at(c), elem); };
  auto store = [&](Value c, Value v) { k.store(v, out, at(c), elem); };
  if (!emitRowBody(k, op, cols, block, sh, {load, store})) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

/// A row region: the row kernel of its row op, whose loads evaluate the
/// prologue per element from the region's inputs (broadcast through
/// per-row offsets and a column stride) and whose stores evaluate the
/// epilogue. Body values pass through their storage form, as in loop regions.
std::optional<KernelLaunch> KernelGenerator::Impl::rowFusionKernel(FusionOp fusion,
                                                                   StringRef name) {
  Block &body = fusion.getBlock();
  Operation *rowOp = nullptr;
  for (Operation &op : body.without_terminator()) {
    if (isInnermostRowOp(&op))
      rowOp = &op;
    if (!faultOf(&op).empty())
      return std::nullopt; // no fault arguments in row kernels
    auto float8 = [](Value v) { return isFloat8(tensorType(v).getElementType()); };
    if (llvm::any_of(op.getOperands(), float8) || llvm::any_of(op.getResults(), float8))
      return std::nullopt;
  }
  if (!rowOp)
    return std::nullopt;
  Type rowElem = tensorType(rowOp->getResult(0)).getElementType();
  if (!(rowElem.isF32() || rowElem.isF16() || rowElem.isBF16()))
    return std::nullopt;
  ArrayRef<int64_t> shape = fusion.getIterationShape();
  int64_t rank = static_cast<int64_t>(shape.size());
  int64_t cols = shape.back(), numel = tensorType(fusion.getResult(0)).getNumElements();
  if (numel == 0)
    return std::nullopt;
  int64_t rows = numel / cols;
  Type outElem = tensorType(fusion.getResult(0)).getElementType();
  SmallVector<Type> args;
  SmallVector<SmallVector<int64_t>> strides;
  for (Value v : fusion.getInputs()) {
    args.push_back(flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements()));
    strides.push_back(broadcastStrides(tensorType(v).getShape(), shape));
  }
  args.push_back(flatMemref(outElem, numel));
  Type smem = sharedBuffer(kWarp, Float32Type::get(context));
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);

  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {smem});
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value out = fn.getArgument(fusion.getInputs().size());
  Value row = k.bid();
  // Each input's offset at column 0 of this row: the row index unravelled
  // over the outer dimensions, dotted with the input's strides.
  SmallVector<Value> rowIndex(rank - 1);
  Value rest = row;
  for (int64_t d = rank - 2; d >= 0; --d) {
    rowIndex[d] = d == 0 ? rest : k.rem(rest, shape[d]);
    if (d > 0)
      rest = k.div(rest, shape[d]);
  }
  SmallVector<Value> rowOffset;
  for (const SmallVector<int64_t> &st : strides) {
    Value off = k.idx(0);
    for (int64_t d = 0; d < rank - 1; ++d)
      if (st[d] != 0)
        off = k.add(off, k.mul(rowIndex[d], k.idx(st[d])));
    rowOffset.push_back(off);
  }
  Value base = k.mul(row, k.idx(cols));
  // Body argument m at column c: its row offset plus c times its column stride.
  auto evalAt = [&](Value v, Value c, llvm::DenseMap<Value, Value> &stored) {
    return evalBodyValue(k, v, stored, [&](BlockArgument arg) -> Value {
      unsigned m = arg.getArgNumber();
      int64_t colStride = strides[m].back();
      Value at = colStride == 0 ? rowOffset[m] : k.add(rowOffset[m], k.mul(c, k.idx(colStride)));
      return b.create<memref::LoadOp>(k.loc, fn.getArgument(m), at);
    });
  };
  bool ok = true;
  Value zero = k.fconst(Float32Type::get(context), 0.0);
  auto load = [&](unsigned j, Value c) -> Value {
    llvm::DenseMap<Value, Value> stored;
    Value v = evalAt(rowOp->getOperand(j), c, stored);
    if (!v) {
      ok = false;
      return zero;
    }
    return k.toCompute(v, rowElem);
  };
  Value rowResult = rowOp->getResult(0), yielded = body.getTerminator()->getOperand(0);
  auto store = [&](Value c, Value v) {
    llvm::DenseMap<Value, Value> stored;
    stored[rowResult] = k.toStorage(v, rowElem);
    Value y = evalAt(yielded, c, stored);
    if (!y) {
      ok = false;
      return;
    }
    b.create<memref::StoreOp>(k.loc, y, out, k.add(base, c));
  };
  if (!emitRowBody(k, rowOp, cols, block, sh, {load, store}) || !ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::argmaxKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() == 0 || !(elem.isF32() || elem.isF16() || elem.isBF16()))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, d, q] = aroundAxis(in.getShape(), axis);
  bool last = op->getAttrOfType<BoolAttr>("select_last_index").getValue();
  if (q == 1)
    return argmaxRowsKernel(op, name, p, d, elem, last);
  // One thread per output; the first NaN wins (as the CPU kernel and NumPy).
  // Outputs along a middle axis: consecutive threads read consecutive
  // elements (q apart from the next output's run).
  return elementKernel(
      name, flatArgs(op), p * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value o) {
        OpBuilder &b = k.b;
        Value base = k.add(k.mul(k.div(o, q), k.idx(d * q)), k.rem(o, q));
        Value first = k.load(fn.getArgument(0), base, elem);
        auto loop = b.create<scf::ForOp>(
            k.loc, k.idx(1), k.idx(d), k.idx(1), ValueRange{first, k.idx(0)},
            [&](OpBuilder &nb, Location l, Value j, ValueRange acc) {
              OpBuilder::InsertionGuard g(b);
              b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
              Value v = k.load(fn.getArgument(0), k.add(base, k.mul(j, k.idx(q))), elem);
              Value better = b.create<arith::CmpFOp>(
                  l, last ? arith::CmpFPredicate::OGE : arith::CmpFPredicate::OGT, v, acc[0]);
              Value vnan = b.create<arith::CmpFOp>(l, arith::CmpFPredicate::UNO, v, v);
              Value bestNan = b.create<arith::CmpFOp>(l, arith::CmpFPredicate::UNO, acc[0], acc[0]);
              Value take = b.create<arith::OrIOp>(l, better, vnan);
              take = b.create<arith::AndIOp>(
                  l, take, b.create<arith::XOrIOp>(l, bestNan, b.create<arith::ConstantIntOp>(l, 1, 1)));
              b.create<scf::YieldOp>(l, ValueRange{b.create<arith::SelectOp>(l, take, v, acc[0]),
                                                   b.create<arith::SelectOp>(l, take, j, acc[1])});
            });
        Value idx = b.create<arith::IndexCastOp>(k.loc, b.getI64Type(), loop.getResult(1));
        b.create<memref::StoreOp>(k.loc, idx, fn.getArgument(1), o);
      });
}

/// arg-max along the innermost axis: a warp per row (lane l scans elements l,
/// l + 32, ... in order, so its reads and the warp's are contiguous), then the
/// lanes' (value, index) pairs combine by shuffles in the order the CPU
/// kernel's scan gives: the first NaN wins, else the larger value, equal
/// values by the lower index (the higher with select_last_index). The
/// combination is associative and commutative, so the butterfly order does
/// not matter. Lane 0 stores the row's index.
std::optional<KernelLaunch> KernelGenerator::Impl::argmaxRowsKernel(Operation *op, StringRef name,
                                                                    int64_t rows, int64_t d,
                                                                    Type elem, bool last) {
  if (d >= (int64_t(1) << 31))
    return std::nullopt; // indices travel as i32 in the shuffles
  return warpKernel(name, flatArgs(op), rows, op->getLoc(),
                    [&](Body &k, gpu::GPUFuncOp fn, Value row, Value lane) {
    OpBuilder &b = k.b;
    Location loc = k.loc;
    Type f32 = b.getF32Type(), i32 = b.getI32Type();
    Value base = k.mul(row, k.idx(d));
    // The lane's scan, in index order: empty (index -1) until its first element.
    auto scan = b.create<scf::ForOp>(
        loc, lane, k.idx(d), k.idx(kWarp),
        ValueRange{k.fconst(f32, NAN), b.create<arith::ConstantIntOp>(loc, -1, 32)},
        [&](OpBuilder &nb, Location l, Value j, ValueRange acc) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          Value v = k.load(fn.getArgument(0), k.add(base, j), elem);
          if (v.getType() != f32)
            v = b.create<arith::ExtFOp>(l, f32, v);
          Value ji = b.create<arith::IndexCastOp>(l, i32, j);
          Value take = k.beatsInOrder(v, ji, acc[0], acc[1], last);
          b.create<scf::YieldOp>(l, ValueRange{b.create<arith::SelectOp>(l, take, v, acc[0]),
                                               b.create<arith::SelectOp>(l, take, ji, acc[1])});
        });
    Value index = k.butterflyBest(scan.getResult(0), scan.getResult(1), 1, kWarp, last).second;
    k.ifThen(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, lane, k.idx(0)), [&] {
      b.create<memref::StoreOp>(loc, b.create<arith::ExtSIOp>(loc, b.getI64Type(), index),
                                fn.getArgument(1), row);
    });
  });
}

/// top_k: one thread per input element; its rank in its line is the number of
/// elements before it in the order (larger, or smaller, first; equal with a
/// lower index; NaN above every number, as the CPU kernel), and it writes
/// itself to position rank when rank < k. O(d^2) per line but parallel and
/// deterministic: the order is total, so every output is written exactly once.
std::optional<KernelLaunch> KernelGenerator::Impl::topKKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() == 0 || in.getNumElements() == 0 || elem.isInteger(1))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, d, q] = aroundAxis(in.getShape(), axis);
  // Long lines (a vocabulary) would cost d^2 compares each: the host's partial
  // sort is cheaper there until a sorting kernel exists.
  constexpr int64_t kMaxLine = 4096;
  if (d > kMaxLine)
    return std::nullopt;
  int64_t topK = op->getAttrOfType<IntegerAttr>("k").getInt();
  bool largest = op->getAttrOfType<BoolAttr>("largest").getValue();
  bool fl = isFloat(elem), isUnsigned = isUnsignedInt(elem);
  return elementKernel(
      name, flatArgs(op), p * d * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        OpBuilder &b = k.b;
        Location loc = k.loc;
        Value c = k.rem(i, q), j = k.rem(k.div(i, q), d), o = k.div(i, d * q);
        Value base = k.add(k.mul(o, k.idx(d * q)), c);
        Value v = k.load(fn.getArgument(0), i, elem);
        auto cmpf = [&](arith::CmpFPredicate pr, Value a, Value e) -> Value {
          return b.create<arith::CmpFOp>(loc, pr, a, e);
        };
        auto cmpi = [&](arith::CmpIPredicate pr, Value a, Value e) -> Value {
          return b.create<arith::CmpIOp>(loc, pr, a, e);
        };
        auto andi = [&](Value a, Value e) -> Value { return b.create<arith::AndIOp>(loc, a, e); };
        auto ori = [&](Value a, Value e) -> Value { return b.create<arith::OrIOp>(loc, a, e); };
        auto noti = [&](Value a) -> Value {
          return b.create<arith::XOrIOp>(loc, a, b.create<arith::ConstantIntOp>(loc, 1, 1));
        };
        Value vNan = fl ? cmpf(arith::CmpFPredicate::UNO, v, v) : Value();
        Value rank = k.loopAcc(k.idx(0), d, k.idx(1), k.idx(0), [&](Value m, Value count) {
          Value u = k.load(fn.getArgument(0), k.add(base, k.mul(m, k.idx(q))), elem);
          Value ahead, equal; // u comes strictly before v, u ties with v
          if (fl) {
            Value uNan = cmpf(arith::CmpFPredicate::UNO, u, u);
            ahead = largest ? ori(cmpf(arith::CmpFPredicate::OGT, u, v), andi(uNan, noti(vNan)))
                            : ori(cmpf(arith::CmpFPredicate::OLT, u, v), andi(vNan, noti(uNan)));
            equal = ori(cmpf(arith::CmpFPredicate::OEQ, u, v), andi(uNan, vNan));
          } else {
            auto gt = isUnsigned ? arith::CmpIPredicate::ugt : arith::CmpIPredicate::sgt;
            auto lt = isUnsigned ? arith::CmpIPredicate::ult : arith::CmpIPredicate::slt;
            ahead = cmpi(largest ? gt : lt, u, v);
            equal = cmpi(arith::CmpIPredicate::eq, u, v);
          }
          Value before = ori(ahead, andi(equal, k.ult(m, j)));
          return b.create<arith::SelectOp>(loc, before, k.add(count, k.idx(1)), count);
        });
        k.ifThen(k.ult(rank, k.idx(topK)), [&] {
          Value at = k.add(k.add(k.mul(o, k.idx(topK * q)), k.mul(rank, k.idx(q))), c);
          k.store(v, fn.getArgument(1), at, elem);
          b.create<memref::StoreOp>(loc, b.create<arith::IndexCastOp>(loc, b.getI64Type(), j),
                                    fn.getArgument(2), at);
        });
      });
}

/// cumsum along `axis` (exclusive / reverse): one thread per line, serial in
/// the line's order, accumulated in f32 (f64 for f64).
std::optional<KernelLaunch> KernelGenerator::Impl::cumsumKernel(Operation *op, StringRef name) {
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  if (x.getRank() == 0 || x.getNumElements() == 0 ||
      !(elem.isF32() || elem.isF16() || elem.isBF16() || elem.isF64()))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, x.getRank());
  auto [p, n, q] = aroundAxis(x.getShape(), axis);
  bool exclusive = op->getAttrOfType<BoolAttr>("exclusive").getValue();
  bool reverse = op->getAttrOfType<BoolAttr>("reverse").getValue();
  Type acc = computeType(elem);
  return elementKernel(name, flatArgs(op), p * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value line) {
    OpBuilder &b = k.b;
    Value base = k.add(k.mul(k.div(line, q), k.idx(n * q)), k.rem(line, q));
    k.loopAcc(k.idx(0), n, k.idx(1), k.fconst(acc, 0.0), [&](Value j, Value s) {
      Value pos = reverse ? Value(b.create<arith::SubIOp>(k.loc, k.idx(n - 1), j)) : j;
      Value at = k.add(base, k.mul(pos, k.idx(q)));
      Value next = b.create<arith::AddFOp>(k.loc, s, k.load(fn.getArgument(0), at, elem));
      k.store(exclusive ? s : next, fn.getArgument(1), at, elem);
      return next;
    });
  });
}

/// A multi_reduce region: member i (a whole-tensor sum, with its pointwise
/// prologue evaluated per element) owns a contiguous range of blocks sized by
/// its elements (capped at a few waves; its grid-stride loop covers the
/// rest), picked by a binary decision tree on blockIdx.x as in horizontal
/// regions. Each block sums its share, then one atomic add per block into the
/// member's scalar (zeroed before the launch). A member may instead be the
/// maximum of an abs (float8 scaling's amax): non-negative floats order as
/// their bits do as signed integers, so the block's maximum goes in by an
/// integer atomic max (NaN's bits exceed infinity's: a NaN wins, as it
/// must). Inputs are read at the flat element index (in 4-element vectors
/// where every size allows: 16 bytes of f32, 8 of bf16/f16), or are scalars.
std::optional<KernelGenerator::Impl::MultiReducePlan>
KernelGenerator::Impl::planMultiReduce(FusionOp fusion) {
  Block &body = fusion.getBlock();
  MultiReducePlan p;
  SmallVector<Operation *> &sums = p.sums; // reduce_sum, or reduce_max of non-negative values
  SmallVector<bool> &isMax = p.isMax;
  // abs(x), or max(y, z) of a non-negative y or z.
  std::function<bool(Value)> nonNegative = [&](Value v) {
    Operation *def = v.getDefiningOp();
    if (isa_and_nonnull<AbsOp>(def))
      return true;
    return isa_and_nonnull<MaxOp>(def) &&
           (nonNegative(def->getOperand(0)) || nonNegative(def->getOperand(1)));
  };
  for (Operation &op : body.without_terminator()) {
    if (isa<ReduceSumOp>(op) || (isa<ReduceMaxOp>(op) && nonNegative(op.getOperand(0)))) {
      sums.push_back(&op);
      isMax.push_back(isa<ReduceMaxOp>(op));
    } else if (isa<ReduceMaxOp>(op)) {
      return std::nullopt; // a maximum of possibly negative values: not by integer atomics
    }
    if (!faultOf(&op).empty())
      return std::nullopt;
    for (Value v : op.getOperands()) {
      Type e = tensorType(v).getElementType();
      if (!e.isF32() && !e.isInteger(1) && !e.isBF16() && !e.isF16())
        return std::nullopt;
    }
  }
  if (sums.empty())
    return std::nullopt;
  // Every argument a member reads has the member's elements (reads[i]: those
  // member i reads), or one.
  //
  // 4-element vectors for a member whose elements divide by 4 and whose inputs
  // that are not scalars are f32, bf16 or f16 (an input read by a member that cannot take
  // vectors makes every member reading it scalar): each thread then loads 4
  // elements at once and sums 16 (the gradient norm of every parameter: a
  // bandwidth-bound pass over all gradients; scalar loads of ~4 elements per
  // thread ran the MLP's 2.9M in 15 us).
  SmallVector<llvm::SmallSetVector<unsigned, 4>> reads(sums.size());
  SmallVector<bool> &vectorized = p.vectorized;
  vectorized.resize(sums.size());
  for (auto [i, sum] : llvm::enumerate(sums)) {
    int64_t n = tensorType(sum->getOperand(0)).getNumElements();
    SmallVector<Value> worklist{sum->getOperand(0)};
    while (!worklist.empty()) {
      Value v = worklist.pop_back_val();
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        int64_t m = tensorType(arg).getNumElements();
        if (m != n && m != 1)
          return std::nullopt;
        if (m != 1)
          reads[i].insert(arg.getArgNumber());
        continue;
      }
      llvm::append_range(worklist, v.getDefiningOp()->getOperands());
    }
    vectorized[i] = tensorType(sum->getOperand(0)).getNumElements() % kVector == 0 &&
                    llvm::all_of(reads[i], [&](unsigned a) {
                      Type e = tensorType(body.getArgument(a)).getElementType();
                      return e.isF32() || e.isBF16() || e.isF16();
                    });
  }
  SmallVector<bool> vectorArg(fusion.getInputs().size());
  for (bool changed = true; changed;) {
    changed = false;
    std::fill(vectorArg.begin(), vectorArg.end(), false);
    for (auto [i, r] : llvm::enumerate(reads))
      if (vectorized[i])
        for (unsigned a : r)
          vectorArg[a] = true;
    for (auto [i, r] : llvm::enumerate(reads))
      if (!vectorized[i] && llvm::any_of(r, [&](unsigned a) { return vectorArg[a]; })) {
        for (auto [j, rj] : llvm::enumerate(reads))
          if (llvm::any_of(rj, [&](unsigned a) { return r.contains(a); }))
            vectorized[j] = false;
        changed = true;
      }
  }
  for (auto [a, v] : llvm::enumerate(fusion.getInputs()))
    p.inTypes.push_back(
        flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements(), vectorArg[a]));
  Type i32 = IntegerType::get(context, 32);
  for (auto [i, v] : llvm::enumerate(fusion.getResults()))
    p.outTypes.push_back(flatMemref(isMax[i] ? i32 : tensorType(v).getElementType(), 1));
  return p;
}

int64_t KernelGenerator::Impl::multiReduceBlocks(const MultiReducePlan &p, size_t i,
                                                 int64_t block) const {
  const int64_t cap = 4 * target.typicalSMs * std::max<int64_t>(1, target.maxThreadsPerSM / block);
  int64_t n = tensorType(p.sums[i]->getOperand(0)).getNumElements();
  // About 4 loads (of `width` elements) per thread, at least one block.
  int64_t perBlock = 4 * (p.vectorized[i] ? kVector : 1) * block;
  return std::clamp<int64_t>((n + perBlock - 1) / perBlock, 1, cap);
}

bool KernelGenerator::Impl::emitMultiReduceSum(Body &k, gpu::GPUFuncOp fn, const MultiReducePlan &p,
                                               size_t lo, ArrayRef<unsigned> inArgs,
                                               unsigned outArg, Value local, int64_t blocks,
                                               int64_t block, Value sh) {
  OpBuilder &b = k.b;
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  bool ok = true;
  auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, a, c); };
  auto maxf = [&](Value a, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, a, c); };
  Value zero = k.fconst(f32, 0.0);
  // Body argument at flat element e (scalars at 0).
  auto evalAt = [&](Value v, Value e, llvm::DenseMap<Value, Value> &stored) {
    return evalBodyValue(k, v, stored, [&](BlockArgument arg) -> Value {
      Value at = tensorType(arg).getNumElements() == 1 ? k.idx(0) : e;
      return b.create<memref::LoadOp>(k.loc, fn.getArgument(inArgs[arg.getArgNumber()]), at);
    });
  };
  Operation *sum = p.sums[lo];
  Value input = sum->getOperand(0);
  auto combine = [&, max = p.isMax[lo]](Value a, Value c) { return max ? maxf(a, c) : addf(a, c); };
  int64_t n = tensorType(input).getNumElements();
  Value start = k.add(k.mul(local, k.idx(block)), k.tid());
  const bool vectorized = p.vectorized[lo];
  const int64_t width = vectorized ? kVector : 1;
  Value acc = k.loopAcc(start, n / width, k.idx(blocks * block), zero, [&](Value e, Value a) {
    if (!vectorized) {
      llvm::DenseMap<Value, Value> stored;
      Value x = evalAt(input, e, stored);
      if (!x) {
        ok = false;
        return a;
      }
      return combine(a, k.toCompute(x, f32));
    }
    // Vector e of every input, loaded once; the body evaluated per lane.
    llvm::DenseMap<unsigned, Value> vectors;
    for (int64_t l = 0; l < kVector; ++l) {
      llvm::DenseMap<Value, Value> stored;
      Value x = evalBodyValue(k, input, stored, [&](BlockArgument arg) -> Value {
        Value mem = fn.getArgument(inArgs[arg.getArgNumber()]);
        if (tensorType(arg).getNumElements() == 1)
          return b.create<memref::LoadOp>(k.loc, mem, k.idx(0));
        Value &vec = vectors[arg.getArgNumber()];
        if (!vec)
          vec = b.create<memref::LoadOp>(k.loc, mem, e);
        return b.create<vector::ExtractOp>(k.loc, vec, l);
      });
      if (!x) {
        ok = false;
        return a;
      }
      a = combine(a, k.toCompute(x, f32));
    }
    return a;
  });
  acc = k.blockReduce(acc, block / kWarp, sh, zero, combine);
  k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
    Value out = fn.getArgument(outArg);
    if (p.isMax[lo])
      b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::maxs,
                                    b.create<arith::BitcastOp>(k.loc, i32, acc), out,
                                    ValueRange{k.idx(0)});
    else
      b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, acc, out,
                                    ValueRange{k.idx(0)});
  });
  return ok;
}

std::optional<KernelLaunch> KernelGenerator::Impl::multiReduceKernel(FusionOp fusion,
                                                                     StringRef name) {
  std::optional<MultiReducePlan> p = planMultiReduce(fusion);
  if (!p)
    return std::nullopt;
  SmallVector<Type> args(p->inTypes);
  llvm::append_range(args, p->outTypes);
  SmallVector<unsigned> inArgs;
  for (unsigned a = 0; a < p->inTypes.size(); ++a)
    inArgs.push_back(a);
  const unsigned numInputs = p->inTypes.size();
  int64_t block = 256;
  SmallVector<int64_t> first, blocks;
  int64_t grid = 0;
  for (size_t i = 0; i < p->sums.size(); ++i) {
    first.push_back(grid);
    blocks.push_back(multiReduceBlocks(*p, i, block));
    grid += blocks.back();
  }
  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {sharedBuffer(kWarp, b.getF32Type())});
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value bid = k.bid();
  bool ok = true;
  emitBlockRanges(k, bid, first, [&](size_t lo) {
    Value local = b.create<arith::SubIOp>(k.loc, bid, k.idx(first[lo]));
    ok &= emitMultiReduceSum(k, fn, *p, lo, inArgs, numInputs + lo, local, blocks[lo], block, sh);
  });
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, block};
  launch.zeroOutputs = true;
  return launch;
}

/// A column_reduce region: sums over the rows of [R, C] (every dim but the
/// last), each of its pointwise prologue evaluated per element. A thread owns
/// `lanes` consecutive columns (one 4-element vector load per input and row:
/// 16 bytes of f32, 8 of bf16) and every `slots`-th row of its block's chunk;
/// a block covers up to 256 column groups, and the rows are split over enough
/// blocks to fill the GPU. Per-thread partial sums meet in shared memory,
/// then one atomic add per block, sum and column into the zeroed f32 results
/// (the order of the additions, and so the last bits, may vary run to run).
/// Inputs are at the iteration shape (read at the row and column), per column
/// (C elements: read at the column) or scalars.
std::optional<KernelLaunch> KernelGenerator::Impl::columnReduceKernel(FusionOp fusion,
                                                                      StringRef name) {
  Block &body = fusion.getBlock();
  SmallVector<Operation *> sums;
  for (Operation &op : body.without_terminator()) {
    if (isa<ReduceSumOp>(op))
      sums.push_back(&op);
    if (!faultOf(&op).empty())
      return std::nullopt;
  }
  if (sums.empty())
    return std::nullopt;
  // Side outputs (forge-fuse-column-sums): yields after the sums, written
  // whole at the element the sums read.
  ValueRange sides = body.getTerminator()->getOperands().drop_front(sums.size());
  auto shape = tensorType(sums[0]->getOperand(0));
  int64_t cols = shape.getShape().back(), total = shape.getNumElements();
  if (cols == 0 || total == 0)
    return std::nullopt;
  int64_t rows = total / cols;
  enum Kind { Full, Column, Scalar };
  SmallVector<Kind> kinds;
  bool vectorizable = cols % kVector == 0;
  for (BlockArgument arg : body.getArguments()) {
    int64_t n = tensorType(arg).getNumElements();
    Type e = tensorType(arg).getElementType();
    if (n == 1) {
      kinds.push_back(Scalar);
      continue;
    }
    if (n == total && tensorType(arg).getShape() == shape.getShape())
      kinds.push_back(Full);
    else if (n == cols)
      kinds.push_back(Column);
    else
      return std::nullopt;
    vectorizable &= e.isF32() || e.isBF16() || e.isF16() || e.isInteger(1);
  }
  const size_t numSums = sums.size();
  for (Value r : fusion.getResults().take_front(numSums))
    if (!tensorType(r).getElementType().isF32())
      return std::nullopt; // f32 sums, added atomically
  for (Value v : sides) {
    Type e = tensorType(v).getElementType();
    if (tensorType(v).getShape() != shape.getShape() || !(e.isF32() || e.isBF16() || e.isF16()))
      return std::nullopt;
  }
  // 16-byte loads of the image: 8 lanes when its inputs are 2-byte (bf16), else 4.
  bool narrow = llvm::all_of(body.getArguments(), [&](BlockArgument arg) {
    return kinds[arg.getArgNumber()] != Full ||
           tensorType(arg).getElementType().getIntOrFloatBitWidth() <= 16;
  });
  const int64_t lanes = !vectorizable ? 1 : narrow && cols % (2 * kVector) == 0 ? 2 * kVector
                                                                                 : kVector;
  const int64_t nsum = sums.size();
  const int64_t groups = cols / lanes, block = 256;
  const int64_t perBlockGroups = std::min(groups, block);
  const int64_t colBlocks = (groups + perBlockGroups - 1) / perBlockGroups;
  const int64_t slots = block / perBlockGroups; // rows a block walks side by side
  // One wave: as many blocks as the GPU holds at once (ptxas gives this
  // kernel 64 registers, so 4 blocks of 256 threads per SM), each thread
  // walking at least kRowsPerThread rows (unrolled by kUnroll) so that the
  // blocks' atomics (one per block, sum and column) stay few. With ~6 rows
  // per block ResNet-50's [25088, 1024] sums ran 4224 blocks whose 8.6M
  // atomics on 2048 addresses took 0.24 ms (215 GB/s). At least 64 rows per
  // thread left 24-98 blocks for the [6272, 2048] sums of its last stage
  // (under one per SM). Measured on ResNet-50 B128 (bench/RESULTS.md,
  // eleventh session; column_reduce per step, step time): >= 64 rows and up
  // to 4 waves 3.64 ms, 18.95 ms (bf16) / 5.33 ms, 33.86 ms (TF32); >= 16
  // rows, one wave 3.18 ms, 18.52 ms / 5.11 ms, 33.67 ms; two waves or >= 32
  // rows or 8 rows per iteration no better.
  constexpr int64_t kUnroll = 16, kRowsPerThread = 16, kBlocksPerSM = 4;
  const int64_t wave = kBlocksPerSM * target.typicalSMs;
  int64_t splits = std::clamp<int64_t>(wave / colBlocks, 1,
                                       std::max<int64_t>(1, rows / (slots * kRowsPerThread)));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t chunk = (rows + splits - 1) / splits;
  const int64_t grid = colBlocks * splits;

  SmallVector<Type> args;
  for (auto [a, v] : llvm::enumerate(fusion.getInputs()))
    args.push_back(flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements(),
                              lanes > 1 && kinds[a] != Scalar, lanes));
  Type f32 = Float32Type::get(context);
  for (Value v : fusion.getResults().take_front(numSums))
    args.push_back(flatMemref(f32, tensorType(v).getNumElements()));
  for (Value v : sides) // written as the inputs are read: `lanes` columns a store
    args.push_back(flatMemref(tensorType(v).getElementType(), total, lanes > 1, lanes));
  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {sharedBuffer(block * nsum * lanes, f32)});
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  unsigned numInputs = fusion.getInputs().size();
  Value zero = k.fconst(f32, 0.0);
  Value t = k.tid();
  Value local = k.rem(t, perBlockGroups), slot = k.div(t, perBlockGroups);
  Value colBlock = colBlocks > 1 ? k.rem(k.bid(), colBlocks) : k.idx(0);
  Value split = colBlocks > 1 ? k.div(k.bid(), colBlocks) : k.bid();
  Value g = k.add(k.mul(colBlock, k.idx(perBlockGroups)), local);
  Value active = b.create<arith::AndIOp>(k.loc, k.ult(slot, k.idx(slots)), k.ult(g, k.idx(groups)));
  Value rBegin = k.mul(split, k.idx(chunk));
  Value rEnd = b.create<arith::MinUIOp>(k.loc, k.add(rBegin, k.idx(chunk)), k.idx(rows));
  Value start = b.create<arith::SelectOp>(k.loc, active, k.add(rBegin, slot), rEnd);
  bool ok = true;
  // kUnroll rows per iteration (r, r + slots, ...), software-pipelined: the
  // next iteration's rows are loaded before this one's sums and carried by
  // the loop, so they are in flight while it adds (issued in the body, ptxas
  // interleaved each load with its sums: one or two rows in flight, 1.3 TB/s
  // on ResNet-50's statistics). Rows past the chunk read its last row (any
  // index is clamped) and add 0.
  Value lastRow = b.create<arith::SubIOp>(k.loc, rEnd, k.idx(1));
  SmallVector<unsigned> fullArgs;       // the Full inputs' argument numbers
  SmallVector<int64_t> fullIndex(kinds.size(), -1); // argument -> its place in fullArgs
  for (auto [a, kind] : llvm::enumerate(kinds))
    if (kind == Full) {
      fullIndex[a] = fullArgs.size();
      fullArgs.push_back(a);
    }
  auto loadRows = [&](Value r0) {
    SmallVector<Value> out; // row u, input fullArgs[i] at u * fullArgs.size() + i
    for (int64_t u = 0; u < kUnroll; ++u) {
      Value r = b.create<arith::MinUIOp>(k.loc, k.add(r0, k.idx(u * slots)), lastRow);
      for (unsigned a : fullArgs)
        out.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(a),
                                               k.add(k.mul(r, k.idx(groups)), g)));
    }
    return out;
  };
  SmallVector<Value> init(nsum * lanes, zero);
  llvm::append_range(init, loadRows(start));
  const int64_t numAcc = nsum * lanes;
  auto loop = b.create<scf::ForOp>(
      k.loc, start, rEnd, k.idx(slots * kUnroll), init,
      [&](OpBuilder &nb, Location l, Value r0, ValueRange carried) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        ValueRange acc = carried.take_front(numAcc), rowsNow = carried.drop_front(numAcc);
        SmallVector<Value> prefetched = loadRows(k.add(r0, k.idx(slots * kUnroll)));
        SmallVector<Value> validOf;
        for (int64_t u = 0; u < kUnroll; ++u)
          validOf.push_back(u ? k.ult(k.add(r0, k.idx(u * slots)), rEnd) : Value());
        llvm::DenseMap<unsigned, Value> perColumn;
        auto leaf = [&](BlockArgument arg, int64_t u, int64_t lane) -> Value {
          unsigned a = arg.getArgNumber();
          Value mem = fn.getArgument(a);
          if (kinds[a] == Scalar)
            return b.create<memref::LoadOp>(k.loc, mem, k.idx(0));
          Value v;
          if (kinds[a] == Full)
            v = rowsNow[u * fullArgs.size() + fullIndex[a]];
          else if (!(v = perColumn[a]))
            v = perColumn[a] = b.create<memref::LoadOp>(k.loc, mem, g);
          return lanes == 1 ? v : Value(b.create<vector::ExtractOp>(k.loc, v, lane));
        };
        SmallVector<Value> next(acc.begin(), acc.end());
        for (int64_t u = 0; u < kUnroll; ++u) {
          // One evaluation of the body per element, shared by its sums and
          // side outputs.
          SmallVector<llvm::DenseMap<Value, Value>> stored(lanes);
          for (auto [i, sum] : llvm::enumerate(sums))
            for (int64_t lane = 0; lane < lanes; ++lane) {
              Value x = evalBodyValue(k, sum->getOperand(0), stored[lane], [&](BlockArgument arg) {
                return leaf(arg, u, lane);
              });
              if (!x) {
                ok = false;
                x = zero;
              }
              // In the summed value's stored type (a side output's bf16).
              x = k.toCompute(x, tensorType(sum->getOperand(0)).getElementType());
              if (validOf[u])
                x = b.create<arith::SelectOp>(k.loc, validOf[u], x, zero);
              Value &a = next[i * lanes + lane];
              a = b.create<arith::AddFOp>(k.loc, a, x);
            }
          // Side outputs: row r0 + u * slots (past the chunk's end: no store).
          for (auto [j, side] : llvm::enumerate(sides)) {
            SmallVector<Value> values;
            for (int64_t lane = 0; lane < lanes && ok; ++lane) {
              Value y = evalBodyValue(k, side, stored[lane], [&](BlockArgument arg) {
                return leaf(arg, u, lane);
              });
              ok = ok && y;
              values.push_back(y);
            }
            if (!ok)
              continue;
            Value mem = fn.getArgument(numInputs + numSums + j);
            Value at = k.add(k.mul(k.add(r0, k.idx(u * slots)), k.idx(groups)), g);
            auto write = [&] {
              Value v = values[0];
              if (lanes > 1)
                v = b.create<vector::FromElementsOp>(
                    k.loc, VectorType::get({lanes}, values[0].getType()), values);
              b.create<memref::StoreOp>(k.loc, v, mem, at);
            };
            if (validOf[u])
              k.ifThen(validOf[u], write);
            else
              write();
          }
        }
        llvm::append_range(next, prefetched);
        b.create<scf::YieldOp>(l, next);
      });
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  // Partials to shared memory: sum i's lane l of thread t at
  // (i * block + t) * lanes + l. Then every thread adds up the slots of one
  // (sum, column group, lane) triple at a time, lanes fastest: adjacent
  // threads read adjacent words (no bank conflicts) and add atomically into
  // adjacent columns (coalesced; forge-check-coalescing checks it). The
  // first column groups' threads alone, with a partial each in turn, took
  // 16-way bank conflicts and serial atomics.
  const int64_t width = nsum * lanes;
  for (int64_t j = 0; j < width; ++j)
    b.create<memref::StoreOp>(
        k.loc, loop.getResult(j), sh,
        k.add(k.mul(t, k.idx(lanes)), k.idx((j / lanes) * block * lanes + j % lanes)));
  b.create<gpu::BarrierOp>(k.loc);
  const int64_t pairs = width * perBlockGroups;
  for (int64_t p0 = 0; p0 < pairs; p0 += block) {
    Value p = k.add(t, k.idx(p0));
    Value lane = k.rem(p, lanes), own = k.rem(k.div(p, lanes), perBlockGroups);
    Value which = k.div(p, lanes * perBlockGroups);
    Value gj = k.add(k.mul(colBlock, k.idx(perBlockGroups)), own);
    Value inRange = b.create<arith::AndIOp>(k.loc, k.ult(p, k.idx(pairs)), k.ult(gj, k.idx(groups)));
    k.ifThen(inRange, [&] {
      Value base = k.add(k.mul(k.add(k.mul(which, k.idx(block)), own), k.idx(lanes)), lane);
      Value total = k.loopAcc(k.idx(0), slots, k.idx(1), zero, [&](Value s, Value a) {
        Value at = k.add(base, k.mul(s, k.idx(perBlockGroups * lanes)));
        return b.create<arith::AddFOp>(k.loc, a, b.create<memref::LoadOp>(k.loc, sh, at));
      });
      Value col = k.add(k.mul(gj, k.idx(lanes)), lane);
      for (int64_t i = 0; i < nsum; ++i)
        k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, which, k.idx(i)), [&] {
          b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, total,
                                        fn.getArgument(numInputs + i), ValueRange{col});
        });
    });
  }
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, block};
  launch.zeroOutputs = true;
  if (!sides.empty()) // the sums only: the side outputs are written whole
    for (unsigned i = 0; i < numSums; ++i)
      launch.zeroOnly.push_back(i);
  return launch;
}

/// A lines region (forge-fuse-line-reductions): the body's first op sums (or
/// averages) its input x over one axis that is not the innermost, [P, D, Q]
/// around it; the rest is pointwise on x and that line's value. A block owns
/// W = 32 V adjacent columns of one p and all D rows of them: lane l holds
/// columns l V .. l V + V - 1 (one V-wide load: a warp's row is one run of
/// memory), warp w rows w, w + warps, ... (up to 32 warps), kUnroll rows
/// loaded before they are added (loads in flight). The warps' f32 partials meet in shared memory
/// in warp order (no atomics, the same bits every run); then the warps read
/// their rows again (from L2: a block's lines are D W elements) and write the
/// body's value per element, into a concat's piece a token stride apart
/// where forge.out_row_strides says so (dims 0 and 1 tokens, the rest a row).
/// V is the widest of 4, 2, 1 that divides Q / 32 and still gives every SM a
/// block (GPT-2's dk: P 16, Q 768 -> V 2, 192 blocks).
std::optional<KernelLaunch> KernelGenerator::Impl::linesKernel(FusionOp fusion, StringRef name) {
  Block &body = fusion.getBlock();
  if (body.getNumArguments() != 1 || fusion->getNumResults() != 1 ||
      body.without_terminator().empty())
    return std::nullopt;
  Operation *red = &body.front();
  std::optional<ReduceKind> kind = reduceKind(red);
  if (!kind || !isa<ReduceSumOp, ReduceMeanOp>(red))
    return std::nullopt;
  for (Operation &op : body.without_terminator())
    if (!faultOf(&op).empty())
      return std::nullopt;
  auto xType = tensorType(fusion.getInputs()[0]);
  Type elem = xType.getElementType(), outElem = tensorType(fusion.getResult(0)).getElementType();
  auto floaty = [](Type t) { return t.isF32() || t.isBF16() || t.isF16(); };
  if (!floaty(elem) || !floaty(outElem) || !tensorType(red->getResult(0)).getElementType().isF32())
    return std::nullopt;
  ArrayRef<int64_t> shape = fusion.getIterationShape();
  const int64_t rank = static_cast<int64_t>(shape.size());
  auto axes = red->getAttrOfType<DenseI64ArrayAttr>("axes");
  if (!axes || axes.size() != 1)
    return std::nullopt;
  const int64_t axis = axes[0] < 0 ? axes[0] + rank : axes[0];
  if (axis < 0 || axis >= rank - 1)
    return std::nullopt;
  auto [P, D, Q] = aroundAxis(shape, axis);
  if (P == 0 || D == 0 || Q % kWarp != 0)
    return std::nullopt;
  // A concat's piece: element (t0, t1, rest) at (t0 * shape[1] + t1) * rowStride + rest.
  int64_t rowStride = 0, rowLen = 0;
  if (auto rows = fusion->getAttrOfType<DenseI64ArrayAttr>("forge.out_row_strides")) {
    if (rank < 3 || rows.size() != 1)
      return std::nullopt;
    rowLen = 1;
    for (int64_t d = 2; d < rank; ++d)
      rowLen *= shape[d];
    rowStride = rows[0];
    if (rowStride != 0 && rowStride < rowLen)
      return std::nullopt;
  }
  int64_t V = 1;
  for (int64_t v : {4, 2}) {
    bool whole =
        Q % (kWarp * v) == 0 && (rowStride == 0 || (rowStride % v == 0 && rowLen % v == 0));
    if (whole && P * (Q / (kWarp * v)) >= target.typicalSMs) {
      V = v;
      break;
    }
  }
  // Measured on GPT-2 bf16's dk (H100, 12 kernels a step, bench/RESULTS.md): 4 rows a pass
  // on 16 warps 0.349 ms, 8 on 16 0.319, 4 on 32 0.307, 8 on 32 0.294 (the reduce_mean and
  // loop before: 0.408); V 4 (96 blocks) 0.323, V 1 (384) 0.316.
  constexpr int64_t kUnroll = 8, kMaxWarps = 32;
  const int64_t W = kWarp * V, colBlocks = Q / W, grid = P * colBlocks;
  const int64_t warps = std::min(kMaxWarps, D), block = warps * kWarp, step = warps * kUnroll;
  if (grid > (int64_t(1) << 31) - 1)
    return std::nullopt;
  const int64_t total = xType.getNumElements();
  int64_t extent = total; // a strided output spans to its last element
  if (rowStride)
    extent = (total / rowLen - 1) * rowStride + rowLen;

  Type f32 = Float32Type::get(context);
  OpBuilder b(context);
  auto fn =
      newKernel(b, name, {flatMemref(elem, total, V > 1, V), flatMemref(outElem, extent, V > 1, V)},
                block, {sharedBuffer(warps * W, f32)});
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value in = fn.getArgument(0), out = fn.getArgument(1), sh = fn.getWorkgroupAttributions()[0];
  Value t = k.tid(), lane = k.rem(t, kWarp), warp = k.div(t, kWarp);
  Value p = k.div(k.bid(), colBlocks), colBlock = k.rem(k.bid(), colBlocks);
  Value col = k.add(k.mul(colBlock, k.idx(W)), k.mul(lane, k.idx(V))); // the lane's first
  Value lineBase = k.add(k.mul(p, k.idx(D * Q)), col);                 // element (p, 0, col)
  Value zero = k.fconst(f32, 0.0), lastRow = k.idx(D - 1);
  // Row r's V storage values of the lane (a row past D reads row D - 1).
  auto loadRow = [&](Value r) {
    Value at = k.add(lineBase, k.mul(b.create<arith::MinUIOp>(k.loc, r, lastRow), k.idx(Q)));
    SmallVector<Value> vals;
    if (V == 1) {
      vals.push_back(b.create<memref::LoadOp>(k.loc, in, at));
      return vals;
    }
    Value vec = b.create<memref::LoadOp>(k.loc, in, k.div(at, V));
    for (int64_t v = 0; v < V; ++v)
      vals.push_back(b.create<vector::ExtractOp>(k.loc, vec, v));
    return vals;
  };
  const bool ragged = D % step != 0;
  auto inRange = [&](Value r) { return k.ult(r, k.idx(D)); };
  // Pass 1: the lane's V column sums over its warp's rows.
  SmallVector<Value> init(V, zero);
  auto sums = b.create<scf::ForOp>(
      k.loc, warp, k.idx(D), k.idx(step), init,
      [&](OpBuilder &nb, Location l, Value r0, ValueRange acc) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        SmallVector<SmallVector<Value>> rows;
        for (int64_t u = 0; u < kUnroll; ++u) // every load issued before the adds
          rows.push_back(loadRow(k.add(r0, k.idx(u * warps))));
        SmallVector<Value> next(acc.begin(), acc.end());
        for (int64_t u = 0; u < kUnroll; ++u) {
          Value ok = u > 0 && ragged ? inRange(k.add(r0, k.idx(u * warps))) : Value();
          for (int64_t v = 0; v < V; ++v) {
            Value x = k.toCompute(rows[u][v], elem);
            if (kind->square)
              x = b.create<arith::MulFOp>(l, x, x);
            if (ok)
              x = b.create<arith::SelectOp>(l, ok, x, zero);
            next[v] = b.create<arith::AddFOp>(l, next[v], x);
          }
        }
        b.create<scf::YieldOp>(l, next);
      });
  // The warps' partials, warp-major; column c's total in warp order.
  for (int64_t v = 0; v < V; ++v)
    b.create<memref::StoreOp>(k.loc, sums.getResult(v), sh,
                              k.add(k.mul(warp, k.idx(W)), k.add(k.mul(lane, k.idx(V)), k.idx(v))));
  b.create<gpu::BarrierOp>(k.loc);
  // Column c's total by threads c, c + block, ... (a block of fewer threads than
  // columns: D < V rows on as many warps).
  k.loop(t, k.idx(W), k.idx(block), [&](Value c) {
    Value sum = k.loopAcc(k.idx(0), warps, k.idx(1), zero, [&](Value w, Value a) {
      return b.create<arith::AddFOp>(
          k.loc, a, b.create<memref::LoadOp>(k.loc, sh, k.add(k.mul(w, k.idx(W)), c)));
    });
    if (kind->mean)
      sum = b.create<arith::DivFOp>(k.loc, sum, k.fconst(f32, static_cast<double>(D)));
    // Only the thread of column c read its partials (its own slot among them).
    b.create<memref::StoreOp>(k.loc, sum, sh, c);
  });
  b.create<gpu::BarrierOp>(k.loc);
  SmallVector<Value> reduced;
  for (int64_t v = 0; v < V; ++v)
    reduced.push_back(b.create<memref::LoadOp>(k.loc, sh, k.add(k.mul(lane, k.idx(V)), k.idx(v))));
  // Pass 2: the body at each of the warp's rows.
  Value redResult = red->getResult(0), x = body.getArgument(0);
  Value yielded = body.getTerminator()->getOperand(0);
  bool ok = true;
  k.loop(warp, k.idx(D), k.idx(step), [&](Value r0) {
    SmallVector<SmallVector<Value>> rows;
    for (int64_t u = 0; u < kUnroll; ++u)
      rows.push_back(loadRow(k.add(r0, k.idx(u * warps))));
    for (int64_t u = 0; u < kUnroll && ok; ++u) {
      Value r = k.add(r0, k.idx(u * warps));
      SmallVector<Value> values;
      for (int64_t v = 0; v < V && ok; ++v) {
        llvm::DenseMap<Value, Value> stored;
        stored[x] = rows[u][v];
        stored[redResult] = reduced[v];
        Value y = evalBodyValue(k, yielded, stored, [&](BlockArgument) { return Value(); });
        ok = ok && y;
        values.push_back(y);
      }
      if (!ok)
        break;
      auto write = [&] {
        // Element (p, r, col) of x's contiguous order; its place in the output.
        Value flat = k.add(lineBase, k.mul(r, k.idx(Q)));
        Value at = rowStride
                       ? k.add(k.mul(k.div(flat, rowLen), k.idx(rowStride)), k.rem(flat, rowLen))
                       : flat;
        if (V == 1) {
          b.create<memref::StoreOp>(k.loc, values[0], out, at);
          return;
        }
        Value vec = b.create<vector::FromElementsOp>(
            k.loc, VectorType::get({V}, values[0].getType()), values);
        b.create<memref::StoreOp>(k.loc, vec, out, k.div(at, V));
      };
      if (u > 0 && ragged)
        k.ifThen(inRange(r), write);
      else
        write();
    }
  });
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}
