// Reduction and scan CPU kernels: reduce_{sum,mean,max,min,prod,l2}, argmax,
// top_k, cumsum, softmax and log_softmax.
//
// Invariants: sums accumulate in double for every float dtype (int64 for
// integers); a reduction's input dims are collapsed into alternating
// kept/reduced groups so each output is a loop over contiguous runs; results
// do not depend on the thread count (chunking is fixed by the grain, partial
// results combine in chunk order). softmax/log_softmax subtract the max first.
#include "KernelUtil.h"

#include <algorithm>
#include <numeric>

namespace forge::rt::cpu {
namespace {

//===----------------------------------------------------------------------===//
// Reducers: init / update / combine / finish over an accumulator type A.
//===----------------------------------------------------------------------===//

template <typename T> struct SumReducer {
  using A = Accum<T>;
  A init() const { return A(0); }
  A update(A a, Compute<T> x) const { return wrapAdd(a, static_cast<A>(x)); }
  A combine(A a, A b) const { return wrapAdd(a, b); }
  T finish(A a, int64_t) const { return convertValue<T>(a); }
};
template <typename T> struct MeanReducer : SumReducer<T> {
  T finish(typename SumReducer<T>::A a, int64_t n) const {
    return convertValue<T>(static_cast<double>(a) / static_cast<double>(n));
  }
};
template <typename T> struct ProdReducer {
  using A = Accum<T>;
  A init() const { return A(1); }
  A update(A a, Compute<T> x) const { return wrapMul(a, static_cast<A>(x)); }
  A combine(A a, A b) const { return wrapMul(a, b); }
  T finish(A a, int64_t) const { return convertValue<T>(a); }
};
template <typename T> struct L2Reducer {
  using A = double;
  A init() const { return 0; }
  A update(A a, Compute<T> x) const { return a + static_cast<double>(x) * static_cast<double>(x); }
  A combine(A a, A b) const { return a + b; }
  T finish(A a, int64_t) const { return convertValue<T>(std::sqrt(a)); }
};
/// Max (Less = false) or min (Less = true); nan propagates.
template <typename T, bool Less> struct ExtremeReducer {
  using A = Compute<T>;
  A init() const {
    if constexpr (std::numeric_limits<A>::has_infinity)
      return Less ? std::numeric_limits<A>::infinity() : -std::numeric_limits<A>::infinity();
    else
      return Less ? std::numeric_limits<A>::max() : std::numeric_limits<A>::lowest();
  }
  A update(A a, A x) const {
    if constexpr (std::is_floating_point_v<A>)
      if (std::isnan(x))
        return x;
    return (Less ? x < a : a < x) ? x : a;
  }
  A combine(A a, A b) const { return update(a, b); }
  T finish(A a, int64_t) const { return store<T>(a); }
};

//===----------------------------------------------------------------------===//
// Reduction plan
//===----------------------------------------------------------------------===//

/// out[o] = reduce over r, j of in[base(o) + redOffsets[r] + j] (inner
/// reduced), or out[o * inner + j] = reduce over r of the same (inner kept).
struct ReducePlan {
  std::vector<int64_t> keptShape, keptStrides; // outer kept groups
  std::vector<int64_t> redOffsets;             // offsets of the outer reduced groups
  int64_t inner = 1;                           // innermost group (contiguous)
  bool innerReduced = true;
  int64_t outer = 1; // product of keptShape
  int64_t count = 1; // elements reduced into each output

  int64_t base(int64_t o) const {
    int64_t off = 0;
    for (size_t d = keptShape.size(); d-- > 0;) {
      off += (o % keptShape[d]) * keptStrides[d];
      o /= keptShape[d];
    }
    return off;
  }
};

Expected<ReducePlan> planReduce(const std::vector<int64_t> &shape,
                                const std::vector<int64_t> &axes) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(rank, false);
  for (int64_t a : axes) {
    if (a < 0 || a >= rank)
      return Status::error("reduction axis {} out of range for rank {}", a, rank);
    reduced[a] = true;
  }
  // Group adjacent dims with the same role; size-1 dims play no role.
  struct Group {
    int64_t size;
    bool reduced;
  };
  std::vector<Group> groups;
  for (int64_t d = 0; d < rank; ++d) {
    if (shape[d] == 1)
      continue;
    if (!groups.empty() && groups.back().reduced == reduced[d])
      groups.back().size *= shape[d];
    else
      groups.push_back({shape[d], reduced[d]});
  }
  ReducePlan p;
  for (int64_t d = 0; d < rank; ++d)
    if (reduced[d])
      p.count *= shape[d];
  if (groups.empty())
    return p;
  p.inner = groups.back().size;
  p.innerReduced = groups.back().reduced;
  std::vector<int64_t> redShape, redStrides;
  int64_t stride = p.inner;
  for (size_t g = groups.size() - 1; g-- > 0;) {
    if (groups[g].reduced) {
      redShape.insert(redShape.begin(), groups[g].size);
      redStrides.insert(redStrides.begin(), stride);
    } else {
      p.keptShape.insert(p.keptShape.begin(), groups[g].size);
      p.keptStrides.insert(p.keptStrides.begin(), stride);
    }
    stride *= groups[g].size;
  }
  p.outer = numElements(p.keptShape);
  // Offsets of every position of the outer reduced groups (odometer order).
  int64_t r = numElements(redShape);
  p.redOffsets.resize(r);
  std::vector<int64_t> idx(redShape.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < r; ++i) {
    p.redOffsets[i] = off;
    for (size_t d = redShape.size(); d-- > 0;) {
      off += redStrides[d];
      if (++idx[d] < redShape[d])
        break;
      off -= idx[d] * redStrides[d];
      idx[d] = 0;
    }
  }
  return p;
}

template <typename T, typename R>
void runReduce(ThreadPool &pool, const ReducePlan &p, const T *in, T *out, const R &red) {
  using A = typename R::A;
  const int64_t numRed = static_cast<int64_t>(p.redOffsets.size());
  if (p.innerReduced) {
    const int64_t work = numRed * p.inner; // elements per output
    // Reduces flattened (r, j) positions [b, e) of output o.
    auto partial = [&](int64_t o, int64_t b, int64_t e) {
      A acc = red.init();
      if (p.inner == 0) // empty rows (UBSan: b / 0)
        return acc;
      const T *base = in + p.base(o);
      for (int64_t r = b / p.inner; r < numRed && r * p.inner < e; ++r) {
        const T *row = base + p.redOffsets[r];
        int64_t j0 = std::max<int64_t>(b - r * p.inner, 0);
        int64_t j1 = std::min<int64_t>(e - r * p.inner, p.inner);
        for (int64_t j = j0; j < j1; ++j)
          acc = red.update(acc, load(row[j]));
      }
      return acc;
    };
    if (p.outer >= static_cast<int64_t>(pool.size()) || work <= kGrain) {
      pool.parallelFor(p.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(work, 1)),
                       [&](int64_t b, int64_t e) {
                         for (int64_t o = b; o < e; ++o)
                           out[o] = red.finish(partial(o, 0, work), p.count);
                       });
      return;
    }
    // Few large outputs: fixed-size chunks of each, combined in order.
    const int64_t chunks = (work + kGrain - 1) / kGrain;
    std::vector<A> parts(chunks);
    for (int64_t o = 0; o < p.outer; ++o) {
      pool.parallelFor(chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c)
          parts[c] = partial(o, c * kGrain, std::min(work, (c + 1) * kGrain));
      });
      A acc = red.init();
      for (const A &a : parts)
        acc = red.combine(acc, a);
      out[o] = red.finish(acc, p.count);
    }
    return;
  }
  // Inner kept: each output row of `inner` values accumulates whole input rows.
  constexpr int64_t kBlock = 512;
  const int64_t blocks = (p.inner + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(numRed * kBlock, 1));
  pool.parallelFor(p.outer * blocks, grain, [&](int64_t b, int64_t e) {
    A acc[kBlock];
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / blocks, j0 = (t % blocks) * kBlock;
      int64_t len = std::min(kBlock, p.inner - j0);
      const T *base = in + p.base(o) + j0;
      for (int64_t j = 0; j < len; ++j)
        acc[j] = red.init();
      for (int64_t r = 0; r < numRed; ++r) {
        const T *row = base + p.redOffsets[r];
        for (int64_t j = 0; j < len; ++j)
          acc[j] = red.update(acc[j], load(row[j]));
      }
      T *dst = out + o * p.inner + j0;
      for (int64_t j = 0; j < len; ++j)
        dst[j] = red.finish(acc[j], p.count);
    }
  });
}

/// The result shape of reducing `shape` over `axes`.
std::vector<int64_t> reducedShape(const std::vector<int64_t> &shape,
                                  const std::vector<int64_t> &axes, bool keepdims) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < (int64_t)shape.size(); ++d) {
    bool r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!r)
      out.push_back(shape[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

template <template <typename> class R> Status reduceKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.attrs.getInts("axes"));
  CPU_ASSIGN_OR_RETURN(int64_t keepdims, ctx.attrs.getInt("keepdims"));
  CPU_ASSIGN_OR_RETURN(ReducePlan plan, planReduce(x.shape, axes));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, reducedShape(x.shape, axes, keepdims != 0)));
  // zero_outputs = [begin, end) (forge-elide-centred-sums): elements that are 0 whatever the
  // input, written as 0 here as by the generated kernels (the input's rounded values there
  // sum to ~0, not 0).
  int64_t zeroBegin = 0, zeroEnd = 0;
  if (ctx.attrs.has("zero_outputs")) {
    CPU_ASSIGN_OR_RETURN(std::vector<int64_t> zero, ctx.attrs.getInts("zero_outputs"));
    if (zero.size() != 2 || zero[0] < 0 || zero[0] >= zero[1] || zero[1] > y.numel())
      return Status::error("zero_outputs must be [begin, end) within the result's {} elements",
                           y.numel());
    zeroBegin = zero[0];
    zeroEnd = zero[1];
  }
  // Booleans (bytes 0/1): ReduceMax is "any", ReduceMin "all" (ONNX ReduceMax/Min-20).
  constexpr bool kExtreme = std::is_same_v<R<uint8_t>, ExtremeReducer<uint8_t, false>> ||
                            std::is_same_v<R<uint8_t>, ExtremeReducer<uint8_t, true>>;
  if constexpr (kExtreme) {
    if (x.dtype == bundle::BOOL) {
      constexpr bool kMin = std::is_same_v<R<uint8_t>, ExtremeReducer<uint8_t, true>>;
      // An empty reduction gives the identity: false for any, true for all.
      uint8_t *dst = y.as<uint8_t>();
      runReduce(ctx.pool, plan, x.as<const uint8_t>(), dst, R<uint8_t>{});
      for (int64_t i = 0; plan.count == 0 && i < y.numel(); ++i)
        dst[i] = kMin ? 1 : 0;
      std::fill(dst + zeroBegin, dst + zeroEnd, uint8_t(0));
      return Status::ok();
    }
  }
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    runReduce(ctx.pool, plan, x.as<const T>(), y.as<T>(), R<T>{});
    std::fill(y.as<T>() + zeroBegin, y.as<T>() + zeroEnd, T{});
    return Status::ok();
  });
}

template <typename T> using MaxReducer = ExtremeReducer<T, false>;
template <typename T> using MinReducer = ExtremeReducer<T, true>;

//===----------------------------------------------------------------------===//
// argmax
//===----------------------------------------------------------------------===//

Expected<int64_t> readAxis(KernelContext &ctx, const TensorView &x) {
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  if (axis < 0 || axis >= std::max<int64_t>(x.rank(), 1))
    return Status::error("axis {} out of range for rank {}", axis, x.rank());
  return axis;
}

Status argmaxKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, readAxis(ctx, x));
  CPU_ASSIGN_OR_RETURN(int64_t keepdims, ctx.attrs.getInt("keepdims"));
  CPU_ASSIGN_OR_RETURN(int64_t selectLast, ctx.attrs.getInt("select_last_index"));
  FORGE_RETURN_IF_ERROR(checkDType(y, bundle::I64, "result"));
  std::vector<int64_t> axes;
  if (x.rank() > 0)
    axes.push_back(axis);
  FORGE_RETURN_IF_ERROR(checkShape(y, reducedShape(x.shape, axes, keepdims != 0)));
  AxisSplit s = splitAtAxis(x.shape, axis);
  if (s.extent == 0 && y.numel() > 0)
    return Status::error("argmax over an empty axis");
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    int64_t *out = y.as<int64_t>();
    ctx.pool.parallelFor(s.outer * s.inner, std::max<int64_t>(1, kGrain / s.extent),
                         [&](int64_t b, int64_t e) {
                           for (int64_t t = b; t < e; ++t) {
                             const T *p = in + (t / s.inner) * s.extent * s.inner + t % s.inner;
                             auto best = load(p[0]);
                             int64_t arg = 0;
                             for (int64_t i = 1; i < s.extent; ++i) {
                               auto v = load(p[i * s.inner]);
                               if constexpr (std::is_floating_point_v<decltype(v)>)
                                 if (std::isnan(best)) // the first nan wins, as in NumPy
                                   break;
                               bool take = selectLast ? !(v < best) : best < v;
                               if constexpr (std::is_floating_point_v<decltype(v)>)
                                 take = take || std::isnan(v);
                               if (take) {
                                 best = v;
                                 arg = i;
                               }
                             }
                             out[t] = arg;
                           }
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// top_k
//===----------------------------------------------------------------------===//

/// top_k: per line along the axis, a partial sort of the positions by the
/// order largest (or smallest) first, ties by the lower index, NaN above every
/// number (onnx's reference). The order is total, so the result is unique:
/// sorted output whatever `sorted` says.
Status topKKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &values = ctx.outputs[0], &indices = ctx.outputs[1];
  CPU_ASSIGN_OR_RETURN(int64_t axis, readAxis(ctx, x));
  CPU_ASSIGN_OR_RETURN(int64_t k, ctx.attrs.getInt("k"));
  CPU_ASSIGN_OR_RETURN(int64_t largest, ctx.attrs.getInt("largest"));
  if (x.rank() == 0)
    return Status::error("top_k needs an input of rank >= 1");
  AxisSplit s = splitAtAxis(x.shape, axis);
  if (k < 0 || k > s.extent)
    return Status::error("top_k's k = {} is outside [0, {}]", k, s.extent);
  std::vector<int64_t> outShape = x.shape;
  outShape[axis] = k;
  FORGE_RETURN_IF_ERROR(checkDType(values, x.dtype, "values"));
  FORGE_RETURN_IF_ERROR(checkDType(indices, bundle::I64, "indices"));
  FORGE_RETURN_IF_ERROR(checkShape(values, outShape));
  FORGE_RETURN_IF_ERROR(checkShape(indices, outShape));
  if (k == 0)
    return Status::ok();
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    T *outV = values.as<T>();
    int64_t *outI = indices.as<int64_t>();
    ctx.pool.parallelFor(s.outer * s.inner, std::max<int64_t>(1, kGrain / s.extent),
                         [&](int64_t b, int64_t e) {
                           std::vector<int64_t> order(s.extent);
                           for (int64_t t = b; t < e; ++t) {
                             const int64_t o = t / s.inner, c = t % s.inner;
                             const T *p = in + o * s.extent * s.inner + c;
                             auto before = [&](int64_t i, int64_t j) {
                               auto u = load(p[i * s.inner]), v = load(p[j * s.inner]);
                               if constexpr (kIsFloat<T>) {
                                 bool un = std::isnan(u), vn = std::isnan(v);
                                 if (un || vn)
                                   return un && vn ? i < j : (largest ? un : vn);
                               }
                               if (u != v)
                                 return largest ? v < u : u < v;
                               return i < j;
                             };
                             std::iota(order.begin(), order.end(), int64_t(0));
                             std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                               before);
                             const int64_t base = o * k * s.inner + c;
                             for (int64_t r = 0; r < k; ++r) {
                               outV[base + r * s.inner] = p[order[r] * s.inner];
                               outI[base + r * s.inner] = order[r];
                             }
                           }
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// cumsum
//===----------------------------------------------------------------------===//

Status cumsumKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, readAxis(ctx, x));
  CPU_ASSIGN_OR_RETURN(int64_t exclusive, ctx.attrs.getInt("exclusive"));
  CPU_ASSIGN_OR_RETURN(int64_t reverse, ctx.attrs.getInt("reverse"));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  AxisSplit s = splitAtAxis(x.shape, axis);
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (s.inner + kBlock - 1) / kBlock;
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = Accum<T>;
    const T *in = x.as<const T>();
    T *out = y.as<T>();
    // One task per (outer, block of inner columns); columns scan together.
    ctx.pool.parallelFor(s.outer * blocks,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(s.extent * kBlock, 1)),
                         [&](int64_t b, int64_t e) {
                           A acc[kBlock];
                           for (int64_t t = b; t < e; ++t) {
                             int64_t o = t / blocks, j0 = (t % blocks) * kBlock;
                             int64_t len = std::min(kBlock, s.inner - j0);
                             std::fill(acc, acc + len, A(0));
                             for (int64_t step = 0; step < s.extent; ++step) {
                               int64_t i = reverse ? s.extent - 1 - step : step;
                               int64_t off = (o * s.extent + i) * s.inner + j0;
                               for (int64_t j = 0; j < len; ++j) {
                                 A v = static_cast<A>(load(in[off + j]));
                                 if (exclusive) {
                                   out[off + j] = convertValue<T>(acc[j]);
                                   acc[j] = wrapAdd(acc[j], v);
                                 } else {
                                   acc[j] = wrapAdd(acc[j], v);
                                   out[off + j] = convertValue<T>(acc[j]);
                                 }
                               }
                             }
                           }
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// softmax / log_softmax
//===----------------------------------------------------------------------===//

/// Softmax of the n elements p[0], p[st], ... into q (Unit: st == 1, which
/// lets the compiler vectorize). Exponentials are stored once when T is its
/// own compute type, recomputed for f16/bf16 to keep full precision.
template <bool Log, bool Unit, typename T>
void softmaxLine(const T *p, T *q, int64_t n, int64_t stride) {
  using C = Compute<T>;
  const int64_t st = Unit ? 1 : stride;
  C m = -std::numeric_limits<C>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    C v = load(p[i * st]);
    nan |= v != v;
    m = v > m ? v : m;
  }
  if (nan)
    m = std::numeric_limits<C>::quiet_NaN();
  else if (std::isinf(m)) // all -inf (or +inf present): avoid inf - inf
    m = m > 0 ? m : C(0);
  double sum = 0;
  if constexpr (Log || !std::is_same_v<T, C>) {
    for (int64_t i = 0; i < n; ++i)
      sum += static_cast<double>(std::exp(load(p[i * st]) - m));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      C e = std::exp(p[i * st] - m);
      q[i * st] = e;
      sum += static_cast<double>(e);
    }
  }
  if constexpr (Log) {
    const C lse = m + static_cast<C>(std::log(sum));
    for (int64_t i = 0; i < n; ++i)
      q[i * st] = store<T>(load(p[i * st]) - lse);
  } else if constexpr (std::is_same_v<T, C>) {
    const C inv = static_cast<C>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i)
      q[i * st] *= inv;
  } else {
    const C inv = static_cast<C>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i)
      q[i * st] = store<T>(std::exp(load(p[i * st]) - m) * inv);
  }
}

template <bool Log> Status softmaxKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, readAxis(ctx, x));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  AxisSplit s = splitAtAxis(x.shape, axis);
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    T *out = y.as<T>();
    // One line along the axis per task (stride `inner` between its elements).
    ctx.pool.parallelFor(s.outer * s.inner,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(s.extent, 1)),
                         [&](int64_t b, int64_t e) {
                           for (int64_t t = b; t < e; ++t) {
                             int64_t base = (t / s.inner) * s.extent * s.inner + t % s.inner;
                             if (s.inner == 1)
                               softmaxLine<Log, true>(in + base, out + base, s.extent, 1);
                             else
                               softmaxLine<Log, false>(in + base, out + base, s.extent, s.inner);
                           }
                         });
    return Status::ok();
  });
}

} // namespace

void registerReduceKernels(Registry &r) {
  r.add("reduce_sum", &reduceKernel<SumReducer>, 1, 1);
  r.add("reduce_mean", &reduceKernel<MeanReducer>, 1, 1);
  r.add("reduce_max", &reduceKernel<MaxReducer>, 1, 1);
  r.add("reduce_min", &reduceKernel<MinReducer>, 1, 1);
  r.add("reduce_prod", &reduceKernel<ProdReducer>, 1, 1);
  r.add("reduce_l2", &reduceKernel<L2Reducer>, 1, 1);
  r.add("argmax", &argmaxKernel, 1, 1);
  r.add("top_k", &topKKernel, 1, 1, 2, 2);
  r.add("cumsum", &cumsumKernel, 1, 1);
  r.add("softmax", &softmaxKernel<false>, 1, 1);
  r.add("log_softmax", &softmaxKernel<true>, 1, 1);
}

} // namespace forge::rt::cpu
