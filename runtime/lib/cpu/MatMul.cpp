// Matrix-product CPU kernels: matmul (NumPy semantics) and gemm (ONNX Gemm).
//
// Invariants: f32/f64 go through OpenBLAS (row-major cblas_?gemm), one call
// per broadcast batch entry, or a single call when the rhs is shared by every
// batch entry and the lhs is dense over the batch (the common "activations x
// weight" case); f16/bf16 run the f32 path on converted copies; integer types
// use a plain loop with wrapping int64 accumulation.
#include "KernelUtil.h"

#include <algorithm>
#include <climits>

#include <cblas.h>

namespace forge::rt::cpu {

namespace {
bool fitsBlas(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d > INT_MAX)
      return false;
  return true;
}
} // namespace

Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha, const float *a,
            int64_t lda, const float *b, int64_t ldb, double beta, float *y, int64_t ldy) {
  if (!fitsBlas({m, n, k, lda, ldb, ldy}))
    return Status::error("matrix dims exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), float(alpha), a, int(std::max<int64_t>(lda, 1)), b,
              int(std::max<int64_t>(ldb, 1)), float(beta), y, int(std::max<int64_t>(ldy, 1)));
  return Status::ok();
}

Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha,
            const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *y,
            int64_t ldy) {
  if (!fitsBlas({m, n, k, lda, ldb, ldy}))
    return Status::error("matrix dims exceed the BLAS int range");
  cblas_dgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(std::max<int64_t>(lda, 1)), b,
              int(std::max<int64_t>(ldb, 1)), beta, y, int(std::max<int64_t>(ldy, 1)));
  return Status::ok();
}

namespace {

/// Integer y = alpha * op(a) op(b) + beta * y (alpha/beta applied in double
/// only when they are not 1/0, so plain products stay exact).
template <typename T>
void intGemm(ThreadPool &pool, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
             double alpha, const T *a, int64_t lda, const T *b, int64_t ldb, double beta, T *y,
             int64_t ldy) {
  using A = Accum<T>;
  pool.parallelFor(m, std::max<int64_t>(1, kGrain / std::max<int64_t>(n * k, 1)),
                   [&](int64_t i0, int64_t i1) {
                     std::vector<A> acc(n);
                     for (int64_t i = i0; i < i1; ++i) {
                       std::fill(acc.begin(), acc.end(), A(0));
                       for (int64_t p = 0; p < k; ++p) {
                         A av = static_cast<A>(transA ? a[p * lda + i] : a[i * lda + p]);
                         for (int64_t j = 0; j < n; ++j) {
                           A bv = static_cast<A>(transB ? b[j * ldb + p] : b[p * ldb + j]);
                           acc[j] = wrapAdd(acc[j], wrapMul(av, bv));
                         }
                       }
                       T *row = y + i * ldy;
                       for (int64_t j = 0; j < n; ++j) {
                         if (alpha == 1.0 && beta == 0.0)
                           row[j] = static_cast<T>(acc[j]);
                         else
                           row[j] = convertValue<T>(alpha * double(acc[j]) +
                                                    (beta != 0.0 ? beta * double(row[j]) : 0.0));
                       }
                     }
                   });
}

template <typename T>
Status gemmAny(ThreadPool &pool, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
               double alpha, const T *a, int64_t lda, const T *b, int64_t ldb, double beta, T *y,
               int64_t ldy) {
  if (m == 0 || n == 0)
    return Status::ok();
  if (k == 0) { // empty contraction: y = beta * y
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        y[i * ldy + j] = beta == 0.0 ? T(0) : convertValue<T>(beta * double(y[i * ldy + j]));
    return Status::ok();
  }
  if constexpr (std::is_floating_point_v<T>)
    return gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, y, ldy);
  else
    intGemm(pool, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, y, ldy);
  return Status::ok();
}

/// f32/f64/integer types natively; f16/bf16 staged through f32.
template <typename F> Status visitMatmulTypes(DType t, KernelContext &ctx, KernelFn self, F &&f) {
  if (t == bundle::F16)
    return runInFloat<Half>(ctx, self);
  if (t == bundle::BF16)
    return runInFloat<BFloat16>(ctx, self);
  if (t == bundle::F32)
    return f(Tag<float>{});
  if (t == bundle::F64)
    return f(Tag<double>{});
  return visitInt(t, f);
}

//===----------------------------------------------------------------------===//
// matmul
//===----------------------------------------------------------------------===//

Status matmulKernel(KernelContext &ctx) {
  const TensorView &a = ctx.inputs[0], &b = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(b, a.dtype, "rhs"));
  FORGE_RETURN_IF_ERROR(checkDType(y, a.dtype, "result"));
  if (a.rank() == 0 || b.rank() == 0)
    return Status::error("matmul operands must have rank >= 1");
  // transA/transB (optional): the operand's last two dims are swapped first.
  const bool transA = ctx.attrs.has("transA") && *ctx.attrs.getInt("transA") != 0;
  const bool transB = ctx.attrs.has("transB") && *ctx.attrs.getInt("transB") != 0;
  if ((transA && a.rank() < 2) || (transB && b.rank() < 2))
    return Status::error("matmul transpose flags need operands of rank >= 2");
  // NumPy promotion: a 1-D lhs is a row, a 1-D rhs a column, both dropped after.
  std::vector<int64_t> as = a.shape, bs = b.shape;
  if (transA)
    std::swap(as[as.size() - 1], as[as.size() - 2]);
  if (transB)
    std::swap(bs[bs.size() - 1], bs[bs.size() - 2]);
  const bool aVec = as.size() == 1, bVec = bs.size() == 1;
  if (aVec)
    as.insert(as.begin(), 1);
  if (bVec)
    bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k)
    return Status::error("contraction dims differ: lhs {} vs rhs {}", shapeString(a.shape),
                         shapeString(b.shape));
  std::vector<int64_t> aBatch(as.begin(), as.end() - 2), bBatch(bs.begin(), bs.end() - 2);
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> batch, broadcastShape(aBatch, bBatch));
  std::vector<int64_t> outShape = batch;
  if (!aVec)
    outShape.push_back(m);
  if (!bVec)
    outShape.push_back(n);
  FORGE_RETURN_IF_ERROR(checkShape(y, outShape));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sa, broadcastStrides(aBatch, batch));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sb, broadcastStrides(bBatch, batch));
  const int64_t nb = numElements(batch);

  return visitMatmulTypes(a.dtype, ctx, &matmulKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *pa = a.as<const T>(), *pb = b.as<const T>();
    T *py = y.as<T>();
    if (y.numel() == 0)
      return Status::ok();
    // Stored row lengths (leading dimensions) of the operands' matrices.
    const int64_t lda = transA ? m : k, ldb = transB ? k : n;
    // Shared rhs, dense untransposed lhs: one [nb*m, k] x [k, n] product.
    if (numElements(bBatch) == 1 && numElements(aBatch) == nb && !transA)
      return gemmAny(ctx.pool, false, transB, nb * m, n, k, 1.0, pa, lda, pb, ldb, 0.0, py, n);
    for (int64_t i = 0; i < nb; ++i) {
      int64_t offA = 0, offB = 0, rest = i;
      for (size_t d = batch.size(); d-- > 0;) {
        int64_t idx = rest % batch[d];
        rest /= batch[d];
        offA += idx * sa[d];
        offB += idx * sb[d];
      }
      FORGE_RETURN_IF_ERROR(gemmAny(ctx.pool, transA, transB, m, n, k, 1.0, pa + offA * m * k,
                                    lda, pb + offB * k * n, ldb, 0.0, py + i * m * n, n));
    }
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// gemm
//===----------------------------------------------------------------------===//

/// A gemm-like kernel's attributes and sizes: y[m, n] = alpha op(a) op(b) +
/// beta C with rank-2 operands (checked, y's shape too).
struct GemmForm {
  int64_t transA = 0, transB = 0, m = 0, n = 0, k = 0;
  double alpha = 1, beta = 0;
};
Status readGemmForm(KernelContext &ctx, const char *op, GemmForm &f) {
  const TensorView &a = ctx.inputs[0], &b = ctx.inputs[1];
  CPU_ASSIGN_OR_RETURN(f.transA, ctx.attrs.getInt("transA"));
  CPU_ASSIGN_OR_RETURN(f.transB, ctx.attrs.getInt("transB"));
  CPU_ASSIGN_OR_RETURN(f.alpha, ctx.attrs.getFloat("alpha"));
  CPU_ASSIGN_OR_RETURN(f.beta, ctx.attrs.getFloat("beta"));
  if (a.rank() != 2 || b.rank() != 2)
    return Status::error("{} operands must have rank 2, got {} and {}", op, shapeString(a.shape),
                         shapeString(b.shape));
  f.m = f.transA ? a.shape[1] : a.shape[0];
  f.k = f.transA ? a.shape[0] : a.shape[1];
  const int64_t kb = f.transB ? b.shape[1] : b.shape[0];
  f.n = f.transB ? b.shape[0] : b.shape[1];
  if (f.k != kb)
    return Status::error("contraction dims differ: A {} vs B {}", shapeString(a.shape),
                         shapeString(b.shape));
  return checkShape(ctx.outputs[0], {f.m, f.n});
}

Status gemmKernel(KernelContext &ctx) {
  const TensorView &a = ctx.inputs[0], &b = ctx.inputs[1];
  const TensorView *c = ctx.inputs.size() > 2 && ctx.inputs[2].present() ? &ctx.inputs[2] : nullptr;
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(b, a.dtype, "B"));
  FORGE_RETURN_IF_ERROR(checkDType(y, a.dtype, "result"));
  GemmForm f;
  FORGE_RETURN_IF_ERROR(readGemmForm(ctx, "gemm", f));
  const int64_t m = f.m, n = f.n, k = f.k, transA = f.transA, transB = f.transB;
  const double alpha = f.alpha, beta = f.beta;
  std::vector<int64_t> sc;
  if (c) {
    FORGE_RETURN_IF_ERROR(checkDType(*c, a.dtype, "C"));
    if (c->rank() > 2)
      return Status::error("gemm C must have rank <= 2, got {}", shapeString(c->shape));
    CPU_ASSIGN_OR_RETURN(sc, broadcastStrides(c->shape, {m, n}));
  }
  return visitMatmulTypes(a.dtype, ctx, &gemmKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    T *py = y.as<T>();
    double blasBeta = 0.0;
    if (c && beta != 0.0) {
      const T *pc = c->as<const T>();
      if (pc != py) // y = broadcast(C), then the product accumulates onto it
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            py[i * n + j] = pc[i * sc[0] + j * sc[1]];
      blasBeta = beta;
    }
    return gemmAny(ctx.pool, transA != 0, transB != 0, m, n, k, alpha, a.as<const T>(), a.shape[1],
                   b.as<const T>(), b.shape[1], blasBeta, py, n);
  });
}

//===----------------------------------------------------------------------===//
// scaled_gemm: float8 operands decoded (exactly) and multiplied by their
// scales, then an f32 gemm; y and C f32 or bf16 (a bias row of either).
//===----------------------------------------------------------------------===//

Status scaledGemmKernel(KernelContext &ctx) {
  const TensorView &a = ctx.inputs[0], &b = ctx.inputs[1];
  const TensorView &as = ctx.inputs[2], &bs = ctx.inputs[3];
  const TensorView *c = ctx.inputs.size() > 4 && ctx.inputs[4].present() ? &ctx.inputs[4] : nullptr;
  TensorView &y = ctx.outputs[0];
  auto float8 = [](DType t) { return t == bundle::F8E4M3 || t == bundle::F8E5M2; };
  if (!float8(a.dtype) || !float8(b.dtype))
    return Status::error("scaled_gemm takes float8 (E4M3 or E5M2) operands, got {} and {}",
                         dtypeName(a.dtype), dtypeName(b.dtype));
  FORGE_RETURN_IF_ERROR(checkDType(as, bundle::F32, "A's scale"));
  FORGE_RETURN_IF_ERROR(checkDType(bs, bundle::F32, "B's scale"));
  if (as.numel() != 1 || bs.numel() != 1)
    return Status::error("scaled_gemm scales must be scalars");
  GemmForm f;
  FORGE_RETURN_IF_ERROR(readGemmForm(ctx, "scaled_gemm", f));
  const int64_t m = f.m, n = f.n, k = f.k;
  if (y.dtype != bundle::F32 && y.dtype != bundle::BF16)
    return unsupportedDType(y.dtype, "scaled_gemm result (f32 or bf16)");
  auto decoded = [](const TensorView &t, float scale) {
    std::vector<float> v(t.numel());
    const uint8_t *bytes = t.as<const uint8_t>();
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(decodeFloat8(bytes[i], t.dtype)) * scale;
    return v;
  };
  std::vector<float> pa = decoded(a, *as.as<const float>()), pb = decoded(b, *bs.as<const float>());
  auto asFloat = [](const TensorView &t) {
    return t.dtype == bundle::BF16 ? toFloatVector<BFloat16>(t)
                                   : std::vector<float>(t.as<const float>(),
                                                        t.as<const float>() + t.numel());
  };
  std::vector<float> py(static_cast<size_t>(m * n), 0.0f);
  double blasBeta = 0.0;
  if (c && f.beta != 0.0) {
    if (c->dtype != bundle::F32 && c->dtype != bundle::BF16)
      return unsupportedDType(c->dtype, "scaled_gemm C (f32 or bf16)");
    if (c->rank() > 2)
      return Status::error("scaled_gemm C must have rank <= 2, got {}", shapeString(c->shape));
    CPU_ASSIGN_OR_RETURN(std::vector<int64_t> sc, broadcastStrides(c->shape, {m, n}));
    std::vector<float> pc = asFloat(*c);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        py[i * n + j] = pc[i * sc[0] + j * sc[1]];
    blasBeta = f.beta;
  }
  FORGE_RETURN_IF_ERROR(gemmAny(ctx.pool, f.transA != 0, f.transB != 0, m, n, k, f.alpha, pa.data(),
                                a.shape[1], pb.data(), b.shape[1], blasBeta, py.data(), n));
  if (y.dtype == bundle::BF16)
    storeFloatVector<BFloat16>(py, y);
  else
    std::copy(py.begin(), py.end(), y.as<float>());
  return Status::ok();
}

} // namespace

void registerMatMulKernels(Registry &r) {
  r.add("matmul", &matmulKernel, 2, 2);
  r.add("gemm", &gemmKernel, 2, 3);
  r.add("scaled_gemm", &scaledGemmKernel, 4, 5);
}

} // namespace forge::rt::cpu
