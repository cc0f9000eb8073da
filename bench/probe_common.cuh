// What the hand-written kernel probes (bench/*_probe.cu) share: the CUDA error check, four
// floats rounded and packed into one 8-byte store, the event timing of a launch and a row's
// normalization moments for the references.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));              \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

/// a, b, c, d rounded to bf16 (nearest even), as one 8-byte word.
__device__ __forceinline__ uint2 packBf16(float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  return {*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi)};
}

/// a, b, c, d rounded to f16, as one 8-byte word.
__device__ __forceinline__ uint2 packF16(float a, float b, float c, float d) {
  __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
  return {*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi)};
}

/// Milliseconds one `launch()` takes on the default stream: `iters` launches timed back to
/// back by two events (after `warmup` untimed ones), averaged.
template <class Launch> float msPerRun(int iters, Launch &&launch, int warmup = 0) {
  for (int i = 0; i < warmup; ++i)
    launch();
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i)
    launch();
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return ms / iters;
}

/// The mean and 1 / sqrt(variance + eps) of a row of n floats, in double (two passes, as
/// the CPU's normalization kernels): the layer norm probes' references.
inline void rowMoments(const float *x, int n, double eps, double &mean, double &rstd) {
  mean = 0;
  for (int c = 0; c < n; ++c)
    mean += x[c];
  mean /= n;
  double var = 0;
  for (int c = 0; c < n; ++c)
    var += (x[c] - mean) * (x[c] - mean);
  rstd = 1.0 / std::sqrt(var / n + eps);
}
