//===- LibraryGradients.cpp - rules of matmul, gemm, conv and the pools ---===//
//
// Gradients of library-class ops are library-class ops again, so the backward
// pass maps to the same GEMM/convolution calls as the forward:
//   * matmul/gemm: two more matmuls/gemms (transposes folded into gemm flags);
//   * conv: input gradient = conv_transpose with the same weight (the adjoint
//     of conv, output_padding restoring the input extent), weight gradient =
//     conv_grad_weight, bias gradient = a reduce_sum;
//   * conv_transpose: input gradient = conv, weight gradient =
//     conv_grad_weight with input and output swapped;
//   * pools: max_pool_grad / avg_pool_grad.
// Each operand gradient is its own op, so DCE removes the ones nobody needs
// (e.g. the input gradient of a first layer, the weight gradient of a frozen
// layer).
//
//===----------------------------------------------------------------------===//
#include "RuleUtils.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::autodiff;

//===----------------------------------------------------------------------===//
// matmul (NumPy semantics: 1-D operands promoted, batch dims broadcast)
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(MatMulOp) {
  // Canonicalization sets the flags, after the train step is built.
  if (getTransA() || getTransB())
    return emitOpError("with transpose flags has no gradient rule (autodiff runs before "
                       "canonicalization folds transposes into matmul)");
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], a = getLhs(), b = getRhs();
  ArrayRef<int64_t> as = shapeOf(a), bs = shapeOf(b);
  const bool aVec = as.size() == 1, bVec = bs.size() == 1;
  // Work on the promoted operands A2 [..., M, K], B2 [..., K, N] and the
  // gradient G2 [batch..., M, N]; reshape back at the end.
  SmallVector<int64_t> a2Shape(as), b2Shape(bs);
  if (aVec)
    a2Shape.insert(a2Shape.begin(), 1);
  if (bVec)
    b2Shape.push_back(1);
  SmallVector<int64_t> g2Shape(shapeOf(g));
  if (aVec)
    g2Shape.insert(g2Shape.end() - (bVec ? 0 : 1), 1);
  if (bVec)
    g2Shape.push_back(1);
  auto typeOf = [](Value v, ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, elementOf(v));
  };
  Value g2 = gb.reshape(g, g2Shape);
  Value a2 = gb.reshape(a, a2Shape), b2 = gb.reshape(b, b2Shape);
  // A product of two matrices with transposes as flags (a gemm, so no
  // transpose is ever materialized for a matrix operand).
  auto gemm = [&](Value x, Value y, bool transX, bool transY) {
    return gb.create1("gemm", {x, y},
                      {gb.attr("transA", transX), gb.attr("transB", transY),
                       gb.attr("alpha", 1.0), gb.attr("beta", 0.0)});
  };
  // A shared (matrix) rhs: every batch row of A and G is one row of a matrix.
  const bool matrixRhs = b2Shape.size() == 2;
  int64_t k = a2Shape.back(), n = b2Shape.back();
  int64_t rows = tensorType(a).getNumElements() / k;

  operandGrads.push_back(gradientFor(gb, a, [&] {
    if (matrixRhs) // dA = G B^T over all rows at once
      return gb.reshape(gemm(gb.reshape(g2, {rows, n}), b2, false, true), as);
    // dA2 = G2 B2^T, summed over the batch dims A2 was broadcast along.
    Value da2 = gb.sumToType(gb.matmul(g2, gb.transposeLast2(b2)), typeOf(a, a2Shape));
    return gb.reshape(da2, as);
  }));
  operandGrads.push_back(gradientFor(gb, b, [&] {
    if (matrixRhs) // dB = A^T G over all rows: one GEMM, not a batch summed afterwards
      return gb.reshape(gemm(gb.reshape(a2, {rows, k}), gb.reshape(g2, {rows, n}), true, false),
                        bs);
    Value db2 = gb.sumToType(gb.matmul(gb.transposeLast2(a2), g2), typeOf(b, b2Shape));
    return gb.reshape(db2, bs);
  }));
  return gb.status();
}

//===----------------------------------------------------------------------===//
// gemm: Y = alpha op(A) op(B) + beta C
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(GemmOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], a = getA(), b = getB();
  const bool tA = getTransA(), tB = getTransB();
  const double alpha = getAlpha().convertToDouble(), beta = getBeta().convertToDouble();
  auto gemm = [&](Value x, Value y, bool transX, bool transY) {
    return gb.create1("gemm", {x, y},
                      {gb.attr("transA", transX), gb.attr("transB", transY),
                       gb.attr("alpha", alpha), gb.attr("beta", 0.0)});
  };
  // dop(A) = alpha G op(B)^T and dop(B) = alpha op(A)^T G, transposed back
  // for transposed operands; all transposes become gemm flags.
  operandGrads.push_back(
      gradientFor(gb, a, [&] { return tA ? gemm(b, g, tB, true) : gemm(g, b, false, !tB); }));
  operandGrads.push_back(
      gradientFor(gb, b, [&] { return tB ? gemm(g, a, true, tA) : gemm(a, g, !tA, false); }));
  if (Value c = getC()) {
    // beta == 0: C does not contribute; its gradient is structurally zero.
    operandGrads.push_back(beta == 0.0 ? Value() : gradientFor(gb, c, [&] { return g; }));
    if (operandGrads.back() && beta != 1.0)
      operandGrads.back() = gb.mulScalar(operandGrads.back(), beta);
  }
  return gb.status();
}

//===----------------------------------------------------------------------===//
// conv / conv_transpose
//===----------------------------------------------------------------------===//

/// Attributes shared by conv, conv_transpose and conv_grad_weight.
template <typename Op> static SmallVector<NamedAttribute> windowAttrs(GradientBuilder &gb, Op op) {
  return {gb.attr("strides", op.getStrides()), gb.attr("pads", op.getPads()),
          gb.attr("dilations", op.getDilations()), gb.attr("group", (int64_t)op.getGroup())};
}

/// Bias gradient: the sum over every dim but the channel dim 1.
static Value biasGradient(GradientBuilder &gb, Value g, Value bias) {
  SmallVector<int64_t> axes = {0};
  for (int64_t d = 2; d < tensorType(g).getRank(); ++d)
    axes.push_back(d);
  return asType(gb, gb.reduceSum(g, axes, /*keepdims=*/false), bias.getType());
}

FORGE_GRADIENT(ConvOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], x = getInput(), w = getWeight();
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w), ys = shapeOf(getResult());
  const int64_t sp = xs.size() - 2;
  operandGrads.push_back(gradientFor(gb, x, [&] {
    // conv_transpose's extent s*(out-1) + output_padding + (k-1)*d + 1 - pads
    // equals the input extent for output_padding = the rows the last window
    // left over (always < stride).
    SmallVector<int64_t> outputPadding;
    for (int64_t d = 0; d < sp; ++d)
      outputPadding.push_back(xs[d + 2] + getPads()[d] + getPads()[d + sp] -
                              getDilations()[d] * (ws[d + 2] - 1) - 1 -
                              getStrides()[d] * (ys[d + 2] - 1));
    SmallVector<NamedAttribute> attrs = windowAttrs(gb, *this);
    attrs.push_back(gb.attr("output_padding", ArrayRef<int64_t>(outputPadding)));
    return gb.create1("conv_transpose", {g, w}, attrs);
  }));
  operandGrads.push_back(gradientFor(gb, w, [&] {
    SmallVector<NamedAttribute> attrs = windowAttrs(gb, *this);
    attrs.push_back(gb.attr("kernel_shape", ws.drop_front(2)));
    return gb.create1("conv_grad_weight", {x, g}, attrs);
  }));
  if (Value bias = getBias())
    operandGrads.push_back(isFloatTensor(bias) ? biasGradient(gb, g, bias) : Value());
  return gb.status();
}

FORGE_GRADIENT(ConvTransposeOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], x = getInput(), w = getWeight();
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w), ys = shapeOf(getResult());
  const int64_t sp = xs.size() - 2;
  // conv over the result has in + output_padding / stride windows per dim:
  // the first `in` are the input gradient; the others (output_padding >=
  // stride, which ONNX allows when dilation > stride) only saw the padding.
  SmallVector<int64_t> windows(xs.begin(), xs.end());
  bool extra = false;
  for (int64_t d = 0; d < sp; ++d) {
    windows[d + 2] =
        (ys[d + 2] + getPads()[d] + getPads()[d + sp] - getDilations()[d] * (ws[d + 2] - 1) - 1) /
            getStrides()[d] +
        1;
    extra |= windows[d + 2] != xs[d + 2];
  }
  operandGrads.push_back(gradientFor(gb, x, [&] {
    Value dx = gb.create1("conv", {g, w}, windowAttrs(gb, *this));
    if (!extra)
      return dx;
    SmallVector<int64_t> starts(xs.size(), 0), steps(xs.size(), 1);
    return gb.slice(dx, starts, SmallVector<int64_t>(xs), steps);
  }));
  operandGrads.push_back(gradientFor(gb, w, [&] {
    // The forward's input plays conv's output gradient: dW[c, m, k] =
    // sum x[n, c, o] * g[n, m, o*s - pad + k*d] (zero-extended to every window).
    Value dy = x;
    if (extra) {
      SmallVector<int64_t> pads(2 * xs.size(), 0);
      for (int64_t d = 0; d < sp; ++d)
        pads[xs.size() + d + 2] = windows[d + 2] - xs[d + 2];
      dy = gb.padConstant(x, pads);
    }
    SmallVector<NamedAttribute> attrs = windowAttrs(gb, *this);
    attrs.push_back(gb.attr("kernel_shape", ws.drop_front(2)));
    return gb.create1("conv_grad_weight", {g, dy}, attrs);
  }));
  if (Value bias = getBias())
    operandGrads.push_back(isFloatTensor(bias) ? biasGradient(gb, g, bias) : Value());
  return gb.status();
}

//===----------------------------------------------------------------------===//
// Pools
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(MaxPoolOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], x = getInput();
  operandGrads.push_back(gradientFor(gb, x, [&] {
    return gb.create1("max_pool_grad", {x, g},
                      {gb.attr("kernel_shape", getKernelShape()), gb.attr("strides", getStrides()),
                       gb.attr("pads", getPads()), gb.attr("dilations", getDilations()),
                       gb.attr("ceil_mode", getCeilMode())});
  }));
  return gb.status();
}

FORGE_GRADIENT(AvgPoolOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], x = getInput();
  operandGrads.push_back(gradientFor(gb, x, [&] {
    return gb.create1("avg_pool_grad", {g},
                      {gb.attr("input_shape", shapeOf(x)),
                       gb.attr("kernel_shape", getKernelShape()), gb.attr("strides", getStrides()),
                       gb.attr("pads", getPads()), gb.attr("dilations", getDilations()),
                       gb.attr("ceil_mode", getCeilMode()),
                       gb.attr("count_include_pad", getCountIncludePad())});
  }));
  return gb.status();
}

//===----------------------------------------------------------------------===//
// attention: one attention_grad (flash attention's backward recomputes the
// probabilities from q, k and the forward's lse; nothing T x T is saved)
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(AttentionOp) {
  if (resultGrads[1])
    return emitOpError("has no gradient rule for its lse result (it is read only by "
                       "attention_grad)");
  GradientBuilder gb(builder, getLoc());
  SmallVector<Value> operands = {getQ(), getK(), getV(), getO(), getLse(), resultGrads[0]};
  if (getBias())
    operands.push_back(getBias());
  SmallVector<Value> grads =
      gb.create("attention_grad", operands,
                {gb.attr("scale", getScale().convertToDouble()), gb.attr("causal", getCausal()),
                 gb.attr("layout", getLayout())});
  if (grads.size() != 3)
    return failure();
  // Sum_j dk_j = 0 exactly: shifting every key by one vector shifts each
  // query's scores by a constant, which softmax ignores. Low-precision kernels
  // (cuDNN's flash attention rounds dS to bf16 before dk = dS^T q) leave a
  // residue there that a bias before the keys (a LayerNorm's) sums over every
  // token: dk minus its mean over the keys removes it (a no-op in exact math).
  int64_t seqAxis = getLayout() == "bshd" ? 1 : 2;
  Value mean = gb.create1("reduce_mean", {grads[1]},
                          {gb.attr("axes", ArrayRef<int64_t>{seqAxis}), gb.attr("keepdims", true)});
  grads[1] = gb.sub(grads[1], mean);
  operandGrads.append(grads.begin(), grads.end());
  if (getBias()) // a mask: forge-recognize-composites forms no attention a parameter reaches
    operandGrads.push_back(Value());
  return gb.status();
}
