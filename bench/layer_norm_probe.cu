// layer_norm_probe: GPT-2's layer norm forward in bf16 training (f32 residual stream in, the
// normalized rows out as bf16 for the next GEMM, f32 scale and bias) as the generated kernel
// does it and in the form of llm.c's fast layer norms, against a read-once/write-once copy.
//
// Why (#11 item 5): on an H100 the generated kernel (compiler/lib/Codegen/Normalization.cpp,
// layerNormKernel: one 128-thread block a row, the row in registers, scalar loads and 2-byte
// stores, two block reductions with barriers) runs GPT-2's 25 calls in 0.75 ms at 2.5 TB/s of
// compulsory traffic (16384 x 768: 50 MB read, 25 MB written). Variants:
//   1  the generated kernel's form: a block of 128 a row, 6 scalar loads a thread
//   2  a warp a row (8 rows a 256-thread block): 6 float4 loads a lane, shuffles only, one
//      8-byte bf16 store a vector
//   3  as 2 with 4 rows a 128-thread block
//   4  roofline: read f32, write bf16, nothing else
// Each is checked against a double reference on sampled rows (2^-8 relative to the row's
// largest |y| plus bf16 rounding).
//
// Build: nvcc -std=c++17 -O3 -arch=sm_90 bench/layer_norm_probe.cu -o layer_norm_probe
// Run:   ./layer_norm_probe [rows]   (default 16384: GPT-2 B16 T1024)
#include "probe_common.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kCols = 768;
constexpr float kEps = 1e-5f;

__device__ float blockSum128(float v, float *sm) {
  for (int o = 16; o; o /= 2)
    v += __shfl_xor_sync(~0u, v, o);
  if (threadIdx.x % 32 == 0)
    sm[threadIdx.x / 32] = v;
  __syncthreads();
  float t = sm[0] + sm[1] + sm[2] + sm[3];
  __syncthreads();
  return t;
}

// Variant 1: a 128-thread block a row, 6 columns a thread (c = tid + 128 t).
__global__ void __launch_bounds__(128)
    blockRow(const float *x, const float *w, const float *b, __nv_bfloat16 *y, int rows) {
  __shared__ float sm[4];
  const float *xr = x + size_t(blockIdx.x) * kCols;
  float v[6];
  for (int t = 0; t < 6; ++t)
    v[t] = xr[threadIdx.x + 128 * t];
  float s = 0;
  for (int t = 0; t < 6; ++t)
    s += v[t];
  float mean = blockSum128(s, sm) / kCols;
  float q = 0;
  for (int t = 0; t < 6; ++t)
    q += (v[t] - mean) * (v[t] - mean);
  float rstd = rsqrtf(blockSum128(q, sm) / kCols + kEps);
  for (int t = 0; t < 6; ++t) {
    int c = threadIdx.x + 128 * t;
    y[size_t(blockIdx.x) * kCols + c] = __float2bfloat16((v[t] - mean) * rstd * w[c] + b[c]);
  }
}

// Variants 2 and 3: a warp a row; lane l holds float4s l, l + 32, ..., l + 160.
template <int ROWS>
__global__ void __launch_bounds__(32 * ROWS)
    warpRow(const float *x, const float *w, const float *b, __nv_bfloat16 *y, int rows) {
  int row = blockIdx.x * ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  const float4 *xr = reinterpret_cast<const float4 *>(x + size_t(row) * kCols);
  float4 v[6];
#pragma unroll
  for (int t = 0; t < 6; ++t)
    v[t] = xr[lane + 32 * t];
  float s = 0;
#pragma unroll
  for (int t = 0; t < 6; ++t)
    s += (v[t].x + v[t].y) + (v[t].z + v[t].w);
  for (int o = 16; o; o /= 2)
    s += __shfl_xor_sync(~0u, s, o);
  const float mean = s / kCols;
  float q = 0;
#pragma unroll
  for (int t = 0; t < 6; ++t) {
    float a = v[t].x - mean, c = v[t].y - mean, d = v[t].z - mean, e = v[t].w - mean;
    q += (a * a + c * c) + (d * d + e * e);
  }
  for (int o = 16; o; o /= 2)
    q += __shfl_xor_sync(~0u, q, o);
  const float rstd = rsqrtf(q / kCols + kEps);
  uint2 *yr = reinterpret_cast<uint2 *>(y + size_t(row) * kCols);
#pragma unroll
  for (int t = 0; t < 6; ++t) {
    int i = lane + 32 * t;
    float4 ww = reinterpret_cast<const float4 *>(w)[i], bb = reinterpret_cast<const float4 *>(b)[i];
    yr[i] = packBf16((v[t].x - mean) * rstd * ww.x + bb.x, (v[t].y - mean) * rstd * ww.y + bb.y,
                     (v[t].z - mean) * rstd * ww.z + bb.z, (v[t].w - mean) * rstd * ww.w + bb.w);
  }
}

// Variant 4 (no statistics: the roofline): x read once, written as bf16.
__global__ void __launch_bounds__(256)
    stream(const float *x, const float *, const float *, __nv_bfloat16 *y, int rows) {
  size_t n = size_t(rows) * kCols / 4;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 v = reinterpret_cast<const float4 *>(x)[i];
    uint2 u = packBf16(v.x, v.y, v.z, v.w);
    reinterpret_cast<uint2 *>(y)[i] = u;
  }
}

struct Variant {
  const char *name;
  void (*kernel)(const float *, const float *, const float *, __nv_bfloat16 *, int);
  int block, rowsPerBlock; // rowsPerBlock 0: a grid of 4 blocks an SM (the stream)
};

} // namespace

int main(int argc, char **argv) {
  int rows = argc > 1 ? std::atoi(argv[1]) : 16384;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; %d rows of %d\n", prop.name, prop.multiProcessorCount, rows, kCols);
  size_t n = size_t(rows) * kCols;
  std::vector<float> hx(n), hw(kCols), hb(kCols);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < n; ++i)
    hx[i] =
        3.f * nd(rng) + 0.5f * float(i % kCols) / kCols; // a per-column offset, as residuals have
  for (int c = 0; c < kCols; ++c) {
    hw[c] = 1.f + 0.1f * nd(rng);
    hb[c] = 0.1f * nd(rng);
  }
  float *x, *w, *b;
  __nv_bfloat16 *y;
  CHECK(cudaMalloc(&x, n * 4));
  CHECK(cudaMalloc(&w, kCols * 4));
  CHECK(cudaMalloc(&b, kCols * 4));
  CHECK(cudaMalloc(&y, n * 2));
  CHECK(cudaMemcpy(x, hx.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w, hw.data(), kCols * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb.data(), kCols * 4, cudaMemcpyHostToDevice));
  Variant variants[] = {
      {"1 a 128-thread block a row (generated)", blockRow, 128, 1},
      {"2 a warp a row, 8 rows a block, float4", warpRow<8>, 256, 8},
      {"3 a warp a row, 4 rows a block, float4", warpRow<4>, 128, 4},
      {"4 stream (read f32, write bf16; no norm)", stream, 256, 0},
  };
  std::vector<__nv_bfloat16> hy(kCols);
  bool allOk = true;
  for (const Variant &v : variants) {
    int grid = v.rowsPerBlock ? (rows + v.rowsPerBlock - 1) / v.rowsPerBlock
                              : 4 * prop.multiProcessorCount;
    CHECK(cudaMemset(y, 0xff, n * 2));
    v.kernel<<<grid, v.block>>>(x, w, b, y, rows);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    double worst = 0;
    bool roofline = v.kernel == stream;
    for (int i = 0; i < 16 && !roofline; ++i) {
      int r = int((size_t(i) * 7919 + 13) % rows);
      const float *xr = hx.data() + size_t(r) * kCols;
      double mean, rstd;
      rowMoments(xr, kCols, kEps, mean, rstd);
      CHECK(cudaMemcpy(hy.data(), y + size_t(r) * kCols, kCols * 2, cudaMemcpyDeviceToHost));
      std::vector<double> ref(kCols);
      double scale = 0;
      for (int c = 0; c < kCols; ++c) {
        ref[c] = (xr[c] - mean) * rstd * hw[c] + hb[c];
        scale = std::max(scale, std::fabs(ref[c]));
      }
      for (int c = 0; c < kCols; ++c) {
        double got = __bfloat162float(hy[c]);
        double err =
            std::fabs(got - ref[c]) / (std::ldexp(1.0, -8) * (scale * 1e-2 + std::fabs(ref[c])));
        worst = std::max(worst, std::isfinite(got) ? err : 1e30);
      }
    }
    bool ok = roofline || worst <= 1.0;
    allOk &= ok;
    const float ms = msPerRun(50, [&] { v.kernel<<<grid, v.block>>>(x, w, b, y, rows); });
    std::printf("%-42s %7.4f ms  %5.2f TB/s  err %.2f  %s\n", v.name, ms,
                double(n) * 6 / (ms * 1e9), worst,
                roofline ? "(no check)"
                : ok     ? "ok"
                         : "WRONG");
  }
  return allOk ? 0 : 1;
}
