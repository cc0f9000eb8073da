//===- AssignLayout.cpp - channels-last convolution nets --------------------===//
//
// forge-assign-layout: with layout=nhwc, 2-d convolution nets run
// channels-last ([N, H, W, C]), the layout of cuDNN's tensor-core kernels.
// Invariants:
//  * Every rank-4 conv, conv_transpose and conv_grad_weight becomes its
//    channels_last form between transposes: its rank-4 operands (input,
//    weight, grad_output) transposed [0, 2, 3, 1] before it, its result
//    [0, 3, 1, 2] after it. Weights and weight gradients keep their ONNX
//    layout outside the op (the optimizer and checkpoints see [M, C, kh, kw]).
//  * Batch norms (training, its gradient, inference) over rank-4 inputs are
//    expanded into channels-last reductions over [N, H, W] and pointwise ops
//    with [C] coefficients (XLA's batch-norm expander): forge-fuse then makes
//    the column sums and one loop kernel with the ReLU and residual epilogue,
//    in the channels-last layout with no transpose. Statistics are shifted
//    sums (s = x - x[0, 0, 0, :], the channel's first value, as the NCHW
//    kernel does), so E[s^2] - E[s]^2 does not cancel; the forward and the
//    gradient build the same ops, which CSE merges (one pass of sums).
//  * Then the transposes are sunk through pointwise ops (all operands
//    transposed alike, or scalars, or small tensors that take the inverse
//    transpose) and keepdims reductions, and cancelled in pairs
//    (transpose's folder). A transpose that only moves unit dims becomes a
//    reshape (a view). What is left is a transpose at the net's input, at
//    layout-unaware consumers (average pools), and of each weight and
//    weight gradient.
//  * Rank-4 max pools and their gradients take their channels_last form the
//    same way (their windows run over the middle dims).
//  * With pad-channels (off by default: measured slower on ResNet-50), a
//    channels_last conv (group 1) of fewer than 8 input
//    channels reads pad(x) and pad(w) at 8 channels (zeros), and its weight
//    gradient is computed at 8 and sliced back; the data gradient (if any)
//    keeps the unpadded weight (the padded channels contribute nothing).
//  * A function without a rank-4 convolution is left untouched.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Dialect/ForgeBuilder.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::forge {
#define GEN_PASS_DEF_ASSIGNLAYOUT
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

constexpr int64_t kToLast[] = {0, 2, 3, 1};  // [N, C, H, W] -> [N, H, W, C]
constexpr int64_t kToFirst[] = {0, 3, 1, 2}; // and back

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

bool isStaticRank4Float(Value v) {
  auto t = tensorOf(v);
  return t && t.hasStaticShape() && t.getRank() == 4 && isa<FloatType>(t.getElementType());
}


Value transposed(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> perm) {
  auto t = tensorOf(v);
  return b.create<TransposeOp>(loc, RankedTensorType::get(permutedShape(t.getShape(), perm),
                                                          t.getElementType()),
                               v, b.getDenseI64ArrayAttr(perm));
}

/// Forge ops at one location in the element type of the image being
/// normalized, and its column sums.
struct Math : ForgeBuilder {
  Math(OpBuilder &b, Location loc, Type elem) : ForgeBuilder(b, loc), elem(elem) {}
  Type elem;
  Value constant(double v) { return scalar(v, elem); }
  /// Sum over the rows [N, H, W] of a channels-last image: [C].
  Value columnSum(Value x) {
    return b.create<ReduceSumOp>(loc, x, b.getDenseI64ArrayAttr({0, 1, 2}), b.getBoolAttr(false));
  }
};

/// Batch statistics of channels-last `x` (biased variance).
struct Statistics {
  Value shift;   // [1, 1, 1, C]: x[0, 0, 0, :]
  Value shifted; // x - shift
  Value m1;      // mean of the shifted values, [C]
  Value mean, var, rstd;
  int64_t count; // values per channel, N * H * W
};

Statistics statisticsOf(Math &m, Value x, double epsilon) {
  auto t = tensorOf(x);
  int64_t c = t.getDimSize(3);
  Statistics s;
  s.count = t.getNumElements() / std::max<int64_t>(c, 1);
  OpBuilder &b = m.b;
  s.shift = b.create<SliceOp>(m.loc, RankedTensorType::get({1, 1, 1, c}, t.getElementType()), x,
                              b.getDenseI64ArrayAttr({0, 0, 0, 0}),
                              b.getDenseI64ArrayAttr({1, 1, 1, c}),
                              b.getDenseI64ArrayAttr({1, 1, 1, 1}));
  s.shifted = m.sub(x, s.shift);
  Value inv = m.constant(1.0 / static_cast<double>(s.count));
  s.m1 = m.mul(m.columnSum(s.shifted), inv);
  Value m2 = m.mul(m.columnSum(m.mul(s.shifted, s.shifted)), inv);
  s.var = m.max(m.sub(m2, m.mul(s.m1, s.m1)), m.constant(0.0));
  Value flatShift = b.create<ReshapeOp>(m.loc, RankedTensorType::get({c}, t.getElementType()),
                                        s.shift, b.getDenseI64ArrayAttr({c}));
  s.mean = m.add(flatShift, s.m1);
  s.rstd = m.reciprocal(m.sqrt(m.add(s.var, m.constant(epsilon))));
  return s;
}

bool perChannel(Value v, int64_t c) {
  auto t = tensorOf(v);
  return t && t.getRank() == 1 && t.getDimSize(0) == c;
}

/// A channels_last weight gradient (sliced back from padded channels or not).
bool isWeightGradient(Value v) {
  if (auto slice = v.getDefiningOp<SliceOp>())
    v = slice.getInput();
  return v.getDefiningOp<ConvGradWeightOp>() != nullptr;
}

struct AssignLayoutPass : public mlir::forge::impl::AssignLayoutBase<AssignLayoutPass> {
  using AssignLayoutBase::AssignLayoutBase;

  void runOnOperation() override {
    if (layout == "nchw") {
      markAllAnalysesPreserved();
      return;
    }
    if (layout != "nhwc") {
      getOperation().emitError() << "forge-assign-layout: unknown layout '" << layout
                                 << "' (nchw, nhwc)";
      return signalPassFailure();
    }
    func::FuncOp func = getOperation();
    SmallVector<Operation *> convs, norms, pools;
    func.walk([&](Operation *op) {
      if (op->getParentOfType<FusionOp>())
        return;
      if (isa<ConvOp, ConvTransposeOp, ConvGradWeightOp>(op) &&
          isStaticRank4Float(op->getOperand(0)) && isStaticRank4Float(op->getResult(0)))
        convs.push_back(op);
      else if (isa<MaxPoolOp, MaxPoolGradOp>(op) && isStaticRank4Float(op->getOperand(0)))
        pools.push_back(op);
      else if (isa<BatchNormTrainingOp, BatchNormTrainingGradOp, BatchNormOp>(op) &&
               isStaticRank4Float(op->getOperand(0)))
        norms.push_back(op);
    });
    if (convs.empty()) {
      markAllAnalysesPreserved();
      return;
    }
    for (Operation *op : convs)
      if (Operation *last = convertConvolution(op); padChannels)
        padInputChannels(last);
    for (Operation *op : pools) // max pools take the same form
      convertConvolution(op);
    for (Operation *op : norms)
      expandBatchNorm(op);

    RewritePatternSet patterns(&getContext());
    patterns.add<SinkThroughPointwise, SinkThroughReduction, UnitDimTransposeToReshape>(
        &getContext());
    if (failed(applyPatternsAndFoldGreedily(func, std::move(patterns))))
      return signalPassFailure();
  }

  /// A channels_last conv or conv_grad_weight (group 1) of fewer than 8 input
  /// channels: input (and weight) zero-padded to 8; a weight gradient computed
  /// at 8 channels and sliced.
  void padInputChannels(Operation *op) {
    constexpr int64_t kChannels = 8;
    if (!isa<ConvOp, ConvGradWeightOp>(op) || op->getAttrOfType<IntegerAttr>("group").getInt() != 1)
      return;
    auto in = tensorOf(op->getOperand(0));
    const int64_t c = in.getShape().back();
    if (c >= kChannels || in.getRank() != 4)
      return;
    OpBuilder b(op);
    Location loc = op->getLoc();
    auto padLast = [&](Value v) {
      auto t = tensorOf(v);
      SmallVector<int64_t> pads(2 * t.getRank(), 0), shape(t.getShape());
      pads.back() = kChannels - c;
      shape.back() = kChannels;
      return b.create<PadOp>(loc, RankedTensorType::get(shape, t.getElementType()), v,
                             b.getDenseI64ArrayAttr(pads), b.getStringAttr("constant"),
                             b.getF64FloatAttr(0.0))
          .getResult();
    };
    op->setOperand(0, padLast(op->getOperand(0)));
    if (auto conv = dyn_cast<ConvOp>(op)) {
      conv.getWeightMutable().assign(padLast(conv.getWeight()));
      return;
    }
    // The weight gradient [M, kh, kw, C]: at 8 channels, then its first C.
    Value dw = op->getResult(0);
    auto type = tensorOf(dw);
    SmallVector<int64_t> wide(type.getShape());
    wide.back() = kChannels;
    dw.setType(RankedTensorType::get(wide, type.getElementType()));
    b.setInsertionPointAfter(op);
    SmallVector<int64_t> starts(4, 0), ends(type.getShape()), steps(4, 1);
    auto slice = b.create<SliceOp>(loc, type, dw, b.getDenseI64ArrayAttr(starts),
                                   b.getDenseI64ArrayAttr(ends), b.getDenseI64ArrayAttr(steps));
    dw.replaceAllUsesExcept(slice.getResult(), slice);
  }

  /// A convolution in its channels_last form between transposes.
  Operation *convertConvolution(Operation *op) {
    OpBuilder b(op);
    Location loc = op->getLoc();
    SmallVector<Value> operands;
    for (Value v : op->getOperands())
      operands.push_back(isStaticRank4Float(v) ? transposed(b, loc, v, kToLast) : v);
    Operation *last = b.clone(*op);
    last->setOperands(operands);
    last->setAttr("channels_last", b.getBoolAttr(true));
    auto type = tensorOf(op->getResult(0));
    last->getResult(0).setType(
        RankedTensorType::get(permutedShape(type.getShape(), kToLast), type.getElementType()));
    op->getResult(0).replaceAllUsesWith(transposed(b, loc, last->getResult(0), kToFirst));
    op->erase();
    return last;
  }

  void expandBatchNorm(Operation *op) {
    OpBuilder b(op);
    Location loc = op->getLoc();
    auto xType = tensorOf(op->getOperand(0));
    int64_t c = xType.getDimSize(1);
    Math m(b, loc, xType.getElementType());
    auto back = [&](Value v) { return transposed(b, loc, v, kToFirst); };
    if (auto norm = dyn_cast<BatchNormTrainingOp>(op)) {
      if (!perChannel(norm.getScale(), c) || !perChannel(norm.getBias(), c) ||
          !perChannel(norm.getRunningMean(), c) || !perChannel(norm.getRunningVar(), c))
        return;
      Value x = transposed(b, loc, norm.getInput(), kToLast);
      Statistics s = statisticsOf(m, x, norm.getEpsilon().convertToDouble());
      Value a = m.mul(norm.getScale(), s.rstd);
      Value y = m.add(m.mul(m.sub(x, s.mean), a), norm.getBias());
      double momentum = norm.getMomentum().convertToDouble();
      double unbias = norm.getUnbiasedVar() && s.count > 1
                          ? static_cast<double>(s.count) / static_cast<double>(s.count - 1)
                          : 1.0;
      Value keep = m.constant(momentum);
      Value newMean = m.add(m.mul(norm.getRunningMean(), keep),
                            m.mul(s.mean, m.constant(1.0 - momentum)));
      Value newVar = m.add(m.mul(norm.getRunningVar(), keep),
                           m.mul(s.var, m.constant(unbias * (1.0 - momentum))));
      norm.getResult().replaceAllUsesWith(back(y));
      norm.getNewRunningMean().replaceAllUsesWith(newMean);
      norm.getNewRunningVar().replaceAllUsesWith(newVar);
      op->erase();
      return;
    }
    if (auto norm = dyn_cast<BatchNormOp>(op)) {
      if (!perChannel(norm.getScale(), c) || !perChannel(norm.getBias(), c) ||
          !perChannel(norm.getMean(), c) || !perChannel(norm.getVar(), c))
        return;
      Value x = transposed(b, loc, norm.getInput(), kToLast);
      Value rstd =
          m.reciprocal(m.sqrt(m.add(norm.getVar(), m.constant(norm.getEpsilon().convertToDouble()))));
      Value y = m.add(m.mul(m.sub(x, norm.getMean()), m.mul(norm.getScale(), rstd)),
                      norm.getBias());
      norm.getResult().replaceAllUsesWith(back(y));
      op->erase();
      return;
    }
    auto grad = cast<BatchNormTrainingGradOp>(op);
    if (!perChannel(grad.getScale(), c) || grad.getGradOutput().getType() != xType)
      return;
    Value x = transposed(b, loc, grad.getInput(), kToLast);
    Value dy = transposed(b, loc, grad.getGradOutput(), kToLast);
    Statistics s = statisticsOf(m, x, grad.getEpsilon().convertToDouble());
    // dbias = sum dy; dscale = sum dy * xhat = rstd * (sum dy * s - m1 * sum dy);
    // dx = scale * rstd * (dy - dbias / M - xhat * dscale / M).
    Value sumDy = m.columnSum(dy);
    Value dscale = m.mul(s.rstd, m.sub(m.columnSum(m.mul(dy, s.shifted)), m.mul(s.m1, sumDy)));
    Value g = m.mul(grad.getScale(), s.rstd);
    Value invCount = m.constant(-1.0 / static_cast<double>(s.count));
    Value c1 = m.mul(m.mul(g, s.rstd), m.mul(dscale, invCount)); // per (x - mean)
    Value c0 = m.mul(g, m.mul(sumDy, invCount));
    SmallVector<Value> results;
    if (grad.getInputGrad())
      results.push_back(back(m.add(m.add(m.mul(dy, g), m.mul(m.sub(x, s.mean), c1)), c0)));
    Type paramElem = ForgeBuilder::elementOf(grad.getScale());
    if (grad.getScaleGrad())
      results.push_back(m.castTo(dscale, paramElem));
    if (grad.getBiasGrad())
      results.push_back(m.castTo(sumDy, paramElem));
    for (auto [old, now] : llvm::zip(grad.getResults(), results))
      old.replaceAllUsesWith(now);
    op->erase();
  }

  /// op(T(a), T(b), scalar...) = T(op(a, b, scalar...)) for a pointwise op:
  /// the transpose moves toward the consumers, where it meets the inverse
  /// transpose of the next channels-last op and folds away. An operand that
  /// is not transposed alike may be a scalar, a small tensor of the same
  /// rank (at most 1/16 of the result), which takes the inverse transpose, or
  /// a broadcast of one, which then broadcasts its inverse transpose.
  struct SinkThroughPointwise : public RewritePattern {
    SinkThroughPointwise(MLIRContext *ctx) : RewritePattern(MatchAnyOpTypeTag(), 1, ctx) {}
    LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rw) const override {
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
          op->getNumResults() != 1 || op->getNumRegions() != 0 || isa<FusionOp>(op))
        return rw.notifyMatchFailure(op, "not a pointwise op");
      auto result = tensorOf(op->getResult(0));
      if (!result || !result.hasStaticShape())
        return rw.notifyMatchFailure(op, "no static result");
      std::optional<SmallVector<int64_t>> perm;
      for (Value v : op->getOperands())
        if (auto t = v.getDefiningOp<TransposeOp>()) {
          // A weight gradient is transposed once, where it is made, for the
          // optimizer's pointwise ops (several read it: one transpose each).
          if (isWeightGradient(t.getInput()))
            return rw.notifyMatchFailure(op, "a weight gradient's transpose stays");
          if (perm && ArrayRef<int64_t>(*perm) != t.getPerm())
            return rw.notifyMatchFailure(op, "operands transposed differently");
          perm = SmallVector<int64_t>(t.getPerm());
        }
      if (!perm || static_cast<int64_t>(perm->size()) != result.getRank())
        return rw.notifyMatchFailure(op, "no transposed operand");
      SmallVector<int64_t> inv = inversePermutation(*perm);
      SmallVector<Value> inner;
      SmallVector<std::pair<unsigned, Value>> toTranspose;
      SmallVector<std::pair<unsigned, BroadcastOp>> toBroadcast;
      for (auto [i, v] : llvm::enumerate(op->getOperands())) {
        auto t = tensorOf(v);
        if (auto tr = v.getDefiningOp<TransposeOp>()) {
          inner.push_back(tr.getInput());
        } else if (t && t.getRank() == 0) {
          inner.push_back(v);
        } else if (t && t.hasStaticShape() && t.getRank() == result.getRank() &&
                   t.getNumElements() * 16 <= result.getNumElements()) {
          inner.push_back(Value());
          toTranspose.push_back({static_cast<unsigned>(i), v});
        } else if (auto bc = v.getDefiningOp<BroadcastOp>();
                   bc && tensorOf(bc.getInput()).getRank() == result.getRank() &&
                   tensorOf(bc.getInput()).getNumElements() * 16 <= result.getNumElements()) {
          // A broadcast of a small tensor (a global pool's gradient): broadcast
          // its transpose instead.
          inner.push_back(Value());
          toBroadcast.push_back({static_cast<unsigned>(i), bc});
        } else {
          return rw.notifyMatchFailure(op, "an operand is neither transposed nor small");
        }
      }
      for (auto [i, v] : toTranspose)
        inner[i] = transposed(rw, op->getLoc(), v, inv);
      for (auto [i, bc] : toBroadcast) {
        Value small = transposed(rw, op->getLoc(), bc.getInput(), inv);
        SmallVector<int64_t> shape = permutedShape(bc.getShape(), inv);
        inner[i] = rw.create<BroadcastOp>(
            bc.getLoc(), RankedTensorType::get(shape, tensorOf(bc.getResult()).getElementType()),
            small, rw.getDenseI64ArrayAttr(shape));
      }
      Operation *moved = rw.clone(*op);
      moved->setOperands(inner);
      moved->getResult(0).setType(
          RankedTensorType::get(permutedShape(result.getShape(), inv), result.getElementType()));
      rw.replaceOp(op, transposed(rw, op->getLoc(), moved->getResult(0), *perm));
      return success();
    }
  };

  /// reduce(T(a), axes, keepdims) = T(reduce(a, perm[axes], keepdims)); without
  /// keepdims, when the dims it keeps stay in their order (a conv bias's
  /// gradient, dy summed over [N, H, W] to [C]), reduce(a, perm[axes]) alone.
  struct SinkThroughReduction : public RewritePattern {
    SinkThroughReduction(MLIRContext *ctx) : RewritePattern(MatchAnyOpTypeTag(), 1, ctx) {}
    LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rw) const override {
      if (!isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp>(op))
        return rw.notifyMatchFailure(op, "not a reduction");
      auto keep = op->getAttrOfType<BoolAttr>("keepdims");
      auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes");
      auto tr = op->getOperand(0).getDefiningOp<TransposeOp>();
      if (!keep || !axes || !tr)
        return rw.notifyMatchFailure(op, "not a reduction of a transpose");
      ArrayRef<int64_t> perm = tr.getPerm();
      SmallVector<int64_t> innerAxes;
      for (int64_t a : axes.asArrayRef())
        innerAxes.push_back(perm[a]);
      llvm::sort(innerAxes);
      if (!keep.getValue()) {
        // The kept dims, in the result's order, as dims of `a`: increasing means
        // the reduction of `a` yields them in that order already.
        int64_t last = -1;
        for (auto [j, p] : llvm::enumerate(perm)) {
          if (llvm::is_contained(axes.asArrayRef(), static_cast<int64_t>(j)))
            continue;
          if (p < last)
            return rw.notifyMatchFailure(op, "the kept dims change order");
          last = p;
        }
        Operation *moved = rw.clone(*op);
        moved->setOperand(0, tr.getInput());
        moved->setAttr("axes", rw.getDenseI64ArrayAttr(innerAxes));
        rw.replaceOp(op, moved->getResults());
        return success();
      }
      auto result = tensorOf(op->getResult(0));
      Operation *moved = rw.clone(*op);
      moved->setOperand(0, tr.getInput());
      moved->setAttr("axes", rw.getDenseI64ArrayAttr(innerAxes));
      moved->getResult(0).setType(RankedTensorType::get(permutedShape(result.getShape(), inversePermutation(perm)),
                                                        result.getElementType()));
      rw.replaceOp(op, transposed(rw, op->getLoc(), moved->getResult(0), perm));
      return success();
    }
  };

  /// A transpose that keeps the order of the dims larger than 1 moves no
  /// element: a reshape (a view).
  struct UnitDimTransposeToReshape : public OpRewritePattern<TransposeOp> {
    using OpRewritePattern::OpRewritePattern;
    LogicalResult matchAndRewrite(TransposeOp op, PatternRewriter &rw) const override {
      auto in = tensorOf(op.getInput());
      auto out = tensorOf(op.getResult());
      if (!in || !in.hasStaticShape())
        return rw.notifyMatchFailure(op, "no static input");
      int64_t previous = -1;
      for (int64_t p : op.getPerm()) {
        if (in.getDimSize(p) == 1)
          continue;
        if (p < previous)
          return rw.notifyMatchFailure(op, "moves a dim larger than 1");
        previous = p;
      }
      rw.replaceOpWithNewOp<ReshapeOp>(op, out, op.getInput(),
                                       rw.getDenseI64ArrayAttr(out.getShape()));
      return success();
    }
  };
};

} // namespace
