// What the hand-written kernel probes (bench/*_probe.cu) share: the CUDA error check and
// four floats rounded and packed into one 8-byte store.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
