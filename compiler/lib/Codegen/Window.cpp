//===- Window.cpp - pools and direct convolution ----------------------------===//
//
// max/avg pooling and their gradients, and the direct convolution for the
// forms cuDNN does not take (WindowGeometry: N-d windows over NC<spatial>).
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

namespace {
/// The window geometry of an N-d pool or convolution over NC<spatial>: window
/// o (of the `out` map) along dim d covers image positions
/// o*stride - padBegin + t*dilation, t < kernel.
struct WindowGeometry {
  SmallVector<int64_t> image, out, kernel, strides, padBegin, padEnd, dilations;
  int64_t imageSize = 1, outSize = 1, taps = 1;

  /// From `op`'s strides/pads/dilations (and kernel_shape, or the spatial dims
  /// of `weight`), `x` the image and `y` the map of windows.
  static std::optional<WindowGeometry> of(Operation *op, RankedTensorType x, RankedTensorType y,
                                          RankedTensorType weight = nullptr) {
    auto kernel = op->getAttrOfType<DenseI64ArrayAttr>("kernel_shape");
    auto strides = op->getAttrOfType<DenseI64ArrayAttr>("strides");
    auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
    auto dil = op->getAttrOfType<DenseI64ArrayAttr>("dilations");
    int64_t sp = x.getRank() - 2;
    SmallVector<int64_t> kernelShape;
    if (kernel)
      kernelShape.assign(kernel.asArrayRef().begin(), kernel.asArrayRef().end());
    else if (weight && weight.getRank() == x.getRank())
      kernelShape.assign(weight.getShape().begin() + 2, weight.getShape().end());
    if (sp < 1 || y.getRank() != x.getRank() || static_cast<int64_t>(kernelShape.size()) != sp || !strides ||
        strides.size() != sp || !pads || pads.size() != 2 * sp || !dil || dil.size() != sp ||
        x.getNumElements() == 0 || y.getNumElements() == 0)
      return std::nullopt;
    WindowGeometry g;
    for (int64_t d = 0; d < sp; ++d) {
      g.image.push_back(x.getDimSize(d + 2));
      g.out.push_back(y.getDimSize(d + 2));
      g.kernel.push_back(kernelShape[d]);
      g.strides.push_back(strides[d]);
      g.padBegin.push_back(pads[d]);
      g.padEnd.push_back(pads[d + sp]);
      g.dilations.push_back(dil[d]);
      g.imageSize *= g.image.back();
      g.outSize *= g.out.back();
      g.taps *= kernelShape[d];
    }
    return g;
  }
  int64_t rank() const { return static_cast<int64_t>(image.size()); }

  /// The coordinates of flat index `i` over `dims` (row-major); `outer` gets
  /// the quotient left over (the plane).
  static SmallVector<Value> unravel(Body &k, Value i, ArrayRef<int64_t> dims, Value &outer) {
    SmallVector<Value> c(dims.size());
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      c[d] = k.rem(i, dims[d]);
      i = k.div(i, dims[d]);
    }
    outer = i;
    return c;
  }
  /// Tap t's index along each dim (odometer order, last dim fastest).
  SmallVector<Value> tap(Body &k, Value t) const {
    Value unused;
    return unravel(k, t, kernel, unused);
  }
  static Value inRange(Body &k, Value v, int64_t lo, int64_t hi) {
    Value a = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, v, k.idx(lo));
    Value c = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, v, k.idx(hi));
    return k.b.create<arith::AndIOp>(k.loc, a, c);
  }
  /// Image position of tap `t` of window `o` along each dim (may lie outside).
  SmallVector<Value> position(Body &k, ArrayRef<Value> o, ArrayRef<Value> t) const {
    SmallVector<Value> p;
    for (int64_t d = 0; d < rank(); ++d)
      p.push_back(k.b.create<arith::SubIOp>(
          k.loc, k.add(k.mul(o[d], k.idx(strides[d])), k.mul(t[d], k.idx(dilations[d]))),
          k.idx(padBegin[d])));
    return p;
  }
  /// Whether `p` lies in the image, and its offset in the plane (clamped into
  /// the image, so always safe to load).
  std::pair<Value, Value> imageOffset(Body &k, ArrayRef<Value> p) const {
    Value valid = k.b.create<arith::ConstantIntOp>(k.loc, 1, 1), off = k.idx(0);
    for (int64_t d = 0; d < rank(); ++d) {
      valid = k.b.create<arith::AndIOp>(k.loc, valid, inRange(k, p[d], 0, image[d]));
      Value c = k.b.create<arith::MinSIOp>(
          k.loc, k.b.create<arith::MaxSIOp>(k.loc, p[d], k.idx(0)), k.idx(image[d] - 1));
      off = k.add(k.mul(off, k.idx(image[d])), c);
    }
    return {valid, off};
  }
  /// The window of `out` that has tap `t` on image position `i`, if any: (hit,
  /// window offset in the plane, window coordinates).
  std::tuple<Value, Value, SmallVector<Value>> windowAt(Body &k, ArrayRef<Value> i,
                                                        ArrayRef<Value> t) const {
    OpBuilder &b = k.b;
    Value hit = b.create<arith::ConstantIntOp>(k.loc, 1, 1), off = k.idx(0);
    SmallVector<Value> o;
    for (int64_t d = 0; d < rank(); ++d) {
      // o * stride = i + padBegin - t * dilation, exactly, with 0 <= o < out.
      Value n = b.create<arith::SubIOp>(k.loc, k.add(i[d], k.idx(padBegin[d])),
                                        k.mul(t[d], k.idx(dilations[d])));
      Value nonneg = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, n, k.idx(0));
      Value nc = b.create<arith::MaxSIOp>(k.loc, n, k.idx(0));
      Value exact = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq,
                                            k.rem(nc, strides[d]), k.idx(0));
      Value q = k.div(nc, strides[d]);
      hit = b.create<arith::AndIOp>(
          k.loc, hit,
          b.create<arith::AndIOp>(k.loc, b.create<arith::AndIOp>(k.loc, nonneg, exact),
                                  k.ult(q, k.idx(out[d]))));
      o.push_back(b.create<arith::MinUIOp>(k.loc, q, k.idx(out[d] - 1)));
      off = k.add(k.mul(off, k.idx(out[d])), o.back());
    }
    return {hit, off, o};
  }
};

Value isNaN(Body &k, Value v) {
  return k.b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::UNO, v, v);
}
} // namespace

/// N-d max pooling (NC<spatial>, or channels-last) and its gradient. The window's choice is the
/// CPU kernel's: the first strictly greater in-image tap in odometer order; a
/// NaN wins once seen. Integer inputs (forward only) compare as their sign says.
std::optional<KernelLaunch> KernelGenerator::Impl::maxPoolKernel(Operation *op, StringRef name,
                                                                 bool grad) {
  auto x = tensorType(op->getOperand(0));
  auto y = tensorType(grad ? op->getOperand(1) : op->getResult(0));
  Type elem = x.getElementType();
  // Channels-last ([N, spatial..., C]): the geometry of the channels-first
  // form; element (plane n, position p, channel c) lies at (n * size + p) * C
  // + c, so consecutive threads take consecutive channels (coalesced).
  auto lastAttr = op->getAttrOfType<BoolAttr>("channels_last");
  const bool cl = lastAttr && lastAttr.getValue() && x.getRank() >= 3;
  const int64_t channels = cl ? x.getShape().back() : 1;
  auto firstForm = [&](RankedTensorType t) {
    if (!cl)
      return t;
    SmallVector<int64_t> s(t.getShape());
    std::rotate(s.begin() + 1, s.end() - 1, s.end());
    return RankedTensorType::get(s, t.getElementType());
  };
  auto g = WindowGeometry::of(op, firstForm(x), firstForm(y));
  // Flat index i: (channel, rest) where rest walks the channels-first planes.
  auto split = [&](Body &k, Value i) -> std::pair<Value, Value> {
    if (!cl)
      return {Value(), i};
    return {k.rem(i, channels), k.div(i, channels)};
  };
  // The element at plane offset `at` (plane base included) of channel c.
  auto element = [&](Body &k, Value at, Value c) { return cl ? k.add(k.mul(at, k.idx(channels)), c) : at; };
  bool fl = isFloat(elem);
  if (!g || elem.isInteger(1) || (grad && !fl))
    return std::nullopt;
  Type ct = computeType(elem);
  bool isUnsigned = elem.isUnsignedInteger();
  auto lowest = [&](Body &k) -> Value {
    if (fl)
      return k.fconst(ct, -INFINITY);
    unsigned w = ct.getIntOrFloatBitWidth();
    return k.b.create<arith::ConstantOp>(
        k.loc, k.b.getIntegerAttr(ct, isUnsigned ? APInt::getMinValue(w)
                                                 : APInt::getSignedMinValue(w)));
  };
  // The chosen tap of window `o` of the plane at `base`: (value, plane offset
  // or -1 if none). With `column`, only the taps of that column (index along
  // the last kernel dim), in the same order. With `staged`, the tap at a
  // plane offset is read through it (the plane's rows in shared memory).
  auto choose = [&](Body &k, Value image, Value base, ArrayRef<Value> o, Value c,
                    Value column = Value(),
                    function_ref<Value(Value)> staged = nullptr) -> std::pair<Value, Value> {
    OpBuilder &b = k.b;
    SmallVector<int64_t> rowTaps(g->kernel.begin(), g->kernel.end() - 1);
    SmallVector<Value> chosen = k.foldRange(
        column ? g->taps / g->kernel.back() : g->taps, ValueRange{lowest(k), k.idx(-1)},
        kUnrollTaps, [&](Value t, ValueRange acc) -> SmallVector<Value> {
          SmallVector<Value> tap;
          if (column) {
            Value unused;
            tap = WindowGeometry::unravel(k, t, rowTaps, unused);
            tap.push_back(column);
          } else {
            tap = g->tap(k, t);
          }
          auto [valid, off] = g->imageOffset(k, g->position(k, o, tap));
          Value v = staged ? staged(off) : k.load(image, element(k, k.add(base, off), c), elem);
          Value best = acc[0];
          Value take;
          if (fl) {
            Value notNan = b.create<arith::XOrIOp>(k.loc, isNaN(k, best),
                                                   b.create<arith::ConstantIntOp>(k.loc, 1, 1));
            Value greater = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OGT, v, best);
            take = b.create<arith::AndIOp>(k.loc, b.create<arith::AndIOp>(k.loc, valid, notNan),
                                           b.create<arith::OrIOp>(k.loc, isNaN(k, v), greater));
          } else {
            Value greater = b.create<arith::CmpIOp>(
                k.loc, isUnsigned ? arith::CmpIPredicate::ugt : arith::CmpIPredicate::sgt, v, best);
            take = b.create<arith::AndIOp>(k.loc, valid, greater);
          }
          return {b.create<arith::SelectOp>(k.loc, take, v, best),
                  b.create<arith::SelectOp>(k.loc, take, off, acc[1])};
        });
    return {chosen[0], chosen[1]};
  };
  // Channels-last with fewer than 32 channels: a thread per output reads, for
  // each tap, runs of C elements `stride` pixels apart (two output pixels a
  // warp at C = 16). When windows tile the rows (kernel width = stride, a
  // power of two, dilation 1) and width x C divides 32, lanes take (output
  // pixel, tap column, channel) instead: each tap row is 32 consecutive
  // elements a warp; a lane keeps its column's choice over the tap rows, and
  // the lanes of one output combine by shuffles in the tap order `choose`
  // scans (first NaN, else the larger, ties to the earlier tap: its lower
  // offset). Float images, the f32 (atomic) gradient.
  const int64_t width = g->kernel.back();
  const bool lanesOverTaps =
      cl && channels < kWarp && kWarp % channels == 0 && g->strides.back() == width &&
      g->dilations.back() == 1 && width > 1 && (width & (width - 1)) == 0 &&
      kWarp % (width * channels) == 0 && (elem.isF32() || elem.isBF16() || elem.isF16()) &&
      (!grad || tensorType(op->getResult(0)).getElementType().isF32());
  if (lanesOverTaps) {
    const int64_t group = width * channels, perWarp = kWarp / group;
    const int64_t pixels = y.getNumElements() / channels, units = (pixels + perWarp - 1) / perWarp;
    KernelLaunch launch = warpKernel(
        name, flatArgs(op), units, op->getLoc(),
        [&](Body &k, gpu::GPUFuncOp fn, Value u, Value lane) {
          OpBuilder &b = k.b;
          Location loc = k.loc;
          Type i32 = b.getI32Type();
          auto andi = [&](Value a, Value c) -> Value { return b.create<arith::AndIOp>(loc, a, c); };
          Value c = k.rem(lane, channels);
          Value column = k.rem(k.div(lane, channels), width);
          Value q = k.add(k.mul(u, k.idx(perWarp)), k.div(lane, group));
          Value inside = k.ult(q, k.idx(pixels));
          Value qc = b.create<arith::MinUIOp>(loc, q, k.idx(pixels - 1));
          Value plane;
          SmallVector<Value> o = WindowGeometry::unravel(k, qc, g->out, plane);
          Value base = k.mul(plane, k.idx(g->imageSize));
          // The lane's column of the window, then the columns' choices, lanes
          // `channels` apart; offsets grow with the tap order, so the lower
          // offset is the earlier tap.
          auto [mine, offset] = choose(k, fn.getArgument(0), base, o, c, column);
          auto [best, at] = k.butterflyBest(mine, b.create<arith::IndexCastOp>(loc, i32, offset),
                                            channels, group, /*lastTies=*/false);
          Value first = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, column, k.idx(0));
          Value out = k.add(k.mul(qc, k.idx(channels)), c);
          if (!grad) {
            k.ifThen(andi(first, inside), [&] { k.store(best, fn.getArgument(1), out, elem); });
            return;
          }
          Value some = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, at,
                                               b.create<arith::ConstantIntOp>(loc, 0, 32));
          k.ifThen(andi(andi(first, inside), some), [&] {
            Value dy = k.load(fn.getArgument(1), out, elem);
            Value off = b.create<arith::IndexCastOp>(loc, b.getIndexType(), at);
            b.create<memref::AtomicRMWOp>(loc, arith::AtomicRMWKind::addf, dy, fn.getArgument(2),
                                          ValueRange{element(k, k.add(base, off), c)});
          });
        });
    launch.zeroOutputs = grad;
    return launch;
  }
  // Channels-first 2-d windows with a horizontal stride: a thread per output
  // reads taps `stride` elements from its neighbour's (strided). Instead a
  // block stages the input rows of a tile of output rows in shared memory
  // (consecutive threads load consecutive elements: the rows lie one after
  // another), then each thread takes outputs of the tile (stored, or their
  // gradients read, consecutively) and scans its window there, in `choose`'s
  // order. Float images (f32 in shared memory), the f32 (atomic) gradient.
  const int64_t stagedRows = [&]() -> int64_t {
    if (cl || g->rank() != 2 || g->strides[1] < 2 ||
        !(elem.isF32() || elem.isBF16() || elem.isF16()) ||
        (grad && !tensorType(op->getResult(0)).getElementType().isF32()))
      return 0;
    const int64_t outRows = g->out[0], outCols = g->out[1];
    auto inRows = [&](int64_t r) {
      return (r - 1) * g->strides[0] + (g->kernel[0] - 1) * g->dilations[0] + 1;
    };
    int64_t r = std::clamp<int64_t>((kStagedPoolBlock + outCols - 1) / outCols, 1, outRows);
    while (r > 1 && inRows(r) * g->image[1] * 4 > kStagedPoolBytes)
      --r;
    return inRows(r) * g->image[1] * 4 <= kStagedPoolBytes ? r : 0;
  }();
  if (stagedRows > 0) {
    const int64_t outRows = g->out[0], outCols = g->out[1], cols = g->image[1];
    const int64_t inRows =
        (stagedRows - 1) * g->strides[0] + (g->kernel[0] - 1) * g->dilations[0] + 1;
    const int64_t rowTiles = (outRows + stagedRows - 1) / stagedRows;
    const int64_t planes = y.getNumElements() / g->outSize, tiles = planes * rowTiles;
    const int64_t block = kStagedPoolBlock;
    OpBuilder b(context);
    Type f32 = b.getF32Type();
    auto fn = newKernel(b, name, flatArgs(op), block, {sharedBuffer(inRows * cols, f32)});
    Body k = Body::of(b, op->getLoc(), fn);
    Value rows = fn.getWorkgroupAttributions()[0];
    Value gridDim = b.create<gpu::GridDimOp>(k.loc, gpu::Dimension::x);
    k.loop(k.bid(), k.idx(tiles), gridDim, [&](Value t) {
      Value plane = k.div(t, rowTiles);
      Value row0 = k.mul(k.rem(t, rowTiles), k.idx(stagedRows)); // the tile's first output row
      // The first staged image row (negative above the image: padding).
      Value first =
          b.create<arith::SubIOp>(k.loc, k.mul(row0, k.idx(g->strides[0])), k.idx(g->padBegin[0]));
      Value base = k.mul(plane, k.idx(g->imageSize));
      Value firstAt = k.add(base, k.mul(first, k.idx(cols))); // element 0 of the staged rows
      k.loop(k.tid(), k.idx(inRows * cols), k.idx(block), [&](Value e) {
        Value row = b.create<arith::AddIOp>(k.loc, first, k.div(e, cols));
        Value v = k.valueIf(
            WindowGeometry::inRange(k, row, 0, g->image[0]),
            [&]() -> Value {
              return k.load(fn.getArgument(0), k.add(firstAt, e), elem); // in f32
            },
            k.fconst(f32, -INFINITY));
        b.create<memref::StoreOp>(k.loc, v, rows, ValueRange{e});
      });
      b.create<gpu::BarrierOp>(k.loc);
      Value outAt = k.add(k.mul(plane, k.idx(g->outSize)), k.mul(row0, k.idx(outCols)));
      k.loop(k.tid(), k.idx(stagedRows * outCols), k.idx(block), [&](Value q) {
        Value orow = k.add(row0, k.div(q, outCols));
        k.ifThen(k.ult(orow, k.idx(outRows)), [&] {
          SmallVector<Value> o{orow, k.rem(q, outCols)};
          // A plane offset as an element of the staged rows (clamped: a tap
          // outside the image is read, then ignored, as choose does).
          auto staged = [&](Value off) -> Value {
            Value local = b.create<arith::SubIOp>(k.loc, off, k.mul(first, k.idx(cols)));
            local = b.create<arith::MinSIOp>(
                k.loc, b.create<arith::MaxSIOp>(k.loc, local, k.idx(0)), k.idx(inRows * cols - 1));
            return b.create<memref::LoadOp>(k.loc, rows, ValueRange{local});
          };
          auto [best, at] = choose(k, fn.getArgument(0), base, o, Value(), Value(), staged);
          Value i = k.add(outAt, q);
          if (!grad) {
            k.store(best, fn.getArgument(1), i, elem);
            return;
          }
          k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, at, k.idx(0)), [&] {
            Value dy = k.load(fn.getArgument(1), i, elem);
            b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, dy, fn.getArgument(2),
                                          ValueRange{k.add(base, at)});
          });
        });
      });
      b.create<gpu::BarrierOp>(k.loc); // the rows are read before the next tile's overwrite them
    });
    b.create<gpu::ReturnOp>(k.loc);
    KernelLaunch launch{name.str(), std::min(tiles, kMaxGrid), block};
    launch.zeroOutputs = grad;
    return launch;
  }
  if (!grad)
    return elementKernel(name, flatArgs(op), y.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                           Value plane;
                           auto [c, rest] = split(k, i);
                           SmallVector<Value> o = WindowGeometry::unravel(k, rest, g->out, plane);
                           Value base = k.mul(plane, k.idx(g->imageSize));
                           k.store(choose(k, fn.getArgument(0), base, o, c).first,
                                   fn.getArgument(1), i, elem);
                         });
  // f32 gradient, scattered per window: each window adds its gradient to the
  // tap it chose with an f32 atomic into the zeroed output (the image and the
  // window gradients may be stored low: a bf16 step keeps the result f32). Nine loads per
  // window instead of ~20 per input element (recomputing every window that
  // holds it); where windows overlap, an element chosen by several gets their
  // sum in an order that may vary run to run (the last bits, as the atomic
  // reductions).
  if (grad && tensorType(op->getResult(0)).getElementType().isF32()) {
    KernelLaunch launch = elementKernel(
        name, flatArgs(op), y.getNumElements(), op->getLoc(),
        [&](Body &k, gpu::GPUFuncOp fn, Value i) {
          OpBuilder &b = k.b;
          Value plane;
          auto [c, rest] = split(k, i);
          SmallVector<Value> o = WindowGeometry::unravel(k, rest, g->out, plane);
          Value base = k.mul(plane, k.idx(g->imageSize));
          Value off = choose(k, fn.getArgument(0), base, o, c).second;
          Value some = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, off, k.idx(0));
          k.ifThen(some, [&, c = c] {
            Value dy = k.load(fn.getArgument(1), i, elem);
            b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, dy, fn.getArgument(2),
                                          ValueRange{element(k, k.add(base, off), c)});
          });
        });
    launch.zeroOutputs = true;
    return launch;
  }
  // Other float types: gathered per input element: every window that holds it as a tap
  // adds its gradient when it chose it (deterministic, no atomics). A window's
  // choice is recomputed only for the windows that hold the element (a 3x3
  // stride-2 pool: ~2.25 of the 9 taps), not for every tap.
  return elementKernel(
      name, flatArgs(op), x.getNumElements(), op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        OpBuilder &b = k.b;
        Value plane;
        auto [c, rest] = split(k, i);
        SmallVector<Value> at = WindowGeometry::unravel(k, rest, g->image, plane);
        Value base = k.mul(plane, k.idx(g->imageSize));
        Value self = k.rem(rest, g->imageSize);
        Value acc = k.foldValue(g->taps, k.fconst(ct, 0.0), kUnrollTaps, [&](Value t, Value a) {
          auto [hit, woff, o] = g->windowAt(k, at, g->tap(k, t));
          return k.valueIf(hit, [&, woff = woff, o = o]() -> Value {
            Value chosen = b.create<arith::CmpIOp>(
                k.loc, arith::CmpIPredicate::eq, choose(k, fn.getArgument(0), base, o, c).second,
                self);
            Value dy = k.load(fn.getArgument(1),
                              element(k, k.add(k.mul(plane, k.idx(g->outSize)), woff), c), elem);
            return b.create<arith::SelectOp>(k.loc, chosen, b.create<arith::AddFOp>(k.loc, a, dy), a);
          }, a);
        });
        k.store(acc, fn.getArgument(2), i, elem);
      });
}

/// N-d average pooling (NC<spatial>) and its gradient, with the CPU kernels'
/// divisor: the window's taps inside the image, or inside the padded image with
/// count_include_pad (a product over dims, windows being boxes). The gradient
/// gathers, per input element, the shares of the windows holding it.
std::optional<KernelLaunch> KernelGenerator::Impl::avgPoolKernel(Operation *op, StringRef name,
                                                                 bool grad) {
  auto dy = tensorType(op->getOperand(0));
  auto res = tensorType(op->getResult(0));
  auto x = grad ? res : dy;   // the image
  auto y = grad ? dy : res;   // the pooled map
  Type elem = x.getElementType();
  auto include = op->getAttrOfType<BoolAttr>("count_include_pad");
  auto g = WindowGeometry::of(op, x, y);
  if (!g || !isFloat(elem) || !include)
    return std::nullopt;
  Type ct = computeType(elem);
  // 1 / divisor of window `o`.
  auto inverseDivisor = [&](Body &k, ArrayRef<Value> o) {
    OpBuilder &b = k.b;
    Value one = k.fconst(ct, 1.0), zero = k.fconst(ct, 0.0), count = one;
    for (int64_t d = 0; d < g->rank(); ++d) {
      int64_t lo = include.getValue() ? -g->padBegin[d] : 0;
      int64_t hi = include.getValue() ? g->image[d] + g->padEnd[d] : g->image[d];
      Value start = b.create<arith::SubIOp>(k.loc, k.mul(o[d], k.idx(g->strides[d])),
                                            k.idx(g->padBegin[d]));
      Value n = k.foldValue(g->kernel[d], zero, kUnrollTaps, [&](Value t, Value a) {
        Value p = k.add(start, k.mul(t, k.idx(g->dilations[d])));
        return b.create<arith::AddFOp>(
            k.loc, a, b.create<arith::SelectOp>(k.loc, WindowGeometry::inRange(k, p, lo, hi), one, zero));
      });
      count = b.create<arith::MulFOp>(k.loc, count, n);
    }
    return b.create<arith::DivFOp>(k.loc, one, count);
  };
  if (!grad)
    return elementKernel(name, flatArgs(op), y.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
      OpBuilder &b = k.b;
      Value plane;
      SmallVector<Value> o = WindowGeometry::unravel(k, i, g->out, plane);
      Value base = k.mul(plane, k.idx(g->imageSize));
      Value zero = k.fconst(ct, 0.0);
      Value acc = k.foldValue(g->taps, zero, kUnrollTaps, [&](Value t, Value a) {
        auto [valid, off] = g->imageOffset(k, g->position(k, o, g->tap(k, t)));
        Value v = k.load(fn.getArgument(0), k.add(base, off), elem);
        return b.create<arith::AddFOp>(k.loc, a, b.create<arith::SelectOp>(k.loc, valid, v, zero));
      });
      k.store(b.create<arith::MulFOp>(k.loc, acc, inverseDivisor(k, o)), fn.getArgument(1), i, elem);
    });
  return elementKernel(name, flatArgs(op), x.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value plane;
    SmallVector<Value> at = WindowGeometry::unravel(k, i, g->image, plane);
    Value acc = k.foldValue(g->taps, k.fconst(ct, 0.0), kUnrollTaps, [&](Value t, Value a) {
      auto [hit, woff, o] = g->windowAt(k, at, g->tap(k, t));
      Value d = k.load(fn.getArgument(0), k.add(k.mul(plane, k.idx(g->outSize)), woff), elem);
      Value share = b.create<arith::MulFOp>(k.loc, d, inverseDivisor(k, o));
      return b.create<arith::SelectOp>(k.loc, hit, b.create<arith::AddFOp>(k.loc, a, share), a);
    });
    k.store(acc, fn.getArgument(1), i, elem);
  });
}

/// conv, conv_transpose and conv_grad_weight in the forms cuDNN does not take
/// (isLibraryCall): asymmetric pads, other dtypes, more spatial dims. Direct
/// loops, one thread per output element, accumulating in f32 (f64 for f64):
/// the correct path, not the fast one. Layouts as the CPU kernels: NC<spatial>,
/// conv weight [M, C/group, k...], conv_transpose weight [C, M/group, k...].
std::optional<KernelLaunch> KernelGenerator::Impl::convKernel(Operation *op, StringRef name) {
  StringRef opName = op->getName().stripDialect();
  auto x = tensorType(op->getOperand(0));
  auto second = tensorType(op->getOperand(1)); // the weight, or dy of conv_grad_weight
  auto res = tensorType(op->getResult(0));
  Type elem = res.getElementType();
  auto group = op->getAttrOfType<IntegerAttr>("group");
  auto channelsLast = op->getAttrOfType<BoolAttr>("channels_last");
  if (!isFloat(elem) || x.getElementType() != elem || second.getElementType() != elem || !group ||
      group.getInt() < 1 || x.getRank() < 3 || (channelsLast && channelsLast.getValue()))
    return std::nullopt; // channels-last convolutions are cuDNN's (forge-layout makes no other)
  int64_t groups = group.getInt();
  bool hasBias = opName != "conv_grad_weight" && op->getNumOperands() > 2 && op->getOperand(2);
  Type accType = computeType(elem);
  int64_t batch = x.getDimSize(0), channels = x.getDimSize(1);
  if (channels % groups)
    return std::nullopt;
  int64_t cg = channels / groups; // input channels per group
  // s + (valid ? a * c : 0), and the result (+ bias[channel]) stored at i.
  auto addProduct = [&](Body &k, Value s, Value valid, Value a, Value c) -> Value {
    Value zero = k.fconst(accType, 0.0);
    Value term = k.b.create<arith::SelectOp>(k.loc, valid, k.b.create<arith::MulFOp>(k.loc, a, c), zero);
    return k.b.create<arith::AddFOp>(k.loc, s, term);
  };
  auto store = [&](Body &k, gpu::GPUFuncOp fn, Value sum, Value channel, Value i) {
    if (hasBias)
      sum = k.b.create<arith::AddFOp>(k.loc, sum, k.load(fn.getArgument(2), channel, elem));
    k.store(sum, fn.getArgument(op->getNumOperands()), i, elem);
  };

  if (isa<ConvOp>(op) || isa<ConvGradWeightOp>(op)) {
    bool grad = isa<ConvGradWeightOp>(op);
    auto y = grad ? second : res;               // the conv output map [N, M, out...]
    auto w = grad ? res : second;               // [M, C/group, k...]
    auto g = WindowGeometry::of(op, x, y, w);
    int64_t maps = y.getDimSize(1);
    if (!g || maps % groups || w.getDimSize(1) != cg)
      return std::nullopt;
    int64_t mg = maps / groups;
    if (!grad)
      return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                           [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        Value rest;
        SmallVector<Value> o = WindowGeometry::unravel(k, i, g->out, rest);
        Value oc = k.rem(rest, maps), n = k.div(rest, maps);
        Value firstChannel = k.mul(k.div(oc, mg), k.idx(cg));
        Value sum = k.loopAcc(k.idx(0), cg * g->taps, k.idx(1), k.fconst(accType, 0.0), [&](Value r, Value s) {
          Value ic = k.div(r, g->taps), t = k.rem(r, g->taps);
          auto [valid, off] = g->imageOffset(k, g->position(k, o, g->tap(k, t)));
          Value plane = k.add(k.mul(n, k.idx(channels)), k.add(firstChannel, ic));
          Value xv = k.load(fn.getArgument(0), k.add(k.mul(plane, k.idx(g->imageSize)), off), elem);
          Value wv = k.load(fn.getArgument(1), k.add(k.mul(k.add(k.mul(oc, k.idx(cg)), ic), k.idx(g->taps)), t), elem);
          return addProduct(k, s, valid, xv, wv);
        });
        store(k, fn, sum, oc, i);
      });
    // dW[oc, ic, t] = sum over n and windows o of dy[n, oc, o] * x[n, group(oc) + ic, p(o, t)].
    return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
      Value t = k.rem(i, g->taps), r = k.div(i, g->taps);
      Value ic = k.rem(r, cg), oc = k.div(r, cg);
      SmallVector<Value> tap = g->tap(k, t);
      Value channel = k.add(k.mul(k.div(oc, mg), k.idx(cg)), ic);
      Value sum = k.loopAcc(k.idx(0), batch * g->outSize, k.idx(1), k.fconst(accType, 0.0), [&](Value j, Value s) {
        Value n;
        SmallVector<Value> o = WindowGeometry::unravel(k, j, g->out, n);
        auto [valid, off] = g->imageOffset(k, g->position(k, o, tap));
        Value xv = k.load(fn.getArgument(0),
                          k.add(k.mul(k.add(k.mul(n, k.idx(channels)), channel), k.idx(g->imageSize)), off), elem);
        Value dy = k.load(fn.getArgument(1),
                          k.add(k.mul(k.add(k.mul(n, k.idx(maps)), oc), k.idx(g->outSize)), k.rem(j, g->outSize)), elem);
        return addProduct(k, s, valid, xv, dy);
      });
      k.store(sum, fn.getArgument(2), i, elem);
    });
  }
  // conv_transpose: the adjoint of a conv whose image is the result and whose
  // window map is x. y[n, g*mg + oc, p] = sum over ic < C/group and taps t whose
  // window i has tap t on p of x[n, g*cg + ic, i] * w[g*cg + ic, oc, t].
  auto w = second;
  auto g = WindowGeometry::of(op, res, x, w);
  if (!g || w.getDimSize(0) != channels)
    return std::nullopt;
  int64_t mg = w.getDimSize(1), maps = res.getDimSize(1);
  if (maps != mg * groups)
    return std::nullopt;
  return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    Value rest;
    SmallVector<Value> p = WindowGeometry::unravel(k, i, g->image, rest);
    Value ocFull = k.rem(rest, maps), n = k.div(rest, maps);
    Value oc = k.rem(ocFull, mg), firstChannel = k.mul(k.div(ocFull, mg), k.idx(cg));
    Value sum = k.loopAcc(k.idx(0), cg * g->taps, k.idx(1), k.fconst(accType, 0.0), [&](Value r, Value s) {
      Value ic = k.add(firstChannel, k.div(r, g->taps)), t = k.rem(r, g->taps);
      auto [hit, woff, unused] = g->windowAt(k, p, g->tap(k, t));
      Value xv = k.load(fn.getArgument(0),
                        k.add(k.mul(k.add(k.mul(n, k.idx(channels)), ic), k.idx(g->outSize)), woff), elem);
      Value wv = k.load(fn.getArgument(1), k.add(k.mul(k.add(k.mul(ic, k.idx(mg)), oc), k.idx(g->taps)), t), elem);
      return addProduct(k, s, hit, xv, wv);
    });
    store(k, fn, sum, ocFull, i);
  });
}
