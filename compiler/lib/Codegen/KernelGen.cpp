//===- KernelGen.cpp - forge ops -> gpu.func kernels ----------------------===//
//
// Kernel families (each a `gpu.func` on flat static memrefs, bare pointers):
//  * map: one output element per iteration of a grid-stride loop; every
//    operand element is found through per-dimension strides over the output
//    index (elementwise ops with broadcasting, cast, where, transpose,
//    broadcast). Adjacent dimensions that every operand walks contiguously are
//    merged first; when all operands are contiguous (or scalars) and the size
//    divides by 4, operands are read and written as 4-element vectors
//    (16-byte accesses for f32).
//  * reduce: reduce_{sum,mean,max,min,prod,l2}. "Row" layout (the innermost
//    input dimension is reduced): one block per output element, threads stride
//    over the reduced elements (coalesced), then a warp-shuffle + shared
//    memory block reduction. "Column" layout: 32 outputs per block across
//    lanes (coalesced), 8 warps split the reduced range, partials combined
//    through shared memory.
//  * row: softmax, log_softmax and their gradients over the last axis, one
//    block per row, block reductions as above.
// Arithmetic runs in f32 for f16/bf16 (converted on load/store); booleans are
// one byte in memory and i1 in registers.
//
//===----------------------------------------------------------------------===//
#include "forge/Codegen/KernelGen.h"

#include "forge/Dialect/ForgeDialect.h"
#include "forge/runtime/Philox.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

using namespace mlir;
using namespace mlir::forge;

std::optional<CudaTarget> mlir::forge::parseCudaTarget(llvm::StringRef target) {
  CudaTarget t;
  if (target == "cuda:sm_90") {
    t.chip = "sm_90";
  } else if (target == "cuda:sm_80") {
    t.chip = "sm_80";
    t.sharedBytesPerSM = 164 * 1024;
    t.typicalSMs = 108;
  } else if (target == "cuda:sm_89") {
    t.chip = "sm_89";
    t.maxThreadsPerSM = 1536;
    t.maxBlocksPerSM = 24;
    t.sharedBytesPerSM = 100 * 1024;
    t.typicalSMs = 142;
  } else {
    return std::nullopt;
  }
  return t;
}

namespace {
/// conv, conv_transpose, conv_grad_weight on cuDNN: f32, 1-3 spatial dims,
/// symmetric pads (runtime/lib/cuda/Conv.h).
bool cudnnConvolution(Operation *op) {
  SmallVector<Type> types(op->getOperandTypes());
  llvm::append_range(types, op->getResultTypes());
  for (Type type : types) {
    auto t = dyn_cast<RankedTensorType>(type);
    if (!t || !t.hasStaticShape() || !t.getElementType().isF32())
      return false;
  }
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
  if (op->getName().stripDialect() == "conv_transpose") {
    auto y = cast<RankedTensorType>(op->getResult(0).getType());
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
} // namespace

bool mlir::forge::isLibraryCall(Operation *op) {
  StringRef name = op->getName().stripDialect();
  if (isa<ConvOp>(op) || isa<ConvTransposeOp>(op) || isa<ConvGradWeightOp>(op))
    return cudnnConvolution(op);
  if (name != "matmul" && name != "gemm")
    return false;
  auto lhs = dyn_cast<RankedTensorType>(op->getOperand(0).getType());
  auto rhs = dyn_cast<RankedTensorType>(op->getOperand(1).getType());
  auto out = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!lhs || !rhs || !out || !lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !lhs.getElementType().isF32() || !rhs.getElementType().isF32() ||
      !out.getElementType().isF32() || lhs.getRank() < 2 || rhs.getRank() < 2)
    return false;
  if (isa<GemmOp>(op)) {
    if (lhs.getRank() != 2 || rhs.getRank() != 2)
      return false;
    if (op->getNumOperands() < 3 || !op->getOperand(2))
      return true;
    // C: a full [M, N] matrix (scaled by beta), or a bias row [N] / [1, N]
    // (cuBLASLt's bias epilogue, which beta does not scale).
    auto c = dyn_cast<RankedTensorType>(op->getOperand(2).getType());
    if (!c || !c.getElementType().isF32())
      return false;
    if (c.getShape() == out.getShape())
      return true;
    auto beta = op->getAttrOfType<FloatAttr>("beta");
    int64_t n = out.getDimSize(1);
    bool row = (c.getRank() == 1 && c.getDimSize(0) == n) ||
               (c.getRank() == 2 && c.getDimSize(0) == 1 && c.getDimSize(1) == n && n > 1);
    return row && (!beta || beta.getValueAsDouble() == 1.0);
  }
  // matmul: rhs a matrix (lhs batch folds into M), or equal batch shapes, or
  // one side without batch (broadcast with batch stride 0).
  auto lb = lhs.getShape().drop_back(2), rb = rhs.getShape().drop_back(2);
  auto ones = [](ArrayRef<int64_t> s) { return llvm::all_of(s, [](int64_t d) { return d == 1; }); };
  return rb.empty() || ones(rb) || lb == rb || lb.empty() || ones(lb);
}

bool mlir::forge::isCopyOp(llvm::StringRef op) { return op == "copy" || op == "reshape"; }

namespace {

constexpr int64_t kWarp = 32;
constexpr int64_t kVector = 4;
constexpr int64_t kMaxGrid = int64_t(1) << 20; // grid-stride loops cover the rest
constexpr int64_t kUnrollTaps = 16; // pooling windows up to this many taps are unrolled

/// Block size with the highest occupancy the target allows (ties: the smaller
/// block), for an assumed register count per thread and shared memory per
/// block, then no larger than the work rounded up to a warp.
int64_t chooseBlockSize(const CudaTarget &t, int64_t work, int64_t regsPerThread = 32,
                        int64_t sharedPerBlock = 0) {
  int64_t best = 128, bestThreads = 0;
  for (int64_t block : {128, 256, 512, 1024}) {
    int64_t blocks = std::min<int64_t>(t.maxThreadsPerSM / block, t.maxBlocksPerSM);
    blocks = std::min<int64_t>(blocks, t.registersPerSM / (regsPerThread * block));
    if (sharedPerBlock > 0)
      blocks = std::min<int64_t>(blocks, t.sharedBytesPerSM / sharedPerBlock);
    if (blocks * block > bestThreads) {
      bestThreads = blocks * block;
      best = block;
    }
  }
  int64_t needed = std::max<int64_t>(kWarp, (work + kWarp - 1) / kWarp * kWarp);
  return std::min(best, needed);
}

bool isFloat(Type t) { return isa<FloatType>(t); }
/// float8 E4M3FN / E5M2: bytes in memory, decoded to f32 on load
/// (Body::toCompute); only casts produce them (emitScalar encodes).
bool isFloat8(Type t) {
  return t.isFloat8E4M3FN() || t.isFloat8E5M2() || t.isFloat8E4M3FNUZ() || t.isFloat8E5M2FNUZ();
}

/// The float8 encodings ONNX defines: E4M3FN (NaN = S.1111.111, max 448),
/// E5M2 (IEEE-like), and the FNUZ pair (no infinity or -0; 0x80 is NaN).
struct Float8Spec {
  int mbits, bias;
  double maxFinite;
  bool e5m2, fnuz;
};
Float8Spec float8Spec(Type t) {
  if (t.isFloat8E5M2()) return {2, 15, 57344.0, true, false};
  if (t.isFloat8E4M3FNUZ()) return {3, 8, 240.0, false, true};
  if (t.isFloat8E5M2FNUZ()) return {2, 16, 57344.0, false, true};
  return {3, 7, 448.0, false, false};
}

/// Element types the generators handle: f16, bf16, f32, f64, bool (i1) and
/// signed, signless or unsigned 8/16/32/64-bit integers. Signless integers are
/// signed (ONNX has no signless integers).
bool supportedElement(Type t) {
  if (t.isF16() || t.isBF16() || t.isF32() || t.isF64() || isFloat8(t))
    return true;
  auto i = dyn_cast<IntegerType>(t);
  return i && (i.getWidth() == 1 ? !i.isUnsigned()
                                 : llvm::is_contained({8u, 16u, 32u, 64u}, i.getWidth()));
}
bool isUnsignedInt(Type t) { return t.isUnsignedInteger() && !t.isInteger(1); }

/// In memory: bool as i8, integers signless (arith works on signless types;
/// the tensor's own type keeps the signedness).
Type storageType(Type t) {
  if (t.isInteger(1) || isFloat8(t))
    return IntegerType::get(t.getContext(), 8);
  if (auto i = dyn_cast<IntegerType>(t))
    return IntegerType::get(t.getContext(), i.getWidth());
  return t;
}
/// In registers: f16/bf16 as f32, integers signless.
Type computeType(Type t) {
  if (t.isF16() || t.isBF16() || isFloat8(t))
    return Float32Type::get(t.getContext());
  if (auto i = dyn_cast<IntegerType>(t))
    return IntegerType::get(t.getContext(), i.getWidth());
  return t;
}

RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// Row-major strides of `shape`.
SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Strides (over the output index) of `in` broadcast to `out` (numpy rules).
SmallVector<int64_t> broadcastStrides(ArrayRef<int64_t> in, ArrayRef<int64_t> out) {
  SmallVector<int64_t> s(out.size(), 0);
  SmallVector<int64_t> inStrides = contiguousStrides(in);
  int64_t shift = static_cast<int64_t>(out.size()) - static_cast<int64_t>(in.size());
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    s[d + shift] = in[d] == 1 ? 0 : inStrides[d];
  return s;
}

/// A kernel body under construction: helpers bound to one insertion point in it.
struct Body {
  OpBuilder &b;
  Location loc;
  Value faultWord = nullptr, faultCode = nullptr; // kernels that check their data (fault)

  Value idx(int64_t v) { return b.create<arith::ConstantIndexOp>(loc, v); }
  Value i32(int32_t v) { return b.create<arith::ConstantIntOp>(loc, v, 32); }
  Value fconst(Type t, double v) { return b.create<arith::ConstantOp>(loc, b.getFloatAttr(t, v)); }
  Value add(Value a, Value c) { return b.create<arith::AddIOp>(loc, a, c); }
  Value mul(Value a, Value c) { return b.create<arith::MulIOp>(loc, a, c); }
  Value div(Value a, int64_t c) { return b.create<arith::DivUIOp>(loc, a, idx(c)); }
  Value rem(Value a, int64_t c) { return b.create<arith::RemUIOp>(loc, a, idx(c)); }
  Value ult(Value a, Value c) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, a, c); }
  Value tid() { return b.create<gpu::ThreadIdOp>(loc, gpu::Dimension::x); }
  Value bid() { return b.create<gpu::BlockIdOp>(loc, gpu::Dimension::x); }

  /// storage element -> compute value
  Value load(Value memref, Value index, Type elem) {
    Value v = b.create<memref::LoadOp>(loc, memref, index);
    return toCompute(v, elem);
  }
  Value toCompute(Value v, Type elem) {
    if (elem.isInteger(1))
      return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, v,
                                     b.create<arith::ConstantIntOp>(loc, 0, 8));
    if (elem.isF16() || elem.isBF16())
      return b.create<arith::ExtFOp>(loc, b.getF32Type(), v);
    if (isFloat8(elem))
      return decodeFloat8(v, float8Spec(elem));
    return v;
  }
  /// A float8 byte as the f32 it stands for (exact). E5M2 is the top byte of
  /// an f16; the other formats are rebuilt from their fields.
  Value decodeFloat8(Value byte, const Float8Spec &f) {
    Type i16 = b.getI16Type(), i32 = b.getI32Type(), f32 = b.getF32Type();
    if (f.e5m2) {
      Value bits = b.create<arith::ShLIOp>(loc, b.create<arith::ExtUIOp>(loc, i16, byte),
                                           b.create<arith::ConstantIntOp>(loc, 8, 16));
      Value half = b.create<arith::BitcastOp>(loc, b.getF16Type(), bits);
      return b.create<arith::ExtFOp>(loc, f32, half);
    }
    auto c = [&](int64_t v) { return b.create<arith::ConstantIntOp>(loc, v, 32); };
    Value v = b.create<arith::ExtUIOp>(loc, i32, byte);
    Value exp = b.create<arith::AndIOp>(loc, b.create<arith::ShRUIOp>(loc, v, c(f.mbits)),
                                        c((1 << (7 - f.mbits)) - 1));
    Value mant = b.create<arith::AndIOp>(loc, v, c((1 << f.mbits) - 1));
    Value sub = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, exp, c(0));
    // |x| = m * 2^(1-bias-mbits) (subnormal) or (2^mbits + m) * 2^(e-bias-mbits);
    // 2^k built from its bits.
    Value significand =
        b.create<arith::SelectOp>(loc, sub, mant, b.create<arith::AddIOp>(loc, mant, c(1 << f.mbits)));
    Value scaleExp = b.create<arith::SelectOp>(loc, sub, c(1 - f.bias - f.mbits),
                                               b.create<arith::SubIOp>(loc, exp, c(f.bias + f.mbits)));
    Value scale = b.create<arith::BitcastOp>(
        loc, f32, b.create<arith::ShLIOp>(loc, b.create<arith::AddIOp>(loc, scaleExp, c(127)), c(23)));
    Value a = b.create<arith::MulFOp>(loc, b.create<arith::UIToFPOp>(loc, f32, significand), scale);
    Value negative = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne,
                                             b.create<arith::AndIOp>(loc, v, c(0x80)), c(0));
    Value r = b.create<arith::SelectOp>(loc, negative, b.create<arith::NegFOp>(loc, a), a);
    Value nan = f.fnuz ? b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, v, c(0x80))
                       : b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                                 b.create<arith::AndIOp>(loc, v, c(0x7f)), c(0x7f));
    return b.create<arith::SelectOp>(loc, nan, fconst(f32, NAN), r);
  }
  Value toStorage(Value v, Type elem) {
    if (elem.isInteger(1))
      return b.create<arith::ExtUIOp>(loc, b.getI8Type(), v);
    if (elem.isF16() || elem.isBF16())
      return b.create<arith::TruncFOp>(loc, elem, v);
    return v;
  }
  void store(Value v, Value memref, Value index, Type elem) {
    b.create<memref::StoreOp>(loc, toStorage(v, elem), memref, index);
  }

  /// for (i = blockIdx*blockDim + threadIdx; i < n; i += gridDim*blockDim)
  void gridStride(int64_t n, function_ref<void(Value)> body) {
    Value start = add(mul(bid(), b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x)), tid());
    Value step = mul(b.create<gpu::GridDimOp>(loc, gpu::Dimension::x),
                     b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x));
    b.create<scf::ForOp>(loc, start, idx(n), step, ValueRange{},
                         [&](OpBuilder &nb, Location l, Value i, ValueRange) {
                           OpBuilder::InsertionGuard g(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           body(i);
                           b.create<scf::YieldOp>(l);
                         });
  }
  /// The same over a share of the grid: `blocks` blocks numbered from
  /// `blockIndex` (a horizontal fusion gives each member region a share).
  void gridStrideOver(int64_t n, Value blockIndex, int64_t blocks,
                      function_ref<void(Value)> body) {
    Value dim = b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x);
    Value start = add(mul(blockIndex, dim), tid());
    b.create<scf::ForOp>(loc, start, idx(n), mul(idx(blocks), dim), ValueRange{},
                         [&](OpBuilder &nb, Location l, Value i, ValueRange) {
                           OpBuilder::InsertionGuard g(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           body(i);
                           b.create<scf::YieldOp>(l);
                         });
  }
  /// for (i = from; i < n; i += step) with a loop-carried accumulator.
  Value loopAcc(Value from, int64_t n, Value step, Value init,
                function_ref<Value(Value, Value)> body) {
    return loopAcc(from, idx(n), step, init, body);
  }
  Value loopAcc(Value from, Value n, Value step, Value init,
                function_ref<Value(Value, Value)> body) {
    auto loop = b.create<scf::ForOp>(
        loc, from, n, step, ValueRange{init},
        [&](OpBuilder &nb, Location l, Value i, ValueRange acc) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          b.create<scf::YieldOp>(l, body(i, acc[0]));
        });
    return loop.getResult(0);
  }
  /// Reports bad data: where `cond` holds, stores the instruction's code into
  /// the fault word. Only in kernels generated with fault arguments (the last
  /// two: the word, the code), which the runtime checks after the run.
  void fault(Value cond) {
    if (!faultWord)
      llvm::report_fatal_error("Body::fault in a kernel generated without fault arguments "
                               "(faultOf does not list its op)");
    ifThen(cond, [&] { b.create<memref::StoreOp>(loc, faultCode, faultWord, idx(0)); });
  }
  static constexpr StringLiteral kFaultAttr = "forge.fault";
  /// A builder for the body of `fn`, bound to its fault arguments if it has them.
  static Body of(OpBuilder &b, Location loc, gpu::GPUFuncOp fn) {
    Body k{b, loc};
    if (fn->hasAttr(kFaultAttr)) {
      unsigned n = fn.getNumArguments();
      k.faultWord = fn.getArgument(n - 2);
      k.faultCode = fn.getArgument(n - 1);
    }
    return k;
  }

  /// acc = body(t, acc) for t = 0 .. n-1 from `init`: straight-line code with
  /// constant t when n <= unrollUpTo (small pooling windows: the index math
  /// folds away), else an scf.for.
  SmallVector<Value> foldRange(int64_t n, ValueRange init, int64_t unrollUpTo,
                               function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    if (n <= unrollUpTo) {
      SmallVector<Value> acc(init);
      for (int64_t t = 0; t < n; ++t)
        acc = body(idx(t), acc);
      return acc;
    }
    auto loop = b.create<scf::ForOp>(loc, idx(0), idx(n), idx(1), init,
                                     [&](OpBuilder &nb, Location l, Value t, ValueRange acc) {
                                       OpBuilder::InsertionGuard g(b);
                                       b.setInsertionPoint(nb.getInsertionBlock(),
                                                           nb.getInsertionPoint());
                                       b.create<scf::YieldOp>(l, body(t, acc));
                                     });
    return SmallVector<Value>(loop.getResults());
  }
  /// foldRange with one carried value.
  Value foldValue(int64_t n, Value init, int64_t unrollUpTo, function_ref<Value(Value, Value)> body) {
    return foldRange(n, init, unrollUpTo, [&](Value t, ValueRange acc) {
      return SmallVector<Value>{body(t, acc[0])};
    })[0];
  }

  void ifThen(Value cond, function_ref<void()> body) {
    b.create<scf::IfOp>(loc, cond, [&](OpBuilder &nb, Location l) {
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
      body();
      b.create<scf::YieldOp>(l);
    });
  }

  /// Butterfly reduction across the 32 lanes; every lane gets the result.
  Value warpReduce(Value v, function_ref<Value(Value, Value)> combine) {
    for (int32_t offset = 16; offset >= 1; offset /= 2) {
      auto shfl = b.create<gpu::ShuffleOp>(loc, v, i32(offset), i32(kWarp), gpu::ShuffleMode::XOR);
      v = combine(v, shfl.getShuffleResult());
    }
    return v;
  }
  /// Reduction across the block (blockDim = warps * 32); every thread gets the
  /// result. `smem` holds at least `warps` values; it is free again on return.
  Value blockReduce(Value v, int64_t warps, Value smem, Value identity,
                    function_ref<Value(Value, Value)> combine) {
    v = warpReduce(v, combine);
    if (warps == 1)
      return v;
    Value t = tid();
    Value lane = rem(t, kWarp), warp = div(t, kWarp);
    ifThen(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, lane, idx(0)),
           [&] { b.create<memref::StoreOp>(loc, v, smem, warp); });
    b.create<gpu::BarrierOp>(loc);
    Value slot = b.create<arith::MinUIOp>(loc, lane, idx(warps - 1));
    Value partial = b.create<memref::LoadOp>(loc, smem, slot);
    Value w = b.create<arith::SelectOp>(loc, ult(lane, idx(warps)), partial, identity);
    w = warpReduce(w, combine);
    b.create<gpu::BarrierOp>(loc); // smem may be reused after this
    return w;
  }
  /// combine(term(i)) over i = threadIdx, threadIdx + block, ... < n, then
  /// across the block (every thread gets the result).
  Value blockAccumulate(int64_t n, int64_t block, Value smem, Value identity,
                        function_ref<Value(Value, Value)> combine,
                        function_ref<Value(Value)> term) {
    Value acc = loopAcc(tid(), n, idx(block), identity,
                        [&](Value i, Value a) { return combine(a, term(i)); });
    return blockReduce(acc, block / kWarp, smem, identity, combine);
  }
  /// The f32 mean, (biased) variance and 1/sqrt(variance + eps) of x(i),
  /// i < n, across the block (every thread gets them): two passes, the mean then
  /// the centered variance, as the CPU's normalization kernels.
  struct Moments {
    Value mean, var, rstd;
  };
  Moments moments(int64_t n, int64_t block, Value smem, double eps,
                  function_ref<Value(Value)> x) {
    Type f32 = b.getF32Type();
    auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(loc, a, c); };
    auto mulf = [&](Value a, Value c) -> Value { return b.create<arith::MulFOp>(loc, a, c); };
    Value zero = fconst(f32, 0.0), inv = fconst(f32, 1.0 / static_cast<double>(n));
    Value mean = mulf(blockAccumulate(n, block, smem, zero, addf, x), inv);
    Value var = mulf(blockAccumulate(n, block, smem, zero, addf,
                                     [&](Value i) {
                                       Value d = b.create<arith::SubFOp>(loc, x(i), mean);
                                       return mulf(d, d);
                                     }),
                     inv);
    return {mean, var, b.create<math::RsqrtOp>(loc, addf(var, fconst(f32, eps)))};
  }
};

//===----------------------------------------------------------------------===//
// Scalar semantics of the elementwise ops (runtime/lib/cpu/Elementwise.cpp is
// the reference). `args` are compute values; returns null when unsupported.
//===----------------------------------------------------------------------===//

double floatAttr(Operation *op, StringRef name, double fallback) {
  if (auto a = op->getAttrOfType<FloatAttr>(name))
    return a.getValueAsDouble();
  return fallback;
}

/// The integer constant `v` of `t` (signless), bit pattern of v mod 2^width.
Value intConst(Body &k, Type t, int64_t v) {
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(t, v));
}
Value intLimit(Body &k, Type t, bool isUnsigned, bool max) {
  unsigned w = t.getIntOrFloatBitWidth();
  APInt v = isUnsigned ? (max ? APInt::getMaxValue(w) : APInt::getMinValue(w))
                       : (max ? APInt::getSignedMaxValue(w) : APInt::getSignedMinValue(w));
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(t, v));
}

/// Float -> integer as the CPU's convertValue: NaN -> 0, saturating at the
/// integer type's limits, otherwise truncated toward zero.
Value floatToInt(Body &k, Value x, Type to, bool isUnsigned) {
  OpBuilder &b = k.b;
  Type ft = x.getType();
  unsigned w = to.getIntOrFloatBitWidth();
  double lo = isUnsigned ? 0.0 : -std::ldexp(1.0, w - 1);
  double hi = isUnsigned ? std::ldexp(1.0, w) - 1 : std::ldexp(1.0, w - 1) - 1;
  Value converted = isUnsigned ? Value(b.create<arith::FPToUIOp>(k.loc, to, x))
                               : Value(b.create<arith::FPToSIOp>(k.loc, to, x));
  Value low = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OLE, x, k.fconst(ft, lo));
  Value high = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OGE, x, k.fconst(ft, hi));
  Value nan = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::UNO, x, x);
  Value r = b.create<arith::SelectOp>(k.loc, low, intLimit(k, to, isUnsigned, false), converted);
  r = b.create<arith::SelectOp>(k.loc, high, intLimit(k, to, isUnsigned, true), r);
  return b.create<arith::SelectOp>(k.loc, nan, intConst(k, to, 0), r);
}

/// base^exp for integers as the CPU's intPow: wrapping square-and-multiply;
/// a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
Value intPow(Body &k, Value base, Value exp, bool isUnsigned) {
  OpBuilder &b = k.b;
  Type t = base.getType();
  unsigned w = t.getIntOrFloatBitWidth();
  Value zero = intConst(k, t, 0), one = intConst(k, t, 1);
  auto loop = b.create<scf::ForOp>(
      k.loc, k.idx(0), k.idx(w), k.idx(1), ValueRange{one, base, exp},
      [&](OpBuilder &nb, Location l, Value, ValueRange acc) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        Value odd = b.create<arith::CmpIOp>(l, arith::CmpIPredicate::ne,
                                            b.create<arith::AndIOp>(l, acc[2], one), zero);
        Value r = b.create<arith::SelectOp>(l, odd, b.create<arith::MulIOp>(l, acc[0], acc[1]),
                                            acc[0]);
        b.create<scf::YieldOp>(l, ValueRange{r, b.create<arith::MulIOp>(l, acc[1], acc[1]),
                                             b.create<arith::ShRUIOp>(l, acc[2], one)});
      });
  if (isUnsigned)
    return loop.getResult(0);
  auto eq = [&](Value a, Value c) {
    return b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, a, c);
  };
  Value minusOne = intConst(k, t, -1);
  Value oddExp = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne,
                                         b.create<arith::AndIOp>(k.loc, exp, one), zero);
  Value negative = b.create<arith::SelectOp>(
      k.loc, eq(base, one), one,
      b.create<arith::SelectOp>(k.loc, eq(base, minusOne),
                                b.create<arith::SelectOp>(k.loc, oddExp, minusOne, one), zero));
  Value isNeg = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, exp, zero);
  return b.create<arith::SelectOp>(k.loc, isNeg, negative, loop.getResult(0));
}

/// A float value (f32, or f64) as a float8 byte, as the CPU's doubleToFloat8:
/// round to nearest even onto the format's grid; beyond the largest finite
/// value, saturate to +-max or give NaN (E4M3FN) / infinity (E5M2).
Value encodeFloat8(Body &k, Value x, const Float8Spec &f, bool saturate) {
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type ft = x.getType();
  bool f64 = ft.isF64();
  unsigned width = f64 ? 64 : 32, fracBits = f64 ? 52 : 23;
  int64_t floatBias = f64 ? 1023 : 127;
  Type it = b.getIntegerType(width), i32 = b.getI32Type(), i8 = b.getI8Type();
  const bool e5m2 = f.e5m2;
  const int mbits = f.mbits, bias = f.bias, emin = 1 - bias;
  const double maxFinite = f.maxFinite;
  const int64_t nanBits = e5m2 ? 0x7d : 0x7f, infBits = e5m2 ? 0x7c : 0x7f,
                maxBits = f.fnuz ? 0x7f : e5m2 ? 0x7b : 0x7e;
  auto c32 = [&](int64_t v) { return b.create<arith::ConstantIntOp>(loc, v, 32); };
  auto c8 = [&](int64_t v) { return b.create<arith::ConstantIntOp>(loc, v, 8); };
  auto sel = [&](Value cond, Value a, Value d) { return b.create<arith::SelectOp>(loc, cond, a, d); };
  Value bits = b.create<arith::BitcastOp>(loc, it, x);
  Value sign = b.create<arith::SelectOp>(
      loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, bits, intConst(k, it, 0)), c8(0x80),
      c8(0));
  Value a = b.create<math::AbsFOp>(loc, x);
  // The grid step at a: 2^q, q = max(floor(log2 a), emin) - mbits (exponent
  // field; f32/f64 subnormals are far below every float8 and get emin).
  Value field = b.create<arith::ShRUIOp>(loc, bits, intConst(k, it, fracBits));
  if (f64)
    field = b.create<arith::TruncIOp>(loc, i32, field);
  field = b.create<arith::AndIOp>(loc, field, c32(f64 ? 0x7ff : 0xff));
  Value q = b.create<arith::SubIOp>(
      loc, b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, field, c32(floatBias)), c32(emin)),
      c32(mbits));
  auto pow2 = [&](Value e) { // 2^e for |e| within the float type's normal range
    Value biased = b.create<arith::AddIOp>(loc, e, c32(floatBias));
    if (f64)
      biased = b.create<arith::ExtSIOp>(loc, it, biased);
    return b.create<arith::BitcastOp>(loc, ft, b.create<arith::ShLIOp>(loc, biased, intConst(k, it, fracBits)));
  };
  // (math.roundeven has no NVVM lowering in MLIR 19; the LLVM intrinsic is cvt.rni.)
  Value r = b.create<LLVM::RoundEvenOp>(
      loc, ft, b.create<arith::MulFOp>(loc, a, pow2(b.create<arith::SubIOp>(loc, c32(0), q))));
  Value rounded = b.create<arith::MulFOp>(loc, r, pow2(q));
  Value isInf = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, a, k.fconst(ft, INFINITY));
  Value over = b.create<arith::OrIOp>(
      loc, isInf, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, rounded, k.fconst(ft, maxFinite)));
  // r in [0, 2^(mbits+1)]: below 2^mbits only at emin (subnormal, exponent field
  // 0); 2^(mbits+1) carries into the next exponent.
  Value ri = b.create<arith::FPToUIOp>(loc, i32, b.create<arith::MinimumFOp>(loc, r, k.fconst(ft, 64.0)));
  Value carry = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, ri, c32(2 << mbits));
  ri = sel(carry, b.create<arith::ShRUIOp>(loc, ri, c32(1)), ri);
  q = sel(carry, b.create<arith::AddIOp>(loc, q, c32(1)), q);
  Value normal = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, ri, c32(1 << mbits));
  Value exponent = sel(normal, b.create<arith::AddIOp>(loc, q, c32(mbits + bias)), c32(0));
  Value mant = sel(normal, b.create<arith::SubIOp>(loc, ri, c32(1 << mbits)), ri);
  Value magnitude = b.create<arith::TruncIOp>(
      loc, i8, b.create<arith::OrIOp>(loc, b.create<arith::ShLIOp>(loc, exponent, c32(mbits)), mant));
  Value result = b.create<arith::OrIOp>(loc, sign, magnitude);
  Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, x, x);
  if (f.fnuz) { // every zero is +0; NaN and unsaturated overflow are 0x80
    result = sel(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, magnitude, c8(0)), c8(0), result);
    Value overflow = saturate ? Value(b.create<arith::OrIOp>(loc, sign, c8(maxBits))) : Value(c8(0x80));
    result = sel(over, overflow, result);
    return sel(nan, c8(0x80), result);
  }
  Value overflow = c8(saturate ? maxBits : (e5m2 ? infBits : nanBits));
  result = sel(over, b.create<arith::OrIOp>(loc, sign, overflow), result);
  return sel(nan, b.create<arith::OrIOp>(loc, sign, c8(nanBits)), result);
}

/// asin, acos, sinh, cosh, asinh, acosh, atanh of a float scalar (null for
/// other names). convert-gpu-to-nvvm in MLIR 19 has no libdevice lowering for
/// them, so they are built from ops it has (atan2, sqrt, exp, expm1, log,
/// log1p), in forms without cancellation or early overflow: a few ulp.
Value emitInverseOrHyperbolic(Body &k, Operation *op, Value x) {
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type t = x.getType();
  auto cf = [&](double v) { return k.fconst(t, v); };
  auto add = [&](Value p, Value q) { return b.create<arith::AddFOp>(loc, p, q); };
  auto sub = [&](Value p, Value q) { return b.create<arith::SubFOp>(loc, p, q); };
  auto mul = [&](Value p, Value q) { return b.create<arith::MulFOp>(loc, p, q); };
  auto div = [&](Value p, Value q) { return b.create<arith::DivFOp>(loc, p, q); };
  auto sqrt = [&](Value v) { return b.create<math::SqrtOp>(loc, v); };
  auto less = [&](Value p, Value q) {
    return b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, p, q);
  };
  auto select = [&](Value c, Value p, Value q) { return b.create<arith::SelectOp>(loc, c, p, q); };
  // f(x) = sign(x) f(|x|) for the odd functions (nan stays nan).
  auto odd = [&](Value r) { return select(less(x, cf(0)), b.create<arith::NegFOp>(loc, r), r); };
  // Beyond 2^28, sqrt(x^2 + 1) = |x| to double precision: log(2|x|) without
  // squaring (which overflows f32 near 1.8e19).
  auto logTwice = [&](Value v) { return add(b.create<math::LogOp>(loc, v), cf(M_LN2)); };
  Value huge = cf(268435456.0);
  // (1 - x)(1 + x): exact factors near |x| = 1, where 1 - x*x cancels; nan
  // from sqrt outside [-1, 1].
  auto cosOfAsin = [&] { return sqrt(mul(sub(cf(1), x), add(cf(1), x))); };

  if (isa<AsinOp>(op))
    return b.create<math::Atan2Op>(loc, x, cosOfAsin());
  if (isa<AcosOp>(op))
    return b.create<math::Atan2Op>(loc, cosOfAsin(), x);
  if (!isa<SinhOp, CoshOp, AsinhOp, AcoshOp, AtanhOp>(op))
    return {};
  Value a = b.create<math::AbsFOp>(loc, x);
  if (isa<SinhOp>(op) || isa<CoshOp>(op)) {
    // h = e^(|x|/2): e^|x| / 2 = (h / 2) h overflows only where the result does.
    Value h = b.create<math::ExpOp>(loc, mul(a, cf(0.5)));
    Value big = mul(mul(h, cf(0.5)), h);
    Value small = div(cf(0.5), mul(h, h)); // e^-|x| / 2
    if (isa<CoshOp>(op))
      return add(big, small);
    // Below 20 (e^-40 is below double's epsilon): with u = e^|x| - 1,
    // sinh = (u + u / (u + 1)) / 2, no cancellation near 0.
    Value u = b.create<math::ExpM1Op>(loc, a);
    Value viaExpm1 = mul(add(u, div(u, add(u, cf(1)))), cf(0.5));
    return odd(select(less(a, cf(20)), viaExpm1, sub(big, small)));
  }
  if (isa<AsinhOp>(op)) {
    // log1p(a + a^2 / (1 + sqrt(1 + a^2))) = log(a + sqrt(a^2 + 1)).
    Value a2 = mul(a, a);
    Value v = b.create<math::Log1pOp>(loc, add(a, div(a2, add(cf(1), sqrt(add(cf(1), a2))))));
    return odd(select(less(a, huge), v, logTwice(a)));
  }
  if (isa<AcoshOp>(op)) {
    // t = x - 1 (exact near 1): log1p(t + sqrt(t) sqrt(t + 2)); sqrt(t) makes
    // x < 1 nan (t (t + 2) would be positive, even inf, below -1).
    Value t1 = sub(x, cf(1));
    Value v = b.create<math::Log1pOp>(loc, add(t1, mul(sqrt(t1), sqrt(add(t1, cf(2))))));
    return select(less(x, huge), v, logTwice(x));
  }
  if (isa<AtanhOp>(op)) {
    // log1p(2a / (1 - a)) / 2: inf at 1, nan beyond.
    Value v = b.create<math::Log1pOp>(loc, div(add(a, a), sub(cf(1), a)));
    return odd(mul(v, cf(0.5)));
  }
  return {};
}

/// The divisor of an integer div or mod made safe: a zero divisor is a fault
/// (Body::fault; the op then gives 0) and becomes 1; for signed types a -1
/// divisor also becomes 1 (MIN / -1 and MIN % -1 trap), `minusOne` says where.
struct SafeDivisor {
  Value zero, isZero, divisor, minusOne;
};
SafeDivisor safeDivisor(Body &k, Value c, Type ct, bool isUnsigned) {
  OpBuilder &b = k.b;
  SafeDivisor d;
  d.zero = intConst(k, ct, 0);
  d.isZero = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, c, d.zero);
  k.fault(d.isZero);
  d.divisor = b.create<arith::SelectOp>(k.loc, d.isZero, intConst(k, ct, 1), c);
  if (!isUnsigned) {
    d.minusOne = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, c, intConst(k, ct, -1));
    d.divisor = b.create<arith::SelectOp>(k.loc, d.minusOne, intConst(k, ct, 1), d.divisor);
  }
  return d;
}

/// One element of an elementwise op. `argElems` are the operands' tensor
/// element types (the first one's signedness picks the integer ops).
Value emitScalar(Body &k, Operation *op, ArrayRef<Value> args, ArrayRef<Type> argElems,
                 Type resultElem) {
  Type argElem = argElems.empty() ? resultElem : argElems[0];
  OpBuilder &b = k.b;
  Location loc = k.loc;
  Type ct = args.empty() ? Type() : args[0].getType();
  bool fl = ct && isFloat(ct);
  bool isUnsigned = isUnsignedInt(argElem);
  auto cf = [&](double v) { return k.fconst(ct, v); };
  auto select = [&](Value c, Value a, Value d) { return b.create<arith::SelectOp>(loc, c, a, d); };
  auto cmpf = [&](arith::CmpFPredicate p, Value a, Value c) {
    return b.create<arith::CmpFOp>(loc, p, a, c);
  };
  auto clamp01 = [&](Value v) {
    Value lo = select(cmpf(arith::CmpFPredicate::OLT, v, cf(0)), cf(0), v);
    return select(cmpf(arith::CmpFPredicate::OGT, lo, cf(1)), cf(1), lo);
  };

  if (isa<TransposeOp>(op) || isa<BroadcastOp>(op) || isa<SliceOp>(op)) // the map does the work
    return args[0];
  if (isa<CastOp>(op) && isFloat8(resultElem)) {
    // Through f32 from floats up to f32 (exact), else through f64, as the CPU
    // goes through double.
    Value x = args[0];
    if (!isFloat(ct)) {
      Type f64 = b.getF64Type();
      x = ct.isInteger(1) || isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, f64, x))
                                        : Value(b.create<arith::SIToFPOp>(loc, f64, x));
    }
    auto saturate = op->getAttrOfType<IntegerAttr>("saturate");
    return encodeFloat8(k, x, float8Spec(resultElem), !saturate || saturate.getInt() != 0);
  }
  if (isa<CastOp>(op)) {
    Type to = computeType(resultElem);
    Value x = args[0];
    bool toUnsigned = isUnsignedInt(resultElem);
    if (ct == to)
      return x;
    if (isFloat(ct) && isFloat(to))
      return to.getIntOrFloatBitWidth() > ct.getIntOrFloatBitWidth()
                 ? Value(b.create<arith::ExtFOp>(loc, to, x))
                 : Value(b.create<arith::TruncFOp>(loc, to, x));
    if (isFloat(ct) && to.isInteger(1)) // unordered: NaN is true, as on the CPU
      return cmpf(arith::CmpFPredicate::UNE, x, cf(0));
    if (isFloat(ct))
      return floatToInt(k, x, to, toUnsigned);
    if (isFloat(to))
      return ct.isInteger(1) || isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, to, x))
                                           : Value(b.create<arith::SIToFPOp>(loc, to, x));
    if (to.isInteger(1))
      return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, x, intConst(k, ct, 0));
    if (to.getIntOrFloatBitWidth() < ct.getIntOrFloatBitWidth())
      return b.create<arith::TruncIOp>(loc, to, x);
    return ct.isInteger(1) || isUnsigned ? Value(b.create<arith::ExtUIOp>(loc, to, x))
                                         : Value(b.create<arith::ExtSIOp>(loc, to, x));
  }
  if (isa<WhereOp>(op))
    return select(args[0], args[1], args[2]);

  if (args.size() == 2) {
    Value a = args[0], c = args[1];
    // Equal register types; integers also of equal signedness (a uint8 base and
    // an int8 exponent of pow would both be i8 here: left to the host).
    if (a.getType() != c.getType() ||
        (argElems.size() == 2 && isUnsignedInt(argElems[0]) != isUnsignedInt(argElems[1])))
      return {};
    bool isBool = ct.isInteger(1);
    if (isa<AndOp>(op) && isBool)
      return b.create<arith::AndIOp>(loc, a, c);
    if (isa<OrOp>(op) && isBool)
      return b.create<arith::OrIOp>(loc, a, c);
    if (isa<XorOp>(op) && isBool)
      return b.create<arith::XOrIOp>(loc, a, c);
    auto fmodAttr = op->getAttrOfType<BoolAttr>("fmod");
    bool fmod = fmodAttr && fmodAttr.getValue();
    if (fl) {
      if (isa<AddOp>(op)) return b.create<arith::AddFOp>(loc, a, c);
      if (isa<SubOp>(op)) return b.create<arith::SubFOp>(loc, a, c);
      if (isa<MulOp>(op)) return b.create<arith::MulFOp>(loc, a, c);
      if (isa<DivOp>(op)) return b.create<arith::DivFOp>(loc, a, c);
      if (isa<PowOp>(op)) return b.create<math::PowFOp>(loc, a, c);
      if (isa<ModOp>(op)) {
        // remf is C fmod (__nv_fmodf); the floored form moves a nonzero
        // remainder to the divisor's side, as the CPU does.
        Value r = b.create<arith::RemFOp>(loc, a, c);
        if (fmod)
          return r;
        Value fix = b.create<arith::AndIOp>(
            loc, cmpf(arith::CmpFPredicate::ONE, r, cf(0)),
            b.create<arith::XOrIOp>(loc, cmpf(arith::CmpFPredicate::OLT, r, cf(0)),
                                    cmpf(arith::CmpFPredicate::OLT, c, cf(0))));
        return select(fix, b.create<arith::AddFOp>(loc, r, c), r);
      }
      if (isa<MinOp>(op)) return b.create<arith::MinimumFOp>(loc, a, c);
      if (isa<MaxOp>(op)) return b.create<arith::MaximumFOp>(loc, a, c);
      if (isa<EqualOp>(op)) return cmpf(arith::CmpFPredicate::OEQ, a, c);
      if (isa<LessOp>(op)) return cmpf(arith::CmpFPredicate::OLT, a, c);
      if (isa<GreaterOp>(op)) return cmpf(arith::CmpFPredicate::OGT, a, c);
      if (isa<LessEqualOp>(op)) return cmpf(arith::CmpFPredicate::OLE, a, c);
      if (isa<GreaterEqualOp>(op)) return cmpf(arith::CmpFPredicate::OGE, a, c);
      return {};
    }
    using P = arith::CmpIPredicate;
    auto icmp = [&](P p, Value l, Value r) { return b.create<arith::CmpIOp>(loc, p, l, r); };
    auto cmpi = [&](P p) { return icmp(p, a, c); };
    if (isa<EqualOp>(op)) return cmpi(P::eq);
    if (isBool)
      return {};
    if (isa<AddOp>(op)) return b.create<arith::AddIOp>(loc, a, c);
    if (isa<SubOp>(op)) return b.create<arith::SubIOp>(loc, a, c);
    if (isa<MulOp>(op)) return b.create<arith::MulIOp>(loc, a, c);
    if (isa<PowOp>(op)) return intPow(k, a, c, isUnsigned);
    if (isa<DivOp>(op)) {
      // A zero divisor gives 0; signed x / -1 is -x.
      SafeDivisor d = safeDivisor(k, c, ct, isUnsigned);
      if (isUnsigned)
        return select(d.isZero, d.zero, b.create<arith::DivUIOp>(loc, a, d.divisor));
      Value q = b.create<arith::DivSIOp>(loc, a, d.divisor);
      q = select(d.minusOne, b.create<arith::SubIOp>(loc, d.zero, a), q);
      return select(d.isZero, d.zero, q);
    }
    if (isa<ModOp>(op)) {
      // As div: x % -1 is 0 (the divisor 1 gives it).
      SafeDivisor d = safeDivisor(k, c, ct, isUnsigned);
      if (isUnsigned)
        return b.create<arith::RemUIOp>(loc, a, d.divisor);
      Value zero = d.zero;
      Value r = b.create<arith::RemSIOp>(loc, a, d.divisor);
      if (fmod)
        return r;
      // Floored: a nonzero remainder whose sign differs from the divisor's
      // gets the divisor added (|r| < |c|: no overflow).
      Value fix = b.create<arith::AndIOp>(
          loc, icmp(P::ne, r, zero),
          b.create<arith::XOrIOp>(loc, icmp(P::slt, r, zero), icmp(P::slt, c, zero)));
      return select(fix, b.create<arith::AddIOp>(loc, r, c), r);
    }
    if (isa<BitwiseAndOp>(op)) return b.create<arith::AndIOp>(loc, a, c);
    if (isa<BitwiseOrOp>(op)) return b.create<arith::OrIOp>(loc, a, c);
    if (isa<BitwiseXorOp>(op)) return b.create<arith::XOrIOp>(loc, a, c);
    if (isa<BitShiftOp>(op)) {
      auto direction = op->getAttrOfType<StringAttr>("direction");
      if (!isUnsigned || !direction)
        return {};
      // Shifts by the bit width or more give 0 (LLVM makes them poison).
      Value over = icmp(P::uge, c, intConst(k, ct, ct.getIntOrFloatBitWidth()));
      Value amount = select(over, intConst(k, ct, 0), c);
      Value r = direction.getValue() == "LEFT" ? Value(b.create<arith::ShLIOp>(loc, a, amount))
                                               : Value(b.create<arith::ShRUIOp>(loc, a, amount));
      return select(over, intConst(k, ct, 0), r);
    }
    if (isa<MinOp>(op)) return isUnsigned ? Value(b.create<arith::MinUIOp>(loc, a, c)) : Value(b.create<arith::MinSIOp>(loc, a, c));
    if (isa<MaxOp>(op)) return isUnsigned ? Value(b.create<arith::MaxUIOp>(loc, a, c)) : Value(b.create<arith::MaxSIOp>(loc, a, c));
    if (isa<LessOp>(op)) return cmpi(isUnsigned ? P::ult : P::slt);
    if (isa<GreaterOp>(op)) return cmpi(isUnsigned ? P::ugt : P::sgt);
    if (isa<LessEqualOp>(op)) return cmpi(isUnsigned ? P::ule : P::sle);
    if (isa<GreaterEqualOp>(op)) return cmpi(isUnsigned ? P::uge : P::sge);
    return {};
  }

  if (args.size() != 1)
    return {};
  Value x = args[0];
  if (isa<NotOp>(op) && ct.isInteger(1))
    return b.create<arith::XOrIOp>(loc, x, b.create<arith::ConstantIntOp>(loc, 1, 1));
  if (!fl) {
    if (ct.isInteger(1))
      return {};
    Value zero = intConst(k, ct, 0);
    if (isa<NegOp>(op)) return b.create<arith::SubIOp>(loc, zero, x);
    if (isa<AbsOp>(op)) return isUnsigned ? x : Value(b.create<math::AbsIOp>(loc, x));
    if (isa<BitwiseNotOp>(op)) return b.create<arith::XOrIOp>(loc, x, intConst(k, ct, -1));
    if (isa<ReluOp>(op)) return isUnsigned ? x : Value(b.create<arith::MaxSIOp>(loc, x, zero));
    if (isa<ClipOp>(op)) {
      // As the CPU: compared in double (so +-inf bounds work), a crossed bound
      // converted with saturation.
      Type f64 = b.getF64Type();
      Value d = isUnsigned ? Value(b.create<arith::UIToFPOp>(loc, f64, x))
                           : Value(b.create<arith::SIToFPOp>(loc, f64, x));
      double lo = floatAttr(op, "min", -INFINITY), hi = floatAttr(op, "max", INFINITY);
      auto bound = [&](double v) { return floatToInt(k, k.fconst(f64, v), ct, isUnsigned); };
      Value r = select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, d, k.fconst(f64, lo)),
                       bound(lo), x);
      return select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, d, k.fconst(f64, hi)),
                    bound(hi), r);
    }
    return {};
  }
  if (isa<NegOp>(op)) return b.create<arith::NegFOp>(loc, x);
  if (isa<FloorOp>(op)) return b.create<math::FloorOp>(loc, x);
  if (isa<CeilOp>(op)) return b.create<math::CeilOp>(loc, x);
  if (isa<RoundOp>(op)) {
    // Half to even without libdevice (MLIR 19 lowers no roundeven): adding and
    // subtracting 2^mantissa-bits rounds in the default mode, nearest even;
    // larger magnitudes (and inf, NaN) are already integral.
    // (math.copysign has no lowering in this pipeline: the sign bit by hand.)
    int bits = ct.isF64() ? 52 : 23;
    unsigned width = ct.getIntOrFloatBitWidth();
    Type it = b.getIntegerType(width);
    Value big = cf(std::ldexp(1.0, bits));
    Value xi = b.create<arith::BitcastOp>(loc, it, x);
    Value negative = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, xi, intConst(k, it, 0));
    Value magic = select(negative, cf(-std::ldexp(1.0, bits)), big);
    Value r = b.create<arith::SubFOp>(loc, b.create<arith::AddFOp>(loc, x, magic), magic);
    // -0.4 rounds to -0.0 (the sign of x), as nearbyint does.
    APInt signBit = APInt::getSignMask(width);
    Value ri = b.create<arith::AndIOp>(loc, b.create<arith::BitcastOp>(loc, it, r),
                                       b.create<arith::ConstantOp>(loc, b.getIntegerAttr(it, ~signBit)));
    Value si = b.create<arith::AndIOp>(loc, xi, b.create<arith::ConstantOp>(loc, b.getIntegerAttr(it, signBit)));
    r = b.create<arith::BitcastOp>(loc, ct, b.create<arith::OrIOp>(loc, ri, si));
    return select(cmpf(arith::CmpFPredicate::OLT, b.create<math::AbsFOp>(loc, x), big), r, x);
  }
  if (isa<AbsOp>(op)) return b.create<math::AbsFOp>(loc, x);
  if (isa<ExpOp>(op)) return b.create<math::ExpOp>(loc, x);
  if (isa<LogOp>(op)) return b.create<math::LogOp>(loc, x);
  if (isa<SqrtOp>(op)) return b.create<math::SqrtOp>(loc, x);
  if (isa<ReciprocalOp>(op)) return b.create<arith::DivFOp>(loc, cf(1), x);
  if (isa<TanhOp>(op)) return b.create<math::TanhOp>(loc, x);
  if (isa<ErfOp>(op)) return b.create<math::ErfOp>(loc, x);
  if (isa<IsNaNOp>(op)) return cmpf(arith::CmpFPredicate::UNO, x, x);
  if (isa<IsInfOp>(op)) {
    auto detect = [&](StringRef attr) {
      auto flag = op->getAttrOfType<BoolAttr>(attr);
      return !flag || flag.getValue();
    };
    Value r = b.create<arith::ConstantIntOp>(loc, 0, 1);
    if (detect("detect_positive"))
      r = b.create<arith::OrIOp>(loc, r, cmpf(arith::CmpFPredicate::OEQ, x, cf(INFINITY)));
    if (detect("detect_negative"))
      r = b.create<arith::OrIOp>(loc, r, cmpf(arith::CmpFPredicate::OEQ, x, cf(-INFINITY)));
    return r;
  }
  if (isa<SinOp>(op)) return b.create<math::SinOp>(loc, x);
  if (isa<CosOp>(op)) return b.create<math::CosOp>(loc, x);
  if (isa<TanOp>(op)) return b.create<math::TanOp>(loc, x);
  if (isa<AtanOp>(op)) return b.create<math::AtanOp>(loc, x);
  if (Value r = emitInverseOrHyperbolic(k, op, x))
    return r;
  if (isa<ReluOp>(op)) // x < 0 ? 0 : x keeps NaN
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)), cf(0), x);
  if (isa<SigmoidOp>(op)) {
    // Never exponentiate a large positive number.
    Value e = b.create<math::ExpOp>(loc, b.create<arith::NegFOp>(loc, b.create<math::AbsFOp>(loc, x)));
    Value onePlus = b.create<arith::AddFOp>(loc, cf(1), e);
    Value pos = b.create<arith::DivFOp>(loc, cf(1), onePlus);
    Value neg = b.create<arith::DivFOp>(loc, e, onePlus);
    return select(cmpf(arith::CmpFPredicate::OGE, x, cf(0)), pos, neg);
  }
  if (isa<SoftplusOp>(op)) {
    Value e = b.create<math::ExpOp>(loc, b.create<arith::NegFOp>(loc, b.create<math::AbsFOp>(loc, x)));
    Value l = b.create<math::Log1pOp>(loc, e);
    Value pos = b.create<arith::AddFOp>(loc, x, l);
    return select(cmpf(arith::CmpFPredicate::OGT, x, cf(0)), pos, l);
  }
  if (isa<HardSwishOp>(op)) {
    Value g = b.create<arith::AddFOp>(loc, b.create<arith::DivFOp>(loc, x, cf(6)), cf(0.5));
    return b.create<arith::MulFOp>(loc, x, clamp01(g));
  }
  if (isa<HardSigmoidOp>(op)) {
    Value v = b.create<arith::AddFOp>(
        loc, b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 0.2)), x),
        cf(floatAttr(op, "beta", 0.5)));
    return clamp01(v);
  }
  if (isa<LeakyReluOp>(op))
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)),
                  b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 0.01)), x), x);
  if (isa<SeluOp>(op)) {
    Value neg = b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 1.6732632423543772)),
                                        b.create<math::ExpM1Op>(loc, x));
    Value v = select(cmpf(arith::CmpFPredicate::OGT, x, cf(0)), x, neg);
    return b.create<arith::MulFOp>(loc, cf(floatAttr(op, "gamma", 1.0507009873554805)), v);
  }
  if (isa<ThresholdedReluOp>(op)) // nan -> 0, as the CPU
    return select(cmpf(arith::CmpFPredicate::OGT, x, cf(floatAttr(op, "alpha", 1.0))), x, cf(0));
  if (isa<EluOp>(op))
    return select(cmpf(arith::CmpFPredicate::OLT, x, cf(0)),
                  b.create<arith::MulFOp>(loc, cf(floatAttr(op, "alpha", 1.0)),
                                          b.create<math::ExpM1Op>(loc, x)),
                  x);
  if (isa<GeluOp>(op)) {
    auto approx = op->getAttrOfType<StringAttr>("approximate");
    Value inner;
    if (approx && approx.getValue() == "tanh") {
      Value x3 = b.create<arith::MulFOp>(loc, b.create<arith::MulFOp>(loc, x, x), x);
      Value t = b.create<arith::AddFOp>(loc, x, b.create<arith::MulFOp>(loc, cf(0.044715), x3));
      inner = b.create<math::TanhOp>(loc, b.create<arith::MulFOp>(loc, cf(0.7978845608028654), t));
    } else if (!approx || approx.getValue() == "none") {
      inner = b.create<math::ErfOp>(loc, b.create<arith::MulFOp>(loc, x, cf(0.7071067811865476)));
    } else {
      return {};
    }
    Value half = b.create<arith::MulFOp>(loc, cf(0.5), x);
    return b.create<arith::MulFOp>(loc, half, b.create<arith::AddFOp>(loc, cf(1), inner));
  }
  if (isa<ClipOp>(op)) {
    Value lo = cf(floatAttr(op, "min", -INFINITY)), hi = cf(floatAttr(op, "max", INFINITY));
    Value v = select(cmpf(arith::CmpFPredicate::OLT, x, lo), lo, x);
    return select(cmpf(arith::CmpFPredicate::OGT, v, hi), hi, v);
  }
  return {};
}

//===----------------------------------------------------------------------===//
// Kernel construction
//===----------------------------------------------------------------------===//

/// How a map kernel finds one operand's element from the output index.
struct OperandMap {
  SmallVector<int64_t> strides; // per output dimension; 0 = broadcast
  int64_t offset = 0;
};

/// Merges adjacent output dimensions that every operand walks contiguously and
/// drops size-1 dimensions (in place).
void coalesce(SmallVector<int64_t> &shape, SmallVector<OperandMap> &maps) {
  SmallVector<int64_t> s;
  SmallVector<SmallVector<int64_t>> st(maps.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1)
      continue;
    bool merge = !s.empty();
    for (size_t m = 0; merge && m < maps.size(); ++m)
      merge = st[m].back() == maps[m].strides[d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t m = 0; m < maps.size(); ++m)
        st[m].back() = maps[m].strides[d];
      continue;
    }
    s.push_back(shape[d]);
    for (size_t m = 0; m < maps.size(); ++m)
      st[m].push_back(maps[m].strides[d]);
  }
  shape = s;
  for (size_t m = 0; m < maps.size(); ++m)
    maps[m].strides = st[m];
}

} // namespace

std::string faultOf(Operation *op); // below, with the dispatch

struct KernelGenerator::Impl {
  MLIRContext *context;
  CudaTarget target;
  OwningOpRef<ModuleOp> module;
  gpu::GPUModuleOp gpuModule;
  llvm::StringMap<std::optional<KernelLaunch>> cache;
  std::vector<std::string> names;
  std::string fault; // the op being generated checks its data for this (faultOf)

  Impl(MLIRContext *ctx, CudaTarget t) : context(ctx), target(std::move(t)) {
    DialectRegistry registry;
    registry.insert<arith::ArithDialect, gpu::GPUDialect, math::MathDialect, memref::MemRefDialect,
                    scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect, NVVM::NVVMDialect>();
    NVVM::registerNVVMTargetInterfaceExternalModels(registry);
    registerBuiltinDialectTranslation(registry);
    registerLLVMDialectTranslation(registry);
    registerNVVMDialectTranslation(registry);
    registerGPUDialectTranslation(registry);
    context->appendDialectRegistry(registry);
    context->loadDialect<arith::ArithDialect, gpu::GPUDialect, math::MathDialect,
                         memref::MemRefDialect, scf::SCFDialect, vector::VectorDialect,
                         LLVM::LLVMDialect, NVVM::NVVMDialect>();
    OpBuilder b(context);
    module = ModuleOp::create(UnknownLoc::get(context));
    module->getOperation()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
    b.setInsertionPointToEnd(module->getBody());
    gpuModule = b.create<gpu::GPUModuleOp>(module->getLoc(), "forge_kernels");
  }

  /// A new kernel `name` taking flat memrefs of `argTypes`; `workgroup` is
  /// shared memory. Leaves `b` at the start of its body.
  gpu::GPUFuncOp newKernel(OpBuilder &b, StringRef name, ArrayRef<Type> argTypes,
                           int64_t block, ArrayRef<Type> workgroup = {}) {
    b.setInsertionPoint(gpuModule.getBody()->getTerminator());
    SmallVector<Type> args(argTypes);
    if (!fault.empty()) // the fault word and this instruction's code (Body::fault)
      args.append({MemRefType::get({1}, b.getI32Type()), b.getI32Type()});
    auto fn = b.create<gpu::GPUFuncOp>(gpuModule.getLoc(), name,
                                       b.getFunctionType(args, {}), workgroup);
    fn->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
    if (!fault.empty())
      fn->setAttr(Body::kFaultAttr, b.getStringAttr(fault));
    fn.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr({static_cast<int32_t>(block), 1, 1}));
    b.setInsertionPointToStart(&fn.getBody().front());
    return fn;
  }

  /// A block's shared-memory buffer of `n` elements (a kernel's workgroup attribution).
  Type sharedBuffer(int64_t n, Type elem) const {
    return MemRefType::get({n}, elem, AffineMap{},
                           gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup));
  }

  static Type flatMemref(Type elem, int64_t n, bool vector = false) {
    Type s = storageType(elem);
    if (vector)
      return MemRefType::get({n / kVector}, VectorType::get({kVector}, s));
    return MemRefType::get({n}, s);
  }

  /// What a pointwise kernel computes per element: the outputs' storage
  /// values from the inputs' storage values (empty: unsupported).
  using PointwiseBody = function_ref<SmallVector<Value>(Body &, ArrayRef<Value>)>;
  /// One kernel over `iterShape`: input m is read through maps[m] (4-wide
  /// vectors when every input is contiguous or a scalar), outputs are
  /// contiguous in the iteration shape.
  /// A pointwise loop's layout: the coalesced shape, each input's map and
  /// form (4-wide vectors when every input is contiguous or a scalar), the
  /// memref types of its inputs and outputs, and its work items.
  struct PointwisePlan {
    SmallVector<int64_t> shape, outStrides;
    SmallVector<OperandMap> maps;
    SmallVector<bool> scalar;
    bool vector = false;
    int64_t work = 0;
    SmallVector<Type> inTypes, outTypes, outStorage;
  };
  std::optional<PointwisePlan> planPointwise(ArrayRef<int64_t> iterShape,
                                             SmallVector<OperandMap> maps,
                                             ArrayRef<Type> inElems, ArrayRef<int64_t> inSizes,
                                             ArrayRef<Type> outElems);
  /// The grid-stride loop of `p` over `blocks` blocks from `blockIndex`,
  /// reading inputs from `fn`'s arguments `inArgs` and writing `outArgs`;
  /// false when `body` does not support an element.
  bool emitPointwise(Body &k, gpu::GPUFuncOp fn, const PointwisePlan &p,
                     ArrayRef<unsigned> inArgs, ArrayRef<unsigned> outArgs, Value blockIndex,
                     int64_t blocks, PointwiseBody body);
  std::optional<KernelLaunch> pointwiseKernel(StringRef name, Location loc,
                                              ArrayRef<int64_t> iterShape,
                                              SmallVector<OperandMap> maps,
                                              ArrayRef<Type> inElems, ArrayRef<int64_t> inSizes,
                                              ArrayRef<Type> outElems, PointwiseBody body);
  std::optional<KernelLaunch> mapKernel(Operation *op, StringRef name,
                                        SmallVector<OperandMap> maps);
  SmallVector<Value> evalLoopBody(Body &k, FusionOp fusion, ArrayRef<Value> in);
  std::optional<PointwisePlan> planLoop(FusionOp fusion);
  std::optional<KernelLaunch> loopFusionKernel(FusionOp fusion, StringRef name);
  std::optional<KernelLaunch> horizontalFusionKernel(FusionOp fusion, StringRef name);
  std::optional<KernelLaunch> reduceKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> rowKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> layerNormKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> layerNormGradKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> gatherKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> nllLossKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> nllLossGradKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> nllLossGradRowKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> crossEntropyKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> argmaxKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> topKKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> concatKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> splitKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> batchNormKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> batchNormTrainingKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> maxPoolKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> remapKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> avgPoolKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> gatherElementsKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> cumsumKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> scatterGradKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> groupNormKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> matmulKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> convKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> dropoutMaskKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> scatterElementsKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> oneHotKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> generate(Operation *op, StringRef name);

  /// Memref types of `op`'s present operands then results (flat, storage types).
  SmallVector<Type> flatArgs(Operation *op) {
    SmallVector<Type> args;
    for (Value v : op->getOperands())
      args.push_back(flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements()));
    for (Value v : op->getResults())
      args.push_back(flatMemref(tensorType(v).getElementType(), tensorType(v).getNumElements()));
    return args;
  }
  /// A one-dimensional grid-stride kernel over `work` items.
  KernelLaunch elementKernel(StringRef name, ArrayRef<Type> args, int64_t work, Location loc,
                             function_ref<void(Body &, gpu::GPUFuncOp, Value)> body) {
    int64_t block = chooseBlockSize(target, work);
    int64_t grid = std::max<int64_t>(1, std::min(kMaxGrid, (work + block - 1) / block));
    OpBuilder b(context);
    auto fn = newKernel(b, name, args, block);
    Body k = Body::of(b, loc, fn);
    k.gridStride(work, [&](Value i) { body(k, fn, i); });
    b.create<gpu::ReturnOp>(loc);
    return KernelLaunch{name.str(), grid, block};
  }
};

std::optional<KernelGenerator::Impl::PointwisePlan>
KernelGenerator::Impl::planPointwise(ArrayRef<int64_t> iterShape, SmallVector<OperandMap> maps,
                                     ArrayRef<Type> inElems, ArrayRef<int64_t> inSizes,
                                     ArrayRef<Type> outElems) {
  PointwisePlan p;
  p.shape.assign(iterShape.begin(), iterShape.end());
  int64_t n = 1;
  for (int64_t d : p.shape)
    n *= d;
  if (n == 0)
    return std::nullopt;
  coalesce(p.shape, maps);
  p.maps = std::move(maps);
  // Vector form: every operand contiguous (strides of the output) or a scalar.
  p.outStrides = contiguousStrides(p.shape);
  p.vector = n % kVector == 0;
  p.scalar.resize(p.maps.size());
  for (size_t m = 0; m < p.maps.size(); ++m) {
    p.scalar[m] = inSizes[m] == 1;
    p.vector &= p.scalar[m] || (p.maps[m].offset == 0 && p.maps[m].strides == p.outStrides);
  }
  for (size_t m = 0; m < p.maps.size(); ++m)
    p.inTypes.push_back(flatMemref(inElems[m], inSizes[m], p.vector && !p.scalar[m]));
  for (Type e : outElems) {
    p.outTypes.push_back(flatMemref(e, n, p.vector));
    p.outStorage.push_back(storageType(e));
  }
  p.work = p.vector ? n / kVector : n;
  return p;
}

bool KernelGenerator::Impl::emitPointwise(Body &k, gpu::GPUFuncOp fn, const PointwisePlan &p,
                                          ArrayRef<unsigned> inArgs, ArrayRef<unsigned> outArgs,
                                          Value blockIndex, int64_t blocks, PointwiseBody body) {
  OpBuilder &b = k.b;
  size_t numIn = p.maps.size();
  bool ok = true;
  k.gridStrideOver(p.work, blockIndex, blocks, [&](Value i) {
    if (p.vector) {
      SmallVector<Value> loaded;
      for (size_t m = 0; m < numIn; ++m)
        loaded.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(inArgs[m]),
                                                  p.scalar[m] ? k.idx(0) : i));
      SmallVector<SmallVector<Value>> lanes(p.outTypes.size());
      for (int64_t l = 0; l < kVector && ok; ++l) {
        SmallVector<Value> in;
        for (size_t m = 0; m < numIn; ++m)
          in.push_back(p.scalar[m] ? loaded[m]
                                   : b.create<vector::ExtractOp>(k.loc, loaded[m], l).getResult());
        SmallVector<Value> out = body(k, in);
        if (out.size() != p.outTypes.size()) {
          ok = false;
          break;
        }
        for (size_t o = 0; o < out.size(); ++o)
          lanes[o].push_back(out[o]);
      }
      if (!ok)
        return;
      for (size_t o = 0; o < p.outTypes.size(); ++o) {
        Value vec = b.create<vector::FromElementsOp>(
            k.loc, VectorType::get({kVector}, p.outStorage[o]), lanes[o]);
        b.create<memref::StoreOp>(k.loc, vec, fn.getArgument(outArgs[o]), i);
      }
      return;
    }
    // Unravel the output index over the coalesced shape.
    SmallVector<Value> index(p.shape.size());
    Value rest = i;
    for (int64_t d = static_cast<int64_t>(p.shape.size()) - 1; d >= 0; --d) {
      index[d] = d == 0 ? rest : k.rem(rest, p.shape[d]);
      if (d > 0)
        rest = k.div(rest, p.shape[d]);
    }
    SmallVector<Value> in;
    for (size_t m = 0; m < numIn; ++m) {
      Value at = k.idx(p.maps[m].offset);
      if (p.scalar[m]) {
        at = k.idx(0);
      } else if (p.maps[m].offset == 0 && p.maps[m].strides == p.outStrides) {
        at = i;
      } else {
        for (size_t d = 0; d < p.shape.size(); ++d)
          if (p.maps[m].strides[d] != 0)
            at = k.add(at, k.mul(index[d], k.idx(p.maps[m].strides[d])));
      }
      in.push_back(b.create<memref::LoadOp>(k.loc, fn.getArgument(inArgs[m]), at));
    }
    SmallVector<Value> out = body(k, in);
    if (out.size() != p.outTypes.size()) {
      ok = false;
      return;
    }
    for (size_t o = 0; o < out.size(); ++o)
      b.create<memref::StoreOp>(k.loc, out[o], fn.getArgument(outArgs[o]), i);
  });
  return ok;
}

std::optional<KernelLaunch>
KernelGenerator::Impl::pointwiseKernel(StringRef name, Location loc, ArrayRef<int64_t> iterShape,
                                       SmallVector<OperandMap> maps, ArrayRef<Type> inElems,
                                       ArrayRef<int64_t> inSizes, ArrayRef<Type> outElems,
                                       PointwiseBody body) {
  std::optional<PointwisePlan> p = planPointwise(iterShape, std::move(maps), inElems, inSizes,
                                                 outElems);
  if (!p)
    return std::nullopt;
  SmallVector<Type> argTypes(p->inTypes);
  argTypes.append(p->outTypes.begin(), p->outTypes.end());
  int64_t block = chooseBlockSize(target, p->work);
  int64_t grid = std::min(kMaxGrid, (p->work + block - 1) / block);
  OpBuilder b(context);
  auto fn = newKernel(b, name, argTypes, block);
  Body k = Body::of(b, loc, fn);
  SmallVector<unsigned> inArgs, outArgs;
  for (unsigned m = 0; m < p->inTypes.size(); ++m)
    inArgs.push_back(m);
  for (unsigned o = 0; o < p->outTypes.size(); ++o)
    outArgs.push_back(static_cast<unsigned>(p->inTypes.size()) + o);
  if (!emitPointwise(k, fn, *p, inArgs, outArgs, k.bid(), grid, body)) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::mapKernel(Operation *op, StringRef name,
                                                             SmallVector<OperandMap> maps) {
  auto outType = tensorType(op->getResult(0));
  SmallVector<Type> elems;
  SmallVector<int64_t> sizes;
  for (Value v : op->getOperands()) {
    elems.push_back(tensorType(v).getElementType());
    sizes.push_back(tensorType(v).getNumElements());
  }
  Type outElem = outType.getElementType();
  return pointwiseKernel(
      name, op->getLoc(), outType.getShape(), std::move(maps), elems, sizes, {outElem},
      [&](Body &k, ArrayRef<Value> in) -> SmallVector<Value> {
        SmallVector<Value> args;
        for (auto [v, e] : llvm::zip(in, elems))
          args.push_back(k.toCompute(v, e));
        Value r = emitScalar(k, op, args, elems, outElem);
        if (!r)
          return {};
        return {k.toStorage(r, outElem)};
      });
}

/// A loop fusion region: the body's ops evaluated per element in program
/// order. Every body value passes through its storage form (toStorage then
/// toCompute), so f16/bf16 rounding, float8 encoding and booleans are exactly
/// those of the unfused ops; only the memory round trips are gone.
SmallVector<Value> KernelGenerator::Impl::evalLoopBody(Body &k, FusionOp fusion,
                                                       ArrayRef<Value> in) {
  Block &block = fusion.getBlock();
  llvm::DenseMap<Value, Value> stored; // body value -> its storage-form scalar
  for (auto [arg, v] : llvm::zip(block.getArguments(), in))
    stored[arg] = v;
  for (Operation &op : block.without_terminator()) {
    SmallVector<Value> args;
    SmallVector<Type> elems;
    for (Value v : op.getOperands()) {
      elems.push_back(tensorType(v).getElementType());
      args.push_back(k.toCompute(stored.lookup(v), elems.back()));
    }
    Type resultElem = tensorType(op.getResult(0)).getElementType();
    Value r = emitScalar(k, &op, args, elems, resultElem);
    if (!r)
      return {};
    stored[op.getResult(0)] = k.toStorage(r, resultElem);
  }
  SmallVector<Value> out;
  for (Value v : block.getTerminator()->getOperands())
    out.push_back(stored.lookup(v));
  return out;
}

/// The plan of a loop region (null when its ops cannot run in one kernel);
/// sets `fault` from its ops.
std::optional<KernelGenerator::Impl::PointwisePlan>
KernelGenerator::Impl::planLoop(FusionOp fusion) {
  auto float8 = [](Value v) { return isFloat8(tensorType(v).getElementType()); };
  for (Operation &op : fusion.getBlock().without_terminator()) {
    if (!isa<CastOp>(op) &&
        (llvm::any_of(op.getOperands(), float8) || llvm::any_of(op.getResults(), float8)))
      return std::nullopt; // as generate(): float8 values are only made and read by casts
    if (fault.empty())
      fault = faultOf(&op);
  }
  ArrayRef<int64_t> shape = fusion.getIterationShape();
  SmallVector<OperandMap> maps;
  SmallVector<Type> inElems, outElems;
  SmallVector<int64_t> inSizes;
  for (Value v : fusion.getInputs()) {
    maps.push_back({broadcastStrides(tensorType(v).getShape(), shape)});
    inElems.push_back(tensorType(v).getElementType());
    inSizes.push_back(tensorType(v).getNumElements());
  }
  for (Value v : fusion.getResults())
    outElems.push_back(tensorType(v).getElementType());
  return planPointwise(shape, std::move(maps), inElems, inSizes, outElems);
}

std::optional<KernelLaunch> KernelGenerator::Impl::loopFusionKernel(FusionOp fusion,
                                                                    StringRef name) {
  std::optional<PointwisePlan> p = planLoop(fusion);
  if (!p)
    return std::nullopt;
  SmallVector<Type> argTypes(p->inTypes);
  argTypes.append(p->outTypes.begin(), p->outTypes.end());
  int64_t block = chooseBlockSize(target, p->work);
  int64_t grid = std::min(kMaxGrid, (p->work + block - 1) / block);
  OpBuilder b(context);
  auto fn = newKernel(b, name, argTypes, block);
  Body k = Body::of(b, fusion.getLoc(), fn);
  SmallVector<unsigned> inArgs, outArgs;
  for (unsigned m = 0; m < p->inTypes.size(); ++m)
    inArgs.push_back(m);
  for (unsigned o = 0; o < p->outTypes.size(); ++o)
    outArgs.push_back(static_cast<unsigned>(p->inTypes.size()) + o);
  auto body = [&](Body &kk, ArrayRef<Value> in) { return evalLoopBody(kk, fusion, in); };
  if (!emitPointwise(k, fn, *p, inArgs, outArgs, k.bid(), grid, body)) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

/// A horizontal region: independent loop regions (an optimizer's per-parameter
/// updates) in one launch. Member i owns a contiguous range of blocks, sized
/// by its work and capped at a few waves (its grid-stride loop covers the
/// rest); a binary decision tree on blockIdx.x picks the member. Arguments
/// are every member's inputs, then every member's outputs, in member order
/// (the region's operands and results).
std::optional<KernelLaunch> KernelGenerator::Impl::horizontalFusionKernel(FusionOp fusion,
                                                                          StringRef name) {
  SmallVector<FusionOp> members;
  std::vector<PointwisePlan> plans;
  for (Operation &op : fusion.getBlock().without_terminator()) {
    auto member = cast<FusionOp>(op);
    std::optional<PointwisePlan> p = planLoop(member);
    if (!p)
      return std::nullopt;
    members.push_back(member);
    plans.push_back(std::move(*p));
  }
  SmallVector<Type> argTypes;
  SmallVector<SmallVector<unsigned>> inArgs(members.size()), outArgs(members.size());
  int64_t maxWork = 1;
  for (auto [i, p] : llvm::enumerate(plans)) {
    for (Type t : p.inTypes) {
      inArgs[i].push_back(static_cast<unsigned>(argTypes.size()));
      argTypes.push_back(t);
    }
    maxWork = std::max(maxWork, p.work);
  }
  for (auto [i, p] : llvm::enumerate(plans))
    for (Type t : p.outTypes) {
      outArgs[i].push_back(static_cast<unsigned>(argTypes.size()));
      argTypes.push_back(t);
    }
  int64_t block = chooseBlockSize(target, maxWork);
  const int64_t cap = 4 * target.typicalSMs * std::max<int64_t>(1, target.maxThreadsPerSM / block);
  SmallVector<int64_t> first, blocks;
  int64_t grid = 0;
  for (const PointwisePlan &p : plans) {
    first.push_back(grid);
    blocks.push_back(std::clamp<int64_t>((p.work + block - 1) / block, 1, cap));
    grid += blocks.back();
  }
  OpBuilder b(context);
  auto fn = newKernel(b, name, argTypes, block);
  Body k = Body::of(b, fusion.getLoc(), fn);
  Value bid = k.bid();
  bool ok = true;
  std::function<void(size_t, size_t)> emitRange = [&](size_t lo, size_t hi) {
    if (hi - lo == 1) {
      FusionOp member = members[lo];
      auto body = [&](Body &kk, ArrayRef<Value> in) { return evalLoopBody(kk, member, in); };
      ok &= emitPointwise(k, fn, plans[lo], inArgs[lo], outArgs[lo],
                          b.create<arith::SubIOp>(k.loc, bid, k.idx(first[lo])), blocks[lo],
                          body);
      return;
    }
    size_t mid = (lo + hi) / 2;
    auto branch = b.create<scf::IfOp>(k.loc, k.ult(bid, k.idx(first[mid])), /*withElse=*/true);
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(&branch.getThenRegion().front());
    emitRange(lo, mid);
    b.setInsertionPointToStart(&branch.getElseRegion().front());
    emitRange(mid, hi);
  };
  emitRange(0, members.size());
  if (!ok) {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

namespace {
struct ReduceKind {
  std::function<Value(Body &, Value, Value)> combine;
  double identity;
  bool square = false; // l2: combine squares
  bool mean = false;   // divide by the count
  bool sqrt = false;   // l2: sqrt at the end
};

std::optional<ReduceKind> reduceKind(Operation *op) {
  auto addf = [](Body &k, Value a, Value c) -> Value { return k.b.create<arith::AddFOp>(k.loc, a, c); };
  if (isa<ReduceSumOp>(op))
    return ReduceKind{addf, 0.0};
  if (isa<ReduceMeanOp>(op))
    return ReduceKind{addf, 0.0, false, true};
  if (isa<ReduceL2Op>(op))
    return ReduceKind{addf, 0.0, true, false, true};
  if (isa<ReduceProdOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MulFOp>(k.loc, a, c);
                      },
                      1.0};
  if (isa<ReduceMaxOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MaximumFOp>(k.loc, a, c);
                      },
                      -INFINITY};
  if (isa<ReduceMinOp>(op))
    return ReduceKind{[](Body &k, Value a, Value c) -> Value {
                        return k.b.create<arith::MinimumFOp>(k.loc, a, c);
                      },
                      INFINITY};
  return std::nullopt;
}

/// Index of the element at (kept index o, reduced index r): the sum over both
/// groups' dimensions of unravelled index times stride.
struct DimGroup {
  SmallVector<int64_t> sizes, strides;
  int64_t count() const {
    int64_t c = 1;
    for (int64_t s : sizes)
      c *= s;
    return c;
  }
  Value offset(Body &k, Value linear) const {
    if (sizes.empty())
      return k.idx(0);
    if (sizes.size() == 1)
      return strides[0] == 1 ? linear : k.mul(linear, k.idx(strides[0]));
    Value at = k.idx(0), rest = linear;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      Value i = d == 0 ? rest : k.rem(rest, sizes[d]);
      if (d > 0)
        rest = k.div(rest, sizes[d]);
      at = k.add(at, k.mul(i, k.idx(strides[d])));
    }
    return at;
  }
};
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::reduceKernel(Operation *op, StringRef name) {
  auto kind = reduceKind(op);
  auto inType = tensorType(op->getOperand(0));
  auto outType = tensorType(op->getResult(0));
  auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes");
  Type elem = inType.getElementType();
  if (!kind || !axes || !isFloat(elem) || outType.getElementType() != elem ||
      inType.getNumElements() == 0)
    return std::nullopt;

  // Kept and reduced dimension groups (size-1 dims dropped, adjacent dims of
  // one class merged: they are contiguous in the input).
  DimGroup kept, reduced;
  SmallVector<int64_t> strides = contiguousStrides(inType.getShape());
  int lastClass = -1;
  for (int64_t d = 0; d < inType.getRank(); ++d) {
    int64_t size = inType.getDimSize(d);
    if (size == 1)
      continue;
    int cls = llvm::is_contained(axes.asArrayRef(), d) ? 1 : 0;
    DimGroup &g = cls ? reduced : kept;
    if (cls == lastClass) {
      g.sizes.back() *= size;
      g.strides.back() = strides[d];
    } else {
      g.sizes.push_back(size);
      g.strides.push_back(strides[d]);
    }
    lastClass = cls;
  }
  int64_t outputs = kept.count(), count = reduced.count();
  bool rowLayout = lastClass == 1; // the innermost (contiguous) dim is reduced
  Type accType = computeType(elem); // the accumulator: f32, or f64 for f64
  Type smem = sharedBuffer(rowLayout ? kWarp : 256, accType);
  int64_t block = rowLayout ? chooseBlockSize(target, count, 32, kWarp * 4) : 256;
  int64_t outBlocks = rowLayout ? outputs : (outputs + kWarp - 1) / kWarp;
  if (outBlocks > (int64_t(1) << 31) - 1)
    return std::nullopt;
  // Too few output blocks to fill the GPU: split the reduced range over more
  // blocks, whose partial sums are added atomically (f32 or f64 sums and means;
  // the order of the additions, and so the last bits, may vary run to run).
  bool additive = (isa<ReduceSumOp>(op) || isa<ReduceMeanOp>(op)) && elem == accType;
  int64_t perBlock = (rowLayout ? block : block / kWarp) * 16; // reduced elements per chunk, at least
  int64_t splits = 1;
  if (additive && outBlocks < 2 * target.typicalSMs)
    splits = std::clamp<int64_t>(std::min<int64_t>(4 * target.typicalSMs / outBlocks,
                                                   (count + perBlock - 1) / perBlock),
                                 1, 65535);
  int64_t chunk = (count + splits - 1) / splits;
  int64_t grid = outBlocks * splits;

  OpBuilder b(context);
  auto fn = newKernel(b, name, {flatMemref(elem, inType.getNumElements()),
                                flatMemref(elem, outType.getNumElements())},
                      block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value in = fn.getArgument(0), out = fn.getArgument(1), sh = fn.getWorkgroupAttributions()[0];
  Value identity = k.fconst(accType, kind->identity);
  auto combine = [&](Value a, Value c) { return kind->combine(k, a, c); };
  auto element = [&](Value base, Value r) {
    Value x = k.load(in, k.add(base, reduced.offset(k, r)), elem);
    return kind->square ? Value(b.create<arith::MulFOp>(k.loc, x, x)) : x;
  };
  auto finish = [&](Value acc, Value o) {
    if (kind->mean)
      acc = b.create<arith::DivFOp>(k.loc, acc, k.fconst(accType, static_cast<double>(count)));
    if (kind->sqrt)
      acc = b.create<math::SqrtOp>(k.loc, acc);
    if (splits > 1)
      b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, acc, out, ValueRange{o});
    else
      k.store(acc, out, o, elem);
  };
  // This block's output block and its chunk [rBegin, rEnd) of the reduced range.
  Value outBlock = splits > 1 ? k.rem(k.bid(), outBlocks) : k.bid();
  Value rBegin = splits > 1 ? k.mul(k.div(k.bid(), outBlocks), k.idx(chunk)) : k.idx(0);
  Value rEnd = splits > 1 ? Value(b.create<arith::MinUIOp>(k.loc, k.add(rBegin, k.idx(chunk)),
                                                           k.idx(count)))
                          : k.idx(count);

  if (rowLayout) {
    Value o = outBlock;
    Value base = kept.offset(k, o);
    Value acc = k.loopAcc(k.add(rBegin, k.tid()), rEnd, k.idx(block), identity,
                          [&](Value r, Value a) { return combine(a, element(base, r)); });
    acc = k.blockReduce(acc, block / kWarp, sh, identity, combine);
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)),
             [&] { finish(acc, o); });
  } else {
    // lanes: 32 consecutive outputs; warps: slices of the reduced range.
    Value t = k.tid();
    Value lane = k.rem(t, kWarp), warp = k.div(t, kWarp);
    Value o = k.add(k.mul(outBlock, k.idx(kWarp)), lane);
    Value valid = k.ult(o, k.idx(outputs));
    Value oc = b.create<arith::MinUIOp>(k.loc, o, k.idx(outputs - 1));
    Value base = kept.offset(k, oc);
    Value acc = k.loopAcc(k.add(rBegin, warp), rEnd, k.idx(block / kWarp), identity,
                          [&](Value r, Value a) { return combine(a, element(base, r)); });
    b.create<memref::StoreOp>(k.loc, acc, sh, t);
    b.create<gpu::BarrierOp>(k.loc);
    Value first = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, warp, k.idx(0));
    k.ifThen(b.create<arith::AndIOp>(k.loc, first, valid), [&] {
      Value total = b.create<memref::LoadOp>(k.loc, sh, lane);
      for (int64_t w = 1; w < block / kWarp; ++w)
        total = combine(total, b.create<memref::LoadOp>(k.loc, sh, k.add(lane, k.idx(w * kWarp))));
      finish(total, o);
    });
  }
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), grid, block};
  launch.zeroOutputs = splits > 1;
  return launch;
}

std::optional<KernelLaunch> KernelGenerator::Impl::rowKernel(Operation *op, StringRef name) {
  auto inType = tensorType(op->getOperand(0));
  auto axis = op->getAttrOfType<IntegerAttr>("axis");
  Type elem = inType.getElementType();
  if (!axis || !(elem.isF32() || elem.isF16() || elem.isBF16()) || inType.getRank() == 0 ||
      inType.getNumElements() == 0)
    return std::nullopt;
  int64_t ax = axis.getInt() < 0 ? axis.getInt() + inType.getRank() : axis.getInt();
  if (ax < 0 || ax >= inType.getRank())
    return std::nullopt;
  for (Value v : op->getOperands())
    if (tensorType(v) != inType)
      return std::nullopt;
  // A row is the `axis` dim at one (outer, inner) position: element c of row r
  // is at (r / inner * cols + c) * inner + r % inner (inner = 1: contiguous rows).
  int64_t cols = inType.getDimSize(ax), rows = inType.getNumElements() / cols;
  int64_t inner = 1;
  for (int64_t d = ax + 1; d < inType.getRank(); ++d)
    inner *= inType.getDimSize(d);
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  SmallVector<Type> args;
  for (Value v : op->getOperands())
    args.push_back(flatMemref(elem, tensorType(v).getNumElements()));
  args.push_back(flatMemref(elem, inType.getNumElements()));

  OpBuilder b(context);
  auto fn = newKernel(b, name, args, block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value out = fn.getArgument(op->getNumOperands());
  Value row = k.bid();
  Value base = inner == 1 ? k.mul(row, k.idx(cols))
                          : k.add(k.mul(k.div(row, inner), k.idx(cols * inner)), k.rem(row, inner));
  auto at = [&](Value c) { return k.add(base, inner == 1 ? c : k.mul(c, k.idx(inner))); };
  auto ld = [&](unsigned arg, Value c) { return k.load(fn.getArgument(arg), at(c), elem); };
  auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, a, c); };
  auto maxf = [&](Value a, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, a, c); };
  auto mulf = [&](Value a, Value c) -> Value { return b.create<arith::MulFOp>(k.loc, a, c); };
  auto subf = [&](Value a, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, a, c); };
  auto expf = [&](Value a) -> Value { return b.create<math::ExpOp>(k.loc, a); };
  Value zero = k.fconst(f32, 0.0), ninf = k.fconst(f32, -INFINITY);
  Value step = k.idx(block);
  auto rowReduce = [&](Value identity, function_ref<Value(Value, Value)> combine,
                       function_ref<Value(Value)> term) {
    return k.blockAccumulate(cols, block, sh, identity, combine, term);
  };
  auto forCols = [&](function_ref<Value(Value)> value) {
    b.create<scf::ForOp>(k.loc, k.tid(), k.idx(cols), step, ValueRange{},
                         [&](OpBuilder &nb, Location l, Value c, ValueRange) {
                           OpBuilder::InsertionGuard g(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           k.store(value(c), out, at(c), elem);
                           b.create<scf::YieldOp>(l);
                         });
  };

  if (isa<SoftmaxOp>(op) || isa<LogSoftmaxOp>(op)) {
    Value m = rowReduce(ninf, maxf, [&](Value c) { return ld(0, c); });
    Value s = rowReduce(zero, addf, [&](Value c) { return expf(subf(ld(0, c), m)); });
    if (isa<SoftmaxOp>(op)) {
      Value inv = b.create<arith::DivFOp>(k.loc, k.fconst(f32, 1.0), s);
      forCols([&](Value c) { return mulf(expf(subf(ld(0, c), m)), inv); });
    } else {
      Value shift = addf(m, b.create<math::LogOp>(k.loc, s));
      forCols([&](Value c) { return subf(ld(0, c), shift); });
    }
  } else if (isa<SoftmaxGradOp>(op)) { // (y, dy): y * (dy - sum(dy * y))
    Value d = rowReduce(zero, addf, [&](Value c) { return mulf(ld(0, c), ld(1, c)); });
    forCols([&](Value c) { return mulf(ld(0, c), subf(ld(1, c), d)); });
  } else if (isa<LogSoftmaxGradOp>(op)) { // (y, dy): dy - exp(y) * sum(dy)
    Value s = rowReduce(zero, addf, [&](Value c) { return ld(1, c); });
    forCols([&](Value c) { return subf(ld(1, c), mulf(expf(ld(0, c)), s)); });
  } else {
    fn.erase();
    return std::nullopt;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

namespace {
/// [P, A, Q] around `axis` of `shape`.
std::array<int64_t, 3> aroundAxis(ArrayRef<int64_t> shape, int64_t axis) {
  int64_t p = 1, q = 1;
  for (int64_t d = 0; d < axis; ++d)
    p *= shape[d];
  for (int64_t d = axis + 1; d < static_cast<int64_t>(shape.size()); ++d)
    q *= shape[d];
  return {p, shape[axis], q};
}

int64_t normalizedAxis(Operation *op, int64_t rank) {
  int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
  return axis < 0 ? axis + rank : axis;
}

/// Input index of padded position `s` (output index minus the begin pad) in a
/// dim of extent n, as the CPU's padSourceIndex; constant mode clamps and
/// clears `valid` outside.
Value padSource(Body &k, Value s, int64_t n, StringRef mode, Value &valid) {
  OpBuilder &b = k.b;
  auto srem = [&](Value a, int64_t m) { // ((a % m) + m) % m on signed values
    Value r = b.create<arith::RemSIOp>(k.loc, a, k.idx(m));
    return b.create<arith::RemSIOp>(k.loc, k.add(r, k.idx(m)), k.idx(m));
  };
  auto clampIdx = [&](Value v) {
    return b.create<arith::MinSIOp>(k.loc, b.create<arith::MaxSIOp>(k.loc, v, k.idx(0)),
                                    k.idx(n - 1));
  };
  if (mode == "constant") {
    Value lo = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, s, k.idx(0));
    Value hi = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, s, k.idx(n));
    valid = b.create<arith::AndIOp>(k.loc, valid, b.create<arith::AndIOp>(k.loc, lo, hi));
    return clampIdx(s);
  }
  if (mode == "edge")
    return clampIdx(s);
  if (mode == "wrap")
    return srem(s, n);
  if (n == 1) // reflect
    return k.idx(0);
  int64_t period = 2 * (n - 1);
  Value r = srem(s, period);
  Value back = b.create<arith::SubIOp>(k.loc, k.idx(period), r);
  Value over = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, r, k.idx(n));
  return b.create<arith::SelectOp>(k.loc, over, back, r);
}

/// An index operand value as `index`, negative values counted from `size`. One
/// outside [-size, size) is a fault (Body::fault); it is then clamped into
/// [0, size) so that the kernel still reads and writes in bounds. The check and
/// the clamp happen in the index's own width: kernels use a 32-bit `index`, so
/// casting first would make an int64 index 2^32 + 3 read element 3 silently.
Value loadIndex(Body &k, Value memref, Value at, int64_t size) {
  Value raw = k.b.create<memref::LoadOp>(k.loc, memref, at);
  Type t = raw.getType();
  auto c = [&](int64_t v) { return intConst(k, t, v); };
  Value neg = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, raw, c(0));
  Value i = k.b.create<arith::SelectOp>(k.loc, neg, k.b.create<arith::AddIOp>(k.loc, raw, c(size)),
                                        raw);
  k.fault(k.b.create<arith::OrIOp>(
      k.loc, k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, i, c(0)),
      k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, i, c(size))));
  i = k.b.create<arith::MaxSIOp>(k.loc, i, c(0));
  i = k.b.create<arith::MinSIOp>(k.loc, i, c(size - 1));
  return k.b.create<arith::IndexCastOp>(k.loc, k.b.getIndexType(), i);
}

/// A class target of nll_loss (or its gradient): the raw value and the class
/// clamped into [0, classes) as `index`, clamped in the target's own width
/// (see loadIndex). Whether the raw value was in range is the caller's check.
std::pair<Value, Value> loadTarget(Body &k, Value memref, Value at, int64_t classes) {
  Value raw = k.b.create<memref::LoadOp>(k.loc, memref, at);
  Type t = raw.getType();
  Value tc = k.b.create<arith::MaxSIOp>(k.loc, raw, intConst(k, t, 0));
  tc = k.b.create<arith::MinSIOp>(k.loc, tc, intConst(k, t, classes - 1));
  return {raw, k.b.create<arith::IndexCastOp>(k.loc, k.b.getIndexType(), tc)};
}
} // namespace

namespace {
/// Element i of a gather (out[i] = src[at]) or of its gradient (dsrc[at] +=
/// dy[i], with f32 atomics into the zeroed output); operands (src or dy,
/// indices, result).
void gatherOrScatter(Body &k, gpu::GPUFuncOp fn, Value i, Value at, bool grad) {
  if (grad) {
    Value g = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
    k.b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g, fn.getArgument(2),
                                    ValueRange{at});
  } else {
    Value v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), at);
    k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(2), i);
  }
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::gatherKernel(Operation *op, StringRef name,
                                                                bool grad) {
  auto src = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  auto indices = tensorType(op->getOperand(1));
  ArrayRef<int64_t> dataShape = grad ? out.getShape() : src.getShape();
  int64_t axis = normalizedAxis(op, static_cast<int64_t>(dataShape.size()));
  if (axis < 0 || axis >= static_cast<int64_t>(dataShape.size()))
    return std::nullopt;
  auto [p, a, q] = aroundAxis(dataShape, axis);
  int64_t ni = indices.getNumElements();
  if (a == 0 || ni == 0 || q == 0 || p == 0)
    return std::nullopt;
  if (grad && !out.getElementType().isF32())
    return std::nullopt; // atomic f32 adds only
  // Iterate over the gathered elements (p, j, q): the output of gather, the
  // incoming gradient of gather_grad (scatter-added into zeros).
  KernelLaunch l = elementKernel(
      name, flatArgs(op), p * ni * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        Value qi = k.rem(i, q), r = k.div(i, q);
        Value j = k.rem(r, ni), pi = k.div(r, ni);
        Value t = loadIndex(k, fn.getArgument(1), j, a);
        Value at = k.add(k.mul(k.add(k.mul(pi, k.idx(a)), t), k.idx(q)), qi);
        gatherOrScatter(k, fn, i, at, grad);
      });
  l.zeroOutputs = grad;
  return l;
}

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  auto reduction = op->getAttrOfType<StringAttr>("reduction");
  bool weighted = op->getNumOperands() == 3;
  if (in.getRank() < 2 || !in.getElementType().isF32() || !reduction ||
      in.getNumElements() == 0 ||
      (weighted && !tensorType(op->getOperand(2)).getElementType().isF32()))
    return std::nullopt;
  // Positions p = (sample, extra dims...) of the [N, C, d...] input: N*D of them,
  // class t of position p at (p / D * C + t) * D + p % D.
  int64_t c = in.getDimSize(1), n = in.getNumElements() / c;
  int64_t inner = n / in.getDimSize(0);
  auto xIndex = [&](Body &k, Value p, Value t) {
    if (inner == 1)
      return k.add(k.mul(p, k.idx(c)), t);
    return k.add(k.mul(k.add(k.mul(k.div(p, inner), k.idx(c)), t), k.idx(inner)), k.rem(p, inner));
  };
  auto ignore = op->getAttrOfType<IntegerAttr>("ignore_index");
  bool mean = reduction.getValue() == "mean";
  // A counted target's weight (1 without weights) and class (clamped in range).
  auto targetOf = [&](Body &k, gpu::GPUFuncOp fn, Value row) {
    OpBuilder &b = k.b;
    auto [raw, tc] = loadTarget(k, fn.getArgument(1), row, c);
    Value counted = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    if (ignore)
      counted = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne, raw,
                                        intConst(k, raw.getType(), ignore.getInt()));
    // Out of range (compared in the target's own width, before the clamp).
    Value outside = b.create<arith::OrIOp>(
        k.loc,
        b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, raw, intConst(k, raw.getType(), 0)),
        b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, raw, intConst(k, raw.getType(), c)));
    k.fault(b.create<arith::AndIOp>(k.loc, counted, outside));
    Value w = weighted ? Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(2), tc))
                       : k.fconst(b.getF32Type(), 1.0);
    w = b.create<arith::SelectOp>(k.loc, counted, w, k.fconst(b.getF32Type(), 0.0));
    return std::pair<Value, Value>{tc, w};
  };
  if (reduction.getValue() == "none")
    return elementKernel(name, flatArgs(op), n, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value row) {
      auto [tc, w] = targetOf(k, fn, row);
      Value x = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), xIndex(k, row, tc));
      Value y = k.b.create<arith::MulFOp>(k.loc, k.b.create<arith::NegFOp>(k.loc, x), w);
      k.b.create<memref::StoreOp>(k.loc, y, fn.getArgument(op->getNumOperands()), row);
    });
  if (reduction.getValue() != "mean" && reduction.getValue() != "sum")
    return std::nullopt;
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, n, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value zero = k.fconst(f32, 0.0), one = k.fconst(f32, 1.0);
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  Type pairType = f32;
  (void)pairType;
  (void)one;
  // Per thread: (sum of -w[t] x[n, t[n]], sum of the counted targets' weights); then block sums.
  auto loop = b.create<scf::ForOp>(
      k.loc, k.tid(), k.idx(n), k.idx(block), ValueRange{zero, zero},
      [&](OpBuilder &nb, Location l, Value row, ValueRange acc) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        auto [tc, w] = targetOf(k, fn, row);
        Value x = b.create<memref::LoadOp>(l, fn.getArgument(0), xIndex(k, row, tc));
        Value term = b.create<arith::MulFOp>(l, b.create<arith::NegFOp>(l, x), w);
        b.create<scf::YieldOp>(l, ValueRange{addf(acc[0], term), addf(acc[1], w)});
      });
  Value sum = k.blockReduce(loop.getResult(0), block / kWarp, sh, zero, addf);
  Value count = k.blockReduce(loop.getResult(1), block / kWarp, sh, zero, addf);
  k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
    Value v = mean ? Value(b.create<arith::DivFOp>(k.loc, sum, count)) : sum;
    b.create<memref::StoreOp>(k.loc, v, fn.getArgument(op->getNumOperands()), k.idx(0));
  });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), 1, block};
}

/// cross_entropy (logits, target) -> (loss, lse) and cross_entropy_grad
/// (logits, lse, target, dy) -> dlogits: one block per row of [N, C] logits,
/// block reductions as the row kernels. The forward reads the row twice (max,
/// then the sum of exponentials) and writes two scalars per row; the gradient
/// reads it once and writes g * (exp(x - lse) - [c == target]).
std::optional<KernelLaunch> KernelGenerator::Impl::crossEntropyKernel(Operation *op,
                                                                      StringRef name, bool grad) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() != 2 || !(elem.isF32() || elem.isF16() || elem.isBF16()) ||
      in.getNumElements() == 0)
    return std::nullopt;
  int64_t rows = in.getDimSize(0), cols = in.getDimSize(1);
  StringRef reduction;
  if (grad) {
    auto r = op->getAttrOfType<StringAttr>("reduction");
    if (!r)
      return std::nullopt;
    reduction = r.getValue();
  }
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value row = k.bid();
  Value base = k.mul(row, k.idx(cols));
  auto ld = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  auto addf = [&](Value a, Value c) -> Value { return b.create<arith::AddFOp>(k.loc, a, c); };
  auto subf = [&](Value a, Value c) -> Value { return b.create<arith::SubFOp>(k.loc, a, c); };
  auto expf = [&](Value a) -> Value { return b.create<math::ExpOp>(k.loc, a); };
  Value zero = k.fconst(f32, 0.0);
  unsigned targetArg = grad ? 2 : 1;
  auto [raw, tc] = loadTarget(k, fn.getArgument(targetArg), row, cols);
  if (!grad) {
    auto maxf = [&](Value a, Value c) -> Value { return b.create<arith::MaximumFOp>(k.loc, a, c); };
    Value m = k.blockAccumulate(cols, block, sh, k.fconst(f32, -INFINITY), maxf, ld);
    Value s = k.blockAccumulate(cols, block, sh, zero, addf,
                                [&](Value c) { return expf(subf(ld(c), m)); });
    Value lse = addf(m, b.create<math::LogOp>(k.loc, s));
    Value outside = b.create<arith::OrIOp>(
        k.loc,
        b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, raw, intConst(k, raw.getType(), 0)),
        b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, raw,
                                intConst(k, raw.getType(), cols)));
    k.ifThen(b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0)), [&] {
      k.fault(outside);
      k.store(subf(lse, ld(tc)), fn.getArgument(2), row, elem);
      k.store(lse, fn.getArgument(3), row, elem);
    });
  } else {
    Value lse = k.load(fn.getArgument(1), row, elem);
    Value dy = k.load(fn.getArgument(3), reduction == "none" ? row : k.idx(0), elem);
    Value g = reduction == "mean"
                  ? Value(b.create<arith::DivFOp>(k.loc, dy, k.fconst(f32, double(rows))))
                  : dy;
    Value one = k.fconst(f32, 1.0);
    b.create<scf::ForOp>(k.loc, k.tid(), k.idx(cols), k.idx(block), ValueRange{},
                         [&](OpBuilder &nb, Location l, Value c, ValueRange) {
                           OpBuilder::InsertionGuard guard(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           Value p = expf(subf(ld(c), lse));
                           Value hit = b.create<arith::CmpIOp>(l, arith::CmpIPredicate::eq, c, tc);
                           p = b.create<arith::SelectOp>(l, hit, subf(p, one), p);
                           k.store(b.create<arith::MulFOp>(l, g, p), fn.getArgument(4),
                                   k.add(base, c), elem);
                           b.create<scf::YieldOp>(l);
                         });
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossGradKernel(Operation *op,
                                                                     StringRef name) {
  auto out = tensorType(op->getResult(0));
  auto reduction = op->getAttrOfType<StringAttr>("reduction");
  if (out.getRank() < 2 || !out.getElementType().isF32() || !reduction ||
      out.getNumElements() == 0)
    return std::nullopt;
  // The mean's denominator is the batch size only without weights and ignore_index.
  if (out.getRank() != 2 || op->getNumOperands() != 2 || op->hasAttr("ignore_index") ||
      (reduction.getValue() != "mean" && reduction.getValue() != "sum") ||
      tensorType(op->getOperand(0)).getNumElements() != 1)
    return nllLossGradRowKernel(op, name);
  int64_t n = out.getDimSize(0), c = out.getDimSize(1);
  double scale = reduction.getValue() == "mean" ? -1.0 / static_cast<double>(n) : -1.0;
  return elementKernel(name, flatArgs(op), n * c, op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value row = k.div(i, c), col = k.rem(i, c);
                         Value raw = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(1), row);
                         // In the target's width: a 32-bit `index` would wrap an int64 target.
                         Value colT = k.b.create<arith::IndexCastOp>(k.loc, raw.getType(), col);
                         Value hit = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq,
                                                               raw, colT);
                         Value dy = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0));
                         Type f32 = k.b.getF32Type();
                         Value g = k.b.create<arith::MulFOp>(k.loc, dy, k.fconst(f32, scale));
                         Value v = k.b.create<arith::SelectOp>(k.loc, hit, g, k.fconst(f32, 0.0));
                         k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(2), i);
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::nllLossGradRowKernel(Operation *op,
                                                                        StringRef name) {
  // The general form (weights, ignore_index, extra dims, reduction none): a
  // grid-stride loop over dx. dx[p, c] is zero but at c = t[p], which gets
  // -w[t] dy (dy[p] for reduction none), divided for the mean by the counted
  // targets' total weight. Each block sums that total once, so the grid is
  // capped (a few blocks per SM): the work stays linear in the number of
  // targets (a [N, C, 512, 512] segmentation loss has millions of them).
  auto out = tensorType(op->getResult(0));
  StringRef reduction = op->getAttrOfType<StringAttr>("reduction").getValue();
  bool weighted = op->getNumOperands() == 3;
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return std::nullopt;
  if (weighted && !tensorType(op->getOperand(2)).getElementType().isF32())
    return std::nullopt;
  // Positions p of [N, C, d...] as in nllLossKernel: n = N*D of them; element
  // i of dx is ((p / D) * C + c) * D + p % D.
  int64_t c = out.getDimSize(1), n = out.getNumElements() / c;
  int64_t inner = n / out.getDimSize(0), total = out.getNumElements();
  auto ignore = op->getAttrOfType<IntegerAttr>("ignore_index");
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, total, 32, kWarp * 4);
  int64_t grid = std::clamp<int64_t>((total + block - 1) / block, 1, 4 * target.typicalSMs);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value zero = k.fconst(f32, 0.0);
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto weightOf = [&](Value p) -> std::pair<Value, Value> { // (class, weight or 0)
    auto [raw, tc] = loadTarget(k, fn.getArgument(1), p, c);
    Value w = weighted ? Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(2), tc))
                       : k.fconst(f32, 1.0);
    if (ignore) {
      Value counted = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne, raw,
                                              intConst(k, raw.getType(), ignore.getInt()));
      w = b.create<arith::SelectOp>(k.loc, counted, w, zero);
    }
    return {tc, w};
  };
  Value sum; // the mean's denominator
  if (reduction == "mean")
    sum = k.blockAccumulate(n, block, sh, zero, addf,
                            [&](Value m) { return weightOf(m).second; });
  Value dyAll = reduction == "none"
                    ? Value()
                    : Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0)));
  Value dx = fn.getArgument(op->getNumOperands());
  k.gridStride(total, [&](Value i) {
    Value col = k.rem(k.div(i, inner), c);
    Value p = inner == 1 ? k.div(i, c) : k.add(k.mul(k.div(i, c * inner), k.idx(inner)),
                                               k.rem(i, inner));
    auto [t, w] = weightOf(p);
    Value dy = dyAll ? dyAll : Value(b.create<memref::LoadOp>(k.loc, fn.getArgument(0), p));
    Value g = b.create<arith::MulFOp>(k.loc, b.create<arith::NegFOp>(k.loc, dy), w);
    if (sum)
      g = b.create<arith::DivFOp>(k.loc, g, sum);
    Value hit = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, col, t);
    b.create<memref::StoreOp>(k.loc, b.create<arith::SelectOp>(k.loc, hit, g, zero), dx, i);
  });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), grid, block};
}

/// dropout_mask: element i keeps when word i % 4 of Philox4x32-10(key = seed,
/// counter = (i / 4, 0, step, 0)) is >= the ratio's threshold, with the rounds,
/// constants and threshold of forge/runtime/Philox.h (the CPU kernel), so the
/// masks are bit-identical. One thread per element computes its block's four
/// words and keeps one: 4x redundant integer work, which is cheap next to the
/// memory traffic of the tensor it masks.
std::optional<KernelLaunch> KernelGenerator::Impl::dropoutMaskKernel(Operation *op,
                                                                    StringRef name) {
  auto out = tensorType(op->getResult(0));
  if (!tensorType(op->getOperand(0)).getElementType().isF32() || out.getNumElements() == 0)
    return std::nullopt;
  double ratio = op->getAttrOfType<FloatAttr>("ratio").getValueAsDouble();
  uint64_t seed = static_cast<uint64_t>(op->getAttrOfType<IntegerAttr>("seed").getInt());
  uint64_t threshold = ::forge::rt::dropoutThreshold(ratio);
  Type outElem = out.getElementType();
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Type i32 = b.getI32Type(), i64 = b.getI64Type();
    auto c32 = [&](uint32_t v) { return intConst(k, i32, static_cast<int32_t>(v)); };
    auto xor3 = [&](Value a, Value c, Value d) {
      return b.create<arith::XOrIOp>(k.loc, b.create<arith::XOrIOp>(k.loc, a, c), d);
    };
    Value step = b.create<arith::FPToUIOp>(
        k.loc, i32, b.create<memref::LoadOp>(k.loc, fn.getArgument(0), k.idx(0)));
    Value block = b.create<arith::IndexCastUIOp>(k.loc, i32, k.div(i, 4));
    std::array<Value, 4> c = {block, c32(0), step, c32(0)};
    std::array<Value, 2> key = {c32(static_cast<uint32_t>(seed)),
                                c32(static_cast<uint32_t>(seed >> 32))};
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        key[0] = b.create<arith::AddIOp>(k.loc, key[0], c32(::forge::rt::kPhiloxW0));
        key[1] = b.create<arith::AddIOp>(k.loc, key[1], c32(::forge::rt::kPhiloxW1));
      }
      auto p0 = b.create<arith::MulUIExtendedOp>(k.loc, c32(::forge::rt::kPhiloxM0), c[0]);
      auto p1 = b.create<arith::MulUIExtendedOp>(k.loc, c32(::forge::rt::kPhiloxM1), c[2]);
      c = {xor3(p1.getHigh(), c[1], key[0]), p1.getLow(), xor3(p0.getHigh(), c[3], key[1]),
           p0.getLow()};
    }
    Value lane = k.rem(i, 4), word = c[3];
    for (int w = 2; w >= 0; --w)
      word = b.create<arith::SelectOp>(
          k.loc, b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, lane, k.idx(w)), c[w],
          word);
    Value keep = b.create<arith::CmpIOp>(
        k.loc, arith::CmpIPredicate::uge, b.create<arith::ExtUIOp>(k.loc, i64, word),
        intConst(k, i64, static_cast<int64_t>(threshold)));
    k.store(keep, fn.getArgument(1), i, outElem);
  });
}

std::optional<KernelLaunch> KernelGenerator::Impl::argmaxKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() == 0 || !(elem.isF32() || elem.isF16() || elem.isBF16()))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, d, q] = aroundAxis(in.getShape(), axis);
  bool last = op->getAttrOfType<BoolAttr>("select_last_index").getValue();
  // One thread per output; the first NaN wins (as the CPU kernel and NumPy).
  return elementKernel(
      name, flatArgs(op), p * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value o) {
        OpBuilder &b = k.b;
        Value base = k.add(k.mul(k.div(o, q), k.idx(d * q)), k.rem(o, q));
        Value first = k.load(fn.getArgument(0), base, elem);
        auto loop = b.create<scf::ForOp>(
            k.loc, k.idx(1), k.idx(d), k.idx(1), ValueRange{first, k.idx(0)},
            [&](OpBuilder &nb, Location l, Value j, ValueRange acc) {
              OpBuilder::InsertionGuard g(b);
              b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
              Value v = k.load(fn.getArgument(0), k.add(base, k.mul(j, k.idx(q))), elem);
              Value better = b.create<arith::CmpFOp>(
                  l, last ? arith::CmpFPredicate::OGE : arith::CmpFPredicate::OGT, v, acc[0]);
              Value vnan = b.create<arith::CmpFOp>(l, arith::CmpFPredicate::UNO, v, v);
              Value bestNan = b.create<arith::CmpFOp>(l, arith::CmpFPredicate::UNO, acc[0], acc[0]);
              Value take = b.create<arith::OrIOp>(l, better, vnan);
              take = b.create<arith::AndIOp>(
                  l, take, b.create<arith::XOrIOp>(l, bestNan, b.create<arith::ConstantIntOp>(l, 1, 1)));
              b.create<scf::YieldOp>(l, ValueRange{b.create<arith::SelectOp>(l, take, v, acc[0]),
                                                   b.create<arith::SelectOp>(l, take, j, acc[1])});
            });
        Value idx = b.create<arith::IndexCastOp>(k.loc, b.getI64Type(), loop.getResult(1));
        b.create<memref::StoreOp>(k.loc, idx, fn.getArgument(1), o);
      });
}

/// top_k: one thread per input element; its rank in its line is the number of
/// elements before it in the order (larger, or smaller, first; equal with a
/// lower index; NaN above every number, as the CPU kernel), and it writes
/// itself to position rank when rank < k. O(d^2) per line but parallel and
/// deterministic: the order is total, so every output is written exactly once.
std::optional<KernelLaunch> KernelGenerator::Impl::topKKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  if (in.getRank() == 0 || in.getNumElements() == 0 || elem.isInteger(1))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, d, q] = aroundAxis(in.getShape(), axis);
  // Long lines (a vocabulary) would cost d^2 compares each: the host's partial
  // sort is cheaper there until a sorting kernel exists.
  constexpr int64_t kMaxLine = 4096;
  if (d > kMaxLine)
    return std::nullopt;
  int64_t topK = op->getAttrOfType<IntegerAttr>("k").getInt();
  bool largest = op->getAttrOfType<BoolAttr>("largest").getValue();
  bool fl = isFloat(elem), isUnsigned = isUnsignedInt(elem);
  return elementKernel(
      name, flatArgs(op), p * d * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        OpBuilder &b = k.b;
        Location loc = k.loc;
        Value c = k.rem(i, q), j = k.rem(k.div(i, q), d), o = k.div(i, d * q);
        Value base = k.add(k.mul(o, k.idx(d * q)), c);
        Value v = k.load(fn.getArgument(0), i, elem);
        auto cmpf = [&](arith::CmpFPredicate pr, Value a, Value e) -> Value {
          return b.create<arith::CmpFOp>(loc, pr, a, e);
        };
        auto cmpi = [&](arith::CmpIPredicate pr, Value a, Value e) -> Value {
          return b.create<arith::CmpIOp>(loc, pr, a, e);
        };
        auto andi = [&](Value a, Value e) -> Value { return b.create<arith::AndIOp>(loc, a, e); };
        auto ori = [&](Value a, Value e) -> Value { return b.create<arith::OrIOp>(loc, a, e); };
        auto noti = [&](Value a) -> Value {
          return b.create<arith::XOrIOp>(loc, a, b.create<arith::ConstantIntOp>(loc, 1, 1));
        };
        Value vNan = fl ? cmpf(arith::CmpFPredicate::UNO, v, v) : Value();
        Value rank = k.loopAcc(k.idx(0), d, k.idx(1), k.idx(0), [&](Value m, Value count) {
          Value u = k.load(fn.getArgument(0), k.add(base, k.mul(m, k.idx(q))), elem);
          Value ahead, equal; // u comes strictly before v, u ties with v
          if (fl) {
            Value uNan = cmpf(arith::CmpFPredicate::UNO, u, u);
            ahead = largest ? ori(cmpf(arith::CmpFPredicate::OGT, u, v), andi(uNan, noti(vNan)))
                            : ori(cmpf(arith::CmpFPredicate::OLT, u, v), andi(vNan, noti(uNan)));
            equal = ori(cmpf(arith::CmpFPredicate::OEQ, u, v), andi(uNan, vNan));
          } else {
            auto gt = isUnsigned ? arith::CmpIPredicate::ugt : arith::CmpIPredicate::sgt;
            auto lt = isUnsigned ? arith::CmpIPredicate::ult : arith::CmpIPredicate::slt;
            ahead = cmpi(largest ? gt : lt, u, v);
            equal = cmpi(arith::CmpIPredicate::eq, u, v);
          }
          Value before = ori(ahead, andi(equal, k.ult(m, j)));
          return b.create<arith::SelectOp>(loc, before, k.add(count, k.idx(1)), count);
        });
        k.ifThen(k.ult(rank, k.idx(topK)), [&] {
          Value at = k.add(k.add(k.mul(o, k.idx(topK * q)), k.mul(rank, k.idx(q))), c);
          k.store(v, fn.getArgument(1), at, elem);
          b.create<memref::StoreOp>(loc, b.create<arith::IndexCastOp>(loc, b.getI64Type(), j),
                                    fn.getArgument(2), at);
        });
      });
}

namespace {
/// Where column c of a layer-norm row (the dims from `axis` on, `normShape`)
/// finds its element of a scale, bias or their gradient that broadcasts to
/// the row (NumPy rules); nullopt when `param` does not broadcast to it.
std::optional<std::function<Value(Body &, Value)>> paramIndex(RankedTensorType param,
                                                            ArrayRef<int64_t> normShape) {
  int64_t cols = 1;
  for (int64_t d : normShape)
    cols *= d;
  if (param.getNumElements() == cols)
    return [](Body &, Value c) { return c; };
  if (param.getRank() > static_cast<int64_t>(normShape.size()))
    return std::nullopt;
  for (int64_t d = 0; d < param.getRank(); ++d) {
    int64_t size = param.getDimSize(d), to = normShape[normShape.size() - param.getRank() + d];
    if (size != 1 && size != to)
      return std::nullopt;
  }
  SmallVector<int64_t> strides = broadcastStrides(param.getShape(), normShape);
  SmallVector<int64_t> dims(normShape);
  return [strides, dims](Body &k, Value c) {
    Value at = k.idx(0), rest = c;
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      if (strides[d] != 0)
        at = k.add(at, k.mul(k.rem(rest, dims[d]), k.idx(strides[d])));
      rest = k.div(rest, dims[d]);
    }
    return at;
  };
}
} // namespace

std::optional<KernelLaunch> KernelGenerator::Impl::layerNormKernel(Operation *op,
                                                                   StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  int64_t axis = normalizedAxis(op, in.getRank());
  if (!(elem.isF32() || elem.isF16() || elem.isBF16()) || axis < 0 || axis >= in.getRank())
    return std::nullopt;
  int64_t cols = 1;
  for (int64_t d = axis; d < in.getRank(); ++d)
    cols *= in.getDimSize(d);
  int64_t rows = cols ? in.getNumElements() / cols : 0;
  ArrayRef<int64_t> normShape = in.getShape().drop_front(axis);
  SmallVector<std::function<Value(Body &, Value)>> at; // scale, bias
  for (unsigned i = 1; i < op->getNumOperands(); ++i) {
    auto index = paramIndex(tensorType(op->getOperand(i)), normShape);
    if (!index || tensorType(op->getOperand(i)).getElementType() != elem)
      return std::nullopt;
    at.push_back(*index);
  }
  if (rows == 0)
    return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  bool hasBias = op->getNumOperands() == 3;
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value out = fn.getArgument(op->getNumOperands());
  Value base = k.mul(k.bid(), k.idx(cols));
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto subf = [&](Value x, Value y) -> Value { return b.create<arith::SubFOp>(k.loc, x, y); };
  auto mulf = [&](Value x, Value y) -> Value { return b.create<arith::MulFOp>(k.loc, x, y); };
  auto x = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, x);
  b.create<scf::ForOp>(k.loc, k.tid(), k.idx(cols), k.idx(block), ValueRange{},
                       [&](OpBuilder &nb, Location l, Value c, ValueRange) {
                         OpBuilder::InsertionGuard g(b);
                         b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                         Value y = mulf(mulf(subf(x(c), mean), rstd),
                                        k.load(fn.getArgument(1), at[0](k, c), elem));
                         if (hasBias)
                           y = addf(y, k.load(fn.getArgument(2), at[1](k, c), elem));
                         k.store(y, out, k.add(base, c), elem);
                         b.create<scf::YieldOp>(l);
                       });
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), rows, block};
}

std::optional<KernelLaunch> KernelGenerator::Impl::layerNormGradKernel(Operation *op,
                                                                       StringRef name) {
  auto in = tensorType(op->getOperand(0));
  Type elem = in.getElementType();
  int64_t axis = normalizedAxis(op, in.getRank());
  if (!elem.isF32() || axis < 0 || axis >= in.getRank())
    return std::nullopt; // dscale/dbias accumulate with f32 atomics
  int64_t cols = 1;
  for (int64_t d = axis; d < in.getRank(); ++d)
    cols *= in.getDimSize(d);
  int64_t rows = cols ? in.getNumElements() / cols : 0;
  ArrayRef<int64_t> normShape = in.getShape().drop_front(axis);
  bool wantDx = op->getAttrOfType<BoolAttr>("input_grad").getValue();
  bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
  bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
  // Element of the scale, dscale and dbias (each with its own broadcast) of column c.
  auto scaleAt = paramIndex(tensorType(op->getOperand(1)), normShape);
  unsigned result = wantDx ? 1 : 0;
  auto dscaleAt = wantScale ? paramIndex(tensorType(op->getResult(result)), normShape) : scaleAt;
  auto dbiasAt = wantBias ? paramIndex(tensorType(op->getResult(result + wantScale)), normShape)
                          : scaleAt;
  if (rows == 0 || !scaleAt || !dscaleAt || !dbiasAt)
    return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  unsigned next = 3;
  Value dx = wantDx ? fn.getArgument(next++) : Value();
  Value dscale = wantScale ? fn.getArgument(next++) : Value();
  Value dbias = wantBias ? fn.getArgument(next++) : Value();
  Value base = k.mul(k.bid(), k.idx(cols));
  auto addf = [&](Value x, Value y) -> Value { return b.create<arith::AddFOp>(k.loc, x, y); };
  auto subf = [&](Value x, Value y) -> Value { return b.create<arith::SubFOp>(k.loc, x, y); };
  auto mulf = [&](Value x, Value y) -> Value { return b.create<arith::MulFOp>(k.loc, x, y); };
  Value zero = k.fconst(f32, 0.0), invCols = k.fconst(f32, 1.0 / static_cast<double>(cols));
  auto x = [&](Value c) { return k.load(fn.getArgument(0), k.add(base, c), elem); };
  auto w = [&](Value c) { return k.load(fn.getArgument(1), (*scaleAt)(k, c), elem); };
  auto dy = [&](Value c) { return k.load(fn.getArgument(2), k.add(base, c), elem); };
  auto rowSum = [&](function_ref<Value(Value)> term) {
    return k.blockAccumulate(cols, block, sh, zero, addf, term);
  };
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, x);
  auto xhat = [&](Value c) { return mulf(subf(x(c), mean), rstd); };
  Value m1, m2;
  if (wantDx) {
    m1 = mulf(rowSum([&](Value c) { return mulf(dy(c), w(c)); }), invCols);
    m2 = mulf(rowSum([&](Value c) { return mulf(mulf(dy(c), w(c)), xhat(c)); }), invCols);
  }
  b.create<scf::ForOp>(
      k.loc, k.tid(), k.idx(cols), k.idx(block), ValueRange{},
      [&](OpBuilder &nb, Location l, Value c, ValueRange) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        Value g0 = dy(c), xh = xhat(c);
        if (wantDx)
          k.store(mulf(rstd, subf(subf(mulf(g0, w(c)), m1), mulf(xh, m2))), dx, k.add(base, c),
                  elem);
        if (wantScale)
          b.create<memref::AtomicRMWOp>(l, arith::AtomicRMWKind::addf, mulf(g0, xh), dscale,
                                        ValueRange{(*dscaleAt)(k, c)});
        if (wantBias)
          b.create<memref::AtomicRMWOp>(l, arith::AtomicRMWKind::addf, g0, dbias,
                                        ValueRange{(*dbiasAt)(k, c)});
        b.create<scf::YieldOp>(l);
      });
  b.create<gpu::ReturnOp>(k.loc);
  KernelLaunch launch{name.str(), rows, block};
  launch.zeroOutputs = wantScale || wantBias; // dx is fully written, zeroing it is harmless
  return launch;
}

std::optional<KernelLaunch> KernelGenerator::Impl::concatKernel(Operation *op, StringRef name) {
  auto out = tensorType(op->getResult(0));
  int64_t axis = normalizedAxis(op, out.getRank());
  auto [p, total, q] = aroundAxis(out.getShape(), axis);
  SmallVector<int64_t> sizes, offsets;
  int64_t at = 0;
  for (Value v : op->getOperands()) {
    sizes.push_back(tensorType(v).getDimSize(axis));
    offsets.push_back(at);
    at += sizes.back();
  }
  if (out.getNumElements() == 0 || llvm::is_contained(sizes, 0))
    return std::nullopt;
  unsigned n = op->getNumOperands();
  // Every input is read at a clamped (in-bounds) position; the one whose range
  // holds the output's axis coordinate is selected.
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value qi = k.rem(i, q), r = k.div(i, q);
                         Value a = k.rem(r, total), pi = k.div(r, total);
                         Value result;
                         for (unsigned j = 0; j < n; ++j) {
                           Value local = k.b.create<arith::SubIOp>(k.loc, a, k.idx(offsets[j]));
                           Value clamped = k.b.create<arith::MinSIOp>(
                               k.loc, k.b.create<arith::MaxSIOp>(k.loc, local, k.idx(0)),
                               k.idx(sizes[j] - 1));
                           Value src = k.add(k.mul(k.add(k.mul(pi, k.idx(sizes[j])), clamped),
                                                   k.idx(q)),
                                             qi);
                           Value v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(j), src);
                           if (!result) {
                             result = v;
                             continue;
                           }
                           Value inside = k.b.create<arith::CmpIOp>(
                               k.loc, arith::CmpIPredicate::sge, a, k.idx(offsets[j]));
                           result = k.b.create<arith::SelectOp>(k.loc, inside, v, result);
                         }
                         k.b.create<memref::StoreOp>(k.loc, result, fn.getArgument(n), i);
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::splitKernel(Operation *op, StringRef name) {
  auto in = tensorType(op->getOperand(0));
  int64_t axis = normalizedAxis(op, in.getRank());
  auto [p, total, q] = aroundAxis(in.getShape(), axis);
  SmallVector<int64_t> sizes, offsets;
  int64_t at = 0;
  for (Value v : op->getResults()) {
    sizes.push_back(tensorType(v).getDimSize(axis));
    offsets.push_back(at);
    at += sizes.back();
  }
  if (in.getNumElements() == 0 || at != total)
    return std::nullopt;
  // One pass over the input; each element is stored into the output whose
  // range holds its axis coordinate.
  return elementKernel(name, flatArgs(op), in.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value qi = k.rem(i, q), r = k.div(i, q);
                         Value a = k.rem(r, total), pi = k.div(r, total);
                         Value v = k.b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
                         for (unsigned j = 0; j < sizes.size(); ++j) {
                           if (sizes[j] == 0)
                             continue;
                           Value lo = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge,
                                                                a, k.idx(offsets[j]));
                           Value hi = k.ult(a, k.idx(offsets[j] + sizes[j]));
                           k.ifThen(k.b.create<arith::AndIOp>(k.loc, lo, hi), [&] {
                             Value local = k.b.create<arith::SubIOp>(k.loc, a, k.idx(offsets[j]));
                             Value dst = k.add(
                                 k.mul(k.add(k.mul(pi, k.idx(sizes[j])), local), k.idx(q)), qi);
                             k.b.create<memref::StoreOp>(k.loc, v, fn.getArgument(1 + j), dst);
                           });
                         }
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::batchNormKernel(Operation *op,
                                                                   StringRef name) {
  // (x - mean[c]) * scale[c] / sqrt(var[c] + eps) + bias[c], c = dim 1.
  auto x = tensorType(op->getResult(0));
  Type elem = x.getElementType();
  if (x.getRank() < 2 || !(elem.isF32() || elem.isF16() || elem.isBF16()))
    return std::nullopt;
  int64_t c = x.getDimSize(1), plane = x.getNumElements() / std::max<int64_t>(1, x.getDimSize(0) * c);
  for (unsigned i = 1; i < 5; ++i)
    if (tensorType(op->getOperand(i)).getNumElements() != c)
      return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  return elementKernel(name, flatArgs(op), x.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                         Value ch = k.rem(k.div(i, plane), c);
                         auto param = [&](unsigned a) { return k.load(fn.getArgument(a), ch, elem); };
                         OpBuilder &b = k.b;
                         Value inv = b.create<math::RsqrtOp>(
                             k.loc, b.create<arith::AddFOp>(k.loc, param(4),
                                                            k.fconst(b.getF32Type(), eps)));
                         Value xc = b.create<arith::SubFOp>(k.loc, k.load(fn.getArgument(0), i, elem),
                                                            param(3));
                         Value y = b.create<arith::AddFOp>(
                             k.loc, b.create<arith::MulFOp>(
                                        k.loc, b.create<arith::MulFOp>(k.loc, xc, inv), param(1)),
                             param(2));
                         k.store(y, fn.getArgument(5), i, elem);
                       });
}

std::optional<KernelLaunch> KernelGenerator::Impl::batchNormTrainingKernel(Operation *op,
                                                                           StringRef name,
                                                                           bool grad) {
  // One block per channel: batch statistics over (N, spatial) by block
  // reductions (biased variance, as ONNX and the CPU kernel), then the
  // normalized output (training) or the gradients (grad).
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  if (x.getRank() < 2 || !elem.isF32())
    return std::nullopt;
  int64_t n = x.getDimSize(0), c = x.getDimSize(1), plane = 1;
  for (int64_t d = 2; d < x.getRank(); ++d)
    plane *= x.getDimSize(d);
  int64_t count = n * plane;
  if (count == 0 || tensorType(op->getOperand(1)).getNumElements() != c)
    return std::nullopt;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  // Few channels are few blocks: give each the most threads a block can have,
  // so the memory system sees enough loads in flight.
  int64_t block = c < 2 * target.typicalSMs ? std::min<int64_t>(1024, std::max<int64_t>(kWarp, (count + kWarp - 1) / kWarp * kWarp))
                                            : chooseBlockSize(target, count, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value ch = k.bid();
  auto at = [&](Value r) { // element r of channel ch: (n * C + ch) * plane + i
    return k.add(k.mul(k.add(k.mul(k.div(r, plane), k.idx(c)), ch), k.idx(plane)),
                 k.rem(r, plane));
  };
  auto addf = [&](Value a, Value d) -> Value { return b.create<arith::AddFOp>(k.loc, a, d); };
  auto subf = [&](Value a, Value d) -> Value { return b.create<arith::SubFOp>(k.loc, a, d); };
  auto mulf = [&](Value a, Value d) -> Value { return b.create<arith::MulFOp>(k.loc, a, d); };
  Value zero = k.fconst(f32, 0.0), invCount = k.fconst(f32, 1.0 / static_cast<double>(count));
  auto xAt = [&](Value r) { return k.load(fn.getArgument(0), at(r), elem); };
  auto chanSum = [&](function_ref<Value(Value)> term) {
    return k.blockAccumulate(count, block, sh, zero, addf, term);
  };
  auto [mean, var, rstd] = k.moments(count, block, sh, eps, xAt);
  Value scale = k.load(fn.getArgument(1), ch, elem);
  Value first = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, k.tid(), k.idx(0));
  auto forEach = [&](function_ref<void(Value)> body) {
    b.create<scf::ForOp>(k.loc, k.tid(), k.idx(count), k.idx(block), ValueRange{},
                         [&](OpBuilder &nb, Location l, Value r, ValueRange) {
                           OpBuilder::InsertionGuard g(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           body(r);
                           b.create<scf::YieldOp>(l);
                         });
  };
  if (!grad) { // (x, scale, bias, running_mean, running_var) -> (y, new_mean, new_var)
    double momentum = op->getAttrOfType<FloatAttr>("momentum").getValueAsDouble();
    // unbiased_var (PyTorch): the running variance takes count / (count - 1) times the
    // batch's (biased) variance.
    auto unbiased = op->getAttrOfType<BoolAttr>("unbiased_var");
    double correction = unbiased && unbiased.getValue() && count > 1
                            ? static_cast<double>(count) / static_cast<double>(count - 1)
                            : 1.0;
    Value bias = k.load(fn.getArgument(2), ch, elem);
    Value a = mulf(scale, rstd);
    forEach([&](Value r) { k.store(addf(mulf(subf(xAt(r), mean), a), bias), fn.getArgument(5), at(r), elem); });
    k.ifThen(first, [&] {
      Value m = k.fconst(f32, momentum), m1 = k.fconst(f32, 1.0 - momentum);
      Value v1 = k.fconst(f32, correction * (1.0 - momentum));
      Value rm = k.load(fn.getArgument(3), ch, elem), rv = k.load(fn.getArgument(4), ch, elem);
      k.store(addf(mulf(rm, m), mulf(mean, m1)), fn.getArgument(6), ch, elem);
      k.store(addf(mulf(rv, m), mulf(var, v1)), fn.getArgument(7), ch, elem);
    });
  } else { // (x, scale, dy) -> dx?, dscale?, dbias?
    bool wantDx = op->getAttrOfType<BoolAttr>("input_grad").getValue();
    bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
    bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
    auto dyAt = [&](Value r) { return k.load(fn.getArgument(2), at(r), elem); };
    Value sumDy = chanSum(dyAt);
    Value sumDyXhat = chanSum([&](Value r) { return mulf(dyAt(r), mulf(subf(xAt(r), mean), rstd)); });
    unsigned next = 3;
    Value dx = wantDx ? fn.getArgument(next++) : Value();
    Value dscale = wantScale ? fn.getArgument(next++) : Value();
    Value dbias = wantBias ? fn.getArgument(next++) : Value();
    if (wantDx) {
      Value a = mulf(scale, rstd), mdy = mulf(sumDy, invCount), mdyx = mulf(sumDyXhat, invCount);
      forEach([&](Value r) {
        Value xhat = mulf(subf(xAt(r), mean), rstd);
        k.store(mulf(a, subf(subf(dyAt(r), mdy), mulf(xhat, mdyx))), dx, at(r), elem);
      });
    }
    k.ifThen(first, [&] {
      if (wantScale)
        k.store(sumDyXhat, dscale, ch, elem);
      if (wantBias)
        k.store(sumDy, dbias, ch, elem);
    });
  }
  b.create<gpu::ReturnOp>(k.loc);
  return KernelLaunch{name.str(), c, block};
}

namespace {
/// The window geometry of an N-d pool or convolution over NC<spatial>: window
/// o (of the `out` map) along dim d covers image positions
/// o*stride - padBegin + t*dilation, t < kernel.
struct WindowGeometry {
  SmallVector<int64_t> image, out, kernel, strides, padBegin, padEnd, dilations;
  int64_t imageSize = 1, outSize = 1, taps = 1;

  /// From `op`'s strides/pads/dilations (and kernel_shape, or the spatial dims
  /// of `weight`), `x` the image and `y` the map of windows.
  static std::optional<WindowGeometry> of(Operation *op, RankedTensorType x, RankedTensorType y,
                                          RankedTensorType weight = nullptr) {
    auto kernel = op->getAttrOfType<DenseI64ArrayAttr>("kernel_shape");
    auto strides = op->getAttrOfType<DenseI64ArrayAttr>("strides");
    auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
    auto dil = op->getAttrOfType<DenseI64ArrayAttr>("dilations");
    int64_t sp = x.getRank() - 2;
    SmallVector<int64_t> kernelShape;
    if (kernel)
      kernelShape.assign(kernel.asArrayRef().begin(), kernel.asArrayRef().end());
    else if (weight && weight.getRank() == x.getRank())
      kernelShape.assign(weight.getShape().begin() + 2, weight.getShape().end());
    if (sp < 1 || y.getRank() != x.getRank() || static_cast<int64_t>(kernelShape.size()) != sp || !strides ||
        strides.size() != sp || !pads || pads.size() != 2 * sp || !dil || dil.size() != sp ||
        x.getNumElements() == 0 || y.getNumElements() == 0)
      return std::nullopt;
    WindowGeometry g;
    for (int64_t d = 0; d < sp; ++d) {
      g.image.push_back(x.getDimSize(d + 2));
      g.out.push_back(y.getDimSize(d + 2));
      g.kernel.push_back(kernelShape[d]);
      g.strides.push_back(strides[d]);
      g.padBegin.push_back(pads[d]);
      g.padEnd.push_back(pads[d + sp]);
      g.dilations.push_back(dil[d]);
      g.imageSize *= g.image.back();
      g.outSize *= g.out.back();
      g.taps *= kernelShape[d];
    }
    return g;
  }
  int64_t rank() const { return static_cast<int64_t>(image.size()); }

  /// The coordinates of flat index `i` over `dims` (row-major); `outer` gets
  /// the quotient left over (the plane).
  static SmallVector<Value> unravel(Body &k, Value i, ArrayRef<int64_t> dims, Value &outer) {
    SmallVector<Value> c(dims.size());
    for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
      c[d] = k.rem(i, dims[d]);
      i = k.div(i, dims[d]);
    }
    outer = i;
    return c;
  }
  /// Tap t's index along each dim (odometer order, last dim fastest).
  SmallVector<Value> tap(Body &k, Value t) const {
    Value unused;
    return unravel(k, t, kernel, unused);
  }
  static Value inRange(Body &k, Value v, int64_t lo, int64_t hi) {
    Value a = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, v, k.idx(lo));
    Value c = k.b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, v, k.idx(hi));
    return k.b.create<arith::AndIOp>(k.loc, a, c);
  }
  /// Image position of tap `t` of window `o` along each dim (may lie outside).
  SmallVector<Value> position(Body &k, ArrayRef<Value> o, ArrayRef<Value> t) const {
    SmallVector<Value> p;
    for (int64_t d = 0; d < rank(); ++d)
      p.push_back(k.b.create<arith::SubIOp>(
          k.loc, k.add(k.mul(o[d], k.idx(strides[d])), k.mul(t[d], k.idx(dilations[d]))),
          k.idx(padBegin[d])));
    return p;
  }
  /// Whether `p` lies in the image, and its offset in the plane (clamped into
  /// the image, so always safe to load).
  std::pair<Value, Value> imageOffset(Body &k, ArrayRef<Value> p) const {
    Value valid = k.b.create<arith::ConstantIntOp>(k.loc, 1, 1), off = k.idx(0);
    for (int64_t d = 0; d < rank(); ++d) {
      valid = k.b.create<arith::AndIOp>(k.loc, valid, inRange(k, p[d], 0, image[d]));
      Value c = k.b.create<arith::MinSIOp>(
          k.loc, k.b.create<arith::MaxSIOp>(k.loc, p[d], k.idx(0)), k.idx(image[d] - 1));
      off = k.add(k.mul(off, k.idx(image[d])), c);
    }
    return {valid, off};
  }
  /// The window of `out` that has tap `t` on image position `i`, if any: (hit,
  /// window offset in the plane, window coordinates).
  std::tuple<Value, Value, SmallVector<Value>> windowAt(Body &k, ArrayRef<Value> i,
                                                        ArrayRef<Value> t) const {
    OpBuilder &b = k.b;
    Value hit = b.create<arith::ConstantIntOp>(k.loc, 1, 1), off = k.idx(0);
    SmallVector<Value> o;
    for (int64_t d = 0; d < rank(); ++d) {
      // o * stride = i + padBegin - t * dilation, exactly, with 0 <= o < out.
      Value n = b.create<arith::SubIOp>(k.loc, k.add(i[d], k.idx(padBegin[d])),
                                        k.mul(t[d], k.idx(dilations[d])));
      Value nonneg = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::sge, n, k.idx(0));
      Value nc = b.create<arith::MaxSIOp>(k.loc, n, k.idx(0));
      Value exact = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq,
                                            k.rem(nc, strides[d]), k.idx(0));
      Value q = k.div(nc, strides[d]);
      hit = b.create<arith::AndIOp>(
          k.loc, hit,
          b.create<arith::AndIOp>(k.loc, b.create<arith::AndIOp>(k.loc, nonneg, exact),
                                  k.ult(q, k.idx(out[d]))));
      o.push_back(b.create<arith::MinUIOp>(k.loc, q, k.idx(out[d] - 1)));
      off = k.add(k.mul(off, k.idx(out[d])), o.back());
    }
    return {hit, off, o};
  }
};

Value isNaN(Body &k, Value v) {
  return k.b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::UNO, v, v);
}
} // namespace

/// N-d max pooling (NC<spatial>) and its gradient. The window's choice is the
/// CPU kernel's: the first strictly greater in-image tap in odometer order; a
/// NaN wins once seen. Integer inputs (forward only) compare as their sign says.
std::optional<KernelLaunch> KernelGenerator::Impl::maxPoolKernel(Operation *op, StringRef name,
                                                                 bool grad) {
  auto x = tensorType(op->getOperand(0));
  auto y = tensorType(grad ? op->getOperand(1) : op->getResult(0));
  Type elem = x.getElementType();
  auto g = WindowGeometry::of(op, x, y);
  bool fl = isFloat(elem);
  if (!g || elem.isInteger(1) || (grad && !fl))
    return std::nullopt;
  Type ct = computeType(elem);
  bool isUnsigned = elem.isUnsignedInteger();
  auto lowest = [&](Body &k) -> Value {
    if (fl)
      return k.fconst(ct, -INFINITY);
    unsigned w = ct.getIntOrFloatBitWidth();
    return k.b.create<arith::ConstantOp>(
        k.loc, k.b.getIntegerAttr(ct, isUnsigned ? APInt::getMinValue(w)
                                                 : APInt::getSignedMinValue(w)));
  };
  // The chosen tap of window `o` of the plane at `base`: (value, plane offset
  // or -1 if none).
  auto choose = [&](Body &k, Value image, Value base, ArrayRef<Value> o) -> std::pair<Value, Value> {
    OpBuilder &b = k.b;
    SmallVector<Value> chosen = k.foldRange(
        g->taps, ValueRange{lowest(k), k.idx(-1)}, kUnrollTaps,
        [&](Value t, ValueRange acc) -> SmallVector<Value> {
          auto [valid, off] = g->imageOffset(k, g->position(k, o, g->tap(k, t)));
          Value v = k.load(image, k.add(base, off), elem);
          Value best = acc[0];
          Value take;
          if (fl) {
            Value notNan = b.create<arith::XOrIOp>(k.loc, isNaN(k, best),
                                                   b.create<arith::ConstantIntOp>(k.loc, 1, 1));
            Value greater = b.create<arith::CmpFOp>(k.loc, arith::CmpFPredicate::OGT, v, best);
            take = b.create<arith::AndIOp>(k.loc, b.create<arith::AndIOp>(k.loc, valid, notNan),
                                           b.create<arith::OrIOp>(k.loc, isNaN(k, v), greater));
          } else {
            Value greater = b.create<arith::CmpIOp>(
                k.loc, isUnsigned ? arith::CmpIPredicate::ugt : arith::CmpIPredicate::sgt, v, best);
            take = b.create<arith::AndIOp>(k.loc, valid, greater);
          }
          return {b.create<arith::SelectOp>(k.loc, take, v, best),
                  b.create<arith::SelectOp>(k.loc, take, off, acc[1])};
        });
    return {chosen[0], chosen[1]};
  };
  if (!grad)
    return elementKernel(name, flatArgs(op), y.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
                           Value plane;
                           SmallVector<Value> o = WindowGeometry::unravel(k, i, g->out, plane);
                           Value base = k.mul(plane, k.idx(g->imageSize));
                           k.store(choose(k, fn.getArgument(0), base, o).first, fn.getArgument(1),
                                   i, elem);
                         });
  // Gradient, gathered per input element: every window that holds it as a tap
  // adds its gradient when it chose it (deterministic, no atomics).
  return elementKernel(
      name, flatArgs(op), x.getNumElements(), op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        OpBuilder &b = k.b;
        Value plane;
        SmallVector<Value> at = WindowGeometry::unravel(k, i, g->image, plane);
        Value base = k.mul(plane, k.idx(g->imageSize));
        Value self = k.rem(i, g->imageSize);
        Value acc = k.foldValue(g->taps, k.fconst(ct, 0.0), kUnrollTaps, [&](Value t, Value a) {
          auto [hit, woff, o] = g->windowAt(k, at, g->tap(k, t));
          Value chosen = b.create<arith::CmpIOp>(
              k.loc, arith::CmpIPredicate::eq, choose(k, fn.getArgument(0), base, o).second, self);
          Value dy = k.load(fn.getArgument(1), k.add(k.mul(plane, k.idx(g->outSize)), woff), elem);
          Value take = b.create<arith::AndIOp>(k.loc, hit, chosen);
          return b.create<arith::SelectOp>(k.loc, take, b.create<arith::AddFOp>(k.loc, a, dy), a);
        });
        k.store(acc, fn.getArgument(2), i, elem);
      });
}

/// N-d average pooling (NC<spatial>) and its gradient, with the CPU kernels'
/// divisor: the window's taps inside the image, or inside the padded image with
/// count_include_pad (a product over dims, windows being boxes). The gradient
/// gathers, per input element, the shares of the windows holding it.
std::optional<KernelLaunch> KernelGenerator::Impl::avgPoolKernel(Operation *op, StringRef name,
                                                                 bool grad) {
  auto dy = tensorType(op->getOperand(0));
  auto res = tensorType(op->getResult(0));
  auto x = grad ? res : dy;   // the image
  auto y = grad ? dy : res;   // the pooled map
  Type elem = x.getElementType();
  auto include = op->getAttrOfType<BoolAttr>("count_include_pad");
  auto g = WindowGeometry::of(op, x, y);
  if (!g || !isFloat(elem) || !include)
    return std::nullopt;
  Type ct = computeType(elem);
  // 1 / divisor of window `o`.
  auto inverseDivisor = [&](Body &k, ArrayRef<Value> o) {
    OpBuilder &b = k.b;
    Value one = k.fconst(ct, 1.0), zero = k.fconst(ct, 0.0), count = one;
    for (int64_t d = 0; d < g->rank(); ++d) {
      int64_t lo = include.getValue() ? -g->padBegin[d] : 0;
      int64_t hi = include.getValue() ? g->image[d] + g->padEnd[d] : g->image[d];
      Value start = b.create<arith::SubIOp>(k.loc, k.mul(o[d], k.idx(g->strides[d])),
                                            k.idx(g->padBegin[d]));
      Value n = k.foldValue(g->kernel[d], zero, kUnrollTaps, [&](Value t, Value a) {
        Value p = k.add(start, k.mul(t, k.idx(g->dilations[d])));
        return b.create<arith::AddFOp>(
            k.loc, a, b.create<arith::SelectOp>(k.loc, WindowGeometry::inRange(k, p, lo, hi), one, zero));
      });
      count = b.create<arith::MulFOp>(k.loc, count, n);
    }
    return b.create<arith::DivFOp>(k.loc, one, count);
  };
  if (!grad)
    return elementKernel(name, flatArgs(op), y.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
      OpBuilder &b = k.b;
      Value plane;
      SmallVector<Value> o = WindowGeometry::unravel(k, i, g->out, plane);
      Value base = k.mul(plane, k.idx(g->imageSize));
      Value zero = k.fconst(ct, 0.0);
      Value acc = k.foldValue(g->taps, zero, kUnrollTaps, [&](Value t, Value a) {
        auto [valid, off] = g->imageOffset(k, g->position(k, o, g->tap(k, t)));
        Value v = k.load(fn.getArgument(0), k.add(base, off), elem);
        return b.create<arith::AddFOp>(k.loc, a, b.create<arith::SelectOp>(k.loc, valid, v, zero));
      });
      k.store(b.create<arith::MulFOp>(k.loc, acc, inverseDivisor(k, o)), fn.getArgument(1), i, elem);
    });
  return elementKernel(name, flatArgs(op), x.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value plane;
    SmallVector<Value> at = WindowGeometry::unravel(k, i, g->image, plane);
    Value acc = k.foldValue(g->taps, k.fconst(ct, 0.0), kUnrollTaps, [&](Value t, Value a) {
      auto [hit, woff, o] = g->windowAt(k, at, g->tap(k, t));
      Value d = k.load(fn.getArgument(0), k.add(k.mul(plane, k.idx(g->outSize)), woff), elem);
      Value share = b.create<arith::MulFOp>(k.loc, d, inverseDivisor(k, o));
      return b.create<arith::SelectOp>(k.loc, hit, b.create<arith::AddFOp>(k.loc, a, share), a);
    });
    k.store(acc, fn.getArgument(1), i, elem);
  });
}

/// conv, conv_transpose and conv_grad_weight in the forms cuDNN does not take
/// (isLibraryCall): asymmetric pads, other dtypes, more spatial dims. Direct
/// loops, one thread per output element, accumulating in f32 (f64 for f64):
/// the correct path, not the fast one. Layouts as the CPU kernels: NC<spatial>,
/// conv weight [M, C/group, k...], conv_transpose weight [C, M/group, k...].
std::optional<KernelLaunch> KernelGenerator::Impl::convKernel(Operation *op, StringRef name) {
  StringRef opName = op->getName().stripDialect();
  auto x = tensorType(op->getOperand(0));
  auto second = tensorType(op->getOperand(1)); // the weight, or dy of conv_grad_weight
  auto res = tensorType(op->getResult(0));
  Type elem = res.getElementType();
  auto group = op->getAttrOfType<IntegerAttr>("group");
  if (!isFloat(elem) || x.getElementType() != elem || second.getElementType() != elem || !group ||
      group.getInt() < 1 || x.getRank() < 3)
    return std::nullopt;
  int64_t groups = group.getInt();
  bool hasBias = opName != "conv_grad_weight" && op->getNumOperands() > 2 && op->getOperand(2);
  Type accType = computeType(elem);
  int64_t batch = x.getDimSize(0), channels = x.getDimSize(1);
  if (channels % groups)
    return std::nullopt;
  int64_t cg = channels / groups; // input channels per group
  // s + (valid ? a * c : 0), and the result (+ bias[channel]) stored at i.
  auto addProduct = [&](Body &k, Value s, Value valid, Value a, Value c) -> Value {
    Value zero = k.fconst(accType, 0.0);
    Value term = k.b.create<arith::SelectOp>(k.loc, valid, k.b.create<arith::MulFOp>(k.loc, a, c), zero);
    return k.b.create<arith::AddFOp>(k.loc, s, term);
  };
  auto store = [&](Body &k, gpu::GPUFuncOp fn, Value sum, Value channel, Value i) {
    if (hasBias)
      sum = k.b.create<arith::AddFOp>(k.loc, sum, k.load(fn.getArgument(2), channel, elem));
    k.store(sum, fn.getArgument(op->getNumOperands()), i, elem);
  };

  if (isa<ConvOp>(op) || isa<ConvGradWeightOp>(op)) {
    bool grad = isa<ConvGradWeightOp>(op);
    auto y = grad ? second : res;               // the conv output map [N, M, out...]
    auto w = grad ? res : second;               // [M, C/group, k...]
    auto g = WindowGeometry::of(op, x, y, w);
    int64_t maps = y.getDimSize(1);
    if (!g || maps % groups || w.getDimSize(1) != cg)
      return std::nullopt;
    int64_t mg = maps / groups;
    if (!grad)
      return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                           [&](Body &k, gpu::GPUFuncOp fn, Value i) {
        Value rest;
        SmallVector<Value> o = WindowGeometry::unravel(k, i, g->out, rest);
        Value oc = k.rem(rest, maps), n = k.div(rest, maps);
        Value firstChannel = k.mul(k.div(oc, mg), k.idx(cg));
        Value sum = k.loopAcc(k.idx(0), cg * g->taps, k.idx(1), k.fconst(accType, 0.0), [&](Value r, Value s) {
          Value ic = k.div(r, g->taps), t = k.rem(r, g->taps);
          auto [valid, off] = g->imageOffset(k, g->position(k, o, g->tap(k, t)));
          Value plane = k.add(k.mul(n, k.idx(channels)), k.add(firstChannel, ic));
          Value xv = k.load(fn.getArgument(0), k.add(k.mul(plane, k.idx(g->imageSize)), off), elem);
          Value wv = k.load(fn.getArgument(1), k.add(k.mul(k.add(k.mul(oc, k.idx(cg)), ic), k.idx(g->taps)), t), elem);
          return addProduct(k, s, valid, xv, wv);
        });
        store(k, fn, sum, oc, i);
      });
    // dW[oc, ic, t] = sum over n and windows o of dy[n, oc, o] * x[n, group(oc) + ic, p(o, t)].
    return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                         [&](Body &k, gpu::GPUFuncOp fn, Value i) {
      Value t = k.rem(i, g->taps), r = k.div(i, g->taps);
      Value ic = k.rem(r, cg), oc = k.div(r, cg);
      SmallVector<Value> tap = g->tap(k, t);
      Value channel = k.add(k.mul(k.div(oc, mg), k.idx(cg)), ic);
      Value sum = k.loopAcc(k.idx(0), batch * g->outSize, k.idx(1), k.fconst(accType, 0.0), [&](Value j, Value s) {
        Value n;
        SmallVector<Value> o = WindowGeometry::unravel(k, j, g->out, n);
        auto [valid, off] = g->imageOffset(k, g->position(k, o, tap));
        Value xv = k.load(fn.getArgument(0),
                          k.add(k.mul(k.add(k.mul(n, k.idx(channels)), channel), k.idx(g->imageSize)), off), elem);
        Value dy = k.load(fn.getArgument(1),
                          k.add(k.mul(k.add(k.mul(n, k.idx(maps)), oc), k.idx(g->outSize)), k.rem(j, g->outSize)), elem);
        return addProduct(k, s, valid, xv, dy);
      });
      k.store(sum, fn.getArgument(2), i, elem);
    });
  }
  // conv_transpose: the adjoint of a conv whose image is the result and whose
  // window map is x. y[n, g*mg + oc, p] = sum over ic < C/group and taps t whose
  // window i has tap t on p of x[n, g*cg + ic, i] * w[g*cg + ic, oc, t].
  auto w = second;
  auto g = WindowGeometry::of(op, res, x, w);
  if (!g || w.getDimSize(0) != channels)
    return std::nullopt;
  int64_t mg = w.getDimSize(1), maps = res.getDimSize(1);
  if (maps != mg * groups)
    return std::nullopt;
  return elementKernel(name, flatArgs(op), res.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    Value rest;
    SmallVector<Value> p = WindowGeometry::unravel(k, i, g->image, rest);
    Value ocFull = k.rem(rest, maps), n = k.div(rest, maps);
    Value oc = k.rem(ocFull, mg), firstChannel = k.mul(k.div(ocFull, mg), k.idx(cg));
    Value sum = k.loopAcc(k.idx(0), cg * g->taps, k.idx(1), k.fconst(accType, 0.0), [&](Value r, Value s) {
      Value ic = k.add(firstChannel, k.div(r, g->taps)), t = k.rem(r, g->taps);
      auto [hit, woff, unused] = g->windowAt(k, p, g->tap(k, t));
      Value xv = k.load(fn.getArgument(0),
                        k.add(k.mul(k.add(k.mul(n, k.idx(channels)), ic), k.idx(g->outSize)), woff), elem);
      Value wv = k.load(fn.getArgument(1), k.add(k.mul(k.add(k.mul(ic, k.idx(mg)), oc), k.idx(g->taps)), t), elem);
      return addProduct(k, s, hit, xv, wv);
    });
    store(k, fn, sum, ocFull, i);
  });
}

/// group_norm (and its gradient): one block per (sample, group), whose
/// channels are contiguous in NCHW, so a row is cols = C/G * spatial
/// consecutive elements; element j belongs to channel g*C/G + j/spatial. The
/// gradient's dscale/dbias accumulate with f32 atomics into zeroed outputs.
std::optional<KernelLaunch> KernelGenerator::Impl::groupNormKernel(Operation *op, StringRef name,
                                                                   bool grad) {
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  auto groupsAttr = op->getAttrOfType<IntegerAttr>("num_groups");
  if (x.getRank() < 2 || !elem.isF32() || !groupsAttr || x.getNumElements() == 0)
    return std::nullopt;
  int64_t n = x.getDimSize(0), c = x.getDimSize(1), groups = groupsAttr.getInt();
  if (groups <= 0 || c % groups != 0 || tensorType(op->getOperand(1)).getNumElements() != c)
    return std::nullopt;
  int64_t spatial = x.getNumElements() / (n * c), cg = c / groups, cols = cg * spatial;
  double eps = op->getAttrOfType<FloatAttr>("epsilon").getValueAsDouble();
  Type f32 = Float32Type::get(context);
  Type smem = sharedBuffer(kWarp, f32);
  int64_t block = chooseBlockSize(target, cols, 32, kWarp * 4);
  OpBuilder b(context);
  auto fn = newKernel(b, name, flatArgs(op), block, {smem});
  Body k = Body::of(b, op->getLoc(), fn);
  Value sh = fn.getWorkgroupAttributions()[0];
  Value row = k.bid();
  Value base = k.mul(row, k.idx(cols));
  Value firstChannel = k.mul(k.rem(row, groups), k.idx(cg));
  auto channel = [&](Value j) { return k.add(firstChannel, k.div(j, spatial)); };
  auto addf = [&](Value a, Value d) -> Value { return b.create<arith::AddFOp>(k.loc, a, d); };
  auto subf = [&](Value a, Value d) -> Value { return b.create<arith::SubFOp>(k.loc, a, d); };
  auto mulf = [&](Value a, Value d) -> Value { return b.create<arith::MulFOp>(k.loc, a, d); };
  Value zero = k.fconst(f32, 0.0), invCols = k.fconst(f32, 1.0 / static_cast<double>(cols));
  auto xAt = [&](Value j) { return k.load(fn.getArgument(0), k.add(base, j), elem); };
  auto scaleAt = [&](Value j) { return k.load(fn.getArgument(1), channel(j), elem); };
  auto rowSum = [&](function_ref<Value(Value)> term) {
    Value acc = k.loopAcc(k.tid(), cols, k.idx(block), zero,
                          [&](Value j, Value a) { return addf(a, term(j)); });
    return k.blockReduce(acc, block / kWarp, sh, zero, addf);
  };
  auto [mean, var, rstd] = k.moments(cols, block, sh, eps, xAt);
  auto xhat = [&](Value j) { return mulf(subf(xAt(j), mean), rstd); };
  auto forEach = [&](function_ref<void(Value)> body) {
    b.create<scf::ForOp>(k.loc, k.tid(), k.idx(cols), k.idx(block), ValueRange{},
                         [&](OpBuilder &nb, Location l, Value j, ValueRange) {
                           OpBuilder::InsertionGuard g(b);
                           b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
                           body(j);
                           b.create<scf::YieldOp>(l);
                         });
  };
  KernelLaunch launch{name.str(), n * groups, block};
  if (!grad) { // (x, scale, bias) -> y
    forEach([&](Value j) {
      Value y = addf(mulf(xhat(j), scaleAt(j)), k.load(fn.getArgument(2), channel(j), elem));
      k.store(y, fn.getArgument(3), k.add(base, j), elem);
    });
  } else { // (x, scale, dy) -> dx?, dscale?, dbias?
    bool wantDx = op->getAttrOfType<BoolAttr>("input_grad").getValue();
    bool wantScale = op->getAttrOfType<BoolAttr>("scale_grad").getValue();
    bool wantBias = op->getAttrOfType<BoolAttr>("bias_grad").getValue();
    unsigned next = 3;
    Value dx = wantDx ? fn.getArgument(next++) : Value();
    Value dscale = wantScale ? fn.getArgument(next++) : Value();
    Value dbias = wantBias ? fn.getArgument(next++) : Value();
    auto dyAt = [&](Value j) { return k.load(fn.getArgument(2), k.add(base, j), elem); };
    Value m1, m2;
    if (wantDx) {
      m1 = mulf(rowSum([&](Value j) { return mulf(dyAt(j), scaleAt(j)); }), invCols);
      m2 = mulf(rowSum([&](Value j) { return mulf(mulf(dyAt(j), scaleAt(j)), xhat(j)); }), invCols);
    }
    forEach([&](Value j) {
      Value g0 = dyAt(j), xh = xhat(j);
      if (wantDx)
        k.store(mulf(rstd, subf(subf(mulf(g0, scaleAt(j)), m1), mulf(xh, m2))), dx,
                k.add(base, j), elem);
      if (wantScale)
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, mulf(g0, xh), dscale,
                                      ValueRange{channel(j)});
      if (wantBias)
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g0, dbias,
                                      ValueRange{channel(j)});
    });
    launch.zeroOutputs = wantScale || wantBias;
  }
  b.create<gpu::ReturnOp>(k.loc);
  return launch;
}

/// slice_grad (a strided store into zeros) and pad_grad (every grad_output
/// element adds into the input element its forward pad copied; f32 atomics),
/// one thread per grad_output element.
std::optional<KernelLaunch> KernelGenerator::Impl::scatterGradKernel(Operation *op,
                                                                     StringRef name) {
  auto dy = tensorType(op->getOperand(0)), dx = tensorType(op->getResult(0));
  int64_t rank = dy.getRank();
  bool pad = isa<PadGradOp>(op);
  if (rank == 0 || dy.getNumElements() == 0 || dx.getNumElements() == 0 ||
      (pad && !dx.getElementType().isF32()))
    return std::nullopt;
  SmallVector<int64_t> dxStrides = contiguousStrides(dx.getShape());
  ArrayRef<int64_t> shape = dy.getShape();
  KernelLaunch l = elementKernel(name, flatArgs(op), dy.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value rest = i, at = k.idx(0);
    Value valid = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    for (int64_t d = rank - 1; d >= 0; --d) {
      Value id = d == 0 ? rest : k.rem(rest, shape[d]);
      if (d > 0)
        rest = k.div(rest, shape[d]);
      Value src;
      if (pad) {
        auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
        Value s = b.create<arith::SubIOp>(k.loc, id, k.idx(pads[d]));
        src = padSource(k, s, dx.getDimSize(d), op->getAttrOfType<StringAttr>("mode").getValue(),
                        valid);
      } else {
        auto starts = op->getAttrOfType<DenseI64ArrayAttr>("starts");
        auto steps = op->getAttrOfType<DenseI64ArrayAttr>("steps");
        src = k.add(k.idx(starts[d]), k.mul(id, k.idx(steps[d])));
      }
      at = k.add(at, k.mul(src, k.idx(dxStrides[d])));
    }
    Value g = b.create<memref::LoadOp>(k.loc, fn.getArgument(0), i);
    if (pad)
      k.ifThen(valid, [&] {
        b.create<memref::AtomicRMWOp>(k.loc, arith::AtomicRMWKind::addf, g, fn.getArgument(1),
                                      ValueRange{at});
      });
    else
      b.create<memref::StoreOp>(k.loc, g, fn.getArgument(1), at);
  });
  l.zeroOutputs = true;
  return l;
}

/// The fill value `value` (an f64 attribute) in `elem`'s storage, converted as
/// the CPU's scalarBytes does: bool is value != 0, integers saturate (NaN gives
/// 0, fractions truncate toward zero), floats round to nearest.
static Value fillConstant(Body &k, Type elem, Type storage, double value) {
  if (auto ft = dyn_cast<FloatType>(storage))
    return k.fconst(ft, value);
  if (elem.isInteger(1))
    return intConst(k, storage, value != 0.0);
  unsigned w = storage.getIntOrFloatBitWidth();
  APInt bits(w, 0);
  if (!std::isnan(value)) {
    if (isUnsignedInt(elem)) {
      double hi = std::ldexp(1.0, static_cast<int>(w));
      bits = value <= 0 ? APInt::getMinValue(w)
             : value >= hi ? APInt::getMaxValue(w)
                           : APInt(w, static_cast<uint64_t>(value));
    } else {
      double lim = std::ldexp(1.0, static_cast<int>(w) - 1);
      bits = value <= -lim ? APInt::getSignedMinValue(w)
             : value >= lim ? APInt::getSignedMaxValue(w)
                            : APInt(w, static_cast<uint64_t>(static_cast<int64_t>(value)), true);
    }
  }
  return k.b.create<arith::ConstantOp>(k.loc, k.b.getIntegerAttr(storage, bits));
}

/// The offset in `data` of element i of a gather_elements/scatter_elements
/// index tensor of `shape`: i's coordinates with dim `axis` replaced by the
/// index stored at i (checked and clamped, loadIndex).
static Value elementsTarget(Body &k, Value indices, Value i, ArrayRef<int64_t> shape, int64_t axis,
                            RankedTensorType data) {
  SmallVector<int64_t> dataStrides = contiguousStrides(data.getShape());
  Value rest = i, at = k.idx(0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    Value id = d == 0 ? rest : k.rem(rest, shape[d]);
    if (d > 0)
      rest = k.div(rest, shape[d]);
    if (d == axis)
      id = loadIndex(k, indices, i, data.getDimSize(axis));
    at = k.add(at, k.mul(id, k.idx(dataStrides[d])));
  }
  return at;
}

/// gather_elements: out[i] = data[i with dim `axis` replaced by indices[i]];
/// its gradient scatter-adds (f32 atomics into zeroed outputs).
std::optional<KernelLaunch> KernelGenerator::Impl::gatherElementsKernel(Operation *op,
                                                                        StringRef name,
                                                                        bool grad) {
  auto idxType = tensorType(op->getOperand(1));
  auto data = tensorType(grad ? op->getResult(0) : op->getOperand(0));
  int64_t rank = idxType.getRank();
  int64_t axis = normalizedAxis(op, rank);
  if (rank == 0 || data.getRank() != rank || axis < 0 || axis >= rank ||
      idxType.getNumElements() == 0 || data.getNumElements() == 0 ||
      (grad && !data.getElementType().isF32()))
    return std::nullopt;
  ArrayRef<int64_t> shape = idxType.getShape();
  KernelLaunch l = elementKernel(name, flatArgs(op), idxType.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    Value at = elementsTarget(k, fn.getArgument(1), i, shape, axis, data);
    gatherOrScatter(k, fn, i, at, grad);
  });
  l.zeroOutputs = grad;
  return l;
}

/// scatter_elements: the output starts as a copy of the input (the runtime
/// copies it before the launch, KernelLaunch::copyInput), then one thread per
/// update writes it (none) or combines it atomically (add: atomic add for f32,
/// f64 and integers; mul, max, min: compare-and-swap loops), at the position of
/// the update with dim `axis` replaced by its index. f16/bf16 reductions have
/// no kernel (the host runs them).
std::optional<KernelLaunch> KernelGenerator::Impl::scatterElementsKernel(Operation *op,
                                                                        StringRef name) {
  auto data = tensorType(op->getOperand(0)), idxType = tensorType(op->getOperand(1));
  StringRef reduction = op->getAttrOfType<StringAttr>("reduction").getValue();
  Type elem = data.getElementType();
  int64_t rank = idxType.getRank();
  int64_t axis = normalizedAxis(op, rank);
  if (rank == 0 || axis < 0 || axis >= rank || idxType.getNumElements() == 0 ||
      data.getNumElements() == 0)
    return std::nullopt;
  bool fl = isFloat(elem);
  if (reduction != "none" &&
      (elem.isInteger(1) || (fl && !elem.isF32() && !elem.isF64()) || isFloat8(elem)))
    return std::nullopt;
  ArrayRef<int64_t> shape = idxType.getShape();
  bool isUnsigned = isUnsignedInt(elem);
  // A compare-and-swap loop swaps integers (LLVM's cmpxchg takes no floats):
  // float mul/max/min see the data and updates as same-width integers and
  // bitcast around the arithmetic.
  bool viaBits = fl && reduction != "none" && reduction != "add";
  Type bitsType = fl ? Type(IntegerType::get(context, elem.getIntOrFloatBitWidth())) : Type();
  SmallVector<Type> args = flatArgs(op);
  if (viaBits)
    for (unsigned a : {0u, 2u, 3u})
      args[a] = flatMemref(bitsType, a == 2 ? idxType.getNumElements() : data.getNumElements());
  KernelLaunch l = elementKernel(name, args, idxType.getNumElements(), op->getLoc(),
                                 [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Value at = elementsTarget(k, fn.getArgument(1), i, shape, axis, data);
    Value out = fn.getArgument(3);
    Value u = b.create<memref::LoadOp>(k.loc, fn.getArgument(2), i); // storage type
    if (reduction == "none") {
      b.create<memref::StoreOp>(k.loc, u, out, at);
      return;
    }
    if (reduction == "add") {
      b.create<memref::AtomicRMWOp>(k.loc, fl ? arith::AtomicRMWKind::addf
                                              : arith::AtomicRMWKind::addi,
                                    u, out, ValueRange{at});
      return;
    }
    auto atomic = b.create<memref::GenericAtomicRMWOp>(k.loc, out, ValueRange{at});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(atomic.getBody());
    Value cur = atomic.getCurrentValue(), next;
    if (viaBits) {
      cur = b.create<arith::BitcastOp>(k.loc, elem, cur);
      u = b.create<arith::BitcastOp>(k.loc, elem, u);
    }
    if (reduction == "mul")
      next = fl ? Value(b.create<arith::MulFOp>(k.loc, cur, u))
                : Value(b.create<arith::MulIOp>(k.loc, cur, u));
    else if (fl) // max/min as the CPU: the update replaces only when strictly beyond
      next = b.create<arith::SelectOp>(
          k.loc,
          b.create<arith::CmpFOp>(k.loc, reduction == "max" ? arith::CmpFPredicate::OGT
                                                            : arith::CmpFPredicate::OLT,
                                  u, cur),
          u, cur);
    else
      next = reduction == "max"
                 ? (isUnsigned ? Value(b.create<arith::MaxUIOp>(k.loc, cur, u))
                               : Value(b.create<arith::MaxSIOp>(k.loc, cur, u)))
                 : (isUnsigned ? Value(b.create<arith::MinUIOp>(k.loc, cur, u))
                               : Value(b.create<arith::MinSIOp>(k.loc, cur, u)));
    if (viaBits)
      next = b.create<arith::BitcastOp>(k.loc, bitsType, next);
    b.create<memref::AtomicYieldOp>(k.loc, next);
  });
  l.copyInput = true;
  return l;
}

/// one_hot: one thread per output element [outer, depth, inner]: `on` where the
/// element's class equals its index (converted to int64 as the CPU does: floats
/// truncate and saturate, NaN is 0; negative counts from depth's end; out of
/// range matches nothing), else `off`; on/off converted as the CPU's scalarBytes.
std::optional<KernelLaunch> KernelGenerator::Impl::oneHotKernel(Operation *op, StringRef name) {
  auto idx = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  Type idxElem = idx.getElementType(), elem = out.getElementType();
  int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
  int64_t depth = op->getAttrOfType<IntegerAttr>("depth").getInt();
  if (out.getNumElements() == 0 || idxElem.isInteger(1) || isFloat8(idxElem) || isFloat8(elem))
    return std::nullopt;
  auto [outer, d, inner] = aroundAxis(out.getShape(), axis);
  if (d != depth)
    return std::nullopt;
  double on = op->getAttrOfType<FloatAttr>("on_value").getValueAsDouble();
  double off = op->getAttrOfType<FloatAttr>("off_value").getValueAsDouble();
  Type storage = storageType(elem);
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    Type i64 = b.getI64Type();
    Value in = k.rem(i, inner), c = k.rem(k.div(i, inner), depth), o = k.div(i, inner * depth);
    Value v = k.load(fn.getArgument(0), k.add(k.mul(o, k.idx(inner)), in), idxElem);
    if (isFloat(v.getType()))
      v = floatToInt(k, v, i64, false);
    else if (v.getType().getIntOrFloatBitWidth() < 64)
      v = isUnsignedInt(idxElem) ? Value(b.create<arith::ExtUIOp>(k.loc, i64, v))
                                 : Value(b.create<arith::ExtSIOp>(k.loc, i64, v));
    Value negative = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::slt, v, intConst(k, i64, 0));
    v = b.create<arith::SelectOp>(k.loc, negative,
                                  b.create<arith::AddIOp>(k.loc, v, intConst(k, i64, depth)), v);
    Value hit = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::eq, v,
                                        b.create<arith::IndexCastOp>(k.loc, i64, c));
    Value r = b.create<arith::SelectOp>(k.loc, hit, fillConstant(k, elem, storage, on),
                                        fillConstant(k, elem, storage, off));
    b.create<memref::StoreOp>(k.loc, r, fn.getArgument(1), i);
  });
}

/// cumsum along `axis` (exclusive / reverse): one thread per line, serial in
/// the line's order, accumulated in f32 (f64 for f64).
std::optional<KernelLaunch> KernelGenerator::Impl::cumsumKernel(Operation *op, StringRef name) {
  auto x = tensorType(op->getOperand(0));
  Type elem = x.getElementType();
  if (x.getRank() == 0 || x.getNumElements() == 0 ||
      !(elem.isF32() || elem.isF16() || elem.isBF16() || elem.isF64()))
    return std::nullopt;
  int64_t axis = normalizedAxis(op, x.getRank());
  auto [p, n, q] = aroundAxis(x.getShape(), axis);
  bool exclusive = op->getAttrOfType<BoolAttr>("exclusive").getValue();
  bool reverse = op->getAttrOfType<BoolAttr>("reverse").getValue();
  Type acc = computeType(elem);
  return elementKernel(name, flatArgs(op), p * q, op->getLoc(), [&](Body &k, gpu::GPUFuncOp fn, Value line) {
    OpBuilder &b = k.b;
    Value base = k.add(k.mul(k.div(line, q), k.idx(n * q)), k.rem(line, q));
    k.loopAcc(k.idx(0), n, k.idx(1), k.fconst(acc, 0.0), [&](Value j, Value s) {
      Value pos = reverse ? Value(b.create<arith::SubIOp>(k.loc, k.idx(n - 1), j)) : j;
      Value at = k.add(base, k.mul(pos, k.idx(q)));
      Value next = b.create<arith::AddFOp>(k.loc, s, k.load(fn.getArgument(0), at, elem));
      k.store(exclusive ? s : next, fn.getArgument(1), at, elem);
      return next;
    });
  });
}

/// pad, tile and trilu: one thread per output element, its source position
/// computed per dimension (the CPU kernels' padSourceIndex / modulo / triangle
/// test), no coalescing (the per-dimension maps are not affine).
std::optional<KernelLaunch> KernelGenerator::Impl::remapKernel(Operation *op, StringRef name) {
  StringRef opName = op->getName().stripDialect();
  auto in = tensorType(op->getOperand(0)), out = tensorType(op->getResult(0));
  Type elem = in.getElementType();
  int64_t rank = in.getRank();
  if (out.getNumElements() == 0 || in.getNumElements() == 0 || rank == 0)
    return std::nullopt;
  SmallVector<int64_t> inStrides = contiguousStrides(in.getShape());
  ArrayRef<int64_t> inShape = in.getShape(), outShape = out.getShape();
  Type storage = storageType(elem);
  return elementKernel(name, flatArgs(op), out.getNumElements(), op->getLoc(),
                       [&](Body &k, gpu::GPUFuncOp fn, Value i) {
    OpBuilder &b = k.b;
    SmallVector<Value> o(rank);
    Value rest = i;
    for (int64_t d = rank - 1; d >= 0; --d) {
      o[d] = d == 0 ? rest : k.rem(rest, outShape[d]);
      if (d > 0)
        rest = k.div(rest, outShape[d]);
    }
    Value valid = b.create<arith::ConstantIntOp>(k.loc, 1, 1);
    Value src = k.idx(0);
    if (isa<PadOp>(op)) {
      auto pads = op->getAttrOfType<DenseI64ArrayAttr>("pads");
      StringRef mode = op->getAttrOfType<StringAttr>("mode").getValue();
      for (int64_t d = 0; d < rank; ++d) {
        Value s = b.create<arith::SubIOp>(k.loc, o[d], k.idx(pads[d]));
        src = k.add(src, k.mul(padSource(k, s, inShape[d], mode, valid), k.idx(inStrides[d])));
      }
    } else if (isa<TileOp>(op)) {
      for (int64_t d = 0; d < rank; ++d)
        src = k.add(src, k.mul(k.rem(o[d], inShape[d]), k.idx(inStrides[d])));
    } else { // trilu over the last two dims: keep c - r >= k (upper) or <= k (lower)
      src = i;
      bool upper = op->getAttrOfType<BoolAttr>("upper").getValue();
      int64_t kk = op->getAttrOfType<IntegerAttr>("k").getInt();
      Value diff = b.create<arith::SubIOp>(k.loc, o[rank - 1], o[rank - 2]);
      valid = b.create<arith::CmpIOp>(
          k.loc, upper ? arith::CmpIPredicate::sge : arith::CmpIPredicate::sle, diff, k.idx(kk));
    }
    Value v = b.create<memref::LoadOp>(k.loc, fn.getArgument(0), src);
    if (opName != "tile") {
      double value = isa<PadOp>(op) ? op->getAttrOfType<FloatAttr>("value").getValueAsDouble() : 0.0;
      v = b.create<arith::SelectOp>(k.loc, valid, v, fillConstant(k, elem, storage, value));
    }
    b.create<memref::StoreOp>(k.loc, v, fn.getArgument(1), i);
  });
}

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

/// What a kernel of `op` checks its data for (empty: nothing): the CPU
/// kernels report these as errors, so the GPU ones do too (Body::fault).
std::string faultOf(Operation *op) {
  StringRef name = op->getName().stripDialect();
  if (llvm::is_contained({"gather", "gather_grad", "gather_elements", "gather_elements_grad",
                          "scatter_elements"},
                         name))
    return "an index is outside [-size, size) of its axis";
  if (isa<NllLossOp>(op))
    return "a target class is outside [0, classes) and not the ignore_index";
  if (isa<CrossEntropyOp>(op))
    return "a target class is outside [0, classes)";
  if (isa<DivOp>(op) && isa<IntegerType>(tensorType(op->getResult(0)).getElementType()))
    return "integer division by zero";
  if (isa<ModOp>(op) && isa<IntegerType>(tensorType(op->getResult(0)).getElementType()))
    return "integer modulo by zero";
  return "";
}

std::optional<KernelLaunch> KernelGenerator::Impl::generate(Operation *op, StringRef name) {
  fault = op->getNumResults() >= 1 && tensorType(op->getResult(0)) ? faultOf(op) : "";
  if (auto fusion = dyn_cast<FusionOp>(op)) {
    fault.clear(); // set from the body's ops
    for (Value v : fusion.getBlock().getArguments())
      if (!tensorType(v) || !supportedElement(tensorType(v).getElementType()))
        return std::nullopt;
    bool supported = true;
    fusion.getBlock().walk([&](Operation *inner) {
      for (Value v : inner->getResults())
        supported &= tensorType(v) && supportedElement(tensorType(v).getElementType());
    });
    if (!supported)
      return std::nullopt;
    if (fusion.getKind() == "loop")
      return loopFusionKernel(fusion, name);
    if (fusion.getKind() == "horizontal")
      return horizontalFusionKernel(fusion, name);
    return std::nullopt;
  }
  for (Value v : op->getOperands())
    if (!tensorType(v) || !tensorType(v).hasStaticShape() ||
        !supportedElement(tensorType(v).getElementType()))
      return std::nullopt;
  for (Value v : op->getResults())
    if (!tensorType(v) || !tensorType(v).hasStaticShape() ||
        !supportedElement(tensorType(v).getElementType()))
      return std::nullopt;
  auto float8 = [](Value v) { return isFloat8(tensorType(v).getElementType()); };
  if (!isa<CastOp>(op) && (llvm::any_of(op->getOperands(), float8) ||
                           llvm::any_of(op->getResults(), float8)))
    return std::nullopt; // float8 values are only made and read by casts
  // Ops with several results first; every other generator makes one result.
  if (isa<SplitOp>(op))
    return splitKernel(op, name);
  if (isa<LayerNormGradOp>(op))
    return layerNormGradKernel(op, name);
  if (isa<GroupNormGradOp>(op))
    return groupNormKernel(op, name, true);
  if (isa<BatchNormTrainingOp, BatchNormTrainingGradOp>(op))
    return batchNormTrainingKernel(op, name, isa<BatchNormTrainingGradOp>(op));
  if (isa<TopKOp>(op))
    return topKKernel(op, name);
  if (isa<CrossEntropyOp, CrossEntropyGradOp>(op))
    return crossEntropyKernel(op, name, isa<CrossEntropyGradOp>(op));
  if (op->getNumResults() != 1)
    return std::nullopt;
  auto outShape = tensorType(op->getResult(0)).getShape();
  if (isa<DropoutMaskOp>(op))
    return dropoutMaskKernel(op, name);
  if (isa<GatherOp, GatherGradOp>(op))
    return gatherKernel(op, name, isa<GatherGradOp>(op));
  if (isa<NllLossOp>(op))
    return nllLossKernel(op, name);
  if (isa<NllLossGradOp>(op))
    return nllLossGradKernel(op, name);
  if (isa<ArgMaxOp>(op))
    return argmaxKernel(op, name);
  if (isa<LayerNormOp>(op))
    return layerNormKernel(op, name);
  if (isa<ConcatOp>(op))
    return concatKernel(op, name);
  if (isa<BatchNormOp>(op))
    return batchNormKernel(op, name);
  if (isa<PadOp, TileOp, TriluOp>(op))
    return remapKernel(op, name);
  if (isa<AvgPoolOp, AvgPoolGradOp>(op))
    return avgPoolKernel(op, name, isa<AvgPoolGradOp>(op));
  if (isa<GatherElementsOp, GatherElementsGradOp>(op))
    return gatherElementsKernel(op, name, isa<GatherElementsGradOp>(op));
  if (isa<ScatterElementsOp>(op))
    return scatterElementsKernel(op, name);
  if (isa<OneHotOp>(op))
    return oneHotKernel(op, name);
  if (isa<CumSumOp>(op))
    return cumsumKernel(op, name);
  if (isa<SliceGradOp, PadGradOp>(op))
    return scatterGradKernel(op, name);
  if (isa<GroupNormOp>(op))
    return groupNormKernel(op, name, false);
  if (isa<MatMulOp, GemmOp>(op))
    return matmulKernel(op, name);
  if (isa<ConvOp, ConvTransposeOp, ConvGradWeightOp>(op))
    return convKernel(op, name);
  if (isa<MaxPoolOp, MaxPoolGradOp>(op))
    return maxPoolKernel(op, name, isa<MaxPoolGradOp>(op));
  if (reduceKind(op)) // the reduce_* ops
    return reduceKernel(op, name);
  if (isa<SoftmaxOp, LogSoftmaxOp, SoftmaxGradOp, LogSoftmaxGradOp>(op))
    return rowKernel(op, name);

  SmallVector<OperandMap> maps;
  if (auto transpose = dyn_cast<TransposeOp>(op)) {
    SmallVector<int64_t> inStrides = contiguousStrides(tensorType(transpose.getInput()).getShape());
    OperandMap m;
    for (int64_t p : transpose.getPerm())
      m.strides.push_back(inStrides[p]);
    maps.push_back(m);
    return mapKernel(op, name, maps);
  }
  if (auto broadcast = dyn_cast<BroadcastOp>(op)) {
    maps.push_back({broadcastStrides(tensorType(broadcast.getInput()).getShape(), outShape)});
    return mapKernel(op, name, maps);
  }
  if (auto slice = dyn_cast<SliceOp>(op)) { // element i of dim d is input element starts[d] + i * steps[d]
    ArrayRef<int64_t> starts = slice.getStarts(), steps = slice.getSteps();
    auto inShape = tensorType(slice.getInput()).getShape();
    if (starts.size() != inShape.size() || steps.size() != inShape.size())
      return std::nullopt;
    SmallVector<int64_t> inStrides = contiguousStrides(inShape);
    OperandMap m;
    for (size_t d = 0; d < inShape.size(); ++d) {
      m.strides.push_back(steps[d] * inStrides[d]);
      m.offset += starts[d] * inStrides[d];
    }
    maps.push_back(m);
    return mapKernel(op, name, maps);
  }
  auto iface = dyn_cast<ForgeOpInterface>(op);
  if (!iface || iface.getFusionClass() != FusionClass::Elementwise)
    return std::nullopt;
  for (Value v : op->getOperands())
    maps.push_back({broadcastStrides(tensorType(v).getShape(), outShape)});
  return mapKernel(op, name, maps);
}

KernelGenerator::KernelGenerator(MLIRContext *context, CudaTarget target)
    : impl(std::make_unique<Impl>(context, std::move(target))) {}
KernelGenerator::~KernelGenerator() = default;

size_t KernelGenerator::numKernels() const { return impl->names.size(); }

std::optional<KernelLaunch> KernelGenerator::kernelFor(Operation *op) {
  if (isLibraryCall(op) || isCopyOp(op->getName().stripDialect()))
    return std::nullopt;
  // Ops with equal name, attributes and types share one kernel; fusion
  // regions with equal text (their bodies printed in a local scope, without
  // locations).
  std::string key;
  if (isa<FusionOp>(op)) {
    llvm::raw_string_ostream os(key);
    op->print(os, OpPrintingFlags().useLocalScope().printGenericOpForm());
  } else {
    llvm::raw_string_ostream os(key);
    os << op->getName() << op->getAttrDictionary() << "(";
    for (Type t : op->getOperandTypes())
      os << t << ",";
    os << ")->(";
    for (Type t : op->getResultTypes())
      os << t << ",";
    os << ")";
  }
  auto it = impl->cache.find(key);
  if (it != impl->cache.end())
    return it->second;
  std::string name = "k" + std::to_string(impl->names.size()) + "_" +
                     op->getName().stripDialect().str();
  std::optional<KernelLaunch> launch = impl->generate(op, name);
  if (launch) {
    launch->fault = impl->fault;
    impl->names.push_back(name);
  }
  impl->cache[key] = launch;
  return launch;
}

namespace {
/// Lowers a module holding one gpu.module (gpu.container_module) to PTX.
FailureOr<std::string> lowerModule(ModuleOp module, const CudaTarget &target) {
  MLIRContext *ctx = module.getContext();
  std::string toolkit;
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *p = std::getenv(env); p && *p && !toolkit.size())
      toolkit = p;
  if (toolkit.empty())
    toolkit = "/usr/local/cuda";
  SmallString<256> libdevice(toolkit);
  llvm::sys::path::append(libdevice, "nvvm", "libdevice", "libdevice.10.bc");
  if (!llvm::sys::fs::exists(libdevice))
    return module.emitError() << "the CUDA target needs libdevice (" << libdevice
                              << " does not exist): set CUDA_HOME to the CUDA toolkit";

  PassManager pm(ctx);
  GpuNVVMAttachTargetOptions attach;
  attach.chip = target.chip;
  attach.features = "+ptx78";
  attach.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(attach));
  OpPassManager &gpm = pm.nest<gpu::GPUModuleOp>();
  gpm.addPass(createConvertSCFToCFPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.useBarePtrCallConv = true;
  nvvm.indexBitwidth = 32; // tensors fit 2^31 elements (checked by the emitter)
  gpm.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  gpm.addPass(createConvertVectorToLLVMPass());
  gpm.addPass(createCanonicalizerPass());
  gpm.addPass(createCSEPass());
  gpm.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.toolkitPath = toolkit;
  binary.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(binary));
  if (failed(pm.run(module)))
    return failure();
  for (auto bin : module.getOps<gpu::BinaryOp>())
    for (Attribute a : bin.getObjects()) {
      std::string ptx = cast<gpu::ObjectAttr>(a).getObject().str();
      // The PTX string inside gpu.binary ends with a NUL byte (DESIGN.md §5).
      while (!ptx.empty() && ptx.back() == '\0')
        ptx.pop_back();
      return ptx;
    }
  return module.emitError("GPU lowering produced no binary");
}
} // namespace

FailureOr<std::string> KernelGenerator::lowerToPtx() {
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>(impl->module->getOperation()->clone());
  return lowerModule(*copy, impl->target);
}

LogicalResult KernelGenerator::dumpKernels(llvm::StringRef dir) {
  SmallString<256> kernels(dir);
  llvm::sys::path::append(kernels, "kernels");
  if (std::error_code ec = llvm::sys::fs::create_directories(kernels))
    return impl->module->emitError() << "cannot create " << kernels << ": " << ec.message();
  for (const std::string &name : impl->names) {
    auto fn = impl->gpuModule.lookupSymbol<gpu::GPUFuncOp>(name);
    OpBuilder b(impl->context);
    OwningOpRef<ModuleOp> single = ModuleOp::create(fn.getLoc());
    single->getOperation()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
    b.setInsertionPointToEnd(single->getBody());
    auto gm = b.create<gpu::GPUModuleOp>(fn.getLoc(), name);
    b.setInsertionPointToStart(gm.getBody());
    b.clone(*fn);
    auto write = [&](StringRef ext, function_ref<void(llvm::raw_ostream &)> body) -> LogicalResult {
      SmallString<256> path(kernels);
      llvm::sys::path::append(path, name + ext.str());
      std::error_code ec;
      llvm::raw_fd_ostream os(path, ec);
      if (ec)
        return impl->module->emitError() << "cannot write " << path << ": " << ec.message();
      body(os);
      return success();
    };
    if (failed(write(".mlir", [&](llvm::raw_ostream &os) { single->print(os); })))
      return failure();
    FailureOr<std::string> ptx = lowerModule(*single, impl->target);
    if (failed(ptx) || failed(write(".ptx", [&](llvm::raw_ostream &os) { os << *ptx; })))
      return failure();
  }
  return success();
}

FailureOr<std::optional<std::string>> mlir::forge::assemblePtx(llvm::StringRef ptx,
                                                               llvm::StringRef chip,
                                                               std::string &error) {
  SmallVector<StringRef> paths;
  std::string cudaHome;
  if (const char *p = std::getenv("CUDA_HOME"); p && *p)
    cudaHome = std::string(p) + "/bin";
  auto found = llvm::sys::findProgramByName("ptxas");
  if (!found && !cudaHome.empty())
    found = llvm::sys::findProgramByName("ptxas", {cudaHome});
  if (!found)
    found = llvm::sys::findProgramByName("ptxas", {"/usr/local/cuda/bin"});
  if (!found)
    return std::optional<std::string>();

  SmallString<128> in, out, log;
  int fd;
  if (llvm::sys::fs::createTemporaryFile("forge-kernels", "ptx", fd, in) ||
      llvm::sys::fs::createTemporaryFile("forge-kernels", "cubin", out) ||
      llvm::sys::fs::createTemporaryFile("forge-ptxas", "log", log)) {
    error = "cannot create temporary files for ptxas";
    return failure();
  }
  auto cleanup = llvm::make_scope_exit([&] {
    llvm::sys::fs::remove(in);
    llvm::sys::fs::remove(out);
    llvm::sys::fs::remove(log);
  });
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    os << ptx;
  }
  std::string arch = "-arch=" + chip.str();
  SmallVector<StringRef> args = {*found, arch, "-O3", in, "-o", out};
  std::optional<StringRef> redirects[] = {std::nullopt, StringRef(log), StringRef(log)};
  int rc = llvm::sys::ExecuteAndWait(*found, args, std::nullopt, redirects);
  if (rc != 0) {
    auto text = llvm::MemoryBuffer::getFile(log);
    error = "ptxas " + arch + " failed (exit " + std::to_string(rc) + ")" +
            (text ? ": " + (*text)->getBuffer().str() : std::string());
    return failure();
  }
  auto cubin = llvm::MemoryBuffer::getFile(out, /*IsText=*/false);
  if (!cubin) {
    error = "cannot read ptxas output " + out.str().str();
    return failure();
  }
  return std::optional<std::string>((*cubin)->getBuffer().str());
}
