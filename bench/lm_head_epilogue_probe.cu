// lm_head_epilogue_probe: whether GPT-2's LM head GEMM can write the loss kernel's f16
// e = exp(x - group max) (plus per-group (max, sum) partials) from a CUTLASS 4.2 sm90 epilogue
// instead of f32 logits, and what the loss then costs as a streaming kernel.
//
// Why (#11, docs/lm-head-epilogue-plan.md): today cuBLASLt writes the f32 logits (2.15 ms on an
// H100 for 16384 tokens x 50264 padded classes, K 768) and the on-chip loss kernel
// (Loss.cpp, crossEntropyOnChipKernel) reads them back for lse and the bf16 gradient. CUTLASS
// measured (bench/cutlass_epilogue_probe.cu, same GPU, M = vocab, N = tokens, column-major D):
// f32 D 2.335 ms (ping-pong 128x128), bf16 D 1.936 ms. The epilogue needs the other
// orientation (a token's logits along N, so that a quad of lanes holds a row's columns).
//
// Problem: logits[t, v] = sum_k X[t, k] W[v, k]; GEMM M = 16384 tokens, N = 50264 (columns
// >= 50257 are padding, treated as -inf), K = 768, bf16 A = X and B = W (both K-major), f32
// accumulation, row-major D [tokens, vocab].
// Variants (cluster 1x2 unless said; persistent tile scheduler):
//   1a plain GEMM, f16 D, ping-pong 128x128 (raster heuristic, along M, along N)
//   1b as 1a, cluster 2x1 (W's tile multicast to two token tiles)
//   1c plain GEMM, f16 D, cooperative 128x256
//   2a ping-pong 128x128, epilogue tile 64x32 (auto), a custom EVT root node (ExpGroupStore):
//      per (row, 32-column group a quad holds in one subtile) the max m over valid columns,
//      e = exp2((x - m) log2 e) written back so that the collective stores f16 e, and
//      (m, s = sum e in f32) stored to ms[row][group]; x at the label column captured in f32
//   2b as 2a with a 64x128 epilogue tile: 128-column groups, a quarter of the (m, s) bytes
//   2c as 2a, cooperative 128x256 (epilogue tile 128x32)
//   3  after each 2x: a streaming kernel (no CUTLASS) reading e, (m, s), labels and x_t;
//      lse per row from the (m, s) pairs, loss = lse - x_t, bf16 gradient
//      (e exp(m - lse) - onehot) / rows (the target's from x_t in f32)
// Checks against a double reference from the same bf16 operands: 1x on 2048 sampled
// elements (max error relative to RMS <= 2e-2); 2x and 3 on 16 sampled rows (m and x_t to
// 1e-3, e to 2^-9 relative + 2^-24, s to 1e-3 relative, lse from the pairs and the loss to
// 1e-5 relative, each gradient entry to 2^-7 of itself plus 2^-23 / rows and the row's sum
// to 0 within 2^-7 / rows). Labels are valid classes here (no ignore_index, none in the
// padding): the generated kernel would also need those cases.
//
// Build (CUTLASS headers from the nvidia-cutlass 4.2 wheel), one line:
//   CUT=$(python -c "import
//   cutlass_library,os;print(os.path.dirname(cutlass_library.__file__))")/source nvcc -std=c++17
//   -O3 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG -I$CUT/include
//     -I$CUT/tools/util/include bench/lm_head_epilogue_probe.cu -o lm_head_epilogue_probe
// Run: ./lm_head_epilogue_probe
#include "probe_common.cuh"

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <cutlass/version.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

// Named, not anonymous: `using namespace cute` inside an anonymous namespace makes nvcc's
// host stubs' references to the anonymous namespace ambiguous with cute's.
namespace lm_probe {

constexpr int kTokens = 16384, kVocab = 50264, kValid = 50257, kK = 768;
constexpr float kLog2e = 1.4426950408889634f;

using bf16 = cutlass::bfloat16_t;
using f16 = cutlass::half_t;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;
namespace fusion = cutlass::epilogue::fusion;
using namespace cute;

__device__ __forceinline__ float ex2(float x) {
  float y; // ftz: results below 2^-126 are far under f16's smallest subnormal anyway
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The EVT root node. It relies on the sm90 collective calling reduce() with the subtile's f32
// results (visit_results) before converting them to D, and on the wgmma accumulator layout:
// per subtile a thread holds 2 rows (the same 2 as the other 3 lanes of its quad) and the quad
// together all EPI_N columns of those rows. Coordinates come from tCcD (relative to the
// thread's first element) and residue_tCcD, as the in-tree reduction nodes use them.
struct ExpGroupStore {
  struct SharedStorage {};
  struct Arguments {
    float2 *ms = nullptr;             // [rows][groups]: (group max, sum of e)
    int groups = 0;                   // ms's row stride: >= ceil(N / EPI_N)
    int valid_cols = 0;               // columns >= this are padding (-inf)
    int64_t const *labels = nullptr;  // optional: capture x at the label column ...
    float *xt = nullptr;              // ... into xt[row]
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &args,
                                                  void *) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    return args.ms != nullptr && args.valid_cols <= N && L == 1;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const &, Arguments const &) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const &, Arguments const &, void *,
                                              cudaStream_t, cutlass::CudaHostAdapter * = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE ExpGroupStore() {}
  CUTLASS_HOST_DEVICE ExpGroupStore(Params const &params, SharedStorage const &)
      : params_ptr(&params) {}
  Params const *params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fusion::detail::ProducerLoadArgs<Args...> const &) {
    return fusion::detail::EmptyProducerLoadCallbacks{};
  }

  template <class CTensor, class Residue, int EpiN>
  struct ConsumerStoreCallbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, Residue residue, int M, int N,
                                          Params const *p, int thread_idx)
        : tCcD(tCcD), residue(residue), M(M), N(N), p(p), thread_idx(thread_idx) {}
    CTensor tCcD;
    Residue residue;
    int M, N;
    Params const *p;
    int thread_idx;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const &, int, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const &frg_input) {
      return frg_input;
    }

    // The tile's labels, loaded once in begin(): a load in each reduce() call sat in front of
    // that subtile's max with nothing to hide its latency (the first run: +1.3-2.3 ms).
    static constexpr int kEpiMs = int(decltype(size<3>(cute::declval<CTensor>()))::value);
    int label[kEpiMs][2];

    /// The thread's two rows in subtile row epi_m, relative to the tile (compile-time
    /// offsets after unrolling; the other lanes of the quad hold the same two).
    CUTLASS_DEVICE void rowsOf(int epi_m, int &rel0, int &rel1) const {
      Tensor c = tCcD(_, _, _, epi_m, 0);
      rel0 = int(get<0>(c(0)));
      rel1 = rel0;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < int(size(c)); ++i)
        if (int(get<0>(c(i))) != rel0)
          rel1 = int(get<0>(c(i)));
    }

    CUTLASS_DEVICE void begin() {
      const int baseM = M - int(get<0>(residue));
      CUTLASS_PRAGMA_UNROLL
      for (int em = 0; em < kEpiMs; ++em) {
        int rel0, rel1;
        rowsOf(em, rel0, rel1);
        const int row0 = baseM + rel0, row1 = baseM + rel1;
        label[em][0] = p->labels && row0 < M ? int(p->labels[row0]) : -1;
        label[em][1] = p->labels && row1 < M ? int(p->labels[row1]) : -1;
      }
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor &&, SyncFn const &, int epi_m, int epi_n, bool,
                               VTensor visit_results) {
      using Frag = cute::remove_cvref_t<decltype(visit_results(0))>;
      constexpr int F = int(Frag::kElements);
      constexpr int V = int(decltype(size(visit_results))::value) * F;
      Tensor c = tCcD(_, _, _, epi_m, epi_n); // element i <-> visit_results(i / F)[i % F]
      const int baseM = M - int(get<0>(residue)), baseN = N - int(get<1>(residue));
      int rel0, rel1;
      rowsOf(epi_m, rel0, rel1);
      const int row0 = baseM + rel0, row1 = baseM + rel1;
      const int t0 = label[epi_m][0], t1 = label[epi_m][1]; // -1: no capture
      const int validCols = p->valid_cols;
      float *const xt = p->xt;
      float m0 = -INFINITY, m1 = -INFINITY;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < V; ++i) {
        auto ci = c(i);
        const int col = baseN + int(get<1>(ci));
        const bool second = int(get<0>(ci)) != rel0;
        float x = visit_results(i / F)[i % F];
        const bool valid = elem_less(ci, residue) && col < validCols;
        if (valid && col == (second ? t1 : t0))
          xt[second ? row1 : row0] = x;
        x = valid ? x : -INFINITY;
        visit_results(i / F)[i % F] = x;
        if (second)
          m1 = fmaxf(m1, x);
        else
          m0 = fmaxf(m0, x);
      }
      // The quad's lanes hold the rest of the group's columns.
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
      // An all-padding group: e = exp2(-inf) = 0, s = 0, m = -inf.
      const float sh0 = m0 == -INFINITY ? 0.f : m0 * kLog2e;
      const float sh1 = m1 == -INFINITY ? 0.f : m1 * kLog2e;
      float s0 = 0.f, s1 = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < V; ++i) {
        const bool second = int(get<0>(c(i))) != rel0;
        const float e = ex2(fmaf(visit_results(i / F)[i % F], kLog2e, second ? -sh1 : -sh0));
        visit_results(i / F)[i % F] = e; // the collective rounds it to f16 for D
        if (second)
          s1 += e;
        else
          s0 += e;
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      // Lane 0 of the quad stores row0's pair, lane 1 row1's.
      const int lane = thread_idx % 4;
      const int group = (baseN + int(get<1>(c(0)))) / EpiN;
      const int row = lane == 0 ? row0 : row1;
      if (lane < 2 && row < M && group * EpiN < N)
        p->ms[size_t(row) * p->groups + group] =
            lane == 0 ? make_float2(m0, s0) : make_float2(m1, s1);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const &args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    using EpiTile = cute::remove_cvref_t<decltype(args.epi_tile)>;
    constexpr int EpiN = int(decltype(size<1>(EpiTile{}))::value);
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD), EpiN>(
        args.tCcD, args.residue_tCcD, int(M), int(N), params_ptr, args.thread_idx);
  }
};

using ExpGroupEVT = fusion::Sm90EVT<ExpGroupStore, fusion::Sm90AccFetch>;
using PlainF16 = fusion::LinearCombination<f16, float, void>;

// M = tokens (A = X, K-major), N = vocab (B = W [vocab][K], K-major), row-major f16 D.
template <class Callbacks, bool PingPong, class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto,
          class Cluster = Shape<_1, _2, _1>>
struct LmGemm {
  using Tile = std::conditional_t<PingPong, Shape<_128, _128, _64>, Shape<_128, _256, _64>>;
  using EpilogueSchedule = std::conditional_t<PingPong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using KernelSchedule =
      std::conditional_t<PingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  static constexpr int AlignD = 8;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, float, float,
      void, RowMajor, AlignD, f16, RowMajor, AlignD, EpilogueSchedule, Callbacks>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, RowMajor, 8, bf16, ColMajor, 8,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr int EpiN = int(decltype(size<1>(typename Epilogue::EpilogueTile{}))::value);
};

template <class T> T *upload(const std::vector<T> &h) {
  T *d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T> std::vector<T> download(const T *d, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

int failures = 0;

/// Runs op warmup + timed times; ms per timed run, or -1 if CUTLASS refused it or a launch
/// failed. The outputs hold the last run's results.
template <class G>
float timeGemm(typename G::Op::Arguments args, const char *what, int warmup = 5, int timed = 20) {
  typename G::Op op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    std::printf("  %-44s CUTLASS cannot implement it\n", what);
    return -1;
  }
  size_t wsBytes = G::Op::get_workspace_size(args);
  void *ws = nullptr;
  if (wsBytes)
    CHECK(cudaMalloc(&ws, wsBytes));
  if (op.initialize(args, ws) != cutlass::Status::kSuccess) {
    std::printf("  %-44s initialize failed\n", what);
    return -1;
  }
  bool ran = true;
  const float ms = msPerRun(
      timed, [&] { ran = ran && op.run() == cutlass::Status::kSuccess; }, warmup);
  if (ws)
    cudaFree(ws);
  if (!ran || cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("  %-44s a launch failed\n", what);
    return -1;
  }
  return ms;
}

template <class G> typename G::Op::Arguments baseArgs(const bf16 *dX, const bf16 *dW, f16 *dD) {
  typename G::Op::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {kTokens, kVocab, kK, 1};
  args.mainloop.ptr_A = dX;
  args.mainloop.dA =
      cutlass::make_cute_packed_stride(typename G::Kernel::StrideA{}, {kTokens, kK, 1});
  args.mainloop.ptr_B = dW;
  args.mainloop.dB =
      cutlass::make_cute_packed_stride(typename G::Kernel::StrideB{}, {kVocab, kK, 1});
  args.epilogue.dC =
      cutlass::make_cute_packed_stride(typename G::Kernel::StrideC{}, {kTokens, kVocab, 1});
  args.epilogue.ptr_D = dD;
  args.epilogue.dD =
      cutlass::make_cute_packed_stride(typename G::Kernel::StrideD{}, {kTokens, kVocab, 1});
  return args;
}

double gemmFlops() { return 2.0 * kTokens * kVocab * kK; }
double gemmBytes() { return 2.0 * (double(kTokens) + kVocab) * kK + 2.0 * kTokens * kVocab; }

void printTime(const char *what, float ms, double flops, double bytes, const char *check,
               bool ok) {
  std::printf("  %-44s %7.4f ms  %6.1f TFLOP/s  %6.0f GB/s  %s %s\n", what, ms,
              flops / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9, check, ok ? "ok" : "WRONG");
}

/// The operands (host copies for the reference) and device buffers.
struct Data {
  std::vector<bf16> x, w;  // X [tokens][K], W [vocab][K]
  std::vector<int64_t> labels;
  bf16 *dX = nullptr, *dW = nullptr;
  int64_t *dLabels = nullptr;
  f16 *dD = nullptr;              // [tokens][vocab]: logits (1x) or e (2x)
  float2 *dMs = nullptr;          // [tokens][groups]
  float *dXt = nullptr, *dLoss = nullptr;
  __nv_bfloat16 *dGrad = nullptr; // [tokens][vocab]
  std::vector<int> sample;         // rows checked in full ...
  std::vector<std::vector<double>> ref; // ... and their double logits (valid columns)
  double logit(int t, int v) const {
    double s = 0;
    for (int k = 0; k < kK; ++k)
      s += double(float(x[size_t(t) * kK + k])) * double(float(w[size_t(v) * kK + k]));
    return s;
  }
};

constexpr size_t kDn = size_t(kTokens) * kVocab;
constexpr int kMaxGroups = (kVocab + 31) / 32;

void poisonOutputs(const Data &d) {
  CHECK(cudaMemset(d.dD, 0xFF, kDn * 2));
  CHECK(cudaMemset(d.dMs, 0xFF, size_t(kTokens) * kMaxGroups * 8));
  CHECK(cudaMemset(d.dXt, 0xFF, kTokens * 4));
  CHECK(cudaMemset(d.dLoss, 0xFF, kTokens * 4));
  CHECK(cudaMemset(d.dGrad, 0xFF, kDn * 2));
}

/// Variant 1x: the plain GEMM, checked on 2048 sampled logits.
using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;

template <class G>
void plain(const Data &d, std::mt19937 &rng, const char *what,
           RasterOrder raster = RasterOrder::Heuristic) {
  poisonOutputs(d);
  auto args = baseArgs<G>(d.dX, d.dW, d.dD);
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.scheduler.raster_order = raster;
  float ms = timeGemm<G>(args, what);
  if (ms < 0) {
    ++failures;
    return;
  }
  auto h = download(d.dD, kDn);
  std::uniform_int_distribution<int> pt(0, kTokens - 1), pv(0, kVocab - 1);
  double maxErr = 0, sumSq = 0;
  for (int s = 0; s < 2048; ++s) {
    const int t = pt(rng), v = pv(rng);
    const double ref = d.logit(t, v), got = float(h[size_t(t) * kVocab + v]);
    maxErr = std::isfinite(got) ? std::max(maxErr, std::fabs(got - ref)) : INFINITY;
    sumSq += ref * ref;
  }
  const double rel = maxErr / std::sqrt(sumSq / 2048);
  char check[64];
  std::snprintf(check, sizeof check, "max error %.2e of RMS", rel);
  failures += rel <= 2e-2 ? 0 : 1;
  printTime(what, ms, gemmFlops(), gemmBytes(), check, rel <= 2e-2);
}

struct MS {
  float m, s;
};
__device__ __forceinline__ MS combine(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY)
    return {m, 0.f};
  return {m, a.s * ex2((a.m - m) * kLog2e) + b.s * ex2((b.m - m) * kLog2e)};
}

// Variant 3: one block a row. The per-group factor exp(m_g - lse) / rows goes to shared
// memory, so that the stream does one multiply a logit; the target's gradient comes from x_t
// in f32 (the one entry with cancellation).
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    lossFromGroups(const __half *e, const float2 *ms, int groups, int groupShift,
                   const int64_t *labels, const float *xt, float g, float *loss,
                   __nv_bfloat16 *grad) {
  extern __shared__ float factor[]; // [groups]
  __shared__ float part[2][32];
  const int row = blockIdx.x;
  const float2 *mr = ms + size_t(row) * groups;
  MS acc{-INFINITY, 0.f};
  for (int k = threadIdx.x; k < groups; k += BLOCK) {
    float2 p = mr[k];
    acc = combine(acc, {p.x, p.y});
  }
  for (int o = 16; o; o /= 2)
    acc = combine(acc, {__shfl_xor_sync(~0u, acc.m, o), __shfl_xor_sync(~0u, acc.s, o)});
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    part[0][warp] = acc.m;
    part[1][warp] = acc.s;
  }
  __syncthreads();
  acc = lane < BLOCK / 32 ? MS{part[0][lane], part[1][lane]} : MS{-INFINITY, 0.f};
  for (int o = 16; o; o /= 2)
    acc = combine(acc, {__shfl_xor_sync(~0u, acc.m, o), __shfl_xor_sync(~0u, acc.s, o)});
  const float lse = acc.m + logf(acc.s);
  for (int k = threadIdx.x; k < groups; k += BLOCK) {
    const float m = mr[k].x;
    factor[k] = m == -INFINITY ? 0.f : expf(m - lse) * g;
  }
  const int64_t t = labels[row];
  const float x = xt[row];
  if (threadIdx.x == 0)
    loss[row] = lse - x;
  const float dt = g * (expf(x - lse) - 1.f);
  __syncthreads();
  const uint4 *__restrict__ er = reinterpret_cast<const uint4 *>(e + size_t(row) * kVocab);
  uint4 *__restrict__ dr = reinterpret_cast<uint4 *>(grad + size_t(row) * kVocab);
  constexpr int vectors = kVocab / 8;
#pragma unroll 4
  for (int v = threadIdx.x; v < vectors; v += BLOCK) {
    const uint4 w = er[v];
    const float f = factor[(8 * v) >> groupShift];
    const __half2 *hw = reinterpret_cast<const __half2 *>(&w);
    float o[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 p = __half22float2(hw[j]);
      o[2 * j] = p.x * f;
      o[2 * j + 1] = p.y * f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 8 * v + j;
      o[j] = c == t ? dt : c >= kValid ? 0.f : o[j];
    }
    const uint2 lo = packBf16(o[0], o[1], o[2], o[3]), hi = packBf16(o[4], o[5], o[6], o[7]);
    dr[v] = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

float bf16f(__nv_bfloat16 h) { return __bfloat162float(h); }

/// Variant 2x (and 3 on its outputs).
template <class G> void expEpilogue(const Data &d, const char *what) {
  constexpr int epiN = G::EpiN;
  const int groups = (kVocab + epiN - 1) / epiN;
  poisonOutputs(d);
  auto args = baseArgs<G>(d.dX, d.dW, d.dD);
  // Sm90EVT<node, child>: arguments {child's, node's}.
  args.epilogue.thread = {{}, {d.dMs, groups, kValid, d.dLabels, d.dXt}};
  // First without the target's capture (no label loads: what the capture costs), then with.
  auto bare = args;
  bare.epilogue.thread = {{}, {d.dMs, groups, kValid, nullptr, d.dXt}};
  const float bareMs = timeGemm<G>(bare, what);
  if (bareMs >= 0)
    std::printf("  %-44s %7.4f ms  %6.1f TFLOP/s  (timing only)\n", "  without the target's capture",
                bareMs, gemmFlops() / (bareMs * 1e-3) / 1e12);
  poisonOutputs(d);
  float ms = timeGemm<G>(args, what);
  if (ms < 0) {
    ++failures;
    return;
  }
  // Check e, (m, s), x_t and lse from the pairs on the sampled rows.
  double worstM = 0, worstE = 0, worstS = 0, worstXt = 0, worstLse = 0;
  bool padOk = true;
  std::vector<f16> he(kVocab);
  std::vector<float2> hms(groups);
  auto hxt = download(d.dXt, kTokens);
  for (size_t si = 0; si < d.sample.size(); ++si) {
    const int r = d.sample[si];
    const std::vector<double> &ref = d.ref[si];
    CHECK(cudaMemcpy(he.data(), d.dD + size_t(r) * kVocab, kVocab * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hms.data(), d.dMs + size_t(r) * groups, groups * 8, cudaMemcpyDeviceToHost));
    double rm = -INFINITY;
    for (int v = 0; v < kValid; ++v)
      rm = std::max(rm, ref[v]);
    double rs = 0;
    for (int v = 0; v < kValid; ++v)
      rs += std::exp(ref[v] - rm);
    const double rlse = rm + std::log(rs);
    double gm = -INFINITY, gs = 0; // lse from the GPU's pairs, in double
    for (int gi = 0; gi < groups; ++gi)
      gm = std::max(gm, double(hms[gi].x));
    for (int gi = 0; gi < groups; ++gi) {
      const int lo = gi * epiN, hi = std::min(lo + epiN, kValid);
      const float m = hms[gi].x;
      double refM = -INFINITY, refS = 0;
      for (int v = lo; v < hi; ++v)
        refM = std::max(refM, ref[v]);
      // (no group is all padding: kValid - 1 > (groups - 1) * epiN for 32 and 128)
      worstM = std::max(worstM, std::isfinite(m) ? std::fabs(m - refM) : INFINITY);
      for (int v = lo; v < std::min(lo + epiN, kVocab); ++v) {
        const double got = float(he[v]);
        if (v >= kValid) {
          padOk = padOk && got == 0.0;
          continue;
        }
        const double want = std::exp(ref[v] - double(m)); // against the GPU's own m
        refS += want;
        const double err = std::fabs(got - want) / (want * std::ldexp(1.0, -9) + std::ldexp(1.0, -24));
        worstE = std::max(worstE, std::isfinite(got) ? err : INFINITY);
      }
      if (lo < kValid) {
        const double relS = std::fabs(hms[gi].y - refS) / refS;
        worstS = std::max(worstS, std::isfinite(relS) ? relS : INFINITY);
        gs += double(hms[gi].y) * std::exp(double(m) - gm);
      }
    }
    // (a NaN must count as a failure: std::max(w, NaN) would keep w)
    const double lseErr = std::fabs(gm + std::log(gs) - rlse) / std::fabs(rlse);
    const double xtErr = std::fabs(double(hxt[r]) - ref[d.labels[r]]);
    worstLse = std::max(worstLse, std::isfinite(lseErr) ? lseErr : INFINITY);
    worstXt = std::max(worstXt, std::isfinite(xtErr) ? xtErr : INFINITY);
  }
  const bool ok = worstM <= 1e-3 && worstE <= 1.0 && worstS <= 1e-3 && worstXt <= 1e-3 &&
                  worstLse <= 1e-5 && padOk;
  failures += ok ? 0 : 1;
  char check[160];
  std::snprintf(check, sizeof check, "m %.1e e %.2f s %.1e x_t %.1e lse %.1e pad %s", worstM,
                worstE, worstS, worstXt, worstLse, padOk ? "0" : "NONZERO");
  const double msBytes = double(kTokens) * groups * 8;
  printTime(what, ms, gemmFlops(), gemmBytes() + msBytes, check, ok);

  // Variant 3 on these outputs.
  constexpr int kBlock = 256;
  const float g = 1.f / kTokens;
  const int shift = __builtin_ctz(epiN);
  auto launch = [&] {
    lossFromGroups<kBlock><<<kTokens, kBlock, groups * sizeof(float)>>>(
        reinterpret_cast<const __half *>(d.dD), d.dMs, groups, shift, d.dLabels, d.dXt, g,
        d.dLoss, d.dGrad);
  };
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const float lms = msPerRun(20, launch, 3);
  auto hloss = download(d.dLoss, kTokens);
  std::vector<__nv_bfloat16> hd(kVocab);
  double worstLoss = 0, worstGrad = 0;
  for (size_t si = 0; si < d.sample.size(); ++si) {
    const int r = d.sample[si];
    const std::vector<double> &ref = d.ref[si];
    double rm = -INFINITY, rs = 0;
    for (int v = 0; v < kValid; ++v)
      rm = std::max(rm, ref[v]);
    for (int v = 0; v < kValid; ++v)
      rs += std::exp(ref[v] - rm);
    const double lse = rm + std::log(rs), want = lse - ref[d.labels[r]];
    worstLoss =
        std::max(worstLoss,
                 std::isfinite(hloss[r]) ? std::fabs(hloss[r] - want) / std::fabs(want) : INFINITY);
    CHECK(cudaMemcpy(hd.data(), d.dGrad + size_t(r) * kVocab, kVocab * 2, cudaMemcpyDeviceToHost));
    // Each entry to 2^-7 of itself (the bf16 store's rounding alone is up to 2^-8, f16 e's
    // 2^-11 and f32 arithmetic come on top; the first run's worst was 1.01 of 2^-8) plus
    // 2^-23 g (e below f16's normal range); the row sums to 0 within 2^-8 of its mass 2 g.
    double rowSum = 0;
    for (int v = 0; v < kVocab; ++v) {
      const double want = v < kValid ? g * (std::exp(ref[v] - lse) - (v == d.labels[r])) : 0.0;
      const double got = bf16f(hd[v]);
      rowSum += got;
      const double err = std::fabs(got - want) /
                         (std::fabs(want) * std::ldexp(1.0, -7) + g * std::ldexp(1.0, -23));
      worstGrad = std::max(worstGrad, std::isfinite(got) ? err : INFINITY);
    }
    const double sumErr = std::fabs(rowSum) / (2 * g * std::ldexp(1.0, -8));
    worstGrad = std::max(worstGrad, std::isfinite(sumErr) ? sumErr : INFINITY);
  }
  const bool lok = worstLoss <= 1e-5 && worstGrad <= 1.0;
  failures += lok ? 0 : 1;
  std::snprintf(check, sizeof check, "loss %.1e grad %.2f", worstLoss, worstGrad);
  const double streamBytes = 4.0 * kTokens * kVocab + msBytes;
  printTime("  3: streaming loss + gradient on it", lms, 0, streamBytes, check, lok);
  std::printf("  %-44s %7.4f ms  (GEMM + loss; today 2.15 + 1.65 ms)\n",
              "  2 + 3 together", ms + lms);
}

int run() {
  std::mt19937 rng(7);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s; CUTLASS %d.%d; LM head M %d tokens, N %d vocab (%d valid), K %d, row-major "
              "f16 D\n",
              prop.name, CUTLASS_MAJOR, CUTLASS_MINOR, kTokens, kVocab, kValid, kK);
  Data d;
  // Logits with a spread like a trained model's (std ~3): X in [-1, 1], W in [-0.35, 0.35].
  auto fill = [&](std::vector<bf16> &v, size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    v.resize(n);
    for (auto &x : v)
      x = bf16(u(rng));
  };
  fill(d.x, size_t(kTokens) * kK, 1.f);
  fill(d.w, size_t(kVocab) * kK, 0.35f);
  d.labels.resize(kTokens);
  for (auto &t : d.labels)
    t = int64_t(rng() % kValid);
  d.dX = upload(d.x);
  d.dW = upload(d.w);
  d.dLabels = upload(d.labels);
  CHECK(cudaMalloc(&d.dD, kDn * 2));
  CHECK(cudaMalloc(&d.dGrad, kDn * 2));
  CHECK(cudaMalloc(&d.dMs, size_t(kTokens) * kMaxGroups * 8));
  CHECK(cudaMalloc(&d.dXt, kTokens * 4));
  CHECK(cudaMalloc(&d.dLoss, kTokens * 4));
  for (int i = 0; i < 16; ++i) {
    const int r = int((size_t(i) * 7919 + 13) % kTokens);
    d.sample.push_back(r);
    d.ref.emplace_back(kValid);
    for (int v = 0; v < kValid; ++v)
      d.ref.back()[v] = d.logit(r, v);
  }

  using RO = RasterOrder;
  std::printf("1: plain GEMM, f16 D\n");
  plain<LmGemm<PlainF16, true>>(d, rng, "1a pingpong 128x128, raster heuristic", RO::Heuristic);
  plain<LmGemm<PlainF16, true>>(d, rng, "1a pingpong 128x128, raster along M", RO::AlongM);
  plain<LmGemm<PlainF16, true>>(d, rng, "1a pingpong 128x128, raster along N", RO::AlongN);
  plain<LmGemm<PlainF16, true, cutlass::epilogue::collective::EpilogueTileAuto,
               Shape<_2, _1, _1>>>(d, rng, "1b pingpong 128x128, cluster 2x1");
  plain<LmGemm<PlainF16, false>>(d, rng, "1c coop 128x256");

  std::printf("2: exp-group epilogue (f16 e, (m, s) per group, x_t), then 3\n");
  expEpilogue<LmGemm<ExpGroupEVT, true>>(d, "2a pingpong 128x128, epi 64x32");
  expEpilogue<LmGemm<ExpGroupEVT, true, Shape<_64, _128>>>(d,
                                                           "2b pingpong 128x128, epi 64x128");
  expEpilogue<LmGemm<ExpGroupEVT, false>>(d, "2c coop 128x256, epi 128x32");

  std::printf("%s\n", failures ? "SOME RESULTS WRONG OR REFUSED" : "all results within bounds");
  return failures ? 1 : 0;
}

} // namespace lm_probe

int main() { return lm_probe::run(); }
