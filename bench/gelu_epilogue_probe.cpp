// gelu_epilogue_probe: what cuBLASLt's GELU_AUX_BIAS and DGELU epilogues compute
// in bf16, against the tanh-approximated GELU that GPT-2 exports (and the exact,
// erf-based one), computed in double from the same f32 accumulators -- #11's
// numerics: Forge's bf16 GPT-2 uses these epilogues by default.
//
// Forward (fc1 of GPT-2 124M, 4096 tokens): h = W x in f32 (a DEFAULT GEMM with
// an f32 D), then GELU_AUX_BIAS with a bf16 bias writes D = bf16(gelu(h + b))
// and aux = bf16(h + b). Backward: g = dY W2 in f32, then DGELU writes
// D = bf16(g * gelu'(aux)). Each output is compared with the bf16 rounding of
// the double reference: the share of elements equal to it, the mean signed
// and the RMS error in units of the reference's bf16 ulp (a correctly rounded
// result: 100% equal, mean 0, RMS 0; rounding a different function shows as a
// mean away from 0). Two approximations in the reference, both far below what
// it tells apart: h comes from a separate DEFAULT GEMM, whose algorithm (and
// so its f32 summation order) may differ from the epilogue GEMM's, and the
// double is rounded to bf16 through float (a double rounding at ties).
//
// Build (either machine; host code only), one line:
//   g++ -O2 -std=c++17 bench/gelu_epilogue_probe.cpp -I/usr/local/cuda/include
//   -L/usr/local/cuda/lib64 -lcublasLt -lcudart -o gelu_epilogue_probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
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

uint16_t toBf16(float f) { // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float fromBf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double ulpOf(double v) { // the bf16 ulp at v (8 significant bits)
  int e;
  std::frexp(v == 0 ? 1e-30 : v, &e);
  return std::ldexp(1.0, e - 8);
}

const double kC = std::sqrt(2.0 / M_PI);
double geluTanh(double x) { return 0.5 * x * (1 + std::tanh(kC * (x + 0.044715 * x * x * x))); }
double geluErf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double dGeluTanh(double x) {
  double u = kC * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kC * (1 + 3 * 0.044715 * x * x);
}
double dGeluErf(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

struct Stats {
  long n = 0, equal = 0;
  double sum = 0, sq = 0;
  void add(float got, double ref) {
    double u = ulpOf(ref), e = (got - ref) / u;
    ++n;
    equal += toBf16(static_cast<float>(ref)) == toBf16(got);
    sum += e;
    sq += e * e;
  }
  void print(const char *what) const {
    std::printf("  %-40s equal %6.2f%%  mean %+.4f ulp  rms %.4f ulp\n", what, 100.0 * equal / n,
                sum / n, std::sqrt(sq / n));
  }
};

// D[rows, cols] (column-major) = A[rows, k] B[k, cols], bf16 operands, f32 compute.
void gemm(cublasLtHandle_t lt, long rows, long cols, long k, const void *a, const void *b, void *d,
          cudaDataType dType, cublasLtEpilogue_t epi, const void *bias, void *aux, void *ws,
          size_t wsBytes) {
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) {
    cudaDataType bt = CUDA_R_16BF;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (aux) {
    long ld = rows;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                      sizeof aux));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, rows, k, rows));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, cols, k));
  CK(cublasLtMatrixLayoutCreate(&ld, dType, rows, cols, rows));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
                                          sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found));
  if (found == 0) {
    std::fprintf(stderr, "no algorithm for epilogue %d\n", int(epi));
    std::exit(1);
  }
  float alpha = 1, beta = 0;
  CK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &res.algo, ws, wsBytes, 0));
  CK(cudaDeviceSynchronize());
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

std::vector<uint16_t> randomBf16(size_t n, double stddev, std::mt19937 &rng) {
  std::normal_distribution<float> dist(0.f, static_cast<float>(stddev));
  std::vector<uint16_t> v(n);
  for (auto &x : v)
    x = toBf16(dist(rng));
  return v;
}

template <class T> void *upload(const std::vector<T> &v) {
  void *p;
  CK(cudaMalloc(&p, v.size() * sizeof(T)));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T> std::vector<T> download(const void *p, size_t n) {
  std::vector<T> v(n);
  CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

} // namespace

int main() {
  const long rows = 3072, cols = 4096, k = 768; // fc1: 3072 features x 4096 tokens
  std::mt19937 rng(7);
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t wsBytes = 32 << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsBytes));
  const size_t n = static_cast<size_t>(rows) * cols;

  // Forward: pre-activations ~ N(0, 1.5^2), a bias ~ N(0, 0.3^2).
  auto w = randomBf16(rows * k, 1.5 / std::sqrt(double(k)), rng);
  auto x = randomBf16(k * cols, 1.0, rng);
  auto bias = randomBf16(rows, 0.3, rng);
  void *dw = upload(w), *dx = upload(x), *db = upload(bias);
  void *dh, *dd, *daux;
  CK(cudaMalloc(&dh, n * 4));
  CK(cudaMalloc(&dd, n * 2));
  CK(cudaMalloc(&daux, n * 2));
  gemm(lt, rows, cols, k, dw, dx, dh, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, ws,
       wsBytes);
  gemm(lt, rows, cols, k, dw, dx, dd, CUDA_R_16BF, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, db, daux, ws,
       wsBytes);
  auto h = download<float>(dh, n);
  auto d = download<uint16_t>(dd, n);
  auto aux = download<uint16_t>(daux, n);
  Stats auxS, tanhS, erfS, tanhOfAuxS;
  for (size_t i = 0; i < n; ++i) {
    double pre = double(h[i]) + fromBf16(bias[i % rows]);
    auxS.add(fromBf16(aux[i]), pre);
    tanhS.add(fromBf16(d[i]), geluTanh(pre));
    erfS.add(fromBf16(d[i]), geluErf(pre));
    tanhOfAuxS.add(fromBf16(d[i]), geluTanh(fromBf16(aux[i])));
  }
  std::printf("GELU_AUX_BIAS, bf16 D and aux, D[%ld x %ld] k %ld:\n", rows, cols, k);
  auxS.print("aux vs h + b");
  tanhS.print("D vs gelu_tanh(h + b)");
  erfS.print("D vs gelu_erf(h + b)");
  tanhOfAuxS.print("D vs gelu_tanh(aux) (GELU of the rounded h)");

  // Backward: g = dY W2 ~ N(0, 1), D = g * gelu'(aux).
  auto w2 = randomBf16(rows * k, 1.0 / std::sqrt(double(k)), rng);
  auto dy = randomBf16(k * cols, 1.0, rng);
  void *dw2 = upload(w2), *ddy = upload(dy);
  gemm(lt, rows, cols, k, dw2, ddy, dh, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, ws,
       wsBytes);
  gemm(lt, rows, cols, k, dw2, ddy, dd, CUDA_R_16BF, CUBLASLT_EPILOGUE_DGELU, nullptr, daux, ws,
       wsBytes);
  auto g = download<float>(dh, n);
  auto dg = download<uint16_t>(dd, n);
  Stats dTanh, dErf;
  for (size_t i = 0; i < n; ++i) {
    double a = fromBf16(aux[i]);
    dTanh.add(fromBf16(dg[i]), g[i] * dGeluTanh(a));
    dErf.add(fromBf16(dg[i]), g[i] * dGeluErf(a));
  }
  std::printf("DGELU, bf16 D, aux from above:\n");
  dTanh.print("D vs g * gelu_tanh'(aux)");
  dErf.print("D vs g * gelu_erf'(aux)");
  return 0;
}
