//===- Pointwise.cpp - map kernels and fusion regions -----------------------===//
//
// map: one output element per iteration of a grid-stride loop; every operand
// element is found through per-dimension strides over the output index
// (elementwise ops with broadcasting, cast, where, transpose, broadcast,
// slice). Adjacent dimensions that every operand walks contiguously are
// merged first; when every operand is contiguous, a scalar, or rows read
// with stride 1 (a broadcast bias) and the sizes divide by the width, operands
// are read and written as vectors of 4 elements (16-byte accesses for f32),
// or of 8 when some tensor has 2-byte or smaller elements (16 bytes of bf16:
// 8-byte accesses left bf16 kernels at ~2.5 TB/s). A loop fusion region is
// one map kernel evaluating its body per element; a horizontal region gives
// each member a block range.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"
#include "forge/runtime/Philox.h"

#include <numeric>

/// Merges adjacent output dimensions that every operand walks contiguously and
/// drops size-1 dimensions (in place).
void kernelgen::coalesce(SmallVector<int64_t> &shape, SmallVector<OperandMap> &maps) {
  SmallVector<int64_t> s;
  SmallVector<SmallVector<int64_t>> st(maps.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1)
      continue;
    bool merge = !s.empty();
    for (size_t m = 0; merge && m < maps.size(); ++m)
      merge = st[m].back() == maps[m].strides[d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t m = 0; m < maps.size(); ++m)
        st[m].back() = maps[m].strides[d];
      continue;
    }
    s.push_back(shape[d]);
    for (size_t m = 0; m < maps.size(); ++m)
      st[m].push_back(maps[m].strides[d]);
  }
  shape = s;
  for (size_t m = 0; m < maps.size(); ++m)
    maps[m].strides = st[m];
}

std::optional<KernelGenerator::Impl::PointwisePlan>
KernelGenerator::Impl::planPointwise(ArrayRef<int64_t> iterShape, SmallVector<OperandMap> maps,
                                     ArrayRef<Type> inElems, ArrayRef<int64_t> inSizes,
                                     ArrayRef<Type> outElems, SmallVector<OperandMap> outMaps) {
  PointwisePlan p;
  p.shape.assign(iterShape.begin(), iterShape.end());
  int64_t n = 1;
  for (int64_t d : p.shape)
    n *= d;
  if (n == 0)
    return std::nullopt;
  // Output maps coalesce with the operands' (a strided output keeps its rows apart).
  const size_t numIn = maps.size();
  maps.append(outMaps.begin(), outMaps.end());
  coalesce(p.shape, maps);
  p.outMaps.assign(maps.begin() + numIn, maps.end());
  maps.resize(numIn);
  p.maps = std::move(maps);
  // Vector form: every operand contiguous (strides of the output) or a scalar.
  p.outStrides = contiguousStrides(p.shape);
  p.scalar.resize(p.maps.size());
  p.identity.resize(p.maps.size());
  for (size_t m = 0; m < p.maps.size(); ++m) {
    p.scalar[m] = inSizes[m] == 1;
    p.identity[m] = p.maps[m].offset == 0 && p.maps[m].strides == p.outStrides;
  }
  // Otherwise `width` consecutive outputs must read as many consecutive,
  // aligned elements (a bias row broadcast over the outer dims, a view's
  // rows): stride 1 in the innermost dim, which divides by the width, as do
  // the offset and the outer strides.
  auto vectorizes = [&](int64_t width) {
    if (n % width != 0)
      return false;
    for (size_t m = 0; m < p.maps.size(); ++m) {
      bool rows = !p.shape.empty() && p.maps[m].strides.back() == 1 &&
                  p.shape.back() % width == 0 && p.maps[m].offset % width == 0 &&
                  llvm::all_of(ArrayRef<int64_t>(p.maps[m].strides).drop_back(),
                               [&](int64_t st) { return st % width == 0; });
      if (!(p.scalar[m] || p.identity[m] || rows))
        return false;
    }
    for (const OperandMap &o : p.outMaps) // whole, aligned vectors of a row
      if (p.shape.empty() || o.strides.back() != 1 || p.shape.back() % width != 0 ||
          o.offset % width != 0 ||
          !llvm::all_of(ArrayRef<int64_t>(o.strides).drop_back(),
                        [&](int64_t st) { return st % width == 0; }))
        return false;
    return true;
  };
  auto bytes = [](Type e) { return storageType(e).getIntOrFloatBitWidth() / 8; };
  bool narrow = llvm::any_of(outElems, [&](Type e) { return bytes(e) <= 2; });
  for (size_t m = 0; m < p.maps.size(); ++m)
    narrow |= !p.scalar[m] && bytes(inElems[m]) <= 2;
  if (p.outMaps.empty()) // tiles write the outputs contiguously
    planTiles(p);
  p.width = narrow && vectorizes(2 * kVector) ? 2 * kVector : kVector;
  p.vector = p.tileDim < 0 && vectorizes(p.width);
  for (size_t m = 0; m < p.maps.size(); ++m)
    p.inTypes.push_back(
        flatMemref(inElems[m], inSizes[m], p.vector && !p.scalar[m], p.width));
  for (auto [o, e] : llvm::enumerate(outElems)) {
    int64_t extent = n; // a strided output spans to its last element
    if (!p.outMaps.empty()) {
      extent = p.outMaps[o].offset + 1;
      for (auto [size, st] : llvm::zip(p.shape, p.outMaps[o].strides))
        extent += (size - 1) * st;
    }
    p.outTypes.push_back(flatMemref(e, extent, p.vector, p.width));
    p.outStorage.push_back(storageType(e));
  }
  p.elements = n;
  p.work = p.tileDim >= 0 ? p.tiles : p.vector ? n / p.width : n;
  return p;
}

/// A transposing read is strided however the threads walk the output: an
/// operand whose stride along the output's innermost dimension is neither 0
/// nor 1 but 1 along another dimension d (a transpose moving the innermost
/// dimension), or whose innermost run of `run` < 32 elements continues along
/// another dimension d rather than the next output one (a head split [B, T,
/// H, D] -> [B, H, T, D]: runs of D). Tiles of d x the output's column
/// dimension (the innermost, or the one outside the run) through shared
/// memory make both sides coalesced: a warp reads along d (and the run),
/// then writes along the columns (and the run). Tiles hold ~1024 elements:
/// 32 x 32 (as wide as a narrow innermost dimension, e.g. an image's 3
/// channels, with more rows), or with runs, square counts of runs whose
/// rows and columns are whole multiples of 32 elements. Every transposed
/// operand must share the form; the others are read directly (coalesced as
/// the writes are), else the plan stays untiled.
void KernelGenerator::Impl::planTiles(PointwisePlan &p) {
  const int64_t rank = static_cast<int64_t>(p.shape.size());
  if (rank < 2)
    return;
  const int64_t last = rank - 1;
  int64_t dim = -1, cols = -1, run = 0;
  SmallVector<bool> transposed(p.maps.size(), false);
  for (size_t m = 0; m < p.maps.size(); ++m) {
    if (p.scalar[m])
      continue;
    ArrayRef<int64_t> st = p.maps[m].strides;
    int64_t d = -1, c = -1, r = 0;
    if (st[last] != 0 && st[last] != 1) { // the innermost dimension moves
      for (int64_t e = 0; e < last; ++e)
        if (st[e] == 1 && p.shape[e] > 1)
          d = e;
      c = last;
      r = 1;
      if (d < 0)
        return;
    } else if (st[last] == 1 && p.shape[last] < kWarp && rank >= 3 &&
               st[last - 1] != p.shape[last] && st[last - 1] != 0) { // runs
      for (int64_t e = 0; e < last - 1; ++e)
        if (st[e] == p.shape[last] && p.shape[e] > 1)
          d = e;
      c = last - 1;
      r = p.shape[last];
      if (d < 0)
        continue; // strided otherwise, but not a transposed run: as before
    } else {
      continue;
    }
    if (dim >= 0 && (d != dim || c != cols || r != run))
      return;
    dim = d;
    cols = c;
    run = r;
    transposed[m] = true;
  }
  if (dim < 0)
    return;
  int64_t tileRows, tileCols;
  if (run == 1) {
    tileCols = std::min<int64_t>(32, p.shape[last]);
    tileRows = std::max<int64_t>(32, (1024 / tileCols) / 32 * 32);
    tileRows = std::min(tileRows, (p.shape[dim] + 31) / 32 * 32);
  } else {
    // base runs make a multiple of 32 elements; as many bases as fit 1024.
    int64_t base = kWarp / std::gcd(run, kWarp), k = 1;
    while ((k + 1) * (k + 1) * base * base * run <= 1024)
      ++k;
    auto fit = [&](int64_t size) { return std::min(k * base, (size + base - 1) / base * base); };
    tileRows = fit(p.shape[dim]);
    tileCols = fit(p.shape[cols]);
  }
  int64_t tiles = (p.shape[dim] + tileRows - 1) / tileRows *
                  ((p.shape[cols] + tileCols - 1) / tileCols);
  for (int64_t d = 0; d < rank; ++d)
    if (d != dim && d != cols && !(run > 1 && d == last))
      tiles *= p.shape[d];
  p.tileDim = dim;
  p.tileColDim = cols;
  p.tileRun = run;
  p.tileRows = tileRows;
  p.tileCols = tileCols;
  p.transposed = std::move(transposed);
  p.tiles = tiles;
}

SmallVector<Type> KernelGenerator::Impl::PointwisePlan::workgroup(MLIRContext *ctx) const {
  SmallVector<Type> buffers;
  if (tileDim < 0)
    return buffers;
  for (size_t m = 0; m < maps.size(); ++m)
    if (transposed[m])
      buffers.push_back(MemRefType::get(
          {tileCols * (tileRows * tileRun + 1)}, cast<MemRefType>(inTypes[m]).getElementType(),
          AffineMap{},
          gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup)));
  return buffers;
}

/// The tiled form of a pointwise kernel (planTiles): each block takes tiles
/// in a grid-stride loop; per tile, the transposed operands' elements go to
/// shared memory with consecutive threads along the tile's rows (their
/// contiguous dimension), then each thread evaluates output elements with
/// consecutive threads along the tile's columns (the output's innermost
/// dimension), reading the staged elements transposed (rows padded by one
/// element: no bank conflicts) and the other operands directly.
bool KernelGenerator::Impl::emitTiledPointwise(Body &k, gpu::GPUFuncOp fn,
                                               const PointwisePlan &p,
                                               ArrayRef<unsigned> inArgs,
                                               ArrayRef<unsigned> outArgs, PointwiseBody body) {
  OpBuilder &b = k.b;
  const int64_t rank = static_cast<int64_t>(p.shape.size()), last = rank - 1;
  const int64_t dim = p.tileDim, colDim = p.tileColDim, run = p.tileRun;
  const int64_t rows = p.tileRows, cols = p.tileCols;
  const int64_t rowTiles = (p.shape[dim] + rows - 1) / rows;
  const int64_t colTiles = (p.shape[colDim] + cols - 1) / cols;
  const int64_t elems = rows * cols * run, per = (elems + kTileThreads - 1) / kTileThreads;
  const int64_t colStride = rows * run + 1; // staged: [cols][rows][run], columns padded
  SmallVector<Value> staged(p.maps.size());
  unsigned w = 0;
  for (size_t m = 0; m < p.maps.size(); ++m)
    if (p.transposed[m])
      staged[m] = fn.getWorkgroupAttributions()[w++];
  auto inTile = [&](int64_t d) { return d == dim || d == colDim || (run > 1 && d == last); };
  Value tid = k.tid();
  Value grid = b.create<gpu::GridDimOp>(k.loc, gpu::Dimension::x);
  bool ok = true;
  k.loop(k.bid(), k.idx(p.work), grid, [&](Value t) {
    // The tile's position: column tile fastest, then row tile, then the
    // other dimensions (the last of them fastest).
    SmallVector<Value> at(rank);
    Value rest = k.div(t, colTiles);
    Value c0 = k.mul(k.rem(t, colTiles), k.idx(cols));
    Value r0 = k.mul(k.rem(rest, rowTiles), k.idx(rows));
    rest = k.div(rest, rowTiles);
    for (int64_t d = last; d >= 0; --d) {
      if (inTile(d))
        continue;
      at[d] = k.rem(rest, p.shape[d]);
      rest = k.div(rest, p.shape[d]);
    }
    auto address = [&](ArrayRef<int64_t> strides, int64_t offset, Value r, Value c, Value u) {
      Value a = k.idx(offset);
      for (int64_t d = 0; d < rank; ++d)
        if (strides[d] != 0)
          a = k.add(a, k.mul(d == dim      ? r
                             : d == colDim ? c
                             : inTile(d)   ? u
                                           : at[d],
                             k.idx(strides[d])));
      return a;
    };
    auto slot = [&](Value cl, Value rl, Value u) {
      Value s = k.add(k.mul(cl, k.idx(colStride)), k.mul(rl, k.idx(run)));
      return run > 1 ? k.add(s, u) : s;
    };
    // Element l of the tile in range (null: every element is).
    auto inRange = [&](Value l, Value r, Value c) {
      Value cond;
      auto both = [&](Value x) { cond = cond ? b.create<arith::AndIOp>(k.loc, cond, x) : x; };
      if (elems % kTileThreads != 0)
        both(k.ult(l, k.idx(elems)));
      if (p.shape[dim] % rows != 0)
        both(k.ult(r, k.idx(p.shape[dim])));
      if (p.shape[colDim] % cols != 0)
        both(k.ult(c, k.idx(p.shape[colDim])));
      return cond;
    };
    // Staging: the run fastest, then rows (the operands' contiguous order).
    for (size_t m = 0; m < p.maps.size(); ++m) {
      if (!p.transposed[m])
        continue;
      for (int64_t j = 0; j < per; ++j) {
        Value l = k.add(tid, k.idx(j * kTileThreads));
        Value u = k.rem(l, run), lr = k.div(l, run);
        Value rl = k.rem(lr, rows), cl = k.div(lr, rows);
        Value r = k.add(r0, rl), c = k.add(c0, cl);
        k.ifThen(inRange(l, r, c), [&] {
          Value v = b.create<memref::LoadOp>(
              k.loc, fn.getArgument(inArgs[m]),
              address(p.maps[m].strides, p.maps[m].offset, r, c, u));
          b.create<memref::StoreOp>(k.loc, v, staged[m], slot(cl, rl, u));
        });
      }
    }
    b.create<gpu::BarrierOp>(k.loc);
    // Output: the run fastest, then columns (the output's order).
    for (int64_t j = 0; j < per && ok; ++j) {
      Value l = k.add(tid, k.idx(j * kTileThreads));
      Value u = k.rem(l, run), lc = k.div(l, run);
      Value cl = k.rem(lc, cols), rl = k.div(lc, cols);
      Value r = k.add(r0, rl), c = k.add(c0, cl);
      k.ifThen(inRange(l, r, c), [&] {
        SmallVector<Value> in;
        for (size_t m = 0; m < p.maps.size(); ++m) {
          Value where = p.transposed[m] ? slot(cl, rl, u)
                        : p.scalar[m]   ? k.idx(0)
                                        : address(p.maps[m].strides, p.maps[m].offset, r, c, u);
          in.push_back(b.create<memref::LoadOp>(
              k.loc, p.transposed[m] ? staged[m] : fn.getArgument(inArgs[m]), where));
        }
        SmallVector<Value> out = body(k, in);
        if (out.size() != p.outTypes.size()) {
          ok = false;
          return;
        }
        Value o = address(p.outStrides, 0, r, c, u);
        for (size_t i = 0; i < out.size(); ++i)
          b.create<memref::StoreOp>(k.loc, out[i], fn.getArgument(outArgs[i]), o);
      });
    }
    b.create<gpu::BarrierOp>(k.loc); // the next tile overwrites the staged elements
  });
  return ok;
}

/// `map`'s element index at output coordinates `at`: its offset plus each
/// coordinate times its stride (0: broadcast).
static Value mapIndex(Body &k, const OperandMap &map, ArrayRef<Value> at) {
  Value index = k.idx(map.offset);
  for (auto [coord, stride] : llvm::zip(at, map.strides))
    if (stride != 0)
      index = k.add(index, k.mul(coord, k.idx(stride)));
  return index;
}

bool KernelGenerator::Impl::emitPointwise(Body &k, gpu::GPUFuncOp fn, const PointwisePlan &p,
                                          ArrayRef<unsigned> inArgs, ArrayRef<unsigned> outArgs,
                                          Value blockIndex, int64_t blocks, PointwiseBody body) {
  if (p.tileDim >= 0)
    return emitTiledPointwise(k, fn, p, inArgs, outArgs, body);
  OpBuilder &b = k.b;
  size_t numIn = p.maps.size();
  bool ok = true;
  k.gridStrideOver(p.work, blockIndex, blocks, [&](Value i) {
    if (p.vector) {
      // Vector i's first element, unravelled (for broadcast rows), once.
      SmallVector<Value> first;
      // The vector index of `map`'s element for vector i (a broadcast row, a
      // view's rows, a strided output's rows).
      auto mapped = [&](const OperandMap &map) -> Value {
        if (first.empty()) {
          Value rest = k.mul(i, k.idx(p.width));
          first.resize(p.shape.size());
          for (int64_t d = static_cast<int64_t>(p.shape.size()) - 1; d >= 0; --d) {
            first[d] = d == 0 ? rest : k.rem(rest, p.shape[d]);
            if (d > 0)
              rest = k.div(rest, p.shape[d]);
          }
        }
        return k.div(mapIndex(k, map, first), p.width);
      };
      auto rowVector = [&](size_t m) { return mapped(p.maps[m]); };
      SmallVector<Value> loaded;
      for (size_t m = 0; m < numIn; ++m)
        loaded.push_back(b.create<memref::LoadOp>(
            k.loc, fn.getArgument(inArgs[m]),
            p.scalar[m] ? k.idx(0) : p.identity[m] ? i : rowVector(m)));
      SmallVector<SmallVector<Value>> lanes(p.outTypes.size());
      for (int64_t l = 0; l < p.width && ok; ++l) {
        SmallVector<Value> in;
        for (size_t m = 0; m < numIn; ++m)
          in.push_back(p.scalar[m] ? loaded[m]
                                   : b.create<vector::ExtractOp>(k.loc, loaded[m], l).getResult());
        SmallVector<Value> out = body(k, in);
        if (out.size() != p.outTypes.size()) {
          ok = false;
          break;
        }
        for (size_t o = 0; o < out.size(); ++o)
          lanes[o].push_back(out[o]);
      }
      if (!ok)
        return;
      for (size_t o = 0; o < p.outTypes.size(); ++o) {
        Value vec = b.create<vector::FromElementsOp>(
            k.loc, VectorType::get({p.width}, p.outStorage[o]), lanes[o]);
        b.create<memref::StoreOp>(k.loc, vec, fn.getArgument(outArgs[o]),
                                  p.outMaps.empty() ? i : mapped(p.outMaps[o]));
      }
      return;
    }
    // Unravel the output index over the coalesced shape.
    SmallVector<Value> index(p.shape.size());
    Value rest = i;
    for (int64_t d = static_cast<int64_t>(p.shape.size()) - 1; d >= 0; --d) {
      index[d] = d == 0 ? rest : k.rem(rest, p.shape[d]);
      if (d > 0)
        rest = k.div(rest, p.shape[d]);
    }
    SmallVector<Value> in;
    for (size_t m = 0; m < numIn; ++m) {
      Value at = p.scalar[m] ? k.idx(0)
                 : p.maps[m].offset == 0 && p.maps[m].strides == p.outStrides
                     ? i
                     : mapIndex(k, p.maps[m], index);
      in.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(inArgs[m]), at));
    }
    SmallVector<Value> out = body(k, in);
    if (out.size() != p.outTypes.size()) {
      ok = false;
      return;
    }
    for (size_t o = 0; o < out.size(); ++o)
      b.create<memref::StoreOp>(k.loc, out[o], fn.getArgument(outArgs[o]),
                                p.outMaps.empty() ? i : mapIndex(k, p.outMaps[o], index));
  });
  return ok;
}

std::optional<KernelLaunch>
KernelGenerator::Impl::pointwiseKernel(StringRef name, Location loc, ArrayRef<int64_t> iterShape,
                                       SmallVector<OperandMap> maps, ArrayRef<Type> inElems,
                                       ArrayRef<int64_t> inSizes, ArrayRef<Type> outElems,
                                       PointwiseBody body) {
  std::optional<PointwisePlan> p = planPointwise(iterShape, std::move(maps), inElems, inSizes,
                                                 outElems);
  if (!p)
    return std::nullopt;
  SmallVector<Type> argTypes(p->inTypes);
  argTypes.append(p->outTypes.begin(), p->outTypes.end());
  auto [block, grid] = launchOf(*p);
  OpBuilder b(context);
  auto fn = newKernel(b, name, argTypes, block, p->workgroup(context));
  Body k = Body::of(b, loc, fn);
  SmallVector<unsigned> inArgs, outArgs;
  for (unsigned m = 0; m < p->inTypes.size(); ++m)
    inArgs.push_back(m);
  for (unsigned o = 0; o < p->outTypes.size(); ++o)
    outArgs.push_back(static_cast<unsigned>(p->inTypes.size()) + o);
  if (!emitPointwise(k, fn, *p, inArgs, outArgs, k.bid(), grid, body)) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::mapKernel(Operation *op, StringRef name,
                                                             SmallVector<OperandMap> maps) {
  auto outType = tensorType(op->getResult(0));
  SmallVector<Type> elems;
  SmallVector<int64_t> sizes;
  for (Value v : op->getOperands()) {
    elems.push_back(tensorType(v).getElementType());
    sizes.push_back(tensorType(v).getNumElements());
  }
  Type outElem = outType.getElementType();
  return pointwiseKernel(
      name, op->getLoc(), outType.getShape(), std::move(maps), elems, sizes, {outElem},
      [&](Body &k, ArrayRef<Value> in) -> SmallVector<Value> {
        SmallVector<Value> args;
        for (auto [v, e] : llvm::zip(in, elems))
          args.push_back(k.toCompute(v, e));
        Value r = emitScalar(k, op, args, elems, outElem);
        if (!r)
          return {};
        return {k.toStorage(r, outElem)};
      });
}

/// A loop fusion region: the body's ops evaluated per element in program
/// order. Every body value passes through its storage form (toStorage then
/// toCompute), so f16/bf16 rounding, float8 encoding and booleans are exactly
/// those of the unfused ops; only the memory round trips are gone.
SmallVector<Value> KernelGenerator::Impl::evalLoopBody(Body &k, FusionOp fusion,
                                                       ArrayRef<Value> in) {
  if (fusion.isViewRegion()) // the element read through the view's map is the result
    return {in[0]};
  Block &block = fusion.getBlock();
  llvm::DenseMap<Value, Value> stored; // body value -> its storage-form scalar
  for (auto [arg, v] : llvm::zip(block.getArguments(), in))
    stored[arg] = v;
  for (Operation &op : block.without_terminator()) {
    SmallVector<Value> args;
    SmallVector<Type> elems;
    for (Value v : op.getOperands()) {
      elems.push_back(tensorType(v).getElementType());
      args.push_back(k.toCompute(stored.lookup(v), elems.back()));
    }
    Type resultElem = tensorType(op.getResult(0)).getElementType();
    Value r = emitScalar(k, &op, args, elems, resultElem);
    if (!r)
      return {};
    stored[op.getResult(0)] = k.toStorage(r, resultElem);
  }
  SmallVector<Value> out;
  for (Value v : block.getTerminator()->getOperands())
    out.push_back(stored.lookup(v));
  return out;
}

Value kernelgen::evalBodyValue(Body &k, Value v, llvm::DenseMap<Value, Value> &stored,
                               function_ref<Value(BlockArgument)> loadArg) {
  if (Value known = stored.lookup(v))
    return known;
  Value r;
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    r = loadArg(arg);
  } else {
    Operation *op = v.getDefiningOp();
    SmallVector<Value> operands;
    SmallVector<Type> elems;
    for (Value u : op->getOperands()) {
      Value su = evalBodyValue(k, u, stored, loadArg);
      if (!su)
        return nullptr;
      elems.push_back(tensorType(u).getElementType());
      operands.push_back(k.toCompute(su, elems.back()));
    }
    Type resultElem = tensorType(v).getElementType();
    Value scalar = emitScalar(k, op, operands, elems, resultElem);
    if (!scalar)
      return nullptr;
    r = k.toStorage(scalar, resultElem);
  }
  stored[v] = r;
  return r;
}

void kernelgen::emitBlockRanges(Body &k, Value bid, ArrayRef<int64_t> first,
                                function_ref<void(size_t)> member) {
  std::function<void(size_t, size_t)> range = [&](size_t lo, size_t hi) {
    if (hi - lo == 1) {
      member(lo);
      return;
    }
    size_t mid = (lo + hi) / 2;
    auto branch = k.b.create<scf::IfOp>(k.loc, k.ult(bid, k.idx(first[mid])), /*withElse=*/true);
    OpBuilder::InsertionGuard g(k.b);
    k.b.setInsertionPointToStart(&branch.getThenRegion().front());
    range(lo, mid);
    k.b.setInsertionPointToStart(&branch.getElseRegion().front());
    range(mid, hi);
  };
  range(0, first.size());
}

namespace {
/// Where the elements of a view of a contiguous tensor lie: per dim of the
/// view its size and stride, and the offset of element 0.
struct StridedLayout {
  SmallVector<int64_t> shape, strides;
  int64_t offset = 0;
};

/// `l` reshaped to `to`, when the elements keep their order in strided
/// groups: each run of dims whose sizes multiply to the same product on both
/// sides must be contiguous in `l` (a head split of a slice's rows is; a
/// reshape merging a transpose's dims is not: nullopt).
std::optional<StridedLayout> reshapeLayout(const StridedLayout &l, ArrayRef<int64_t> to) {
  SmallVector<int64_t> shape, strides; // `l` without size-1 dims
  for (auto [n, st] : llvm::zip(l.shape, l.strides))
    if (n != 1) {
      shape.push_back(n);
      strides.push_back(st);
    }
  StridedLayout r{SmallVector<int64_t>(to), SmallVector<int64_t>(to.size(), 0), l.offset};
  size_t i = 0, j = 0;
  while (j < to.size() && to[j] == 1)
    r.strides[j++] = 0;
  while (i < shape.size()) {
    // One group: old dims [i, i2) and new dims [j, j2) of equal products.
    size_t i2 = i + 1, j2 = j + 1;
    if (j >= to.size())
      return std::nullopt;
    int64_t a = shape[i], b = to[j];
    while (a != b) {
      if (a < b) {
        if (i2 >= shape.size())
          return std::nullopt;
        a *= shape[i2++];
      } else {
        if (j2 >= to.size())
          return std::nullopt;
        b *= to[j2++];
      }
    }
    for (size_t d = i; d + 1 < i2; ++d)
      if (strides[d] != strides[d + 1] * shape[d + 1])
        return std::nullopt; // not contiguous within the group
    int64_t st = strides[i2 - 1];
    for (size_t d = j2; d-- > j;) {
      r.strides[d] = st;
      st *= to[d];
    }
    i = i2;
    j = j2;
    while (j < to.size() && to[j] == 1)
      r.strides[j++] = 0;
  }
  if (j != to.size())
    return std::nullopt;
  return r;
}

/// The layout of a view region's result in its input's memory.
std::optional<StridedLayout> viewLayout(FusionOp fusion) {
  auto in = cast<RankedTensorType>(fusion.getInputs()[0].getType());
  StridedLayout l{SmallVector<int64_t>(in.getShape()), contiguousStrides(in.getShape()), 0};
  for (Operation &op : fusion.getBlock().without_terminator()) {
    if (auto slice = dyn_cast<SliceOp>(op)) {
      for (auto [d, st, step] : llvm::enumerate(slice.getStarts(), slice.getSteps())) {
        if (step != 1)
          return std::nullopt;
        l.offset += st * l.strides[d];
      }
      l.shape.assign(cast<RankedTensorType>(slice.getType()).getShape().begin(),
                     cast<RankedTensorType>(slice.getType()).getShape().end());
    } else if (auto t = dyn_cast<TransposeOp>(op)) {
      StridedLayout p{{}, {}, l.offset};
      for (int64_t d : t.getPerm()) {
        p.shape.push_back(l.shape[d]);
        p.strides.push_back(l.strides[d]);
      }
      l = p;
    } else if (auto r = dyn_cast<ReshapeOp>(op)) {
      auto next = reshapeLayout(l, cast<RankedTensorType>(r.getType()).getShape());
      if (!next)
        return std::nullopt;
      l = *next;
    } else {
      return std::nullopt;
    }
  }
  return l;
}
} // namespace

/// The plan of a loop region (null when its ops cannot run in one kernel);
/// sets `fault` from its ops.
std::optional<KernelGenerator::Impl::PointwisePlan>
KernelGenerator::Impl::planLoop(FusionOp fusion) {
  if (fusion.isViewRegion()) {
    std::optional<StridedLayout> l = viewLayout(fusion);
    if (!l)
      return std::nullopt;
    Value in = fusion.getInputs()[0];
    Type elem = tensorType(in).getElementType();
    if (isFloat8(elem))
      return std::nullopt;
    SmallVector<OperandMap> maps{{l->strides, l->offset}};
    return planPointwise(fusion.getIterationShape(), std::move(maps), {elem},
                         {tensorType(in).getNumElements()},
                         {tensorType(fusion.getResult(0)).getElementType()});
  }
  auto float8 = [](Value v) { return isFloat8(tensorType(v).getElementType()); };
  for (Operation &op : fusion.getBlock().without_terminator()) {
    if (!isa<CastOp>(op) &&
        (llvm::any_of(op.getOperands(), float8) || llvm::any_of(op.getResults(), float8)))
      return std::nullopt; // as generate(): float8 values are only made and read by casts
    if (fault.empty())
      fault = faultOf(&op);
  }
  ArrayRef<int64_t> shape = fusion.getIterationShape();
  SmallVector<OperandMap> maps;
  SmallVector<Type> inElems, outElems;
  SmallVector<int64_t> inSizes;
  for (Value v : fusion.getInputs()) {
    maps.push_back({broadcastStrides(tensorType(v).getShape(), shape)});
    inElems.push_back(tensorType(v).getElementType());
    inSizes.push_back(tensorType(v).getNumElements());
  }
  for (Value v : fusion.getResults())
    outElems.push_back(tensorType(v).getElementType());
  // Results written into a concat a token stride apart (forge-fold-attention-
  // views): dims 0 and 1 are tokens, the rest one contiguous row.
  SmallVector<OperandMap> outMaps;
  if (auto rows = fusion->getAttrOfType<DenseI64ArrayAttr>("forge.out_row_strides")) {
    if (shape.size() < 3 || rows.size() != static_cast<int64_t>(fusion->getNumResults()))
      return std::nullopt;
    for (Value v : fusion.getResults()) {
      if (tensorType(v).getShape() != shape)
        return std::nullopt;
      int64_t stride = rows[outMaps.size()];
      OperandMap m{contiguousStrides(shape), 0};
      if (stride > 0) {
        if (stride < m.strides[1])
          return std::nullopt;
        m.strides[1] = stride;
        m.strides[0] = stride * shape[1];
      }
      outMaps.push_back(std::move(m));
    }
  }
  return planPointwise(shape, std::move(maps), inElems, inSizes, outElems, std::move(outMaps));
}

std::optional<KernelLaunch> KernelGenerator::Impl::loopFusionKernel(FusionOp fusion,
                                                                    StringRef name) {
  std::optional<PointwisePlan> p = planLoop(fusion);
  if (!p)
    return std::nullopt;
  SmallVector<Type> argTypes(p->inTypes);
  argTypes.append(p->outTypes.begin(), p->outTypes.end());
  auto [block, grid] = launchOf(*p);
  OpBuilder b(context);
  auto fn = newKernel(b, name, argTypes, block, p->workgroup(context));
  Body k = Body::of(b, fusion.getLoc(), fn);
  SmallVector<unsigned> inArgs, outArgs;
  for (unsigned m = 0; m < p->inTypes.size(); ++m)
    inArgs.push_back(m);
  for (unsigned o = 0; o < p->outTypes.size(); ++o)
    outArgs.push_back(static_cast<unsigned>(p->inTypes.size()) + o);
  auto body = [&](Body &kk, ArrayRef<Value> in) { return evalLoopBody(kk, fusion, in); };
  if (!emitPointwise(k, fn, *p, inArgs, outArgs, k.bid(), grid, body)) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

/// A horizontal region: independent loop regions (an optimizer's per-parameter
/// updates) in one launch. Member i owns a contiguous range of blocks, sized
/// by its work and capped at a few waves (its grid-stride loop covers the
/// rest); a binary decision tree on blockIdx.x picks the member. Arguments
/// are the region's operands, then its results (every member's outputs, in
/// member order).
///
/// A multi_reduce member's reductions get block ranges of their own too,
/// after the loop members' (emitMultiReduceSum: one atomic per block into its
/// zeroed result). The loop members that read its sums (one-element results:
/// a loss's mean, the gradient norm; forge-merge-reductions) have no blocks:
/// thread 0 of each reduction block, after its atomic, fences and counts its
/// arrival with an
/// integer atomic in the bits of the first f32 result of those members
/// (zeroed with the sums); the block that counts last fences again, reads
/// the complete sums (atomically: they are never cached stale) and evaluates
/// those members, its stores overwriting the count with the result.
std::optional<KernelLaunch> KernelGenerator::Impl::horizontalFusionKernel(FusionOp fusion,
                                                                          StringRef name) {
  Block &body = fusion.getBlock();
  const unsigned numInputs = fusion.getInputs().size();
  SmallVector<Type> argTypes(numInputs + fusion->getNumResults());
  // Each block argument read by one member, as that member reads it.
  auto bindArg = [&](Value v, Type t) -> std::optional<unsigned> {
    auto arg = dyn_cast<BlockArgument>(v);
    if (!arg || arg.getOwner() != &body)
      return std::nullopt;
    Type &slot = argTypes[arg.getArgNumber()];
    if (slot && slot != t)
      return std::nullopt;
    slot = t;
    return arg.getArgNumber();
  };
  // Units that own blocks: loop members (a pointwise plan) and reductions.
  struct Unit {
    size_t member;
    int64_t sum = -1; // the reduction of a multi_reduce member, or -1
  };
  SmallVector<Unit> units;
  SmallVector<FusionOp> members;
  std::vector<std::optional<PointwisePlan>> plans;
  std::vector<std::optional<MultiReducePlan>> reducePlans;
  SmallVector<SmallVector<unsigned>> inArgs, outArgs;
  SmallVector<size_t> late; // members evaluated once the sums are complete
  DenseMap<Value, std::pair<size_t, unsigned>> sumOf; // a sum -> (member, output arg)
  unsigned nextOut = numInputs;
  int64_t maxWork = 0;
  for (Operation &op : body.without_terminator()) {
    auto member = cast<FusionOp>(op);
    size_t m = members.size();
    members.push_back(member);
    plans.emplace_back();
    reducePlans.emplace_back();
    inArgs.emplace_back();
    outArgs.emplace_back();
    bool reads = llvm::any_of(member.getInputs(), [&](Value v) { return sumOf.count(v); });
    if (member.getKind() == "multi_reduce") {
      reducePlans[m] = planMultiReduce(member);
      if (!reducePlans[m])
        return std::nullopt;
      for (auto [j, v] : llvm::enumerate(member.getInputs())) {
        std::optional<unsigned> a = bindArg(v, reducePlans[m]->inTypes[j]);
        if (!a)
          return std::nullopt;
        inArgs[m].push_back(*a);
      }
      for (auto [j, t] : llvm::enumerate(reducePlans[m]->outTypes)) {
        sumOf[member->getResult(j)] = {m, nextOut};
        outArgs[m].push_back(nextOut);
        argTypes[nextOut++] = t;
      }
      continue;
    }
    if (reads) { // one element a result (the verifier): one thread evaluates it
      if (!llvm::all_of(member->getResultTypes(),
                        [](Type t) { return cast<RankedTensorType>(t).getNumElements() == 1; }))
        return std::nullopt;
      for (Value v : member.getInputs()) {
        if (sumOf.count(v)) {
          inArgs[m].push_back(~0u); // read from the sum's output
          continue;
        }
        std::optional<unsigned> a =
            bindArg(v, flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements()));
        if (!a)
          return std::nullopt;
        inArgs[m].push_back(*a);
      }
      for (Value r : member->getResults()) {
        outArgs[m].push_back(nextOut);
        argTypes[nextOut++] = flatMemref(tensorType(r).getElementType(), 1);
      }
      late.push_back(m);
      continue;
    }
    plans[m] = planLoop(member);
    if (!plans[m])
      return std::nullopt;
    plans[m]->untile(); // members share the block size and have no shared memory
    for (auto [j, v] : llvm::enumerate(member.getInputs())) {
      std::optional<unsigned> a = bindArg(v, plans[m]->inTypes[j]);
      if (!a)
        return std::nullopt;
      inArgs[m].push_back(*a);
    }
    for (Type t : plans[m]->outTypes) {
      outArgs[m].push_back(nextOut);
      argTypes[nextOut++] = t;
    }
    maxWork = std::max(maxWork, plans[m]->work);
    units.push_back({m, -1});
  }
  // The reductions' blocks last: one range from reduceStart on.
  for (size_t m = 0; m < members.size(); ++m)
    if (reducePlans[m])
      for (size_t i = 0; i < reducePlans[m]->sums.size(); ++i)
        units.push_back({m, static_cast<int64_t>(i)});
  if (units.empty() || nextOut != argTypes.size())
    return std::nullopt;
  for (auto [a, v] : llvm::enumerate(fusion.getInputs())) // an operand no member reads
    if (!argTypes[a])
      argTypes[a] = flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements());
  // The arrival count: the first f32 result of a late member, as i32 bits.
  std::optional<unsigned> counter;
  for (size_t m : late)
    for (auto [j, r] : llvm::enumerate(members[m]->getResults()))
      if (!counter && tensorType(r).getElementType().isF32()) {
        counter = outArgs[m][j];
        argTypes[*counter] = flatMemref(IntegerType::get(context, 32), 1);
      }
  if (!late.empty() && !counter)
    return std::nullopt;

  int64_t block = maxWork > 0 ? chooseBlockSize(target, maxWork) : 256;
  const int64_t cap = 4 * target.typicalSMs * std::max<int64_t>(1, target.maxThreadsPerSM / block);
  SmallVector<int64_t> first, blocks;
  int64_t grid = 0, reduceBlocks = 0, reduceStart = -1;
  for (const Unit &u : units) {
    first.push_back(grid);
    if (u.sum >= 0) {
      if (reduceStart < 0)
        reduceStart = grid;
      blocks.push_back(multiReduceBlocks(*reducePlans[u.member], u.sum, block));
      reduceBlocks += blocks.back();
    } else {
      blocks.push_back(std::clamp<int64_t>((plans[u.member]->work + block - 1) / block, 1, cap));
    }
    grid += blocks.back();
  }
  bool reduces = reduceBlocks > 0;
  OpBuilder b(context);
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  SmallVector<Type> shared;
  if (reduces)
    shared.push_back(sharedBuffer(kWarp, f32));
  auto fn = newKernel(b, name, argTypes, block, shared);
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value sh = reduces ? Value(fn.getWorkgroupAttributions()[0]) : Value();
  Value bid = k.bid();
  bool ok = true;
  // A fence at the GPU's scope: the sums' atomics before the arrival's, and
  // the last arrival before the sums' reads.
  auto fence = [&] {
    b.create<LLVM::InlineAsmOp>(k.loc, TypeRange{}, ValueRange{}, "fence.acq_rel.gpu;", "",
                                /*has_side_effects=*/true, /*is_align_stack=*/false,
                                LLVM::AsmDialectAttr(), ArrayAttr());
  };
  // The late members, by the thread that completes the sums.
  auto evaluateLate = [&] {
    for (size_t m : late) {
      SmallVector<Value> in;
      for (auto [j, v] : llvm::enumerate(members[m].getInputs())) {
        if (inArgs[m][j] != ~0u) {
          in.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(inArgs[m][j]), k.idx(0)));
          continue;
        }
        auto [rm, out] = sumOf.lookup(v);
        unsigned s = cast<OpResult>(v).getResultNumber();
        Value mem = fn.getArgument(out);
        Type stored = cast<MemRefType>(mem.getType()).getElementType();
        if (!stored.isF32() && !stored.isInteger(32)) { // atomics read f32 sums, i32 maxima
          ok = false;
          return;
        }
        if (reducePlans[rm]->isMax[s]) // bits of a non-negative float: read by max(., 0)
          in.push_back(b.create<arith::BitcastOp>(
              k.loc, f32,
              b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::maxs, k.i32(0), mem,
                                            ValueRange{k.idx(0)})));
        else
          in.push_back(b.create<memref::AtomicRMWOp>(
              k.loc, arith::AtomicRMWKind::addf, k.fconst(f32, 0.0), mem, ValueRange{k.idx(0)}));
      }
      SmallVector<Value> out = evalLoopBody(k, members[m], in);
      if (out.size() != members[m]->getNumResults()) {
        ok = false;
        return;
      }
      for (auto [j, v] : llvm::enumerate(out)) {
        unsigned a = outArgs[m][j];
        Value stored = a == *counter ? Value(b.create<arith::BitcastOp>(k.loc, i32, v)) : v;
        b.create<memref::StoreOp>(k.loc, stored, fn.getArgument(a), ValueRange{k.idx(0)});
      }
    }
  };
  emitBlockRanges(k, bid, first, [&](size_t u) {
    const Unit &unit = units[u];
    Value local = b.create<arith::SubIOp>(k.loc, bid, k.idx(first[u]));
    size_t m = unit.member;
    if (unit.sum < 0) {
      auto eval = [&](Body &kk, ArrayRef<Value> in) { return evalLoopBody(kk, members[m], in); };
      ok &= emitPointwise(k, fn, *plans[m], inArgs[m], outArgs[m], local, blocks[u], eval);
      return;
    }
    ok &= emitMultiReduceSum(k, fn, *reducePlans[m], unit.sum, inArgs[m], outArgs[m][unit.sum],
                             local, blocks[u], block, sh);
  });
  // Thread 0 of a reduction block has added its share (above): it arrives.
  if (!late.empty()) {
    Value reducing = b.create<arith::AndIOp>(
        k.loc, b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::uge, bid, k.idx(reduceStart)),
        b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)));
    k.ifThen(reducing, [&] {
      fence();
      Value arrived = b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addi, k.i32(1),
                                                    fn.getArgument(*counter), ValueRange{k.idx(0)});
      k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, arrived,
                                       k.i32(static_cast<int32_t>(reduceBlocks - 1))),
               [&] {
                 fence();
                 evaluateLate();
               });
    });
  }
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, block};
  if (reduces) { // the sums and the arrival count start at zero
    launch.zeroOutputs = true;
    for (size_t m = 0; m < members.size(); ++m)
      if (reducePlans[m])
        for (unsigned a : outArgs[m])
          launch.zeroOnly.push_back(a - numInputs);
    if (counter)
      launch.zeroOnly.push_back(*counter - numInputs);
  }
  return launch;
}

/// dropout_mask: element i keeps when word j % 4 of Philox4x32-10(key = seed,
/// counter = (j / 4 low, j / 4 high, step, 0)) is >= the ratio's threshold, j = i plus
/// the offset of the mask's first sample in the step's global batch (DropoutMaskOp:
/// (rank * rank_samples + first_sample) * numel / batch), with the rounds,
/// constants and threshold of forge/runtime/Philox.h (the CPU kernel), so the
/// masks are bit-identical. One thread per element computes its block's four
/// words and keeps one: 4x redundant integer work, which is cheap next to the
/// memory traffic of the tensor it masks.
std::optional<KernelLaunch> KernelGenerator::Impl::dropoutMaskKernel(Operation *op,
                                                                    StringRef name) {
  auto out = tensorType(op->getResult(0));
  if (!tensorType(op->getOperand(0)).getElementType().isF32() ||
      !tensorType(op->getOperand(1)).getElementType().isInteger(64) || out.getNumElements() == 0)
    return std::nullopt;
  double ratio = op->getAttrOfType<FloatAttr>("ratio").getValueAsDouble();
  uint64_t seed = static_cast<uint64_t>(op->getAttrOfType<IntegerAttr>("seed").getInt());
  const int64_t first = op->getAttrOfType<IntegerAttr>("first_sample").getInt();
  const int64_t rankSamples = op->getAttrOfType<IntegerAttr>("rank_samples").getInt();
  const int64_t perSample =
      out.getNumElements() / op->getAttrOfType<IntegerAttr>("batch").getInt();
  uint64_t threshold = ::forge::rt::dropoutThreshold(ratio);
  Type outElem = out.getElementType();
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Type i32 = b.getI32Type(), i64 = b.getI64Type();
    auto c32 = [&](uint32_t v) { return intConst(k, i32, static_cast<int32_t>(v)); };
    auto xor3 = [&](Value a, Value c, Value d) {
      return b.create<arith::XOrIOp>(k.loc, b.create<arith::XOrIOp>(k.loc, a, c), d);
    };
    Value step = b.create<arith::FPToUIOp>(
        k.loc, i32, b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0)));
    // j = (rank * rank_samples + first_sample) * per_sample + i, in 64 bits.
    Value rank = b.create<memref::LoadOp>(k.loc, fn.getArgument(1), k.idx(0));
    Value base = b.create<arith::MulIOp>(
        k.loc,
        b.create<arith::AddIOp>(k.loc, b.create<arith::MulIOp>(k.loc, rank, intConst(k, i64, rankSamples)),
                                intConst(k, i64, first)),
        intConst(k, i64, perSample));
    Value j = b.create<arith::AddIOp>(k.loc, base, b.create<arith::IndexCastUIOp>(k.loc, i64, i));
    Value block64 = b.create<arith::ShRUIOp>(k.loc, j, intConst(k, i64, 2));
    Value blockLo = b.create<arith::TruncIOp>(k.loc, i32, block64);
    Value blockHi = b.create<arith::TruncIOp>(
        k.loc, i32, b.create<arith::ShRUIOp>(k.loc, block64, intConst(k, i64, 32)));
    std::array<Value, 4> c = {blockLo, blockHi, step, c32(0)};
    std::array<Value, 2> key = {c32(static_cast<uint32_t>(seed)),
                                c32(static_cast<uint32_t>(seed >> 32))};
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        key[0] = b.create<arith::AddIOp>(k.loc, key[0], c32(::forge::rt::kPhiloxW0));
        key[1] = b.create<arith::AddIOp>(k.loc, key[1], c32(::forge::rt::kPhiloxW1));
      }
      auto p0 = b.create<arith::MulUIExtendedOp>(k.loc, c32(::forge::rt::kPhiloxM0), c[0]);
      auto p1 = b.create<arith::MulUIExtendedOp>(k.loc, c32(::forge::rt::kPhiloxM1), c[2]);
      c = {xor3(p1.getHigh(), c[1], key[0]), p1.getLow(), xor3(p0.getHigh(), c[3], key[1]),
           p0.getLow()};
    }
    Value lane = b.create<arith::AndIOp>(k.loc, j, intConst(k, i64, 3)), word = c[3];
    for (int w = 2; w >= 0; --w)
      word = b.create<arith::SelectOp>(
          k.loc,
          b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, lane, intConst(k, i64, w)),
          c[w], word);
    Value keep = b.create<arith::CmpIOp>(
        k.loc, arith::CmpIPredicate::uge, b.create<arith::ExtUIOp>(k.loc, i64, word),
        intConst(k, i64, static_cast<int64_t>(threshold)));
    k.store(keep, fn.getArgument(2), i, outElem);
  });
}
