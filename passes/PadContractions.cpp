//===- PadContractions.cpp - aligned rows for cuBLASLt's GEMMs ------------===//
//
// cuBLASLt's fast GEMM kernels read and write whole 16-byte vectors: every
// matrix's leading dimension must be a multiple of 16 bytes (4 f32, 8 f16 or
// bf16 elements). A contraction whose innermost dims are not runs its
// unaligned kernels, 2-3x slower (GPT-2's LM head, N = 50257: 30 ms of a
// 127 ms step). Such a matmul or gemm gets its dims zero-padded to the
// alignment: K on both operands (the product is unchanged), N on the rhs and
// M on a transposed lhs, whose extra rows/columns of the result are sliced
// off. Invariants: results are bit-identical (the padding adds exact zeros);
// only static float contractions of at least `min-flops` are padded, where a
// 2x faster GEMM outweighs the copies the pads and slices make.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::forge {
#define GEN_PASS_DEF_PADCONTRACTIONS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// Elements per 16 bytes of `elem`; 0 for non-float types.
int64_t alignmentOf(Type elem) {
  if (!isa<FloatType>(elem) || elem.getIntOrFloatBitWidth() > 32)
    return 0;
  return 128 / elem.getIntOrFloatBitWidth();
}

int64_t roundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/// `v` zero-padded at the end of `axis` to `size`.
Value padAxis(OpBuilder &b, Location loc, Value v, int64_t axis, int64_t size) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getDimSize(axis) == size)
    return v;
  SmallVector<int64_t> shape(type.getShape()), pads(2 * type.getRank(), 0);
  pads[type.getRank() + axis] = size - shape[axis];
  shape[axis] = size;
  return b.create<PadOp>(loc, RankedTensorType::get(shape, type.getElementType()), v,
                         b.getDenseI64ArrayAttr(pads), b.getStringAttr("constant"),
                         b.getF64FloatAttr(0.0));
}

/// What to pad in op(A) [.., M, K] x op(B) [.., K, N] -> [.., M, N].
struct Padding {
  int64_t m, n, k;       // padded sizes
  bool padM, padN, padK; // which differ from the op's
};

/// The padding a contraction of these operands needs, or nullopt when its
/// rows are aligned already, it is not a static float contraction, or it is
/// too small to pay.
std::optional<Padding> planPadding(RankedTensorType lhs, RankedTensorType rhs,
                                   RankedTensorType out, bool transA, bool transB,
                                   int64_t minFlops, int64_t minElements) {
  if (!lhs.hasStaticShape() || !rhs.hasStaticShape() || !out.hasStaticShape() ||
      lhs.getRank() < 2 || rhs.getRank() < 2 || out.getNumElements() == 0)
    return std::nullopt;
  int64_t align = alignmentOf(out.getElementType());
  if (align != 0 && minElements > align)
    align = minElements; // stored in a narrower type later (forge-assign-precision)
  if (align == 0 || lhs.getElementType() != out.getElementType() ||
      rhs.getElementType() != out.getElementType())
    return std::nullopt;
  int64_t lr = lhs.getRank(), rr = rhs.getRank();
  int64_t m = lhs.getDimSize(transA ? lr - 1 : lr - 2), k = lhs.getDimSize(transA ? lr - 2 : lr - 1);
  int64_t n = rhs.getDimSize(transB ? rr - 2 : rr - 1);
  // 2 * M * N * K per matrix product; the batch is the result's other dims.
  double flops = 2.0 * static_cast<double>(out.getNumElements()) * static_cast<double>(k);
  if (flops < static_cast<double>(minFlops))
    return std::nullopt;
  Padding p{m, n, k, false, false, false};
  // K is a leading dimension unless both operands hold it as their outer dim;
  // N is the result's; M only that of a transposed lhs.
  p.padK = k % align != 0 && (!transA || transB);
  p.padN = n % align != 0;
  p.padM = m % align != 0 && transA;
  if (!p.padM && !p.padN && !p.padK)
    return std::nullopt;
  if (p.padK)
    p.k = roundUp(k, align);
  if (p.padN)
    p.n = roundUp(n, align);
  if (p.padM)
    p.m = roundUp(m, align);
  return p;
}

/// The operands padded as `p` says; the result type with padded M and N.
struct PaddedOperands {
  Value lhs, rhs;
  RankedTensorType out;
};
PaddedOperands padOperands(OpBuilder &b, Location loc, Value lhs, Value rhs,
                           RankedTensorType out, bool transA, bool transB, const Padding &p) {
  int64_t lr = cast<RankedTensorType>(lhs.getType()).getRank();
  int64_t rr = cast<RankedTensorType>(rhs.getType()).getRank();
  lhs = padAxis(b, loc, lhs, transA ? lr - 2 : lr - 1, p.k);
  lhs = padAxis(b, loc, lhs, transA ? lr - 1 : lr - 2, p.m);
  rhs = padAxis(b, loc, rhs, transB ? rr - 1 : rr - 2, p.k);
  rhs = padAxis(b, loc, rhs, transB ? rr - 2 : rr - 1, p.n);
  SmallVector<int64_t> shape(out.getShape());
  shape[shape.size() - 2] = p.m;
  shape.back() = p.n;
  return {lhs, rhs, RankedTensorType::get(shape, out.getElementType())};
}

bool padMatmul(MatMulOp op, int64_t minFlops, int64_t minElements) {
  auto lhs = cast<RankedTensorType>(op.getLhs().getType());
  auto rhs = cast<RankedTensorType>(op.getRhs().getType());
  auto out = cast<RankedTensorType>(op.getType());
  std::optional<Padding> p = planPadding(lhs, rhs, out, op.getTransA(), op.getTransB(), minFlops,
                                         minElements);
  if (!p)
    return false;
  OpBuilder b(op);
  PaddedOperands padded = padOperands(b, op.getLoc(), op.getLhs(), op.getRhs(), out,
                                      op.getTransA(), op.getTransB(), *p);
  auto product = b.create<MatMulOp>(op.getLoc(), padded.out, padded.lhs, padded.rhs,
                                    op.getTransAAttr(), op.getTransBAttr());
  op.replaceAllUsesWith(createLeadingSlice(b, op.getLoc(), product, out.getShape()));
  op.erase();
  return true;
}

bool padGemm(GemmOp op, int64_t minFlops, int64_t minElements) {
  auto lhs = cast<RankedTensorType>(op.getA().getType());
  auto rhs = cast<RankedTensorType>(op.getB().getType());
  auto out = cast<RankedTensorType>(op.getType());
  if (lhs.getRank() != 2 || rhs.getRank() != 2)
    return false;
  std::optional<Padding> p = planPadding(lhs, rhs, out, op.getTransA(), op.getTransB(), minFlops,
                                         minElements);
  if (!p)
    return false;
  OpBuilder b(op);
  Location loc = op.getLoc();
  PaddedOperands padded =
      padOperands(b, loc, op.getA(), op.getB(), out, op.getTransA(), op.getTransB(), *p);
  // C broadcasts to [M, N]: its dims of size M or N (not 1) grow with them.
  Value c = op.getC();
  if (c) {
    auto ct = cast<RankedTensorType>(c.getType());
    int64_t cr = ct.getRank();
    if (cr >= 1 && ct.getDimSize(cr - 1) == out.getDimSize(1) && out.getDimSize(1) != 1)
      c = padAxis(b, loc, c, cr - 1, p->n);
    if (cr == 2 && ct.getDimSize(0) == out.getDimSize(0) && out.getDimSize(0) != 1)
      c = padAxis(b, loc, c, 0, p->m);
  }
  auto product = b.create<GemmOp>(loc, padded.out, padded.lhs, padded.rhs, c, op.getTransAAttr(),
                                  op.getTransBAttr(), op.getAlphaAttr(), op.getBetaAttr());
  op.replaceAllUsesWith(createLeadingSlice(b, loc, product, out.getShape()));
  op.erase();
  return true;
}

struct PadContractionsPass
    : public mlir::forge::impl::PadContractionsBase<PadContractionsPass> {
  using PadContractionsBase::PadContractionsBase;
  void runOnOperation() override {
    bool changed = false;
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (isa<MatMulOp, GemmOp>(op))
        ops.push_back(op);
    });
    for (Operation *op : ops) {
      if (auto matmul = dyn_cast<MatMulOp>(op))
        changed |= padMatmul(matmul, minFlops, minElements);
      else
        changed |= padGemm(cast<GemmOp>(op), minFlops, minElements);
    }
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace
