// fp8_gemm_probe: which float8 GEMM forms cuBLASLt takes on this GPU, and how
// fast they run against bf16, for GPT-2 124M's training GEMMs (B16 T1024).
//
// The question #11's fp8 item turns on before any compiler work: a Hopper
// float8 GEMM must read both operands K-major ("TN"), so a forward linear
// (x[M,K] . W[N,K]^T) takes it as it stands while the weight and activation
// gradients need transposed copies; and which epilogues (BIAS with a full f32
// C, GELU_AUX_BIAS) come with float8 operands decides what the fused regions
// keep. Row-major Y[M,N] = X[M,K] . W[N,K]^T is run as the column-major
// Y^T = W^T X (cuBLASLt's A = W with op T, its B = X with op N), as
// runtime/lib/cuda/Matmul.cpp does.
//
// Build (here or there; host code only):
//   g++ -O2 -std=c++17 bench/fp8_gemm_probe.cpp -I/usr/local/cuda/include \
//       -L/usr/local/cuda/lib64 -lcublasLt -lcudart -o fp8_gemm_probe
// Run: ./fp8_gemm_probe   (prints one line per form: algorithms found, best ms,
// TFLOP/s)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                                    \
  do {                                                                                           \
    auto e_ = (x);                                                                               \
    if (e_ != 0) {                                                                               \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, int(e_), __LINE__);                 \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

enum class Epi { None, Bias, GeluAuxBias, BiasOnly, FullC };
const char *epiName(Epi e) {
  switch (e) {
  case Epi::None: return "none";
  case Epi::Bias: return "bias+fullC";
  case Epi::GeluAuxBias: return "gelu_aux_bias";
  case Epi::BiasOnly: return "bias";
  case Epi::FullC: return "fullC";
  }
  return "?";
}

struct Form {
  const char *name;
  long m, n, k; // row-major Y[m,n] = lhs[m,k] . rhs[n,k]^T
  cudaDataType lhs, rhs, out;
  Epi epi;
};

const char *typeName(cudaDataType t) {
  switch (t) {
  case CUDA_R_8F_E4M3: return "e4m3";
  case CUDA_R_8F_E5M2: return "e5m2";
  case CUDA_R_16BF: return "bf16";
  case CUDA_R_32F: return "f32";
  default: return "?";
  }
}
size_t typeBytes(cudaDataType t) {
  return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1;
}

void probe(cublasLtHandle_t lt, const Form &f, void *ws, size_t wsBytes, char *pool) {
  bool fp8 = f.lhs != CUDA_R_16BF;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
  // Device buffers carved from one pool: W (A), X (B), C/D, bias, aux, scales.
  char *p = pool;
  auto take = [&](size_t bytes) {
    char *r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  void *a = take(f.n * f.k * typeBytes(f.rhs));
  void *b = take(f.m * f.k * typeBytes(f.lhs));
  void *d = take(f.m * f.n * typeBytes(f.out));
  void *bias = take(f.n * 4);
  void *aux = take(f.m * f.n * 4);
  float *scales = reinterpret_cast<float *>(take(64));
  if (fp8 && !std::getenv("PROBE_NO_SCALES")) {
    // cuBLASLt refuses (NOT_SUPPORTED at the call, not in the heuristic)
    // scale pointers that are not 16-byte aligned: PROBE_SCALE_GAP=1 shows it.
    const char *gap = std::getenv("PROBE_SCALE_GAP");
    void *sa = scales, *sb = scales + (gap ? std::atoi(gap) : 4);
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    int8_t fast = 1; // fast accumulation off would be 0 (TE uses 0 for gradients)
    if (!std::getenv("PROBE_NO_FAST"))
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  cublasLtEpilogue_t epi = f.epi == Epi::GeluAuxBias                        ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                           : (f.epi == Epi::Bias || f.epi == Epi::BiasOnly) ? CUBLASLT_EPILOGUE_BIAS
                                                                            : CUBLASLT_EPILOGUE_DEFAULT;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (f.epi != Epi::None && f.epi != Epi::FullC) {
    // The bias in the output's type for bf16 D; bf16 for fp8 with f32 D is
    // what the docs list, so try the output's type first (Forge's choice).
    cudaDataType bt = std::getenv("PROBE_BIAS_BF16") ? CUDA_R_16BF : f.out;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (f.epi == Epi::GeluAuxBias) {
    long ld = f.n;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                      sizeof aux));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    if (fp8) {
      cudaDataType at = CUDA_R_16BF;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                        sizeof at));
    }
  }
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, f.rhs, f.k, f.n, f.k));
  CK(cublasLtMatrixLayoutCreate(&lb, f.lhs, f.k, f.m, f.k));
  CK(cublasLtMatrixLayoutCreate(&lc, f.out, f.n, f.m, f.n));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
                                          sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, res, &found);
  double flops = 2.0 * f.m * f.n * f.k;
  std::printf("%-14s %6ld x %5ld x %5ld  %s.%s -> %s  %-14s", f.name, f.m, f.n, f.k,
              typeName(f.lhs), typeName(f.rhs), typeName(f.out), epiName(f.epi));
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    std::printf("  NOT TAKEN (status %d, %d algorithms)\n", int(hs), found);
  } else {
    float alpha = 1, beta = f.epi == Epi::Bias || f.epi == Epi::FullC ? 1.f : 0.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < found; ++i) {
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      for (int w = 0; w < 3 && st == CUBLAS_STATUS_SUCCESS; ++w)
        st = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &res[i].algo, ws,
                            wsBytes, 0);
      if (st != CUBLAS_STATUS_SUCCESS) {
        if (i == 0) {
          std::printf(" [run: %s", cublasLtGetStatusString(st));
          // The same with C apart from D (is in-place refused?).
          st = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, aux, lc, d, lc, &res[i].algo,
                              ws, wsBytes, 0);
          std::printf("; C apart: %s]", cublasLtGetStatusString(st));
        }
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
      if (ms / reps < best)
        best = ms / reps;
    }
    std::printf("  %d algos  best %.4f ms  %.0f TFLOP/s\n", found, best, flops / best / 1e9);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
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
  size_t poolBytes = size_t(12) << 30;
  CK(cudaMalloc(&pool, poolBytes));
  CK(cudaMemset(pool, 0, poolBytes));
  float ones[16];
  for (float &o : ones)
    o = 1.0f;
  // GPT-2 124M at B16 T1024: M = 16384 tokens, C = 768, V = 50304.
  const long M = 16384, C = 768, V = 50304;
  const cudaDataType e4 = CUDA_R_8F_E4M3, e5 = CUDA_R_8F_E5M2, bf = CUDA_R_16BF, f32 = CUDA_R_32F;
  std::vector<Form> forms = {
      // forward linears (x . W^T): qkv, attention proj (+ residual, bias), fc (GELU), fc proj
      {"qkv", M, 3 * C, C, bf, bf, bf, Epi::None},
      {"qkv", M, 3 * C, C, e4, e4, bf, Epi::None},
      {"attn_proj", M, C, C, bf, bf, f32, Epi::Bias},
      {"attn_proj", M, C, C, e4, e4, f32, Epi::Bias},
      {"attn_proj", M, C, C, e4, e4, f32, Epi::None},
      {"attn_proj", M, C, C, e4, e4, f32, Epi::FullC},
      {"attn_proj", M, C, C, e4, e4, f32, Epi::BiasOnly},
      {"attn_proj", M, C, C, e4, e4, bf, Epi::BiasOnly},
      {"qkv", M, 3 * C, C, e4, e4, bf, Epi::BiasOnly},
      {"qkv", M, 3 * C, C, bf, bf, bf, Epi::BiasOnly},
      {"fc", M, 4 * C, C, bf, bf, bf, Epi::GeluAuxBias},
      {"fc", M, 4 * C, C, e4, e4, bf, Epi::GeluAuxBias},
      {"fc", M, 4 * C, C, e4, e4, bf, Epi::None},
      {"fc_proj", M, C, 4 * C, bf, bf, f32, Epi::Bias},
      {"fc_proj", M, C, 4 * C, e4, e4, f32, Epi::Bias},
      {"fc_proj", M, C, 4 * C, e4, e4, f32, Epi::FullC},
      {"lm_head", M, V, C, bf, bf, f32, Epi::None},
      {"lm_head", M, V, C, e4, e4, f32, Epi::None},
      {"lm_head", M, V, C, e4, e4, bf, Epi::None},
      // gradients: dX = dY . W (W^T copy stored [K,N]); dW = dY^T X (both transposed copies)
      {"dx_fc_proj", M, 4 * C, C, bf, bf, bf, Epi::None},
      {"dx_fc_proj", M, 4 * C, C, e5, e4, bf, Epi::None},
      {"dw_fc", 4 * C, C, M, bf, bf, f32, Epi::None},
      {"dw_fc", 4 * C, C, M, e5, e4, f32, Epi::None},
      {"dx_lm_head", M, C, V, bf, bf, bf, Epi::None},
      {"dx_lm_head", M, C, V, e5, e4, bf, Epi::None},
  };
  CK(cudaMemcpy(pool + poolBytes - 256, ones, sizeof ones, cudaMemcpyHostToDevice));
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
