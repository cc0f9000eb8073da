// cutlass_epilogue_probe: what GPT-2 124M's epilogue GEMMs cost when the epilogue is
// CUTLASS's (4.2's sm90 TMA warp-specialized GEMMs, epilogue visitor trees) instead of
// cuBLASLt's.
//
// Why (#11 item 5): on an H100, cuBLASLt's epilogues keep GPT-2 bf16's GEMMs below the
// plain GEMMs' ~700-830 TFLOP/s (bench/bias_grad_gemm_probe.cpp, RESULTS "thirtieth
// session"): fc1's GELU_AUX_BIAS 0.149 ms against 0.093 plain, the attention projection
// with its f32 residual 0.060 against 0.032, DGELU 0.135 against 0.105; a bias gradient in
// the epilogue (DGELU_BGRAD) 0.453; and cuBLASLt takes no f32 bias beside a bf16 D at all.
// Together ~2.2 ms of GPT-2's 33 ms step. This times the same problems with CUTLASS's
// fused epilogues, so that the decision to generate such GEMMs rests on a measurement.
//
// Problems (GEMM terms of cuBLASLt's column-major view, as Forge's runtime issues them:
// M = features, N = 16384 tokens, D column-major = [tokens, features] row-major):
//   fc1 forward   M 3072 K 768:  D bf16 plain; D = gelu_tanh(acc + b) bf16, aux = acc + b
//                 bf16, b f32 (Forge's default epilogue, with the f32 bias cuBLASLt refuses)
//   attention projection M 768 K 768 and fc2 forward M 768 K 3072: D f32 = acc + b + C,
//                 b and the residual C f32 (Forge keeps the residual stream in f32)
//   fc2's dX      M 3072 K 768, A = W2 read transposed: D bf16 = acc * gelu'(aux); and the
//                 same with the bias gradient (sum over tokens of D, f32) in the epilogue
//   LM head       M 50264 K 768: D f32 = acc (the logits; the whole 16384 tokens at once),
//                 and D bf16 (a 2-byte D: half the stored bytes)
// Each result is checked on 2048 sampled elements (and 8 bias-gradient rows) against a
// double reference from the same bf16 operands: the largest error relative to the
// reference's RMS, failing above 2e-2 (bf16 output: 2^-9 relative, plus tanh.approx).
//
// Build (CUTLASS's headers from the `nvidia-cutlass` wheel on PyPI:
// cutlass_library/source/include and cutlass_library/source/tools/util/include), one line:
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG
//     -I$CUTLASS/include -I$CUTLASS/tools/util/include bench/cutlass_epilogue_probe.cu
//     -o cutlass_epilogue_probe
// Run: ./cutlass_epilogue_probe
#include "../runtime/lib/cuda/CutlassGemmSm90.cuh" // the runtime's GEMM (CutlassGemm.cu)
#include "probe_common.cuh"
#include <cutlass/version.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace forge::cutlass_sm90;

namespace {

constexpr int N_TOKENS = 16384;

template <bool PP>
using Plain = Gemm<RowMajor, void, bf16, fusion::LinearCombination<bf16, float, void>, PP>;
template <bool PP>
using PlainF32 = Gemm<RowMajor, void, float, fusion::LinearCombination<float, float, void>, PP>;
// fc1's GELU with an f32 bias (which cuBLASLt refuses; the runtime's GeluAuxGemm reads a
// bf16 one); the residual and dGELU GEMMs are the runtime's own (CutlassGemmSm90.cuh).
template <bool PP> using GeluAux = GeluAuxBiasTypeGemm<PP, float>;
template <bool PP>
using DGeluBgrad =
    Gemm<ColMajor, void, bf16,
         fusion::LinCombDeEltActDePerRowBias<ColMajor, cutlass::epilogue::thread::dGELU, bf16,
                                             float, bf16, float, void>,
         PP>;

/// Calls f(std::bool_constant<PP>) for both configurations, naming each in the report.
/// The outputs in `poison` are set to NaN (all bits set) before each, so that neither is
/// checked against what an earlier GEMM left there.
const char *config = "";
std::vector<std::pair<void *, size_t>> poison;
template <class F> void bothConfigs(F &&f) {
  auto fill = [] {
    for (auto [ptr, bytes] : poison)
      if (cudaMemset(ptr, 0xFF, bytes) != cudaSuccess)
        std::exit(1);
  };
  config = "coop 128x256";
  fill();
  f(std::false_type{});
  config = "pingpong 128x128";
  fill();
  f(std::true_type{});
}

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

std::vector<bf16> randomBf16(size_t n, float scale, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<bf16> v(n);
  for (auto &x : v)
    x = bf16(u(rng));
  return v;
}

double geluTanh(double z) {
  return 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
}
double dGeluTanh(double z) {
  const double t = std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z));
  return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * z * z);
}

/// Runs op (arguments `args`) warmup + timed times; returns ms per timed run, or -1 if
/// CUTLASS refused it or a launch failed (GemmUniversalAdapter::run clears the launch error
/// it reports). The outputs hold the last run's results.
template <class G>
float timeGemm(typename G::Op::Arguments args, const char *what, int warmup = 5, int timed = 20) {
  typename G::Op op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    std::printf("  %-16s %-44s CUTLASS cannot implement it\n", config, what);
    return -1;
  }
  size_t wsBytes = G::Op::get_workspace_size(args);
  void *ws = nullptr;
  if (wsBytes)
    CHECK(cudaMalloc(&ws, wsBytes));
  if (op.initialize(args, ws) != cutlass::Status::kSuccess) {
    std::printf("  %-16s %-44s initialize failed\n", config, what);
    return -1;
  }
  bool ran = true;
  const float ms = msPerRun(
      timed, [&] { ran = ran && op.run() == cutlass::Status::kSuccess; }, warmup);
  if (ws)
    cudaFree(ws);
  if (!ran) {
    std::printf("  %-16s %-44s a launch failed\n", config, what);
    return -1;
  }
  return ms;
}

struct Problem {
  int m, k;
  std::vector<bf16> a, b; // A: [m, k] (row-major, or [k, m] for a transposed A); B: [n, k]
  bool aTransposed;
  double acc(int i, int j) const { // sum_k A(i, k) B(k, j) in double
    double s = 0;
    for (int p = 0; p < k; ++p) {
      const double av = float(aTransposed ? a[size_t(p) * m + i] : a[size_t(i) * k + p]);
      s += av * double(float(b[size_t(j) * k + p]));
    }
    return s;
  }
};

/// Largest |got - ref| over the samples, relative to the references' RMS.
struct ErrorStat {
  double maxErr = 0, sumSq = 0;
  int n = 0;
  void add(double got, double ref) {
    // A NaN (a poisoned output no GEMM wrote) is an infinite error, not skipped by max.
    maxErr = std::isfinite(got) ? std::max(maxErr, std::fabs(got - ref)) : INFINITY;
    sumSq += ref * ref;
    ++n;
  }
  double rel() const { return maxErr / std::max(std::sqrt(sumSq / std::max(n, 1)), 1e-30); }
};

int failures = 0;

void report(const char *what, float ms, double flops, const ErrorStat &e) {
  if (ms < 0) {
    ++failures;
    return;
  }
  const bool ok = e.rel() <= 2e-2;
  failures += ok ? 0 : 1;
  std::printf("  %-16s %-44s %7.4f ms  %6.1f TFLOP/s  max error %.2e of RMS %s\n", config, what, ms,
              flops / (ms * 1e-3) / 1e12, e.rel(), ok ? "ok" : "WRONG");
}

template <class G>
typename G::Op::Arguments baseArgs(const Problem &p, const bf16 *dA, const bf16 *dB) {
  typename G::Op::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {p.m, N_TOKENS, p.k, 1};
  args.mainloop.ptr_A = dA;
  args.mainloop.dA = cutlass::make_cute_packed_stride(typename G::StrideA{}, {p.m, p.k, 1});
  args.mainloop.ptr_B = dB;
  args.mainloop.dB = cutlass::make_cute_packed_stride(typename G::StrideB{}, {N_TOKENS, p.k, 1});
  args.epilogue.dC = cutlass::make_cute_packed_stride(typename G::StrideC{}, {p.m, N_TOKENS, 1});
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename G::StrideD{}, {p.m, N_TOKENS, 1});
  args.epilogue.thread.alpha = 1.f; // every epilogue here: alpha * acc (+ beta * C) ...
  args.epilogue.thread.beta = 0.f;
  return args;
}

/// The error of 2048 sampled outputs of D (column-major, m rows, N_TOKENS columns) against
/// ref(i, j).
template <class T, class Ref>
ErrorStat sampled(std::mt19937 &rng, int m, const std::vector<T> &d, Ref ref) {
  std::uniform_int_distribution<int> pickM(0, m - 1), pickN(0, N_TOKENS - 1);
  ErrorStat e;
  for (int s = 0; s < 2048; ++s) {
    const int i = pickM(rng), j = pickN(rng);
    e.add(float(d[size_t(j) * m + i]), ref(i, j));
  }
  return e;
}

/// The plain GEMM (bf16 D = acc) of `p` in both configurations: the baseline each
/// problem's epilogues are set beside.
void plainGemm(std::mt19937 &rng, const Problem &p, const bf16 *dA, const bf16 *dB, bf16 *dD,
               double flops) {
  bothConfigs([&](auto pp) {
    using G = Plain<decltype(pp)::value>;
    auto args = baseArgs<G>(p, dA, dB);
    args.epilogue.ptr_D = dD;
    float ms = timeGemm<G>(args, "plain, bf16 D");
    auto d = download(dD, size_t(p.m) * N_TOKENS);
    report("plain, bf16 D", ms, flops,
           sampled(rng, p.m, d, [&](int i, int j) { return p.acc(i, j); }));
  });
}

} // namespace

int main() {
  std::mt19937 rng(7);
  int dev = 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s; CUTLASS %d.%d sm90 TMA warp-specialized GEMMs (cooperative 128x256x64 and "
              "ping-pong 128x128x64, cluster 1x2); N = %d tokens\n",
              prop.name, CUTLASS_MAJOR, CUTLASS_MINOR, N_TOKENS);
  const size_t mn3072 = size_t(3072) * N_TOKENS, mn768 = size_t(768) * N_TOKENS;

  // fc1 forward: A = W1 [3072, 768], B = x [16384, 768].
  {
    Problem p{3072, 768, randomBf16(3072 * 768, 0.05f, rng),
              randomBf16(size_t(N_TOKENS) * 768, 1.0f, rng), false};
    std::vector<float> bias(p.m);
    for (auto &x : bias)
      x = std::uniform_real_distribution<float>(-0.5f, 0.5f)(rng);
    bf16 *dA = upload(p.a), *dB = upload(p.b), *dD = nullptr, *dAux = nullptr;
    float *dBias = upload(bias);
    CHECK(cudaMalloc(&dD, mn3072 * 2));
    CHECK(cudaMalloc(&dAux, mn3072 * 2));
    poison = {{dD, mn3072 * 2}, {dAux, mn3072 * 2}};
    const double flops = 2.0 * p.m * N_TOKENS * p.k;
    std::printf("fc1 forward, M 3072 N %d K 768:\n", N_TOKENS);
    plainGemm(rng, p, dA, dB, dD, flops);
    bothConfigs([&](auto pp) {
      using G = GeluAux<decltype(pp)::value>;
      auto args = baseArgs<G>(p, dA, dB);
      args.epilogue.ptr_D = dD;
      args.epilogue.thread.bias_ptr = dBias;
      args.epilogue.thread.aux_ptr = dAux;
      args.epilogue.thread.dAux =
          cutlass::make_cute_packed_stride(typename G::StrideC{}, {p.m, N_TOKENS, 1});
      float ms = timeGemm<G>(args, "bias f32 + tanh GELU, bf16 D and aux");
      auto h = [&](int i, int j) { return p.acc(i, j) + bias[i]; };
      report(
          "bias f32 + tanh GELU, bf16 D and aux: D", ms, flops,
          sampled(rng, p.m, download(dD, mn3072), [&](int i, int j) { return geluTanh(h(i, j)); }));
      report("                                      aux", ms, flops,
             sampled(rng, p.m, download(dAux, mn3072), h));
    });
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dAux), cudaFree(dBias);
  }

  // attention projection (K 768) and fc2 forward (K 3072): D f32 = acc + b + C.
  for (int k : {768, 3072}) {
    Problem p{768, k, randomBf16(size_t(768) * k, 0.05f, rng),
              randomBf16(size_t(N_TOKENS) * k, 1.0f, rng), false};
    std::vector<float> bias(p.m), resid(mn768);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto &x : bias)
      x = u(rng);
    for (auto &x : resid)
      x = u(rng);
    bf16 *dA = upload(p.a), *dB = upload(p.b), *dD16 = nullptr;
    float *dBias = upload(bias), *dC = upload(resid), *dD = nullptr;
    CHECK(cudaMalloc(&dD, mn768 * 4));
    CHECK(cudaMalloc(&dD16, mn768 * 2));
    poison = {{dD, mn768 * 4}, {dD16, mn768 * 2}};
    const double flops = 2.0 * p.m * N_TOKENS * p.k;
    std::printf("%s, M 768 N %d K %d:\n", k == 768 ? "attention projection" : "fc2 forward",
                N_TOKENS, k);
    plainGemm(rng, p, dA, dB, dD16, flops);
    bothConfigs([&](auto pp) {
      using G = ResidualGemm<decltype(pp)::value>;
      auto args = baseArgs<G>(p, dA, dB);
      args.epilogue.ptr_C = dC;
      args.epilogue.ptr_D = dD;
      args.epilogue.thread.beta = 1.f;
      args.epilogue.thread.bias_ptr = dBias;
      float ms = timeGemm<G>(args, "bias f32 + residual C f32, f32 D");
      report("bias f32 + residual C f32, f32 D", ms, flops,
             sampled(rng, p.m, download(dD, mn768), [&](int i, int j) {
               return p.acc(i, j) + bias[i] + resid[size_t(j) * p.m + i];
             }));
    });
    cudaFree(dA), cudaFree(dB), cudaFree(dD16), cudaFree(dBias), cudaFree(dC), cudaFree(dD);
  }

  // fc2's dX through GELU: A = W2 [768, 3072] read as [3072 x 768] column-major, B = dY
  // [16384, 768], aux = fc1's pre-activation [16384, 3072].
  {
    Problem p{3072, 768, randomBf16(size_t(3072) * 768, 0.05f, rng),
              randomBf16(size_t(N_TOKENS) * 768, 1.0f, rng), true};
    std::vector<bf16> aux = randomBf16(mn3072, 3.0f, rng);
    bf16 *dA = upload(p.a), *dB = upload(p.b), *dAux = upload(aux), *dD = nullptr;
    float *dBgrad = nullptr;
    CHECK(cudaMalloc(&dD, mn3072 * 2));
    CHECK(cudaMalloc(&dBgrad, 3072 * 4));
    poison = {{dD, mn3072 * 2}};
    const double flops = 2.0 * p.m * N_TOKENS * p.k;
    std::printf("fc2's dX through the GELU, M 3072 N %d K 768 (A transposed):\n", N_TOKENS);
    auto dh = [&](int i, int j) {
      return p.acc(i, j) * dGeluTanh(float(aux[size_t(j) * p.m + i]));
    };
    auto check = [&](const char *what, float ms) {
      report(what, ms, flops, sampled(rng, p.m, download(dD, mn3072), dh));
    };
    bothConfigs([&](auto pp) {
      using G = DgeluGemm<decltype(pp)::value>;
      auto args = baseArgs<G>(p, dA, dB);
      args.epilogue.ptr_D = dD;
      args.epilogue.thread.aux_ptr = dAux;
      args.epilogue.thread.dAux =
          cutlass::make_cute_packed_stride(typename G::StrideC{}, {p.m, N_TOKENS, 1});
      check("dGELU, bf16 D", timeGemm<G>(args, "dGELU, bf16 D"));
    });
    bothConfigs([&](auto pp) {
      using G = DGeluBgrad<decltype(pp)::value>;
      CHECK(cudaMemset(dBgrad, 0, 3072 * 4));
      auto args = baseArgs<G>(p, dA, dB);
      args.epilogue.ptr_D = dD;
      args.epilogue.thread.aux_ptr = dAux;
      args.epilogue.thread.dAux =
          cutlass::make_cute_packed_stride(typename G::StrideC{}, {p.m, N_TOKENS, 1});
      args.epilogue.thread.dbias_ptr = dBgrad;
      float ms = timeGemm<G>(args, "dGELU + bias gradient f32, bf16 D");
      check("dGELU + bias gradient f32, bf16 D", ms);
      // The bias gradient of one run (the timing ran 25: rerun once from zero).
      CHECK(cudaMemset(dBgrad, 0, 3072 * 4));
      if (ms >= 0 && timeGemm<G>(args, "its bias gradient's own run", 0, 1) >= 0) {
        auto g = download(dBgrad, 3072);
        std::uniform_int_distribution<int> pickM(0, p.m - 1);
        ErrorStat e;
        for (int s = 0; s < 8; ++s) {
          const int i = pickM(rng);
          double ref = 0;
          for (int j = 0; j < N_TOKENS; ++j)
            ref += dh(i, j);
          e.add(g[i], ref);
        }
        report("  its bias gradient (8 rows, one run)", ms, flops, e);
      } else if (ms >= 0) {
        ++failures; // timeGemm said why
      }
    });
    cudaFree(dA), cudaFree(dB), cudaFree(dAux), cudaFree(dD), cudaFree(dBgrad);
  }
  // The LM head's logits in f32 (A = the tied embedding [50264, 768], B = x): Forge runs
  // them in 4 chunks of 4096 tokens (cuBLASLt: ~0.53 ms each on an H100, ~600 TFLOP/s,
  // the f32 D's 3.3 GB written beside the tensor-core work); here all 16384 at once.
  {
    Problem p{50264, 768, randomBf16(size_t(50264) * 768, 0.05f, rng),
              randomBf16(size_t(N_TOKENS) * 768, 1.0f, rng), false};
    const size_t mn = size_t(p.m) * N_TOKENS;
    bf16 *dA = upload(p.a), *dB = upload(p.b);
    float *dD = nullptr;
    CHECK(cudaMalloc(&dD, mn * 4));
    poison = {{dD, mn * 4}};
    const double flops = 2.0 * p.m * N_TOKENS * p.k;
    std::printf("LM head (logits), M 50264 N %d K 768, f32 D:\n", N_TOKENS);
    bothConfigs([&](auto pp) {
      using G = PlainF32<decltype(pp)::value>;
      auto args = baseArgs<G>(p, dA, dB);
      args.epilogue.ptr_D = dD;
      float ms = timeGemm<G>(args, "plain, f32 D");
      report("plain, f32 D", ms, flops,
             sampled(rng, p.m, download(dD, mn), [&](int i, int j) { return p.acc(i, j); }));
    });
    // The same GEMM with a 2-byte D: what an epilogue writing the loss kernel's f16
    // exp(x - group max) instead of f32 logits would start from (half the stored bytes).
    bf16 *dD16 = nullptr;
    CHECK(cudaMalloc(&dD16, mn * 2));
    poison = {{dD16, mn * 2}};
    std::printf("LM head (logits), M 50264 N %d K 768, bf16 D:\n", N_TOKENS);
    plainGemm(rng, p, dA, dB, dD16, flops);
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dD16);
  }
  std::printf("%s\n", failures ? "SOME RESULTS WRONG OR REFUSED" : "all results within 2e-2");
  return failures ? 1 : 0;
}
