// Data-movement CPU kernels: constant, reshape, transpose, broadcast, concat,
// split, slice, pad, tile, gather, gather_elements, scatter_elements, trilu, one_hot and
// resized_crop (the one that reads element values: u8 texels at its boxes' taps).
//
// Invariants: these kernels never look at element values (except one_hot's
// indices and constant/pad fill values), so they accept every dtype and move
// elements by size; every index read from a tensor is range-checked before
// any result is written, and a bad one is an error Status.
#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace forge::rt::cpu {
namespace {

Status checkSameDType(const TensorView &t, const TensorView &ref, std::string_view what) {
  return checkDType(t, ref.dtype, what);
}

/// Copies x into y through per-dim index maps: y[o] = x[map_0[o_0], ...], or
/// `fill` where any map entry is -1.
template <typename T>
void remapCopy(ThreadPool &pool, const T *x, T *y, const std::vector<int64_t> &inShape,
               const std::vector<int64_t> &outShape, const std::vector<std::vector<int64_t>> &maps,
               T fill) {
  const int64_t rank = static_cast<int64_t>(outShape.size());
  if (rank == 0) {
    y[0] = x[0];
    return;
  }
  const int64_t last = outShape.back(), outSize = numElements(outShape);
  if (outSize == 0)
    return;
  const std::vector<int64_t> inStrides = contiguousStrides(inShape);
  const std::vector<int64_t> &lastMap = maps.back();
  pool.parallelFor(outSize / last, std::max<int64_t>(1, kGrain / last),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       T *dst = y + r * last;
                       int64_t off = 0;
                       bool filled = false;
                       for (int64_t d = rank - 1, t = r; d-- > 0;) {
                         int64_t s = maps[d][t % outShape[d]];
                         t /= outShape[d];
                         filled |= s < 0;
                         off += s * inStrides[d];
                       }
                       if (filled) {
                         std::fill(dst, dst + last, fill);
                         continue;
                       }
                       const T *src = x + off;
                       for (int64_t o = 0; o < last; ++o)
                         dst[o] = lastMap[o] < 0 ? fill : src[lastMap[o]];
                     }
                   });
}

//===----------------------------------------------------------------------===//
// constant, reshape
//===----------------------------------------------------------------------===//

/// Fills the result from a `value` attribute: one number (splat) or one per
/// element, as ints or floats. (Constants normally live in bundle sections;
/// this covers a constant op left in the instruction stream.)
Status constantKernel(KernelContext &ctx) {
  TensorView &y = ctx.outputs[0];
  std::vector<double> floats;
  std::vector<int64_t> ints;
  auto it = ctx.inst.attrs().find("value");
  if (it == ctx.inst.attrs().end())
    return Status::error("missing attribute 'value'");
  const bundle::Attribute &a = it->second;
  switch (a.value_case()) {
  case bundle::Attribute::kI:
    ints = {a.i()};
    break;
  case bundle::Attribute::kF:
    floats = {a.f()};
    break;
  case bundle::Attribute::kInts:
    ints.assign(a.ints().values().begin(), a.ints().values().end());
    break;
  case bundle::Attribute::kFloats:
    floats.assign(a.floats().values().begin(), a.floats().values().end());
    break;
  default:
    return Status::error("attribute 'value' must be numbers");
  }
  const int64_t count = static_cast<int64_t>(ints.empty() ? floats.size() : ints.size());
  const int64_t n = y.numel();
  if (count != 1 && count != n)
    return Status::error("'value' has {} entries for a result of {} elements", count, n);
  auto fill = [&](auto tag) {
    using T = typename decltype(tag)::type;
    T *dst = y.as<T>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = count == 1 ? 0 : i;
      dst[i] = ints.empty() ? convertValue<T>(floats[k]) : convertValue<T>(ints[k]);
    }
    return Status::ok();
  };
  if (y.dtype == bundle::BOOL) {
    uint8_t *dst = y.as<uint8_t>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = count == 1 ? 0 : i;
      dst[i] = ints.empty() ? floats[k] != 0.0 : ints[k] != 0;
    }
    return Status::ok();
  }
  return visitNumeric(y.dtype, fill);
}

Status reshapeKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx.attrs.getInts("shape"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  if (y.numel() != x.numel())
    return Status::error("reshape from {} to {} changes the element count", shapeString(x.shape),
                         shapeString(shape));
  if (x.data != y.data && x.numel() > 0)
    std::memmove(y.data, x.data, x.bytes());
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// transpose, broadcast (strided copies)
//===----------------------------------------------------------------------===//

/// y (dense, shape outShape) = x read with element `strides` from `x + base`.
Status stridedCopy(KernelContext &ctx, const TensorView &x, TensorView &y,
                   const std::vector<int64_t> &strides, int64_t base = 0) {
  StridedLoop<1> loop(y.shape, {strides});
  return visitBySize(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *src = x.as<const T>() + base;
    T *dst = y.as<T>();
    loop.parallelRuns(ctx.pool, kGrain, [&](int64_t o, int64_t n, auto off, auto st) {
      if (st[0] == 1)
        std::memcpy(dst + o, src + off[0], n * sizeof(T));
      else
        for (int64_t i = 0; i < n; ++i)
          dst[o + i] = src[off[0] + i * st[0]];
    });
    return Status::ok();
  });
}

Status transposeKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> perm, ctx.attrs.getInts("perm"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  if ((int64_t)perm.size() != x.rank())
    return Status::error("perm has {} entries for rank {}", perm.size(), x.rank());
  std::vector<bool> seen(perm.size(), false);
  std::vector<int64_t> shape, strides, inStrides = contiguousStrides(x.shape);
  for (int64_t p : perm) {
    if (p < 0 || p >= x.rank() || seen[p])
      return Status::error("perm is not a permutation of [0, {})", x.rank());
    seen[p] = true;
    shape.push_back(x.shape[p]);
    strides.push_back(inStrides[p]);
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  if (y.numel() == 0)
    return Status::ok();
  return stridedCopy(ctx, x, y, strides);
}

Status broadcastKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx.attrs.getInts("shape"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> strides, broadcastStrides(x.shape, shape));
  if (y.numel() == 0)
    return Status::ok();
  return stridedCopy(ctx, x, y, strides);
}

//===----------------------------------------------------------------------===//
// concat, split
//===----------------------------------------------------------------------===//

/// Checks that `parts` stack along `axis` into `whole`.
Status checkStacking(const TensorView &whole, std::span<const TensorView> parts, int64_t axis) {
  if (axis < 0 || axis >= whole.rank())
    return Status::error("axis {} out of range for rank {}", axis, whole.rank());
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView &p = parts[i];
    FORGE_RETURN_IF_ERROR(checkDType(p, whole.dtype, "operand"));
    bool ok = p.rank() == whole.rank();
    for (int64_t d = 0; ok && d < whole.rank(); ++d)
      ok = d == axis || p.shape[d] == whole.shape[d];
    if (!ok)
      return Status::error("part {} of shape {} does not stack into {} along axis {}", i,
                           shapeString(p.shape), shapeString(whole.shape), axis);
    total += p.shape[axis];
  }
  if (total != whole.shape[axis])
    return Status::error("parts add up to {} along axis {}, expected {}", total, axis,
                         whole.shape[axis]);
  return Status::ok();
}

/// Copies blocks between the whole and its parts: (outer, part) tasks of
/// `extent_i * inner` contiguous bytes each.
template <bool ToWhole>
void stackCopy(ThreadPool &pool, const TensorView &whole, std::span<const TensorView> parts,
               int64_t axis) {
  const size_t esz = dtypeSize(whole.dtype);
  AxisSplit s = splitAtAxis(whole.shape, axis);
  std::vector<int64_t> begin(parts.size());
  for (size_t i = 0, at = 0; i < parts.size(); ++i) {
    begin[i] = static_cast<int64_t>(at);
    at += parts[i].shape[axis];
  }
  const int64_t tasks = s.outer * static_cast<int64_t>(parts.size());
  const int64_t avg = s.extent * s.inner / std::max<int64_t>(1, parts.size());
  pool.parallelFor(tasks, std::max<int64_t>(1, kGrain / std::max<int64_t>(avg, 1)),
                   [&](int64_t t0, int64_t t1) {
                     for (int64_t t = t0; t < t1; ++t) {
                       int64_t o = t / parts.size(), i = t % parts.size();
                       int64_t len = parts[i].shape[axis] * s.inner;
                       auto *w = static_cast<uint8_t *>(whole.data) +
                                 ((o * s.extent + begin[i]) * s.inner) * esz;
                       auto *p = static_cast<uint8_t *>(parts[i].data) + o * len * esz;
                       if (len == 0)
                         continue;
                       if (ToWhole)
                         std::memcpy(w, p, len * esz);
                       else
                         std::memcpy(p, w, len * esz);
                     }
                   });
}

Status concatKernel(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkStacking(y, ctx.inputs, axis));
  if (y.numel() > 0)
    stackCopy<true>(ctx.pool, y, ctx.inputs, axis);
  return Status::ok();
}

Status splitKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ctx.attrs.getInts("sizes"));
  if (sizes.size() != ctx.outputs.size())
    return Status::error("{} split sizes for {} results", sizes.size(), ctx.outputs.size());
  FORGE_RETURN_IF_ERROR(checkStacking(x, ctx.outputs, axis));
  for (size_t i = 0; i < sizes.size(); ++i)
    if (ctx.outputs[i].shape[axis] != sizes[i])
      return Status::error("result {} has {} entries along axis {}, sizes says {}", i,
                           ctx.outputs[i].shape[axis], axis, sizes[i]);
  if (x.numel() > 0)
    stackCopy<false>(ctx.pool, x, ctx.outputs, axis);
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// slice, pad, tile
//===----------------------------------------------------------------------===//

Status sliceKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> starts, ctx.attrs.getInts("starts"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> ends, ctx.attrs.getInts("ends"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ctx.attrs.getInts("steps"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  CPU_ASSIGN_OR_RETURN(SliceGeom g, sliceGeometry(x.shape, starts, ends, steps, "reads"));
  FORGE_RETURN_IF_ERROR(checkShape(y, g.shape));
  if (y.numel() == 0)
    return Status::ok();
  return stridedCopy(ctx, x, y, g.strides, g.base);
}

Status padKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> pads, ctx.attrs.getInts("pads"));
  CPU_ASSIGN_OR_RETURN(std::string mode, ctx.attrs.getString("mode"));
  CPU_ASSIGN_OR_RETURN(double value, ctx.attrs.getFloat("value"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  const int64_t rank = x.rank();
  if ((int64_t)pads.size() != 2 * rank)
    return Status::error("pads need {} entries, got {}", 2 * rank, pads.size());
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return Status::error("pad mode must be constant, reflect, edge or wrap, got '{}'", mode);
  std::vector<int64_t> shape(rank);
  std::vector<std::vector<int64_t>> maps(rank);
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t n = x.shape[d], before = pads[d];
    shape[d] = n + before + pads[d + rank];
    if (shape[d] < 0)
      return Status::error("negative pads remove more than dim {} holds", d);
    if (n == 0 && shape[d] > 0 && mode != "constant")
      return Status::error("{} padding of an empty dim {}", mode, d);
    maps[d].resize(shape[d]);
    for (int64_t o = 0; o < shape[d]; ++o)
      maps[d][o] = padSourceIndex(o - before, n, mode); // negative pads crop
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  CPU_ASSIGN_OR_RETURN(auto fillBytes, scalarBytes(x.dtype, value));
  if (y.numel() == 0)
    return Status::ok();
  return visitBySize(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T fill;
    std::memcpy(&fill, fillBytes.data(), sizeof(T));
    remapCopy(ctx.pool, x.as<const T>(), y.as<T>(), x.shape, shape, maps, fill);
    return Status::ok();
  });
}

Status tileKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> repeats, ctx.attrs.getInts("repeats"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  const int64_t rank = x.rank();
  if ((int64_t)repeats.size() != rank)
    return Status::error("repeats need {} entries, got {}", rank, repeats.size());
  std::vector<int64_t> shape(rank);
  std::vector<std::vector<int64_t>> maps(rank);
  for (int64_t d = 0; d < rank; ++d) {
    if (repeats[d] < 0)
      return Status::error("repeats must be non-negative");
    shape[d] = x.shape[d] * repeats[d];
    for (int64_t o = 0; o < shape[d]; ++o)
      maps[d].push_back(o % x.shape[d]);
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  if (y.numel() == 0)
    return Status::ok();
  return visitBySize(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    remapCopy(ctx.pool, x.as<const T>(), y.as<T>(), x.shape, shape, maps, T{});
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// gather, gather_elements
//===----------------------------------------------------------------------===//

Status gatherKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &idx = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  if (axis < 0 || axis >= x.rank())
    return Status::error("axis {} out of range for rank {}", axis, x.rank());
  std::vector<int64_t> shape(x.shape.begin(), x.shape.begin() + axis);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), x.shape.begin() + axis + 1, x.shape.end());
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  AxisSplit s = splitAtAxis(x.shape, axis);
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> indices, readIndices(idx, s.extent));
  const int64_t k = static_cast<int64_t>(indices.size());
  const size_t row = s.inner * dtypeSize(x.dtype);
  if (y.numel() == 0)
    return Status::ok();
  const auto *src = static_cast<const uint8_t *>(x.data);
  auto *dst = static_cast<uint8_t *>(y.data);
  ctx.pool.parallelFor(s.outer * k, std::max<int64_t>(1, kGrain / std::max<int64_t>(s.inner, 1)),
                       [&](int64_t t0, int64_t t1) {
                         for (int64_t t = t0; t < t1; ++t) {
                           int64_t o = t / k, j = t % k;
                           std::memcpy(dst + t * row, src + (o * s.extent + indices[j]) * row, row);
                         }
                       });
  return Status::ok();
}

Status gatherElementsKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &idx = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  if (axis < 0 || axis >= x.rank() || idx.rank() != x.rank())
    return Status::error("gather_elements needs indices of the input's rank and an axis in "
                         "range, got {} and axis {}",
                         shapeString(idx.shape), axis);
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != axis && idx.shape[d] > x.shape[d])
      return Status::error("indices {} exceed the input {} in dim {}", shapeString(idx.shape),
                           shapeString(x.shape), d);
  FORGE_RETURN_IF_ERROR(checkShape(y, idx.shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> indices, readIndices(idx, x.shape[axis]));
  if (y.numel() == 0)
    return Status::ok();
  // Input offset of each result position with the axis coordinate zeroed.
  std::vector<int64_t> inStrides = contiguousStrides(x.shape), strides = inStrides;
  strides[axis] = 0;
  StridedLoop<1> loop(idx.shape, {strides});
  const int64_t axisStride = inStrides[axis];
  return visitBySize(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *src = x.as<const T>();
    T *dst = y.as<T>();
    loop.parallelRuns(ctx.pool, kGrain, [&](int64_t o, int64_t n, auto off, auto st) {
      for (int64_t i = 0; i < n; ++i)
        dst[o + i] = src[off[0] + i * st[0] + indices[o + i] * axisStride];
    });
    return Status::ok();
  });
}

/// scatter_elements: a copy of the input, then every update in index order
/// (sequential: deterministic, and the reductions need no atomics).
Status scatterElementsKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &idx = ctx.inputs[1], &upd = ctx.inputs[2];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(std::string reduction, ctx.attrs.getString("reduction"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  FORGE_RETURN_IF_ERROR(checkSameDType(upd, x, "updates"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  if (axis < 0 || axis >= x.rank() || idx.rank() != x.rank() || upd.shape != idx.shape)
    return Status::error("scatter_elements needs indices and updates of one shape and the "
                         "input's rank, and an axis in range; got indices {}, updates {}, axis {}",
                         shapeString(idx.shape), shapeString(upd.shape), axis);
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != axis && idx.shape[d] > x.shape[d])
      return Status::error("indices {} exceed the input {} in dim {}", shapeString(idx.shape),
                           shapeString(x.shape), d);
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" &&
      reduction != "min")
    return Status::error("scatter_elements reduction must be none, add, mul, max or min, got "
                         "'{}'", reduction);
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> indices, readIndices(idx, x.shape[axis]));
  if (y.data != x.data)
    std::memcpy(y.data, x.data, x.bytes());
  const std::vector<int64_t> strides = contiguousStrides(x.shape);
  std::vector<int64_t> pos(idx.rank(), 0);
  auto target = [&](int64_t i) { // output offset of update i (pos: its coordinates)
    int64_t off = 0;
    for (int64_t d = 0; d < idx.rank(); ++d)
      off += (d == axis ? indices[i] : pos[d]) * strides[d];
    for (int64_t d = idx.rank() - 1; d >= 0 && ++pos[d] == idx.shape[d]; --d)
      pos[d] = 0;
    return off;
  };
  if (reduction == "none")
    return visitBySize(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *u = upd.as<const T>();
      T *out = y.as<T>();
      for (int64_t i = 0; i < idx.numel(); ++i)
        out[target(i)] = u[i];
      return Status::ok();
    });
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *u = upd.as<const T>();
    T *out = y.as<T>();
    for (int64_t i = 0; i < idx.numel(); ++i) {
      T &o = out[target(i)];
      auto a = load(o), b = load(u[i]);
      if (reduction == "add")
        o = store<T>(wrapAdd(a, b));
      else if (reduction == "mul")
        o = store<T>(wrapMul(a, b));
      else if (reduction == "max")
        o = b > a ? u[i] : o;
      else
        o = b < a ? u[i] : o;
    }
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// trilu, one_hot
//===----------------------------------------------------------------------===//

Status triluKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t upper, ctx.attrs.getInt("upper"));
  CPU_ASSIGN_OR_RETURN(int64_t k, ctx.attrs.getInt("k"));
  FORGE_RETURN_IF_ERROR(checkSameDType(y, x, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  if (x.rank() < 2)
    return Status::error("trilu input must have rank >= 2, got {}", shapeString(x.shape));
  const int64_t rows = x.shape[x.rank() - 2], cols = x.shape[x.rank() - 1];
  const int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  const size_t esz = dtypeSize(x.dtype);
  const auto *src = static_cast<const uint8_t *>(x.data);
  auto *dst = static_cast<uint8_t *>(y.data);
  // Row i keeps columns j with j - i >= k (upper) or j - i <= k (lower);
  // zero bytes are zero in every dtype.
  ctx.pool.parallelFor(mats * rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
                       [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) {
                           const int64_t i = r % rows;
                           int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
                           int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
                           const uint8_t *s = src + r * cols * esz;
                           uint8_t *d = dst + r * cols * esz;
                           if (s != d) {
                             std::memmove(d + lo * esz, s + lo * esz, (hi - lo) * esz);
                           }
                           std::memset(d, 0, lo * esz);
                           std::memset(d + hi * esz, 0, (cols - hi) * esz);
                         }
                       });
  return Status::ok();
}

/// resized_crop (ResizedCropOp): per-sample boxes of u8 images in a canvas, scaled
/// bilinearly to [B, height, width, C] f32, in f32 as the CUDA kernel computes it.
Status resizedCropKernel(KernelContext &ctx) {
  const TensorView &canvas = ctx.inputs[0], &geometry = ctx.inputs[1];
  TensorView &out = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(canvas, bundle::U8, "canvas"));
  FORGE_RETURN_IF_ERROR(checkDType(geometry, bundle::F32, "geometry"));
  CPU_ASSIGN_OR_RETURN(int64_t height, ctx.attrs.getInt("height"));
  CPU_ASSIGN_OR_RETURN(int64_t width, ctx.attrs.getInt("width"));
  if (canvas.shape.size() != 4)
    return Status::error("resized_crop: the canvas is not [B, Hc, Wc, C]");
  const int64_t batch = canvas.shape[0], ch = canvas.shape[1], cw = canvas.shape[2],
                channels = canvas.shape[3];
  FORGE_RETURN_IF_ERROR(checkShape(geometry, {batch, 6}, "geometry"));
  FORGE_RETURN_IF_ERROR(checkShape(out, {batch, height, width, channels}, "result"));
  const uint8_t *px = canvas.as<const uint8_t>();
  const float *geo = geometry.as<const float>();
  // The taps are clamped into the canvas; a NaN would not be (a data file's boxes).
  for (int64_t i = 0; i < batch * 6; ++i)
    if (!std::isfinite(geo[i]))
      return Status::error("resized_crop: sample {}'s crop box has a non-finite value ({})", i / 6,
                           geo[i]);
  // A tap's index and weight along one axis: what the CUDA kernel computes per element.
  auto tap = [](int64_t i, float origin, float box, int64_t size, float extent, int64_t limit) {
    const float last = std::min(std::max(extent, 1.0f), static_cast<float>(limit)) - 1.0f;
    const float s = std::min(
        std::max(origin + (static_cast<float>(i) + 0.5f) * box / static_cast<float>(size) - 0.5f,
                 0.0f),
        last);
    const int64_t lo = static_cast<int64_t>(s);
    return std::tuple<int64_t, int64_t, float>{lo, std::min(lo + 1, static_cast<int64_t>(last)),
                                               s - static_cast<float>(lo)};
  };
  return visitFloat(
      out.dtype,
      [&](auto tag) { // stored as f32, or rounded to bf16/f16
        using T = typename decltype(tag)::type;
        T *dst = out.as<T>();
        ctx.pool.parallelFor(batch * height, 1, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / height, y = row % height;
            const float *g = geo + b * 6;
            const auto [y0, y1, fy] = tap(y, g[1], g[3], height, g[5], ch);
            const uint8_t *r0 = px + ((b * ch + y0) * cw) * channels;
            const uint8_t *r1 = px + ((b * ch + y1) * cw) * channels;
            T *o = dst + row * width * channels;
            for (int64_t x = 0; x < width; ++x) {
              const auto [x0, x1, fx] = tap(x, g[0], g[2], width, g[4], cw);
              for (int64_t c = 0; c < channels; ++c) {
                const float p00 = r0[x0 * channels + c], p01 = r0[x1 * channels + c];
                const float p10 = r1[x0 * channels + c], p11 = r1[x1 * channels + c];
                const float top = p00 + (p01 - p00) * fx, bottom = p10 + (p11 - p10) * fx;
                o[x * channels + c] = store<T>(top + (bottom - top) * fy);
              }
            }
          }
        });
        return Status::ok();
      },
      "result");
}

Status oneHotKernel(KernelContext &ctx) {
  const TensorView &idx = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t depth, ctx.attrs.getInt("depth"));
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(double offValue, ctx.attrs.getFloat("off_value"));
  CPU_ASSIGN_OR_RETURN(double onValue, ctx.attrs.getFloat("on_value"));
  CPU_ASSIGN_OR_RETURN(DType dtype, ctx.attrs.getDType("dtype"));
  FORGE_RETURN_IF_ERROR(checkDType(y, dtype, "result"));
  if (depth <= 0 || axis < 0 || axis > idx.rank())
    return Status::error("one_hot needs depth > 0 and axis in [0, {}], got {} and {}", idx.rank(),
                         depth, axis);
  std::vector<int64_t> shape = idx.shape;
  shape.insert(shape.begin() + axis, depth);
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  CPU_ASSIGN_OR_RETURN(auto onBytes, scalarBytes(dtype, onValue));
  CPU_ASSIGN_OR_RETURN(auto offBytes, scalarBytes(dtype, offValue));
  // Class of each index: negative counts from the end, out of range -> none.
  std::vector<int64_t> cls(idx.numel());
  FORGE_RETURN_IF_ERROR(visitNumeric(
      idx.dtype,
      [&](auto tag) {
        using I = typename decltype(tag)::type;
        const I *p = idx.as<const I>();
        for (size_t i = 0; i < cls.size(); ++i) {
          int64_t v = convertValue<int64_t>(p[i]);
          if (v < 0)
            v += depth;
          cls[i] = v >= 0 && v < depth ? v : -1;
        }
        return Status::ok();
      },
      "indices"));
  AxisSplit s = splitAtAxis(shape, axis); // [outer, depth, inner]
  return visitBySize(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T on, off;
    std::memcpy(&on, onBytes.data(), sizeof(T));
    std::memcpy(&off, offBytes.data(), sizeof(T));
    T *dst = y.as<T>();
    ctx.pool.parallelFor(s.outer * depth,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(s.inner, 1)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             int64_t o = r / depth, c = r % depth;
                             const int64_t *cl = cls.data() + o * s.inner;
                             T *row = dst + r * s.inner;
                             for (int64_t j = 0; j < s.inner; ++j)
                               row[j] = cl[j] == c ? on : off;
                           }
                         });
    return Status::ok();
  });
}

} // namespace

void registerMovementKernels(Registry &r) {
  r.add("constant", &constantKernel, 0, 0);
  r.add("reshape", &reshapeKernel, 1, 1);
  r.add("transpose", &transposeKernel, 1, 1);
  r.add("broadcast", &broadcastKernel, 1, 1);
  r.add("concat", &concatKernel, 1, -1);
  r.add("split", &splitKernel, 1, 1, 0, -1);
  r.add("slice", &sliceKernel, 1, 1);
  r.add("pad", &padKernel, 1, 1);
  r.add("tile", &tileKernel, 1, 1);
  r.add("gather", &gatherKernel, 2, 2);
  r.add("gather_elements", &gatherElementsKernel, 2, 2);
  r.add("scatter_elements", &scatterElementsKernel, 3, 3);
  r.add("trilu", &triluKernel, 1, 1);
  r.add("one_hot", &oneHotKernel, 1, 1);
  r.add("resized_crop", &resizedCropKernel, 2, 2);
}

} // namespace forge::rt::cpu
