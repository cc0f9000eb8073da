//===- KernelGenInternal.h - shared by the kernel generators ----------------*- C++ -*-===//
//
// Private to compiler/lib/Codegen. The generator's state
// (KernelGenerator::Impl), the kernel-body builder (Body), type and layout
// helpers and the scalar emitters, shared by one file per kernel family:
//  * KernelGen.cpp      dispatch (Impl::generate), the public API, lowering to PTX;
//  * Scalar.cpp         one element of an elementwise op (emitScalar);
//  * Pointwise.cpp      map kernels, loop and horizontal fusion regions, dropout masks;
//  * Reduction.cpp      reduce_*, softmax-family rows, argmax, top_k, cumsum;
//  * Normalization.cpp  layer/batch/group norm, forward and backward;
//  * Loss.cpp           nll_loss and cross_entropy, forward and backward;
//  * Indexing.cpp       gather/scatter, concat/split, pad/tile/trilu, one_hot;
//  * Window.cpp         pools and the direct convolution;
//  * Matmul.cpp         matmul/gemm in the forms cuBLASLt does not take.
// Arithmetic runs in f32 for f16/bf16/float8 (converted on load/store);
// booleans are one byte in memory and i1 in registers.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_CODEGEN_KERNELGENINTERNAL_H
#define FORGE_CODEGEN_KERNELGENINTERNAL_H

#include "forge/Codegen/KernelGen.h"
#include "forge/Dialect/ForgeDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

namespace mlir::forge::kernelgen {

inline constexpr int64_t kWarp = 32;
inline constexpr int64_t kVector = 4;
inline constexpr int64_t kMaxGrid = int64_t(1) << 20; // grid-stride loops cover the rest
inline constexpr int64_t kUnrollTaps = 16; // pooling windows up to this many taps are unrolled
inline constexpr int64_t kStagedPoolBlock = 256;       // a channels-first max pool's staged block
inline constexpr int64_t kStagedPoolBytes = 24 * 1024; // ... and its shared input rows, at most
inline constexpr int64_t kRowCache = 8; // row kernels keep up to this many columns per thread in registers

/// Block size with the highest occupancy the target allows (ties: the smaller
/// block), for an assumed register count per thread and shared memory per
/// block, then no larger than the work rounded up to a warp.
inline int64_t chooseBlockSize(const CudaTarget &t, int64_t work, int64_t regsPerThread = 32,
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

inline bool isFloat(Type t) { return isa<FloatType>(t); }
/// On the kernels' gpu.module: the chip converts f32 to float8 in hardware
/// (sm_89+, PTX cvt.rn.satfinite.e4m3x2.f32).
inline constexpr llvm::StringLiteral kFloat8CvtAttr = "forge.float8_cvt";

/// float8 E4M3FN / E5M2: bytes in memory, decoded to f32 on load
/// (Body::toCompute); only casts produce them (emitScalar encodes).
inline bool isFloat8(Type t) {
  return t.isFloat8E4M3FN() || t.isFloat8E5M2() || t.isFloat8E4M3FNUZ() || t.isFloat8E5M2FNUZ();
}

/// The float8 encodings ONNX defines: E4M3FN (NaN = S.1111.111, max 448),
/// E5M2 (IEEE-like), and the FNUZ pair (no infinity or -0; 0x80 is NaN).
struct Float8Spec {
  int mbits, bias;
  double maxFinite;
  bool e5m2, fnuz;
};
inline Float8Spec float8Spec(Type t) {
  if (t.isFloat8E5M2()) return {2, 15, 57344.0, true, false};
  if (t.isFloat8E4M3FNUZ()) return {3, 8, 240.0, false, true};
  if (t.isFloat8E5M2FNUZ()) return {2, 16, 57344.0, false, true};
  return {3, 7, 448.0, false, false};
}

/// Element types the generators handle: f16, bf16, f32, f64, bool (i1) and
/// signed, signless or unsigned 8/16/32/64-bit integers. Signless integers are
/// signed (ONNX has no signless integers).
inline bool supportedElement(Type t) {
  if (t.isF16() || t.isBF16() || t.isF32() || t.isF64() || isFloat8(t))
    return true;
  auto i = dyn_cast<IntegerType>(t);
  return i && (i.getWidth() == 1 ? !i.isUnsigned()
                                 : llvm::is_contained({8u, 16u, 32u, 64u}, i.getWidth()));
}
inline bool isUnsignedInt(Type t) { return t.isUnsignedInteger() && !t.isInteger(1); }

/// In memory: bool as i8, integers signless (arith works on signless types;
/// the tensor's own type keeps the signedness).
inline Type storageType(Type t) {
  if (t.isInteger(1) || isFloat8(t))
    return IntegerType::get(t.getContext(), 8);
  if (auto i = dyn_cast<IntegerType>(t))
    return IntegerType::get(t.getContext(), i.getWidth());
  return t;
}
/// In registers: f16/bf16 as f32, integers signless.
inline Type computeType(Type t) {
  if (t.isF16() || t.isBF16() || isFloat8(t))
    return Float32Type::get(t.getContext());
  if (auto i = dyn_cast<IntegerType>(t))
    return IntegerType::get(t.getContext(), i.getWidth());
  return t;
}

inline RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// Row-major strides of `shape`.
inline SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Strides (over the output index) of `in` broadcast to `out` (numpy rules).
inline SmallVector<int64_t> broadcastStrides(ArrayRef<int64_t> in, ArrayRef<int64_t> out) {
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
  bool float8Cvt = false; // the chip converts f32 to float8 in hardware (kFloat8CvtAttr)

  Value idx(int64_t v) { return b.create<arith::ConstantIndexOp>(loc, v); }
  Value i32(int32_t v) { return b.create<arith::ConstantIntOp>(loc, v, 32); }
  Value fconst(Type t, double v) { return b.create<arith::ConstantOp>(loc, b.getFloatAttr(t, v)); }
  Value add(Value a, Value c) { return b.create<arith::AddIOp>(loc, a, c); }
  Value mul(Value a, Value c) { return b.create<arith::MulIOp>(loc, a, c); }
  /// e^x of an f32 x as 2^(x log2(e)): libdevice's exp2f is ex2.approx.f32
  /// (about 4 SASS instructions with its subnormal handling, 2 ulp), where its
  /// expf spends ~10 in PTX on range reduction (also 2 ulp). For the loss
  /// kernels, whose two exponentials per logit made them instruction-bound.
  /// Rounding x log2(e) adds a relative error of about |x| 2^-24 (log2(e)'s
  /// own rounding ~|x| 2^-26 more), so x should be a difference already taken
  /// (x - max: at most a few tens where the result still counts).
  Value expViaExp2(Value x) {
    Value scaled = b.create<arith::MulFOp>(loc, x, fconst(x.getType(), M_LOG2E));
    return b.create<math::Exp2Op>(loc, scaled);
  }
  Value div(Value a, int64_t c) { return b.create<arith::DivUIOp>(loc, a, idx(c)); }
  Value rem(Value a, int64_t c) { return b.create<arith::RemUIOp>(loc, a, idx(c)); }
  Value ult(Value a, Value c) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, a, c); }
  Value tid() { return b.create<gpu::ThreadIdOp>(loc, gpu::Dimension::x); }
  Value bid() { return b.create<gpu::BlockIdOp>(loc, gpu::Dimension::x); }

  /// The element type a tensor is stored as: the memref's when it is a float
  /// (forge-assign-precision stores one op's operands and results in
  /// different float types), else `elem` (i1 and float8 are stored as bytes).
  static Type storedAs(Value memref, Type elem) {
    Type stored = cast<MemRefType>(memref.getType()).getElementType();
    return isa<FloatType>(stored) && isa<FloatType>(elem) ? stored : elem;
  }
  /// storage element -> compute value
  Value load(Value memref, Value index, Type elem) {
    Value v = b.create<memref::LoadOp>(loc, memref, index);
    Type stored = storedAs(memref, elem);
    Value c = toCompute(v, stored);
    // An f32 value in a kernel that computes in another float type.
    Type want = computeTypeOf(elem);
    if (stored != elem && c.getType() != want && isa<FloatType>(want))
      c = want.getIntOrFloatBitWidth() > c.getType().getIntOrFloatBitWidth()
              ? Value(b.create<arith::ExtFOp>(loc, want, c))
              : Value(b.create<arith::TruncFOp>(loc, want, c));
    return c;
  }
  /// The register type of `elem`: f32 for f16/bf16, else itself.
  static Type computeTypeOf(Type elem) {
    if (elem.isF16() || elem.isBF16())
      return Float32Type::get(elem.getContext());
    return elem;
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
    Type stored = storedAs(memref, elem);
    if (stored != elem && isa<FloatType>(v.getType())) {
      // Through the stored type's register type (f32 for f16/bf16).
      Type want = computeTypeOf(stored);
      if (v.getType() != want)
        v = want.getIntOrFloatBitWidth() > v.getType().getIntOrFloatBitWidth()
                ? Value(b.create<arith::ExtFOp>(loc, want, v))
                : Value(b.create<arith::TruncFOp>(loc, want, v));
    }
    b.create<memref::StoreOp>(loc, toStorage(v, stored), memref, index);
  }

  /// for (i = blockIdx*blockDim + threadIdx; i < n; i += gridDim*blockDim)
  void gridStride(int64_t n, function_ref<void(Value)> body) {
    Value start = add(mul(bid(), b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x)), tid());
    Value step = mul(b.create<gpu::GridDimOp>(loc, gpu::Dimension::x),
                     b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x));
    loop(start, idx(n), step, body);
  }
  /// The same over a share of the grid: `blocks` blocks numbered from
  /// `blockIndex` (a horizontal fusion gives each member region a share).
  void gridStrideOver(int64_t n, Value blockIndex, int64_t blocks,
                      function_ref<void(Value)> body) {
    Value dim = b.create<gpu::BlockDimOp>(loc, gpu::Dimension::x);
    Value start = add(mul(blockIndex, dim), tid());
    loop(start, idx(n), mul(idx(blocks), dim), body);
  }
  /// for (i = from; i < n; i += step) body(i), built with `b` (an scf.for).
  void loop(Value from, Value n, Value step, function_ref<void(Value)> body) {
    b.create<scf::ForOp>(loc, from, n, step, ValueRange{},
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
    auto kernels = fn->getParentOfType<gpu::GPUModuleOp>();
    k.float8Cvt = kernels && kernels->hasAttr(kFloat8CvtAttr);
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

  /// `value()` where `cond` holds, else `otherwise`, with value()'s ops (a
  /// load past a row's end) run only where it holds; a null `cond` always holds.
  Value valueIf(Value cond, function_ref<Value()> value, Value otherwise) {
    if (!cond)
      return value();
    auto branch = b.create<scf::IfOp>(
        loc, cond,
        [&](OpBuilder &nb, Location l) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          b.create<scf::YieldOp>(l, value());
        },
        [&](OpBuilder &nb, Location l) { nb.create<scf::YieldOp>(l, otherwise); });
    return branch.getResult(0);
  }
  /// `body()` where `cond` holds; a null `cond` always holds (no branch).
  void ifThen(Value cond, function_ref<void()> body) {
    if (!cond) {
      body();
      return;
    }
    b.create<scf::IfOp>(loc, cond, [&](OpBuilder &nb, Location l) {
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
      body();
      b.create<scf::YieldOp>(l);
    });
  }

  /// Whether the choice (v, i) beats (w, j) in a scan's order (arg-max, a
  /// pool's tap): an empty choice (i32 index < 0) never does and loses to
  /// any other; the first NaN wins; else the larger value; equal values go to
  /// the lower index (`lastTies`: the higher). Associative and commutative,
  /// so lanes may combine in any order.
  Value beatsInOrder(Value v, Value i, Value w, Value j, bool lastTies) {
    auto cmpi = [&](arith::CmpIPredicate p, Value a, Value c) -> Value {
      return b.create<arith::CmpIOp>(loc, p, a, c);
    };
    auto andi = [&](Value a, Value c) -> Value { return b.create<arith::AndIOp>(loc, a, c); };
    auto ori = [&](Value a, Value c) -> Value { return b.create<arith::OrIOp>(loc, a, c); };
    auto nan = [&](Value x) -> Value {
      return b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, x, x);
    };
    Value zero = b.create<arith::ConstantIntOp>(loc, 0, 32);
    Value some = cmpi(arith::CmpIPredicate::sge, i, zero);
    Value otherNone = cmpi(arith::CmpIPredicate::slt, j, zero);
    Value vNan = nan(v), wNan = nan(w);
    Value lower = cmpi(arith::CmpIPredicate::slt, i, j);
    Value tieWins = cmpi(lastTies ? arith::CmpIPredicate::sgt : arith::CmpIPredicate::slt, i, j);
    Value byValue = ori(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, v, w),
                        andi(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, v, w), tieWins));
    Value one = b.create<arith::ConstantIntOp>(loc, 1, 1);
    Value noNan = andi(b.create<arith::XOrIOp>(loc, vNan, one), b.create<arith::XOrIOp>(loc, wNan, one));
    Value wins = b.create<arith::SelectOp>(
        loc, andi(vNan, wNan), lower, b.create<arith::SelectOp>(loc, noNan, byValue, vNan));
    return andi(some, ori(otherNone, wins));
  }
  /// The best choice (f32 value, i32 index) of the lanes `from`, 2 `from`,
  /// ... (< `to`) apart, by XOR shuffles (beatsInOrder); every lane gets its
  /// group's (to = 32, from = 1: the warp's).
  std::pair<Value, Value> butterflyBest(Value v, Value i, int64_t from, int64_t to,
                                        bool lastTies) {
    for (int64_t offset = from; offset < to; offset *= 2) {
      Value ov = b.create<gpu::ShuffleOp>(loc, v, i32(static_cast<int32_t>(offset)), i32(kWarp),
                                          gpu::ShuffleMode::XOR).getShuffleResult();
      Value oi = b.create<gpu::ShuffleOp>(loc, i, i32(static_cast<int32_t>(offset)), i32(kWarp),
                                          gpu::ShuffleMode::XOR).getShuffleResult();
      Value take = beatsInOrder(ov, oi, v, i, lastTies);
      v = b.create<arith::SelectOp>(loc, take, ov, v);
      i = b.create<arith::SelectOp>(loc, take, oi, i);
    }
    return {v, i};
  }
  /// combine(v, the value `offset` lanes away) for offset = from, 2 from, ...
  /// < to (XOR shuffles): every lane gets its group's combination (lanes
  /// congruent modulo `from` within aligned groups of `to`).
  Value butterfly(Value v, int64_t from, int64_t to, function_ref<Value(Value, Value)> combine) {
    for (int64_t offset = from; offset < to; offset *= 2)
      v = combine(v, b.create<gpu::ShuffleOp>(loc, v, i32(static_cast<int32_t>(offset)),
                                              i32(kWarp), gpu::ShuffleMode::XOR)
                         .getShuffleResult());
    return v;
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
  /// combine(term(t)) over a thread's columns t held in registers (t with a
  /// false `valid[t]`, past the row's end, counts as `identity`; null: in
  /// range), then across the block (every thread gets the result).
  Value reduceColumns(ArrayRef<Value> valid, int64_t warps, Value smem, Value identity,
                      function_ref<Value(Value, Value)> combine,
                      function_ref<Value(int64_t)> term) {
    Value acc = identity;
    for (int64_t t = 0; t < static_cast<int64_t>(valid.size()); ++t) {
      Value v = term(t);
      if (valid[t])
        v = b.create<arith::SelectOp>(loc, valid[t], v, identity);
      acc = combine(acc, v);
    }
    return blockReduce(acc, warps, smem, identity, combine);
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
// Kernel construction
//===----------------------------------------------------------------------===//

/// How a map kernel finds one operand's element from the output index.
struct OperandMap {
  SmallVector<int64_t> strides; // per output dimension; 0 = broadcast
  int64_t offset = 0;
};

/// Merges adjacent output dimensions that every operand walks contiguously and
/// drops size-1 dimensions (in place). Pointwise.cpp.
void coalesce(SmallVector<int64_t> &shape, SmallVector<OperandMap> &maps);

// Scalar.cpp
/// The integer constant `v` of `t` (signless), bit pattern of v mod 2^width.
Value intConst(Body &k, Type t, int64_t v);
/// Float -> integer as the CPU's convertValue: NaN -> 0, saturating at the
/// integer type's limits, otherwise truncated toward zero.
Value floatToInt(Body &k, Value x, Type to, bool isUnsigned);
/// One element of an elementwise op. `argElems` are the operands' tensor
/// element types (the first one's signedness picks the integer ops).
Value emitScalar(Body &k, Operation *op, ArrayRef<Value> args, ArrayRef<Type> argElems,
                 Type resultElem);

// Pointwise.cpp
/// The storage-form scalar of fusion-body value `v` at one element: body
/// arguments through `loadArg` (a storage-form load), ops through
/// emitScalar, each value once (memoized in `stored`); null when an op has
/// no scalar form.
Value evalBodyValue(Body &k, Value v, llvm::DenseMap<Value, Value> &stored,
                    function_ref<Value(BlockArgument)> loadArg);
/// Member i of a kernel whose members own consecutive block ranges starting
/// at first[i]: a binary decision tree on `bid` emits `member(i)` where
/// first[i] <= bid < first[i + 1].
void emitBlockRanges(Body &k, Value bid, ArrayRef<int64_t> first,
                     function_ref<void(size_t)> member);

// Reduction.cpp
/// How a reduce_* op combines its elements (nullopt: not a reduce_* op).
struct ReduceKind {
  std::function<Value(Body &, Value, Value)> combine;
  double identity;
  bool square = false; // l2: combine squares
  bool mean = false;   // divide by the count
  bool sqrt = false;   // l2: sqrt at the end
};
std::optional<ReduceKind> reduceKind(Operation *op);

// Indexing.cpp
/// [P, A, Q] around `axis` of `shape`.
std::array<int64_t, 3> aroundAxis(ArrayRef<int64_t> shape, int64_t axis);
/// `op`'s `axis` attribute in [0, rank).
int64_t normalizedAxis(Operation *op, int64_t rank);
/// A class target of nll_loss (or its gradient): the raw value and the class
/// clamped into [0, classes) as `index` (see loadIndex). Whether the raw value
/// was in range is the caller's check.
std::pair<Value, Value> loadTarget(Body &k, Value memref, Value at, int64_t classes);
/// Whether a raw class target lies outside [0, classes), compared in its own
/// width (before loadTarget's clamp): the loss kernels' fault condition.
Value targetOutside(Body &k, Value raw, int64_t classes);

/// What a kernel of `op` checks its data for (empty: nothing). KernelGen.cpp.
std::string faultOf(Operation *op);

} // namespace mlir::forge::kernelgen

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::kernelgen;

struct KernelGenerator::Impl {
  MLIRContext *context;
  CudaTarget target;
  OwningOpRef<ModuleOp> module;
  gpu::GPUModuleOp gpuModule;
  llvm::StringMap<std::optional<KernelLaunch>> cache;
  std::vector<std::string> names;
  std::string fault; // the op being generated checks its data for this (faultOf)

  /// Loads the dialects kernels use and creates the (empty) kernel module.
  Impl(MLIRContext *ctx, CudaTarget t);

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

  static Type flatMemref(Type elem, int64_t n, bool vector = false, int64_t width = kVector) {
    Type s = storageType(elem);
    if (vector)
      return MemRefType::get({n / width}, VectorType::get({width}, s));
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
    /// Per output where its elements go (a concat's piece written a token
    /// stride apart: forge.out_row_strides); empty: every output contiguous,
    /// element i at i.
    SmallVector<OperandMap> outMaps;
    SmallVector<bool> scalar, identity; // per operand: one element; read at the output's index
    bool vector = false;
    int64_t width = kVector; // elements per vector (8 for 2-byte tensors)
    int64_t work = 0;        // vectors, elements, or tiles when tiled
    int64_t elements = 0;
    SmallVector<Type> inTypes, outTypes, outStorage;
    /// Tiled (a transposing read): operands whose contiguous dimension (or
    /// run of tileRun elements) continues along tileDim rather than the
    /// output's go through shared memory in tiles of tileRows x tileCols
    /// (dimension tileDim x tileColDim, x the run), so that both their reads
    /// and the output's writes are coalesced. -1: not tiled.
    int64_t tileDim = -1, tileColDim = -1, tileRun = 1, tileRows = 0, tileCols = 0, tiles = 0;
    SmallVector<bool> transposed; // per operand
    /// The plan without tiles (a horizontal region's member: no shared memory).
    void untile() {
      if (tileDim < 0)
        return;
      tileDim = -1;
      work = elements;
    }
    /// Shared-memory buffers a tiled plan's kernel needs, one per transposed
    /// operand, in operand order.
    SmallVector<Type> workgroup(MLIRContext *ctx) const;
  };
  static constexpr int64_t kTileThreads = 256; // a tiled pointwise kernel's block
  void planTiles(PointwisePlan &p);
  /// A pointwise plan's block size and grid.
  std::pair<int64_t, int64_t> launchOf(const PointwisePlan &p) const {
    if (p.tileDim >= 0)
      return {kTileThreads, std::min(kMaxGrid, p.work)};
    int64_t block = chooseBlockSize(target, p.work);
    return {block, std::min(kMaxGrid, (p.work + block - 1) / block)};
  }
  bool emitTiledPointwise(Body &k, gpu::GPUFuncOp fn, const PointwisePlan &p,
                          ArrayRef<unsigned> inArgs, ArrayRef<unsigned> outArgs,
                          PointwiseBody body);
  std::optional<PointwisePlan> planPointwise(ArrayRef<int64_t> iterShape,
                                             SmallVector<OperandMap> maps, ArrayRef<Type> inElems,
                                             ArrayRef<int64_t> inSizes, ArrayRef<Type> outElems,
                                             SmallVector<OperandMap> outMaps = {});
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
  std::optional<KernelLaunch> rowFusionKernel(FusionOp fusion, StringRef name);
  /// A multi_reduce region's reductions (reduce_sum, or reduce_max of
  /// non-negative values: float8 scaling's amax) and how they read their
  /// inputs: its own kernel's, or a horizontal region's member's.
  struct MultiReducePlan {
    SmallVector<Operation *> sums;
    SmallVector<bool> isMax, vectorized; // per reduction
    SmallVector<Type> inTypes, outTypes; // per body argument (4-element vectors or flat), result
  };
  std::optional<MultiReducePlan> planMultiReduce(FusionOp fusion);
  /// Blocks for reduction i at `block` threads: ~4 loads a thread, capped.
  int64_t multiReduceBlocks(const MultiReducePlan &p, size_t i, int64_t block) const;
  /// Reduction i over `blocks` blocks (this one the `local`-th): each block's
  /// share, then one atomic per block into `fn`'s argument `outArg` (zeroed
  /// before the launch; a maximum as its bits, an integer max). inArgs: the
  /// argument of `fn` per body argument; `sh`: kWarp f32 of shared memory.
  /// False when the body has an op no scalar emitter takes.
  bool emitMultiReduceSum(Body &k, gpu::GPUFuncOp fn, const MultiReducePlan &p, size_t i,
                          ArrayRef<unsigned> inArgs, unsigned outArg, Value local, int64_t blocks,
                          int64_t block, Value sh);
  std::optional<KernelLaunch> multiReduceKernel(FusionOp fusion, StringRef name);
  std::optional<KernelLaunch> columnReduceKernel(FusionOp fusion, StringRef name);
  std::optional<KernelLaunch> linesKernel(FusionOp fusion, StringRef name);
  std::optional<KernelLaunch> layerNormKernel(Operation *op, StringRef name);
  /// A layer norm's gradient; with `epilogue` (a norm_grad region whose
  /// first op is `op`), the region's kernel: dx stays in registers and the
  /// region's other ops run per element on it.
  std::optional<KernelLaunch> layerNormGradKernel(Operation *op, StringRef name,
                                                  FusionOp epilogue = {});
  std::optional<KernelLaunch> gatherKernel(Operation *op, StringRef name, bool grad);
  std::optional<KernelLaunch> nllLossKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> nllLossGradKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> nllLossGradRowKernel(Operation *op, StringRef name);
  /// cross_entropy, cross_entropy_grad, cross_entropy_with_grad.
  enum class CrossEntropyMode { Forward, Gradient, Both };
  /// Argument positions of a cross-entropy kernel (-1: not an argument).
  struct CrossEntropyArgs {
    int target = -1, lse = -1, dy = -1, loss = -1, lseOut = -1, d = -1;
  };
  std::optional<KernelLaunch> crossEntropyKernel(Operation *op, StringRef name,
                                                 CrossEntropyMode mode);
  std::optional<KernelLaunch> crossEntropyVectorKernel(Operation *op, StringRef name,
                                                       CrossEntropyMode mode, CrossEntropyArgs a,
                                                       int64_t rows, int64_t stride,
                                                       int64_t cols, StringRef reduction);
  std::optional<KernelLaunch> crossEntropyOnChipKernel(Operation *op, StringRef name,
                                                       CrossEntropyArgs a, int64_t rows,
                                                       int64_t stride, int64_t cols,
                                                       StringRef reduction);
  std::optional<KernelLaunch> argmaxKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> argmaxRowsKernel(Operation *op, StringRef name, int64_t rows,
                                               int64_t d, Type elem, bool last);
  std::optional<KernelLaunch> topKKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> concatKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> splitKernel(Operation *op, StringRef name);
  std::optional<KernelLaunch> batchNormKernel(Operation *op, StringRef name);
  /// batch_norm_training (or its gradient); `fusion`: the batch_norm region
  /// around `op`, whose epilogue the output pass evaluates.
  std::optional<KernelLaunch> batchNormTrainingKernel(Operation *op, StringRef name, bool grad,
                                                      FusionOp fusion = nullptr);
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
  std::optional<KernelLaunch> resizedCropKernel(Operation *op, StringRef name);
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
  /// A kernel of 8 warps a block whose warps take `units` (a row, a few
  /// output pixels: warp-wide work) in a grid-stride loop; `body` gets the
  /// unit and the thread's lane.
  KernelLaunch warpKernel(StringRef name, ArrayRef<Type> args, int64_t units, Location loc,
                          function_ref<void(Body &, gpu::GPUFuncOp, Value, Value)> body) {
    constexpr int64_t warps = 8, block = warps * kWarp;
    int64_t grid = std::max<int64_t>(1, std::min(kMaxGrid, (units + warps - 1) / warps));
    OpBuilder b(context);
    auto fn = newKernel(b, name, args, block);
    Body k = Body::of(b, loc, fn);
    Value lane = k.rem(k.tid(), kWarp), warp = k.div(k.tid(), kWarp);
    Value gridDim = b.create<gpu::GridDimOp>(loc, gpu::Dimension::x);
    k.loop(k.add(k.mul(k.bid(), k.idx(warps)), warp), k.idx(units), k.mul(gridDim, k.idx(warps)),
           [&](Value u) { body(k, fn, u, lane); });
    b.create<gpu::ReturnOp>(loc);
    return KernelLaunch{name.str(), grid, block};
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

#endif // FORGE_CODEGEN_KERNELGENINTERNAL_H
