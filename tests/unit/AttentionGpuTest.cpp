// cuDNN fused attention as a library call of the CUDA executor (cuda/Attention.h): hand-built
// bundles with one "attention" and one "attention_grad" instruction, run on the GPU and
// compared with a float64 reference computed here from the same bf16/f16-rounded inputs.
// Skipped without a GPU. The checks of a malformed instruction need no GPU and always run.
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Executor.h"
#include "BundleTestUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>

#include <gtest/gtest.h>

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fb = forge::bundle;

namespace {

struct Case {
  const char *name;
  fb::DType dtype;
  int64_t B, H, Hk, Tq, Tk, D;
  bool causal;
  bool bshd = false; // layout "bshd": q/k/v/o and their gradients stored [B, T, H, D]
  std::vector<int64_t> bias = {}; // the additive bias's shape ([B|1, H|1, Tq|1, Tk]); none
};

/// Element offset of the bias at scores (b, h, i, j): dims of 1 broadcast.
int64_t biasAt(const Case &c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t at[4] = {b, h, i, j};
  int64_t off = 0;
  for (int d = 0; d < 4; ++d)
    off = off * c.bias[d] + (c.bias[d] == 1 ? 0 : at[d]);
  return off;
}

/// gtest (and ctest's test names) print a case by its name.
void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

/// [B, T, H, D] <-> [B, H, T, D] (the reference works in the latter).
std::vector<double> swapHeadsAndSeq(const std::vector<double> &x, int64_t b, int64_t n1,
                                    int64_t n2, int64_t d) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t a = 0; a < n1; ++a)
      for (int64_t c = 0; c < n2; ++c)
        for (int64_t e = 0; e < d; ++e)
          y[((i * n2 + c) * n1 + a) * d + e] = x[((i * n1 + a) * n2 + c) * d + e];
  return y;
}

int64_t alignUp(int64_t v) { return (v + 63) / 64 * 64; }

/// Adds tensors of a dtype to `p`, one after another in its arena (64-byte aligned).
struct ArenaTensors {
  fb::Program &p;
  int64_t offset = 0;
  int32_t operator()(const char *name, fb::TensorInfo::Kind kind,
                     const std::vector<int64_t> &shape, fb::DType dtype) {
    int32_t t = addTensor(p, name, kind, shape, offset);
    p.mutable_tensors(t)->set_dtype(dtype);
    offset += alignUp(numElements(shape) * static_cast<int64_t>(dtypeSize(dtype)));
    return t;
  }
};

/// Routine "forward": attention(q, k, v) -> o, lse. Routine "backward":
/// attention_grad(gq, gk, gv, go, glse, gdo) -> dq, dk, dv. `mutate` edits the program.
std::unique_ptr<Bundle> makeBundle(const Case &c,
                                   const std::function<void(fb::Program &)> &mutate = {}) {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("AttentionGpuTest");
  const std::vector<int64_t> qs = c.bshd ? std::vector<int64_t>{c.B, c.Tq, c.H, c.D}
                                        : std::vector<int64_t>{c.B, c.H, c.Tq, c.D},
                             ks = c.bshd ? std::vector<int64_t>{c.B, c.Tk, c.Hk, c.D}
                                         : std::vector<int64_t>{c.B, c.Hk, c.Tk, c.D},
                             ls = {c.B, c.H, c.Tq};
  ArenaTensors add{p};
  const auto IN = fb::TensorInfo::INPUT, OUT = fb::TensorInfo::OUTPUT;
  const bool bias = !c.bias.empty();
  std::vector<int32_t> fwd = {add("q", IN, qs, c.dtype), add("k", IN, ks, c.dtype),
                              add("v", IN, ks, c.dtype)};
  if (bias)
    fwd.push_back(add("bias", IN, c.bias, c.dtype));
  fwd.push_back(add("o", OUT, qs, c.dtype));
  fwd.push_back(add("lse", OUT, ls, fb::F32));
  std::vector<int32_t> bwd = {add("gq", IN, qs, c.dtype),  add("gk", IN, ks, c.dtype),
                              add("gv", IN, ks, c.dtype),  add("go", IN, qs, c.dtype),
                              add("glse", IN, ls, fb::F32), add("gdo", IN, qs, c.dtype)};
  if (bias)
    bwd.push_back(add("gbias", IN, c.bias, c.dtype));
  for (auto [n, s] : {std::pair("dq", qs), std::pair("dk", ks), std::pair("dv", ks)})
    bwd.push_back(add(n, OUT, s, c.dtype));
  p.set_arena_size(add.offset);
  auto routine = [&](const char *name, const char *op, const std::vector<int32_t> &ts,
                     int nIn) {
    fb::Routine *r = p.add_routines();
    r->set_name(name);
    fb::Instruction *inst = r->add_instructions();
    inst->set_op(op);
    inst->set_name(std::string("layer0/") + op);
    inst->set_placement(fb::LIBRARY);
    for (int i = 0; i < static_cast<int>(ts.size()); ++i) {
      (i < nIn ? inst->add_inputs(ts[i]) : inst->add_outputs(ts[i]));
      (i < nIn ? r->add_inputs(ts[i]) : r->add_outputs(ts[i]));
    }
    (*inst->mutable_attrs())["scale"].set_f(1.0 / std::sqrt(static_cast<double>(c.D)));
    (*inst->mutable_attrs())["causal"].set_i(c.causal ? 1 : 0);
    if (c.bshd)
      (*inst->mutable_attrs())["layout"].set_s("bshd");
  };
  routine("forward", "attention", fwd, bias ? 4 : 3);
  routine("backward", "attention_grad", bwd, bias ? 7 : 6);
  if (mutate)
    mutate(p);
  auto bundle = Bundle::fromBytes(w.serialize(), "attention.forge");
  EXPECT_TRUE(bundle.isOk()) << bundle.status().message();
  return bundle ? bundle.take() : nullptr;
}

// bf16 / f16 <-> float (the test's own decoding; narrowFloats rounds).
double decode(const uint8_t *p, fb::DType t) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (t == fb::BF16) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 31 ? (man ? NAN : INFINITY) // inf and nan (a fully masked row's -inf)
             : exp == 0 ? std::ldexp(man, -24)
                        : std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

/// Random values in [-a, a) rounded to `t`: the bytes and the rounded values.
std::pair<std::vector<uint8_t>, std::vector<double>> randomTensor(size_t n, fb::DType t,
                                                                  float a, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<float> f(n);
  for (float &x : f)
    x = u(rng);
  std::vector<uint8_t> bytes = narrowFloats(reinterpret_cast<const uint8_t *>(f.data()),
                                            n * sizeof(float), t);
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i)
    d[i] = decode(bytes.data() + 2 * i, t);
  return {bytes, d};
}

std::vector<double> toDoubles(const TensorView &v) {
  std::vector<double> d(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = v.dtype == fb::F32 ? static_cast<const float *>(v.data)[i]
                              : decode(static_cast<const uint8_t *>(v.data) + 2 * i, v.dtype);
  return d;
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

/// float64 attention and its gradients. The backward's D = rowsum(dO * O) uses `oUsed`
/// (the O fed to attention_grad, as cuDNN does).
Reference reference(const Case &c, const std::vector<double> &q, const std::vector<double> &k,
                    const std::vector<double> &v, const std::vector<double> &dO,
                    const std::vector<double> *oUsed, const std::vector<double> &bias = {}) {
  Reference r;
  const int64_t B = c.B, H = c.H, Hk = c.Hk, Tq = c.Tq, Tk = c.Tk, D = c.D, group = H / Hk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  r.o.assign(B * H * Tq * D, 0);
  r.lse.assign(B * H * Tq, 0);
  r.dq.assign(B * H * Tq * D, 0);
  r.dk.assign(B * Hk * Tk * D, 0);
  r.dv.assign(B * Hk * Tk * D, 0);
  std::vector<double> P(Tq * Tk), dS(Tq * Tk);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / group;
      const double *Q = &q[(b * H + h) * Tq * D], *K = &k[(b * Hk + kh) * Tk * D],
                   *V = &v[(b * Hk + kh) * Tk * D], *dOh = &dO[(b * H + h) * Tq * D];
      double *Oh = &r.o[(b * H + h) * Tq * D];
      for (int64_t i = 0; i < Tq; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < Tk; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += Q[i * D + d] * K[j * D + d];
          P[i * Tk + j] = (c.causal && j > i) ? -INFINITY
                          : scale * s + (bias.empty() ? 0.0 : bias[biasAt(c, b, h, i, j)]);
          m = std::max(m, P[i * Tk + j]);
        }
        if (m == -INFINITY) { // every key masked: o = 0, lse = -inf, no gradient
          r.lse[(b * H + h) * Tq + i] = -INFINITY;
          std::fill(&P[i * Tk], &P[i * Tk] + Tk, 0.0);
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < Tk; ++j)
          l += std::exp(P[i * Tk + j] - m);
        double lse = m + std::log(l);
        r.lse[(b * H + h) * Tq + i] = lse;
        for (int64_t j = 0; j < Tk; ++j)
          P[i * Tk + j] = std::exp(P[i * Tk + j] - lse);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < Tk; ++j)
            acc += P[i * Tk + j] * V[j * D + d];
          Oh[i * D + d] = acc;
        }
      }
      const double *Ou = oUsed ? &(*oUsed)[(b * H + h) * Tq * D] : Oh;
      double *dQ = &r.dq[(b * H + h) * Tq * D], *dK = &r.dk[(b * Hk + kh) * Tk * D],
             *dV = &r.dv[(b * Hk + kh) * Tk * D];
      for (int64_t i = 0; i < Tq; ++i) {
        double Di = 0;
        for (int64_t d = 0; d < D; ++d)
          Di += dOh[i * D + d] * Ou[i * D + d];
        for (int64_t j = 0; j < Tk; ++j) {
          double dP = 0;
          for (int64_t d = 0; d < D; ++d)
            dP += dOh[i * D + d] * V[j * D + d];
          dS[i * Tk + j] = P[i * Tk + j] * (dP - Di);
          for (int64_t d = 0; d < D; ++d)
            dV[j * D + d] += P[i * Tk + j] * dOh[i * D + d];
        }
      }
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j)
          for (int64_t d = 0; d < D; ++d) {
            dQ[i * D + d] += scale * dS[i * Tk + j] * K[j * D + d];
            dK[j * D + d] += scale * dS[i * Tk + j] * Q[i * D + d];
          }
    }
  return r;
}

double maxAbs(const std::vector<double> &a) {
  double m = 0;
  for (double x : a)
    m = std::max(m, std::fabs(x));
  return m;
}
double maxErr(const std::vector<double> &a, const std::vector<double> &b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// deterministic: cuDNN's deterministic backward (ExecutorOptions::deterministicAttention),
// whose dq must then be bit-identical between runs; else its default (atomic dq) backward.
void runCase(const Case &c, bool deterministic) {
  SCOPED_TRACE(std::string(c.name) + (deterministic ? ", deterministic" : ", fast"));
  auto bundle = makeBundle(c);
  ASSERT_TRUE(bundle);
  ASSERT_TRUE(checkLibraryCalls(*bundle).isOk());
  ExecutorOptions options{"cuda", 0, true};
  options.deterministicAttention = deterministic;
  auto ex = createExecutor(*bundle, options);
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  Executor &e = **ex;
  std::mt19937 rng(1234);
  const std::vector<int64_t> qs = c.bshd ? std::vector<int64_t>{c.B, c.Tq, c.H, c.D}
                                        : std::vector<int64_t>{c.B, c.H, c.Tq, c.D},
                             ks = c.bshd ? std::vector<int64_t>{c.B, c.Tk, c.Hk, c.D}
                                         : std::vector<int64_t>{c.B, c.Hk, c.Tk, c.D},
                             ls = {c.B, c.H, c.Tq};
  auto [qb, q] = randomTensor(numElements(qs), c.dtype, 1.0f, rng);
  auto [kb, k] = randomTensor(numElements(ks), c.dtype, 1.0f, rng);
  auto [vb, v] = randomTensor(numElements(ks), c.dtype, 1.0f, rng);
  auto [dob, dO] = randomTensor(numElements(qs), c.dtype, 1.0f, rng);
  // A mask-like bias: values in [-4, 4), a quarter of them -1e4 (hidden keys).
  std::vector<uint8_t> bb;
  std::vector<double> bias;
  if (!c.bias.empty()) {
    std::tie(bb, bias) = randomTensor(numElements(c.bias), c.dtype, 4.0f, rng);
    std::vector<float> f(bias.begin(), bias.end());
    for (size_t i = 0; i < f.size(); i += 4)
      f[i] = -1e4f;
    // With queries of their own (Tq > 1 in the bias): query row 1 of batch 0 (and of every
    // head the bias broadcasts over) sees no key at all: o = 0 there, lse = -inf.
    if (c.bias[2] > 1)
      for (int64_t j = 0; j < c.Tk; ++j)
        f[static_cast<size_t>(biasAt(c, 0, 0, 1, j))] = -INFINITY;
    bb = narrowFloats(reinterpret_cast<const uint8_t *>(f.data()), f.size() * sizeof(float),
                      c.dtype);
    for (size_t i = 0; i < f.size(); ++i)
      bias[i] = decode(bb.data() + 2 * i, c.dtype);
  }
  auto set = [&](int routine, const char *name, std::vector<uint8_t> &bytes, fb::DType t,
                 const std::vector<int64_t> &shape) {
    Status st = e.setInput(routine, name, TensorView{bytes.data(), t, shape});
    ASSERT_TRUE(st.isOk()) << st.message();
  };
  auto output = [&](int routine, const char *name) {
    auto t = e.findOutput(routine, name);
    EXPECT_TRUE(t.isOk());
    return toDoubles(e.view(*t));
  };
  // Three runs each: the first checked, then CUDA graph capture and replay.
  std::vector<uint8_t> oBytes, lseBytes;
  for (int run = 0; run < 3; ++run) {
    set(0, "q", qb, c.dtype, qs);
    set(0, "k", kb, c.dtype, ks);
    set(0, "v", vb, c.dtype, ks);
    if (!c.bias.empty())
      set(0, "bias", bb, c.dtype, c.bias);
    Status st = e.run(0);
    ASSERT_TRUE(st.isOk()) << st.message();
    st = e.wait();
    ASSERT_TRUE(st.isOk()) << st.message();
  }
  std::vector<double> o = output(0, "o"), lse = output(0, "lse");
  {
    TensorView ov = e.view(*e.findOutput(0, "o")), lv = e.view(*e.findOutput(0, "lse"));
    oBytes.assign(static_cast<uint8_t *>(ov.data), static_cast<uint8_t *>(ov.data) + ov.bytes());
    lseBytes.assign(static_cast<uint8_t *>(lv.data),
                    static_cast<uint8_t *>(lv.data) + lv.bytes());
  }
  std::vector<uint8_t> firstDq;
  for (int run = 0; run < 3; ++run) {
    set(1, "gq", qb, c.dtype, qs);
    set(1, "gk", kb, c.dtype, ks);
    set(1, "gv", vb, c.dtype, ks);
    set(1, "go", oBytes, c.dtype, qs);
    set(1, "glse", lseBytes, fb::F32, ls);
    set(1, "gdo", dob, c.dtype, qs);
    if (!c.bias.empty())
      set(1, "gbias", bb, c.dtype, c.bias);
    Status st = e.run(1);
    ASSERT_TRUE(st.isOk()) << st.message();
    st = e.wait();
    ASSERT_TRUE(st.isOk()) << st.message();
    TensorView dqv = e.view(*e.findOutput(1, "dq"));
    std::vector<uint8_t> dqBytes(static_cast<uint8_t *>(dqv.data),
                                 static_cast<uint8_t *>(dqv.data) + dqv.bytes());
    if (run == 0)
      firstDq = dqBytes;
    else if (deterministic) // bit-identical runs (the last one a graph replay)
      EXPECT_TRUE(dqBytes == firstDq) << "dq differs between run 1 and run " << run + 1;
  }
  std::vector<double> dq = output(1, "dq"), dk = output(1, "dk"), dv = output(1, "dv");
  Reference r;
  if (c.bshd) { // the reference in [B, H, T, D], its results back in [B, T, H, D]
    auto qh = [&](const std::vector<double> &x) { return swapHeadsAndSeq(x, c.B, c.Tq, c.H, c.D); };
    auto kh = [&](const std::vector<double> &x) { return swapHeadsAndSeq(x, c.B, c.Tk, c.Hk, c.D); };
    std::vector<double> oh = qh(o);
    r = reference(c, qh(q), kh(k), kh(v), qh(dO), &oh, bias);
    r.o = swapHeadsAndSeq(r.o, c.B, c.H, c.Tq, c.D);
    r.dq = swapHeadsAndSeq(r.dq, c.B, c.H, c.Tq, c.D);
    r.dk = swapHeadsAndSeq(r.dk, c.B, c.Hk, c.Tk, c.D);
    r.dv = swapHeadsAndSeq(r.dv, c.B, c.Hk, c.Tk, c.D);
  } else {
    r = reference(c, q, k, v, dO, &o, bias);
  }

  // Tolerances: o (bf16/f16 output of an f32-accumulated softmax) within 2e-2 absolute +
  // 2e-2 relative per element; lse (f32) within 1e-3 absolute; the gradients (bf16/f16,
  // summed over keys or queries) within 3e-2 of the largest reference magnitude.
  double oErr = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    double err = std::fabs(o[i] - r.o[i]);
    oErr = std::max(oErr, err);
    ASSERT_LE(err, 2e-2 + 2e-2 * std::fabs(r.o[i])) << "o[" << i << "]";
  }
  // lse where a row sees keys; -inf (or below -1e30) where it sees none.
  double lseErr = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(r.lse[i])) {
      EXPECT_TRUE(lse[i] < -1e30) << "lse[" << i << "] = " << lse[i] << " of a fully masked row";
      continue;
    }
    lseErr = std::max(lseErr, std::fabs(lse[i] - r.lse[i]));
  }
  EXPECT_LE(lseErr, 1e-3);
  for (auto [name, g] : {std::pair("dq", &dq), std::pair("dk", &dk), std::pair("dv", &dv)})
    EXPECT_TRUE(std::all_of(g->begin(), g->end(), [](double x) { return std::isfinite(x); }))
        << name << " has a non-finite element";
  double dqErr = maxErr(dq, r.dq) / maxAbs(r.dq), dkErr = maxErr(dk, r.dk) / maxAbs(r.dk),
         dvErr = maxErr(dv, r.dv) / maxAbs(r.dv);
  EXPECT_LE(dqErr, 3e-2);
  EXPECT_LE(dkErr, 3e-2);
  EXPECT_LE(dvErr, 3e-2);
  // A systematic error (one that does not cancel between rows) shows in the sums over all
  // rows, which is what a bias before the attention (a LayerNorm's) accumulates: each
  // column's sum within 3e-2 of the largest column sum of magnitudes. (Not of the sums
  // themselves: dk's are exactly 0 in exact arithmetic, softmax ignoring a shift of every
  // key, so a bf16 kernel's residue there is all noise; the compiler's gradient rule
  // centres dk over the keys for that reason, see LibraryGradients.cpp.)
  auto sumErr = [&](const std::vector<double> &got, const std::vector<double> &want) {
    std::vector<double> a(c.D, 0.0), b(c.D, 0.0), mag(c.D, 0.0);
    for (size_t i = 0; i < got.size(); ++i) {
      a[i % c.D] += got[i];
      b[i % c.D] += want[i];
      mag[i % c.D] += std::fabs(want[i]);
    }
    return maxErr(a, b) / std::max(maxAbs(mag), 1e-30);
  };
  double dqSum = sumErr(dq, r.dq), dkSum = sumErr(dk, r.dk), dvSum = sumErr(dv, r.dv);
  EXPECT_LE(dqSum, 3e-2);
  EXPECT_LE(dkSum, 3e-2);
  EXPECT_LE(dvSum, 3e-2);
  std::printf("[%s] max |o err| %.3g, |lse err| %.3g, grads err / max: dq %.3g dk %.3g dv %.3g; "
              "row sums: dq %.3g dk %.3g dv %.3g\n",
              c.name, oErr, lseErr, dqErr, dkErr, dvErr, dqSum, dkSum, dvSum);
}

bool haveGpu() { return cudaAvailable(); }

} // namespace

// One test per case: bf16/f16, causal or not, Tq != Tk, GQA/MQA, the gpt fixture's small
// heads (tests/fixtures/gpt_*: head size 16, 32 tokens), and layout bshd (the compiler's
// folded head transposes: cuDNN reads [B, T, H, D] strided).
class AttentionCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCaseTest, MatchesFloat64Reference) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  runCase(GetParam(), /*deterministic=*/false); // forge-train's default
  runCase(GetParam(), /*deterministic=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    AttentionGpuTest, AttentionCaseTest,
    ::testing::Values(
        Case{"bf16 causal", fb::BF16, 2, 4, 4, 128, 128, 64, true},
        Case{"bf16 non-causal Tq!=Tk", fb::BF16, 2, 3, 3, 80, 144, 64, false},
        Case{"f16 causal D128", fb::F16, 1, 4, 4, 128, 128, 128, true},
        Case{"bf16 causal D16 T32", fb::BF16, 4, 4, 4, 32, 32, 16, true},
        Case{"f16 causal D16 T32", fb::F16, 4, 4, 4, 32, 32, 16, true},
        Case{"bf16 bshd causal (GPT-2's heads)", fb::BF16, 2, 12, 12, 512, 512, 64, true, true},
        Case{"f16 bshd GQA 8/2 non-causal Tq!=Tk", fb::F16, 2, 8, 2, 96, 160, 32, false, true},
        Case{"bf16 GQA 8/2 causal", fb::BF16, 2, 8, 2, 128, 128, 64, true},
        Case{"bf16 MQA 4/1 non-causal Tq!=Tk", fb::BF16, 1, 4, 1, 64, 192, 32, false},
        // Additive biases: a padding mask [B, 1, 1, Tk], a full [B, H, Tq, Tk] one in
        // layout bshd, and LLaMA's [1, 1, Tq, Tk] with GQA (the last two with a row that sees
        // no key: o = 0 there).
        Case{"bf16 padding bias", fb::BF16, 2, 4, 4, 64, 96, 64, false, false, {2, 1, 1, 96}},
        Case{"f16 bshd full bias", fb::F16, 2, 4, 4, 64, 64, 32, false, true, {2, 4, 64, 64}},
        Case{"bf16 GQA 8/2 [1, 1, Tq, Tk] bias", fb::BF16, 1, 8, 2, 128, 128, 64, false, false,
             {1, 1, 128, 128}}),
    [](const ::testing::TestParamInfo<Case> &info) { return std::to_string(info.index); });

// Two layers of one problem (the second reads the first's o as q, k and v) share one
// built cuDNN graph (AttentionCache), each plan with its own operands.
TEST(AttentionGpuTest, TwoLayersShareAGraph) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  const Case c{"two layers", fb::BF16, 1, 2, 2, 64, 64, 64, true};
  const std::vector<int64_t> s4 = {c.B, c.H, c.Tq, c.D}, s3 = {c.B, c.H, c.Tq};
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("AttentionGpuTest");
  ArenaTensors add{p};
  int32_t q = add("q", fb::TensorInfo::INPUT, s4, c.dtype),
          k = add("k", fb::TensorInfo::INPUT, s4, c.dtype),
          v = add("v", fb::TensorInfo::INPUT, s4, c.dtype),
          o1 = add("o1", fb::TensorInfo::OUTPUT, s4, c.dtype),
          l1 = add("l1", fb::TensorInfo::OUTPUT, s3, fb::F32),
          o2 = add("o2", fb::TensorInfo::OUTPUT, s4, c.dtype),
          l2 = add("l2", fb::TensorInfo::OUTPUT, s3, fb::F32);
  p.set_arena_size(add.offset);
  fb::Routine *r = p.add_routines();
  r->set_name("forward");
  for (int32_t t : {q, k, v})
    r->add_inputs(t);
  for (int32_t t : {o1, l1, o2, l2})
    r->add_outputs(t);
  auto layer = [&](const char *name, std::vector<int32_t> in, std::vector<int32_t> out) {
    fb::Instruction *inst = r->add_instructions();
    inst->set_op("attention");
    inst->set_name(name);
    inst->set_placement(fb::LIBRARY);
    for (int32_t t : in)
      inst->add_inputs(t);
    for (int32_t t : out)
      inst->add_outputs(t);
    (*inst->mutable_attrs())["scale"].set_f(1.0 / std::sqrt(static_cast<double>(c.D)));
    (*inst->mutable_attrs())["causal"].set_i(1);
  };
  layer("h0/attention", {q, k, v}, {o1, l1});
  layer("h1/attention", {o1, o1, o1}, {o2, l2});
  auto bundle = Bundle::fromBytes(w.serialize(), "two-layers.forge");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  auto ex = createExecutor(**bundle, ExecutorOptions{"cuda", 0, true});
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  Executor &e = **ex;
  std::mt19937 rng(99);
  auto [qb, qd] = randomTensor(numElements(s4), c.dtype, 1.0f, rng);
  auto [kb, kd] = randomTensor(numElements(s4), c.dtype, 1.0f, rng);
  auto [vb, vd] = randomTensor(numElements(s4), c.dtype, 1.0f, rng);
  ASSERT_TRUE(e.setInput(0, "q", TensorView{qb.data(), c.dtype, s4}).isOk());
  ASSERT_TRUE(e.setInput(0, "k", TensorView{kb.data(), c.dtype, s4}).isOk());
  ASSERT_TRUE(e.setInput(0, "v", TensorView{vb.data(), c.dtype, s4}).isOk());
  ASSERT_TRUE(e.run(0).isOk());
  Status st = e.wait();
  ASSERT_TRUE(st.isOk()) << st.message();
  std::vector<double> out1 = toDoubles(e.view(o1)), lse1 = toDoubles(e.view(l1)),
                      out2 = toDoubles(e.view(o2)), lse2 = toDoubles(e.view(l2));
  Reference r1 = reference(c, qd, kd, vd, qd, nullptr);
  Reference r2 = reference(c, out1, out1, out1, out1, nullptr); // from layer 0's real output
  EXPECT_LE(maxErr(out1, r1.o), 2e-2);
  EXPECT_LE(maxErr(lse1, r1.lse), 1e-3);
  EXPECT_LE(maxErr(out2, r2.o), 2e-2);
  EXPECT_LE(maxErr(lse2, r2.lse), 1e-3);
  std::printf("[two layers] max |o err| %.3g / %.3g, |lse err| %.3g / %.3g\n",
              maxErr(out1, r1.o), maxErr(out2, r2.o), maxErr(lse1, r1.lse), maxErr(lse2, r2.lse));
}

// Without a GPU: malformed instructions are refused by the executor's checks
// (checkLibraryCalls -> checkAttention) with a message naming the instruction.
namespace {
void expectRefused(const Case &c, const std::function<void(fb::Program &)> &mutate,
                   const std::string &needle,
                   const std::string &where = "instruction #0 'layer0/attention'") {
  auto bundle = makeBundle(c, mutate);
  ASSERT_TRUE(bundle);
  Status st = checkLibraryCalls(*bundle);
  ASSERT_FALSE(st.isOk()) << "expected an error containing: " << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(where), std::string::npos) << st.message();
}
} // namespace

TEST(AttentionGpuTest, MalformedInstructionsAreRefused) {
  const Case ok{"ok", fb::BF16, 2, 4, 2, 16, 24, 64, false};
  {
    auto bundle = makeBundle(ok);
    ASSERT_TRUE(bundle);
    Status st = checkLibraryCalls(*bundle);
    EXPECT_TRUE(st.isOk()) << st.message();
  }
  expectRefused({"d", fb::BF16, 2, 4, 2, 16, 24, 12, false}, {}, "head dim 12");
  expectRefused({"d", fb::BF16, 2, 4, 2, 16, 24, 256, false}, {}, "head dim 256");
  expectRefused({"f32", fb::F32, 2, 4, 2, 16, 24, 64, false}, {}, "q is f32");
  expectRefused({"gqa", fb::BF16, 2, 6, 4, 16, 24, 64, false}, {},
                "6 heads are not a multiple of k/v's 4 heads");
  // One operand of the wrong dtype or shape, in the backward.
  const std::string grad = "instruction #0 'layer0/attention_grad'";
  expectRefused(ok, [](fb::Program &p) { p.mutable_tensors(9)->set_dtype(fb::BF16); },
                "lse is bf16, expected f32", grad);
  expectRefused(ok, [](fb::Program &p) { p.mutable_tensors(12)->set_shape(2, 20); },
                "dk is [2, 2, 20, 64], expected [2, 2, 24, 64]", grad);
  expectRefused(ok, [](fb::Program &p) { p.mutable_tensors(1)->set_shape(0, 3); },
                "k [3, 2, 24, 64] does not match q");
  expectRefused(ok, [](fb::Program &p) {
    p.mutable_routines(0)->mutable_instructions(0)->mutable_attrs()->erase("scale");
  }, "attribute 'scale'");
  expectRefused(ok, [](fb::Program &p) {
    (*p.mutable_routines(0)->mutable_instructions(0)->mutable_attrs())["causal"].set_i(2);
  }, "attribute 'causal'");
  expectRefused(ok, [](fb::Program &p) {
    p.mutable_routines(0)->mutable_instructions(0)->mutable_outputs()->RemoveLast();
  }, "attention needs 3 inputs (q, k, v, and optionally a bias) and 2 outputs (o, lse), not 3 "
     "and 1");
  // The bias (tensor 3, the forward's fourth input): a shape that does not broadcast to the
  // scores, another dtype.
  const Case biased{"bias", fb::BF16, 2, 4, 2, 16, 24, 64, false, false, {2, 1, 1, 24}};
  {
    auto bundle = makeBundle(biased);
    ASSERT_TRUE(bundle);
    Status st = checkLibraryCalls(*bundle);
    EXPECT_TRUE(st.isOk()) << st.message();
  }
  expectRefused(biased, [](fb::Program &p) { p.mutable_tensors(3)->set_shape(3, 23); },
                "bias is [2, 1, 1, 23], expected [B, H, Tq, Tk] = [2, 4, 16, 24]");
  expectRefused(biased, [](fb::Program &p) { p.mutable_tensors(3)->set_dtype(fb::F16); },
                "bias is f16, expected bf16");
  // causal beside a bias: cuDNN's causal fill is finite (a fully masked row would not be 0).
  expectRefused(biased, [](fb::Program &p) {
    (*p.mutable_routines(0)->mutable_instructions(0)->mutable_attrs())["causal"].set_i(1);
  }, "causal with a bias");
}

// The CUDA executor's other GPU checks live in this binary too (the GPU machines carry it).
// A plan larger than the device: the error names the planned arena at the bundle's batch
// and a batch that would fit (about batch * (90% of free - the rest) / arena, a multiple of
// 8 from 8 on), never a crash. A 400 GB arena at batch 64 on a GPU of 24-141 GB: 3-20.
TEST(CudaExecutorGpuTest, OutOfMemoryNamesABatchThatFits) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("CudaExecutorGpuTest");
  ArenaTensors add{p};
  int32_t x = add("x", fb::TensorInfo::INPUT, {64, 4}, fb::F32);
  int32_t y = add("y", fb::TensorInfo::OUTPUT, {64, 4}, fb::F32);
  p.set_arena_size(int64_t(400) * 1000 * 1000 * 1000);
  (*p.mutable_build_options())["batch"] = "64";
  fb::Routine *r = p.add_routines();
  r->set_name("forward");
  r->add_inputs(x);
  r->add_outputs(y);
  fb::Instruction *inst = r->add_instructions();
  inst->set_op("copy");
  inst->set_name("copy");
  inst->set_placement(fb::DEVICE_COPY);
  inst->add_inputs(x);
  inst->add_outputs(y);
  auto bundle = Bundle::fromBytes(w.serialize(), "huge.forge");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  auto ex = createExecutor(**bundle, ExecutorOptions{"cuda", 0, true});
  ASSERT_FALSE(ex.isOk());
  const std::string m = ex.status().message();
  EXPECT_NE(m.find("cannot allocate"), std::string::npos) << m;
  EXPECT_NE(m.find("at batch 64"), std::string::npos) << m;
  size_t at = m.find("a batch of about ");
  ASSERT_NE(at, std::string::npos) << m;
  int n = std::atoi(m.c_str() + at + std::strlen("a batch of about "));
  EXPECT_GE(n, 1) << m;
  EXPECT_LT(n, 64) << m;
  if (n >= 8)
    EXPECT_EQ(n % 8, 0) << m;
}

// --profile's spans: a device copy whose result shares its operand's bytes (a reshape the
// memory plan aliased) issues nothing, so it gets no span (its two events alone read as
// ~1.5 us of "copy": 0.6 ms a step of GPT-2's profile that no unprofiled step has); the
// real copies beside it keep theirs, and the result is the copied input.
TEST(CudaExecutorGpuTest, ProfileLeavesOutCopiesThatIssueNothing) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU";
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("CudaExecutorGpuTest");
  ArenaTensors add{p};
  int32_t x = add("x", fb::TensorInfo::INPUT, {64, 4}, fb::F32);
  const int64_t aAt = add.offset;
  int32_t a = add("a", fb::TensorInfo::INTERMEDIATE, {64, 4}, fb::F32);
  int32_t b = addTensor(p, "b", fb::TensorInfo::INTERMEDIATE, {256}, aAt); // a's bytes
  int32_t y = add("y", fb::TensorInfo::OUTPUT, {256}, fb::F32);
  p.set_arena_size(add.offset);
  fb::Routine *r = p.add_routines();
  r->set_name("forward");
  r->add_inputs(x);
  r->add_outputs(y);
  auto copy = [&](const char *op, int32_t from, int32_t to) {
    fb::Instruction *inst = r->add_instructions();
    inst->set_op(op);
    inst->set_name(op);
    inst->set_placement(fb::DEVICE_COPY);
    inst->add_inputs(from);
    inst->add_outputs(to);
  };
  copy("copy", x, a);
  copy("reshape", a, b); // issues nothing: b is a
  copy("identity", b, y);
  auto bundle = Bundle::fromBytes(w.serialize(), "copies.forge");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  auto ex = createExecutor(**bundle, ExecutorOptions{"cuda", 0, true});
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  Executor &e = **ex;
  std::vector<float> in(256);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = 0.5f * static_cast<float>(i) - 7.0f;
  ASSERT_TRUE(e.setInput(0, "x", TensorView{in.data(), fb::F32, {64, 4}}).isOk());
  auto spans = e.runProfiled(0);
  ASSERT_TRUE(spans.isOk()) << spans.status().message();
  Status st = e.wait();
  ASSERT_TRUE(st.isOk()) << st.message();
  std::vector<int> timed;
  for (const Executor::Span &s : *spans)
    if (s.instruction >= 0)
      timed.push_back(s.instruction);
  EXPECT_EQ(timed, (std::vector<int>{0, 2}));
  std::vector<double> out = toDoubles(e.view(y));
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i], static_cast<double>(in[i])) << "element " << i;
}
