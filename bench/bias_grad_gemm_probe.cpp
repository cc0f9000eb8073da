// bias_grad_gemm_probe: whether cuBLASLt writes a bias gradient in f32 beside a
// bf16 GEMM on this GPU, and what the bias-gradient epilogues cost against the
// plain GEMM, for GPT-2 124M's backward (B16 T1024) -- #11's bias sums.
//
// In Forge's bf16 step the bias gradients are f32 sums (forge-assign-precision).
// fc1's is peeled off the DGELU GEMM into a generated column sum (0.53 ms a
// step, x12) because the runtime assumed that DGELU_BGRAD writes its sum in
// D's type (bf16), and qkv's is a loose column sum of cuDNN's dQKV (0.42 ms,
// x12) because a BGRADB on the weight-gradient GEMM may lose split-K at
// k = 16384. Each form is given in cuBLASLt's column-major terms:
// D[rows, cols] = op(A)[rows, k] . op(B)[k, cols]; a DGELU's bias gradient has
// D's rows, a BGRADB's D's columns (the sum over k of B).
//
// Build (here or there; host code only):
//   g++ -O2 -std=c++17 bench/bias_grad_gemm_probe.cpp -I/usr/local/cuda/include \
//       -L/usr/local/cuda/lib64 -lcublasLt -lcudart -o bias_grad_gemm_probe
// Run: ./bias_grad_gemm_probe   (one line per form: algorithms found, best ms
// over the heuristic's first 16, TFLOP/s; "NOT TAKEN" where the heuristic
// returns none)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    auto e_ = (x);                                                                                 \
    if (e_ != 0) {                                                                                 \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, int(e_), __LINE__);                    \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

struct Form {
  const char *name;
  long rows, cols, k;
  bool transA, transB; // A stored [rows, k] (N) or [k, rows] (T); B [k, cols] or [cols, k]
  cudaDataType out;    // D's type (A and B are bf16)
  cublasLtEpilogue_t epi;
  cudaDataType biasType; // the bias (gradient)'s (unused for DEFAULT)
  bool residual = false; // beta = 1: D += (C = D), the f32 residual stream
};

const char *typeName(cudaDataType t) { return t == CUDA_R_32F ? "f32" : "bf16"; }
size_t typeBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
const char *epiName(cublasLtEpilogue_t e) {
  switch (e) {
  case CUBLASLT_EPILOGUE_DEFAULT:
    return "default";
  case CUBLASLT_EPILOGUE_DGELU:
    return "dgelu";
  case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    return "dgelu_bgrad";
  case CUBLASLT_EPILOGUE_BGRADA:
    return "bgrada";
  case CUBLASLT_EPILOGUE_BGRADB:
    return "bgradb";
  case CUBLASLT_EPILOGUE_BIAS:
    return "bias";
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    return "gelu_aux_bias";
  default:
    return "?";
  }
}

void probe(cublasLtHandle_t lt, const Form &f, void *ws, size_t wsBytes, char *pool) {
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opA = f.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = f.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
  char *p = pool;
  auto take = [&](size_t bytes) {
    char *r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  void *a = take(f.rows * f.k * 2);
  void *b = take(f.k * f.cols * 2);
  void *d = take(f.rows * f.cols * typeBytes(f.out));
  void *aux = take(f.rows * f.cols * 2);
  void *bias = take((f.rows > f.cols ? f.rows : f.cols) * 4);
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &f.epi, sizeof f.epi));
  if (f.epi != CUBLASLT_EPILOGUE_DEFAULT && f.epi != CUBLASLT_EPILOGUE_DGELU) {
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f.biasType,
                                      sizeof f.biasType));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (f.epi == CUBLASLT_EPILOGUE_DGELU || f.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD ||
      f.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    long ld = f.rows;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                      sizeof aux));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  cublasLtMatrixLayout_t la, lb, lc;
  if (f.transA)
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, f.k, f.rows, f.k));
  else
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, f.rows, f.k, f.rows));
  if (f.transB)
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, f.cols, f.k, f.cols));
  else
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, f.k, f.cols, f.k));
  CK(cublasLtMatrixLayoutCreate(&lc, f.out, f.rows, f.cols, f.rows));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
                                          sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, res, &found);
  double flops = 2.0 * f.rows * f.cols * f.k;
  std::printf("%-10s D[%5ld x %5ld] k %5ld %c%c -> %-4s%s %-13s bias %-4s", f.name, f.rows, f.cols,
              f.k, f.transA ? 'T' : 'N', f.transB ? 'T' : 'N', typeName(f.out),
              f.residual ? "+C" : "  ", epiName(f.epi),
              f.epi == CUBLASLT_EPILOGUE_DEFAULT || f.epi == CUBLASLT_EPILOGUE_DGELU
                  ? "-"
                  : typeName(f.biasType));
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    std::printf("  NOT TAKEN (status %d, %d algorithms)\n", int(hs), found);
  } else {
    float alpha = 1, beta = f.residual ? 1.f : 0.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    int bestAt = -1, failed = 0;
    for (int i = 0; i < found; ++i) {
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      for (int w = 0; w < 3 && st == CUBLAS_STATUS_SUCCESS; ++w)
        st = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &res[i].algo, ws,
                            wsBytes, 0);
      if (st != CUBLAS_STATUS_SUCCESS) {
        ++failed;
        continue;
      }
      CK(cudaEventRecord(e0));
      const int reps = 20;
      for (int r = 0; r < reps; ++r)
        cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &res[i].algo, ws,
                       wsBytes, 0);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (ms / reps < best) {
        best = ms / reps;
        bestAt = i;
      }
    }
    if (bestAt < 0)
      std::printf("  %d algos, every run failed\n", found);
    else
      std::printf("  %2d algos (%d failed)  best #%d %.4f ms  %.0f TFLOP/s\n", found, failed,
                  bestAt, best, flops / best / 1e9);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  CK(cudaGetLastError());
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
}

} // namespace

int main(int argc, char **argv) {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t wsBytes = 64 << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsBytes));
  char *pool;
  size_t poolBytes = size_t(2) << 30;
  CK(cudaMalloc(&pool, poolBytes));
  // Random bf16 values of magnitude [0.5, 1), either sign (an f32 view of the patterns is
  // finite too): zeros would flatter the tensor cores' power and clocks.
  {
    const size_t chunk = size_t(64) << 20;
    std::vector<uint16_t> host(chunk / 2);
    uint32_t state = 12345;
    for (uint16_t &h : host) {
      state = state * 1664525u + 1013904223u;
      h = static_cast<uint16_t>(0x3f00u | ((state >> 16) & 0x7fu)) ^ ((state >> 8) & 0x8000u);
    }
    CK(cudaMemcpy(pool, host.data(), chunk, cudaMemcpyHostToDevice));
    for (size_t at = chunk; at < poolBytes; at += chunk)
      CK(cudaMemcpy(pool + at, pool, std::min(chunk, poolBytes - at), cudaMemcpyDeviceToDevice));
  }
  // GPT-2 124M at B16 T1024: M = 16384 tokens, C = 768.
  const long M = 16384, C = 768;
  const cudaDataType bf = CUDA_R_16BF, f32 = CUDA_R_32F;
  const auto biasE = CUBLASLT_EPILOGUE_BIAS, geluAux = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const auto none = CUBLASLT_EPILOGUE_DEFAULT, dgelu = CUBLASLT_EPILOGUE_DGELU,
             dgeluB = CUBLASLT_EPILOGUE_DGELU_BGRAD, bgradb = CUBLASLT_EPILOGUE_BGRADB,
             bgrada = CUBLASLT_EPILOGUE_BGRADA;
  std::vector<Form> forms = {
      // The forward linears Y[M, N] = X . W^T + b as D = Y^T[N, M] (W [N, K]: A T;
      // X [M, K]: B N): plain bf16 out, with the bias, and (fc2, the attention
      // projection) with the bias and the f32 residual stream read and written.
      {"fwd_fc1", 4 * C, M, C, true, false, bf, none, bf},
      {"fwd_fc1", 4 * C, M, C, true, false, bf, biasE, bf},
      {"fwd_fc1", 4 * C, M, C, true, false, bf, geluAux, bf},
      {"fwd_fc1", 4 * C, M, C, true, false, bf, geluAux, f32},
      {"fwd_fc1", 4 * C, M, C, true, false, bf, biasE, f32},
      {"fwd_fc2", C, M, 4 * C, true, false, bf, none, bf},
      {"fwd_fc2", C, M, 4 * C, true, false, bf, biasE, bf},
      {"fwd_fc2", C, M, 4 * C, true, false, f32, biasE, f32, true},
      {"fwd_proj", C, M, C, true, false, bf, none, bf},
      {"fwd_proj", C, M, C, true, false, bf, biasE, bf},
      {"fwd_proj", C, M, C, true, false, f32, biasE, f32, true},
      {"fwd_qkv", 3 * C, M, C, true, false, bf, biasE, bf},
      {"fwd_qkv", 3 * C, M, C, true, false, bf, biasE, f32},
      {"fwd_qkv", 3 * C, M, C, true, false, bf, none, bf},
      // fc2's input gradient with the GELU's gradient: dH^T[4C, M] = W2^T . dY^T
      // (W2 row-major [C, 4C]: A [4C, C] N; dY [M, C]: B [C, M] N).
      {"dx_fc2", 4 * C, M, C, false, false, bf, none, bf},
      {"dx_fc2", 4 * C, M, C, false, false, bf, dgelu, bf},
      {"dx_fc2", 4 * C, M, C, false, false, bf, dgeluB, bf},
      {"dx_fc2", 4 * C, M, C, false, false, bf, dgeluB, f32},
      // Weight gradients dW^T[C, N] = X^T . dY (X [M, C]: A [C, M] N; dY [M, N]:
      // B [M, N] = the stored [N, M] transposed); the bias gradient is dY's
      // column sum, BGRADB. D f32 (Forge's gradients) and bf16.
      {"dw_qkv", C, 3 * C, M, false, true, f32, none, f32},
      {"dw_qkv", C, 3 * C, M, false, true, f32, bgradb, f32},
      {"dw_qkv", C, 3 * C, M, false, true, bf, none, f32},
      {"dw_qkv", C, 3 * C, M, false, true, bf, bgradb, f32},
      {"dw_qkv", C, 3 * C, M, false, true, bf, bgradb, bf},
      {"dw_fc1", C, 4 * C, M, false, true, f32, none, f32},
      {"dw_fc1", C, 4 * C, M, false, true, f32, bgradb, f32},
      // The same weight gradients the other way round: dW[N, C] (A = dY^T, its
      // sum over k is BGRADA).
      {"dw_qkv_t", 3 * C, C, M, true, false, f32, none, f32},
      {"dw_qkv_t", 3 * C, C, M, true, false, f32, bgrada, f32},
      {"dw_fc1_t", 4 * C, C, M, true, false, f32, none, f32},
      {"dw_fc1_t", 4 * C, C, M, true, false, f32, bgrada, f32},
  };
  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
  for (const Form &f : forms)
    if (argc < 2 || std::string(argv[1]) == f.name)
      probe(lt, f, ws, wsBytes, pool);
  return 0;
}
