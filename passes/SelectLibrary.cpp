//===- SelectLibrary.cpp - matmul/gemm/conv onto cuBLASLt and cuDNN --------===//
//
// The compiler's one statement of which forms the CUDA runtime's library
// paths take (runtime/lib/cuda/Matmul.h and Conv.h execute them). An op this
// pass leaves unmarked gets a generated kernel.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SELECTLIBRARY
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// `v`'s type in the channels-first form [N, C, spatial...] (a channels-last
/// convolution's operands and result are [N, spatial..., C]).
RankedTensorType channelsFirstType(Operation *op, Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  auto last = op->getAttrOfType<BoolAttr>("channels_last");
  if (!last || !last.getValue() || t.getRank() < 3)
    return t;
  SmallVector<int64_t> shape(t.getShape());
  std::rotate(shape.begin() + 1, shape.end() - 1, shape.end());
  return RankedTensorType::get(shape, t.getElementType());
}

/// Whether cuDNN's legacy convolution API takes the operand types: f32, or
/// bf16/f16 for every operand and the result (its "pseudo" configurations
/// accumulate in f32).
bool cudnnTypes(Operation *op) {
  auto type = [](Type t) {
    auto r = dyn_cast<RankedTensorType>(t);
    return r && r.hasStaticShape() && r.getNumElements() > 0 ? r.getElementType() : Type();
  };
  Type elem = type(op->getResult(0).getType());
  if (!elem || !(elem.isF32() || elem.isBF16() || elem.isF16()))
    return false;
  return llvm::all_of(op->getOperandTypes(), [&](Type t) { return type(t) == elem; });
}

/// conv, conv_transpose, conv_grad_weight: 1-3 spatial dims, symmetric pads.
bool cudnnTakes(Operation *op) {
  auto x = channelsFirstType(op, op->getOperand(0));
  int64_t spatial = x.getRank() - 2;
  auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
  if (spatial < 1 || spatial > 3 || !pads || pads.size() != 2 * spatial)
    return false;
  for (int64_t d = 0; d < spatial; ++d)
    if (pads[d] != pads[d + spatial])
      return false;
  // conv_transpose runs as cuDNN's backward-data of the conv from its result to
  // its input, which must then follow the conv formula: not so when
  // output_padding reaches the stride (the extra outputs see no input).
  if (auto transpose = dyn_cast<ConvTransposeOp>(op)) {
    auto y = channelsFirstType(op, transpose.getResult());
    auto w = channelsFirstType(op, op->getOperand(1));
    auto strides = op->getAttrOfType<DenseI64ArrayAttr>("strides");
    auto dilations = op->getAttrOfType<DenseI64ArrayAttr>("dilations");
    if (!strides || !dilations || strides.size() != spatial || dilations.size() != spatial)
      return false;
    for (int64_t d = 0; d < spatial; ++d) {
      int64_t window = dilations[d] * (w.getDimSize(d + 2) - 1) + 1;
      if ((y.getDimSize(d + 2) + 2 * pads[d] - window) / strides[d] + 1 != x.getDimSize(d + 2))
        return false;
    }
  }
  return true;
}

/// Why cuDNN's flash attention (runtime/lib/cuda/Attention.h) does not take
/// an attention or attention_grad op ("" when it does): q, k, v (and o,
/// grad_output and the gradients) in one of bf16/f16, lse f32, head sizes
/// equal, a multiple of 8 up to 128.
std::string cudnnAttentionRefusal(Operation *op) {
  auto q = cast<RankedTensorType>(op->getOperand(0).getType());
  Type elem = q.getElementType();
  if (!elem.isBF16() && !elem.isF16())
    return "cuDNN's flash attention takes bf16 or f16 operands (compile with --precision bf16 "
           "or fp16)";
  SmallVector<Value> values(op->getOperands());
  llvm::append_range(values, op->getResults());
  for (Value v : values) {
    auto t = cast<RankedTensorType>(v.getType());
    bool lse = isa<AttentionOp>(op) ? v == op->getResult(1) : v == op->getOperand(4);
    if (t.getElementType() != (lse ? Type(Float32Type::get(op->getContext())) : elem))
      return lse ? "its lse must be f32" : "its operands and results must share one type";
  }
  auto fwd = dyn_cast<AttentionOp>(op);
  auto grad = dyn_cast<AttentionGradOp>(op);
  bool bias = fwd ? bool(fwd.getBias()) : bool(grad.getBias());
  if (bias && (fwd ? fwd.getCausal() : grad.getCausal()))
    return "cuDNN's causal mask beside a bias hides a fully masked row's keys with a finite "
           "fill (forge-recognize-composites folds the triangle into the bias)";
  return cudnnAttentionHeadRefusal(q.getDimSize(3),
                                   cast<RankedTensorType>(op->getOperand(2).getType()).getDimSize(3));
}

/// A cuBLASLt problem (the bundle's MatmulProblem; runtime/lib/cuda/Matmul.h
/// executes it as stated): row-major Y = alpha op(lhs) op(rhs) (+ beta C |
/// + bias row) over `batch` strided batches.
struct MatmulForm {
  int64_t m = 0, n = 0, k = 0, batch = 1, lhsBatchStride = 0, rhsBatchStride = 0;
  bool transA = false, transB = false;
  StringRef c = "none"; // none | full | bias
  double alpha = 1.0, beta = 0.0;
  // A gemm region's epilogue: relu | relu_aux | drelu | bias | bgrad_lhs | bgrad_rhs |
  // gelu | gelu_aux | dgelu | dgelu_bgrad (none: not stated).
  StringRef epilogue = "none";
  // A scaled_gemm: float8 lhs/rhs and their scales (inputs 2 and 3).
  bool scaled = false;
};

/// gemm: 2-d operands; C absent, a full [M, N] matrix (scaled by beta), or a
/// bias row [N] / [1, N] (cuBLASLt's bias epilogue, which beta does not scale).
std::optional<MatmulForm> cublasForm(GemmOp gemm) {
  auto lhs = cast<RankedTensorType>(gemm.getA().getType());
  auto rhs = cast<RankedTensorType>(gemm.getB().getType());
  auto out = cast<RankedTensorType>(gemm.getResult().getType());
  if (lhs.getRank() != 2 || rhs.getRank() != 2)
    return std::nullopt;
  MatmulForm f;
  f.transA = gemm.getTransA();
  f.transB = gemm.getTransB();
  f.m = lhs.getDimSize(f.transA ? 1 : 0);
  f.k = lhs.getDimSize(f.transA ? 0 : 1);
  f.n = rhs.getDimSize(f.transB ? 0 : 1);
  f.alpha = gemm.getAlpha().convertToDouble();
  if (!gemm.getC())
    return f;
  auto c = cast<RankedTensorType>(gemm.getC().getType());
  double beta = gemm.getBeta().convertToDouble();
  if (c.getShape() == out.getShape()) {
    f.c = "full";
    f.beta = beta;
    return f;
  }
  int64_t n = out.getDimSize(1);
  bool row = (c.getRank() == 1 && c.getDimSize(0) == n) ||
             (c.getRank() == 2 && c.getDimSize(0) == 1 && c.getDimSize(1) == n && n > 1);
  if (!row || beta != 1.0)
    return std::nullopt;
  f.c = "bias";
  f.beta = 1.0;
  return f;
}

/// scaled_gemm: as gemm, in the one layout Hopper's float8 GEMMs read (both
/// operands K-major: lhs [M, K], rhs [N, K]), with K and N multiples of 16
/// (16-byte rows of float8 and of the output); no full C beside a bias row
/// of another type is possible, so C is absent, a row or a full matrix.
std::optional<MatmulForm> cublasForm(ScaledGemmOp gemm) {
  auto lhs = cast<RankedTensorType>(gemm.getA().getType());
  auto rhs = cast<RankedTensorType>(gemm.getB().getType());
  auto out = cast<RankedTensorType>(gemm.getResult().getType());
  if (gemm.getTransA() || !gemm.getTransB() || lhs.getRank() != 2 || rhs.getRank() != 2)
    return std::nullopt;
  MatmulForm f;
  f.scaled = true;
  f.transB = true;
  f.m = lhs.getDimSize(0);
  f.k = lhs.getDimSize(1);
  f.n = rhs.getDimSize(0);
  if (f.k % 16 != 0 || f.n % 16 != 0)
    return std::nullopt;
  f.alpha = gemm.getAlpha().convertToDouble();
  if (!gemm.getC())
    return f;
  auto c = cast<RankedTensorType>(gemm.getC().getType());
  if (c.getShape() == out.getShape()) {
    f.c = "full";
    f.beta = gemm.getBeta().convertToDouble();
    return f;
  }
  if (c.getRank() != 1 || c.getDimSize(0) != f.n || gemm.getBeta().convertToDouble() != 1.0)
    return std::nullopt;
  f.c = "bias";
  f.beta = 1.0;
  return f;
}

/// matmul: rhs a matrix (the lhs batch folds into M, unless the lhs is
/// transposed), or equal batch shapes, or one side without batch (broadcast
/// with batch stride 0).
std::optional<MatmulForm> cublasForm(MatMulOp matmul) {
  auto lhs = cast<RankedTensorType>(matmul.getLhs().getType());
  auto rhs = cast<RankedTensorType>(matmul.getRhs().getType());
  if (lhs.getRank() < 2 || rhs.getRank() < 2)
    return std::nullopt;
  MatmulForm f;
  f.transA = matmul.getTransA();
  f.transB = matmul.getTransB();
  int64_t lr = lhs.getRank(), rr = rhs.getRank();
  f.m = lhs.getDimSize(f.transA ? lr - 1 : lr - 2);
  f.k = lhs.getDimSize(f.transA ? lr - 2 : lr - 1);
  f.n = rhs.getDimSize(f.transB ? rr - 2 : rr - 1);
  auto lb = lhs.getShape().drop_back(2), rb = rhs.getShape().drop_back(2);
  auto ones = [](ArrayRef<int64_t> s) { return llvm::all_of(s, [](int64_t d) { return d == 1; }); };
  if ((rb.empty() || ones(rb)) && f.transA) {
    f.batch = ShapedType::getNumElements(lb); // a transposed lhs batch cannot fold into M
    f.lhsBatchStride = f.m * f.k;
  } else if (rb.empty() || ones(rb)) {
    f.m *= ShapedType::getNumElements(lb); // the lhs batch folds into M
  } else if (lb == rb) {
    f.batch = ShapedType::getNumElements(lb);
    f.lhsBatchStride = f.m * f.k;
    f.rhsBatchStride = f.k * f.n;
  } else if (lb.empty() || ones(lb)) {
    f.batch = ShapedType::getNumElements(rb);
    f.rhsBatchStride = f.k * f.n;
  } else {
    return std::nullopt;
  }
  if (f.batch == 1) // one product has no batch to stride over (a 2-D transposed lhs lands here)
    f.lhsBatchStride = f.rhsBatchStride = 0;
  return f;
}

DictionaryAttr formAttr(MLIRContext *ctx, const MatmulForm &f) {
  Builder b(ctx);
  SmallVector<NamedAttribute> attrs({
      b.getNamedAttr("m", b.getI64IntegerAttr(f.m)),
      b.getNamedAttr("n", b.getI64IntegerAttr(f.n)),
      b.getNamedAttr("k", b.getI64IntegerAttr(f.k)),
      b.getNamedAttr("batch", b.getI64IntegerAttr(f.batch)),
      b.getNamedAttr("trans_a", b.getBoolAttr(f.transA)),
      b.getNamedAttr("trans_b", b.getBoolAttr(f.transB)),
      b.getNamedAttr("lhs_batch_stride", b.getI64IntegerAttr(f.lhsBatchStride)),
      b.getNamedAttr("rhs_batch_stride", b.getI64IntegerAttr(f.rhsBatchStride)),
      b.getNamedAttr("c", b.getStringAttr(f.c)),
      b.getNamedAttr("alpha", b.getF64FloatAttr(f.alpha)),
      b.getNamedAttr("beta", b.getF64FloatAttr(f.beta)),
  });
  if (f.epilogue != "none")
    attrs.push_back(b.getNamedAttr("epilogue", b.getStringAttr(f.epilogue)));
  if (f.scaled)
    attrs.push_back(b.getNamedAttr("scaled", b.getBoolAttr(true)));
  return b.getDictionaryAttr(attrs);
}

/// The cuBLASLt problem of a forge.fusion "gemm" (its product and epilogue,
/// which the region's verifier fixed): RELU (RELU_BIAS with a bias row) after
/// a product without a full C; BIAS from the region's last input after a
/// product with a full C; a bias gradient (BGRADB/BGRADA: cuBLASLt's B is the
/// lhs here) of one product, no C; the tanh GELU (GELU[_AUX][_BIAS]) and its
/// gradient (DGELU[_BGRAD], the GELU's input the region's last argument),
/// whose aux matrices need n a multiple of 8.
std::optional<MatmulForm> cublasForm(FusionOp region) {
  Operation *product = &region.getBlock().front();
  std::optional<MatmulForm> f;
  if (auto matmul = dyn_cast<MatMulOp>(product))
    f = cublasForm(matmul);
  else if (auto scaled = dyn_cast<ScaledGemmOp>(product))
    f = cublasForm(scaled);
  else
    f = cublasForm(cast<GemmOp>(product));
  if (!f)
    return std::nullopt;
  Operation *epilogue = product->getNextNode();
  if (isa<AddOp>(epilogue)) {
    // The bias row (BIAS) beside a full C (the residual forge-fuse put there);
    // beside float8 operands cuBLASLt takes a bf16 row only.
    Type row = cast<RankedTensorType>(region.getInputs().back().getType()).getElementType();
    if (f->c != "full" || (f->scaled && !row.isBF16()))
      return std::nullopt;
    f->epilogue = "bias";
    return f;
  }
  if (isa<ReluOp>(epilogue)) {
    // RELU_AUX(_BIAS) when the region yields the bitmask too (one product).
    bool aux = region.getNumResults() == 2;
    if (f->c == "full" || (aux && f->batch != 1))
      return std::nullopt;
    f->epilogue = aux ? "relu_aux" : "relu";
    return f;
  }
  if (isa<ReluGradBitmaskOp>(epilogue)) {
    // DRELU reading the bitmask, the region's last argument.
    if (f->batch != 1 || f->c != "none")
      return std::nullopt;
    f->epilogue = "drelu";
    return f;
  }
  if (isa<GeluOp>(epilogue)) {
    // GELU(_BIAS), and GELU_AUX(_BIAS) when the region yields the product too.
    // The aux matrix's leading dimension (n) must be a multiple of 8.
    bool aux = region.getNumResults() == 2;
    if (f->c == "full" || (aux && (f->n % 8 != 0 || f->batch != 1)))
      return std::nullopt;
    f->epilogue = aux ? "gelu_aux" : "gelu";
    return f;
  }
  if (isa<GeluGradOp>(epilogue)) {
    // DGELU reading the region's last argument; DGELU_BGRAD with the sum.
    if (f->batch != 1 || f->c != "none" || f->n % 8 != 0)
      return std::nullopt;
    f->epilogue = region.getNumResults() == 2 ? "dgelu_bgrad" : "dgelu";
    return f;
  }
  if (f->batch != 1 || f->c != "none")
    return std::nullopt;
  f->epilogue = epilogue->getOperand(0) == region.getBlock().getArgument(0) ? "bgrad_lhs"
                                                                             : "bgrad_rhs";
  return f;
}

/// cuBLASLt's element types (runtime/lib/cuda/Matmul.cpp): lhs and rhs f32,
/// bf16 or f16 of one type, the output f32 or theirs, C (full or a bias row)
/// the output's type; static shapes with elements. A scaled_gemm's lhs and
/// rhs are float8 (E4M3 or E5M2, not both E5M2), its output f32 or bf16, a
/// bias row bf16 (cuBLASLt takes no other beside float8 operands), a full C
/// the output's type.
bool cublasTypes(Operation *op) {
  auto elem = [](Value v) { return cast<RankedTensorType>(v.getType()).getElementType(); };
  auto nonEmpty = [](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.hasStaticShape() && t.getNumElements() > 0;
  };
  if (!llvm::all_of(op->getOperands(), nonEmpty) || !llvm::all_of(op->getResults(), nonEmpty))
    return false;
  Type ab = elem(op->getOperand(0)), out = elem(op->getResult(0));
  if (auto scaled = dyn_cast<ScaledGemmOp>(op)) {
    if (elem(scaled.getA()).isFloat8E5M2() && elem(scaled.getB()).isFloat8E5M2())
      return false;
    if (!(out.isF32() || out.isBF16()))
      return false;
    if (Value c = scaled.getC()) {
      bool row = cast<RankedTensorType>(c.getType()).getRank() == 1;
      return row ? elem(c).isBF16() : elem(c) == out;
    }
    return true;
  }
  if (!(ab.isF32() || ab.isBF16() || ab.isF16()) || elem(op->getOperand(1)) != ab ||
      !(out.isF32() || out == ab))
    return false;
  if (op->getNumOperands() > 2 && elem(op->getOperand(2)) != out)
    return false;
  return true;
}

/// add(matmul(A, W), b) with W a matrix and b a row of N: one gemm with
/// cuBLASLt's bias epilogue over A's rows (A's batch dims fold into M), so the
/// bias is added as the product is written instead of by a kernel of its own
/// that reads and writes the product again. Only a standalone add (fusion left
/// it alone, e.g. GPT-2's qkv bias before the split) and an A without transA.
bool foldBiasEpilogue(AddOp add) {
  MatMulOp matmul;
  Value bias;
  for (auto [x, y] : {std::pair(add.getLhs(), add.getRhs()), std::pair(add.getRhs(), add.getLhs())})
    if (auto m = x.getDefiningOp<MatMulOp>(); m && m->hasOneUse()) {
      matmul = m;
      bias = y;
      break;
    }
  if (!matmul || matmul.getTransA() || !cublasTypes(matmul))
    return false;
  auto a = cast<RankedTensorType>(matmul.getLhs().getType());
  auto w = cast<RankedTensorType>(matmul.getRhs().getType());
  auto out = cast<RankedTensorType>(add.getType());
  auto b = cast<RankedTensorType>(bias.getType());
  int64_t n = out.getShape().back();
  // The sum is written in the product's place: f32, or the operands' type
  // (forge-assign-precision stores it low, with a bias row of that type).
  Type outElem = out.getElementType();
  if (a.getRank() < 2 || w.getRank() != 2 || b.getRank() != 1 || b.getDimSize(0) != n ||
      out.getShape() != matmul.getType().getShape() || b.getElementType() != outElem ||
      !(outElem.isF32() || outElem == a.getElementType()) || !out.hasStaticShape() ||
      out.getNumElements() == 0)
    return false;
  int64_t k = a.getShape().back(), m = a.getNumElements() / std::max<int64_t>(k, 1);
  OpBuilder builder(add);
  Location loc = add.getLoc();
  Value lhs = matmul.getLhs();
  if (a.getRank() != 2)
    lhs = builder.create<ReshapeOp>(loc, RankedTensorType::get({m, k}, a.getElementType()), lhs,
                                    builder.getDenseI64ArrayAttr({m, k}));
  Value product = builder.create<GemmOp>(
      loc, RankedTensorType::get({m, n}, out.getElementType()), lhs, matmul.getRhs(), bias,
      builder.getBoolAttr(false), builder.getBoolAttr(matmul.getTransB()),
      builder.getF64FloatAttr(1.0), builder.getF64FloatAttr(1.0));
  if (out.getRank() != 2)
    product = builder.create<ReshapeOp>(loc, out, product,
                                        builder.getDenseI64ArrayAttr(out.getShape()));
  add.replaceAllUsesWith(product);
  add.erase();
  matmul.erase();
  return true;
}

/// cuBLASLt writes a bias gradient (BGRADA/BGRADB, DGELU_BGRAD) in D's type.
/// A gemm region whose sum has another type (forge-assign-precision keeps
/// sums f32: a DGELU's output is bf16 beside its f32 bias gradient) keeps
/// its product and epilogue, and the sum becomes a loose reduce_sum of what
/// it read (the region's output or input) after it: its own kernel, in f32.
/// Returns the region that stays.
FusionOp peelMismatchedSum(FusionOp region) {
  if (region.getNumResults() != 2)
    return region;
  Operation *yield = region.getBlock().getTerminator();
  auto sum = yield->getOperand(1).getDefiningOp<ReduceSumOp>();
  auto elem = [](Value v) { return cast<RankedTensorType>(v.getType()).getElementType(); };
  if (!sum || elem(sum.getResult()) == elem(region.getResult(0)))
    return region;
  Value read = sum->getOperand(0), outside;
  if (auto arg = dyn_cast<BlockArgument>(read); arg && arg.getOwner() == &region.getBlock())
    outside = region.getInputs()[arg.getArgNumber()];
  else if (read != yield->getOperand(0))
    return region; // not a form cublasForm takes: it is inlined
  FusionOp lone = region.rebuild(region.getInputs(), yield->getOperand(0));
  OpBuilder b(lone);
  IRMapping map;
  map.map(read, outside ? outside : lone.getResult(0));
  b.setInsertionPointAfter(lone);
  Operation *loose = b.clone(*sum, map);
  sum.erase();
  region.getResult(0).replaceAllUsesWith(lone.getResult(0));
  region.getResult(1).replaceAllUsesWith(loose->getResult(0));
  region.erase();
  return lone;
}

struct SelectLibraryPass : public mlir::forge::impl::SelectLibraryBase<SelectLibraryPass> {
  void runOnOperation() override {
    bool changed = false;
    for (AddOp add : llvm::to_vector(getOperation().getBody().getOps<AddOp>()))
      changed |= foldBiasEpilogue(add);
    // GEMM regions (forge-fuse) run as one call with their epilogue, or, when
    // cuBLASLt has no form for them, become their ops again (a plain GEMM
    // call and the epilogue's kernel).
    for (FusionOp region : llvm::to_vector(getOperation().getBody().getOps<FusionOp>())) {
      if (region.getKind() != "gemm")
        continue;
      changed = true;
      region = peelMismatchedSum(region);
      std::optional<MatmulForm> form;
      if (cublasTypes(&region.getBlock().front()))
        form = cublasForm(region);
      if (form) {
        region->setAttr("forge.matmul", formAttr(region->getContext(), *form));
        region->setAttr("forge.library", StringAttr::get(region->getContext(), "cublaslt"));
      } else {
        region.inlineBody();
      }
    }
    // Attention has no generated kernel: cuDNN's flash attention runs it
    // (forge-recognize-composites formed it only in the forms cuDNN takes,
    // and forge-assign-precision gave it bf16/f16 operands).
    WalkResult attention = getOperation().walk([&](Operation *op) {
      if (!isa<AttentionOp, AttentionGradOp>(op))
        return WalkResult::advance();
      if (std::string why = cudnnAttentionRefusal(op); !why.empty()) {
        op->emitError() << "forge-select-library: no CUDA kernel for " << op->getName() << ": "
                        << why;
        return WalkResult::interrupt();
      }
      op->setAttr("forge.library", StringAttr::get(op->getContext(), "cudnn"));
      changed = true;
      return WalkResult::advance();
    });
    if (attention.wasInterrupted())
      return signalPassFailure();
    // The LM head's GEMM with its loss (forge-fuse-linear-cross-entropy made it
    // only in the form the runtime's CUTLASS kernels take) has no other kernel.
    getOperation().walk([&](LinearCrossEntropyWithGradOp op) {
      op->setAttr("forge.library", StringAttr::get(op->getContext(), "cutlass"));
      changed = true;
    });
    // A scaled_gemm has no generated kernel: cuBLASLt must take it
    // (forge-assign-precision made it only in forms cublasForm accepts).
    WalkResult scaled = getOperation().walk([&](ScaledGemmOp op) {
      if (op->getParentOfType<FusionOp>() || (cublasTypes(op) && cublasForm(op)))
        return WalkResult::advance();
      op->emitError() << "forge-select-library: cuBLASLt takes no form of this scaled_gemm (it "
                         "needs lhs [M, K] and rhs [N, K] with K and N multiples of 16, not both "
                         "E5M2, an f32 or bf16 output and a bf16 bias row)";
      return WalkResult::interrupt();
    });
    if (scaled.wasInterrupted())
      return signalPassFailure();
    getOperation().walk([&](Operation *op) {
      if (!isa<MatMulOp, GemmOp, ScaledGemmOp, ConvOp, ConvTransposeOp, ConvGradWeightOp>(op) ||
          op->getParentOfType<FusionOp>())
        return;
      bool takes =
          isa<MatMulOp, GemmOp, ScaledGemmOp>(op) ? cublasTypes(op) : cudnnTypes(op);
      if (!takes)
        return;
      StringRef library;
      std::optional<MatmulForm> form;
      if (auto matmul = dyn_cast<MatMulOp>(op))
        form = cublasForm(matmul);
      else if (auto gemm = dyn_cast<GemmOp>(op))
        form = cublasForm(gemm);
      else if (auto scaled = dyn_cast<ScaledGemmOp>(op))
        form = cublasForm(scaled);
      else
        library = cudnnTakes(op) ? "cudnn" : "";
      if (form) {
        library = "cublaslt";
        op->setAttr("forge.matmul", formAttr(op->getContext(), *form));
      }
      if (library.empty())
        return;
      op->setAttr("forge.library", StringAttr::get(op->getContext(), library));
      changed = true;
    });
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace

std::string mlir::forge::cudnnAttentionHeadRefusal(int64_t d, int64_t dv) {
  if (d != dv)
    return "head sizes of q and v differ";
  if (d % 8 != 0 || d > 128)
    return "head size " + std::to_string(d) + " is not a multiple of 8 up to 128";
  return "";
}

bool mlir::forge::isStaticNonEmptyF32(Operation *op) {
  auto f32 = [](Type type) {
    auto t = dyn_cast<RankedTensorType>(type);
    return t && t.hasStaticShape() && t.getNumElements() > 0 && t.getElementType().isF32();
  };
  return llvm::all_of(op->getOperandTypes(), f32) && llvm::all_of(op->getResultTypes(), f32);
}
