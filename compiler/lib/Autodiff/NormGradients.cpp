//===- NormGradients.cpp - rules of normalizations, softmax and losses ----===//
//
//   * batch_norm (inference): mean and var are constants (running statistics),
//     so dx, dscale, dbias are small elementwise/reduction compositions and
//     mean/var get no gradient;
//   * batch_norm_training, layer_norm, group_norm: one fused backward op each
//     (ForgeGradOps.td) returning dx, dscale, dbias; its canonicalization drops
//     the gradients nobody uses. batch_norm_training's running-statistics
//     results are state updates, not differentiable: their gradients are
//     ignored and the running-statistics operands get none;
//   * softmax/log_softmax: backward ops that read the forward result;
//   * nll_loss: nll_loss_grad; the target and the class weights get no
//     gradient (weights are constants, as in PyTorch).
//
//===----------------------------------------------------------------------===//
#include "RuleUtils.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::autodiff;

/// Axes of every dim but the channel dim 1.
static SmallVector<int64_t> nonChannelAxes(int64_t rank) {
  SmallVector<int64_t> axes = {0};
  for (int64_t d = 2; d < rank; ++d)
    axes.push_back(d);
  return axes;
}

FORGE_GRADIENT(BatchNormOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0], x = getInput();
  auto xt = tensorType(x);
  // Per-channel parameters (any shape with C elements, any float type) as
  // [1, C, 1, ...] tensors of the input's element type.
  SmallVector<int64_t> channelShape(xt.getRank(), 1);
  channelShape[1] = xt.getDimSize(1);
  auto channel = [&](Value p) {
    return gb.reshape(gb.castTo(p, xt.getElementType()), channelShape);
  };
  Value rstd =
      gb.reciprocal(gb.sqrt(gb.addScalar(channel(getVar()), getEpsilon().convertToDouble())));
  SmallVector<int64_t> axes = nonChannelAxes(xt.getRank());
  operandGrads.push_back(
      gradientFor(gb, x, [&] { return gb.mul(g, gb.mul(channel(getScale()), rstd)); }));
  Value scale = getScale(), bias = getBias();
  operandGrads.push_back(
      isFloatTensor(scale)
          ? asType(
                gb,
                gb.reduceSum(gb.mul(g, gb.mul(gb.sub(x, channel(getMean())), rstd)), axes, false),
                scale.getType())
          : Value());
  operandGrads.push_back(
      isFloatTensor(bias) ? asType(gb, gb.reduceSum(g, axes, false), bias.getType()) : Value());
  operandGrads.push_back(Value()); // mean: a constant of inference mode
  operandGrads.push_back(Value()); // var
  return gb.status();
}

/// Builds a fused norm backward op for all of (input, scale, bias) that are
/// float tensors, and returns the three gradients (null where not built).
static std::array<Value, 3> fusedNormGrad(GradientBuilder &gb, StringRef name, Value x, Value scale,
                                          Value bias, Value g, SmallVector<NamedAttribute> attrs) {
  bool want[3] = {isFloatTensor(x), isFloatTensor(scale), bias && isFloatTensor(bias)};
  attrs.push_back(gb.attr("input_grad", want[0]));
  attrs.push_back(gb.attr("scale_grad", want[1]));
  attrs.push_back(gb.attr("bias_grad", want[2]));
  std::array<Value, 3> out = {};
  SmallVector<Value> results = gb.create(name, {x, scale, g}, attrs);
  if (gb.failed())
    return out;
  unsigned next = 0;
  for (int i = 0; i < 3; ++i)
    if (want[i])
      out[i] = results[next++];
  return out;
}

FORGE_GRADIENT(BatchNormTrainingOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  if (!g) { // only running statistics are requested: no gradient flows
    operandGrads.append(getOperation()->getNumOperands(), Value());
    return success();
  }
  auto grads = fusedNormGrad(gb, "batch_norm_training_grad", getInput(), getScale(), getBias(), g,
                             {gb.attr("epsilon", getEpsilon().convertToDouble())});
  operandGrads.push_back(grads[0]);
  operandGrads.push_back(grads[1] ? asType(gb, grads[1], getScale().getType()) : Value());
  operandGrads.push_back(grads[2] ? asType(gb, grads[2], getBias().getType()) : Value());
  operandGrads.push_back(Value()); // running_mean
  operandGrads.push_back(Value()); // running_var
  return gb.status();
}

FORGE_GRADIENT(LayerNormOp) {
  GradientBuilder gb(builder, getLoc());
  Value bias = getBias();
  auto grads = fusedNormGrad(
      gb, "layer_norm_grad", getInput(), getScale(), bias, resultGrads[0],
      {gb.attr("axis", (int64_t)getAxis()), gb.attr("epsilon", getEpsilon().convertToDouble())});
  // Parameter gradients come in the normalized shape; scale and bias may be
  // broadcast into it.
  operandGrads.push_back(grads[0]);
  operandGrads.push_back(grads[1] ? gb.sumToType(grads[1], getScale().getType()) : Value());
  if (bias)
    operandGrads.push_back(grads[2] ? gb.sumToType(grads[2], bias.getType()) : Value());
  return gb.status();
}

FORGE_GRADIENT(GroupNormOp) {
  GradientBuilder gb(builder, getLoc());
  auto grads =
      fusedNormGrad(gb, "group_norm_grad", getInput(), getScale(), getBias(), resultGrads[0],
                    {gb.attr("num_groups", (int64_t)getNumGroups()),
                     gb.attr("epsilon", getEpsilon().convertToDouble())});
  operandGrads.push_back(grads[0]);
  operandGrads.push_back(grads[1] ? asType(gb, grads[1], getScale().getType()) : Value());
  operandGrads.push_back(grads[2] ? asType(gb, grads[2], getBias().getType()) : Value());
  return gb.status();
}

FORGE_GRADIENT(SoftmaxOp) {
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(gb.create1("softmax_grad", {getResult(), resultGrads[0]},
                                    {gb.attr("axis", (int64_t)getAxis())}));
  return gb.status();
}

FORGE_GRADIENT(LogSoftmaxOp) {
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(gb.create1("log_softmax_grad", {getResult(), resultGrads[0]},
                                    {gb.attr("axis", (int64_t)getAxis())}));
  return gb.status();
}

FORGE_GRADIENT(NllLossOp) {
  GradientBuilder gb(builder, getLoc());
  Value x = getInput();
  SmallVector<Value> operands = {resultGrads[0], getTarget()};
  if (Value w = getWeight())
    operands.push_back(w);
  SmallVector<NamedAttribute> attrs = {gb.attr("reduction", getReduction()),
                                       gb.attr("num_classes", shapeOf(x)[1])};
  if (auto ignore = getIgnoreIndexAttr())
    attrs.push_back(gb.attr("ignore_index", Attribute(ignore)));
  operandGrads.push_back(
      gradientFor(gb, x, [&] { return gb.create1("nll_loss_grad", operands, attrs); }));
  operandGrads.push_back(Value()); // target: class indices
  if (getWeight())
    operandGrads.push_back(Value()); // class weights: constants
  return gb.status();
}
