// The fused LM head cross entropy (cuda/LinearCrossEntropy.h) called directly on cudaMalloc'd
// buffers and compared with a float64 reference computed here from the same bf16-rounded x and
// w: shapes with row and column residues (rows and columns not multiples of the 128x128 tile),
// padding columns, an all-padding column group, GPT-2's head; int64 and int32 targets; the
// three reductions. Skipped without a GPU of compute capability 9.0 (the kernels are sm_90a
// code). The refusals of unsupported problems need no GPU and always run.
#include "cuda/LinearCrossEntropy.h"
#include "forge/runtime/Bundle.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

using forge::rt::cuda::LinearCrossEntropy;
using forge::rt::cuda::linearCrossEntropyWorkspaceBytes;
using forge::rt::cuda::runLinearCrossEntropy;
using Reduction = LinearCrossEntropy::Reduction;

namespace {

/// Why the GPU tests cannot run here, or "" when they can.
std::string whyNoGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return "no GPU";
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
    return "no GPU";
  if (prop.major != 9 || prop.minor != 0)
    return "GPU of compute capability " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + ", not 9.0 (the kernels are sm_90a code)";
  return "";
}

uint16_t toBf16(float f) { // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float fromBf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A cudaMalloc'd array of n T, freed on scope exit.
template <class T> struct Device {
  T *p = nullptr;
  explicit Device(size_t n) {
    void *v = nullptr;
    EXPECT_EQ(cudaMalloc(&v, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    p = static_cast<T *>(v);
  }
  ~Device() { cudaFree(p); }
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;
  void upload(const std::vector<T> &h) {
    ASSERT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download(size_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

struct Shape {
  const char *name;
  int64_t rows, columns, classes, k;
};

void PrintTo(const Shape &s, std::ostream *os) { *os << s.name; }

/// One shape's operands, on the host (bf16-rounded, as floats) and on the GPU, and the float64
/// logits of the rows checked entry by entry (all rows, except for GPT-2's head: a sample).
struct Problem {
  Shape s;
  std::vector<float> x, w;
  std::unique_ptr<Device<uint16_t>> dx, dw;
  std::vector<int64_t> checked;
  std::vector<std::vector<double>> logits; // [checked][classes]
  std::vector<double> lse;                 // [checked]

  explicit Problem(const Shape &shape) : s(shape) {
    std::mt19937 rng(1234);
    // Logits with a spread like a trained model's (std ~3): x in [-1, 1], w in [-a, a] with
    // a = 9 / sqrt(k) (std a sqrt(k) / 3); GPT-2's k = 768 gives a = 0.32.
    const float a = 9.f / std::sqrt(float(s.k));
    auto fill = [&](std::vector<float> &v, size_t n, float scale, Device<uint16_t> &d) {
      std::uniform_real_distribution<float> u(-scale, scale);
      std::vector<uint16_t> bits(n);
      v.resize(n);
      for (size_t i = 0; i < n; ++i) {
        bits[i] = toBf16(u(rng));
        v[i] = fromBf16(bits[i]);
      }
      d.upload(bits);
    };
    dx = std::make_unique<Device<uint16_t>>(size_t(s.rows * s.k));
    dw = std::make_unique<Device<uint16_t>>(size_t(s.columns * s.k));
    fill(x, size_t(s.rows * s.k), 1.f, *dx);
    fill(w, size_t(s.columns * s.k), a, *dw);
    if (s.columns <= 4096) {
      for (int64_t r = 0; r < s.rows; ++r)
        checked.push_back(r);
    } else { // the tiles' edges, the last (residue) tile's row and a few more
      for (int64_t r : {0, 1, 63, 64, 127, 128, 129, 255, 256, 383, 384, 511})
        if (r < s.rows)
          checked.push_back(r);
      for (int64_t r : {s.rows - 1, s.rows / 3, s.rows / 2 + 7})
        checked.push_back(r);
    }
    for (int64_t r : checked) {
      std::vector<double> l(size_t(s.classes));
      const float *xr = &x[size_t(r * s.k)];
      double m = -INFINITY;
      for (int64_t c = 0; c < s.classes; ++c) {
        const float *wr = &w[size_t(c * s.k)];
        double acc = 0;
        for (int64_t i = 0; i < s.k; ++i)
          acc += double(xr[i]) * double(wr[i]);
        l[size_t(c)] = acc;
        m = std::max(m, acc);
      }
      double sum = 0;
      for (double v : l)
        sum += std::exp(v - m);
      lse.push_back(m + std::log(sum));
      logits.push_back(std::move(l));
    }
  }
};

struct Variant {
  bool targetI32;
  Reduction reduction;
};

/// Runs the problem with random targets (row 0's the first class, row 1's the last valid one)
/// and checks every output against the reference.
void runVariant(const Problem &pr, const Variant &v, std::mt19937 &rng) {
  const Shape &s = pr.s;
  SCOPED_TRACE(std::string(s.name) + (v.targetI32 ? ", int32 targets" : ", int64 targets") +
               (v.reduction == Reduction::None  ? ", reduction none"
                : v.reduction == Reduction::Sum ? ", reduction sum"
                                                : ", reduction mean"));
  LinearCrossEntropy p;
  p.rows = s.rows;
  p.columns = s.columns;
  p.classes = s.classes;
  p.k = s.k;
  p.targetI32 = v.targetI32;
  p.reduction = v.reduction;

  std::vector<int64_t> target(size_t(s.rows));
  for (auto &t : target)
    t = int64_t(rng() % uint32_t(s.classes));
  target[0] = 0;
  if (s.rows > 1)
    target[1] = s.classes - 1;
  Device<int64_t> dTarget(target.size());
  if (v.targetI32) {
    std::vector<int32_t> t32(target.begin(), target.end());
    ASSERT_EQ(cudaMemcpy(dTarget.p, t32.data(), t32.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
  } else {
    dTarget.upload(target);
  }
  // g per row: gradOutput[row] (none), gradOutput (sum), gradOutput / rows (mean).
  std::vector<float> gradOutput;
  std::vector<double> g(size_t(s.rows));
  if (v.reduction == Reduction::None) {
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    gradOutput.resize(size_t(s.rows));
    for (size_t r = 0; r < gradOutput.size(); ++r)
      g[r] = gradOutput[r] = u(rng);
  } else {
    gradOutput = {0.5f};
    std::fill(g.begin(), g.end(), v.reduction == Reduction::Sum ? 0.5 : 0.5 / double(s.rows));
  }
  Device<float> dGradOutput(gradOutput.size()), dLoss(size_t(s.rows));
  dGradOutput.upload(gradOutput);
  const size_t n = size_t(s.rows * s.columns);
  Device<uint16_t> dResult(n);
  // Poison: every output must be written.
  ASSERT_EQ(cudaMemset(dResult.p, 0xff, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dLoss.p, 0xff, size_t(s.rows) * 4), cudaSuccess);
  Device<int32_t> dFault(1);
  ASSERT_EQ(cudaMemset(dFault.p, 0, 4), cudaSuccess);
  const size_t wsBytes = linearCrossEntropyWorkspaceBytes(p);
  // What forge-train --info and forgec --batch auto plan for it (forge/runtime/Bundle.h).
  EXPECT_EQ(wsBytes, forge::rt::linearCrossEntropyScratchBytes(p.rows, p.columns));
  ASSERT_GT(wsBytes, 0u);
  Device<char> ws(wsBytes);
  ASSERT_EQ(cudaMemset(ws.p, 0xff, wsBytes), cudaSuccess);

  ASSERT_EQ(runLinearCrossEntropy(p, pr.dx->p, pr.dw->p, dTarget.p, dGradOutput.p, dLoss.p,
                                  dResult.p, dFault.p, 7, ws.p, wsBytes, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dFault.download(1)[0], 0) << "valid targets raised the fault";
  const std::vector<float> loss = dLoss.download(size_t(s.rows));
  const std::vector<uint16_t> result = dResult.download(n);

  // Every row: padding exactly 0 and the gradient summing to 0 (its mass is 2 |g|).
  int badPadding = 0, badSums = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < s.columns; ++c) {
      const float got = fromBf16(result[size_t(r * s.columns + c)]);
      if (c >= s.classes)
        badPadding += got != 0.f;
      sum += got;
    }
    if (!(std::fabs(sum) <= std::ldexp(1.0, -7) * 2 * std::fabs(g[size_t(r)])) && ++badSums <= 3)
      ADD_FAILURE() << "row " << r << "'s gradient sums to " << sum << " (g " << g[size_t(r)]
                    << ")";
  }
  EXPECT_EQ(badPadding, 0) << "padding entries not exactly 0";
  EXPECT_EQ(badSums, 0) << "rows whose gradient does not sum to ~0";

  // The checked rows: the loss, and each gradient entry to bf16's rounding (2^-8) and f16 e's
  // (2^-11) with room, plus 2^-23 g for e below f16's normal range.
  int badLoss = 0, badEntries = 0;
  double worstEntry = 0;
  for (size_t i = 0; i < pr.checked.size(); ++i) {
    const int64_t r = pr.checked[i];
    const double lse = pr.lse[i], gr = g[size_t(r)];
    const int64_t t = target[size_t(r)];
    const double wantLoss = lse - pr.logits[i][size_t(t)];
    const double lossErr = std::fabs(double(loss[size_t(r)]) - wantLoss);
    if (!(lossErr <= 1e-5 * std::fabs(wantLoss) + 1e-6) && ++badLoss <= 3)
      ADD_FAILURE() << "row " << r << ": loss " << loss[size_t(r)] << ", want " << wantLoss;
    for (int64_t c = 0; c < s.classes; ++c) {
      const double want = gr * (std::exp(pr.logits[i][size_t(c)] - lse) - (c == t ? 1.0 : 0.0));
      const double got = fromBf16(result[size_t(r * s.columns + c)]);
      const double bound =
          std::ldexp(1.0, -7) * std::fabs(want) + std::ldexp(1.0, -23) * std::fabs(gr);
      const double ratio = std::fabs(got - want) / bound;
      worstEntry = std::max(worstEntry, std::isfinite(ratio) ? ratio : INFINITY);
      if (!(ratio <= 1.0) && ++badEntries <= 3)
        ADD_FAILURE() << "row " << r << " column " << c << (c == t ? " (target)" : "")
                      << ": gradient " << got << ", want " << want;
    }
  }
  EXPECT_EQ(badLoss, 0) << "losses off the reference";
  EXPECT_EQ(badEntries, 0) << "gradient entries off the reference (worst " << worstEntry
                           << " of the bound)";
}

class LinearCrossEntropyGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearCrossEntropyGpuTest, MatchesFloat64Reference) {
  if (const std::string why = whyNoGpu(); !why.empty())
    GTEST_SKIP() << why;
  const Problem pr(GetParam());
  std::mt19937 rng(99);
  runVariant(pr, {false, Reduction::Mean}, rng);
  runVariant(pr, {true, Reduction::None}, rng);
  runVariant(pr, {false, Reduction::Sum}, rng);
  runVariant(pr, {true, Reduction::Mean}, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearCrossEntropyGpuTest,
    ::testing::Values(
        // One tile row, 7 padding columns, a third column group holding 1 valid class.
        Shape{"rows 64, columns 264, classes 257, k 64", 64, 264, 257, 64},
        // Residues in both dimensions, no padding.
        Shape{"rows 300, columns 1000, classes 1000, k 128", 300, 1000, 1000, 128},
        // GPT-2's head (50257 classes padded to 50264), a 513th row alone in its tile.
        Shape{"rows 513, columns 50264, classes 50257, k 768", 513, 50264, 50257, 768},
        // A last column group of padding alone (m = -inf, s = 0): 136 columns, 128 classes.
        Shape{"rows 130, columns 136, classes 128, k 32", 130, 136, 128, 32}),
    [](const ::testing::TestParamInfo<Shape> &info) { return std::to_string(info.index); });

// A target out of range (== classes, or negative) stores the fault code; the run stays in
// bounds. A workspace one byte short is refused.
TEST(LinearCrossEntropyGpuFaultTest, OutOfRangeTargetRaisesFault) {
  if (const std::string why = whyNoGpu(); !why.empty())
    GTEST_SKIP() << why;
  const Problem pr({"fault", 64, 264, 257, 64});
  for (const bool i32 : {false, true}) {
    LinearCrossEntropy p;
    p.rows = 64;
    p.columns = 264;
    p.classes = 257;
    p.k = 64;
    p.targetI32 = i32;
    p.reduction = Reduction::Sum;
    std::vector<int64_t> target(64, 3);
    target[5] = i32 ? -1 : 257;
    Device<int64_t> dTarget(64);
    if (i32) {
      std::vector<int32_t> t32(target.begin(), target.end());
      ASSERT_EQ(cudaMemcpy(dTarget.p, t32.data(), 64 * 4, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      dTarget.upload(target);
    }
    Device<float> dGrad(1), dLoss(64);
    dGrad.upload({1.f});
    Device<uint16_t> dResult(64 * 264);
    Device<int32_t> dFault(1);
    ASSERT_EQ(cudaMemset(dFault.p, 0, 4), cudaSuccess);
    const size_t wsBytes = linearCrossEntropyWorkspaceBytes(p);
    Device<char> ws(wsBytes);
    EXPECT_EQ(runLinearCrossEntropy(p, pr.dx->p, pr.dw->p, dTarget.p, dGrad.p, dLoss.p, dResult.p,
                                    dFault.p, 42, ws.p, wsBytes - 1, nullptr),
              cudaErrorNotSupported);
    ASSERT_EQ(runLinearCrossEntropy(p, pr.dx->p, pr.dw->p, dTarget.p, dGrad.p, dLoss.p, dResult.p,
                                    dFault.p, 42, ws.p, wsBytes, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dFault.download(1)[0], 42) << (i32 ? "target -1" : "target == classes");
    // The other rows are still right (target 3).
    const std::vector<float> loss = dLoss.download(64);
    const double want = pr.lse[0] - pr.logits[0][3];
    EXPECT_NEAR(loss[0], want, 1e-5 * std::fabs(want) + 1e-6);
  }
}

// Problems that cannot run are refused before anything touches the GPU (no GPU needed: the
// pointers are never dereferenced).
TEST(LinearCrossEntropyTest, RefusesUnsupportedProblems) {
  alignas(16) static char buffer[4096];
  void *ok = buffer;
  const float *f = reinterpret_cast<const float *>(buffer);
  float *lf = reinterpret_cast<float *>(buffer);
  int32_t *fault = reinterpret_cast<int32_t *>(buffer);
  auto run = [&](const LinearCrossEntropy &p, const void *x) {
    return runLinearCrossEntropy(p, x, ok, ok, f, lf, ok, fault, 1, ok, sizeof buffer, nullptr);
  };
  LinearCrossEntropy p;
  p.rows = 64;
  p.columns = 264;
  p.classes = 257;
  p.k = 64;
  // x one bf16 element off 16-byte alignment.
  EXPECT_EQ(run(p, buffer + 2), cudaErrorNotSupported);
  LinearCrossEntropy q = p;
  q.columns = 260; // not a multiple of 8
  q.classes = 257;
  EXPECT_EQ(run(q, ok), cudaErrorNotSupported);
  q = p;
  q.k = 60;
  EXPECT_EQ(run(q, ok), cudaErrorNotSupported);
  q = p;
  q.classes = 265; // more classes than columns
  EXPECT_EQ(run(q, ok), cudaErrorNotSupported);
  q = p;
  q.classes = 0;
  EXPECT_EQ(run(q, ok), cudaErrorNotSupported);
  q = p;
  q.rows = int64_t(INT32_MAX) + 1;
  EXPECT_EQ(run(q, ok), cudaErrorNotSupported);
  // No rows: nothing to do.
  q = p;
  q.rows = 0;
  EXPECT_EQ(run(q, ok), cudaSuccess);
  EXPECT_EQ(linearCrossEntropyWorkspaceBytes(q), 0u);
}

} // namespace
