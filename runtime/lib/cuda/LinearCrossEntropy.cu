// The fused LM head cross entropy (LinearCrossEntropy.h): a CUTLASS 4.2 sm90 GEMM whose
// epilogue turns each row's 128-column group of logits into f16 e = exp(x - group max) plus a
// (max, sum) pair, a target-logit kernel, and a streaming loss + gradient kernel that rewrites
// e in place as the bf16 gradient. bench/lm_head_epilogue_probe.cu measured this design (its
// variant 2b, then 3) on an H100 for GPT-2's head: GEMM 2.18 ms, loss 1.21 ms at 2.77 TB/s,
// against 2.15 + 1.65 ms for cuBLASLt's f32 logits and the on-chip loss kernel.
//
// Invariants beyond the header's: the GEMM is M = rows (A = x, K-major), N = columns (B = w,
// K-major), ping-pong 128x128x64 tiles, cluster 1x2, a 64x128 epilogue subtile, so a group is
// exactly one tile's 128 columns and groups = ceil(columns / 128). e <= 1 (the group max
// gives 1), so f16 keeps 2^-11 relative precision down to its subnormals; the group sums s
// are f32 from the unrounded e. Padding columns (>= classes) and a group with no valid column
// give e = 0, and (m, s) = (-inf, 0) for the latter.
#include "cuda/LinearCrossEntropy.h"

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

// Named, not anonymous: `cute::` names used inside an anonymous namespace make nvcc's host
// stubs' references ambiguous (bench/lm_head_epilogue_probe.cu). Kernels and host helpers
// that use no cute names live in an anonymous namespace below.
namespace forge::cutlass_sm90::lm_head {

namespace fusion = cutlass::epilogue::fusion;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kGroupColumns = 128; // the epilogue subtile's N extent: one (m, s) pair's columns

__device__ __forceinline__ float ex2(float x) {
  float y; // ftz: results below 2^-126 are far under f16's smallest subnormal anyway
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The EVT root node. It relies on the sm90 collective calling reduce() with the subtile's f32
// results (visit_results, a view of tRS_rCompute) before converting them to D
// (sm90_epilogue_tma_warpspecialized.hpp), and on the wgmma accumulator layout: per subtile a
// thread holds 2 rows (the same 2 as the other 3 lanes of its quad) and the quad together all
// EPI_N columns of those rows. Coordinates come from tCcD (relative to the thread's first
// element) and residue_tCcD ((M, N) minus that element's absolute coordinate), as the in-tree
// reduction nodes use them. No shared memory, workspace or atomics: each (row, group) pair is
// stored once, by one lane.
struct ExpGroupStore {
  struct SharedStorage {};
  struct Arguments {
    float2 *ms = nullptr; // [rows][groups]: (group max, sum of e)
    int groups = 0;       // ms's row stride: ceil(N / EPI_N)
    int classes = 0;      // columns >= this are padding (-inf)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &args,
                                                  void *) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem_shape, Arguments const &args) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    return args.ms != nullptr && args.classes <= int(N) &&
           int64_t(args.groups) * kGroupColumns >= int64_t(N) && L == 1;
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
  CUTLASS_DEVICE auto
  get_producer_load_callbacks(fusion::detail::ProducerLoadArgs<Args...> const &) {
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
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const &, int, int,
                              int, cutlass::Array<ElementInput, FragmentSize> const &frg_input) {
      return frg_input;
    }

    /// The thread's two rows in subtile row epi_m, relative to its first element
    /// (compile-time offsets after unrolling; the other lanes of the quad hold the same two).
    CUTLASS_DEVICE void rowsOf(int epi_m, int &rel0, int &rel1) const {
      cute::Tensor c = tCcD(cute::_, cute::_, cute::_, epi_m, 0);
      rel0 = int(cute::get<0>(c(0)));
      rel1 = rel0;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < int(cute::size(c)); ++i)
        if (int(cute::get<0>(c(i))) != rel0)
          rel1 = int(cute::get<0>(c(i)));
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor &&, SyncFn const &, int epi_m, int epi_n, bool,
                               VTensor visit_results) {
      using Frag = cute::remove_cvref_t<decltype(visit_results(0))>;
      constexpr int F = int(Frag::kElements);
      constexpr int V = int(decltype(cute::size(visit_results))::value) * F;
      // Element i <-> visit_results(i / F)[i % F]: both follow tRS_rD_layout's order.
      cute::Tensor c = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      const int baseM = M - int(cute::get<0>(residue)), baseN = N - int(cute::get<1>(residue));
      int rel0, rel1;
      rowsOf(epi_m, rel0, rel1);
      const int classes = p->classes;
      float m0 = -INFINITY, m1 = -INFINITY;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < V; ++i) {
        auto ci = c(i);
        const int col = baseN + int(cute::get<1>(ci));
        const bool second = int(cute::get<0>(ci)) != rel0;
        // Out of the problem (the last tiles' residue) or padding: no probability.
        const bool valid = cute::elem_less(ci, residue) && col < classes;
        const float x = valid ? visit_results(i / F)[i % F] : -INFINITY;
        visit_results(i / F)[i % F] = x;
        if (second)
          m1 = fmaxf(m1, x);
        else
          m0 = fmaxf(m0, x);
      }
      // The quad's other lanes hold the rest of the group's columns.
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
      // An all-padding group: e = exp2(-inf) = 0, s = 0, m = -inf (not exp(-inf - -inf)).
      const float sh0 = m0 == -INFINITY ? 0.f : m0 * kLog2e;
      const float sh1 = m1 == -INFINITY ? 0.f : m1 * kLog2e;
      float s0 = 0.f, s1 = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < V; ++i) {
        const bool second = int(cute::get<0>(c(i))) != rel0;
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
      // Lane 0 of the quad stores row0's pair, lane 1 row1's. Rows past M (the last tile's
      // residue) and a whole tile past N (the cluster's padding CTA) store nothing.
      const int lane = thread_idx % 4;
      const int group = (baseN + int(cute::get<1>(c(0)))) / EpiN;
      const int row = baseM + (lane == 0 ? rel0 : rel1);
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
    constexpr int EpiN = int(decltype(cute::size<1>(EpiTile{}))::value);
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD), EpiN>(
        args.tCcD, args.residue_tCcD, int(M), int(N), params_ptr, args.thread_idx);
  }
};

using bf16 = cutlass::bfloat16_t;
using f16 = cutlass::half_t;

// The probe's variant 2b, its fastest: ping-pong (one warp group's epilogue, with its exp
// work, overlaps the other's main loop), 128x128x64 tiles, cluster 1x2 (two CTAs along N
// share x's tile by multicast), epilogue subtile 64x128 (a quad holds a row's whole 128-column
// tile row: one (m, s) pair per row and tile). M = rows (A = x, K-major), N = columns
// (B = w [columns, k], K-major, i.e. column-major K x N), row-major f16 D.
struct Gemm {
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using EpiTile = cute::Shape<cute::_64, cute::_128>;
  using Callbacks = fusion::Sm90EVT<ExpGroupStore, fusion::Sm90AccFetch>;
  static constexpr int AlignD = 8;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, float, float,
      void, cutlass::layout::RowMajor, AlignD, f16, cutlass::layout::RowMajor, AlignD,
      cutlass::epilogue::TmaWarpSpecialized, Callbacks>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, cutlass::layout::RowMajor, 8, bf16,
      cutlass::layout::ColumnMajor, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr int EpiN =
      int(decltype(cute::size<1>(typename Epilogue::EpilogueTile{}))::value);
  static_assert(EpiN == kGroupColumns, "a group is the epilogue subtile's N extent");
};

/// The GEMM's arguments (pointers may be null for sizing the workspace).
inline Gemm::Op::Arguments gemmArguments(int rows, int columns, int classes, int k, const void *x,
                                         const void *w, void *e, float2 *ms, int groups,
                                         int device) {
  Gemm::Op::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {rows, columns, k, 1};
  args.mainloop.ptr_A = static_cast<const bf16 *>(x);
  args.mainloop.dA = cutlass::make_cute_packed_stride(Gemm::Kernel::StrideA{}, {rows, k, 1});
  args.mainloop.ptr_B = static_cast<const bf16 *>(w);
  args.mainloop.dB = cutlass::make_cute_packed_stride(Gemm::Kernel::StrideB{}, {columns, k, 1});
  args.epilogue.dC = cutlass::make_cute_packed_stride(Gemm::Kernel::StrideC{}, {rows, columns, 1});
  args.epilogue.ptr_D = static_cast<f16 *>(e);
  args.epilogue.dD = cutlass::make_cute_packed_stride(Gemm::Kernel::StrideD{}, {rows, columns, 1});
  // Sm90EVT<node, child>: arguments {child's, node's}.
  args.epilogue.thread = {{}, {ms, groups, classes}};
  args.hw_info.device_id = device; // CUTLASS sizes the persistent grid by this device's SMs
  return args;
}

} // namespace forge::cutlass_sm90::lm_head

namespace forge::rt::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kGroupColumns = forge::cutlass_sm90::lm_head::kGroupColumns;
// The loss kernel holds a row's per-group factors in shared memory: 48 KiB without opting in,
// less its 64 static bytes (the warps' partial pairs): 12272 groups, 1.57M columns, far above
// any vocabulary.
constexpr int64_t kMaxGroups = (48 * 1024 - 64) / 4;
constexpr int kTargetBlock = 256; // 8 rows (warps) a block
constexpr int kLossBlock = 256;
// 16-byte vectors a thread loads before it stores any: in place, a row streams at 2.91 TB/s
// with 16 on an H100 (GPT-2's head, 16384 rows), 2.55 with 4 (out of place 4 reached 2.87:
// the in-place stream needs more bytes in flight).
constexpr int kLossUnroll = 16;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// A target read as int64 and clamped into [0, classes); `outside` says it was not in range.
template <class T> __device__ __forceinline__ int clampTarget(T raw, int classes, bool &outside) {
  const int64_t t = static_cast<int64_t>(raw);
  outside = t < 0 || t >= classes;
  return t < 0 ? 0 : t >= classes ? classes - 1 : static_cast<int>(t);
}

/// x_t[row] = x[row, :] . w[target[row], :] in f32, one warp a row (16-byte loads of 8 bf16;
/// each bf16 product is exact in f32). A target out of range stores faultCode (a plain store:
/// every faulting row writes the same word) and is clamped, so the reads stay in bounds.
template <class T>
__global__ void __launch_bounds__(kTargetBlock)
    targetLogitKernel(const uint4 *__restrict__ x, const uint4 *__restrict__ w,
                      const T *__restrict__ target, int rows, int kVectors, int classes,
                      float *__restrict__ xt, int32_t *fault, int32_t faultCode) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (kTargetBlock / 32) + threadIdx.x / 32;
  if (row >= rows)
    return;
  bool outside;
  const int t = clampTarget(target[row], classes, outside);
  if (outside && lane == 0 && fault)
    *fault = faultCode;
  const uint4 *xr = x + size_t(row) * kVectors, *wr = w + size_t(t) * kVectors;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int v = lane; v < kVectors; v += 32) {
    const uint4 a = xr[v], b = wr[v];
    const __nv_bfloat162 *ha = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *hb = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 fa = __bfloat1622float2(ha[j]), fb = __bfloat1622float2(hb[j]);
      acc[j] = fmaf(fa.x, fb.x, fmaf(fa.y, fb.y, acc[j]));
    }
  }
  float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
#pragma unroll
  for (int o = 16; o; o /= 2)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0)
    xt[row] = s;
}

/// A running (max, sum of exp(x - max)) pair.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY)
    return {m, 0.f};
  return {m, a.s * ex2((a.m - m) * kLog2e) + b.s * ex2((b.m - m) * kLog2e)};
}
__device__ __forceinline__ MaxSum warpCombine(MaxSum a) {
#pragma unroll
  for (int o = 16; o; o /= 2)
    a = combine(a, {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)});
  return a;
}

/// One block a row: lse from the row's (m, s) pairs, loss = lse - x_t, then the gradient
/// g (e exp(m_group - lse) - onehot) over e in place (each thread reads each 16-byte vector
/// before writing it back). The per-group factor g exp(m - lse) sits in shared memory, so the
/// stream does one multiply a logit. The target's entry comes from x_t in f32 (the one entry
/// where p - 1 cancels: f16 e would lose it); padding columns are written exactly 0.
template <class T>
__global__ void __launch_bounds__(kLossBlock)
    lossGradKernel(uint4 *eGrad, const float2 *__restrict__ ms, const T *__restrict__ target,
                   const float *__restrict__ xt, const float *__restrict__ gradOutput, bool perRow,
                   float divisor, int vectors, int classes, int groups, float *__restrict__ loss) {
  extern __shared__ float factor[]; // [groups]: the group max, then g exp(m - lse)
  __shared__ MaxSum part[kLossBlock / 32];
  const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float2 *mr = ms + size_t(row) * groups;
  MaxSum acc{-INFINITY, 0.f};
  for (int i = threadIdx.x; i < groups; i += kLossBlock) {
    const float2 p = mr[i];
    factor[i] = p.x;
    acc = combine(acc, {p.x, p.y});
  }
  acc = warpCombine(acc);
  if (lane == 0)
    part[warp] = acc;
  __syncthreads();
  acc = warpCombine(lane < kLossBlock / 32 ? part[lane] : MaxSum{-INFINITY, 0.f});
  // classes >= 1: some group holds a valid column, whose own e = 1 makes s >= 1.
  const float lse = acc.m + logf(acc.s);
  const float g = perRow ? gradOutput[row] : *gradOutput / divisor;
  for (int i = threadIdx.x; i < groups; i += kLossBlock) {
    const float m = factor[i]; // this thread's own entries: no barrier in between
    factor[i] = m == -INFINITY ? 0.f : expf(m - lse) * g;
  }
  bool outside;
  const int t = clampTarget(target[row], classes, outside);
  const float x = xt[row];
  if (threadIdx.x == 0)
    loss[row] = lse - x;
  const float dt = g * (expf(x - lse) - 1.f);
  __syncthreads();

  uint4 *r = eGrad + size_t(row) * vectors;
  for (int v0 = threadIdx.x; v0 < vectors; v0 += kLossBlock * kLossUnroll) {
    uint4 in[kLossUnroll];
#pragma unroll
    for (int u = 0; u < kLossUnroll; ++u) {
      const int v = v0 + u * kLossBlock;
      if (v < vectors)
        in[u] = r[v];
    }
#pragma unroll
    for (int u = 0; u < kLossUnroll; ++u) {
      const int v = v0 + u * kLossBlock;
      if (v >= vectors)
        continue;
      const float f = factor[v / (kGroupColumns / 8)]; // a vector's 8 columns share a group
      const __half2 *h = reinterpret_cast<const __half2 *>(&in[u]);
      float o[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 p = __half22float2(h[j]);
        o[2 * j] = p.x * f;
        o[2 * j + 1] = p.y * f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = 8 * v + j;
        o[j] = c == t ? dt : c >= classes ? 0.f : o[j];
      }
      uint4 out;
      __nv_bfloat162 *b = reinterpret_cast<__nv_bfloat162 *>(&out);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        b[j] = __floats2bfloat162_rn(o[2 * j], o[2 * j + 1]);
      r[v] = out;
    }
  }
}

size_t alignUp(size_t v) { return (v + 255) / 256 * 256; }

/// The workspace's sections: ms pairs, then x_t, then the GEMM's own (each 256-byte aligned).
struct Layout {
  int64_t groups = 0;
  size_t msBytes = 0, xtOffset = 0, gemmOffset = 0, gemmBytes = 0;
  size_t total() const { return gemmOffset + gemmBytes; }
};

Layout layoutOf(const LinearCrossEntropy &p, int device) {
  namespace lm = forge::cutlass_sm90::lm_head;
  Layout l;
  l.groups = (p.columns + kGroupColumns - 1) / kGroupColumns;
  l.msBytes = alignUp(size_t(p.rows) * size_t(l.groups) * sizeof(float2));
  l.xtOffset = l.msBytes;
  l.gemmOffset = l.xtOffset + alignUp(size_t(p.rows) * sizeof(float));
  auto args = lm::gemmArguments(int(p.rows), int(p.columns), int(p.classes), int(p.k), nullptr,
                                nullptr, nullptr, nullptr, int(l.groups), device);
  l.gemmBytes = alignUp(lm::Gemm::Op::get_workspace_size(args));
  return l;
}

bool supported(const LinearCrossEntropy &p) {
  return p.rows >= 0 && p.rows <= INT32_MAX && p.columns > 0 && p.columns <= INT32_MAX &&
         p.columns % 8 == 0 && p.classes >= 1 && p.classes <= p.columns && p.k > 0 &&
         p.k <= INT32_MAX && p.k % 8 == 0 &&
         (p.columns + kGroupColumns - 1) / kGroupColumns <= kMaxGroups;
}

template <class T>
cudaError_t launchKernels(const LinearCrossEntropy &p, const void *x, const void *w,
                          const void *target, const float *gradOutput, float *loss, void *result,
                          int32_t *fault, int32_t faultCode, const Layout &l, float2 *ms, float *xt,
                          cudaStream_t stream) {
  const int rows = int(p.rows), classes = int(p.classes);
  const T *t = static_cast<const T *>(target);
  targetLogitKernel<T>
      <<<(rows + kTargetBlock / 32 - 1) / (kTargetBlock / 32), kTargetBlock, 0, stream>>>(
          static_cast<const uint4 *>(x), static_cast<const uint4 *>(w), t, rows, int(p.k / 8),
          classes, xt, fault, faultCode);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return e;
  using R = LinearCrossEntropy::Reduction;
  const bool perRow = p.reduction == R::None;
  const float divisor = p.reduction == R::Mean ? float(p.rows) : 1.f;
  lossGradKernel<T><<<rows, kLossBlock, size_t(l.groups) * sizeof(float), stream>>>(
      static_cast<uint4 *>(result), ms, t, xt, gradOutput, perRow, divisor, int(p.columns / 8),
      classes, int(l.groups), loss);
  return cudaGetLastError();
}

} // namespace

size_t linearCrossEntropyWorkspaceBytes(const LinearCrossEntropy &p) {
  if (p.rows == 0 || !supported(p))
    return 0;
  int device = 0;
  cudaGetDevice(&device);
  return layoutOf(p, device).total();
}

cudaError_t runLinearCrossEntropy(const LinearCrossEntropy &p, const void *x, const void *w,
                                  const void *target, const float *gradOutput, float *loss,
                                  void *result, int32_t *fault, int32_t faultCode, void *workspace,
                                  size_t workspaceBytes, cudaStream_t stream) {
  namespace lm = forge::cutlass_sm90::lm_head;
  if (!supported(p))
    return cudaErrorNotSupported;
  if (p.rows == 0)
    return cudaSuccess;
  // TMA descriptors need 16-byte aligned addresses, and CUTLASS's can_implement checks only
  // shapes (a misaligned one fails cuTensorMapEncodeTiled, past an assert NDEBUG removes); the
  // other kernels' 16-byte vectors need the same of x, w and result.
  for (const void *q :
       {x, w, static_cast<const void *>(result), static_cast<const void *>(workspace)})
    if (q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 != 0)
      return cudaErrorNotSupported;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return e;
  const Layout l = layoutOf(p, device);
  if (l.total() > workspaceBytes)
    return cudaErrorNotSupported;
  char *base = static_cast<char *>(workspace);
  float2 *ms = reinterpret_cast<float2 *>(base);
  float *xt = reinterpret_cast<float *>(base + l.xtOffset);
  void *gemmWorkspace = l.gemmBytes ? base + l.gemmOffset : nullptr;

  auto args = lm::gemmArguments(int(p.rows), int(p.columns), int(p.classes), int(p.k), x, w, result,
                                ms, int(l.groups), device);
  lm::Gemm::Op op;
  if (op.can_implement(args) != cutlass::Status::kSuccess ||
      lm::Gemm::Op::get_workspace_size(args) > l.gemmBytes)
    return cudaErrorNotSupported;
  if (op.initialize(args, gemmWorkspace, stream) != cutlass::Status::kSuccess)
    return cudaErrorNotSupported;
  // GemmUniversalAdapter::run has already taken the launch's error (cudaGetLastError).
  if (op.run(stream) != cutlass::Status::kSuccess)
    return cudaErrorLaunchFailure;
  return p.targetI32 ? launchKernels<int32_t>(p, x, w, target, gradOutput, loss, result, fault,
                                              faultCode, l, ms, xt, stream)
                     : launchKernels<int64_t>(p, x, w, target, gradOutput, loss, result, fault,
                                              faultCode, l, ms, xt, stream);
}

} // namespace forge::rt::cuda
