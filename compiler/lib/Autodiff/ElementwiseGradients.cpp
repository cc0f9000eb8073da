//===- ElementwiseGradients.cpp - rules of the elementwise ops ------------===//
//
// Binary ops broadcast NumPy-style, so each operand's gradient is summed back
// to the operand's own shape (GradientBuilder::sumToType).
//
// Conventions at non-smooth points (documented in the interface):
//   * min/max: ties send the gradient to the lhs, the operand the forward
//     kernel returns on a tie;
//   * relu passes the gradient where x > 0; leaky_relu/elu/selu take the
//     negative branch where x < 0 (x == 0 gets the positive slope);
//     thresholded_relu passes it where x > alpha; hard_swish is 0 below -3 and
//     1 above 3; clip passes it on [min, max] inclusive; hard_sigmoid only
//     strictly inside its linear part (0 < y < 1);
//   * abs: sign(x), 0 at 0;
//   * pow: d/d exponent uses log(base) where base > 0 and 0 elsewhere;
//   * mod: the quotient is piecewise constant, so d/da = 1 and
//     d/db = -q with q = (a - y) / b, the truncated (fmod) or floored quotient.
//
//===----------------------------------------------------------------------===//
#include "RuleUtils.h"

#include <cmath>

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::autodiff;

//===----------------------------------------------------------------------===//
// Binary arithmetic
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(AddOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  operandGrads.push_back(gradientFor(gb, getLhs(), [&] { return g; }));
  operandGrads.push_back(gradientFor(gb, getRhs(), [&] { return g; }));
  return gb.status();
}

FORGE_GRADIENT(SubOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  operandGrads.push_back(gradientFor(gb, getLhs(), [&] { return g; }));
  // Negate after summing: the reduced tensor is the smaller one.
  Value rhs = gradientFor(gb, getRhs(), [&] { return g; });
  operandGrads.push_back(rhs ? gb.neg(rhs) : rhs);
  return gb.status();
}

FORGE_GRADIENT(MulOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  operandGrads.push_back(gradientFor(gb, getLhs(), [&] { return gb.mul(g, getRhs()); }));
  operandGrads.push_back(gradientFor(gb, getRhs(), [&] { return gb.mul(g, getLhs()); }));
  return gb.status();
}

FORGE_GRADIENT(DivOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  operandGrads.push_back(gradientFor(gb, getLhs(), [&] { return gb.div(g, getRhs()); }));
  // d(a/b)/db = -a/b^2 = -y/b.
  Value rhs = gradientFor(gb, getRhs(), [&] { return gb.div(gb.mul(g, getResult()), getRhs()); });
  operandGrads.push_back(rhs ? gb.neg(rhs) : rhs);
  return gb.status();
}

FORGE_GRADIENT(PowOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], base = getLhs(), exponent = getRhs();
  operandGrads.push_back(gradientFor(gb, base, [&] {
    // b * a^(b-1); an integer exponent is converted for the arithmetic.
    Value e = gb.castTo(exponent, elementOf(base));
    return gb.mul(g, gb.mul(e, gb.pow(base, gb.addScalar(e, -1.0))));
  }));
  operandGrads.push_back(gradientFor(gb, exponent, [&] {
    // y * log(a), defined as 0 where a <= 0 (a^b is then 0 or not real).
    Value zero = gb.scalarLike(base, 0.0);
    Value logBase = gb.where(gb.greater(base, zero), gb.log(base), zero);
    return gb.mul(gb.mul(g, getResult()), logBase);
  }));
  return gb.status();
}

FORGE_GRADIENT(ModOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  operandGrads.push_back(gradientFor(gb, getLhs(), [&] { return g; }));
  // y = a - q b for both forms, so q = (a - y) / b without a trunc/floor op.
  Value rhs = gradientFor(gb, getRhs(), [&] {
    return gb.mul(g, gb.div(gb.sub(getLhs(), getResult()), getRhs()));
  });
  operandGrads.push_back(rhs ? gb.neg(rhs) : rhs);
  return gb.status();
}

/// min/max: `lhsWins` (lhs <= rhs for min, lhs >= rhs for max) routes the
/// gradient to the lhs, including ties, exactly where the forward picks it.
static void minMaxRule(GradientBuilder &gb, Value g, Value lhs, Value rhs, Value lhsWins,
                       SmallVectorImpl<Value> &operandGrads) {
  Value zero = gb.scalarLike(g, 0.0);
  operandGrads.push_back(gradientFor(gb, lhs, [&] { return gb.where(lhsWins, g, zero); }));
  operandGrads.push_back(gradientFor(gb, rhs, [&] { return gb.where(lhsWins, zero, g); }));
}

FORGE_GRADIENT(MinOp) {
  GradientBuilder gb(builder, getLoc());
  minMaxRule(gb, resultGrads[0], getLhs(), getRhs(), gb.lessEqual(getLhs(), getRhs()),
             operandGrads);
  return gb.status();
}

FORGE_GRADIENT(MaxOp) {
  GradientBuilder gb(builder, getLoc());
  minMaxRule(gb, resultGrads[0], getLhs(), getRhs(), gb.greaterEqual(getLhs(), getRhs()),
             operandGrads);
  return gb.status();
}

//===----------------------------------------------------------------------===//
// Unary math: dx = g * f'(x), written with x and/or the result y
//===----------------------------------------------------------------------===//

/// Shared body: pushes `make(gb, g, x, y)` as the input's gradient.
template <typename Op, typename Make>
static LogicalResult unaryRule(Op op, OpBuilder &builder, ValueRange resultGrads,
                               SmallVectorImpl<Value> &operandGrads, Make &&make) {
  GradientBuilder gb(builder, op.getLoc());
  Value x = op.getInput();
  operandGrads.push_back(
      gradientFor(gb, x, [&] { return make(gb, resultGrads[0], x, op.getResult()); }));
  return gb.status();
}

FORGE_GRADIENT(NegOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value) { return gb.neg(g); });
}

FORGE_GRADIENT(AbsOp) {
  return unaryRule(
      *this, builder, resultGrads, operandGrads, [](GradientBuilder &gb, Value g, Value x, Value) {
        // sign(x) = [x > 0] - [x < 0] (0 at 0).
        Type e = elementOf(x);
        Value zero = gb.scalarLike(x, 0.0);
        Value sign = gb.sub(gb.castTo(gb.greater(x, zero), e), gb.castTo(gb.less(x, zero), e));
        return gb.mul(g, sign);
      });
}

FORGE_GRADIENT(ExpOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value y) { return gb.mul(g, y); });
}

FORGE_GRADIENT(LogOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) { return gb.div(g, x); });
}

FORGE_GRADIENT(SqrtOp) {
  return unaryRule(
      *this, builder, resultGrads, operandGrads,
      [](GradientBuilder &gb, Value g, Value, Value y) { return gb.div(gb.mulScalar(g, 0.5), y); });
}

FORGE_GRADIENT(ReciprocalOp) {
  return unaryRule(
      *this, builder, resultGrads, operandGrads,
      [](GradientBuilder &gb, Value g, Value, Value y) { return gb.neg(gb.mul(g, gb.mul(y, y))); });
}

FORGE_GRADIENT(TanhOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value y) {
                     Value one = gb.scalarLike(y, 1.0);
                     return gb.mul(g, gb.sub(one, gb.mul(y, y)));
                   });
}

FORGE_GRADIENT(SigmoidOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value y) {
                     Value one = gb.scalarLike(y, 1.0);
                     return gb.mul(g, gb.mul(y, gb.sub(one, y)));
                   });
}

// The mask from the output (y > 0 exactly where x > 0, NaN included): the
// backward then keeps y, which the next op saves anyway (a conv's input), and
// not x, which can die at the ReLU (a BatchNorm output written over in place).
FORGE_GRADIENT(ReluOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value y) {
                     return gb.maskedOrZero(gb.greater(y, gb.scalarLike(y, 0.0)), g);
                   });
}

FORGE_GRADIENT(ErfOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     // 2/sqrt(pi) * exp(-x^2)
                     Value e = gb.exp(gb.neg(gb.mul(x, x)));
                     return gb.mul(g, gb.mulScalar(e, 2.0 / std::sqrt(M_PI)));
                   });
}

FORGE_GRADIENT(SinOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.mul(g, gb.cos(x));
                   });
}

FORGE_GRADIENT(CosOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.neg(gb.mul(g, gb.sin(x)));
                   });
}

FORGE_GRADIENT(TanOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value, Value y) {
                     return gb.mul(g, gb.addScalar(gb.mul(y, y), 1.0)); // 1 + tan^2
                   });
}

/// sqrt((1 - x)(1 + x)): no cancellation near |x| = 1.
static Value sqrtOneMinusSquare(GradientBuilder &gb, Value x) {
  Value one = gb.scalarLike(x, 1.0);
  return gb.sqrt(gb.mul(gb.sub(one, x), gb.add(one, x)));
}

FORGE_GRADIENT(AsinOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.div(g, sqrtOneMinusSquare(gb, x));
                   });
}

FORGE_GRADIENT(AcosOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.neg(gb.div(g, sqrtOneMinusSquare(gb, x)));
                   });
}

FORGE_GRADIENT(AtanOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.div(g, gb.addScalar(gb.mul(x, x), 1.0));
                   });
}

FORGE_GRADIENT(SinhOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.mul(g, gb.cosh(x));
                   });
}

FORGE_GRADIENT(CoshOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.mul(g, gb.sinh(x));
                   });
}

FORGE_GRADIENT(AsinhOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.div(g, gb.sqrt(gb.addScalar(gb.mul(x, x), 1.0)));
                   });
}

FORGE_GRADIENT(AcoshOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     // 1 / sqrt((x - 1)(x + 1)): no cancellation near 1.
                     return gb.div(g, gb.sqrt(gb.mul(gb.addScalar(x, -1.0), gb.addScalar(x, 1.0))));
                   });
}

FORGE_GRADIENT(AtanhOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     Value one = gb.scalarLike(x, 1.0);
                     return gb.div(g, gb.mul(gb.sub(one, x), gb.add(one, x)));
                   });
}

FORGE_GRADIENT(SoftplusOp) {
  return unaryRule(
      *this, builder, resultGrads, operandGrads,
      [](GradientBuilder &gb, Value g, Value x, Value) { return gb.mul(g, gb.sigmoid(x)); });
}

FORGE_GRADIENT(HardSwishOp) {
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [](GradientBuilder &gb, Value g, Value x, Value) {
                     // y = x * clip(x/6 + 1/2, 0, 1): 0 below -3, 1 above 3,
                     // x/3 + 1/2 in between.
                     Value zero = gb.scalarLike(x, 0.0);
                     Value inner = gb.mul(g, gb.addScalar(gb.mulScalar(x, 1.0 / 3.0), 0.5));
                     Value upper = gb.where(gb.greater(x, gb.scalarLike(x, 3.0)), g, inner);
                     return gb.where(gb.less(x, gb.scalarLike(x, -3.0)), zero, upper);
                   });
}

FORGE_GRADIENT(LeakyReluOp) {
  double alpha = getAlpha().convertToDouble();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value) {
                     Value negative = gb.less(x, gb.scalarLike(x, 0.0));
                     return gb.where(negative, gb.mulScalar(g, alpha), g);
                   });
}

FORGE_GRADIENT(EluOp) {
  double alpha = getAlpha().convertToDouble();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value y) {
                     // x < 0: y = alpha (e^x - 1), y' = alpha e^x = y + alpha.
                     Value negative = gb.less(x, gb.scalarLike(x, 0.0));
                     return gb.where(negative, gb.mul(g, gb.addScalar(y, alpha)), g);
                   });
}

FORGE_GRADIENT(SeluOp) {
  double alpha = getAlpha().convertToDouble(), gamma = getGamma().convertToDouble();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value y) {
                     // x < 0: y = gamma alpha (e^x - 1), y' = y + gamma alpha.
                     Value negative = gb.less(x, gb.scalarLike(x, 0.0));
                     return gb.where(negative, gb.mul(g, gb.addScalar(y, gamma * alpha)),
                                     gb.mulScalar(g, gamma));
                   });
}

FORGE_GRADIENT(ThresholdedReluOp) {
  double alpha = getAlpha().convertToDouble();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.maskedOrZero(gb.greater(x, gb.scalarLike(x, alpha)), g);
                   });
}

FORGE_GRADIENT(GeluOp) {
  // One gelu_grad op (its derivative: compiler/lib/Codegen/Scalar.cpp and the
  // CPU's Backward.cpp), which forge-fuse can hand to cuBLASLt's DGELU
  // epilogue with the GEMM that produces g.
  StringRef approximate = getApproximate();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value) {
                     return gb.create1("gelu_grad", {g, x}, {gb.attr("approximate", approximate)});
                   });
}

FORGE_GRADIENT(HardSigmoidOp) {
  double alpha = getAlpha().convertToDouble();
  return unaryRule(
      *this, builder, resultGrads, operandGrads, [&](GradientBuilder &gb, Value g, Value, Value y) {
        // alpha strictly inside the linear part, read off the result.
        Value inside =
            gb.logicalAnd(gb.greater(y, gb.scalarLike(y, 0.0)), gb.less(y, gb.scalarLike(y, 1.0)));
        return gb.maskedOrZero(inside, gb.mulScalar(g, alpha));
      });
}

FORGE_GRADIENT(ClipOp) {
  double lo = getMin().convertToDouble(), hi = getMax().convertToDouble();
  return unaryRule(*this, builder, resultGrads, operandGrads,
                   [&](GradientBuilder &gb, Value g, Value x, Value) {
                     Value inside = gb.logicalAnd(gb.greaterEqual(x, gb.scalarLike(x, lo)),
                                                  gb.lessEqual(x, gb.scalarLike(x, hi)));
                     return gb.maskedOrZero(inside, g);
                   });
}

//===----------------------------------------------------------------------===//
// cast, where
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(CastOp) {
  // Only float -> float casts get here (buildGradient stops integer sides).
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  Value x = getInput();
  operandGrads.push_back(isFloatTensor(g) ? gradientFor(gb, x, [&] { return g; }) : Value());
  return gb.status();
}

FORGE_GRADIENT(WhereOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], cond = getCondition();
  Value zero = gb.scalarLike(g, 0.0);
  operandGrads.push_back(Value()); // the condition is a mask
  operandGrads.push_back(gradientFor(gb, getX(), [&] { return gb.where(cond, g, zero); }));
  operandGrads.push_back(gradientFor(gb, getY(), [&] { return gb.where(cond, zero, g); }));
  return gb.status();
}
