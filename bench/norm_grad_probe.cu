// norm_grad_probe: GPT-2's fused layer-norm gradient region in bf16 training (forge-fuse-
// norm-grad-epilogues: layer_norm_grad, the residual gradient added, the sum cast to bf16 for
// the next GEMM and summed over tokens for the previous bias) as the generated kernel does it
// and with vector accesses, against a copy of the same bytes.
//
// Why (#11 item 5): on an H100 the generated kernel (compiler/lib/Codegen/Normalization.cpp,
// layerNormGradKernel with an epilogue) takes 1.97 ms for GPT-2's 23 calls at 2.65 TB/s of
// compulsory traffic: x, dy and the residual gradient r read (f32, 16384 x 768: 150 MB),
// out = dx + r written f32 and bf16 (75 MB). Per call:
//   dscale += dy xhat, dbias += dy, dsum += out (column sums over the rows, f32 atomics),
//   dx = rstd (w dy - mean(w dy) - xhat mean(w dy xhat)), out = dx + r.
// Variants (each a block takes `rows / (4 SMs)` consecutive rows, its column sums in
// registers, one atomic a column a block at the end, the next row's loads issued before the
// current row's reductions, as the generated kernel does):
//   1  the generated form: 128 threads, 6 scalar columns a thread (c = tid + 128 t)
//   2  192 threads, one float4 of the row a thread (c = 4 tid)
//   3  roofline: x, dy, r read as float4, out written f32 and bf16, nothing else
// Checked against a double reference: out on sampled rows, the column sums over all rows
// (relative to their RMS).
//
// Build: nvcc -std=c++17 -O3 -arch=sm_90 bench/norm_grad_probe.cu -o norm_grad_probe
// Run:   ./norm_grad_probe [rows]   (default 16384: GPT-2 B16 T1024)
#include "probe_common.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kCols = 768;
constexpr float kEps = 1e-5f;

struct Args {
  const float *x, *w, *dy, *r;
  float *dscale, *dbias, *dsum, *out;
  __nv_bfloat16 *outLow;
  int rows, perBlock;
};

// Block sums of two values (every thread gets both); `sm` holds 2 x 32 floats.
template <int BLOCK> __device__ float2 blockSum2(float a, float b, float *sm) {
  for (int o = 16; o; o /= 2) {
    a += __shfl_xor_sync(~0u, a, o);
    b += __shfl_xor_sync(~0u, b, o);
  }
  constexpr int warps = BLOCK / 32;
  if (threadIdx.x % 32 == 0) {
    sm[threadIdx.x / 32] = a;
    sm[32 + threadIdx.x / 32] = b;
  }
  __syncthreads();
  float2 t = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < warps; ++i) {
    t.x += sm[i];
    t.y += sm[32 + i];
  }
  __syncthreads();
  return t;
}

// Variant 1: 128 threads, columns c = tid + 128 t (t < 6).
__global__ void __launch_bounds__(128) scalarRows(Args a) {
  __shared__ float sm[64];
  constexpr int P = 6;
  const int first = blockIdx.x * a.perBlock, last = min(first + a.perBlock, a.rows);
  float w[P], ds[P] = {}, db[P] = {}, dsu[P] = {};
  for (int t = 0; t < P; ++t)
    w[t] = a.w[threadIdx.x + 128 * t];
  float x[P], dy[P], r[P];
  auto load = [&](int row, float *xx, float *yy, float *rr) {
    for (int t = 0; t < P; ++t) {
      size_t i = size_t(row) * kCols + threadIdx.x + 128 * t;
      xx[t] = a.x[i];
      yy[t] = a.dy[i];
      rr[t] = a.r[i];
    }
  };
  if (first < last)
    load(first, x, dy, r);
  for (int row = first; row < last; ++row) {
    float nx[P], ndy[P], nr[P];
    if (row + 1 < last)
      load(row + 1, nx, ndy, nr);
    float s = 0, q = 0;
    for (int t = 0; t < P; ++t)
      s += x[t];
    float mean = blockSum2<128>(s, 0.f, sm).x / kCols;
    for (int t = 0; t < P; ++t)
      q += (x[t] - mean) * (x[t] - mean);
    float rstd = rsqrtf(blockSum2<128>(q, 0.f, sm).x / kCols + kEps);
    float g = 0, gx = 0;
    for (int t = 0; t < P; ++t) {
      float xh = (x[t] - mean) * rstd, wd = w[t] * dy[t];
      g += wd;
      gx += wd * xh;
    }
    float2 sums = blockSum2<128>(g, gx, sm);
    float mg = sums.x / kCols, mgx = sums.y / kCols;
    for (int t = 0; t < P; ++t) {
      float xh = (x[t] - mean) * rstd;
      float o = rstd * (w[t] * dy[t] - mg - xh * mgx) + r[t];
      size_t i = size_t(row) * kCols + threadIdx.x + 128 * t;
      a.out[i] = o;
      a.outLow[i] = __float2bfloat16(o);
      ds[t] += dy[t] * xh;
      db[t] += dy[t];
      dsu[t] += o;
    }
    if (row + 1 < last)
      for (int t = 0; t < P; ++t) {
        x[t] = nx[t];
        dy[t] = ndy[t];
        r[t] = nr[t];
      }
  }
  for (int t = 0; t < P; ++t) {
    int c = threadIdx.x + 128 * t;
    atomicAdd(&a.dscale[c], ds[t]);
    atomicAdd(&a.dbias[c], db[t]);
    atomicAdd(&a.dsum[c], dsu[t]);
  }
}

// Variant 2: 192 threads, one float4 a thread (columns 4 tid .. 4 tid + 3).
__global__ void __launch_bounds__(192) vectorRows(Args a) {
  __shared__ float sm[64];
  const int first = blockIdx.x * a.perBlock, last = min(first + a.perBlock, a.rows);
  const float4 w = reinterpret_cast<const float4 *>(a.w)[threadIdx.x];
  float4 ds = {}, db = {}, dsu = {};
  auto at = [&](const float *p, int row) {
    return reinterpret_cast<const float4 *>(p + size_t(row) * kCols)[threadIdx.x];
  };
  float4 x = {}, dy = {}, r = {};
  if (first < last) {
    x = at(a.x, first);
    dy = at(a.dy, first);
    r = at(a.r, first);
  }
  for (int row = first; row < last; ++row) {
    float4 nx = {}, ndy = {}, nr = {};
    if (row + 1 < last) {
      nx = at(a.x, row + 1);
      ndy = at(a.dy, row + 1);
      nr = at(a.r, row + 1);
    }
    float mean = blockSum2<192>((x.x + x.y) + (x.z + x.w), 0.f, sm).x / kCols;
    float4 d = {x.x - mean, x.y - mean, x.z - mean, x.w - mean};
    float rstd = rsqrtf(
        blockSum2<192>((d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w), 0.f, sm).x / kCols +
        kEps);
    float4 xh = {d.x * rstd, d.y * rstd, d.z * rstd, d.w * rstd};
    float4 wd = {w.x * dy.x, w.y * dy.y, w.z * dy.z, w.w * dy.w};
    float2 sums = blockSum2<192>((wd.x + wd.y) + (wd.z + wd.w),
                                 (wd.x * xh.x + wd.y * xh.y) + (wd.z * xh.z + wd.w * xh.w), sm);
    float mg = sums.x / kCols, mgx = sums.y / kCols;
    float4 o = {rstd * (wd.x - mg - xh.x * mgx) + r.x, rstd * (wd.y - mg - xh.y * mgx) + r.y,
                rstd * (wd.z - mg - xh.z * mgx) + r.z, rstd * (wd.w - mg - xh.w * mgx) + r.w};
    reinterpret_cast<float4 *>(a.out + size_t(row) * kCols)[threadIdx.x] = o;
    uint2 u = packBf16(o.x, o.y, o.z, o.w);
    reinterpret_cast<uint2 *>(a.outLow + size_t(row) * kCols)[threadIdx.x] = u;
    ds = {ds.x + dy.x * xh.x, ds.y + dy.y * xh.y, ds.z + dy.z * xh.z, ds.w + dy.w * xh.w};
    db = {db.x + dy.x, db.y + dy.y, db.z + dy.z, db.w + dy.w};
    dsu = {dsu.x + o.x, dsu.y + o.y, dsu.z + o.z, dsu.w + o.w};
    x = nx;
    dy = ndy;
    r = nr;
  }
  const int c = 4 * threadIdx.x;
  const float dsv[4] = {ds.x, ds.y, ds.z, ds.w}, dbv[4] = {db.x, db.y, db.z, db.w},
              dsuv[4] = {dsu.x, dsu.y, dsu.z, dsu.w};
  for (int l = 0; l < 4; ++l) {
    atomicAdd(&a.dscale[c + l], dsv[l]);
    atomicAdd(&a.dbias[c + l], dbv[l]);
    atomicAdd(&a.dsum[c + l], dsuv[l]);
  }
}

// Variant 3 (the roofline): the same bytes moved, nothing computed but the sum.
__global__ void __launch_bounds__(256) stream(Args a) {
  size_t n = size_t(a.rows) * kCols / 4;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 x = reinterpret_cast<const float4 *>(a.x)[i],
           dy = reinterpret_cast<const float4 *>(a.dy)[i],
           r = reinterpret_cast<const float4 *>(a.r)[i];
    float4 o = {x.x + dy.x + r.x, x.y + dy.y + r.y, x.z + dy.z + r.z, x.w + dy.w + r.w};
    reinterpret_cast<float4 *>(a.out)[i] = o;
    uint2 u = packBf16(o.x, o.y, o.z, o.w);
    reinterpret_cast<uint2 *>(a.outLow)[i] = u;
  }
}

} // namespace

int main(int argc, char **argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 16384;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs; %d rows of %d\n", prop.name, sms, rows, kCols);
  const size_t n = size_t(rows) * kCols;
  std::vector<float> hx(n), hdy(n), hr(n), hw(kCols);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < n; ++i) {
    hx[i] = 2.f * nd(rng) + 0.3f * float(i % kCols) / kCols;
    hdy[i] = 1e-3f * nd(rng);
    hr[i] = 1e-3f * nd(rng);
  }
  for (int c = 0; c < kCols; ++c)
    hw[c] = 1.f + 0.1f * nd(rng);
  Args a{};
  float *x, *w, *dy, *r, *cols, *out;
  __nv_bfloat16 *outLow;
  CHECK(cudaMalloc(&x, n * 4));
  CHECK(cudaMalloc(&dy, n * 4));
  CHECK(cudaMalloc(&r, n * 4));
  CHECK(cudaMalloc(&out, n * 4));
  CHECK(cudaMalloc(&outLow, n * 2));
  CHECK(cudaMalloc(&w, kCols * 4));
  CHECK(cudaMalloc(&cols, 3 * kCols * 4));
  CHECK(cudaMemcpy(x, hx.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, hdy.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(r, hr.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w, hw.data(), kCols * 4, cudaMemcpyHostToDevice));
  a = {x, w, dy, r, cols, cols + kCols, cols + 2 * kCols, out, outLow, rows, 0};
  a.perBlock = std::max(1, std::min(64, rows / (4 * sms)));
  const int rowGrid = (rows + a.perBlock - 1) / a.perBlock;
  // The reference: out on 8 rows, the column sums over every row (double).
  std::vector<double> refCols(3 * kCols, 0.0);
  std::vector<std::vector<double>> refOut;
  std::vector<int> sample;
  for (int i = 0; i < 8; ++i)
    sample.push_back(int((size_t(i) * 7919 + 13) % rows));
  // refOut is filled in row order, so the sample must be in row order too.
  std::sort(sample.begin(), sample.end());
  sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  for (int row = 0; row < rows; ++row) {
    const float *xr = &hx[size_t(row) * kCols], *yr = &hdy[size_t(row) * kCols],
                *rr = &hr[size_t(row) * kCols];
    double mean, rstd, g = 0, gx = 0;
    rowMoments(xr, kCols, kEps, mean, rstd);
    for (int c = 0; c < kCols; ++c) {
      double xh = (xr[c] - mean) * rstd;
      g += hw[c] * yr[c];
      gx += hw[c] * yr[c] * xh;
    }
    g /= kCols;
    gx /= kCols;
    bool keep = std::find(sample.begin(), sample.end(), row) != sample.end();
    if (keep)
      refOut.emplace_back(kCols);
    for (int c = 0; c < kCols; ++c) {
      double xh = (xr[c] - mean) * rstd;
      double o = rstd * (hw[c] * yr[c] - g - xh * gx) + rr[c];
      refCols[c] += yr[c] * xh;
      refCols[kCols + c] += yr[c];
      refCols[2 * kCols + c] += o;
      if (keep)
        refOut.back()[c] = o;
    }
  }
  struct Variant {
    const char *name;
    void (*kernel)(Args);
    int block, grid;
  } variants[] = {
      {"1 128 threads, 6 scalar columns (generated)", scalarRows, 128, rowGrid},
      {"2 192 threads, one float4 a thread", vectorRows, 192, rowGrid},
      {"3 stream (same bytes, no norm)", stream, 256, 4 * sms},
  };
  bool allOk = true;
  std::vector<float> hc(3 * kCols), ho(kCols);
  for (const Variant &v : variants) {
    CHECK(cudaMemset(cols, 0, 3 * kCols * 4));
    v.kernel<<<v.grid, v.block>>>(a);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    bool roofline = v.kernel == stream;
    double worstOut = 0, worstCols = 0;
    if (!roofline) {
      CHECK(cudaMemcpy(hc.data(), cols, 3 * kCols * 4, cudaMemcpyDeviceToHost));
      for (int k = 0; k < 3; ++k) {
        double rms = 0;
        for (int c = 0; c < kCols; ++c)
          rms += refCols[k * kCols + c] * refCols[k * kCols + c];
        rms = std::sqrt(rms / kCols);
        for (int c = 0; c < kCols; ++c)
          worstCols =
              std::max(worstCols, std::fabs(hc[k * kCols + c] - refCols[k * kCols + c]) / rms);
      }
      for (size_t i = 0; i < sample.size(); ++i) {
        CHECK(cudaMemcpy(ho.data(), out + size_t(sample[i]) * kCols, kCols * 4,
                         cudaMemcpyDeviceToHost));
        double rms = 0;
        for (int c = 0; c < kCols; ++c)
          rms += refOut[i][c] * refOut[i][c];
        rms = std::sqrt(rms / kCols);
        for (int c = 0; c < kCols; ++c)
          worstOut = std::max(worstOut, std::fabs(ho[c] - refOut[i][c]) / rms);
      }
    }
    bool ok = roofline || (worstOut < 1e-4 && worstCols < 1e-4);
    allOk &= ok;
    const float ms = msPerRun(30, [&] {
      CHECK(cudaMemsetAsync(cols, 0, 3 * kCols * 4)); // as the runtime zeroes them
      v.kernel<<<v.grid, v.block>>>(a);
    });
    std::printf("%-44s %7.4f ms  %5.2f TB/s  out err %.1e  column sums err %.1e  %s\n", v.name, ms,
                double(n) * 18 / (ms * 1e9), worstOut, worstCols,
                roofline ? "(no check)"
                : ok     ? "ok"
                         : "WRONG");
  }
  return allOk ? 0 : 1;
}
