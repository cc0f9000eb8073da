// cuBLASLt matmul plans (Matmul.h).
#include "cuda/Matmul.h"

#include <algorithm>

namespace forge::rt::cuda {

namespace {

std::vector<int64_t> shapeOf(const bundle::Program &p, int32_t t) {
  const auto &s = p.tensors(t).shape();
  return {s.begin(), s.end()};
}

int64_t product(const std::vector<int64_t> &v, size_t begin, size_t end) {
  int64_t r = 1;
  for (size_t i = begin; i < end; ++i)
    r *= v[i];
  return r;
}

bool allOnes(const std::vector<int64_t> &v, size_t end) {
  return std::all_of(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(end),
                     [](int64_t d) { return d == 1; });
}

#define LT_CHECK(call)                                                                          \
  do {                                                                                          \
    cublasStatus_t status_ = (call);                                                            \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return Status::error("cuBLASLt {} failed: {}", #call,                                    \
                           api.cublasLtGetStatusString(status_));                               \
  } while (0)

} // namespace

std::string MatmulProblem::key() const {
  return fmt::format("{}x{}x{} b{} t{}{} s{},{} c{}{} a{} b{} tf{}", m, n, k, batch, transA,
                     transB, lhsBatchStride, rhsBatchStride, fullC, bias, alpha, beta, tf32);
}

Expected<MatmulProblem> matmulProblem(const bundle::Program &p, const bundle::Instruction &inst,
                                      bool tf32) {
  MatmulProblem pr;
  pr.tf32 = tf32;
  if (inst.inputs_size() < 2 || inst.outputs_size() != 1 || inst.inputs(0) < 0 ||
      inst.inputs(1) < 0)
    return Status::error("{} needs lhs, rhs and one output", inst.op());
  for (int32_t t : {inst.inputs(0), inst.inputs(1), inst.outputs(0)})
    if (p.tensors(t).dtype() != bundle::F32)
      return Status::error("{} on the GPU takes f32 tensors; '{}' is not", inst.op(),
                           p.tensors(t).name());
  std::vector<int64_t> lhs = shapeOf(p, inst.inputs(0)), rhs = shapeOf(p, inst.inputs(1));
  std::vector<int64_t> out = shapeOf(p, inst.outputs(0));
  if (lhs.size() < 2 || rhs.size() < 2 || out.size() < 2)
    return Status::error("{} on the GPU needs operands of rank >= 2", inst.op());
  auto attrFloat = [&](const char *name, double fallback) {
    auto it = inst.attrs().find(name);
    return it != inst.attrs().end() && it->second.value_case() == bundle::Attribute::kF
               ? it->second.f()
               : fallback;
  };
  auto attrBool = [&](const char *name) {
    auto it = inst.attrs().find(name);
    return it != inst.attrs().end() && it->second.value_case() == bundle::Attribute::kI &&
           it->second.i() != 0;
  };

  if (inst.op() == "gemm") {
    if (lhs.size() != 2 || rhs.size() != 2)
      return Status::error("gemm needs matrices");
    pr.transA = attrBool("transA");
    pr.transB = attrBool("transB");
    pr.m = pr.transA ? lhs[1] : lhs[0];
    pr.k = pr.transA ? lhs[0] : lhs[1];
    pr.n = pr.transB ? rhs[0] : rhs[1];
    pr.alpha = static_cast<float>(attrFloat("alpha", 1.0));
    double beta = attrFloat("beta", 1.0);
    if (inst.inputs_size() > 2 && inst.inputs(2) >= 0) {
      std::vector<int64_t> c = shapeOf(p, inst.inputs(2));
      if (p.tensors(inst.inputs(2)).dtype() != bundle::F32)
        return Status::error("gemm's C must be f32 on the GPU");
      if (c == out) {
        pr.fullC = true;
        pr.beta = static_cast<float>(beta);
      } else if (((c.size() == 1 && c[0] == pr.n) ||
                  (c.size() == 2 && c[0] == 1 && c[1] == pr.n)) &&
                 beta == 1.0) {
        pr.bias = true;
      } else {
        return Status::error("gemm's C of shape {} with beta {} has no cuBLASLt form",
                             shapeString(c), beta);
      }
    }
  } else if (inst.op() == "matmul") {
    // transA/transB: the operand's last two dims are swapped (cuBLASLt op flags).
    pr.transA = attrBool("transA");
    pr.transB = attrBool("transB");
    size_t lb = lhs.size() - 2, rb = rhs.size() - 2;
    pr.m = pr.transA ? lhs[lb + 1] : lhs[lb];
    pr.k = pr.transA ? lhs[lb] : lhs[lb + 1];
    pr.n = pr.transB ? rhs[rb] : rhs[rb + 1];
    if ((pr.transB ? rhs[rb + 1] : rhs[rb]) != pr.k)
      return Status::error("matmul inner dimensions differ: {} vs {}", shapeString(lhs),
                           shapeString(rhs));
    std::vector<int64_t> lBatch(lhs.begin(), lhs.begin() + static_cast<std::ptrdiff_t>(lb));
    std::vector<int64_t> rBatch(rhs.begin(), rhs.begin() + static_cast<std::ptrdiff_t>(rb));
    if ((rb == 0 || allOnes(rhs, rb)) && pr.transA) {
      pr.batch = product(lhs, 0, lb); // a transposed lhs batch cannot fold into M
      pr.lhsBatchStride = pr.m * pr.k;
      pr.rhsBatchStride = 0;
    } else if (rb == 0 || allOnes(rhs, rb)) {
      pr.m *= product(lhs, 0, lb); // fold the lhs batch into M
    } else if (lBatch == rBatch) {
      pr.batch = product(lhs, 0, lb);
      pr.lhsBatchStride = pr.m * pr.k;
      pr.rhsBatchStride = pr.k * pr.n;
    } else if (lb == 0 || allOnes(lhs, lb)) {
      pr.batch = product(rhs, 0, rb);
      pr.rhsBatchStride = pr.k * pr.n;
    } else {
      return Status::error("matmul batch shapes {} and {} have no strided-batch form",
                           shapeString(lhs), shapeString(rhs));
    }
  } else {
    return Status::error("op '{}' is not a matmul", inst.op());
  }
  if (pr.m * pr.n * pr.batch != product(out, 0, out.size()))
    return Status::error("{}: output shape {} does not match M={} N={} batch={}", inst.op(),
                         shapeString(out), pr.m, pr.n, pr.batch);
  return pr;
}

Expected<std::unique_ptr<MatmulPlan>> MatmulPlan::create(const CublasLtApi &api,
                                                         cublasLtHandle_t handle,
                                                         const MatmulProblem &pr,
                                                         size_t workspaceBytes,
                                                         std::shared_ptr<MatmulAlgoCache> cache) {
  std::unique_ptr<MatmulPlan> plan(new MatmulPlan());
  plan->api_ = &api;
  plan->handle_ = handle;
  plan->problem_ = pr;
  plan->workspaceBytes_ = workspaceBytes;
  plan->cache_ = cache;
  cublasComputeType_t compute = pr.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CHECK(api.cublasLtMatmulDescCreate(&plan->desc_, compute, CUDA_R_32F));
  // cuBLASLt A = rhs^T view (N x K), B = lhs^T view (K x M), D = Y^T (N x M).
  cublasOperation_t opA = pr.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = pr.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &opA,
                                              sizeof(opA)));
  LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &opB,
                                              sizeof(opB)));
  if (pr.bias) {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                &epilogue, sizeof(epilogue)));
  }
  auto layout = [&](cublasLtMatrixLayout_t *l, int64_t rows, int64_t cols, int64_t stride)
      -> Status {
    LT_CHECK(api.cublasLtMatrixLayoutCreate(l, CUDA_R_32F, static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), rows));
    if (pr.batch > 1) {
      int32_t count = static_cast<int32_t>(pr.batch);
      LT_CHECK(api.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof(count)));
      LT_CHECK(api.cublasLtMatrixLayoutSetAttribute(
          *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return Status::ok();
  };
  // Stored (column-major) shapes: rhs is N x K when transB, else... its memory
  // is row-major [K, N] (or [N, K] with transB), i.e. column-major N x K (K x N).
  FORGE_RETURN_IF_ERROR(layout(&plan->a_, pr.transB ? pr.k : pr.n, pr.transB ? pr.n : pr.k,
                               pr.rhsBatchStride));
  FORGE_RETURN_IF_ERROR(layout(&plan->b_, pr.transA ? pr.m : pr.k, pr.transA ? pr.k : pr.m,
                               pr.lhsBatchStride));
  FORGE_RETURN_IF_ERROR(layout(&plan->c_, pr.n, pr.m, pr.m * pr.n));

  const std::string key = pr.key();
  if (auto hit = cache->candidates.find(key); hit != cache->candidates.end()) {
    plan->algo_ = hit->second.front();
    return plan;
  }
  cublasLtMatmulPreference_t pref;
  LT_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspaceBytes;
  cublasStatus_t st = api.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kMatmulCandidates] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = api.cublasLtMatmulAlgoGetHeuristic(handle, plan->desc_, plan->a_, plan->b_, plan->c_,
                                            plan->c_, pref, kMatmulCandidates, results, &found);
  api.cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return Status::error("cuBLASLt found no algorithm for {} ({})", pr.key(),
                         st != CUBLAS_STATUS_SUCCESS ? api.cublasLtGetStatusString(st)
                                                     : "no heuristic result");
  std::vector<cublasLtMatmulAlgo_t> &candidates = cache->candidates[key];
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspaceBytes)
      candidates.push_back(results[i].algo);
  if (candidates.empty())
    candidates.push_back(results[0].algo);
  plan->algo_ = candidates.front();
  return plan;
}

MatmulPlan::~MatmulPlan() {
  if (!api_)
    return;
  if (a_) api_->cublasLtMatrixLayoutDestroy(a_);
  if (b_) api_->cublasLtMatrixLayoutDestroy(b_);
  if (c_) api_->cublasLtMatrixLayoutDestroy(c_);
  if (desc_) api_->cublasLtMatmulDescDestroy(desc_);
}

Status MatmulPlan::run(cudaStream_t stream, const void *lhs, const void *rhs, const void *c,
                       void *out, void *workspace) const {
  const CublasLtApi &api = *api_;
  if (problem_.bias)
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c,
                                                sizeof(c)));
  const void *cPtr = problem_.fullC ? c : out;
  float beta = problem_.fullC ? problem_.beta : 0.0f;
  LT_CHECK(api.cublasLtMatmul(handle_, desc_, &problem_.alpha, rhs, a_, lhs, b_, &beta, cPtr, c_,
                              out, c_, &algo_, workspace, workspaceBytes_, stream));
  return Status::ok();
}

Status MatmulPlan::tune(cudaStream_t stream, const void *lhs, const void *rhs, const void *c,
                        void *out, void *workspace) {
  if (tuned_)
    return Status::ok();
  const std::string key = problem_.key();
  if (auto hit = cache_->tuned.find(key); hit != cache_->tuned.end()) {
    algo_ = hit->second;
    tuned_ = true;
    return Status::ok();
  }
  const std::vector<cublasLtMatmulAlgo_t> candidates = cache_->candidates[key];
  if (candidates.size() < 2) {
    tuned_ = true;
    return Status::ok();
  }
  if (out == lhs || out == rhs || (c && out == c))
    return Status::ok(); // a later plan of this problem times them
  tuned_ = true;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
    return Status::error("cudaEventCreate failed while tuning a matmul");
  constexpr int kRuns = 5; // after one untimed run of each candidate
  float best = 0;
  bool any = false;
  cublasLtMatmulAlgo_t chosen = algo_;
  Status lastFailure;
  for (const cublasLtMatmulAlgo_t &candidate : candidates) {
    algo_ = candidate;
    Status status = run(stream, lhs, rhs, c, out, workspace); // warm-up (does it run at all?)
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    cudaEventRecord(start, stream);
    for (int i = 0; i < kRuns && status.isOk(); ++i)
      status = run(stream, lhs, rhs, c, out, workspace);
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (status.isOk() && (cudaEventSynchronize(stop) != cudaSuccess ||
                          cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return Status::error("CUDA error while timing a matmul algorithm for {}: {}", key,
                           cudaGetErrorString(cudaGetLastError()));
    }
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    if (!any || ms < best) {
      best = ms;
      chosen = candidate;
    }
    any = true;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!any)
    return lastFailure;
  algo_ = chosen;
  cache_->tuned[key] = chosen;
  return Status::ok(); // the caller then runs the chosen algorithm
}

} // namespace forge::rt::cuda
