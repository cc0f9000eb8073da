//===- Matmul.cpp - generated matmul and gemm -------------------------------===//
//
// The generated matmul/gemm, for the forms cuBLASLt does not take
// (isLibraryCall): correct, not fast.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

/// matmul (NumPy semantics: 1-d operands, broadcast batch dims) and gemm
/// (transA/transB, alpha, beta, C broadcast to [M, N]) in the forms cuBLASLt
/// does not take (isLibraryCall): other dtypes, broadcast batches, vectors, a
/// scaled or broadcast C. One thread per output element, a K loop accumulating
/// in f32 (f64 for f64; integers wrap): the correct path, not the fast one.
std::optional<KernelLaunch> KernelGenerator::Impl::matmulKernel(Operation *op, StringRef name) {
  bool gemm = op->getName().stripDialect() == "gemm";
  auto lhs = tensorType(op->getOperand(0)), rhs = tensorType(op->getOperand(1));
  auto out = tensorType(op->getResult(0));
  Type elem = out.getElementType();
  if (lhs.getElementType() != elem || rhs.getElementType() != elem || elem.isInteger(1) ||
      out.getNumElements() == 0 || lhs.getRank() < 1 || rhs.getRank() < 1)
    return std::nullopt;
  auto intAttr = [&](StringRef n) {
    auto a = op->getAttrOfType<IntegerAttr>(n);
    return a && a.getInt() != 0;
  };
  bool transA = intAttr("transA"), transB = intAttr("transB"); // gemm's, or matmul's flags
  // Operands as [batch..., rows, cols] (a 1-d lhs is one row, a 1-d rhs one column).
  SmallVector<int64_t> ls(lhs.getShape()), rs(rhs.getShape());
  if (ls.size() == 1)
    ls.insert(ls.begin(), 1);
  if (rs.size() == 1)
    rs.push_back(1);
  if (gemm && (ls.size() != 2 || rs.size() != 2))
    return std::nullopt;
  int64_t m = transA ? ls.back() : ls[ls.size() - 2], depth = transA ? ls[ls.size() - 2] : ls.back();
  int64_t n = transB ? rs[rs.size() - 2] : rs.back();
  if ((transB ? rs.back() : rs[rs.size() - 2]) != depth || depth == 0)
    return std::nullopt;
  // Batch: the output's leading dims; each operand's batch dims broadcast into them.
  int64_t batchRank = std::max<int64_t>(ls.size(), rs.size()) - 2;
  SmallVector<int64_t> batch(batchRank, 1);
  auto alignBatch = [&](ArrayRef<int64_t> s) {
    SmallVector<int64_t> dims(batchRank - (static_cast<int64_t>(s.size()) - 2), 1);
    dims.append(s.begin(), s.end() - 2);
    return dims;
  };
  SmallVector<int64_t> lb = alignBatch(ls), rb = alignBatch(rs);
  for (int64_t d = 0; d < batchRank; ++d)
    batch[d] = std::max(lb[d], rb[d]);
  int64_t batchCount = 1;
  for (int64_t d : batch)
    batchCount *= d;
  if (batchCount * m * n != out.getNumElements())
    return std::nullopt;
  SmallVector<int64_t> lStride = broadcastStrides(lb, batch), rStride = broadcastStrides(rb, batch);
  // C of gemm, broadcast to [M, N].
  auto floatOf = [&](StringRef a, double d) {
    auto f = op->getAttrOfType<FloatAttr>(a);
    return f ? f.getValueAsDouble() : d;
  };
  double alpha = gemm ? floatOf("alpha", 1.0) : 1.0, beta = gemm ? floatOf("beta", 1.0) : 1.0;
  // beta == 0 means C is not read at all (BLAS): an inf or NaN in C must not leak.
  bool hasC = gemm && op->getNumOperands() > 2 && op->getOperand(2) && beta != 0.0;
  SmallVector<int64_t> cStride;
  if (hasC) {
    auto c = tensorType(op->getOperand(2));
    if (c.getElementType() != elem || c.getRank() > 2)
      return std::nullopt;
    cStride = broadcastStrides(c.getShape(), {m, n});
  }
  bool fl = isFloat(elem);
  if (!fl && (alpha != 1.0 || (hasC && beta != 1.0)))
    return std::nullopt;
  Type accType = computeType(elem);
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value col = k.rem(i, n), row = k.rem(k.div(i, n), m), bi = k.div(i, m * n);
    Value lBase = k.idx(0), rBase = k.idx(0), rest = bi;
    for (int64_t d = batchRank - 1; d >= 0; --d) {
      Value at = k.rem(rest, batch[d]);
      rest = k.div(rest, batch[d]);
      lBase = k.add(lBase, k.mul(at, k.idx(lStride[d] * m * depth)));
      rBase = k.add(rBase, k.mul(at, k.idx(rStride[d] * depth * n)));
    }
    Value lRow = transA ? row : k.mul(row, k.idx(depth));
    Value rCol = transB ? k.mul(col, k.idx(depth)) : col;
    Value zero = fl ? k.fconst(accType, 0.0) : intConst(k, accType, 0);
    Value sum = k.loopAcc(k.idx(0), depth, k.idx(1), zero, [&](Value j, Value s) {
      Value a = k.load(fn.getArgument(0),
                        k.add(lBase, k.add(lRow, transA ? k.mul(j, k.idx(m)) : j)), elem);
      Value c = k.load(fn.getArgument(1),
                        k.add(rBase, k.add(rCol, transB ? j : k.mul(j, k.idx(n)))), elem);
      return fl ? Value(b.create<arith::AddFOp>(k.loc, s, b.create<arith::MulFOp>(k.loc, a, c)))
                : Value(b.create<arith::AddIOp>(k.loc, s, b.create<arith::MulIOp>(k.loc, a, c)));
    });
    if (fl && alpha != 1.0)
      sum = b.create<arith::MulFOp>(k.loc, sum, k.fconst(accType, alpha));
    if (hasC) {
      Value cAt = k.add(k.mul(row, k.idx(cStride[0])), k.mul(col, k.idx(cStride[1])));
      Value c = k.load(fn.getArgument(2), cAt, elem);
      if (fl && beta != 1.0)
        c = b.create<arith::MulFOp>(k.loc, c, k.fconst(accType, beta));
      sum = fl ? Value(b.create<arith::AddFOp>(k.loc, sum, c))
               : Value(b.create<arith::AddIOp>(k.loc, sum, c));
    }
    k.store(sum, fn.getArgument(op->getNumOperands()), i, elem);
  });
}
