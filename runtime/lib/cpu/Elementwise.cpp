// Elementwise CPU kernels: NumPy-broadcast binary arithmetic and comparisons,
// bitwise ops and shifts, unary math, cast, isnan/isinf and where.
//
// Invariants: every op is a small functor over the compute type (float for
// f16/bf16); one strided loop template runs them all, in parallel chunks of
// kGrain elements; same-shape operands collapse to one flat contiguous loop.
// Integer arithmetic wraps (no UB); integer division or modulo by zero is an
// error.
#include "KernelUtil.h"

#include <algorithm>
#include <atomic>

namespace forge::rt::cpu {
namespace {

//===----------------------------------------------------------------------===//
// Binary ops
//===----------------------------------------------------------------------===//

enum class BinaryKind {
  Arith,   // numeric operands of one dtype -> same dtype
  Compare, // numeric (or bool) operands of one dtype -> bool
  Logic,   // bool -> bool
  Pow,     // numeric base, numeric exponent of any dtype -> base dtype
  Bitwise, // integer operands of one dtype -> same dtype
};

template <typename C> C nanOr(C a, C b, C pick) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a))
      return a;
    if (std::isnan(b))
      return b;
  }
  return pick;
}

struct AddOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const { return wrapAdd(a, b); }
};
struct SubOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const { return wrapSub(a, b); }
};
struct MulOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const { return wrapMul(a, b); }
};
struct DivOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      // Zero divisors are rejected before the loop; -1 would trap on MIN / -1.
      if constexpr (std::is_signed_v<C>)
        if (b == C(-1))
          return wrapNeg(a);
      return b == C(0) ? C(0) : C(a / b);
    } else {
      return a / b;
    }
  }
};
struct ModOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  bool fmod = false; // C fmod (dividend's sign) instead of Python % (divisor's)
  static Expected<ModOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(int64_t fmod, attrs.getInt("fmod"));
    return ModOp{fmod != 0};
  }
  template <typename C> C operator()(C a, C b) const {
    C r;
    if constexpr (std::is_integral_v<C>) {
      // Zero divisors are rejected before the loop; -1 would trap on MIN % -1.
      if (b == C(0))
        return C(0);
      if constexpr (std::is_signed_v<C>)
        if (b == C(-1))
          return C(0);
      r = C(a % b);
    } else {
      r = std::fmod(a, b);
    }
    // Floored: move a nonzero remainder to the divisor's side (|r| < |b|,
    // so r + b cannot overflow).
    if (!fmod && r != C(0) && ((r < C(0)) != (b < C(0))))
      r = C(r + b);
    return r;
  }
};
struct MinOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const { return nanOr(a, b, b < a ? b : a); }
};
struct MaxOp {
  static constexpr BinaryKind kKind = BinaryKind::Arith;
  template <typename C> C operator()(C a, C b) const { return nanOr(a, b, a < b ? b : a); }
};

template <typename C> C intPow(C base, int64_t exp) {
  if (exp < 0) {
    if constexpr (std::is_signed_v<C>)
      if (base == C(-1))
        return (exp & 1) ? C(-1) : C(1);
    return base == C(1) ? C(1) : C(0);
  }
  C result = 1;
  while (exp) {
    if (exp & 1)
      result = wrapMul(result, base);
    base = wrapMul(base, base);
    exp >>= 1;
  }
  return result;
}

struct PowOp {
  static constexpr BinaryKind kKind = BinaryKind::Pow;
  template <typename CA, typename CB> CA operator()(CA a, CB b) const {
    if constexpr (std::is_floating_point_v<CA>)
      return std::pow(a, static_cast<CA>(b));
    else if constexpr (std::is_floating_point_v<CB>)
      return convertValue<CA>(std::pow(static_cast<double>(a), static_cast<double>(b)));
    else
      return intPow<CA>(a, static_cast<int64_t>(b));
  }
};

struct BitwiseAndOp {
  static constexpr BinaryKind kKind = BinaryKind::Bitwise;
  template <typename C> C operator()(C a, C b) const { return C(a & b); }
};
struct BitwiseOrOp {
  static constexpr BinaryKind kKind = BinaryKind::Bitwise;
  template <typename C> C operator()(C a, C b) const { return C(a | b); }
};
struct BitwiseXorOp {
  static constexpr BinaryKind kKind = BinaryKind::Bitwise;
  template <typename C> C operator()(C a, C b) const { return C(a ^ b); }
};
/// Unsigned operands only (checked by the kernel), as in ONNX.
struct BitShiftOp {
  static constexpr BinaryKind kKind = BinaryKind::Bitwise;
  bool left = true;
  static Expected<BitShiftOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(std::string direction, attrs.getString("direction"));
    if (direction != "LEFT" && direction != "RIGHT")
      return Status::error("bit_shift direction must be 'LEFT' or 'RIGHT', got '{}'", direction);
    return BitShiftOp{direction == "LEFT"};
  }
  template <typename C> C operator()(C a, C b) const {
    // Shifting by the bit width or more is undefined in C++; all bits leave.
    if (b >= C(8 * sizeof(C)))
      return C(0);
    return left ? C(a << b) : C(a >> b);
  }
};

struct AndOp {
  static constexpr BinaryKind kKind = BinaryKind::Logic;
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};
struct OrOp {
  static constexpr BinaryKind kKind = BinaryKind::Logic;
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) | (b != 0); }
};
struct XorOp {
  static constexpr BinaryKind kKind = BinaryKind::Logic;
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) != (b != 0); }
};

struct EqualOp {
  static constexpr BinaryKind kKind = BinaryKind::Compare;
  template <typename C> bool operator()(C a, C b) const { return a == b; }
};
struct LessOp {
  static constexpr BinaryKind kKind = BinaryKind::Compare;
  template <typename C> bool operator()(C a, C b) const { return a < b; }
};
struct GreaterOp {
  static constexpr BinaryKind kKind = BinaryKind::Compare;
  template <typename C> bool operator()(C a, C b) const { return a > b; }
};
struct LessEqualOp {
  static constexpr BinaryKind kKind = BinaryKind::Compare;
  template <typename C> bool operator()(C a, C b) const { return a <= b; }
};
struct GreaterEqualOp {
  static constexpr BinaryKind kKind = BinaryKind::Compare;
  template <typename C> bool operator()(C a, C b) const { return a >= b; }
};

/// y[i] = op(a[i], b[i]) over the broadcast loop; TA/TB/TO are storage types.
template <typename TA, typename TB, typename TO, typename Op>
void runBinary(KernelContext &ctx, const StridedLoop<2> &loop, const Op &op) {
  const TA *a = ctx.inputs[0].as<const TA>();
  const TB *b = ctx.inputs[1].as<const TB>();
  TO *y = ctx.outputs[0].as<TO>();
  auto f = [&op](TA x, TB z) { return store<TO>(op(load(x), load(z))); };
  loop.parallelRuns(ctx.pool, kGrain, [&](int64_t o, int64_t n, auto off, auto st) {
    const TA *pa = a + off[0];
    const TB *pb = b + off[1];
    TO *py = y + o;
    // Specialized inner loops for the common stride patterns (vectorizable).
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i)
        py[i] = f(pa[i], pb[i]);
    } else if (st[0] == 1 && st[1] == 0) {
      TB bv = *pb;
      for (int64_t i = 0; i < n; ++i)
        py[i] = f(pa[i], bv);
    } else if (st[0] == 0 && st[1] == 1) {
      TA av = *pa;
      for (int64_t i = 0; i < n; ++i)
        py[i] = f(av, pb[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        py[i] = f(pa[i * st[0]], pb[i * st[1]]);
    }
  });
}

template <typename T> bool anyZero(KernelContext &ctx, const TensorView &t) {
  std::atomic<bool> found{false};
  const T *p = t.as<const T>();
  ctx.pool.parallelFor(t.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (p[i] == T(0)) {
        found = true;
        return;
      }
  });
  return found;
}

template <typename Op> Status binaryKernel(KernelContext &ctx) {
  const TensorView &a = ctx.inputs[0], &b = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> shape, broadcastShape(a.shape, b.shape));
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sa, broadcastStrides(a.shape, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sb, broadcastStrides(b.shape, shape));
  StridedLoop<2> loop(shape, {sa, sb});
  Op op;
  if constexpr (requires { Op::make(ctx.attrs); }) {
    CPU_ASSIGN_OR_RETURN(op, Op::make(ctx.attrs));
  }

  if constexpr (Op::kKind == BinaryKind::Logic) {
    FORGE_RETURN_IF_ERROR(checkDType(a, bundle::BOOL, "lhs"));
    FORGE_RETURN_IF_ERROR(checkDType(b, bundle::BOOL, "rhs"));
    FORGE_RETURN_IF_ERROR(checkDType(y, bundle::BOOL, "result"));
    runBinary<uint8_t, uint8_t, uint8_t>(ctx, loop, op);
    return Status::ok();
  } else if constexpr (Op::kKind == BinaryKind::Pow) {
    FORGE_RETURN_IF_ERROR(checkDType(y, a.dtype, "result"));
    return visitNumeric(a.dtype, [&](auto ta) {
      using TA = typename decltype(ta)::type;
      return visitNumeric(
          b.dtype,
          [&](auto tb) {
            using TB = typename decltype(tb)::type;
            runBinary<TA, TB, TA>(ctx, loop, op);
            return Status::ok();
          },
          "exponent");
    });
  } else if constexpr (Op::kKind == BinaryKind::Bitwise) {
    FORGE_RETURN_IF_ERROR(checkDType(b, a.dtype, "rhs"));
    FORGE_RETURN_IF_ERROR(checkDType(y, a.dtype, "result"));
    return visitInt(a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<Op, BitShiftOp> && std::is_signed_v<T>) {
        return unsupportedDType(a.dtype, "bit_shift operand (unsigned integers only)");
      } else {
        runBinary<T, T, T>(ctx, loop, op);
        return Status::ok();
      }
    });
  } else {
    FORGE_RETURN_IF_ERROR(checkDType(b, a.dtype, "rhs"));
    constexpr bool kCompare = Op::kKind == BinaryKind::Compare;
    FORGE_RETURN_IF_ERROR(checkDType(y, kCompare ? bundle::BOOL : a.dtype, "result"));
    if (kCompare && a.dtype == bundle::BOOL) {
      runBinary<uint8_t, uint8_t, uint8_t>(ctx, loop, op);
      return Status::ok();
    }
    return visitNumeric(a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<Op, DivOp> && std::is_integral_v<T>)
        if (anyZero<T>(ctx, b))
          return Status::error("integer division by zero");
      if constexpr (std::is_same_v<Op, ModOp> && std::is_integral_v<T>)
        if (anyZero<T>(ctx, b))
          return Status::error("integer modulo by zero");
      if constexpr (kCompare)
        runBinary<T, T, uint8_t>(ctx, loop, op);
      else
        runBinary<T, T, T>(ctx, loop, op);
      return Status::ok();
    });
  }
}

//===----------------------------------------------------------------------===//
// Unary ops: kInt says whether integer dtypes are accepted; ops with
// attributes read them in make().
//===----------------------------------------------------------------------===//

struct NegOp {
  static constexpr bool kInt = true;
  template <typename C> C operator()(C x) const { return wrapNeg(x); }
};
struct AbsOp {
  static constexpr bool kInt = true;
  template <typename C> C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>)
      return std::abs(x);
    else if constexpr (std::is_signed_v<C>)
      return x < 0 ? wrapNeg(x) : x;
    else
      return x;
  }
};
struct ReluOp {
  static constexpr bool kInt = true;
  template <typename C> C operator()(C x) const { return x < C(0) ? C(0) : x; } // keeps nan
};
struct ExpOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::exp(x); }
};
struct LogOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::log(x); }
};
struct SqrtOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::sqrt(x); }
};
struct ReciprocalOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return C(1) / x; }
};
struct TanhOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::tanh(x); }
};
struct SigmoidOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const {
    // Never exponentiate a large positive number.
    if (x >= C(0))
      return C(1) / (C(1) + std::exp(-x));
    C e = std::exp(x);
    return e / (C(1) + e);
  }
};
struct ErfOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::erf(x); }
};
struct SinOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::sin(x); }
};
struct CosOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::cos(x); }
};
struct TanOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::tan(x); }
};
struct AsinOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::asin(x); }
};
struct AcosOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::acos(x); }
};
struct AtanOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::atan(x); }
};
struct SinhOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::sinh(x); }
};
struct CoshOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::cosh(x); }
};
struct AsinhOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::asinh(x); }
};
struct AcoshOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::acosh(x); }
};
struct AtanhOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::atanh(x); }
};
struct FloorOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::floor(x); }
};
struct CeilOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::ceil(x); }
};
struct RoundOp { // half to even: nearbyint in the default rounding mode
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const { return std::nearbyint(x); }
};
struct SoftplusOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const {
    return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
};
struct HardSwishOp {
  static constexpr bool kInt = false;
  template <typename C> C operator()(C x) const {
    C g = x / C(6) + C(0.5);
    return x * (g < C(0) ? C(0) : (g > C(1) ? C(1) : g));
  }
};
struct LeakyReluOp {
  static constexpr bool kInt = false;
  double alpha = 0.01;
  static Expected<LeakyReluOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double alpha, attrs.getFloat("alpha"));
    return LeakyReluOp{alpha};
  }
  template <typename C> C operator()(C x) const { return x < C(0) ? C(alpha) * x : x; }
};
struct EluOp {
  static constexpr bool kInt = false;
  double alpha = 1.0;
  static Expected<EluOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double alpha, attrs.getFloat("alpha"));
    return EluOp{alpha};
  }
  template <typename C> C operator()(C x) const { return x < C(0) ? C(alpha) * std::expm1(x) : x; }
};
struct SeluOp {
  static constexpr bool kInt = false;
  double alpha = 0, gamma = 0;
  static Expected<SeluOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double alpha, attrs.getFloat("alpha"));
    CPU_ASSIGN_OR_RETURN(double gamma, attrs.getFloat("gamma"));
    return SeluOp{alpha, gamma};
  }
  template <typename C> C operator()(C x) const {
    return C(gamma) * (x > C(0) ? x : C(alpha) * std::expm1(x));
  }
};
struct ThresholdedReluOp {
  static constexpr bool kInt = false;
  double alpha = 1.0;
  static Expected<ThresholdedReluOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double alpha, attrs.getFloat("alpha"));
    return ThresholdedReluOp{alpha};
  }
  // nan -> 0, as ONNX's reference (x > alpha is false).
  template <typename C> C operator()(C x) const { return x > C(alpha) ? x : C(0); }
};
struct GeluOp {
  static constexpr bool kInt = false;
  bool tanhApprox = false;
  static Expected<GeluOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(std::string approx, attrs.getString("approximate"));
    if (approx != "none" && approx != "tanh")
      return Status::error("gelu approximate must be 'none' or 'tanh', got '{}'", approx);
    return GeluOp{approx == "tanh"};
  }
  template <typename C> C operator()(C x) const {
    if (tanhApprox) {
      const C k = C(0.7978845608028654); // sqrt(2 / pi)
      return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
    }
    return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
  }
};
struct HardSigmoidOp {
  static constexpr bool kInt = false;
  double alpha = 0.2, beta = 0.5;
  static Expected<HardSigmoidOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double alpha, attrs.getFloat("alpha"));
    CPU_ASSIGN_OR_RETURN(double beta, attrs.getFloat("beta"));
    return HardSigmoidOp{alpha, beta};
  }
  template <typename C> C operator()(C x) const {
    C v = C(alpha) * x + C(beta);
    return v < C(0) ? C(0) : (v > C(1) ? C(1) : v);
  }
};
struct ClipOp {
  static constexpr bool kInt = true;
  double lo = 0, hi = 0;
  static Expected<ClipOp> make(const AttrReader &attrs) {
    CPU_ASSIGN_OR_RETURN(double lo, attrs.getFloat("min"));
    CPU_ASSIGN_OR_RETURN(double hi, attrs.getFloat("max"));
    return ClipOp{lo, hi};
  }
  template <typename C> C operator()(C x) const {
    // Compare in double so that +-inf bounds work for integer inputs too;
    // nan stays nan.
    double d = static_cast<double>(x);
    if (d < lo)
      return convertValue<C>(lo);
    if (d > hi)
      return convertValue<C>(hi);
    return x;
  }
};

template <typename Op> Status unaryKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  Op op;
  if constexpr (requires { Op::make(ctx.attrs); }) {
    CPU_ASSIGN_OR_RETURN(op, Op::make(ctx.attrs));
  }
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    T *out = y.as<T>();
    ctx.pool.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        out[i] = store<T>(op(load(in[i])));
    });
    return Status::ok();
  };
  if constexpr (Op::kInt)
    return visitNumeric(x.dtype, run);
  else
    return visitFloat(x.dtype, run);
}

Status notKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(x, bundle::BOOL, "input"));
  FORGE_RETURN_IF_ERROR(checkDType(y, bundle::BOOL, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  const uint8_t *in = x.as<const uint8_t>();
  uint8_t *out = y.as<uint8_t>();
  ctx.pool.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      out[i] = in[i] == 0;
  });
  return Status::ok();
}

Status bitwiseNotKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  return visitInt(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    T *out = y.as<T>();
    ctx.pool.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        out[i] = T(~in[i]);
    });
    return Status::ok();
  });
}

Status isinfKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(y, bundle::BOOL, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  CPU_ASSIGN_OR_RETURN(int64_t positive, ctx.attrs.getInt("detect_positive"));
  CPU_ASSIGN_OR_RETURN(int64_t negative, ctx.attrs.getInt("detect_negative"));
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    uint8_t *out = y.as<uint8_t>();
    ctx.pool.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto v = load(in[i]);
        out[i] = std::isinf(v) && (v > 0 ? positive != 0 : negative != 0);
      }
    });
    return Status::ok();
  });
}

Status isnanKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(y, bundle::BOOL, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *in = x.as<const T>();
    uint8_t *out = y.as<uint8_t>();
    ctx.pool.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        out[i] = std::isnan(load(in[i]));
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// cast
//===----------------------------------------------------------------------===//

/// Numeric dtypes plus bool (read as its 0/1 byte).
template <typename F> Status visitCastable(DType t, F &&f, std::string_view what) {
  if (t == bundle::BOOL)
    return f(Tag<uint8_t>{});
  return visitNumeric(t, f, what);
}

/// float8 E4M3FN (bias 7, no infinities, NaN = S.1111.111, max 448),
/// E5M2 (bias 15, IEEE-like infinities, max 57344) and the FNUZ variants
/// E4M3FNUZ / E5M2FNUZ (bias 8 / 16, max 240 / 57344, no infinities and no
/// negative zero: 0x80 is the only NaN), as ONNX defines them.
struct Float8Format {
  int mantissaBits, bias;
  double max;
  bool hasInf, fnuz;
};
constexpr Float8Format kE4M3{3, 7, 448.0, false, false};
constexpr Float8Format kE5M2{2, 15, 57344.0, true, false};
constexpr Float8Format kE4M3FNUZ{3, 8, 240.0, false, true};
constexpr Float8Format kE5M2FNUZ{2, 16, 57344.0, false, true};

bool isFloat8Type(DType t) {
  return t == bundle::F8E4M3 || t == bundle::F8E5M2 || t == bundle::F8E4M3FNUZ ||
         t == bundle::F8E5M2FNUZ;
}

const Float8Format &float8Format(DType t) {
  switch (t) {
  case bundle::F8E4M3: return kE4M3;
  case bundle::F8E5M2: return kE5M2;
  case bundle::F8E4M3FNUZ: return kE4M3FNUZ;
  default: return kE5M2FNUZ;
  }
}

double float8ToDouble(uint8_t v, const Float8Format &f) {
  if (f.fnuz && v == 0x80)
    return std::numeric_limits<double>::quiet_NaN();
  bool negative = v & 0x80;
  int expBits = 7 - f.mantissaBits;
  int exp = (v >> f.mantissaBits) & ((1 << expBits) - 1);
  int mant = v & ((1 << f.mantissaBits) - 1);
  int expMax = (1 << expBits) - 1;
  double r;
  if (f.hasInf && exp == expMax)
    r = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (!f.hasInf && !f.fnuz && exp == expMax && mant == (1 << f.mantissaBits) - 1)
    r = std::numeric_limits<double>::quiet_NaN();
  else if (exp == 0)
    r = std::ldexp(double(mant), 1 - f.bias - f.mantissaBits);
  else
    r = std::ldexp(1.0 + double(mant) / (1 << f.mantissaBits), exp - f.bias);
  return negative ? -r : r;
}

/// Round to nearest even onto the format's grid; overflow saturates to +-max
/// or becomes NaN (E4M3FN, FNUZ) / infinity (E5M2), per the ONNX `saturate`
/// flag. FNUZ formats map NaN (and unsaturated infinity) to 0x80 and every
/// zero to +0.
uint8_t doubleToFloat8(double x, const Float8Format &f, bool saturate) {
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  int expBits = 7 - f.mantissaBits;
  uint8_t nanBits = f.hasInf ? uint8_t(((1 << expBits) - 1) << f.mantissaBits | 1) : 0x7f;
  uint8_t infBits = uint8_t(((1 << expBits) - 1) << f.mantissaBits);
  uint8_t maxBits = f.fnuz ? 0x7f : f.hasInf ? uint8_t(infBits - 1) : 0x7e;
  if (std::isnan(x))
    return f.fnuz ? 0x80 : sign | nanBits;
  double a = std::fabs(x);
  int emin = 1 - f.bias; // smallest normal exponent
  double rounded = 0;
  if (!std::isinf(a) && a > 0) {
    int e;
    std::frexp(a, &e); // a = m * 2^e, m in [0.5, 1)
    int quantumExp = std::max(e - 1, emin) - f.mantissaBits;
    rounded = std::ldexp(std::nearbyint(std::ldexp(a, -quantumExp)), quantumExp);
  }
  if (std::isinf(a) || rounded > f.max) {
    if (saturate)
      return sign | maxBits;
    if (f.fnuz)
      return 0x80;
    return sign | (f.hasInf ? infBits : nanBits);
  }
  if (rounded == 0)
    return f.fnuz ? 0 : sign;
  int e;
  double m = std::frexp(rounded, &e); // rounded = m * 2^e
  int exponent = e - 1;
  if (exponent < emin) // subnormal
    return sign | uint8_t(std::ldexp(rounded, f.bias - 1 + f.mantissaBits));
  uint8_t mant = uint8_t(std::ldexp(2 * m - 1, f.mantissaBits));
  return sign | uint8_t((exponent + f.bias) << f.mantissaBits) | mant;
}

/// Casts with a float8 side go through double (exact for every float8 value).
Status castFloat8(KernelContext &ctx, const TensorView &x, TensorView &y, DType to) {
  bool saturate = !ctx.attrs.has("saturate") || *ctx.attrs.getInt("saturate") != 0;
  const int64_t n = x.numel();
  auto format = float8Format;
  bool fromF8 = isFloat8Type(x.dtype);
  bool toF8 = isFloat8Type(to);
  std::vector<double> values(n);
  if (fromF8) {
    const uint8_t *in = x.as<const uint8_t>();
    for (int64_t i = 0; i < n; ++i)
      values[i] = float8ToDouble(in[i], format(x.dtype));
  } else {
    FORGE_RETURN_IF_ERROR(visitCastable(
        x.dtype,
        [&](auto tag) {
          using From = typename decltype(tag)::type;
          const From *in = x.as<const From>();
          for (int64_t i = 0; i < n; ++i)
            values[i] = static_cast<double>(load(in[i]));
          return Status::ok();
        },
        "cast source"));
  }
  if (toF8) {
    uint8_t *out = y.as<uint8_t>();
    for (int64_t i = 0; i < n; ++i)
      out[i] = doubleToFloat8(values[i], format(to), saturate);
    return Status::ok();
  }
  if (to == bundle::BOOL) {
    uint8_t *out = y.as<uint8_t>();
    for (int64_t i = 0; i < n; ++i)
      out[i] = values[i] != 0;
    return Status::ok();
  }
  return visitNumeric(
      to,
      [&](auto tag) {
        using To = typename decltype(tag)::type;
        To *out = y.as<To>();
        for (int64_t i = 0; i < n; ++i)
          out[i] = convertValue<To>(values[i]);
        return Status::ok();
      },
      "cast target");
}

Status castKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(DType to, ctx.attrs.getDType("to"));
  FORGE_RETURN_IF_ERROR(checkDType(y, to, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  const int64_t n = x.numel();
  if (x.dtype == to) {
    if (n > 0 && x.data != y.data)
      std::memmove(y.data, x.data, x.bytes());
    return Status::ok();
  }
  if (isFloat8Type(x.dtype) || isFloat8Type(to))
    return castFloat8(ctx, x, y, to);
  return visitCastable(
      x.dtype,
      [&](auto fromTag) {
        using From = typename decltype(fromTag)::type;
        const From *in = x.as<const From>();
        if (to == bundle::BOOL) {
          uint8_t *out = y.as<uint8_t>();
          ctx.pool.parallelFor(n, kGrain, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i)
              out[i] = load(in[i]) != 0; // nan -> true, as in NumPy
          });
          return Status::ok();
        }
        return visitNumeric(
            to,
            [&](auto toTag) {
              using To = typename decltype(toTag)::type;
              To *out = y.as<To>();
              ctx.pool.parallelFor(n, kGrain, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i)
                  out[i] = convertValue<To>(in[i]);
              });
              return Status::ok();
            },
            "cast target");
      },
      "cast source");
}

//===----------------------------------------------------------------------===//
// where (dtype-agnostic: moves elements by size)
//===----------------------------------------------------------------------===//

Status whereKernel(KernelContext &ctx) {
  const TensorView &c = ctx.inputs[0], &a = ctx.inputs[1], &b = ctx.inputs[2];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(c, bundle::BOOL, "condition"));
  FORGE_RETURN_IF_ERROR(checkDType(b, a.dtype, "y operand"));
  FORGE_RETURN_IF_ERROR(checkDType(y, a.dtype, "result"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> shape, broadcastShape(c.shape, a.shape));
  CPU_ASSIGN_OR_RETURN(shape, broadcastShape(shape, b.shape));
  FORGE_RETURN_IF_ERROR(checkShape(y, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sc, broadcastStrides(c.shape, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sa, broadcastStrides(a.shape, shape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sb, broadcastStrides(b.shape, shape));
  StridedLoop<3> loop(shape, {sc, sa, sb});
  return visitBySize(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const uint8_t *pc = c.as<const uint8_t>();
    const T *pa = a.as<const T>(), *pb = b.as<const T>();
    T *py = y.as<T>();
    loop.parallelRuns(ctx.pool, kGrain, [&](int64_t o, int64_t n, auto off, auto st) {
      for (int64_t i = 0; i < n; ++i)
        py[o + i] = pc[off[0] + i * st[0]] ? pa[off[1] + i * st[1]] : pb[off[2] + i * st[2]];
    });
    return Status::ok();
  });
}

} // namespace

double decodeFloat8(uint8_t byte, DType type) { return float8ToDouble(byte, float8Format(type)); }

void registerElementwiseKernels(Registry &r) {
  r.add("add", &binaryKernel<AddOp>, 2, 2);
  r.add("sub", &binaryKernel<SubOp>, 2, 2);
  r.add("mul", &binaryKernel<MulOp>, 2, 2);
  r.add("div", &binaryKernel<DivOp>, 2, 2);
  r.add("pow", &binaryKernel<PowOp>, 2, 2);
  r.add("min", &binaryKernel<MinOp>, 2, 2);
  r.add("max", &binaryKernel<MaxOp>, 2, 2);
  r.add("and", &binaryKernel<AndOp>, 2, 2);
  r.add("or", &binaryKernel<OrOp>, 2, 2);
  r.add("xor", &binaryKernel<XorOp>, 2, 2);
  r.add("mod", &binaryKernel<ModOp>, 2, 2);
  r.add("bitwise_and", &binaryKernel<BitwiseAndOp>, 2, 2);
  r.add("bitwise_or", &binaryKernel<BitwiseOrOp>, 2, 2);
  r.add("bitwise_xor", &binaryKernel<BitwiseXorOp>, 2, 2);
  r.add("bit_shift", &binaryKernel<BitShiftOp>, 2, 2);
  r.add("equal", &binaryKernel<EqualOp>, 2, 2);
  r.add("less", &binaryKernel<LessOp>, 2, 2);
  r.add("greater", &binaryKernel<GreaterOp>, 2, 2);
  r.add("less_equal", &binaryKernel<LessEqualOp>, 2, 2);
  r.add("greater_equal", &binaryKernel<GreaterEqualOp>, 2, 2);

  r.add("neg", &unaryKernel<NegOp>, 1, 1);
  r.add("abs", &unaryKernel<AbsOp>, 1, 1);
  r.add("exp", &unaryKernel<ExpOp>, 1, 1);
  r.add("log", &unaryKernel<LogOp>, 1, 1);
  r.add("sqrt", &unaryKernel<SqrtOp>, 1, 1);
  r.add("reciprocal", &unaryKernel<ReciprocalOp>, 1, 1);
  r.add("tanh", &unaryKernel<TanhOp>, 1, 1);
  r.add("sigmoid", &unaryKernel<SigmoidOp>, 1, 1);
  r.add("relu", &unaryKernel<ReluOp>, 1, 1);
  r.add("erf", &unaryKernel<ErfOp>, 1, 1);
  r.add("sin", &unaryKernel<SinOp>, 1, 1);
  r.add("cos", &unaryKernel<CosOp>, 1, 1);
  r.add("tan", &unaryKernel<TanOp>, 1, 1);
  r.add("asin", &unaryKernel<AsinOp>, 1, 1);
  r.add("acos", &unaryKernel<AcosOp>, 1, 1);
  r.add("atan", &unaryKernel<AtanOp>, 1, 1);
  r.add("sinh", &unaryKernel<SinhOp>, 1, 1);
  r.add("cosh", &unaryKernel<CoshOp>, 1, 1);
  r.add("asinh", &unaryKernel<AsinhOp>, 1, 1);
  r.add("acosh", &unaryKernel<AcoshOp>, 1, 1);
  r.add("atanh", &unaryKernel<AtanhOp>, 1, 1);
  r.add("floor", &unaryKernel<FloorOp>, 1, 1);
  r.add("ceil", &unaryKernel<CeilOp>, 1, 1);
  r.add("round", &unaryKernel<RoundOp>, 1, 1);
  r.add("softplus", &unaryKernel<SoftplusOp>, 1, 1);
  r.add("hard_swish", &unaryKernel<HardSwishOp>, 1, 1);
  r.add("leaky_relu", &unaryKernel<LeakyReluOp>, 1, 1);
  r.add("elu", &unaryKernel<EluOp>, 1, 1);
  r.add("selu", &unaryKernel<SeluOp>, 1, 1);
  r.add("thresholded_relu", &unaryKernel<ThresholdedReluOp>, 1, 1);
  r.add("gelu", &unaryKernel<GeluOp>, 1, 1);
  r.add("hard_sigmoid", &unaryKernel<HardSigmoidOp>, 1, 1);
  r.add("clip", &unaryKernel<ClipOp>, 1, 1);
  r.add("not", &notKernel, 1, 1);
  r.add("bitwise_not", &bitwiseNotKernel, 1, 1);
  r.add("isnan", &isnanKernel, 1, 1);
  r.add("isinf", &isinfKernel, 1, 1);
  r.add("cast", &castKernel, 1, 1);
  r.add("where", &whereKernel, 3, 3);
}

} // namespace forge::rt::cpu
