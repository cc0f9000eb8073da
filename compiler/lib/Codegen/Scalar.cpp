//===- Scalar.cpp - scalar semantics of elementwise ops ---------------------===//
//
// One element of an elementwise op (runtime/lib/cpu/Elementwise.cpp is the
// reference); every generator that evaluates ops per element calls emitScalar.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

namespace mlir::forge::kernelgen {

//===----------------------------------------------------------------------===//
// Scalar semantics of the elementwise ops (runtime/lib/cpu/Elementwise.cpp is
// the reference). `args` are compute values; returns null when unsupported.
//===----------------------------------------------------------------------===//

double floatAttr(Operation *op, StringRef name, double fallback) {
  if (auto a = op->getAttrOfType<FloatAttr>(name))
    return a.getValueAsDouble();
  return fallback;
}

/// The integer constant `v` of `t` (signless), bit pattern of v mod 2^width.
Value intConst(Body &k, Type t, int64_t v) {
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(t, v));
}
Value intLimit(Body &k, Type t, bool isUnsigned, bool max) {
  unsigned w = t.getIntOrFloatBitWidth();
  APInt v = isUnsigned ? (max ? APInt::getMaxValue(w) : APInt::getMinValue(w))
                       : (max ? APInt::getSignedMaxValue(w) : APInt::getSignedMinValue(w));
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(t, v));
}

/// Float -> integer as the CPU's convertValue: NaN -> 0, saturating at the
/// integer type's limits, otherwise truncated toward zero.
Value floatToInt(Body &k, Value x, Type to, bool isUnsigned) {
  OpBuilder &b = k.b;
  Type ft = x.getType();
  unsigned w = to.getIntOrFloatBitWidth();
  double lo = isUnsigned ? 0.0 : -std::ldexp(1.0, w - 1);
  double hi = isUnsigned ? std::ldexp(1.0, w) - 1 : std::ldexp(1.0, w - 1) - 1;
  Value converted = isUnsigned ? Value(b.create<arith::FPToUIOp>(k.loc, to, x))
                               : Value(b.create<arith::FPToSIOp>(k.loc, to, x));
  Value low = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OLE, x, k.fconst(ft, lo));
  Value high = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OGE, x, k.fconst(ft, hi));
  Value nan = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::UNO, x, x);
  Value r = b.create<arith::SelectOp>(k.loc, low, intLimit(k, to, isUnsigned, false), converted);
  r = b.create<arith::SelectOp>(k.loc, high, intLimit(k, to, isUnsigned, true), r);
  return b.create<arith::SelectOp>(k.loc, nan, intConst(k, to, 0), r);
}

/// base^exp for integers as the CPU's intPow: wrapping square-and-multiply;
/// a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
Value intPow(Body &k, Value base, Value exp, bool isUnsigned) {
  OpBuilder &b = k.b;
  Type t = base.getType();
  unsigned w = t.getIntOrFloatBitWidth();
  Value zero = intConst(k, t, 0), one = intConst(k, t, 1);
  auto loop = b.create<scf::ForOp>(
      k.loc, k.idx(0), k.idx(w), k.idx(1), ValueRange{one, base, exp},
      [&](OpBuilder &nb, Location l, Value, ValueRange acc) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        Value odd = b.create<arith::CmpIOp>(l, arith::CmpIPredicate::ne,
                                            b.create<arith::AndIOp>(l, acc[2], one), zero);
        Value r = b.create<arith::SelectOp>(l, odd, b.create<arith::MulIOp>(l, acc[0], acc[1]),
                                            acc[0]);
        b.create<scf::YieldOp>(l, ValueRange{r, b.create<arith::MulIOp>(l, acc[1], acc[1]),
                                             b.create<arith::ShRUIOp>(l, acc[2], one)});
      });
  if (isUnsigned)
    return loop.getResult(0);
  auto eq = [&](Value a, Value c) {
    return b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, a, c);
  };
  Value minusOne = intConst(k, t, -1);
  Value oddExp = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne,
                                         b.create<arith::AndIOp>(k.loc, exp, one), zero);
  Value negative = b.create<arith::SelectOp>(
      k.loc, eq(base, one), one,
      b.create<arith::SelectOp>(k.loc, eq(base, minusOne),
                                b.create<arith::SelectOp>(k.loc, oddExp, minusOne, one), zero));
  Value isNeg = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, exp, zero);
  return b.create<arith::SelectOp>(k.loc, isNeg, negative, loop.getResult(0));
}

/// A float value (f32, or f64) as a float8 byte, as the CPU's doubleToFloat8:
/// round to nearest even onto the format's grid; beyond the largest finite
/// value, saturate to +-max or give NaN (E4M3FN) / infinity (E5M2).
Value encodeFloat8(Body &k, Value x, const Float8Spec &f, bool saturate) {
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type ft = x.getType();
  // sm_89+ converts f32 to E4M3FN in one instruction (cvt.rn.satfinite:
  // round to nearest even, +-max beyond it and for +-inf) where the grid walk
  // below takes ~40: float8 scaling's casts were compute-bound at 1.5 TB/s.
  // Only the saturating E4M3FN cast is the same function (satfinite would
  // turn E5M2's infinities into +-max); NaN keeps its sign as below.
  if (ft.isF32() && saturate && !f.e5m2 && !f.fnuz && k.float8Cvt) {
    Type i32 = b.getI32Type(), i8 = b.getI8Type();
    Value both = b.create<LLVM::InlineAsmOp>(
                      loc, i32, ValueRange{x},
                      "{\n.reg .b16 t;\ncvt.rn.satfinite.e4m3x2.f32 t, $1, $1;\n"
                      "cvt.u32.u16 $0, t;\n}",
                      "=r,f", /*has_side_effects=*/false, /*is_align_stack=*/false,
                      LLVM::AsmDialectAttr(), ArrayAttr())
                     .getResult(0);
    Value byte = b.create<arith::TruncIOp>(loc, i8, both);
    Value sign = b.create<arith::AndIOp>(loc, byte, b.create<arith::ConstantIntOp>(loc, 0x80, 8));
    Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, x, x);
    return b.create<arith::SelectOp>(
        loc, nan, b.create<arith::OrIOp>(loc, sign, b.create<arith::ConstantIntOp>(loc, 0x7f, 8)),
        byte);
  }
  bool f64 = ft.isF64();
  unsigned width = f64 ? 64 : 32, fracBits = f64 ? 52 : 23;
  int64_t floatBias = f64 ? 1023 : 127;
  Type it = b.getIntegerType(width), i32 = b.getI32Type(), i8 = b.getI8Type();
  const bool e5m2 = f.e5m2;
  const int mbits = f.mbits, bias = f.bias, emin = 1 - bias;
  const double maxFinite = f.maxFinite;
  const int64_t nanBits = e5m2 ? 0x7d : 0x7f, infBits = e5m2 ? 0x7c : 0x7f,
                maxBits = f.fnuz ? 0x7f : e5m2 ? 0x7b : 0x7e;
  auto c32 = [&](int64_t v) { return b.create<arith::ConstantIntOp>(loc, v, 32); };
  auto c8 = [&](int64_t v) { return b.create<arith::ConstantIntOp>(loc, v, 8); };
  auto sel = [&](Value cond, Value a, Value d) { return b.create<arith::SelectOp>(loc, cond, a, d); };
  Value bits = b.create<arith::BitcastOp>(loc, it, x);
  Value sign = b.create<arith::SelectOp>(
      loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, bits, intConst(k, it, 0)), c8(0x80),
      c8(0));
  Value a = b.create<math::AbsFOp>(loc, x);
  // The grid step at a: 2^q, q = max(floor(log2 a), emin) - mbits (exponent
  // field; f32/f64 subnormals are far below every float8 and get emin).
  Value field = b.create<arith::ShRUIOp>(loc, bits, intConst(k, it, fracBits));
  if (f64)
    field = b.create<arith::TruncIOp>(loc, i32, field);
  field = b.create<arith::AndIOp>(loc, field, c32(f64 ? 0x7ff : 0xff));
  Value q = b.create<arith::SubIOp>(
      loc, b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, field, c32(floatBias)), c32(emin)),
      c32(mbits));
  auto pow2 = [&](Value e) { // 2^e for |e| within the float type's normal range
    Value biased = b.create<arith::AddIOp>(loc, e, c32(floatBias));
    if (f64)
      biased = b.create<arith::ExtSIOp>(loc, it, biased);
    return b.create<arith::BitcastOp>(loc, ft, b.create<arith::ShLIOp>(loc, biased, intConst(k, it, fracBits)));
  };
  // (math.roundeven has no NVVM lowering in MLIR 19; the LLVM intrinsic is cvt.rni.)
  Value r = b.create<LLVM::RoundEvenOp>(
      loc, ft, b.create<arith::MulFOp>(loc, a, pow2(b.create<arith::SubIOp>(loc, c32(0), q))));
  Value rounded = b.create<arith::MulFOp>(loc, r, pow2(q));
  Value isInf = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, a, k.fconst(ft, INFINITY));
  Value over = b.create<arith::OrIOp>(
      loc, isInf, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, rounded, k.fconst(ft, maxFinite)));
  // r in [0, 2^(mbits+1)]: below 2^mbits only at emin (subnormal, exponent field
  // 0); 2^(mbits+1) carries into the next exponent.
  Value ri = b.create<arith::FPToUIOp>(loc, i32, b.create<arith::MinimumFOp>(loc, r, k.fconst(ft, 64.0)));
  Value carry = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, ri, c32(2 << mbits));
  ri = sel(carry, b.create<arith::ShRUIOp>(loc, ri, c32(1)), ri);
  q = sel(carry, b.create<arith::AddIOp>(loc, q, c32(1)), q);
  Value normal = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, ri, c32(1 << mbits));
  Value exponent = sel(normal, b.create<arith::AddIOp>(loc, q, c32(mbits + bias)), c32(0));
  Value mant = sel(normal, b.create<arith::SubIOp>(loc, ri, c32(1 << mbits)), ri);
  Value magnitude = b.create<arith::TruncIOp>(
      loc, i8, b.create<arith::OrIOp>(loc, b.create<arith::ShLIOp>(loc, exponent, c32(mbits)), mant));
  Value result = b.create<arith::OrIOp>(loc, sign, magnitude);
  Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, x, x);
  if (f.fnuz) { // every zero is +0; NaN and unsaturated overflow are 0x80
    result = sel(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, magnitude, c8(0)), c8(0), result);
    Value overflow = saturate ? Value(b.create<arith::OrIOp>(loc, sign, c8(maxBits))) : Value(c8(0x80));
    result = sel(over, overflow, result);
    return sel(nan, c8(0x80), result);
  }
  Value overflow = c8(saturate ? maxBits : (e5m2 ? infBits : nanBits));
  result = sel(over, b.create<arith::OrIOp>(loc, sign, overflow), result);
  return sel(nan, b.create<arith::OrIOp>(loc, sign, c8(nanBits)), result);
}

/// asin, acos, sinh, cosh, asinh, acosh, atanh of a float scalar (null for
/// other names). convert-gpu-to-nvvm in MLIR 19 has no libdevice lowering for
/// them, so they are built from ops it has (atan2, sqrt, exp, expm1, log,
/// log1p), in forms without cancellation or early overflow: a few ulp.
Value emitInverseOrHyperbolic(Body &k, Operation *op, Value x) {
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type t = x.getType();
  auto cf = [&](double v) { return k.fconst(t, v); };
  auto add = [&](Value p, Value q) { return b.create<arith::AddFOp>(loc, p, q); };
  auto sub = [&](Value p, Value q) { return b.create<arith::SubFOp>(loc, p, q); };
  auto mul = [&](Value p, Value q) { return b.create<arith::MulFOp>(loc, p, q); };
  auto div = [&](Value p, Value q) { return b.create<arith::DivFOp>(loc, p, q); };
  auto sqrt = [&](Value v) { return b.create<math::SqrtOp>(loc, v); };
  auto less = [&](Value p, Value q) {
    return b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, p, q);
  };
  auto select = [&](Value c, Value p, Value q) { return b.create<arith::SelectOp>(loc, c, p, q); };
  // f(x) = sign(x) f(|x|) for the odd functions (nan stays nan).
  auto odd = [&](Value r) { return select(less(x, cf(0)), b.create<arith::NegFOp>(loc, r), r); };
  // Beyond 2^28, sqrt(x^2 + 1) = |x| to double precision: log(2|x|) without
  // squaring (which overflows f32 near 1.8e19).
  auto logTwice = [&](Value v) { return add(b.create<math::LogOp>(loc, v), cf(M_LN2)); };
  Value huge = cf(268435456.0);
  // (1 - x)(1 + x): exact factors near |x| = 1, where 1 - x*x cancels; nan
  // from sqrt outside [-1, 1].
  auto cosOfAsin = [&] { return sqrt(mul(sub(cf(1), x), add(cf(1), x))); };

  if (isa<AsinOp>(op))
    return b.create<math::Atan2Op>(loc, x, cosOfAsin());
  if (isa<AcosOp>(op))
    return b.create<math::Atan2Op>(loc, cosOfAsin(), x);
  if (!isa<SinhOp, CoshOp, AsinhOp, AcoshOp, AtanhOp>(op))
    return {};
  Value a = b.create<math::AbsFOp>(loc, x);
  if (isa<SinhOp>(op) || isa<CoshOp>(op)) {
    // h = e^(|x|/2): e^|x| / 2 = (h / 2) h overflows only where the result does.
    Value h = b.create<math::ExpOp>(loc, mul(a, cf(0.5)));
    Value big = mul(mul(h, cf(0.5)), h);
    Value small = div(cf(0.5), mul(h, h)); // e^-|x| / 2
    if (isa<CoshOp>(op))
      return add(big, small);
    // Below 20 (e^-40 is below double's epsilon): with u = e^|x| - 1,
    // sinh = (u + u / (u + 1)) / 2, no cancellation near 0.
    Value u = b.create<math::ExpM1Op>(loc, a);
    Value viaExpm1 = mul(add(u, div(u, add(u, cf(1)))), cf(0.5));
    return odd(select(less(a, cf(20)), viaExpm1, sub(big, small)));
  }
  if (isa<AsinhOp>(op)) {
    // log1p(a + a^2 / (1 + sqrt(1 + a^2))) = log(a + sqrt(a^2 + 1)).
    Value a2 = mul(a, a);
    Value v = b.create<math::Log1pOp>(loc, add(a, div(a2, add(cf(1), sqrt(add(cf(1), a2))))));
    return odd(select(less(a, huge), v, logTwice(a)));
  }
  if (isa<AcoshOp>(op)) {
    // t = x - 1 (exact near 1): log1p(t + sqrt(t) sqrt(t + 2)); sqrt(t) makes
    // x < 1 nan (t (t + 2) would be positive, even inf, below -1).
    Value t1 = sub(x, cf(1));
    Value v = b.create<math::Log1pOp>(loc, add(t1, mul(sqrt(t1), sqrt(add(t1, cf(2))))));
    return select(less(x, huge), v, logTwice(x));
  }
  if (isa<AtanhOp>(op)) {
    // log1p(2a / (1 - a)) / 2: inf at 1, nan beyond.
    Value v = b.create<math::Log1pOp>(loc, div(add(a, a), sub(cf(1), a)));
    return odd(mul(v, cf(0.5)));
  }
  return {};
}

/// The divisor of an integer div or mod made safe: a zero divisor is a fault
/// (Body::fault; the op then gives 0) and becomes 1; for signed types a -1
/// divisor also becomes 1 (MIN / -1 and MIN % -1 trap), `minusOne` says where.
struct SafeDivisor {
  Value zero, isZero, divisor, minusOne;
};
SafeDivisor safeDivisor(Body &k, Value c, Type ct, bool isUnsigned) {
  OpBuilder &b = k.b;
  SafeDivisor d;
  d.zero = intConst(k, ct, 0);
  d.isZero = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, c, d.zero);
  k.fault(d.isZero);
  d.divisor = b.create<arith::SelectOp>(k.loc, d.isZero, intConst(k, ct, 1), c);
  if (!isUnsigned) {
    d.minusOne = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, c, intConst(k, ct, -1));
    d.divisor = b.create<arith::SelectOp>(k.loc, d.minusOne, intConst(k, ct, 1), d.divisor);
  }
  return d;
}

/// gelu_grad's dy * gelu'(x) in x's float type; the tanh form: with
/// u = k (x + c x^3), t = tanh(u), gelu' = (1 + t)/2 + x (1 - t^2) k (1 + 3 c x^2) / 2;
/// the exact form: Phi(x) + x phi(x).
Value emitGeluGrad(Body &k, Operation *op, Value dy, Value x) {
  OpBuilder &b = k.b;
  Location loc = k.loc;
  auto cf = [&](double v) { return k.fconst(x.getType(), v); };
  auto mul = [&](Value p, Value q) { return b.create<arith::MulFOp>(loc, p, q); };
  auto add = [&](Value p, Value q) { return b.create<arith::AddFOp>(loc, p, q); };
  Value x2 = mul(x, x), d;
  if (op->getAttrOfType<StringAttr>("approximate").getValue() == "tanh") {
    const double kk = 0.7978845608028654, c = 0.044715;
    Value t = b.create<math::TanhOp>(loc, mul(cf(kk), mul(x, add(cf(1), mul(cf(c), x2)))));
    Value du = mul(cf(kk), add(cf(1), mul(cf(3 * c), x2)));
    Value sech2 = b.create<arith::SubFOp>(loc, cf(1), mul(t, t));
    d = add(mul(cf(0.5), add(cf(1), t)), mul(mul(cf(0.5), x), mul(sech2, du)));
  } else {
    Value cdf = mul(cf(0.5), add(cf(1), b.create<math::ErfOp>(loc, mul(x, cf(0.7071067811865476)))));
    Value pdf = mul(b.create<math::ExpOp>(loc, mul(x2, cf(-0.5))), cf(0.3989422804014327));
    d = add(cdf, mul(x, pdf));
  }
  return mul(dy, d);
}

/// One element of an elementwise op. `argElems` are the operands' tensor
/// element types (the first one's signedness picks the integer ops).
Value emitScalar(Body &k, Operation *op, ArrayRef<Value> args, ArrayRef<Type> argElems,
                 Type resultElem) {
  Type argElem = argElems.empty() ? resultElem : argElems[0];
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type ct = args.empty() ? Type() : args[0].getType();
  bool fl = ct && isFloat(ct);
  bool isUnsigned = isUnsignedInt(argElem);
  auto cf = [&](double v) { return k.fconst(ct, v); };
  auto select = [&](Value c, Value a, Value d) { return b.create<arith::SelectOp>(loc, c, a, d); };
  auto cmpf = [&](arith::CmpFPredicate p, Value a, Value c) {
    return b.create<arith::CmpFOp>(loc, p, a, c);
  };
  auto clamp01 = [&](Value v) {
    Value lo = select(cmpf(arith::CmpFPredicate::OLT, v, cf(0)), cf(0), v);
    return select(cmpf(arith::CmpFPredicate::OGT, lo, cf(1)), cf(1), lo);
  };

  if (isa<TransposeOp>(op) || isa<BroadcastOp>(op) || isa<SliceOp>(op)) // the map does the work
    return args[0];
  if (isa<CastOp>(op) && isFloat8(resultElem)) {
    // Through f32 from floats up to f32 (exact), else through f64, as the CPU
    // goes through double.
    Value x = args[0];
    if (!isFloat(ct)) {
      Type f64 = b.getF64Type();
      x = ct.isInteger(1) || isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, f64, x))
                                        : Value(b.create<arith::SIToFPOp>(loc, f64, x));
    }
    auto saturate = op->getAttrOfType<IntegerAttr>("saturate");
    return encodeFloat8(k, x, float8Spec(resultElem), !saturate || saturate.getInt() != 0);
  }
  if (isa<CastOp>(op)) {
    Type to = computeType(resultElem);
    Value x = args[0];
    bool toUnsigned = isUnsignedInt(resultElem);
    if (ct == to)
      return x;
    if (isFloat(ct) && isFloat(to))
      return to.getIntOrFloatBitWidth() > ct.getIntOrFloatBitWidth()
                 ? Value(b.create<arith::ExtFOp>(loc, to, x))
                 : Value(b.create<arith::TruncFOp>(loc, to, x));
    if (isFloat(ct) && to.isInteger(1)) // unordered: NaN is true, as on the CPU
      return cmpf(arith::CmpFPredicate::UNE, x, cf(0));
    if (isFloat(ct))
      return floatToInt(k, x, to, toUnsigned);
    if (isFloat(to))
      return ct.isInteger(1) || isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, to, x))
                                           : Value(b.create<arith::SIToFPOp>(loc, to, x));
    if (to.isInteger(1))
      return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, x, intConst(k, ct, 0));
    if (to.getIntOrFloatBitWidth() < ct.getIntOrFloatBitWidth())
      return b.create<arith::TruncIOp>(loc, to, x);
    return ct.isInteger(1) || isUnsigned ? Value(b.create<arith::ExtUIOp>(loc, to, x))
                                         : Value(b.create<arith::ExtSIOp>(loc, to, x));
  }
  if (isa<WhereOp>(op))
    return select(args[0], args[1], args[2]);
  if (isa<GeluGradOp>(op) && fl && args.size() == 2)
    return emitGeluGrad(k, op, args[0], args[1]);

  if (args.size() == 2) {
    Value a = args[0], c = args[1];
    // Equal register types; integers also of equal signedness (a uint8 base and
    // an int8 exponent of pow would both be i8 here: left to the host).
    if (a.getType() != c.getType() ||
        (argElems.size() == 2 && isUnsignedInt(argElems[0]) != isUnsignedInt(argElems[1])))
      return {};
    bool isBool = ct.isInteger(1);
    if (isa<AndOp>(op) && isBool)
      return b.create<arith::AndIOp>(loc, a, c);
    if (isa<OrOp>(op) && isBool)
      return b.create<arith::OrIOp>(loc, a, c);
    if (isa<XorOp>(op) && isBool)
      return b.create<arith::XOrIOp>(loc, a, c);
    auto fmodAttr = op->getAttrOfType<BoolAttr>("fmod");
    bool fmod = fmodAttr && fmodAttr.getValue();
    if (fl) {
      if (isa<AddOp>(op)) return b.create<arith::AddFOp>(loc, a, c);
      if (isa<SubOp>(op)) return b.create<arith::SubFOp>(loc, a, c);
      if (isa<MulOp>(op)) return b.create<arith::MulFOp>(loc, a, c);
      if (isa<DivOp>(op)) return b.create<arith::DivFOp>(loc, a, c);
      if (isa<PowOp>(op)) return b.create<math::PowFOp>(loc, a, c);
      if (isa<ModOp>(op)) {
        // remf is C fmod (__nv_fmodf); the floored form moves a nonzero
        // remainder to the divisor's side, as the CPU does.
        Value r = b.create<arith::RemFOp>(loc, a, c);
        if (fmod)
          return r;
        Value fix = b.create<arith::AndIOp>(
            loc, cmpf(arith::CmpFPredicate::ONE, r, cf(0)),
            b.create<arith::XOrIOp>(loc, cmpf(arith::CmpFPredicate::OLT, r, cf(0)),
                                    cmpf(arith::CmpFPredicate::OLT, c, cf(0))));
        return select(fix, b.create<arith::AddFOp>(loc, r, c), r);
      }
      if (isa<MinOp>(op)) return b.create<arith::MinimumFOp>(loc, a, c);
      if (isa<MaxOp>(op)) return b.create<arith::MaximumFOp>(loc, a, c);
      if (isa<EqualOp>(op)) return cmpf(arith::CmpFPredicate::OEQ, a, c);
      if (isa<LessOp>(op)) return cmpf(arith::CmpFPredicate::OLT, a, c);
      if (isa<GreaterOp>(op)) return cmpf(arith::CmpFPredicate::OGT, a, c);
      if (isa<LessEqualOp>(op)) return cmpf(arith::CmpFPredicate::OLE, a, c);
      if (isa<GreaterEqualOp>(op)) return cmpf(arith::CmpFPredicate::OGE, a, c);
      return {};
    }
    using P = arith::CmpIPredicate;
    auto icmp = [&](P p, Value l, Value r) { return b.create<arith::CmpIOp>(loc, p, l, r); };
    auto cmpi = [&](P p) { return icmp(p, a, c); };
    if (isa<EqualOp>(op)) return cmpi(P::eq);
    if (isBool)
      return {};
    if (isa<AddOp>(op)) return b.create<arith::AddIOp>(loc, a, c);
    if (isa<SubOp>(op)) return b.create<arith::SubIOp>(loc, a, c);
    if (isa<MulOp>(op)) return b.create<arith::MulIOp>(loc, a, c);
    if (isa<PowOp>(op)) return intPow(k, a, c, isUnsigned);
    if (isa<DivOp>(op)) {
      // A zero divisor gives 0; signed x / -1 is -x.
      SafeDivisor d = safeDivisor(k, c, ct, isUnsigned);
      if (isUnsigned)
        return select(d.isZero, d.zero, b.create<arith::DivUIOp>(loc, a, d.divisor));
      Value q = b.create<arith::DivSIOp>(loc, a, d.divisor);
      q = select(d.minusOne, b.create<arith::SubIOp>(loc, d.zero, a), q);
      return select(d.isZero, d.zero, q);
    }
    if (isa<ModOp>(op)) {
      // As div: x % -1 is 0 (the divisor 1 gives it).
      SafeDivisor d = safeDivisor(k, c, ct, isUnsigned);
      if (isUnsigned)
        return b.create<arith::RemUIOp>(loc, a, d.divisor);
      Value zero = d.zero;
      Value r = b.create<arith::RemSIOp>(loc, a, d.divisor);
      if (fmod)
        return r;
      // Floored: a nonzero remainder whose sign differs from the divisor's
      // gets the divisor added (|r| < |c|: no overflow).
      Value fix = b.create<arith::AndIOp>(
          loc, icmp(P::ne, r, zero),
          b.create<arith::XOrIOp>(loc, icmp(P::slt, r, zero), icmp(P::slt, c, zero)));
      return select(fix, b.create<arith::AddIOp>(loc, r, c), r);
    }
    if (isa<BitwiseAndOp>(op)) return b.create<arith::AndIOp>(loc, a, c);
    if (isa<BitwiseOrOp>(op)) return b.create<arith::OrIOp>(loc, a, c);
    if (isa<BitwiseXorOp>(op)) return b.create<arith::XOrIOp>(loc, a, c);
    if (isa<BitShiftOp>(op)) {
      auto direction = op->getAttrOfType<StringAttr>("direction");
      if (!isUnsigned || !direction)
        return {};
      // Shifts by the bit width or more give 0 (LLVM makes them poison).
      Value over = icmp(P::uge, c, intConst(k, ct, ct.getIntOrFloatBitWidth()));
      Value amount = select(over, intConst(k, ct, 0), c);
      Value r = direction.getValue() == "LEFT" ? Value(b.create<arith::ShLIOp>(loc, a, amount))
                                               : Value(b.create<arith::ShRUIOp>(loc, a, amount));
      return select(over, intConst(k, ct, 0), r);
    }
    if (isa<MinOp>(op)) return isUnsigned ? Value(b.create<arith::MinUIOp>(loc, a, c)) : Value(b.create<arith::MinSIOp>(loc, a, c));
    if (isa<MaxOp>(op)) return isUnsigned ? Value(b.create<arith::MaxUIOp>(loc, a, c)) : Value(b.create<arith::MaxSIOp>(loc, a, c));
    if (isa<LessOp>(op)) return cmpi(isUnsigned ? P::ult : P::slt);
    if (isa<GreaterOp>(op)) return cmpi(isUnsigned ? P::ugt : P::sgt);
    if (isa<LessEqualOp>(op)) return cmpi(isUnsigned ? P::ule : P::sle);
    if (isa<GreaterEqualOp>(op)) return cmpi(isUnsigned ? P::uge : P::sge);
    return {};
  }

  if (args.size() != 1)
    return {};
  Value x = args[0];
  if (isa<NotOp>(op) && ct.isInteger(1))
    return b.create<arith::XOrIOp>(loc, x, b.create<arith::ConstantIntOp>(loc, 1, 1));
  if (!fl) {
    if (ct.isInteger(1))
      return {};
    Value zero = intConst(k, ct, 0);
    if (isa<NegOp>(op)) return b.create<arith::SubIOp>(loc, zero, x);
    if (isa<AbsOp>(op)) return isUnsigned ? x : Value(b.create<math::AbsIOp>(loc, x));
    if (isa<BitwiseNotOp>(op)) return b.create<arith::XOrIOp>(loc, x, intConst(k, ct, -1));
    if (isa<ReluOp>(op)) return isUnsigned ? x : Value(b.create<arith::MaxSIOp>(loc, x, zero));
    if (isa<ClipOp>(op)) {
      // As the CPU: compared in double (so +-inf bounds work), a crossed bound
      // converted with saturation.
      Type f64 = b.getF64Type();
      Value d = isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, f64, x))
                           : Value(b.create<arith::SIToFPOp>(loc, f64, x));
      double lo = floatAttr(op, "min", -INFINITY), hi = floatAttr(op, "max", INFINITY);
      auto bound = [&](double v) { return floatToInt(k, k.fconst(f64, v), ct, isUnsigned); };
      Value r = select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, d, k.fconst(f64, lo)),
                       bound(lo), x);
      return select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, d, k.fconst(f64, hi)),
                    bound(hi), r);
    }
    return {};
  }
  if (isa<NegOp>(op)) return b.create<arith::NegFOp>(loc, x);
  if (isa<FloorOp>(op)) return b.create<math::FloorOp>(loc, x);
  if (isa<CeilOp>(op)) return b.create<math::CeilOp>(loc, x);
  if (isa<RoundOp>(op)) {
    // Half to even without libdevice (MLIR 19 lowers no roundeven): adding and
    // subtracting 2^mantissa-bits rounds in the default mode, nearest even;
    // larger magnitudes (and inf, NaN) are already integral.
    // (math.copysign has no lowering in this pipeline: the sign bit by hand.)
    int bits = ct.isF64() ? 52 : 23;
    unsigned width = ct.getIntOrFloatBitWidth();
    Type it = b.getIntegerType(width);
    Value big = cf(std::ldexp(1.0, bits));
    Value xi = b.create<arith::BitcastOp>(loc, it, x);
    Value negative = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, xi, intConst(k, it, 0));
    Value magic = select(negative, cf(-std::ldexp(1.0, bits)), big);
    Value r = b.create<arith::SubFOp>(loc, b.create<arith::AddFOp>(loc, x, magic), magic);
    // -0.4 rounds to -0.0 (the sign of x), as nearbyint does.
    APInt signBit = APInt::getSignMask(width);
    Value ri = b.create<arith::AndIOp>(loc, b.create<arith::BitcastOp>(loc, it, r),
                                       b.create<arith::ConstantOp>(loc, b.getIntegerAttr(it, ~signBit)));
    Value si = b.create<arith::AndIOp>(loc, xi, b.create<arith::ConstantOp>(loc, b.getIntegerAttr(it, signBit)));
    r = b.create<arith::BitcastOp>(loc, ct, b.create<arith::OrIOp>(loc, ri, si));
    return select(cmpf(arith::CmpFPredicate::OLT, b.create<math::AbsFOp>(loc, x), big), r, x);
  }
  if (isa<AbsOp>(op)) return b.create<math::AbsFOp>(loc, x);
  if (isa<ExpOp>(op)) return b.create<math::ExpOp>(loc, x);
  if (isa<LogOp>(op)) return b.create<math::LogOp>(loc, x);
  if (isa<SqrtOp>(op)) return b.create<math::SqrtOp>(loc, x);
  if (isa<ReciprocalOp>(op)) return b.create<arith::DivFOp>(loc, cf(1), x);
  if (isa<TanhOp>(op)) return b.create<math::TanhOp>(loc, x);
  if (isa<ErfOp>(op)) return b.create<math::ErfOp>(loc, x);
  if (isa<IsNaNOp>(op)) return cmpf(arith::CmpFPredicate::UNO, x, x);
  if (isa<IsInfOp>(op)) {
    auto detect = [&](StringRef attr) {
      auto flag = op->getAttrOfType<BoolAttr>(attr);
      return !flag || flag.getValue();
    };
    Value r = b.create<arith::ConstantIntOp>(loc, 0, 1);
    if (detect("detect_positive"))
      r = b.create<arith::OrIOp>(loc, r, cmpf(arith::CmpFPredicate::OEQ, x, cf(INFINITY)));
    if (detect("detect_negative"))
      r = b.create<arith::OrIOp>(loc, r, cmpf(arith::CmpFPredicate::OEQ, x, cf(-INFINITY)));
    return r;
  }
  if (isa<SinOp>(op)) return b.create<math::SinOp>(loc, x);
  if (isa<CosOp>(op)) return b.create<math::CosOp>(loc, x);
  if (isa<TanOp>(op)) return b.create<math::TanOp>(loc, x);
  if (isa<AtanOp>(op)) return b.create<math::AtanOp>(loc, x);
  if (Value r = emitInverseOrHyperbolic(k, op, x))
    return r;
  if (isa<ReluOp>(op)) // x < 0 ? 0 : x keeps NaN
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)), cf(0), x);
  if (isa<SigmoidOp>(op)) {
    // Never exponentiate a large positive number.
    Value e = b.create<math::ExpOp>(loc, b.create<arith::NegFOp>(loc, b.create<math::AbsFOp>(loc, x)));
    Value onePlus = b.create<arith::AddFOp>(loc, cf(1), e);
    Value pos = b.create<arith::DivFOp>(loc, cf(1), onePlus);
    Value neg = b.create<arith::DivFOp>(loc, e, onePlus);
    return select(cmpf(arith::CmpFPredicate::OGE, x, cf(0)), pos, neg);
  }
  if (isa<SoftplusOp>(op)) {
    Value e = b.create<math::ExpOp>(loc, b.create<arith::NegFOp>(loc, b.create<math::AbsFOp>(loc, x)));
    Value l = b.create<math::Log1pOp>(loc, e);
    Value pos = b.create<arith::AddFOp>(loc, x, l);
    return select(cmpf(arith::CmpFPredicate::OGT, x, cf(0)), pos, l);
  }
  if (isa<HardSwishOp>(op)) {
    Value g = b.create<arith::AddFOp>(loc, b.create<arith::DivFOp>(loc, x, cf(6)), cf(0.5));
    return b.create<arith::MulFOp>(loc, x, clamp01(g));
  }
  if (isa<HardSigmoidOp>(op)) {
    Value v = b.create<arith::AddFOp>(
        loc, b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 0.2)), x),
        cf(floatAttr(op, "beta", 0.5)));
    return clamp01(v);
  }
  if (isa<LeakyReluOp>(op))
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)),
                  b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 0.01)), x), x);
  if (isa<SeluOp>(op)) {
    Value neg = b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 1.6732632423543772)),
                                        b.create<math::ExpM1Op>(loc, x));
    Value v = select(cmpf(arith::CmpFPredicate::OGT, x, cf(0)), x, neg);
    return b.create<arith::MulFOp>(loc, cf(floatAttr(op, "gamma", 1.0507009873554805)), v);
  }
  if (isa<ThresholdedReluOp>(op)) // nan -> 0, as the CPU
    return select(cmpf(arith::CmpFPredicate::OGT, x, cf(floatAttr(op, "alpha", 1.0))), x, cf(0));
  if (isa<EluOp>(op))
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)),
                  b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 1.0)),
                                          b.create<math::ExpM1Op>(loc, x)),
                  x);
  if (isa<GeluOp>(op)) {
    auto approx = op->getAttrOfType<StringAttr>("approximate");
    Value inner;
    if (approx && approx.getValue() == "tanh") {
      Value x3 = b.create<arith::MulFOp>(loc, b.create<arith::MulFOp>(loc, x, x), x);
      Value t = b.create<arith::AddFOp>(loc, x, b.create<arith::MulFOp>(loc, cf(0.044715), x3));
      inner = b.create<math::TanhOp>(loc, b.create<arith::MulFOp>(loc, cf(0.7978845608028654), t));
    } else if (!approx || approx.getValue() == "none") {
      inner = b.create<math::ErfOp>(loc, b.create<arith::MulFOp>(loc, x, cf(0.7071067811865476)));
    } else {
      return {};
    }
    Value half = b.create<arith::MulFOp>(loc, cf(0.5), x);
    return b.create<arith::MulFOp>(loc, half, b.create<arith::AddFOp>(loc, cf(1), inner));
  }
  if (isa<ClipOp>(op)) {
    Value lo = cf(floatAttr(op, "min", -INFINITY)), hi = cf(floatAttr(op, "max", INFINITY));
    Value v = select(cmpf(arith::CmpFPredicate::OLT, x, lo), lo, x);
    return select(cmpf(arith::CmpFPredicate::OGT, v, hi), hi, v);
  }
  return {};
}

} // namespace mlir::forge::kernelgen
