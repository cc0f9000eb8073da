//===- ForgeGradOps.cpp - type inference, verifiers and canonicalization ---===//
//
// For the backward-only ops of ForgeGradOps.td. Inference re-derives the
// forward op's shape relation (e.g. grad_output must have the pool's output
// shape for `input`), so a rule that builds an inconsistent backward op fails
// at creation, not in a kernel.
//
//===----------------------------------------------------------------------===//
#include "forge/Dialect/ForgeDialect.h"

#include "InferenceUtils.h"

#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::detail;

#define FORGE_INFER(OP)                                                                            \
  LogicalResult OP::inferReturnTypes(MLIRContext *context, std::optional<Location> loc,            \
                                     Adaptor adaptor, SmallVectorImpl<Type> &inferred)

static LogicalResult requireShape(std::optional<Location> loc, RankedTensorType t,
                                  ArrayRef<int64_t> expected, StringRef what) {
  if (t.getShape() == expected)
    return success();
  std::string got, want;
  llvm::raw_string_ostream g(got), w(want);
  llvm::interleave(t.getShape(), g, "x");
  llvm::interleave(expected, w, "x");
  return failInference(loc, what + " has shape [" + got + "], expected [" + want + "]");
}

//===----------------------------------------------------------------------===//
// conv_grad_weight
//===----------------------------------------------------------------------===//

FORGE_INFER(ConvGradWeightOp) {
  bool last = adaptor.getChannelsLast();
  auto x = channelsFirst(rankedOrNull(adaptor.getInput().getType()), last);
  auto dy = channelsFirst(rankedOrNull(adaptor.getGradOutput().getType()), last);
  if (!x || !dy || x.getRank() < 3 || dy.getRank() != x.getRank())
    return failInference(loc, "conv_grad_weight needs input and grad_output of equal rank >= 3");
  int64_t spatial = x.getRank() - 2, group = adaptor.getGroup();
  if (failed(checkSpatialAttrs(loc, spatial, adaptor.getStrides(), adaptor.getPads(),
                               adaptor.getDilations())))
    return failure();
  if ((int64_t)adaptor.getKernelShape().size() != spatial)
    return failInference(loc, "kernel_shape needs one entry per spatial dim");
  if (group <= 0 || x.getDimSize(1) % group != 0 || dy.getDimSize(1) % group != 0)
    return failInference(loc, "channels must be divisible by group");
  if (x.getElementType() != dy.getElementType())
    return failInference(loc, "input and grad_output element types differ");
  SmallVector<int64_t> expected = {x.getDimSize(0), dy.getDimSize(1)};
  for (int64_t i = 0; i < spatial; ++i)
    expected.push_back(windowOutput(
        x.getDimSize(i + 2), adaptor.getKernelShape()[i], adaptor.getStrides()[i],
        adaptor.getPads()[i], adaptor.getPads()[i + spatial], adaptor.getDilations()[i], false));
  if (failed(requireShape(loc, dy, expected, "grad_output")))
    return failure();
  SmallVector<int64_t> shape = {dy.getDimSize(1), x.getDimSize(1) / group};
  llvm::append_range(shape, adaptor.getKernelShape());
  inferred.push_back(withShape(x, last ? channelsLastShape(shape) : shape));
  return success();
}

OpCost ConvGradWeightOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  auto w = cast<RankedTensorType>(getType());
  int64_t perOutput = w.getNumElements() / std::max<int64_t>(w.getDimSize(0), 1);
  cost.flops = 2 * perOutput * cast<RankedTensorType>(getGradOutput().getType()).getNumElements();
  return cost;
}

//===----------------------------------------------------------------------===//
// Pools
//===----------------------------------------------------------------------===//

FORGE_INFER(MaxPoolGradOp) {
  bool last = adaptor.getChannelsLast();
  auto stored = rankedOrNull(adaptor.getInput().getType());
  auto x = channelsFirst(stored, last);
  auto dy = channelsFirst(rankedOrNull(adaptor.getGradOutput().getType()), last);
  // One type, or (forge-assign-precision) a 16-bit float image and/or gradient beside
  // f32: the overlapping windows' gradients then add into an f32 result.
  auto half = [](Type t) { return t.isBF16() || t.isF16(); };
  Type xe = x ? x.getElementType() : Type(), dye = dy ? dy.getElementType() : Type();
  bool mixed = x && dy && (half(xe) || half(dye)) && (xe == dye || xe.isF32() || dye.isF32());
  if (!x || !dy || (xe != dye && !mixed))
    return failInference(loc, "max_pool_grad needs static input and grad_output of one type (or "
                              "bf16/f16 beside f32)");
  auto shape = poolOutputShape(loc, x.getShape(), adaptor.getKernelShape(), adaptor.getStrides(),
                               adaptor.getPads(), adaptor.getDilations(), adaptor.getCeilMode());
  if (failed(shape) || failed(requireShape(loc, dy, *shape, "grad_output")))
    return failure();
  inferred.push_back(mixed ? RankedTensorType::get(stored.getShape(), Float32Type::get(context))
                           : stored);
  return success();
}

FORGE_INFER(AvgPoolGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!dy)
    return failInference(loc, "avg_pool_grad needs a static grad_output");
  for (int64_t d : adaptor.getInputShape())
    if (d < 0)
      return failInference(loc, "input_shape must be non-negative");
  auto shape =
      poolOutputShape(loc, adaptor.getInputShape(), adaptor.getKernelShape(), adaptor.getStrides(),
                      adaptor.getPads(), adaptor.getDilations(), adaptor.getCeilMode());
  if (failed(shape) || failed(requireShape(loc, dy, *shape, "grad_output")))
    return failure();
  inferred.push_back(withShape(dy, adaptor.getInputShape()));
  return success();
}

//===----------------------------------------------------------------------===//
// Normalization backward: one result per set flag (input, scale, bias)
//===----------------------------------------------------------------------===//

/// Result types of a norm-grad op whose parameter gradients have `paramShape`.
template <typename Adaptor>
static LogicalResult inferNormGrad(std::optional<Location> loc, Adaptor adaptor,
                                   ArrayRef<int64_t> paramShape, SmallVectorImpl<Type> &inferred) {
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto scale = cast<RankedTensorType>(adaptor.getScale().getType());
  if (adaptor.getInputGrad())
    inferred.push_back(x);
  if (adaptor.getScaleGrad())
    inferred.push_back(withShape(scale, paramShape));
  if (adaptor.getBiasGrad())
    inferred.push_back(withShape(scale, paramShape));
  return success();
}

/// Checks shared by the norm-grad ops: static input, grad_output of the
/// input's type (`lowGradOutput`: of its shape, in any float type), a float
/// scale with `paramElements` elements.
template <typename Adaptor>
static LogicalResult checkNormGradOperands(std::optional<Location> loc, Adaptor adaptor,
                                           bool lowGradOutput = false) {
  auto x = rankedOrNull(adaptor.getInput().getType());
  auto scale = rankedOrNull(adaptor.getScale().getType());
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!x || !scale || !dy)
    return failInference(loc, "operands must be statically shaped tensors");
  if (lowGradOutput) {
    // A layer norm's grad_output may be stored in another float type
    // (forge-assign-precision's low-norm-gradients: a GEMM's bf16 product); its
    // kernels compute in f32 whatever they load.
    if (dy.getShape() != x.getShape() || !isa<FloatType>(dy.getElementType()) ||
        !isa<FloatType>(x.getElementType()))
      return failInference(loc, "grad_output must have the input's shape, both floats");
  } else if (dy != x) {
    return failInference(loc, "grad_output must have the input's type");
  }
  return success();
}

FORGE_INFER(BatchNormTrainingGradOp) {
  if (failed(checkNormGradOperands(loc, adaptor)))
    return failure();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() < 2)
    return failInference(loc, "input must have rank >= 2 (N, C, ...)");
  return inferNormGrad(loc, adaptor, {x.getDimSize(1)}, inferred);
}

FORGE_INFER(LayerNormGradOp) {
  if (failed(checkNormGradOperands(loc, adaptor, /*lowGradOutput=*/true)))
    return failure();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  int64_t axis = adaptor.getAxis();
  if (axis < 0 || axis >= std::max<int64_t>(x.getRank(), 1))
    return failInference(loc, "axis out of range");
  return inferNormGrad(loc, adaptor, x.getShape().drop_front(std::min<int64_t>(axis, x.getRank())),
                       inferred);
}

FORGE_INFER(GroupNormGradOp) {
  if (failed(checkNormGradOperands(loc, adaptor)))
    return failure();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  if (x.getRank() < 2 || adaptor.getNumGroups() <= 0 ||
      x.getDimSize(1) % adaptor.getNumGroups() != 0)
    return failInference(loc, "channels must be divisible by num_groups");
  return inferNormGrad(loc, adaptor, {x.getDimSize(1)}, inferred);
}

template <typename Op> static LogicalResult verifyNormGrad(Op op) {
  if (!op.getInputGrad() && !op.getScaleGrad() && !op.getBiasGrad())
    return op.emitOpError("must compute at least one gradient");
  return success();
}

LogicalResult BatchNormTrainingGradOp::verify() { return verifyNormGrad(*this); }
LogicalResult LayerNormGradOp::verify() { return verifyNormGrad(*this); }
LogicalResult GroupNormGradOp::verify() { return verifyNormGrad(*this); }

/// Drops the results nobody uses by clearing their flags (dead backward code
/// of frozen parameters); an op with no used result is left to DCE.
template <typename Op> static LogicalResult dropUnusedNormGrads(Op op, PatternRewriter &rewriter) {
  bool flags[3] = {op.getInputGrad(), op.getScaleGrad(), op.getBiasGrad()};
  SmallVector<Value> live;
  bool changed = false, anyUsed = false;
  unsigned next = 0;
  for (bool &flag : flags) {
    if (!flag)
      continue;
    Value r = op->getResult(next++);
    if (r.use_empty()) {
      flag = false;
      changed = true;
    } else {
      live.push_back(r);
      anyUsed = true;
    }
  }
  if (!changed || !anyUsed)
    return failure();
  SmallVector<NamedAttribute> attrs;
  for (NamedAttribute a : op->getAttrs()) {
    StringRef name = a.getName().getValue();
    if (name == op.getInputGradAttrName().getValue())
      a.setValue(rewriter.getBoolAttr(flags[0]));
    else if (name == op.getScaleGradAttrName().getValue())
      a.setValue(rewriter.getBoolAttr(flags[1]));
    else if (name == op.getBiasGradAttrName().getValue())
      a.setValue(rewriter.getBoolAttr(flags[2]));
    attrs.push_back(a);
  }
  SmallVector<Type> types;
  for (Value r : live)
    types.push_back(r.getType());
  auto replacement = rewriter.create<Op>(op.getLoc(), types, op->getOperands(), attrs);
  for (auto [old, now] : llvm::zip(live, replacement->getResults()))
    rewriter.replaceAllUsesWith(old, now);
  rewriter.eraseOp(op);
  return success();
}

LogicalResult BatchNormTrainingGradOp::canonicalize(BatchNormTrainingGradOp op,
                                                    PatternRewriter &rewriter) {
  return dropUnusedNormGrads(op, rewriter);
}
LogicalResult LayerNormGradOp::canonicalize(LayerNormGradOp op, PatternRewriter &rewriter) {
  return dropUnusedNormGrads(op, rewriter);
}
LogicalResult GroupNormGradOp::canonicalize(GroupNormGradOp op, PatternRewriter &rewriter) {
  return dropUnusedNormGrads(op, rewriter);
}

//===----------------------------------------------------------------------===//
// Softmax, loss
//===----------------------------------------------------------------------===//

FORGE_INFER(ReluBitmaskOp) {
  auto x = rankedOrNull(adaptor.getInput().getType());
  if (!x || x.getRank() != 2 || !isa<FloatType>(x.getElementType()))
    return failInference(loc, "relu_bitmask takes a static 2-D float tensor");
  inferred.push_back(RankedTensorType::get({x.getDimSize(0), ReluBitmaskOp::rowBytes(x.getDimSize(1))},
                                           IntegerType::get(context, 8)));
  return success();
}

FORGE_INFER(ReluGradBitmaskOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  auto mask = rankedOrNull(adaptor.getMask().getType());
  if (!dy || !mask || dy.getRank() != 2 || !isa<FloatType>(dy.getElementType()))
    return failInference(loc, "relu_grad_bitmask takes a static 2-D float grad_output");
  if (failed(requireShape(loc, mask, {dy.getDimSize(0), ReluBitmaskOp::rowBytes(dy.getDimSize(1))},
                          "mask")))
    return failure();
  inferred.push_back(dy);
  return success();
}

FORGE_INFER(GeluGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  auto x = rankedOrNull(adaptor.getInput().getType());
  if (!dy || dy != x || !isa<FloatType>(dy.getElementType()))
    return failInference(loc, "grad_output and input must be float tensors of one type");
  if (adaptor.getApproximate() != "none" && adaptor.getApproximate() != "tanh")
    return failInference(loc, "approximate must be 'none' or 'tanh'");
  inferred.push_back(dy);
  return success();
}

template <typename Adaptor>
static LogicalResult inferSoftmaxGrad(std::optional<Location> loc, Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  auto y = rankedOrNull(adaptor.getResult().getType());
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!y || y != dy)
    return failInference(loc, "result and grad_output must be static tensors of one type");
  // getAxis() is unsigned: a negative axis arrives as a huge value.
  const int64_t axis = static_cast<int64_t>(adaptor.getAxis());
  if (axis < 0 || axis >= std::max<int64_t>(y.getRank(), 1))
    return failInference(loc, "axis out of range");
  inferred.push_back(y);
  return success();
}

FORGE_INFER(AttentionGradOp) {
  Type q = adaptor.getQ().getType(), k = adaptor.getK().getType(), v = adaptor.getV().getType();
  StringRef layout = adaptor.getLayout();
  auto shape = attentionShape(loc, q, k, v, layout);
  if (failed(shape) ||
      failed(checkAttentionBias(loc, adaptor.getBias() ? adaptor.getBias().getType() : Type(), q,
                                k, *shape, layout)))
    return failure();
  auto o = rankedOrNull(adaptor.getO().getType());
  auto lse = rankedOrNull(adaptor.getLse().getType());
  auto dout = rankedOrNull(adaptor.getGradOutput().getType());
  if (!o || !lse || !dout)
    return failInference(loc, "attention_grad: o, lse and grad_output must be static tensors");
  if (failed(requireShape(loc, o, *shape, "attention_grad: o")) ||
      failed(requireShape(loc, dout, *shape, "attention_grad: grad_output")) ||
      failed(requireShape(loc, lse, attentionLseShape(*shape, layout), "attention_grad: lse")))
    return failure();
  inferred.append({q, k, v});
  return success();
}

OpCost AttentionGradOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  // Five products: the recomputed scores, dv, dP, dq and dk.
  cost.flops = attentionFlops(getQ().getType(), getK().getType(), getV().getType(), getCausal(),
                              getLayout()) * 5 / 2;
  return cost;
}

FORGE_INFER(SoftmaxGradOp) { return inferSoftmaxGrad(loc, adaptor, inferred); }
FORGE_INFER(LogSoftmaxGradOp) { return inferSoftmaxGrad(loc, adaptor, inferred); }

/// cross_entropy_grad's and cross_entropy_with_grad's reduction and the
/// shape of their upstream gradient: [N] for none, a scalar otherwise.
static LogicalResult checkCrossEntropyUpstream(std::optional<Location> loc, StringRef reduction,
                                               RankedTensorType dy, int64_t n) {
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return failInference(loc, "reduction must be none, sum or mean");
  return requireShape(loc, dy, reduction == "none" ? ArrayRef<int64_t>(n) : ArrayRef<int64_t>(),
                      "grad_output");
}

FORGE_INFER(CrossEntropyOp) {
  auto x = rankedOrNull(adaptor.getLogits().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  if (!x || !target || x.getRank() != 2 || !isa<FloatType>(x.getElementType()))
    return failInference(loc, "cross_entropy needs float logits [N, C] and a static target");
  const int64_t n = x.getDimSize(0);
  if (failed(requireShape(loc, target, {n}, "target")))
    return failure();
  inferred.push_back(withShape(x, ArrayRef<int64_t>(n)));
  inferred.push_back(withShape(x, ArrayRef<int64_t>(n)));
  return success();
}

OpCost CrossEntropyOp::computeCost() {
  // Reads the logits twice (max, then the sum of exponentials); 4 FLOPs each.
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  cost.flops = 4 * cast<RankedTensorType>(getLogits().getType()).getNumElements();
  return cost;
}

FORGE_INFER(CrossEntropyGradOp) {
  auto x = rankedOrNull(adaptor.getLogits().getType());
  auto lse = rankedOrNull(adaptor.getLse().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!x || !lse || !target || !dy || x.getRank() != 2)
    return failInference(loc, "cross_entropy_grad needs logits [N, C], lse [N], target [N] and "
                              "grad_output");
  int64_t n = x.getDimSize(0);
  if (failed(requireShape(loc, lse, {n}, "lse")) ||
      failed(requireShape(loc, target, {n}, "target")))
    return failure();
  if (failed(checkCrossEntropyUpstream(loc, adaptor.getReduction(), dy, n)))
    return failure();
  inferred.push_back(x);
  return success();
}

FORGE_INFER(CrossEntropyWithGradOp) {
  auto x = rankedOrNull(adaptor.getLogits().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!x || !target || !dy || x.getRank() != 2 || !isa<FloatType>(x.getElementType()))
    return failInference(loc, "cross_entropy_with_grad needs float logits [N, C], target [N] "
                              "and grad_output");
  const int64_t n = x.getDimSize(0);
  if (failed(requireShape(loc, target, {n}, "target")))
    return failure();
  if (failed(checkCrossEntropyUpstream(loc, adaptor.getReduction(), dy, n)))
    return failure();
  inferred.push_back(withShape(x, ArrayRef<int64_t>(n)));
  inferred.push_back(x);
  return success();
}

OpCost CrossEntropyWithGradOp::computeCost() {
  // One read of the logits from memory (the second read of a row hits L2) and
  // one write of the gradient; the statistics' 4 FLOPs and the gradient's 4.
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  cost.flops = 8 * cast<RankedTensorType>(getLogits().getType()).getNumElements();
  return cost;
}

FORGE_INFER(LinearCrossEntropyWithGradOp) {
  auto x = rankedOrNull(adaptor.getX().getType());
  auto w = rankedOrNull(adaptor.getW().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!x || !w || !target || !dy || x.getRank() != 2 || w.getRank() != 2 ||
      !isa<FloatType>(x.getElementType()) || !isa<FloatType>(w.getElementType()))
    return failInference(loc, "linear_cross_entropy_with_grad needs float x [N, K], w [C, K], "
                              "target [N] and grad_output");
  const int64_t n = x.getDimSize(0), k = x.getDimSize(1), c = w.getDimSize(0);
  if (w.getDimSize(1) != k)
    return failInference(loc, "linear_cross_entropy_with_grad: w's columns are not x's");
  // (classes is unsigned in the adaptor: a negative value reads as a huge one.)
  if (auto classes = adaptor.getClasses();
      classes && (static_cast<int64_t>(*classes) <= 0 || static_cast<int64_t>(*classes) > c))
    return failInference(loc, "linear_cross_entropy_with_grad: classes is outside 1..C");
  if (failed(requireShape(loc, target, {n}, "target")))
    return failure();
  if (failed(checkCrossEntropyUpstream(loc, adaptor.getReduction(), dy, n)))
    return failure();
  // The logits and what is made of them are f32 (f64 for f64 operands); the
  // stored result may be narrower (forge-assign-precision's 2-byte gradient).
  Type f = x.getElementType().isF64() ? x.getElementType() : Float32Type::get(x.getContext());
  inferred.push_back(RankedTensorType::get({n}, f));
  inferred.push_back(RankedTensorType::get({n, c}, f));
  return success();
}

OpCost LinearCrossEntropyWithGradOp::computeCost() {
  // The GEMM's 2 N C K, the statistics' and the gradient's 8 a logit; bytes as
  // run: x and w read, the gradient written (its f16 exponentials written and
  // read back in the same bytes), the loss.
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  auto x = cast<RankedTensorType>(getX().getType());
  auto result = cast<RankedTensorType>(getResult().getType());
  const int64_t n = x.getDimSize(0), k = x.getDimSize(1), c = result.getDimSize(1);
  cost.flops = 2 * n * c * k + 8 * n * c;
  cost.bytes += 2 * result.getNumElements() *
                static_cast<int64_t>(result.getElementType().getIntOrFloatBitWidth() / 8);
  return cost;
}

FORGE_INFER(NllLossGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  if (!dy || !target || target.getRank() < 1)
    return failInference(loc, "nll_loss_grad needs static grad_output and target [N, ...]");
  StringRef reduction = adaptor.getReduction();
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return failInference(loc, "reduction must be none, sum or mean");
  ArrayRef<int64_t> expected = reduction == "none" ? target.getShape() : ArrayRef<int64_t>();
  if (failed(requireShape(loc, dy, expected, "grad_output")))
    return failure();
  const int64_t classes = static_cast<int64_t>(adaptor.getNumClasses());
  if (classes <= 0)
    return failInference(loc, "num_classes must be positive");
  SmallVector<int64_t> shape = {target.getDimSize(0), classes};
  llvm::append_range(shape, target.getShape().drop_front());
  inferred.push_back(withShape(dy, shape));
  return success();
}

//===----------------------------------------------------------------------===//
// Scatters into zeros
//===----------------------------------------------------------------------===//

static LogicalResult checkInputShape(std::optional<Location> loc, ArrayRef<int64_t> shape) {
  for (int64_t d : shape)
    if (d < 0)
      return failInference(loc, "input_shape must be non-negative");
  return success();
}

FORGE_INFER(GatherGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  ArrayRef<int64_t> in = adaptor.getInputShape();
  int64_t axis = adaptor.getAxis();
  if (!dy || !idx || failed(checkInputShape(loc, in)) || axis < 0 || axis >= (int64_t)in.size())
    return failInference(loc, "gather_grad axis out of range");
  SmallVector<int64_t> expected(in.take_front(axis));
  llvm::append_range(expected, idx.getShape());
  llvm::append_range(expected, in.drop_front(axis + 1));
  if (failed(requireShape(loc, dy, expected, "grad_output")))
    return failure();
  inferred.push_back(withShape(dy, in));
  return success();
}

FORGE_INFER(GatherElementsGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  ArrayRef<int64_t> in = adaptor.getInputShape();
  int64_t axis = adaptor.getAxis();
  if (!dy || !idx || failed(checkInputShape(loc, in)) || idx.getRank() != (int64_t)in.size() ||
      axis < 0 || axis >= (int64_t)in.size())
    return failInference(loc, "gather_elements_grad needs indices of the input's rank");
  if (failed(requireShape(loc, dy, idx.getShape(), "grad_output")))
    return failure();
  inferred.push_back(withShape(dy, in));
  return success();
}

FORGE_INFER(SliceGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  ArrayRef<int64_t> in = adaptor.getInputShape();
  int64_t rank = in.size();
  if (!dy || failed(checkInputShape(loc, in)) || (int64_t)adaptor.getStarts().size() != rank ||
      (int64_t)adaptor.getEnds().size() != rank || (int64_t)adaptor.getSteps().size() != rank)
    return failInference(loc, "slice_grad needs starts/ends/steps with one entry per dim");
  SmallVector<int64_t> expected;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t start = adaptor.getStarts()[d], end = adaptor.getEnds()[d],
            step = adaptor.getSteps()[d];
    bool ok = step > 0 ? (0 <= start && start <= end && end <= in[d])
                       : (step < 0 && -1 <= end && end <= start && start <= in[d] - 1);
    if (!ok && !(step < 0 && in[d] == 0))
      return failInference(loc, "slice_grad bounds not normalized in dim " + Twine(d));
    expected.push_back(step > 0 ? std::max<int64_t>(0, (end - start + step - 1) / step)
                                : std::max<int64_t>(0, (start - end - step - 1) / -step));
  }
  if (failed(requireShape(loc, dy, expected, "grad_output")))
    return failure();
  inferred.push_back(withShape(dy, in));
  return success();
}

FORGE_INFER(PadGradOp) {
  auto dy = rankedOrNull(adaptor.getGradOutput().getType());
  if (!dy || (int64_t)adaptor.getPads().size() != 2 * dy.getRank())
    return failInference(loc, "pads need 2 entries per dim");
  StringRef mode = adaptor.getMode();
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return failInference(loc, "pad mode must be constant, reflect, edge or wrap");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < dy.getRank(); ++d) {
    int64_t extent = dy.getDimSize(d) - adaptor.getPads()[d] - adaptor.getPads()[d + dy.getRank()];
    if (extent < 0)
      return failInference(loc, "pads exceed grad_output's extent");
    shape.push_back(extent);
  }
  inferred.push_back(withShape(dy, shape));
  return success();
}
