// Private helpers shared by the CPU kernel files (not installed, not included
// outside runtime/lib/cpu and its unit test).
//
// Invariants:
//  * every tensor is dense row-major; strides here are element strides;
//  * f16/bf16 are stored as 16-bit patterns (Half/BFloat16) and computed in
//    float (Compute<T>); bool is stored as one byte holding 0 or 1;
//  * helpers never allocate caller-visible memory and report bad shapes or
//    dtypes as Status, never by aborting.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "forge/runtime/Kernels.h"
#include "forge/runtime/Window.h"

#define FORGE_CPU_CONCAT_(a, b) a##b
#define FORGE_CPU_CONCAT(a, b) FORGE_CPU_CONCAT_(a, b)
/// `lhs = *expr` or return expr's Status from the enclosing function.
#define CPU_ASSIGN_OR_RETURN(lhs, expr)                                                            \
  auto FORGE_CPU_CONCAT(_cpuExp, __LINE__) = (expr);                                               \
  if (!FORGE_CPU_CONCAT(_cpuExp, __LINE__))                                                        \
    return FORGE_CPU_CONCAT(_cpuExp, __LINE__).status();                                           \
  lhs = FORGE_CPU_CONCAT(_cpuExp, __LINE__).take()

namespace forge::rt::cpu {

//===----------------------------------------------------------------------===//
// 16-bit floats (conversions by hand, round to nearest even)
//===----------------------------------------------------------------------===//

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) // inf / nan (keep the payload)
    return bitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0)
      return bitsFloat(sign);
    // Subnormal: value = mant * 2^-24, exact in float.
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return bitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t floatToHalf(float f) {
  uint32_t u = floatBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) // inf or nan (force a quiet nan bit)
    return sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u | ((absu >> 13) & 0x3ffu) : 0);
  if (absu >= 0x477ff000u) // rounds to >= 65520: overflow to inf
    return sign | 0x7c00u;
  if (absu < 0x38800000u) { // below the smallest normal half (2^-14)
    if (absu < 0x33000000u) // below half of the smallest subnormal: zero
      return sign;
    // Subnormal: shift the full mantissa right and round to nearest even.
    uint32_t exp = absu >> 23, mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; // 14..24
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1)))
      ++half;
    return sign | uint16_t(half);
  }
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  uint32_t v = absu - 0x38000000u; // exponent 127 -> 15
  uint32_t rem = v & 0x1fffu;
  uint32_t half = v >> 13;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
    ++half; // may carry into the exponent, which is the correct rounding
  return sign | uint16_t(half);
}

inline float bf16ToFloat(uint16_t b) { return bitsFloat(uint32_t(b) << 16); }

inline uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) // nan: keep it a quiet nan
    return uint16_t((u >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

/// double -> float rounded to odd: an inexact result gets its last mantissa
/// bit set, so a later round-to-nearest-even to a narrower format (half,
/// bf16) rounds as if straight from the double (no double-rounding error).
inline float roundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d)
    return f;
  if (std::isinf(f))
    f = std::copysign(std::numeric_limits<float>::max(), f);
  else if (std::abs(static_cast<double>(f)) > std::abs(d))
    f = std::nextafter(f, 0.0f); // truncate toward zero
  return bitsFloat(floatBits(f) | 1u);
}

struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(floatToHalf(f)) {}
  explicit Half(double d) : bits(floatToHalf(roundToOddFloat(d))) {}
  operator float() const { return halfToFloat(bits); }
};
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(floatToBf16(f)) {}
  explicit BFloat16(double d) : bits(floatToBf16(roundToOddFloat(d))) {}
  operator float() const { return bf16ToFloat(bits); }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

//===----------------------------------------------------------------------===//
// Element type traits
//===----------------------------------------------------------------------===//

template <typename T>
inline constexpr bool kIsFloat =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// The type arithmetic on a T runs in (float for the 16-bit floats).
template <typename T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<Half> { using type = float; };
template <> struct ComputeOf<BFloat16> { using type = float; };
template <typename T> using Compute = typename ComputeOf<T>::type;

/// Accumulator for sums of many T (double for every float type, int64 for ints).
template <typename T>
using Accum = std::conditional_t<kIsFloat<T>, double,
                                 std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

template <typename T> inline Compute<T> load(T v) { return static_cast<Compute<T>>(v); }
template <typename T, typename V> inline T store(V v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return std::is_same_v<V, float> ? T(static_cast<float>(v)) : T(static_cast<double>(v));
  else
    return static_cast<T>(v);
}

/// Value conversion with defined results for every input: nan -> 0 and
/// saturation for float -> int, x != 0 for -> bool (handled by the caller).
template <typename To, typename From> inline To convertValue(From v) {
  if constexpr (kIsFloat<From> && !kIsFloat<To>) {
    double d = static_cast<double>(load(v));
    if (std::isnan(d))
      return To(0);
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest()))
      return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return store<To>(load(v));
  } else {
    return static_cast<To>(load(v));
  }
}

/// Wrapping integer arithmetic (no signed-overflow UB); identity for floats.
template <typename C> inline C wrapAdd(C a, C b) {
  if constexpr (std::is_integral_v<C>)
    return C(std::make_unsigned_t<C>(a) + std::make_unsigned_t<C>(b));
  else
    return a + b;
}
template <typename C> inline C wrapSub(C a, C b) {
  if constexpr (std::is_integral_v<C>)
    return C(std::make_unsigned_t<C>(a) - std::make_unsigned_t<C>(b));
  else
    return a - b;
}
template <typename C> inline C wrapMul(C a, C b) {
  if constexpr (std::is_integral_v<C>)
    return C(std::make_unsigned_t<C>(a) * std::make_unsigned_t<C>(b));
  else
    return a * b;
}
template <typename C> inline C wrapNeg(C a) { return wrapSub(C(0), a); }

//===----------------------------------------------------------------------===//
// dtype dispatch: f(std::type_identity<T>{}) for the storage type T of `t`
//===----------------------------------------------------------------------===//

template <typename T> using Tag = std::type_identity<T>;

Status unsupportedDType(DType t, std::string_view what = "operand");

template <typename F> Status visitFloat(DType t, F &&f, std::string_view what = "operand") {
  switch (t) {
  case bundle::F32:
    return f(Tag<float>{});
  case bundle::F64:
    return f(Tag<double>{});
  case bundle::F16:
    return f(Tag<Half>{});
  case bundle::BF16:
    return f(Tag<BFloat16>{});
  default:
    return unsupportedDType(t, what);
  }
}

/// Signed and unsigned integer types (not bool).
template <typename F> Status visitInt(DType t, F &&f, std::string_view what = "operand") {
  switch (t) {
  case bundle::I64:
    return f(Tag<int64_t>{});
  case bundle::I32:
    return f(Tag<int32_t>{});
  case bundle::I16:
    return f(Tag<int16_t>{});
  case bundle::I8:
    return f(Tag<int8_t>{});
  case bundle::U8:
    return f(Tag<uint8_t>{});
  case bundle::U16:
    return f(Tag<uint16_t>{});
  case bundle::U32:
    return f(Tag<uint32_t>{});
  case bundle::U64:
    return f(Tag<uint64_t>{});
  default:
    return unsupportedDType(t, what);
  }
}

/// Float and integer types (not bool).
template <typename F> Status visitNumeric(DType t, F &&f, std::string_view what = "operand") {
  if (isFloatType(t) && t != bundle::F8E4M3 && t != bundle::F8E5M2 && t != bundle::F8E4M3FNUZ &&
      t != bundle::F8E5M2FNUZ)
    return visitFloat(t, f, what);
  return visitInt(t, f, what);
}

/// Index tensors: i64 or i32.
template <typename F> Status visitIndex(DType t, F &&f, std::string_view what = "indices") {
  switch (t) {
  case bundle::I64:
    return f(Tag<int64_t>{});
  case bundle::I32:
    return f(Tag<int32_t>{});
  default:
    return unsupportedDType(t, what);
  }
}

/// Any dtype by element size (data movement: bytes only).
template <typename F> Status visitBySize(DType t, F &&f, std::string_view what = "operand") {
  switch (dtypeSize(t)) {
  case 1:
    return f(Tag<uint8_t>{});
  case 2:
    return f(Tag<uint16_t>{});
  case 4:
    return f(Tag<uint32_t>{});
  case 8:
    return f(Tag<uint64_t>{});
  default:
    return unsupportedDType(t, what);
  }
}

/// The bytes of `value` converted to dtype `t` (for fill values of any dtype).
Expected<std::array<uint8_t, 8>> scalarBytes(DType t, double value);

//===----------------------------------------------------------------------===//
// Dense matrix products (MatMul.cpp) and 16-bit float staging
//===----------------------------------------------------------------------===//

/// Row-major y = alpha * op(a) * op(b) + beta * y for one [m, n] matrix, through
/// OpenBLAS; beta == 0 ignores y's old contents (nan included). Errors only
/// when a dim does not fit BLAS's int.
Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha, const float *a,
            int64_t lda, const float *b, int64_t ldb, double beta, float *y, int64_t ldy);
Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha,
            const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *y,
            int64_t ldy);

/// f16/bf16 tensors run the f32 kernels on converted copies.
/// The value a float8 byte of `type` (F8E4M3, F8E5M2 or their FNUZ
/// variants) stands for, exactly (Elementwise.cpp, as Cast decodes).
double decodeFloat8(uint8_t byte, DType type);

template <typename T> std::vector<float> toFloatVector(const TensorView &t) {
  std::vector<float> out(t.present() ? t.numel() : 0);
  const T *p = t.as<const T>();
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(p[i]);
  return out;
}
template <typename T> void storeFloatVector(const std::vector<float> &v, TensorView &t) {
  T *p = t.as<T>();
  for (size_t i = 0; i < v.size(); ++i)
    p[i] = T(v[i]);
}

/// Runs the f32 kernel `fn` on f32 copies of the operands of dtype T (Half or
/// BFloat16) and converts the results back; other operands pass through.
template <typename T> Status runInFloat(KernelContext &ctx, KernelFn fn) {
  const DType half = std::is_same_v<T, Half> ? bundle::F16 : bundle::BF16;
  std::vector<std::vector<float>> inBufs, outBufs;
  inBufs.reserve(ctx.inputs.size());
  outBufs.reserve(ctx.outputs.size());
  std::vector<TensorView> ins, outs;
  for (const TensorView &t : ctx.inputs) {
    if (t.dtype != half) {
      ins.push_back(t);
      continue;
    }
    inBufs.push_back(toFloatVector<T>(t));
    ins.push_back(TensorView{inBufs.back().data(), bundle::F32, t.shape});
  }
  for (const TensorView &t : ctx.outputs) {
    if (t.dtype != half) {
      outs.push_back(t);
      continue;
    }
    outBufs.emplace_back(t.numel());
    outs.push_back(TensorView{outBufs.back().data(), bundle::F32, t.shape});
  }
  KernelContext staged{ctx.inst, ins, outs, ctx.pool, ctx.attrs};
  FORGE_RETURN_IF_ERROR(fn(staged));
  size_t next = 0;
  for (TensorView &t : ctx.outputs)
    if (t.dtype == half)
      storeFloatVector<T>(outBufs[next++], t);
  return Status::ok();
}

/// Runs `run` (a kernel taking channels-first operands, [N, C, spatial...])
/// on an instruction whose operands of rank >= 3 are channels-last
/// ([N, spatial..., C]; forge-layout's convolutions, whose weights are
/// [M, k..., C/group]: the same move of the last dim to position 1): each
/// such input is copied channels-first, the results are computed into
/// channels-first scratch and copied back. A reference path, not a fast one.
template <typename F> Status runChannelsFirst(KernelContext &ctx, F &&run) {
  auto permute = [](const TensorView &from, TensorView &to, bool toFirst) {
    // from [N, s..., C] to [N, C, s...] (toFirst) or back; a plane is s... .
    int64_t n = from.shape[0], c = toFirst ? from.shape.back() : from.shape[1];
    int64_t plane = from.numel() / std::max<int64_t>(1, n * c);
    size_t e = dtypeSize(from.dtype);
    const char *src = static_cast<const char *>(from.data);
    char *dst = static_cast<char *>(to.data);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < plane; ++p)
        for (int64_t ch = 0; ch < c; ++ch) {
          int64_t last = (i * plane + p) * c + ch, first = (i * c + ch) * plane + p;
          std::memcpy(dst + (toFirst ? first : last) * e, src + (toFirst ? last : first) * e, e);
        }
  };
  auto firstShape = [](std::vector<int64_t> s) {
    std::rotate(s.begin() + 1, s.end() - 1, s.end());
    return s;
  };
  std::vector<std::vector<char>> bufs;
  bufs.reserve(ctx.inputs.size() + ctx.outputs.size());
  std::vector<TensorView> ins, outs;
  for (const TensorView &t : ctx.inputs) {
    if (!t.present() || t.rank() < 3) {
      ins.push_back(t);
      continue;
    }
    bufs.emplace_back(t.bytes());
    TensorView view{bufs.back().data(), t.dtype, firstShape(t.shape)};
    permute(t, view, true);
    ins.push_back(view);
  }
  for (const TensorView &t : ctx.outputs) {
    if (t.rank() < 3) {
      outs.push_back(t);
      continue;
    }
    bufs.emplace_back(t.bytes());
    outs.push_back(TensorView{bufs.back().data(), t.dtype, firstShape(t.shape)});
  }
  KernelContext staged{ctx.inst, ins, outs, ctx.pool, ctx.attrs};
  FORGE_RETURN_IF_ERROR(run(staged));
  for (size_t i = 0; i < outs.size(); ++i)
    if (ctx.outputs[i].rank() >= 3)
      permute(outs[i], ctx.outputs[i], false);
  return Status::ok();
}

/// f32/f64 natively (f(Tag<T>{})), f16/bf16 through f32 copies of the operands of
/// that dtype (runInFloat of `self`).
template <typename F> Status visitGradTypes(DType t, KernelContext &ctx, KernelFn self, F &&f) {
  switch (t) {
  case bundle::F16:
    return runInFloat<Half>(ctx, self);
  case bundle::BF16:
    return runInFloat<BFloat16>(ctx, self);
  case bundle::F32:
    return f(Tag<float>{});
  case bundle::F64:
    return f(Tag<double>{});
  default:
    return unsupportedDType(t);
  }
}


//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

struct KernelInfo {
  KernelFn fn = nullptr;
  /// Operands [0, minInputs) must be present; [minInputs, maxInputs) are
  /// optional (absent = DTYPE_UNSPECIFIED). maxInputs < 0: variadic.
  int minInputs = 1, maxInputs = 1;
  int minOutputs = 1, maxOutputs = 1; // maxOutputs < 0: variadic
};

class Registry {
public:
  void add(std::string name, KernelFn fn, int minInputs, int maxInputs, int minOutputs = 1,
           int maxOutputs = 1);
  const KernelInfo *find(std::string_view name) const;
  std::vector<std::string> names() const;

private:
  std::map<std::string, KernelInfo, std::less<>> kernels_;
};

void registerElementwiseKernels(Registry &r);
void registerReduceKernels(Registry &r);
void registerMatMulKernels(Registry &r);
void registerConvKernels(Registry &r);
void registerPoolKernels(Registry &r);
void registerNormKernels(Registry &r);
void registerMovementKernels(Registry &r);
void registerLossKernels(Registry &r);
void registerBackwardKernels(Registry &r);
void registerCollectiveKernels(Registry &r);
void registerAttentionKernels(Registry &r);
void registerRandomKernels(Registry &r);

/// The registry with every CPU kernel (built on first use).
const Registry &cpuRegistry();

//===----------------------------------------------------------------------===//
// Shapes and strided iteration
//===----------------------------------------------------------------------===//

/// Elements per parallel chunk for cheap elementwise work.
inline constexpr int64_t kGrain = 16 * 1024;

std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape);

/// Strides of `in` (element strides of a dense tensor) aligned to the output
/// rank, 0 on broadcast dims; error when `in` does not broadcast to `out`.
Expected<std::vector<int64_t>> broadcastStrides(const std::vector<int64_t> &in,
                                                const std::vector<int64_t> &out);

/// NumPy broadcast of two shapes; error when incompatible.
Expected<std::vector<int64_t>> broadcastShape(const std::vector<int64_t> &a,
                                              const std::vector<int64_t> &b);

Status checkShape(const TensorView &t, const std::vector<int64_t> &expected,
                  std::string_view what = "result");
Status checkDType(const TensorView &t, DType expected, std::string_view what);

/// An iteration space over a dense output with N strided operands; adjacent
/// dims are merged where every operand allows it, so same-shape operands
/// become one flat loop.
template <size_t N> struct StridedLoop {
  std::vector<int64_t> shape;
  std::array<std::vector<int64_t>, N> strides;

  StridedLoop(const std::vector<int64_t> &outShape, std::array<std::vector<int64_t>, N> s) {
    // Drop size-1 dims, then merge dim d into d+1 when every operand is
    // linear across the pair.
    std::vector<int64_t> sh;
    std::array<std::vector<int64_t>, N> st;
    for (size_t d = 0; d < outShape.size(); ++d) {
      if (outShape[d] == 1)
        continue;
      sh.push_back(outShape[d]);
      for (size_t k = 0; k < N; ++k)
        st[k].push_back(s[k][d]);
    }
    for (size_t d = 0; d < sh.size(); ++d) {
      bool merge = !shape.empty();
      for (size_t k = 0; k < N && merge; ++k)
        merge = strides[k].back() == st[k][d] * sh[d];
      if (merge) {
        shape.back() *= sh[d];
        for (size_t k = 0; k < N; ++k)
          strides[k].back() = st[k][d];
      } else {
        shape.push_back(sh[d]);
        for (size_t k = 0; k < N; ++k)
          strides[k].push_back(st[k][d]);
      }
    }
    if (shape.empty()) {
      shape.push_back(1);
      for (size_t k = 0; k < N; ++k)
        strides[k].push_back(0);
    }
  }

  int64_t numel() const { return numElements(shape); }

  /// Calls body(outIndex, count, offsets, innerStrides) for each run along
  /// the innermost dim covering output elements [begin, end).
  template <typename Body> void forEachRun(int64_t begin, int64_t end, Body &&body) const {
    if (begin >= end)
      return;
    const size_t rank = shape.size();
    const int64_t inner = shape[rank - 1];
    std::array<int64_t, N> innerStrides, offs{};
    for (size_t k = 0; k < N; ++k)
      innerStrides[k] = strides[k][rank - 1];
    // Multi-index of `begin` over the outer dims.
    std::vector<int64_t> idx(rank, 0);
    int64_t rest = begin / inner, pos = begin % inner;
    for (size_t d = rank - 1; d-- > 0;) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
      for (size_t k = 0; k < N; ++k)
        offs[k] += idx[d] * strides[k][d];
    }
    int64_t o = begin;
    while (o < end) {
      int64_t count = std::min(inner - pos, end - o);
      std::array<int64_t, N> at;
      for (size_t k = 0; k < N; ++k)
        at[k] = offs[k] + pos * innerStrides[k];
      body(o, count, at, innerStrides);
      o += count;
      pos = 0;
      for (size_t d = rank - 1; d-- > 0;) {
        for (size_t k = 0; k < N; ++k)
          offs[k] += strides[k][d];
        if (++idx[d] < shape[d])
          break;
        for (size_t k = 0; k < N; ++k)
          offs[k] -= idx[d] * strides[k][d];
        idx[d] = 0;
      }
    }
  }

  /// forEachRun over the whole space, in parallel chunks of >= grain elements.
  template <typename Body>
  void parallelRuns(ThreadPool &pool, int64_t grain, const Body &body) const {
    pool.parallelFor(numel(), grain,
                     [&](int64_t begin, int64_t end) { forEachRun(begin, end, body); });
  }
};

/// Splits `shape` around `axis` into (outer, extent, inner) for axis-wise ops.
struct AxisSplit {
  int64_t outer = 1, extent = 1, inner = 1;
};
inline AxisSplit splitAtAxis(const std::vector<int64_t> &shape, int64_t axis) {
  AxisSplit s;
  for (int64_t d = 0; d < (int64_t)shape.size(); ++d) {
    if (d < axis)
      s.outer *= shape[d];
    else if (d == axis)
      s.extent = shape[d];
    else
      s.inner *= shape[d];
  }
  return s;
}

//===----------------------------------------------------------------------===//
// Shared by the forward kernels and their gradients (Backward.cpp)
//===----------------------------------------------------------------------===//

using ::forge::rt::windowOutput; // forge/runtime/Window.h, shared with the compiler

/// What an average pool divides the window starting at `start` by: its taps
/// inside [0, image), or inside [-padBegin, image + padEnd) with
/// count_include_pad; a product over dims, windows being boxes.
inline double avgPoolDivisor(const std::vector<int64_t> &start, const std::vector<int64_t> &image,
                             const std::vector<int64_t> &kernel,
                             const std::vector<int64_t> &dilations,
                             const std::vector<int64_t> &padBegin,
                             const std::vector<int64_t> &padEnd, bool countIncludePad) {
  double count = 1;
  for (size_t d = 0; d < image.size(); ++d) {
    int64_t lo = countIncludePad ? -padBegin[d] : 0;
    int64_t hi = countIncludePad ? image[d] + padEnd[d] : image[d];
    int64_t n = 0;
    for (int64_t k = 0; k < kernel[d]; ++k) {
      int64_t p = start[d] + k * dilations[d];
      n += p >= lo && p < hi;
    }
    count *= double(n);
  }
  return count;
}

/// Normalized indices (negative counts from the end); error outside [-dim, dim).
inline Expected<std::vector<int64_t>> readIndices(const TensorView &idx, int64_t dim) {
  std::vector<int64_t> out(idx.numel());
  Status st = visitIndex(idx.dtype, [&](auto tag) -> Status {
    using I = typename decltype(tag)::type;
    const I *p = idx.as<const I>();
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v = static_cast<int64_t>(p[i]);
      if (v < -dim || v >= dim)
        return Status::error("index {} at position {} is out of range for extent {}", v, i, dim);
      out[i] = v < 0 ? v + dim : v;
    }
    return Status::ok();
  });
  if (!st)
    return st;
  return out;
}

/// The values of a float parameter tensor (any float dtype) with exactly `n`
/// elements, as double.
inline Expected<std::vector<double>> loadParam(const TensorView &p, int64_t n,
                                               std::string_view what) {
  if (p.numel() != n)
    return Status::error("{} has shape {}, expected {} elements", what, shapeString(p.shape), n);
  std::vector<double> out(n);
  Status st = visitFloat(
      p.dtype,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T *src = p.as<const T>();
        for (int64_t i = 0; i < n; ++i)
          out[i] = static_cast<double>(load(src[i]));
        return Status::ok();
      },
      what);
  if (!st)
    return st;
  return out;
}

/// A parameter broadcast to `target` (leading size-1 dims beyond its rank
/// ignored), as the layer_norm kernels read it.
inline Expected<std::vector<double>> expandParam(const TensorView &p,
                                                 const std::vector<int64_t> &target,
                                                 std::string_view what) {
  std::vector<int64_t> shape = p.shape;
  while (shape.size() > target.size() && shape.front() == 1)
    shape.erase(shape.begin());
  auto strides = broadcastStrides(shape, target);
  if (!strides)
    return Status::error("{} of shape {} does not broadcast to {}", what, shapeString(p.shape),
                         shapeString(target));
  CPU_ASSIGN_OR_RETURN(std::vector<double> values, loadParam(p, p.numel(), what));
  std::vector<double> out(numElements(target));
  StridedLoop<1> loop(target, {*strides});
  loop.forEachRun(0, static_cast<int64_t>(out.size()),
                  [&](int64_t o, int64_t n, auto off, auto st) {
                    for (int64_t i = 0; i < n; ++i)
                      out[o + i] = values[off[0] + i * st[0]];
                  });
  return out;
}

/// Stores `values` into the float tensor `t` (any float dtype), which must
/// have exactly as many elements.
inline Status storeParam(TensorView &t, const std::vector<double> &values,
                         std::string_view what) {
  if (t.numel() != static_cast<int64_t>(values.size()))
    return Status::error("{} has shape {}, expected {} elements", what, shapeString(t.shape),
                         values.size());
  return visitFloat(
      t.dtype,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        T *dst = t.as<T>();
        for (size_t i = 0; i < values.size(); ++i)
          dst[i] = store<T>(values[i]);
        return Status::ok();
      },
      what);
}

/// Mean and biased variance, in double with two passes, of `groups` runs of
/// `len` contiguous elements, `stride` apart, starting at x; (0, 0) when empty.
template <typename T>
std::pair<double, double> moments(const T *x, int64_t groups, int64_t len, int64_t stride) {
  const double count = static_cast<double>(groups * len);
  if (count == 0)
    return {0.0, 0.0};
  double sum = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < len; ++i)
      sum += static_cast<double>(load(x[g * stride + i]));
  double mean = sum / count, sq = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < len; ++i) {
      double d = static_cast<double>(load(x[g * stride + i])) - mean;
      sq += d * d;
    }
  return {mean, sq / count};
}

/// (N, C, spatial...) viewed as n x c planes of `plane` elements; channel dim 1.
struct ChannelLayout {
  int64_t n = 0, c = 0, plane = 1;
};

inline Expected<ChannelLayout> channelLayout(const TensorView &x) {
  if (x.rank() < 2)
    return Status::error("input must have rank >= 2 (N, C, ...), got {}", shapeString(x.shape));
  ChannelLayout l{x.shape[0], x.shape[1], 1};
  for (int64_t d = 2; d < x.rank(); ++d)
    l.plane *= x.shape[d];
  return l;
}

/// Source index along one dim of extent n for padded position i (position
/// minus the begin pad): i itself inside [0, n), else per ONNX Pad `mode`
/// (constant: -1, fill; edge: clamped; reflect: mirrored without repeating
/// the edge).
inline int64_t padSourceIndex(int64_t i, int64_t n, std::string_view mode) {
  if (i >= 0 && i < n)
    return i;
  if (mode == "constant")
    return -1;
  if (mode == "edge")
    return std::clamp<int64_t>(i, 0, n - 1);
  if (mode == "wrap") // ONNX Pad-19: the opposite side's elements, periodically
    return ((i % n) + n) % n;
  if (n == 1)
    return 0;
  const int64_t period = 2 * (n - 1); // reflect
  i = ((i % period) + period) % period;
  return i >= n ? period - i : i;
}

/// A strided slice of a dense tensor of shape `in`: the result shape, the
/// element strides into `in` and the offset of the first element.
struct SliceGeom {
  std::vector<int64_t> shape, strides;
  int64_t base = 0;
};

/// Error when a position falls outside `in`; `access` ("reads", "writes")
/// names what the kernel does there, for the message.
inline Expected<SliceGeom> sliceGeometry(const std::vector<int64_t> &in,
                                         const std::vector<int64_t> &starts,
                                         const std::vector<int64_t> &ends,
                                         const std::vector<int64_t> &steps,
                                         std::string_view access) {
  const int64_t rank = static_cast<int64_t>(in.size());
  if ((int64_t)starts.size() != rank || (int64_t)ends.size() != rank ||
      (int64_t)steps.size() != rank)
    return Status::error("starts/ends/steps need one entry per dim ({})", rank);
  SliceGeom g;
  g.shape.resize(rank);
  g.strides.resize(rank);
  const std::vector<int64_t> inStrides = contiguousStrides(in);
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t st = steps[d], b = starts[d], e = ends[d];
    if (st == 0)
      return Status::error("slice step is 0 in dim {}", d);
    g.shape[d] = st > 0 ? std::max<int64_t>(0, (e - b + st - 1) / st)
                        : std::max<int64_t>(0, (b - e - st - 1) / -st);
    // Every position must lie inside the dim.
    int64_t lastPos = b + (g.shape[d] - 1) * st;
    if (g.shape[d] > 0 && (b < 0 || b >= in[d] || lastPos < 0 || lastPos >= in[d]))
      return Status::error("slice [{}:{}:{}] {} outside dim {} of extent {}", b, e, st, access, d,
                           in[d]);
    g.strides[d] = st * inStrides[d];
    if (g.shape[d] > 0)
      g.base += b * inStrides[d];
  }
  return g;
}

} // namespace forge::rt::cpu
