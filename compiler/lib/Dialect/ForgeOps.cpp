//===- ForgeOps.cpp - type inference, verifiers, folders and costs ---------===//
//
// Invariant: after import every shape is static, so type inference here never
// sees a dynamic dimension; it reports one as an error rather than guessing.
//
//===----------------------------------------------------------------------===//
#include "forge/Dialect/ForgeDialect.h"

#include "InferenceUtils.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::detail;

FailureOr<SmallVector<int64_t>> mlir::forge::broadcastShapes(ArrayRef<int64_t> a,
                                                             ArrayRef<int64_t> b) {
  size_t rank = std::max(a.size(), b.size());
  SmallVector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return failure();
    out[i] = da == 1 ? db : da;
  }
  return out;
}

LogicalResult mlir::forge::inferBroadcastType(std::optional<Location> loc, ValueRange operands,
                                              Type resultElement,
                                              SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t> shape;
  Type element;
  for (Value v : operands) {
    auto t = rankedOrNull(v.getType());
    if (!t)
      return failInference(loc, "operands must be statically shaped tensors");
    auto b = broadcastShapes(shape, t.getShape());
    if (failed(b))
      return failInference(loc, "operand shapes are not broadcast-compatible");
    shape = *b;
  }
  // `where` passes its i1 condition first; all value operands share one type.
  for (Value v : operands.drop_front(operands.size() == 3 ? 1 : 0)) {
    Type e = cast<RankedTensorType>(v.getType()).getElementType();
    if (element && e != element)
      return failInference(loc, "operand element types differ");
    element = e;
  }
  inferred.push_back(RankedTensorType::get(shape, resultElement ? resultElement : element));
  return success();
}

LogicalResult mlir::forge::inferReduceType(std::optional<Location> loc, Type input,
                                           ArrayRef<int64_t> axes, bool keepdims,
                                           Type resultElement, SmallVectorImpl<Type> &inferred) {
  auto t = rankedOrNull(input);
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < t.getRank(); ++d) {
    bool reduced = llvm::is_contained(axes, d);
    if (!reduced)
      shape.push_back(t.getDimSize(d));
    else if (keepdims)
      shape.push_back(1);
  }
  for (int64_t a : axes)
    if (a < 0 || a >= t.getRank())
      return failInference(loc, "reduction axis out of range");
  inferred.push_back(RankedTensorType::get(shape, resultElement ? resultElement : t.getElementType()));
  return success();
}

LogicalResult mlir::forge::checkZeroOutputs(std::optional<Location> loc,
                                            std::optional<ArrayRef<int64_t>> zeroOutputs,
                                            Type result) {
  if (!zeroOutputs)
    return success();
  int64_t n = cast<RankedTensorType>(result).getNumElements();
  if (zeroOutputs->size() != 2 || (*zeroOutputs)[0] < 0 || (*zeroOutputs)[0] >= (*zeroOutputs)[1] ||
      (*zeroOutputs)[1] > n)
    return failInference(loc, "zero_outputs must be [begin, end) with 0 <= begin < end <= " +
                                  std::to_string(n) + " (the result's elements)");
  return success();
}

#define FORGE_INFER(OP)                                                                  \
  LogicalResult OP::inferReturnTypes(MLIRContext *context, std::optional<Location> loc, \
                                     Adaptor adaptor, SmallVectorImpl<Type> &inferred)

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

FORGE_INFER(IsNaNOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  inferred.push_back(RankedTensorType::get(t.getShape(), IntegerType::get(context, 1)));
  return success();
}

FORGE_INFER(IsInfOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  inferred.push_back(RankedTensorType::get(t.getShape(), IntegerType::get(context, 1)));
  return success();
}

FORGE_INFER(CastOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  inferred.push_back(RankedTensorType::get(t.getShape(), adaptor.getTo()));
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return {};
}

FORGE_INFER(WhereOp) {
  SmallVector<Type> shapeOnly;
  if (failed(inferBroadcastType(loc, adaptor.getOperands(), nullptr, shapeOnly)))
    return failure();
  auto x = cast<RankedTensorType>(adaptor.getX().getType());
  inferred.push_back(withShape(x, cast<RankedTensorType>(shapeOnly[0]).getShape()));
  return success();
}

//===----------------------------------------------------------------------===//
// Library ops
//===----------------------------------------------------------------------===//

FORGE_INFER(MatMulOp) {
  auto a = rankedOrNull(adaptor.getLhs().getType());
  auto b = rankedOrNull(adaptor.getRhs().getType());
  if (!a || !b || a.getRank() == 0 || b.getRank() == 0)
    return failInference(loc, "matmul operands must be static tensors of rank >= 1");
  SmallVector<int64_t> as(a.getShape()), bs(b.getShape());
  bool aVec = as.size() == 1, bVec = bs.size() == 1;
  if ((aVec && adaptor.getTransA()) || (bVec && adaptor.getTransB()))
    return failInference(loc, "matmul transpose flags need operands of rank >= 2");
  if (adaptor.getTransA())
    std::swap(as[as.size() - 1], as[as.size() - 2]);
  if (adaptor.getTransB())
    std::swap(bs[bs.size() - 1], bs[bs.size() - 2]);
  if (aVec)
    as.insert(as.begin(), 1);
  if (bVec)
    bs.push_back(1);
  int64_t m = as[as.size() - 2], k = as.back(), k2 = bs[bs.size() - 2], n = bs.back();
  if (k != k2) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << "matmul contraction dims differ: lhs " << a << (adaptor.getTransA() ? " (transposed)" : "")
       << " has " << k << ", rhs " << b << (adaptor.getTransB() ? " (transposed)" : "") << " has "
       << k2;
    return failInference(loc, text);
  }
  auto batch = broadcastShapes(ArrayRef<int64_t>(as).drop_back(2), ArrayRef<int64_t>(bs).drop_back(2));
  if (failed(batch))
    return failInference(loc, "matmul batch dims are not broadcast-compatible");
  SmallVector<int64_t> shape = *batch;
  if (!aVec)
    shape.push_back(m);
  if (!bVec)
    shape.push_back(n);
  inferred.push_back(withShape(a, shape));
  return success();
}

OpCost MatMulOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  auto a = cast<RankedTensorType>(getLhs().getType());
  int64_t k = getTransA() ? a.getShape()[a.getRank() - 2] : a.getShape().back();
  cost.flops = 2 * k * cast<RankedTensorType>(getType()).getNumElements();
  return cost;
}

namespace {
/// matmul(transpose(x), y) with a transpose of x's last two dims only =
/// matmul(x, y) with the operand's flag flipped (likewise for the rhs).
struct FoldTransposeIntoMatMul : public OpRewritePattern<MatMulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MatMulOp op, PatternRewriter &rewriter) const override {
    auto swapsLast2 = [](TransposeOp t) {
      ArrayRef<int64_t> perm = t.getPerm();
      int64_t r = static_cast<int64_t>(perm.size());
      if (r < 2)
        return false;
      for (int64_t i = 0; i < r - 2; ++i)
        if (perm[i] != i)
          return false;
      return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
    };
    auto lhs = op.getLhs().getDefiningOp<TransposeOp>();
    auto rhs = op.getRhs().getDefiningOp<TransposeOp>();
    bool foldLhs = lhs && swapsLast2(lhs), foldRhs = rhs && swapsLast2(rhs);
    if (!foldLhs && !foldRhs)
      return rewriter.notifyMatchFailure(op, "no operand is a transpose of its last two dims");
    rewriter.modifyOpInPlace(op, [&] {
      if (foldLhs) {
        op.getLhsMutable().assign(lhs.getInput());
        op.setTransA(!op.getTransA());
      }
      if (foldRhs) {
        op.getRhsMutable().assign(rhs.getInput());
        op.setTransB(!op.getTransB());
      }
    });
    return success();
  }
};
/// `perm` with its last two entries swapped (= the transpose by `perm`
/// followed by a swap of the last two dims).
SmallVector<int64_t> swapLastTwo(ArrayRef<int64_t> perm) {
  SmallVector<int64_t> q(perm);
  std::swap(q[q.size() - 2], q[q.size() - 1]);
  return q;
}

bool isIdentityPerm(ArrayRef<int64_t> perm) {
  for (auto [i, p] : llvm::enumerate(perm))
    if (static_cast<int64_t>(i) != p)
      return false;
  return true;
}

/// matmul(transpose(y, p), ...) where p moves y's innermost dim but p with
/// its last two entries swapped (q) does not: transpose(y, p) is
/// transpose(y, q) with its last two dims swapped, which the operand's flag
/// takes. The remaining transpose copies whole rows (coalesced) and often
/// equals one that exists already (attention: K^T = the head split of K,
/// transposed by the GEMM; CSE then merges it with K's head split).
struct SplitTransposeForMatMul : public OpRewritePattern<MatMulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MatMulOp op, PatternRewriter &rewriter) const override {
    auto split = [&](Value operand) -> Value {
      auto t = operand.getDefiningOp<TransposeOp>();
      if (!t || t.getPerm().size() < 3)
        return nullptr;
      ArrayRef<int64_t> p = t.getPerm();
      int64_t last = static_cast<int64_t>(p.size()) - 1;
      SmallVector<int64_t> q = swapLastTwo(p);
      if (p[last] == last || q[last] != last || isIdentityPerm(q))
        return nullptr;
      return rewriter.create<TransposeOp>(t.getLoc(), t.getInput(),
                                          rewriter.getDenseI64ArrayAttr(q));
    };
    rewriter.setInsertionPoint(op);
    Value lhs = split(op.getLhs()), rhs = split(op.getRhs());
    if (!lhs && !rhs)
      return rewriter.notifyMatchFailure(op, "no operand is a transpose that moves its "
                                             "innermost dim and a row-keeping one after a swap");
    rewriter.modifyOpInPlace(op, [&] {
      if (lhs) {
        op.getLhsMutable().assign(lhs);
        op.setTransA(!op.getTransA());
      }
      if (rhs) {
        op.getRhsMutable().assign(rhs);
        op.setTransB(!op.getTransB());
      }
    });
    return success();
  }
};
} // namespace

void MatMulOp::getCanonicalizationPatterns(RewritePatternSet &patterns, MLIRContext *context) {
  patterns.add<FoldTransposeIntoMatMul, SplitTransposeForMatMul>(context);
}

namespace {
/// transpose(matmul(a, b), p) where p moves the product's innermost dim but
/// p composed after a swap of the last two dims (c) does not: the product is
/// computed transposed, matmul(b, a) with the flags swapped and flipped
/// ((AB)^T = B^T A^T), then transposed by c, which copies whole rows (or is
/// the identity: no transpose at all). Attention's dK = (Q^T dS)^T.
struct MatMulOfTransposedResult : public OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op, PatternRewriter &rewriter) const override {
    auto matmul = op.getInput().getDefiningOp<MatMulOp>();
    if (!matmul || !matmul->hasOneUse())
      return rewriter.notifyMatchFailure(op, "not the only user of a matmul");
    auto a = cast<RankedTensorType>(matmul.getLhs().getType());
    auto b = cast<RankedTensorType>(matmul.getRhs().getType());
    auto m = cast<RankedTensorType>(matmul.getType());
    if (a.getRank() < 2 || b.getRank() < 2 || m.getRank() < 2)
      return rewriter.notifyMatchFailure(op, "a matrix-vector product");
    ArrayRef<int64_t> p = op.getPerm();
    int64_t last = m.getRank() - 1;
    // c[i] = s[p[i]] with s the swap of the last two dims.
    SmallVector<int64_t> c;
    for (int64_t d : p)
      c.push_back(d == last ? last - 1 : d == last - 1 ? last : d);
    if (p[last] == last || c[last] != last)
      return rewriter.notifyMatchFailure(op, "the transpose keeps the innermost dim, or moves "
                                             "it after a swap too");
    SmallVector<int64_t> shape(m.getShape());
    std::swap(shape[last - 1], shape[last]);
    Value product = rewriter.create<MatMulOp>(
        matmul.getLoc(), RankedTensorType::get(shape, m.getElementType()), matmul.getRhs(),
        matmul.getLhs(), rewriter.getBoolAttr(!matmul.getTransB()),
        rewriter.getBoolAttr(!matmul.getTransA()));
    if (!isIdentityPerm(c))
      product = rewriter.create<TransposeOp>(op.getLoc(), product,
                                             rewriter.getDenseI64ArrayAttr(c));
    rewriter.replaceOp(op, product);
    rewriter.eraseOp(matmul);
    return success();
  }
};
} // namespace

namespace {
bool isMatrixTranspose(Value v) {
  auto t = v.getDefiningOp<TransposeOp>();
  return t && t.getPerm().size() == 2 && t.getPerm()[0] == 1;
}

/// gemm(transpose(A), B) = gemm(A, B) with transA flipped (likewise B).
struct FoldTransposeIntoGemm : public OpRewritePattern<GemmOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GemmOp op, PatternRewriter &rewriter) const override {
    bool foldA = isMatrixTranspose(op.getA()), foldB = isMatrixTranspose(op.getB());
    if (!foldA && !foldB)
      return rewriter.notifyMatchFailure(op, "no operand is a matrix transpose");
    rewriter.modifyOpInPlace(op, [&] {
      if (foldA) {
        op.getAMutable().assign(op.getA().getDefiningOp<TransposeOp>().getInput());
        op.setTransA(!op.getTransA());
      }
      if (foldB) {
        op.getBMutable().assign(op.getB().getDefiningOp<TransposeOp>().getInput());
        op.setTransB(!op.getTransB());
      }
    });
    return success();
  }
};

/// transpose(gemm(A, B)) without C = gemm(B, A) with the flags swapped and
/// flipped ((op(A) op(B))^T = op(B)^T op(A)^T): the product is written in the
/// transposed layout directly.
struct GemmOfTransposedResult : public OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op, PatternRewriter &rewriter) const override {
    auto gemm = op.getInput().getDefiningOp<GemmOp>();
    if (!gemm || op.getPerm().size() != 2 || op.getPerm()[0] != 1)
      return rewriter.notifyMatchFailure(op, "not a matrix transpose of a gemm");
    if (gemm.getC() || !gemm->hasOneUse())
      return rewriter.notifyMatchFailure(op, "the gemm has a C operand or other users");
    auto swapped = rewriter.create<GemmOp>(
        gemm.getLoc(), op.getType(), gemm.getB(), gemm.getA(), Value(),
        rewriter.getBoolAttr(!gemm.getTransB()), rewriter.getBoolAttr(!gemm.getTransA()),
        gemm.getAlphaAttr(), gemm.getBetaAttr());
    rewriter.replaceOp(op, swapped.getResult());
    rewriter.eraseOp(gemm);
    return success();
  }
};
} // namespace

void GemmOp::getCanonicalizationPatterns(RewritePatternSet &patterns, MLIRContext *context) {
  patterns.add<FoldTransposeIntoGemm>(context);
}

void TransposeOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                              MLIRContext *context) {
  patterns.add<GemmOfTransposedResult, MatMulOfTransposedResult>(context);
}

/// [M, N] of a gemm-like op (gemm, scaled_gemm): rank-2 operands whose
/// contraction dims agree, a C (if any) broadcasting to [M, N].
static LogicalResult inferGemmShape(std::optional<Location> loc, StringRef op, Type aType,
                                    Type bType, bool transA, bool transB, Value c,
                                    SmallVectorImpl<int64_t> &mn) {
  auto a = rankedOrNull(aType);
  auto b = rankedOrNull(bType);
  if (!a || !b || a.getRank() != 2 || b.getRank() != 2)
    return failInference(loc, (op + " operands must be static rank-2 tensors").str());
  int64_t m = transA ? a.getDimSize(1) : a.getDimSize(0);
  int64_t ka = transA ? a.getDimSize(0) : a.getDimSize(1);
  int64_t kb = transB ? b.getDimSize(1) : b.getDimSize(0);
  int64_t n = transB ? b.getDimSize(0) : b.getDimSize(1);
  if (ka != kb) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << op << " contraction dims differ: A " << a << (transA ? " (transA)" : "") << " has "
       << ka << ", B " << b << (transB ? " (transB)" : "") << " has " << kb;
    return failInference(loc, text);
  }
  if (c) {
    auto ct = rankedOrNull(c.getType());
    if (!ct || failed(broadcastShapes({m, n}, ct.getShape())) || ct.getRank() > 2)
      return failInference(loc, (op + " C does not broadcast to [M, N]").str());
  }
  mn.assign({m, n});
  return success();
}

FORGE_INFER(GemmOp) {
  SmallVector<int64_t> mn;
  if (failed(inferGemmShape(loc, "gemm", adaptor.getA().getType(), adaptor.getB().getType(),
                            adaptor.getTransA(), adaptor.getTransB(), adaptor.getC(), mn)))
    return failure();
  inferred.push_back(withShape(cast<RankedTensorType>(adaptor.getA().getType()), mn));
  return success();
}

/// 2 K FLOPs per output element of a gemm-like op.
template <typename GemmLike> static OpCost gemmCost(GemmLike op) {
  OpCost cost = estimateDefaultCost(op.getOperation(), 0);
  auto a = cast<RankedTensorType>(op.getA().getType());
  int64_t k = op.getTransA() ? a.getDimSize(0) : a.getDimSize(1);
  cost.flops = 2 * k * cast<RankedTensorType>(op.getType()).getNumElements();
  return cost;
}

OpCost GemmOp::computeCost() { return gemmCost(*this); }

FORGE_INFER(ScaledGemmOp) {
  SmallVector<int64_t> mn;
  if (failed(inferGemmShape(loc, "scaled_gemm", adaptor.getA().getType(),
                            adaptor.getB().getType(), adaptor.getTransA(), adaptor.getTransB(),
                            adaptor.getC(), mn)))
    return failure();
  // The float8 operands decode to f32, the product's type (stored bf16 where
  // forge-assign-precision says so).
  inferred.push_back(RankedTensorType::get(mn, Float32Type::get(context)));
  return success();
}

LogicalResult ScaledGemmOp::verify() {
  auto isFloat8 = [](Value v) {
    Type e = cast<RankedTensorType>(v.getType()).getElementType();
    return e.isFloat8E4M3FN() || e.isFloat8E5M2();
  };
  if (!isFloat8(getA()) || !isFloat8(getB()))
    return emitOpError("takes float8 (f8E4M3FN or f8E5M2) operands");
  for (Value s : {getAScale(), getBScale()}) {
    auto t = cast<RankedTensorType>(s.getType());
    if (t.getRank() != 0 || !t.getElementType().isF32())
      return emitOpError("takes f32 scalar scales");
  }
  return success();
}

OpCost ScaledGemmOp::computeCost() { return gemmCost(*this); }

FORGE_INFER(ConvOp) {
  bool last = adaptor.getChannelsLast();
  auto x = channelsFirst(rankedOrNull(adaptor.getInput().getType()), last);
  auto w = channelsFirst(rankedOrNull(adaptor.getWeight().getType()), last);
  if (!x || !w || x.getRank() < 3 || w.getRank() != x.getRank())
    return failInference(loc, "conv input and weight must be static N-d tensors of equal rank >= 3");
  int64_t spatial = x.getRank() - 2;
  if (failed(checkSpatialAttrs(loc, spatial, adaptor.getStrides(), adaptor.getPads(),
                               adaptor.getDilations())))
    return failure();
  SmallVector<int64_t> shape = {x.getDimSize(0), w.getDimSize(0)};
  for (int64_t i = 0; i < spatial; ++i)
    shape.push_back(windowOutput(x.getDimSize(i + 2), w.getDimSize(i + 2),
                                 adaptor.getStrides()[i], adaptor.getPads()[i],
                                 adaptor.getPads()[i + spatial], adaptor.getDilations()[i],
                                 false));
  inferred.push_back(withShape(x, last ? channelsLastShape(shape) : shape));
  return success();
}

LogicalResult ConvOp::verify() {
  auto x = channelsFirst(cast<RankedTensorType>(getInput().getType()), getChannelsLast());
  auto w = channelsFirst(cast<RankedTensorType>(getWeight().getType()), getChannelsLast());
  int64_t group = getGroup();
  if (group <= 0 || x.getDimSize(1) != w.getDimSize(1) * group)
    return emitOpError() << "input channels " << x.getDimSize(1) << " != weight channels "
                         << w.getDimSize(1) << " x group " << group;
  if (w.getDimSize(0) % group != 0)
    return emitOpError("output channels must be divisible by group");
  if (getBias() && cast<RankedTensorType>(getBias().getType()).getNumElements() != w.getDimSize(0))
    return emitOpError("bias must have one entry per output channel");
  return success();
}

OpCost ConvOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t perOutput = w.getNumElements() / w.getDimSize(0); // dim 0 in both layouts
  cost.flops = 2 * perOutput * cast<RankedTensorType>(getType()).getNumElements();
  return cost;
}

FORGE_INFER(ConvTransposeOp) {
  bool last = adaptor.getChannelsLast();
  auto x = channelsFirst(rankedOrNull(adaptor.getInput().getType()), last);
  auto w = channelsFirst(rankedOrNull(adaptor.getWeight().getType()), last);
  if (!x || !w || x.getRank() < 3 || w.getRank() != x.getRank())
    return failInference(loc, "conv_transpose input and weight must be static N-d tensors");
  int64_t spatial = x.getRank() - 2;
  if (failed(checkSpatialAttrs(loc, spatial, adaptor.getStrides(), adaptor.getPads(),
                               adaptor.getDilations())) ||
      (int64_t)adaptor.getOutputPadding().size() != spatial)
    return failure();
  SmallVector<int64_t> shape = {x.getDimSize(0),
                               w.getDimSize(1) * static_cast<int64_t>(adaptor.getGroup())};
  for (int64_t i = 0; i < spatial; ++i)
    shape.push_back(adaptor.getStrides()[i] * (x.getDimSize(i + 2) - 1) +
                    adaptor.getOutputPadding()[i] +
                    (w.getDimSize(i + 2) - 1) * adaptor.getDilations()[i] + 1 -
                    adaptor.getPads()[i] - adaptor.getPads()[i + spatial]);
  inferred.push_back(withShape(x, last ? channelsLastShape(shape) : shape));
  return success();
}

OpCost ConvTransposeOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  auto w = cast<RankedTensorType>(getWeight().getType());
  auto x = cast<RankedTensorType>(getInput().getType());
  cost.flops = 2 * x.getNumElements() * (w.getNumElements() / w.getDimSize(0));
  return cost;
}

/// A pool's result: its windows over the spatial dims of the input, which is
/// [N, C, spatial...] or, with `channelsLast`, [N, spatial..., C].
template <typename Adaptor>
static LogicalResult inferPool(std::optional<Location> loc, Adaptor adaptor,
                               SmallVectorImpl<Type> &inferred, bool channelsLast = false) {
  auto x = channelsFirst(rankedOrNull(adaptor.getInput().getType()), channelsLast);
  if (!x)
    return failInference(loc, "pool input must be a static N-d tensor");
  auto shape = poolOutputShape(loc, x.getShape(), adaptor.getKernelShape(), adaptor.getStrides(),
                               adaptor.getPads(), adaptor.getDilations(), adaptor.getCeilMode());
  if (failed(shape))
    return failure();
  inferred.push_back(withShape(x, channelsLast ? channelsLastShape(*shape) : *shape));
  return success();
}

FORGE_INFER(MaxPoolOp) { return inferPool(loc, adaptor, inferred, adaptor.getChannelsLast()); }
FORGE_INFER(AvgPoolOp) { return inferPool(loc, adaptor, inferred); }

//===----------------------------------------------------------------------===//
// Normalizations, softmax, losses
//===----------------------------------------------------------------------===//

static LogicalResult inferSameAsInput(std::optional<Location> loc, Value input,
                                      SmallVectorImpl<Type> &inferred) {
  if (!rankedOrNull(input.getType()))
    return failInference(loc, "input must be a statically shaped tensor");
  inferred.push_back(input.getType());
  return success();
}

static LogicalResult checkAxis(std::optional<Location> loc, Value input, int64_t axis) {
  auto t = cast<RankedTensorType>(input.getType());
  if (axis < 0 || axis >= std::max<int64_t>(t.getRank(), 1))
    return failInference(loc, "axis " + Twine(axis) + " out of range for rank " +
                                  Twine(t.getRank()));
  return success();
}

FORGE_INFER(BatchNormOp) { return inferSameAsInput(loc, adaptor.getInput(), inferred); }
FORGE_INFER(BatchNormTrainingOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  inferred.push_back(adaptor.getRunningMean().getType());
  inferred.push_back(adaptor.getRunningVar().getType());
  return success();
}
FORGE_INFER(LayerNormOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  return checkAxis(loc, adaptor.getInput(), adaptor.getAxis());
}
FORGE_INFER(GroupNormOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  auto t = cast<RankedTensorType>(adaptor.getInput().getType());
  if (t.getRank() < 2 || adaptor.getNumGroups() <= 0 ||
      t.getDimSize(1) % adaptor.getNumGroups() != 0)
    return failInference(loc, "channels must be divisible by num_groups");
  return success();
}
FORGE_INFER(AttentionOp) {
  StringRef layout = adaptor.getLayout();
  auto shape = attentionShape(loc, adaptor.getQ().getType(), adaptor.getK().getType(),
                              adaptor.getV().getType(), layout);
  if (failed(shape) ||
      failed(checkAttentionBias(loc, adaptor.getBias() ? adaptor.getBias().getType() : Type(),
                                adaptor.getQ().getType(), adaptor.getK().getType(), *shape,
                                layout)))
    return failure();
  inferred.push_back(withShape(adaptor.getQ().getType(), *shape));
  // f32 beside low and f32 operands; f64 beside f64 ones (the gradient checks).
  Type q = cast<RankedTensorType>(adaptor.getQ().getType()).getElementType();
  Type lse = q.isF64() ? q : Float32Type::get(context);
  inferred.push_back(RankedTensorType::get(attentionLseShape(*shape, layout), lse));
  return success();
}

OpCost AttentionOp::computeCost() {
  OpCost cost = estimateDefaultCost(getOperation(), 0);
  cost.flops = attentionFlops(getQ().getType(), getK().getType(), getV().getType(), getCausal(),
                              getLayout());
  return cost;
}

namespace {
/// attention (or attention_grad) whose 4-d operands are all [B, T, H, D]
/// tensors transposed to [B, H, T, D] reads them as they are (layout bshd):
/// cuDNN takes the strides, so the transposes, and the ones the results go
/// through back to [B, T, H, D] (which cancel with the new ones), vanish.
template <typename OpT> struct FoldAttentionTransposes : public OpRewritePattern<OpT> {
  using OpRewritePattern<OpT>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpT op, PatternRewriter &rewriter) const override {
    if (op.getLayout() != "bhsd")
      return failure();
    const int64_t swap[] = {0, 2, 1, 3};
    SmallVector<Value> operands(op->getOperands());
    for (auto [i, v] : llvm::enumerate(operands)) {
      if (cast<RankedTensorType>(v.getType()).getRank() != 4 || v == op.getBias())
        continue; // lse, and the bias (the scores' layout in both)
      auto t = v.template getDefiningOp<TransposeOp>();
      if (!t || t.getPerm() != ArrayRef<int64_t>(swap))
        return failure();
      operands[i] = t.getInput();
    }
    SmallVector<Type> types;
    for (Value r : op->getResults()) {
      auto t = cast<RankedTensorType>(r.getType());
      if (t.getRank() != 4) {
        types.push_back(t);
        continue;
      }
      types.push_back(t.clone({t.getDimSize(0), t.getDimSize(2), t.getDimSize(1), t.getDimSize(3)}));
    }
    OperationState state(op.getLoc(), op->getName(), operands, types, op->getAttrs());
    Operation *folded = rewriter.create(state);
    folded->setAttr("layout", rewriter.getStringAttr("bshd"));
    SmallVector<Value> replacements;
    for (auto [old, now] : llvm::zip(op->getResults(), folded->getResults())) {
      if (cast<RankedTensorType>(now.getType()).getRank() != 4) {
        replacements.push_back(now);
        continue;
      }
      replacements.push_back(rewriter.create<TransposeOp>(op.getLoc(), old.getType(), now,
                                                          rewriter.getDenseI64ArrayAttr(swap)));
    }
    rewriter.replaceOp(op, replacements);
    return success();
  }
};
} // namespace

void AttentionOp::getCanonicalizationPatterns(RewritePatternSet &patterns, MLIRContext *context) {
  patterns.add<FoldAttentionTransposes<AttentionOp>>(context);
}

void AttentionGradOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                                  MLIRContext *context) {
  patterns.add<FoldAttentionTransposes<AttentionGradOp>>(context);
}

FORGE_INFER(SoftmaxOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  return checkAxis(loc, adaptor.getInput(), adaptor.getAxis());
}
FORGE_INFER(LogSoftmaxOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  return checkAxis(loc, adaptor.getInput(), adaptor.getAxis());
}

FORGE_INFER(NllLossOp) {
  auto x = rankedOrNull(adaptor.getInput().getType());
  auto target = rankedOrNull(adaptor.getTarget().getType());
  if (!x || !target || x.getRank() < 2 || target.getRank() != x.getRank() - 1)
    return failInference(loc, "nll_loss needs input [N, C, ...] and target [N, ...]");
  StringRef reduction = adaptor.getReduction();
  if (reduction == "none") {
    inferred.push_back(withShape(x, target.getShape()));
    return success();
  }
  if (reduction != "sum" && reduction != "mean")
    return failInference(loc, "reduction must be none, sum or mean");
  inferred.push_back(withShape(x, {}));
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions and scans
//===----------------------------------------------------------------------===//

FORGE_INFER(ArgMaxOp) {
  if (failed(checkAxis(loc, adaptor.getInput(), adaptor.getAxis())))
    return failure();
  int64_t axis = adaptor.getAxis();
  return inferReduceType(loc, adaptor.getInput().getType(), ArrayRef<int64_t>(axis),
                         adaptor.getKeepdims(), IntegerType::get(context, 64), inferred);
}

FORGE_INFER(TopKOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  int64_t axis = adaptor.getAxis(), k = adaptor.getK();
  if (!t || axis < 0 || axis >= t.getRank())
    return failInference(loc, "top_k needs a ranked input and an axis in range");
  if (k < 0 || k > t.getDimSize(axis))
    return failInference(loc, "top_k's k must be in [0, the axis' size]");
  SmallVector<int64_t> shape(t.getShape());
  shape[axis] = k;
  inferred.push_back(withShape(t, shape));
  inferred.push_back(RankedTensorType::get(shape, IntegerType::get(context, 64)));
  return success();
}

FORGE_INFER(CumSumOp) {
  if (failed(inferSameAsInput(loc, adaptor.getInput(), inferred)))
    return failure();
  return checkAxis(loc, adaptor.getInput(), adaptor.getAxis());
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

FORGE_INFER(ConstantOp) {
  inferred.push_back(cast<ElementsAttr>(adaptor.getValue()).getType());
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }


FORGE_INFER(ReshapeOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  for (int64_t d : adaptor.getShape())
    if (d < 0)
      return failInference(loc, "reshape target dims must be resolved and non-negative");
  if (ShapedType::getNumElements(adaptor.getShape()) != t.getNumElements())
    return failInference(loc, "reshape changes the element count");
  inferred.push_back(withShape(t, adaptor.getShape()));
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(cast<ShapedType>(getType()));
  return {};
}

FORGE_INFER(TransposeOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t || (int64_t)adaptor.getPerm().size() != t.getRank())
    return failInference(loc, "perm must have one entry per input dim");
  SmallVector<int64_t> shape;
  for (int64_t p : adaptor.getPerm()) {
    if (p < 0 || p >= t.getRank())
      return failInference(loc, "perm entry out of range");
    shape.push_back(t.getDimSize(p));
  }
  inferred.push_back(withShape(t, shape));
  return success();
}

//===----------------------------------------------------------------------===//
// Fusion regions
//===----------------------------------------------------------------------===//

/// A "lines" region (forge-fuse-line-reductions): one input x and one result
/// at the iteration shape; first a keepdims reduce_sum / reduce_mean of x over
/// one axis that is not the innermost, then pointwise ops at the iteration
/// shape (reading x and the reduction).
static LogicalResult verifyLinesRegion(FusionOp fusion, Block &block) {
  ArrayRef<int64_t> shape = fusion.getIterationShape();
  if (block.getNumArguments() != 1 || fusion->getNumResults() != 1 ||
      cast<RankedTensorType>(block.getArgument(0).getType()).getShape() != shape ||
      cast<RankedTensorType>(fusion->getResult(0).getType()).getShape() != shape)
    return fusion.emitOpError("lines region must have one input and one result at its "
                              "iteration shape");
  Operation *first = block.without_terminator().empty() ? nullptr : &block.front();
  auto axes = first ? first->getAttrOfType<DenseI64ArrayAttr>("axes") : nullptr;
  auto keep = first ? first->getAttrOfType<BoolAttr>("keepdims") : nullptr;
  int64_t rank = static_cast<int64_t>(shape.size());
  int64_t axis = axes && axes.size() == 1 ? (axes[0] < 0 ? axes[0] + rank : axes[0]) : -1;
  if (!first || !isa<ReduceSumOp, ReduceMeanOp>(first) ||
      first->getOperand(0) != block.getArgument(0) || !keep || !keep.getValue() || axis < 0 ||
      axis >= rank - 1)
    return fusion.emitOpError("lines region must start with a keepdims reduce_sum or "
                              "reduce_mean of its input over one axis that is not the last");
  for (Operation &op : block.without_terminator()) {
    if (&op == first)
      continue;
    auto iface = dyn_cast<ForgeOpInterface>(op);
    if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
        cast<RankedTensorType>(op.getResult(0).getType()).getShape() != shape)
      return op.emitOpError("is not pointwise at the lines region's iteration shape");
  }
  return success();
}

/// A gemm region (see FusionOp's description): the product's op, then one
/// epilogue op, a ReLU of the product or a reduce_sum of a 2-D operand over
/// its leading (contraction) axis.
static LogicalResult verifyGemmRegion(FusionOp fusion, Block &block, YieldOp yield) {
  auto ops = llvm::map_to_vector(block.without_terminator(), [](Operation &op) { return &op; });
  // Two epilogue ops: gelu_grad and its bias gradient, relu and its bitmask.
  bool twoOps = ops.size() == 3 && (isa<GeluGradOp>(ops[1]) || isa<ReluOp>(ops[1]));
  bool dgeluBgrad = twoOps && isa<GeluGradOp>(ops[1]);
  if ((ops.size() != 2 && !twoOps) || !isa<GemmOp, MatMulOp, ScaledGemmOp>(ops[0]))
    return fusion.emitOpError("a gemm region holds one gemm, scaled_gemm or matmul and one "
                              "epilogue op (gelu_grad and its bias gradient, relu and its "
                              "bitmask: two)");
  Operation *product = ops[0], *epilogue = ops[1];
  // A bias or GELU/ReLU-gradient epilogue reads one more argument, the last:
  // the bias row, the GELU's input or the ReLU's bitmask saved by the forward.
  bool extraArg = isa<AddOp, GeluGradOp, ReluGradBitmaskOp>(epilogue);
  auto productArgs = block.getArguments().drop_back(extraArg ? 1 : 0);
  if (!llvm::equal(product->getOperands(), productArgs))
    return product->emitOpError("must take the gemm region's arguments, in order, as operands");
  // cuBLASLt's operands: f32, or bf16/f16 (forge-assign-precision) of one
  // type; a scaled_gemm's are float8 (its verifier), then its two scales.
  bool scaled = isa<ScaledGemmOp>(product);
  Type lhsElem = cast<RankedTensorType>(product->getOperand(0).getType()).getElementType();
  for (Type t : TypeRange(product->getOperandTypes()).take_front(2))
    if (Type e = cast<RankedTensorType>(t).getElementType();
        !scaled && (e != lhsElem || !(e.isF32() || e.isBF16() || e.isF16())))
      return product->emitOpError("of a gemm region must take f32, bf16 or f16 operands of one "
                                  "type");
  Type outElem = cast<RankedTensorType>(product->getResult(0).getType()).getElementType();
  for (Type t : TypeRange(product->getOperandTypes()).drop_front(scaled ? 4 : 2))
    if (cast<RankedTensorType>(t).getElementType() != outElem)
      return product->emitOpError("of a gemm region must take a C of its result's type");
  if (auto gelu = dyn_cast<GeluOp>(epilogue)) {
    // GELU (GELU_BIAS with a bias row as C), yielding the pre-activation too
    // as the aux output.
    Value p = product->getResult(0);
    if (gelu.getInput() != p || gelu.getApproximate() != "tanh")
      return gelu.emitOpError("must be the tanh GELU of its gemm region's product");
    if (!(llvm::equal(yield.getValues(), gelu->getResults()) ||
          (yield.getValues().size() == 2 && yield.getValues()[0] == gelu.getResult() &&
           yield.getValues()[1] == p)))
      return fusion.emitOpError("with a GELU epilogue must yield the GELU, then optionally the "
                                "product (the aux output)");
    return success();
  }
  if (auto grad = dyn_cast<GeluGradOp>(epilogue)) {
    Value p = product->getResult(0), x = block.getArguments().back();
    if (grad.getGradOutput() != p || grad.getInput() != x || grad.getApproximate() != "tanh" ||
        x.getType() != p.getType() || cast<RankedTensorType>(p.getType()).getRank() != 2 ||
        (!dgeluBgrad && !p.hasOneUse()))
      return grad.emitOpError("must be the tanh GELU's gradient of its gemm region's product, "
                              "with the GELU's input as the region's last argument");
    if (dgeluBgrad) {
      auto sum = dyn_cast<ReduceSumOp>(ops[2]);
      if (!sum || sum.getInput() != grad.getResult() || sum.getAxes().size() != 1 ||
          sum.getAxes()[0] != 0 || !sum.getKeepdims())
        return ops[2]->emitOpError("must sum the GELU gradient over its rows (axis 0, keepdims)");
      if (yield.getValues().size() != 2 || yield.getValues()[0] != grad.getResult() ||
          yield.getValues()[1] != sum.getResult())
        return fusion.emitOpError("with a GELU-gradient epilogue and its bias gradient must "
                                  "yield both, in order");
      return success();
    }
    if (!llvm::equal(yield.getValues(), grad->getResults()))
      return fusion.emitOpError("with a GELU-gradient epilogue must yield the gradient alone");
    return success();
  }
  if (isa<AddOp>(epilogue)) {
    Value bias = block.getArguments().back();
    auto out = cast<RankedTensorType>(product->getResult(0).getType());
    auto row = cast<RankedTensorType>(bias.getType());
    bool reads = (epilogue->getOperand(0) == product->getResult(0) &&
                  epilogue->getOperand(1) == bias) ||
                 (epilogue->getOperand(1) == product->getResult(0) &&
                  epilogue->getOperand(0) == bias);
    if (!reads || !product->getResult(0).hasOneUse() || row.getRank() != 1 ||
        out.getRank() != 2 || row.getDimSize(0) != out.getDimSize(1) ||
        row.getElementType() != out.getElementType())
      return epilogue->emitOpError("must add the bias row (the gemm region's last argument, of "
                                   "the product's columns) to the product it alone reads");
    if (!llvm::equal(yield.getValues(), epilogue->getResults()))
      return fusion.emitOpError("with a bias epilogue must yield the sum alone");
    return success();
  }
  if (auto relu = dyn_cast<ReluOp>(epilogue)) {
    if (relu->getOperand(0) != product->getResult(0) || !product->getResult(0).hasOneUse())
      return relu.emitOpError("must alone read the product of its gemm region");
    if (twoOps) { // RELU_AUX: the ReLU, then its bitmask
      auto mask = dyn_cast<ReluBitmaskOp>(ops[2]);
      if (!mask || mask.getInput() != relu.getResult())
        return ops[2]->emitOpError("must be the bitmask of the gemm region's ReLU");
      if (yield.getValues().size() != 2 || yield.getValues()[0] != relu.getResult() ||
          yield.getValues()[1] != mask.getResult())
        return fusion.emitOpError("with a ReLU and its bitmask must yield both, in order");
      return success();
    }
    if (!llvm::equal(yield.getValues(), relu->getResults()))
      return fusion.emitOpError("with a ReLU epilogue must yield the ReLU's result alone");
    return success();
  }
  if (auto grad = dyn_cast<ReluGradBitmaskOp>(epilogue)) {
    Value p = product->getResult(0);
    if (grad.getGradOutput() != p || grad.getMask() != block.getArguments().back() ||
        !p.hasOneUse())
      return grad.emitOpError("must mask its gemm region's product with the region's last "
                              "argument");
    if (!llvm::equal(yield.getValues(), grad->getResults()))
      return fusion.emitOpError("with a ReLU-gradient epilogue must yield the gradient alone");
    return success();
  }
  auto sum = dyn_cast<ReduceSumOp>(epilogue);
  if (!sum)
    return epilogue->emitOpError("is no gemm epilogue (relu or tanh gelu of the product, a bias "
                                 "row added to it, gelu_grad of it, or reduce_sum of an operand "
                                 "over its contraction axis)");
  auto in = cast<RankedTensorType>(sum.getInput().getType());
  bool lhs = sum.getInput() == block.getArgument(0), rhs = sum.getInput() == block.getArgument(1);
  if (scaled) // the sum of a float8 operand would be of its encoded values
    return sum.emitOpError("cannot sum an operand of a scaled_gemm");
  auto gemm = dyn_cast<GemmOp>(product);
  bool transA = gemm ? gemm.getTransA() : cast<MatMulOp>(product).getTransA();
  bool transB = gemm ? gemm.getTransB() : cast<MatMulOp>(product).getTransB();
  // The contraction axis of a stored 2-D operand: rows of a transposed lhs
  // ([K, M]) and of a plain rhs ([K, N]).
  if (!(lhs || rhs) || in.getRank() != 2 || sum.getAxes().size() != 1 || sum.getAxes()[0] != 0 ||
      (lhs && !transA) || (rhs && transB) ||
      cast<RankedTensorType>(product->getOperand(lhs ? 1 : 0).getType()).getRank() != 2)
    return sum.emitOpError("must sum a 2-D operand of its gemm region over the contraction "
                           "axis (axis 0 of a transposed lhs or of a plain rhs)");
  if (yield.getValues().size() != 2 || yield.getValues()[0] != product->getResult(0) ||
      yield.getValues()[1] != sum.getResult())
    return fusion.emitOpError("with a reduce_sum epilogue must yield the product, then the sum");
  return success();
}

LogicalResult AllReduceOp::verify() {
  if (getInputs().size() != getResults().size())
    return emitOpError() << "has " << getInputs().size() << " operands but "
                         << getResults().size() << " results";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getInputs().getTypes(), getResultTypes())))
    if (std::get<0>(pair) != std::get<1>(pair))
      return emitOpError() << "result " << i << " is " << std::get<1>(pair) << ", operand " << i
                           << " is " << std::get<0>(pair);
  if (getReduction() != "sum" && getReduction() != "mean" && getReduction() != "max")
    return emitOpError() << "reduction '" << getReduction() << "' is not 'sum', 'mean' or 'max'";
  if (getSize() < 1)
    return emitOpError() << "group size " << getSize() << " is not positive";
  if (getGroup().empty())
    return emitOpError() << "has an empty group name";
  return success();
}

/// ZeRO-1's collectives: `part` is `whole` with dim 0 divided by `size`.
static LogicalResult verifyParts(Operation *op, Type wholeType, Type partType, int64_t size,
                                 StringRef group) {
  auto whole = cast<RankedTensorType>(wholeType), part = cast<RankedTensorType>(partType);
  if (size < 1)
    return op->emitOpError() << "group size " << size << " is not positive";
  if (group.empty())
    return op->emitOpError() << "has an empty group name";
  if (whole.getRank() < 1 || whole.getDimSize(0) % size != 0)
    return op->emitOpError() << whole << " has no dim 0 that splits into " << size
                             << " equal parts";
  SmallVector<int64_t> shape(whole.getShape());
  shape[0] /= size;
  if (part.getElementType() != whole.getElementType() || part.getShape() != ArrayRef<int64_t>(shape))
    return op->emitOpError() << part << " is not part 1/" << size << " of " << whole
                             << " along dim 0";
  return success();
}

LogicalResult ReduceScatterOp::verify() {
  if (getReduction() != "sum" && getReduction() != "mean")
    return emitOpError() << "reduction '" << getReduction() << "' is neither 'sum' nor 'mean'";
  return verifyParts(*this, getInput().getType(), getType(), getSize(), getGroup());
}

LogicalResult AllGatherOp::verify() {
  return verifyParts(*this, getType(), getInput().getType(), getSize(), getGroup());
}

/// A pipeline message's endpoints: a peer inside a group of at least two
/// that is not this stage's own place is checked where the stage is known
/// (forge-split-pipeline-stages); here the attributes alone.
static LogicalResult verifyMessage(Operation *op, StringRef group, int64_t peer, int64_t tag,
                                   int64_t size) {
  if (group.empty())
    return op->emitOpError() << "has an empty group name";
  if (size < 2)
    return op->emitOpError() << "group size " << size << " is below 2";
  if (peer < 0 || peer >= size)
    return op->emitOpError() << "peer " << peer << " is outside the group of " << size;
  if (tag < 0)
    return op->emitOpError() << "tag " << tag << " is negative";
  return success();
}

/// A message's order token: tensor<0xi1>, no bytes.
static LogicalResult verifyToken(Operation *op, Type t, StringRef what) {
  auto tt = dyn_cast<RankedTensorType>(t);
  if (!tt || tt.getRank() != 1 || tt.getDimSize(0) != 0 || !tt.getElementType().isInteger(1))
    return op->emitOpError() << what << " must be an order token, tensor<0xi1>, got " << t;
  return success();
}

/// forge.send and forge.recv alike: their tokens, then their endpoints.
template <typename MessageOp>
static LogicalResult verifyMessageOp(MessageOp op) {
  if (op.getAfter() && failed(verifyToken(op, op.getAfter().getType(), "'after'")))
    return failure();
  if (failed(verifyToken(op, op.getToken().getType(), "the token")))
    return failure();
  return verifyMessage(op, op.getGroup(), op.getPeer(), op.getTag(), op.getSize());
}

LogicalResult SendOp::verify() { return verifyMessageOp(*this); }
LogicalResult RecvOp::verify() { return verifyMessageOp(*this); }

LogicalResult RankSliceOp::verify() {
  return verifyParts(*this, getInput().getType(), getType(), getSize(), getGroup());
}

OpFoldResult EnterGroupOp::fold(FoldAdaptor) {
  // The identity once nothing differentiates it any more. Before the train
  // step is built nothing folds (the pipeline runs no canonicalization
  // there), so the gradient rule still sees it.
  return getInput();
}

LogicalResult ShardOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  const int64_t axis = getAxis(), size = getSize();
  if (size < 1)
    return emitOpError() << "group size " << size << " is not positive";
  if (getGroup().empty())
    return emitOpError() << "has an empty group name";
  if (axis < 0 || axis >= in.getRank())
    return emitOpError() << "axis " << axis << " is out of range for rank " << in.getRank();
  if (getBlocks() < 1 || in.getDimSize(axis) % (size * getBlocks()) != 0)
    return emitOpError() << "axis " << axis << " of size " << in.getDimSize(axis)
                         << " does not split into " << getBlocks() << " block(s) of " << size
                         << " equal parts";
  SmallVector<int64_t> shape(in.getShape());
  shape[axis] /= size;
  if (out.getElementType() != in.getElementType() || out.getShape() != ArrayRef<int64_t>(shape))
    return emitOpError() << "result " << out << " is not part 1/" << size << " of " << in
                         << " along axis " << axis;
  auto c = getInput().getDefiningOp<ConstantOp>();
  if (!c || !c->hasAttr("forge.initializer"))
    return emitOpError("must split an initializer (a forge.constant with forge.initializer)");
  return success();
}

LogicalResult FusionOp::verify() {
  Block &block = getBlock();
  if (block.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but its body takes "
                         << block.getNumArguments() << " arguments";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getInputs(), block.getArguments())))
    if (std::get<0>(pair).getType() != std::get<1>(pair).getType())
      return emitOpError() << "input " << i << " has type " << std::get<0>(pair).getType()
                           << " but body argument " << i << " has type "
                           << std::get<1>(pair).getType();
  auto yield = dyn_cast<YieldOp>(block.getTerminator());
  if (!yield)
    return emitOpError("body must end with forge.yield");
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("yields types that differ from its result types");
  if (getNumResults() == 0)
    return emitOpError("has no results");
  if (getKind() == "horizontal") {
    // Independent loop and multi_reduce regions side by side: each member
    // reads body arguments only, except that a loop region of one-element
    // results may also read an earlier multi_reduce member's sums (the
    // kernel evaluates it once every sum is complete: forge-merge-reductions).
    // The yield returns every member's results in member order.
    SmallVector<Value> results;
    llvm::DenseSet<Value> sums;
    for (Operation &op : block.without_terminator()) {
      auto member = dyn_cast<FusionOp>(op);
      if (!member || (member.getKind() != "loop" && member.getKind() != "multi_reduce"))
        return op.emitOpError("is not a loop or multi_reduce region; a horizontal region holds "
                              "those only");
      bool scalar =
          member.getKind() == "loop" && llvm::all_of(member->getResultTypes(), [](Type t) {
            return cast<RankedTensorType>(t).getNumElements() == 1;
          });
      for (Value v : member.getInputs()) {
        if (isa<BlockArgument>(v) && cast<BlockArgument>(v).getOwner() == &block)
          continue;
        if (scalar && sums.contains(v))
          continue;
        return member.emitOpError("reads a value that is neither an argument of its horizontal "
                                  "region nor, for a loop region of one-element results, a sum "
                                  "of an earlier multi_reduce member (members must be "
                                  "independent)");
      }
      if (member.getKind() == "multi_reduce")
        sums.insert(member->result_begin(), member->result_end());
      llvm::append_range(results, member.getResults());
    }
    if (!llvm::equal(results, yield.getValues()))
      return emitOpError("must yield its members' results in member order");
    return success();
  }
  if (getKind() == "multi_reduce") {
    // Sums (or maxima: float8 scaling's amax) of whole tensors; each member's
    // prologue only feeds it.
    SmallVector<Value> sums;
    for (Operation &op : block.without_terminator()) {
      if (isa<ReduceSumOp, ReduceMaxOp>(op)) {
        auto in = cast<RankedTensorType>(op.getOperand(0).getType());
        auto axes = op.getAttrOfType<DenseI64ArrayAttr>("axes");
        if (cast<RankedTensorType>(op.getResult(0).getType()).getRank() != 0 ||
            static_cast<int64_t>(axes.size()) != in.getRank())
          return op.emitOpError("is not a reduction of a whole tensor to a scalar");
        sums.push_back(op.getResult(0));
        continue;
      }
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise || !op.hasOneUse())
        return op.emitOpError("is neither a whole-tensor reduce_sum/reduce_max nor a pointwise "
                              "op that only one reduction reads");
    }
    if (!llvm::equal(sums, yield.getValues()))
      return emitOpError("must yield its reductions' sums in order");
    return success();
  }
  if (getKind() == "column_reduce") {
    // Column sums (reduce_sum over every dim but the last) of one iteration
    // shape, each with its pointwise prologue at that shape; then, as side
    // outputs, values of the iteration shape the same kernel writes
    // (forge-fuse-column-sums: a loop region's results beside their sums).
    SmallVector<Value> sums;
    ArrayRef<int64_t> shape;
    for (Operation &op : block.without_terminator()) {
      if (auto sum = dyn_cast<ReduceSumOp>(op)) {
        auto in = cast<RankedTensorType>(sum.getInput().getType());
        if (sum.getKeepdims() || in.getRank() < 2 ||
            !llvm::equal(sum.getAxes(), llvm::seq<int64_t>(0, in.getRank() - 1)))
          return op.emitOpError("is not a column sum (reduce_sum over every dim but the last)");
        if (!shape.empty() && in.getShape() != shape)
          return op.emitOpError("sums another shape than the region's first column sum");
        shape = in.getShape();
        sums.push_back(sum.getResult());
        continue;
      }
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise)
        return op.emitOpError("is neither a column sum nor a pointwise op");
    }
    ValueRange yielded = yield.getValues();
    if (sums.empty() || yielded.size() < sums.size() ||
        !llvm::equal(sums, yielded.take_front(sums.size())))
      return emitOpError("must yield its column sums in order, then its side outputs");
    for (Value v : yielded.drop_front(sums.size()))
      if (cast<RankedTensorType>(v.getType()).getShape() != shape)
        return emitOpError("yields a side output of another shape than its column sums read");
    return success();
  }
  if (getKind() == "batch_norm") {
    // Forward: one batch_norm_training on body arguments, then its pointwise
    // epilogue; yields values of the iteration shape, then the running
    // statistics. Gradient: a pointwise prologue computing the dy of one
    // batch_norm_training_grad (x and scale body arguments), which is last;
    // yields its results.
    Operation *norm = nullptr;
    for (Operation &op : block.without_terminator())
      if (isa<BatchNormTrainingOp, BatchNormTrainingGradOp>(op)) {
        if (norm)
          return op.emitOpError("is a second batch norm in one batch_norm region");
        norm = &op;
      }
    if (!norm)
      return emitOpError("batch_norm region has no batch_norm_training(_grad) op");
    bool backward = isa<BatchNormTrainingGradOp>(norm);
    for (auto [j, v] : llvm::enumerate(norm->getOperands()))
      if (!isa<BlockArgument>(v) && (!backward || j != 2))
        return norm->emitOpError("must take the batch_norm region's arguments as operands");
    for (Operation &op : block.without_terminator()) {
      if (&op == norm)
        continue;
      bool before = op.isBeforeInBlock(norm);
      if (before && !backward)
        return op.emitOpError("comes before the batch norm of its batch_norm region");
      if (!before && backward)
        return op.emitOpError("comes after the batch norm gradient of its batch_norm region");
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise)
        return op.emitOpError("is not pointwise (FusionClass Elementwise) and cannot be in a "
                              "batch_norm region");
    }
    auto values = yield.getValues();
    ArrayRef<int64_t> shape = cast<RankedTensorType>(norm->getOperand(0).getType()).getShape();
    for (Operation &op : block.without_terminator())
      if (&op != norm)
        for (Type t : op.getResultTypes())
          if (cast<RankedTensorType>(t).getShape() != shape)
            return op.emitOpError("result does not have the batch_norm region's iteration shape");
    if (isa<BatchNormTrainingGradOp>(norm)) {
      if (!llvm::equal(values, norm->getResults()))
        return emitOpError("must yield the batch norm gradient's results");
      return success();
    }
    if (values.size() < 3 || values[values.size() - 2] != norm->getResult(1) ||
        values.back() != norm->getResult(2))
      return emitOpError("must yield values of its iteration shape, then the batch norm's "
                         "running mean and variance");
    for (Value v : values.drop_back(2))
      if (cast<RankedTensorType>(v.getType()).getShape() != shape || v == norm->getResult(1) ||
          v == norm->getResult(2))
        return emitOpError("yields a value that does not have the batch norm's output shape");
    return success();
  }
  if (getKind() == "norm_grad") {
    // A layer_norm_grad on the first three arguments (x, scale, dy), then
    // pointwise ops and column sums at its shape reading its dx
    // (forge-fuse-norm-grad-epilogues); yields the norm's scale/bias
    // gradients, the column sums and values of its shape (dx among them when
    // other ops read it too).
    auto norm = dyn_cast<LayerNormGradOp>(&block.front());
    if (!norm || block.getNumArguments() < 3 ||
        llvm::any_of(llvm::seq<unsigned>(0, 3),
                     [&](unsigned i) { return norm->getOperand(i) != block.getArgument(i); }))
      return emitOpError("norm_grad region must begin with a layer_norm_grad of its first three "
                         "arguments");
    ArrayRef<int64_t> shape = cast<RankedTensorType>(norm->getOperand(0).getType()).getShape();
    for (Operation &op : llvm::drop_begin(block.without_terminator())) {
      if (auto sum = dyn_cast<ReduceSumOp>(op)) {
        auto in = cast<RankedTensorType>(sum.getInput().getType());
        if (sum.getKeepdims() || in.getShape() != shape ||
            !llvm::equal(sum.getAxes(), llvm::seq<int64_t>(0, in.getRank() - 1)))
          return op.emitOpError("is not a column sum at the norm_grad region's shape");
        continue;
      }
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
          cast<RankedTensorType>(op.getResult(0).getType()).getShape() != shape)
        return op.emitOpError("is neither a column sum nor a pointwise op at the norm_grad "
                              "region's shape");
    }
    return success();
  }
  if (getKind() == "gemm")
    return verifyGemmRegion(*this, block, yield);
  if (getKind() == "lines")
    return verifyLinesRegion(*this, block);
  if (getKind() != "loop" && getKind() != "row")
    return emitOpError() << "has unknown kind '" << getKind()
                         << "' (loop, row, batch_norm, norm_grad, horizontal, multi_reduce, "
                            "gemm, lines)";
  ArrayRef<int64_t> shape = getIterationShape();
  if (getKind() == "row") {
    if (getNumResults() != 1)
      return emitOpError("row region must have one result");
    Operation *rowOp = nullptr;
    for (Operation &op : block.without_terminator()) {
      if (!isInnermostRowOp(&op))
        continue;
      if (rowOp)
        return op.emitOpError("is a second row op in one row region");
      rowOp = &op;
    }
    if (!rowOp)
      return emitOpError("row region has no softmax-family op over the innermost axis");
    // The prologue computes the row op's operands only; the epilogue reads
    // the row op's result, the inputs and its own values.
    for (Operation &op : block.without_terminator()) {
      if (&op == rowOp)
        continue;
      bool prologue = op.isBeforeInBlock(rowOp);
      for (Operation *user : op.getUsers())
        if (prologue && isa<YieldOp>(user))
          return op.emitOpError("is a prologue op of a row region and cannot be yielded");
      if (!prologue)
        for (Value v : op.getOperands())
          if (Operation *def = v.getDefiningOp(); def && def->isBeforeInBlock(rowOp))
            return op.emitOpError("is an epilogue op of a row region and reads a prologue value");
    }
  }
  if (getKind() == "loop" && isViewRegion()) {
    // A chain of views from the one argument to the one result.
    if (block.getNumArguments() != 1 || getNumResults() != 1)
      return emitOpError("a view region has one input and one result");
    Value cur = block.getArgument(0);
    for (Operation &op : block.without_terminator()) {
      if (!isa<TransposeOp, ReshapeOp, SliceOp>(op))
        return op.emitOpError("is not a view (transpose, reshape, slice) and cannot be in a "
                              "view region");
      if (op.getOperand(0) != cur || !cur.hasOneUse())
        return op.emitOpError("does not continue the view region's chain");
      cur = op.getResult(0);
    }
    if (yield.getValues()[0] != cur)
      return emitOpError("must yield the end of its view chain");
    return success();
  }
  auto inRegionShape = [&](Operation &op) {
    return getKind() == "row" && isInnermostRowOp(&op);
  };
  for (Type t : getResultTypes())
    if (cast<RankedTensorType>(t).getShape() != shape)
      return emitOpError() << getKind() << " region results must all have the iteration shape";
  for (Operation &op : block.without_terminator()) {
    auto iface = dyn_cast<ForgeOpInterface>(op);
    if (!inRegionShape(op) && (!iface || iface.getFusionClass() != FusionClass::Elementwise))
      return op.emitOpError() << "is not pointwise (FusionClass Elementwise) and cannot be in a "
                              << getKind() << " region";
    for (Type t : op.getResultTypes())
      if (cast<RankedTensorType>(t).getShape() != shape)
        return op.emitOpError() << "result does not have the " << getKind()
                              << " region's iteration shape";
  }
  for (BlockArgument arg : block.getArguments()) {
    auto argShape = cast<RankedTensorType>(arg.getType()).getShape();
    auto joint = broadcastShapes(argShape, shape);
    if (failed(joint) || ArrayRef<int64_t>(*joint) != shape)
      return emitOpError() << "input of shape [" << argShape
                           << "] does not broadcast to the iteration shape";
  }
  return success();
}

Value mlir::forge::createLeadingSlice(OpBuilder &b, Location loc, Value v,
                                      ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  SmallVector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1);
  return b.create<SliceOp>(loc, RankedTensorType::get(shape, type.getElementType()), v,
                           b.getDenseI64ArrayAttr(zeros), b.getDenseI64ArrayAttr(shape),
                           b.getDenseI64ArrayAttr(ones));
}

bool FusionOp::isViewRegion() {
  return getKind() == "loop" &&
         llvm::any_of(getBlock().without_terminator(),
                      [](Operation &op) { return isa<TransposeOp, ReshapeOp, SliceOp>(op); });
}

bool mlir::forge::isInnermostRowOp(Operation *op) {
  if (!isa<SoftmaxOp, LogSoftmaxOp, SoftmaxGradOp, LogSoftmaxGradOp>(op))
    return false;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  auto axis = op->getAttrOfType<IntegerAttr>("axis");
  if (!type || !type.hasStaticShape() || type.getRank() == 0 || !axis)
    return false;
  int64_t ax = axis.getInt() < 0 ? axis.getInt() + type.getRank() : axis.getInt();
  return ax == type.getRank() - 1 &&
         llvm::all_of(op->getOperandTypes(), [&](Type t) { return t == type; });
}

FusionOp FusionOp::rebuild(ValueRange inputs, ValueRange yielded) {
  SmallVector<Value> values(yielded); // may be the terminator's own operands
  getBlock().getTerminator()->setOperands(values);
  OpBuilder b(*this);
  auto rebuilt = b.create<FusionOp>(getLoc(), ValueRange(values).getTypes(), inputs, getKindAttr());
  rebuilt->setAttrs((*this)->getAttrs());
  rebuilt.getBody().takeBody(getBody());
  return rebuilt;
}

void FusionOp::inlineBody() {
  Block &block = getBlock();
  auto yield = cast<YieldOp>(block.getTerminator());
  SmallVector<FusionOp> members;
  for (auto [arg, input] : llvm::zip(block.getArguments(), getInputs()))
    arg.replaceAllUsesWith(input);
  // After the arguments' replacement: a region may yield an argument itself.
  SmallVector<Value> yielded(yield.getValues());
  yield.erase();
  for (Operation &op : llvm::make_early_inc_range(block)) {
    op.moveBefore(*this);
    if (auto member = dyn_cast<FusionOp>(op))
      members.push_back(member);
  }
  for (auto [r, v] : llvm::zip(getResults(), yielded))
    r.replaceAllUsesWith(v);
  erase();
  for (FusionOp member : members)
    member.inlineBody();
}

OpCost FusionOp::getCost() {
  OpCost cost = estimateDefaultCost(*this, /*flopsPerElement=*/0); // inputs + results
  for (Operation &op : getBlock().without_terminator()) {
    if (auto iface = dyn_cast<ForgeOpInterface>(op))
      cost.flops += iface.getCost().flops;
    else if (auto member = dyn_cast<FusionOp>(op)) // a horizontal region's member
      cost.flops += member.getCost().flops;
  }
  return cost;
}

LogicalResult TransposeOp::verify() {
  SmallVector<bool> seen(getPerm().size(), false);
  for (int64_t p : getPerm()) {
    if (seen[p])
      return emitOpError("perm is not a permutation");
    seen[p] = true;
  }
  return success();
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  // transpose(transpose(x, p1), p2) = transpose(x, p1[p2[i]]): one transpose
  // (updated in place), or x itself when the composition is the identity.
  if (auto inner = getInput().getDefiningOp<TransposeOp>()) {
    ArrayRef<int64_t> p1 = inner.getPerm(), p2 = getPerm();
    SmallVector<int64_t> composed;
    bool identity = true;
    for (auto [i, p] : llvm::enumerate(p2)) {
      composed.push_back(p1[p]);
      identity &= composed.back() == static_cast<int64_t>(i);
    }
    if (identity)
      return inner.getInput();
    setPermAttr(DenseI64ArrayAttr::get(getContext(), composed));
    getInputMutable().assign(inner.getInput());
    return getResult();
  }
  for (auto [i, p] : llvm::enumerate(getPerm()))
    if ((int64_t)i != p)
      return {};
  return getInput();
}

FORGE_INFER(BroadcastOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t)
    return failInference(loc, "input must be a statically shaped tensor");
  auto shape = broadcastShapes(t.getShape(), adaptor.getShape());
  if (failed(shape) || ArrayRef<int64_t>(*shape) != adaptor.getShape())
    return failInference(loc, "input does not broadcast to the target shape");
  inferred.push_back(withShape(t, *shape));
  return success();
}

OpFoldResult BroadcastOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  // A splat folds to a constant unless that constant would be too large to
  // carry in a bundle (a huge ConstantOfShape stays a run-time broadcast).
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(adaptor.getInput());
      dense && dense.isSplat() && getType().getNumElements() <= kMaxFoldElements)
    return SplatElementsAttr::get(cast<ShapedType>(getType()), dense.getSplatValue<Attribute>());
  return {};
}

FORGE_INFER(ConcatOp) {
  if (adaptor.getInputs().empty())
    return failInference(loc, "concat needs at least one input");
  auto first = rankedOrNull(adaptor.getInputs()[0].getType());
  if (!first)
    return failInference(loc, "inputs must be statically shaped tensors");
  int64_t axis = adaptor.getAxis();
  if (axis < 0 || axis >= first.getRank())
    return failInference(loc, "concat axis out of range");
  SmallVector<int64_t> shape(first.getShape());
  shape[axis] = 0;
  for (Value v : adaptor.getInputs()) {
    auto t = rankedOrNull(v.getType());
    if (!t || t.getRank() != first.getRank())
      return failInference(loc, "concat inputs must have equal rank");
    for (int64_t d = 0; d < t.getRank(); ++d)
      if (d != axis && t.getDimSize(d) != first.getDimSize(d))
        return failInference(loc, "concat inputs differ outside the concat axis");
    shape[axis] += t.getDimSize(axis);
  }
  inferred.push_back(withShape(first, shape));
  return success();
}

FORGE_INFER(SplitOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  int64_t axis = adaptor.getAxis();
  if (!t || axis < 0 || axis >= t.getRank())
    return failInference(loc, "split axis out of range");
  int64_t total = 0;
  for (int64_t s : adaptor.getSizes()) {
    if (s < 0)
      return failInference(loc, "split sizes must be non-negative");
    SmallVector<int64_t> shape(t.getShape());
    shape[axis] = s;
    inferred.push_back(withShape(t, shape));
    total += s;
  }
  if (total != t.getDimSize(axis))
    return failInference(loc, "split sizes do not add up to the axis extent");
  return success();
}

static int64_t sliceExtent(int64_t start, int64_t end, int64_t step) {
  if (step > 0)
    return std::max<int64_t>(0, (end - start + step - 1) / step);
  return std::max<int64_t>(0, (start - end + (-step) - 1) / (-step));
}

FORGE_INFER(SliceOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  int64_t rank = t ? t.getRank() : 0;
  if (!t || (int64_t)adaptor.getStarts().size() != rank ||
      (int64_t)adaptor.getEnds().size() != rank || (int64_t)adaptor.getSteps().size() != rank)
    return failInference(loc, "slice needs starts/ends/steps with one entry per dim");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d)
    shape.push_back(sliceExtent(adaptor.getStarts()[d], adaptor.getEnds()[d], adaptor.getSteps()[d]));
  inferred.push_back(withShape(t, shape));
  return success();
}

LogicalResult SliceOp::verify() {
  auto t = cast<RankedTensorType>(getInput().getType());
  for (int64_t d = 0; d < t.getRank(); ++d) {
    int64_t start = getStarts()[d], end = getEnds()[d], step = getSteps()[d], dim = t.getDimSize(d);
    bool ok = step > 0 ? (0 <= start && start <= end && end <= dim)
                       : (step < 0 && -1 <= end && end <= start && start <= dim - 1);
    if (!ok && !(step < 0 && dim == 0))
      return emitOpError() << "dim " << d << ": start " << start << ", end " << end
                           << ", step " << step << " not normalized for extent " << dim;
  }
  return success();
}

FORGE_INFER(PadOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t || (int64_t)adaptor.getPads().size() != 2 * t.getRank())
    return failInference(loc, "pads need 2 entries per input dim");
  StringRef mode = adaptor.getMode();
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return failInference(loc, "pad mode must be constant, reflect, edge or wrap");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < t.getRank(); ++d) {
    int64_t extent = t.getDimSize(d) + adaptor.getPads()[d] + adaptor.getPads()[d + t.getRank()];
    if (extent < 0)
      return failInference(loc, "negative pads remove more than the dim holds");
    shape.push_back(extent);
  }
  inferred.push_back(withShape(t, shape));
  return success();
}

FORGE_INFER(TileOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t || (int64_t)adaptor.getRepeats().size() != t.getRank())
    return failInference(loc, "repeats need one entry per input dim");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < t.getRank(); ++d)
    shape.push_back(t.getDimSize(d) * adaptor.getRepeats()[d]);
  inferred.push_back(withShape(t, shape));
  return success();
}

FORGE_INFER(GatherOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  int64_t axis = adaptor.getAxis();
  if (!t || !idx || axis < 0 || axis >= t.getRank())
    return failInference(loc, "gather axis out of range");
  SmallVector<int64_t> shape(t.getShape().take_front(axis));
  llvm::append_range(shape, idx.getShape());
  llvm::append_range(shape, t.getShape().drop_front(axis + 1));
  inferred.push_back(withShape(t, shape));
  return success();
}

FORGE_INFER(GatherElementsOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  int64_t axis = adaptor.getAxis();
  if (!t || !idx || idx.getRank() != t.getRank() || axis < 0 || axis >= t.getRank())
    return failInference(loc, "gather_elements needs indices of the input's rank");
  inferred.push_back(withShape(t, idx.getShape()));
  return success();
}

FORGE_INFER(ScatterElementsOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  auto upd = rankedOrNull(adaptor.getUpdates().getType());
  int64_t axis = adaptor.getAxis();
  if (!t || !idx || !upd || idx.getRank() != t.getRank() || axis < 0 || axis >= t.getRank())
    return failInference(loc, "scatter_elements needs indices of the input's rank and an axis "
                              "in range");
  if (upd.getShape() != idx.getShape() || upd.getElementType() != t.getElementType())
    return failInference(loc, "scatter_elements needs updates of the indices' shape and the "
                              "input's element type");
  for (int64_t d = 0; d < t.getRank(); ++d)
    if (d != axis && idx.getDimSize(d) > t.getDimSize(d))
      return failInference(loc, "scatter_elements indices exceed the input outside the axis");
  StringRef r = adaptor.getReduction();
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    return failInference(loc, "scatter_elements reduction must be none, add, mul, max or min");
  inferred.push_back(t);
  return success();
}

FORGE_INFER(TriluOp) {
  auto t = rankedOrNull(adaptor.getInput().getType());
  if (!t || t.getRank() < 2)
    return failInference(loc, "trilu input must have rank >= 2");
  inferred.push_back(t);
  return success();
}

FORGE_INFER(ResizedCropOp) {
  auto canvas = rankedOrNull(adaptor.getCanvas().getType());
  auto geometry = rankedOrNull(adaptor.getGeometry().getType());
  if (!canvas || canvas.getRank() != 4 || !geometry || geometry.getRank() != 2 ||
      geometry.getDimSize(1) != 6 || geometry.getDimSize(0) != canvas.getDimSize(0))
    return failInference(loc, "resized_crop takes a canvas [B, Hc, Wc, C] and a geometry [B, 6]");
  if (adaptor.getHeight() < 1 || adaptor.getWidth() < 1)
    return failInference(loc, "resized_crop's height and width must be positive");
  inferred.push_back(
      RankedTensorType::get({canvas.getDimSize(0), static_cast<int64_t>(adaptor.getHeight()),
                             static_cast<int64_t>(adaptor.getWidth()), canvas.getDimSize(3)},
                            Float32Type::get(context)));
  return success();
}

FORGE_INFER(OneHotOp) {
  auto idx = rankedOrNull(adaptor.getIndices().getType());
  int64_t axis = adaptor.getAxis();
  if (!idx || axis < 0 || axis > idx.getRank() || adaptor.getDepth() <= 0)
    return failInference(loc, "one_hot axis out of range or depth not positive");
  SmallVector<int64_t> shape(idx.getShape());
  shape.insert(shape.begin() + axis, adaptor.getDepth());
  inferred.push_back(RankedTensorType::get(shape, adaptor.getDtype()));
  return success();
}

FORGE_INFER(DropoutOp) {
  auto x = rankedOrNull(adaptor.getInput().getType());
  if (!x)
    return failInference(loc, "dropout needs a ranked input");
  double ratio = adaptor.getRatio().convertToDouble();
  if (!(ratio >= 0 && ratio <= 1))
    return failInference(loc, "dropout ratio must be in [0, 1]");
  inferred.push_back(x);
  inferred.push_back(RankedTensorType::get(x.getShape(), IntegerType::get(context, 1)));
  return success();
}

FORGE_INFER(DropoutMaskOp) {
  auto step = rankedOrNull(adaptor.getStep().getType());
  double ratio = adaptor.getRatio().convertToDouble();
  if (!step || step.getRank() != 0 || !isa<FloatType>(step.getElementType()))
    return failInference(loc, "dropout_mask takes the step counter, a float scalar");
  if (!(ratio >= 0 && ratio <= 1))
    return failInference(loc, "dropout ratio must be in [0, 1]");
  if (llvm::any_of(adaptor.getShape(), [](int64_t d) { return d < 0; }))
    return failInference(loc, "dropout_mask shape must be static");
  auto rank = rankedOrNull(adaptor.getRank().getType());
  if (!rank || rank.getRank() != 0 || !rank.getElementType().isInteger(64))
    return failInference(loc, "dropout_mask takes the data-parallel rank, an i64 scalar");
  const int64_t numel = ShapedType::getNumElements(adaptor.getShape());
  if (adaptor.getBatch() < 1 || numel % adaptor.getBatch() != 0 ||
      static_cast<int64_t>(adaptor.getFirstSample()) < 0 || // I64Attr reads back unsigned
      static_cast<int64_t>(adaptor.getRankSamples()) < 0)
    return failInference(loc, "dropout_mask: batch must divide the mask's elements, and the "
                              "sample offsets be non-negative");
  inferred.push_back(RankedTensorType::get(adaptor.getShape(), IntegerType::get(context, 1)));
  return success();
}

#define GET_OP_CLASSES
#include "forge/Dialect/ForgeOps.cpp.inc"

bool mlir::forge::isStorageCompatible(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != actual.size())
    return false;
  for (auto [i, a] : llvm::zip(inferred, actual)) {
    if (i == a)
      continue;
    auto it = dyn_cast<RankedTensorType>(i), at = dyn_cast<RankedTensorType>(a);
    if (!it || !at || it.getShape() != at.getShape() ||
        !isa<FloatType>(it.getElementType()) || !isa<FloatType>(at.getElementType()))
      return false;
  }
  return true;
}

llvm::StringRef mlir::forge::sourceNodeName(Location loc) {
  if (auto name = dyn_cast<NameLoc>(loc))
    return name.getName().getValue();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (llvm::StringRef name = sourceNodeName(inner); !name.empty())
        return name;
  return {};
}

std::string mlir::forge::launchKind(Operation *op) {
  std::string kind =
      op->getName().getStringRef().drop_front(op->getName().getDialectNamespace().size() + 1).str();
  if (auto fusion = dyn_cast<FusionOp>(op))
    kind += " " + fusion.getKind().str();
  return kind;
}
