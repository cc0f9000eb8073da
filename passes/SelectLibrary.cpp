//===- SelectLibrary.cpp - matmul/gemm/conv onto cuBLASLt and cuDNN --------===//
//
// The compiler's one statement of which forms the CUDA runtime's library
// paths take (runtime/lib/cuda/Matmul.h and Conv.h execute them). An op this
// pass leaves unmarked gets a generated kernel.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SELECTLIBRARY
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// Static f32 operands and results, and some result to compute (an op whose
/// results are all empty is a zero-byte copy, forge-generate-kernels).
bool staticF32(Operation *op) {
  SmallVector<Type> types(op->getOperandTypes());
  llvm::append_range(types, op->getResultTypes());
  auto f32 = [](Type type) {
    auto t = dyn_cast<RankedTensorType>(type);
    return t && t.hasStaticShape() && t.getElementType().isF32();
  };
  auto empty = [](Type type) { return cast<RankedTensorType>(type).getNumElements() == 0; };
  return llvm::all_of(types, f32) && !llvm::all_of(op->getResultTypes(), empty);
}

/// conv, conv_transpose, conv_grad_weight: 1-3 spatial dims, symmetric pads.
bool cudnnTakes(Operation *op) {
  auto x = cast<RankedTensorType>(op->getOperand(0).getType());
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
    auto y = cast<RankedTensorType>(transpose.getResult().getType());
    auto w = cast<RankedTensorType>(op->getOperand(1).getType());
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

/// gemm: 2-d operands; C absent, a full [M, N] matrix (scaled by beta), or a
/// bias row [N] / [1, N] (cuBLASLt's bias epilogue, which beta does not scale).
bool cublasTakesGemm(GemmOp gemm) {
  auto lhs = cast<RankedTensorType>(gemm.getA().getType());
  auto rhs = cast<RankedTensorType>(gemm.getB().getType());
  auto out = cast<RankedTensorType>(gemm.getResult().getType());
  if (lhs.getRank() != 2 || rhs.getRank() != 2)
    return false;
  if (!gemm.getC())
    return true;
  auto c = cast<RankedTensorType>(gemm.getC().getType());
  if (c.getShape() == out.getShape())
    return true;
  int64_t n = out.getDimSize(1);
  bool row = (c.getRank() == 1 && c.getDimSize(0) == n) ||
             (c.getRank() == 2 && c.getDimSize(0) == 1 && c.getDimSize(1) == n && n > 1);
  return row && gemm.getBeta().convertToDouble() == 1.0;
}

/// matmul: rhs a matrix (the lhs batch folds into M), or equal batch shapes,
/// or one side without batch (broadcast with batch stride 0).
bool cublasTakesMatmul(MatMulOp matmul) {
  auto lhs = cast<RankedTensorType>(matmul.getLhs().getType());
  auto rhs = cast<RankedTensorType>(matmul.getRhs().getType());
  if (lhs.getRank() < 2 || rhs.getRank() < 2)
    return false;
  auto lb = lhs.getShape().drop_back(2), rb = rhs.getShape().drop_back(2);
  auto ones = [](ArrayRef<int64_t> s) { return llvm::all_of(s, [](int64_t d) { return d == 1; }); };
  return rb.empty() || ones(rb) || lb == rb || lb.empty() || ones(lb);
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
  if (!matmul || matmul.getTransA() || !staticF32(add) || !staticF32(matmul))
    return false;
  auto a = cast<RankedTensorType>(matmul.getLhs().getType());
  auto w = cast<RankedTensorType>(matmul.getRhs().getType());
  auto out = cast<RankedTensorType>(add.getType());
  auto b = cast<RankedTensorType>(bias.getType());
  int64_t n = out.getShape().back();
  if (a.getRank() < 2 || w.getRank() != 2 || b.getRank() != 1 || b.getDimSize(0) != n ||
      out != matmul.getType())
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

struct SelectLibraryPass : public mlir::forge::impl::SelectLibraryBase<SelectLibraryPass> {
  void runOnOperation() override {
    bool changed = false;
    for (AddOp add : llvm::to_vector(getOperation().getBody().getOps<AddOp>()))
      changed |= foldBiasEpilogue(add);
    getOperation().walk([&](Operation *op) {
      if (!isa<MatMulOp, GemmOp, ConvOp, ConvTransposeOp, ConvGradWeightOp>(op) ||
          !staticF32(op))
        return;
      StringRef library;
      if (auto matmul = dyn_cast<MatMulOp>(op))
        library = cublasTakesMatmul(matmul) ? "cublaslt" : "";
      else if (auto gemm = dyn_cast<GemmOp>(op))
        library = cublasTakesGemm(gemm) ? "cublaslt" : "";
      else
        library = cudnnTakes(op) ? "cudnn" : "";
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
