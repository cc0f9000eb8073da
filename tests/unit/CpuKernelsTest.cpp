// Tests of the CPU kernels (runtime/lib/cpu) through runCpuKernel.
//
// Every numeric kernel is compared with a naive float64 reference written
// here (independent loops over unravelled indices), on seeded random inputs
// that include broadcasting and non-square shapes; movement ops are checked on
// small hand-computed cases. Tolerances: f32 |got - want| <= 1e-5 * |want| +
// 1e-5, f64 1e-12, f16/bf16 one unit in the last place of the format.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "../../runtime/lib/cpu/KernelUtil.h"
#include "forge/runtime/Kernels.h"
#include "forge/runtime/Philox.h"

using namespace forge::rt;
using forge::rt::cpu::BFloat16;
using forge::rt::cpu::Half;
namespace bundle = forge::bundle;

namespace {

//===----------------------------------------------------------------------===//
// Harness
//===----------------------------------------------------------------------===//

ThreadPool &pool() {
  static ThreadPool p(4); // more threads than cores: exercises chunking
  return p;
}

struct HT {
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HT() = default;
  HT(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
    bytes.assign(std::max<int64_t>(numel(), 0) * dtypeSize(t), 0xCD); // poison
  }
  int64_t numel() const { return numElements(shape); }
  template <typename T> T *data() { return reinterpret_cast<T *>(bytes.data()); }
  template <typename T> const T *data() const { return reinterpret_cast<const T *>(bytes.data()); }
  TensorView view() { return TensorView{bytes.data(), dtype, shape}; }

  /// Element i converted to double (any numeric dtype).
  double at(int64_t i) const {
    switch (dtype) {
    case bundle::F32:
      return data<float>()[i];
    case bundle::F64:
      return data<double>()[i];
    case bundle::F16:
      return cpu::halfToFloat(data<uint16_t>()[i]);
    case bundle::BF16:
      return cpu::bf16ToFloat(data<uint16_t>()[i]);
    case bundle::I64:
      return double(data<int64_t>()[i]);
    case bundle::I32:
      return data<int32_t>()[i];
    case bundle::I8:
      return data<int8_t>()[i];
    case bundle::U32:
      return data<uint32_t>()[i];
    case bundle::U64:
      return double(data<uint64_t>()[i]);
    case bundle::U8:
    case bundle::BOOL:
      return data<uint8_t>()[i];
    default:
      ADD_FAILURE() << "at(): dtype";
      return 0;
    }
  }
  std::vector<double> values() const {
    std::vector<double> v(numel());
    for (int64_t i = 0; i < numel(); ++i)
      v[i] = at(i);
    return v;
  }
};

/// A tensor of dtype t holding `values` (converted).
HT make(DType t, std::vector<int64_t> shape, const std::vector<double> &values) {
  HT h(t, std::move(shape));
  EXPECT_EQ((int64_t)values.size(), h.numel());
  for (int64_t i = 0; i < h.numel(); ++i) {
    double v = values[i];
    switch (t) {
    case bundle::F32:
      h.data<float>()[i] = float(v);
      break;
    case bundle::F64:
      h.data<double>()[i] = v;
      break;
    case bundle::F16:
      h.data<uint16_t>()[i] = cpu::floatToHalf(float(v));
      break;
    case bundle::BF16:
      h.data<uint16_t>()[i] = cpu::floatToBf16(float(v));
      break;
    case bundle::I64:
      h.data<int64_t>()[i] = int64_t(v);
      break;
    case bundle::I32:
      h.data<int32_t>()[i] = int32_t(v);
      break;
    case bundle::I8:
      h.data<int8_t>()[i] = int8_t(v);
      break;
    case bundle::U32:
      h.data<uint32_t>()[i] = uint32_t(v);
      break;
    case bundle::U64:
      h.data<uint64_t>()[i] = uint64_t(v);
      break;
    case bundle::U8:
    case bundle::BOOL:
      h.data<uint8_t>()[i] = uint8_t(v);
      break;
    default:
      ADD_FAILURE() << "make(): dtype";
    }
  }
  return h;
}

std::mt19937 &rng() {
  static std::mt19937 g(20240611);
  return g;
}

std::vector<double> randomValues(int64_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double &x : v)
    x = d(rng());
  return v;
}
std::vector<double> randomInts(int64_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<double> v(n);
  for (double &x : v)
    x = d(rng());
  return v;
}
HT randomTensor(DType t, std::vector<int64_t> shape, double lo = -1, double hi = 1) {
  int64_t n = numElements(shape);
  return make(t, std::move(shape), randomValues(n, lo, hi));
}

/// Builds and runs one instruction.
struct Op {
  bundle::Instruction inst;
  explicit Op(const std::string &name) {
    inst.set_op(name);
    inst.set_name("node_" + name);
  }
  bundle::Attribute &attr(const std::string &k) { return (*inst.mutable_attrs())[k]; }
  Op &i(const std::string &k, int64_t v) {
    attr(k).set_i(v);
    return *this;
  }
  Op &f(const std::string &k, double v) {
    attr(k).set_f(v);
    return *this;
  }
  Op &s(const std::string &k, const std::string &v) {
    attr(k).set_s(v);
    return *this;
  }
  Op &ints(const std::string &k, const std::vector<int64_t> &v) {
    auto *list = attr(k).mutable_ints();
    list->clear_values();
    for (int64_t x : v)
      list->add_values(x);
    return *this;
  }
  Op &dt(const std::string &k, DType v) {
    attr(k).set_dtype(v);
    return *this;
  }
  /// nullptr inputs are absent optional operands.
  Status run(std::vector<HT *> ins, std::vector<HT *> outs) const {
    std::vector<TensorView> iv, ov;
    for (HT *h : ins)
      iv.push_back(h ? h->view() : TensorView{});
    for (HT *h : outs)
      ov.push_back(h->view());
    return runCpuKernel(inst, iv, ov, pool());
  }
};

#define EXPECT_OK(expr)                                                                            \
  do {                                                                                             \
    Status _s = (expr);                                                                            \
    EXPECT_TRUE(_s.isOk()) << _s.message();                                                        \
  } while (0)
#define ASSERT_OK(expr)                                                                            \
  do {                                                                                             \
    Status _s = (expr);                                                                            \
    ASSERT_TRUE(_s.isOk()) << _s.message();                                                        \
  } while (0)

double tolFor(DType t) {
  switch (t) {
  case bundle::F64:
    return 1e-12;
  case bundle::F16:
    return 1.0 / 1024;
  case bundle::BF16:
    return 1.0 / 128;
  default:
    return 1e-5;
  }
}

void expectNear(const HT &got, const std::vector<double> &want, double rel, double abs,
                const std::string &what = "") {
  ASSERT_EQ(got.numel(), (int64_t)want.size()) << what;
  int failures = 0;
  for (int64_t i = 0; i < got.numel() && failures < 5; ++i) {
    double g = got.at(i), w = want[i];
    bool ok = (std::isnan(w) && std::isnan(g)) || (std::isinf(w) && g == w) ||
              std::abs(g - w) <= abs + rel * std::abs(w);
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
    }
  }
}
void expectNear(const HT &got, const std::vector<double> &want, const std::string &what = "") {
  double t = tolFor(got.dtype);
  expectNear(got, want, t, t, what);
}
void expectEqual(const HT &got, const std::vector<double> &want, const std::string &what = "") {
  expectNear(got, want, 0, 0, what);
}

//===----------------------------------------------------------------------===//
// Index helpers for the references
//===----------------------------------------------------------------------===//

std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t> &shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t> &idx, const std::vector<int64_t> &shape) {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    off = off * shape[d] + idx[d];
  return off;
}
/// Offset in a tensor of shape `in` of the output multi-index (NumPy broadcast).
int64_t broadcastOffset(const std::vector<int64_t> &outIdx, const std::vector<int64_t> &in) {
  std::vector<int64_t> idx(in.size());
  size_t lead = outIdx.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    idx[d] = in[d] == 1 ? 0 : outIdx[lead + d];
  return ravel(idx, in);
}
std::vector<int64_t> broadcastShapes(std::vector<int64_t> a, std::vector<int64_t> b) {
  while (a.size() < b.size())
    a.insert(a.begin(), 1);
  while (b.size() < a.size())
    b.insert(b.begin(), 1);
  for (size_t d = 0; d < a.size(); ++d)
    a[d] = a[d] == 1 ? b[d] : a[d];
  return a;
}

//===----------------------------------------------------------------------===//
// Registry and attributes
//===----------------------------------------------------------------------===//

TEST(CpuKernels, RegistryCoversEveryDialectOp) {
  // Every mnemonic of compiler/include/forge/Dialect/ForgeOps.td (and ForgeGradOps.td).
  const std::vector<std::string> ops = {
      "add", "sub", "mul", "div", "pow", "min", "max", "and", "or", "xor", "mod", "bitwise_and",
      "bitwise_or", "bitwise_xor", "bit_shift", "equal", "less", "greater", "less_equal",
      "greater_equal", "neg", "abs", "exp", "log", "sqrt", "reciprocal", "tanh", "sigmoid", "relu",
      "erf", "softplus", "hard_swish", "not", "bitwise_not", "sin", "cos", "tan", "asin", "acos",
      "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "leaky_relu", "elu", "selu",
      "thresholded_relu", "gelu", "hard_sigmoid", "clip", "isnan", "isinf", "cast", "where",
      "matmul", "gemm", "scaled_gemm", "conv", "conv_transpose", "max_pool", "avg_pool",
      "batch_norm", "batch_norm_training", "layer_norm", "group_norm", "attention", "softmax",
      "log_softmax", "nll_loss", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
      "reduce_prod", "reduce_l2", "argmax", "top_k", "cumsum", "constant", "reshape", "transpose",
      "broadcast", "concat", "split", "slice", "pad", "tile", "gather", "gather_elements",
      "scatter_elements", "trilu", "one_hot", "resized_crop", "dropout", "dropout_mask", "floor",
      "ceil", "round",
      // Backward-only ops (ForgeGradOps.td).
      "conv_grad_weight", "max_pool_grad", "avg_pool_grad", "batch_norm_training_grad",
      "layer_norm_grad", "group_norm_grad", "gelu_grad", "relu_bitmask", "relu_grad_bitmask",
      "softmax_grad", "log_softmax_grad", "nll_loss_grad", "cross_entropy", "cross_entropy_grad",
      "cross_entropy_with_grad", "linear_cross_entropy_with_grad", "gather_grad",
      "gather_elements_grad", "slice_grad", "pad_grad", "attention_grad",
      // Bundle-level op (BundleEmitter write-back).
      "copy",
      // The data-parallel collective (forgec --dp).
      "all_reduce",
      // ZeRO-1's (forgec --zero 1).
      "reduce_scatter", "all_gather", "rank_slice",
      // Pipeline messages (forgec --pp).
      "send", "recv"};
  for (const std::string &op : ops)
    EXPECT_NE(findCpuKernel(op), nullptr) << op;
  std::vector<std::string> names = cpuKernelNames();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(names.size(), ops.size());
  EXPECT_EQ(findCpuKernel("no_such_op"), nullptr);
}

// transposeBytes (stored permuted parameters): against index arithmetic in float64 terms,
// and the inverse permutation restores the bytes.
TEST(CpuKernels, TransposeBytesMatchesIndexArithmetic) {
  const std::vector<int64_t> shape = {3, 4, 2, 5}; // [O, C, kh, kw]
  const int64_t perm[] = {0, 2, 3, 1}, inv[] = {0, 3, 1, 2};
  std::vector<float> x(3 * 4 * 2 * 5);
  std::iota(x.begin(), x.end(), 0.5f);
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t *>(x.data()), x.size() * 4);
  std::vector<uint8_t> t = forge::rt::transposeBytes(bytes, shape, perm, 4);
  ASSERT_EQ(t.size(), bytes.size());
  const float *y = reinterpret_cast<const float *>(t.data());
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t w = 0; w < 5; ++w)
          ASSERT_EQ(y[((o * 2 + h) * 5 + w) * 4 + c], x[((o * 4 + c) * 2 + h) * 5 + w])
              << o << " " << c << " " << h << " " << w;
  std::vector<uint8_t> back = forge::rt::transposeBytes(t, {3, 2, 5, 4}, inv, 4);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin(), bytes.end()));
}

TEST(CpuKernels, RoundHalfToEven) {
  // Round is half to even (ONNX), not half away from zero; -0 keeps its sign.
  HT x = make(bundle::F32, {8}, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999, -0.4}), y(bundle::F32, {8});
  EXPECT_OK(Op("round").run({&x}, {&y}));
  std::vector<double> want = {0, 2, 2, -0.0, -2, -2, 3, -0.0};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y.at(i), want[i]) << i;
    EXPECT_EQ(std::signbit(y.at(i)), std::signbit(want[i])) << i;
  }
}

TEST(CpuKernels, PhiloxKnownAnswers) {
  // Random123's known-answer vectors for Philox4x32-10 (kat_vectors), which
  // cuRAND's Philox4x32-10 also reproduces.
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(CpuKernels, DropoutMask) {
  // dropout_mask equals dropoutKeep element by element whatever the thread
  // split (the pool has 4 threads), keeps ~(1 - ratio), and depends on the step.
  const int64_t n = 10007; // not a multiple of 4: the last Philox block is partial
  auto maskOf = [&](double ratio, int64_t seed, float step, std::vector<int64_t> shape,
                    int64_t rank, int64_t first, int64_t rankSamples, int64_t batch) {
    HT s = make(bundle::F32, {}, {step}), r = make(bundle::I64, {}, {double(rank)}),
       m(bundle::BOOL, shape);
    EXPECT_OK(Op("dropout_mask")
                  .f("ratio", ratio)
                  .i("seed", seed)
                  .i("first_sample", first)
                  .i("rank_samples", rankSamples)
                  .i("batch", batch)
                  .run({&s, &r}, {&m}));
    return m.values();
  };
  auto maskAt = [&](double ratio, int64_t seed, float step) {
    return maskOf(ratio, seed, step, {n}, 0, 0, 0, 1);
  };
  std::vector<double> a = maskAt(0.3, 12345, 7), b = maskAt(0.3, 12345, 8);
  uint64_t threshold = dropoutThreshold(0.3);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i] != 0, dropoutKeep(12345, 7, uint64_t(i), threshold)) << i;
    kept += a[i] != 0;
  }
  double sigma = std::sqrt(n * 0.3 * 0.7);
  EXPECT_NEAR(double(kept), 0.7 * n, 4 * sigma);
  EXPECT_NE(a, b);                          // the step is part of the counter
  EXPECT_NE(a, maskAt(0.3, 54321, 7));      // so is the seed
  EXPECT_EQ(a, maskAt(0.3, 12345, 7));      // and nothing else
  for (double v : maskAt(0.0, 1, 1))        // ratio 0 keeps all
    ASSERT_EQ(v, 1.0);
  for (double v : maskAt(1.0, 1, 1))        // ratio 1 drops all
    ASSERT_EQ(v, 0.0);
  // By global sample: a step of 2 ranks x 2 micro-batches x 3 samples of 5 elements
  // is the mask of the whole 12 x 5 batch, whichever part a kernel makes.
  std::vector<double> whole = maskOf(0.5, 99, 3, {12, 5}, 0, 0, 0, 12);
  for (int64_t rank = 0; rank < 2; ++rank)
    for (int64_t micro = 0; micro < 2; ++micro) {
      std::vector<double> part = maskOf(0.5, 99, 3, {3, 5}, rank, micro * 3, 6, 3);
      const int64_t at = (rank * 6 + micro * 3) * 5;
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + at))
          << "rank " << rank << " micro-batch " << micro;
    }
  HT bad = make(bundle::F32, {}, {-1}), r0 = make(bundle::I64, {}, {0}), m(bundle::BOOL, {4});
  EXPECT_FALSE(Op("dropout_mask")
                   .f("ratio", 0.5)
                   .i("seed", 1)
                   .i("first_sample", 0)
                   .i("rank_samples", 0)
                   .i("batch", 1)
                   .run({&bad, &r0}, {&m})
                   .isOk());
  HT s1 = make(bundle::F32, {}, {1});
  EXPECT_FALSE(Op("dropout_mask") // a batch that does not divide the elements
                   .f("ratio", 0.5)
                   .i("seed", 1)
                   .i("first_sample", 0)
                   .i("rank_samples", 0)
                   .i("batch", 3)
                   .run({&s1, &r0}, {&m})
                   .isOk());
}

TEST(CpuKernels, UnknownOpAndArityErrors) {
  HT a = randomTensor(bundle::F32, {2}), y(bundle::F32, {2});
  Status st = Op("no_such_op").run({&a}, {&y});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("no_such_op"), std::string::npos) << st.message();
  st = Op("add").run({&a}, {&y});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("node_add"), std::string::npos) << st.message();
  st = Op("add").run({&a, nullptr}, {&y}); // a required operand absent
  EXPECT_FALSE(st.isOk());
  HT bad(bundle::F32, {3});
  EXPECT_FALSE(Op("add").run({&a, &a}, {&bad}).isOk()); // wrong result shape
  HT nostore = a;
  TensorView v = nostore.view();
  v.data = nullptr;
  TensorView outs[] = {y.view()};
  TensorView ins[] = {v, a.view()};
  EXPECT_FALSE(runCpuKernel(Op("add").inst, ins, outs, pool()).isOk());
}

TEST(CpuKernels, AttrReader) {
  Op op("x");
  op.i("n", 3).f("x", 0.5).s("s", "hi").ints("l", {1, 2}).dt("t", bundle::F16);
  AttrReader r(op.inst);
  EXPECT_TRUE(r.has("n"));
  EXPECT_FALSE(r.has("m"));
  EXPECT_EQ(*r.getInt("n"), 3);
  EXPECT_EQ(*r.getFloat("x"), 0.5);
  EXPECT_EQ(*r.getFloat("n"), 3.0); // integral float written as int
  EXPECT_EQ(*r.getString("s"), "hi");
  EXPECT_EQ(*r.getInts("l"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(*r.getDType("t"), bundle::F16);
  EXPECT_FALSE(r.getInt("x").isOk());
  EXPECT_FALSE(r.getInt("missing").isOk());
  EXPECT_FALSE(r.getString("n").isOk());
  EXPECT_FALSE(r.getInts("n").isOk());
  EXPECT_FALSE(r.getDType("n").isOk());
  EXPECT_NE(r.getInt("missing").status().message().find("missing"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// 16-bit floats
//===----------------------------------------------------------------------===//

TEST(CpuKernels, HalfConversion) {
  using cpu::floatToHalf, cpu::halfToFloat, cpu::floatToBf16, cpu::bf16ToFloat;
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);                         // rounds down
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);                         // rounds to inf
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);            // smallest subnormal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);            // tie -> even (0)
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);            // 1.5 ulp tie -> even (2)
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);            // smallest normal
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);     // tie -> even
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02); // tie -> even (up)
  EXPECT_EQ(floatToHalf(INFINITY), 0x7c00);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(NAN))));
  EXPECT_EQ(halfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0xfbff), -65504.0f);
  // Every half round-trips through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t exp = (h >> 10) & 0x1f;
    if (exp == 0x1f && (h & 0x3ff))
      continue; // nan payloads
    ASSERT_EQ(floatToHalf(halfToFloat(uint16_t(h))), h) << h;
  }
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(cpu::bitsFloat(0x3f808000u)), 0x3f80); // tie -> even
  EXPECT_EQ(floatToBf16(cpu::bitsFloat(0x3f818000u)), 0x3f82); // tie -> even (up)
  EXPECT_EQ(floatToBf16(cpu::bitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16ToFloat(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// Runs binary `op` on a/b and checks against f applied under broadcasting.
void checkBinary(const std::string &op, DType t, std::vector<int64_t> sa, std::vector<int64_t> sb,
                 const std::function<double(double, double)> &f,
                 DType outType = bundle::DTYPE_UNSPECIFIED, double lo = -2, double hi = 2,
                 const std::map<std::string, int64_t> &intAttrs = {}) {
  HT a = randomTensor(t, sa, lo, hi), b = randomTensor(t, sb, lo, hi);
  std::vector<int64_t> so = broadcastShapes(sa, sb);
  HT y(outType == bundle::DTYPE_UNSPECIFIED ? t : outType, so);
  Op o(op);
  for (auto &[k, v] : intAttrs)
    o.i(k, v);
  ASSERT_OK(o.run({&a, &b}, {&y}));
  std::vector<double> want(y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, so);
    want[i] = f(a.at(broadcastOffset(idx, sa)), b.at(broadcastOffset(idx, sb)));
  }
  expectNear(y, want, op + " " + std::string(dtypeName(t)));
}

TEST(CpuKernels, BinaryArithmeticBroadcast) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{2, 3, 4}, {3, 1}}, {{1}, {5, 1, 7}}, {{4, 1, 3}, {1, 5, 1}}, {{}, {3, 2}},
      {{70001}, {70001}},  {{300, 7}, {7}},  {{7, 1}, {7, 300}},     {{2, 0, 3}, {3}}};
  std::map<std::string, std::function<double(double, double)>> fns = {
      {"add", [](double a, double b) { return a + b; }},
      {"sub", [](double a, double b) { return a - b; }},
      {"mul", [](double a, double b) { return a * b; }},
      {"div", [](double a, double b) { return a / b; }},
      {"min", [](double a, double b) { return std::min(a, b); }},
      {"max", [](double a, double b) { return std::max(a, b); }}};
  for (auto &[op, f] : fns)
    for (auto &[sa, sb] : shapes) {
      checkBinary(op, bundle::F32, sa, sb,
                  [&](double a, double b) { return double(float(f(a, b))); });
      checkBinary(op, bundle::F64, sa, sb, f);
    }
  checkBinary(
      "pow", bundle::F64, {3, 4}, {4}, [](double a, double b) { return std::pow(a, b); },
      bundle::DTYPE_UNSPECIFIED, 0.1, 3);
  checkBinary(
      "pow", bundle::F32, {3, 4}, {3, 1}, [](double a, double b) { return std::pow(a, b); },
      bundle::DTYPE_UNSPECIFIED, 0.1, 3);
  checkBinary("add", bundle::F16, {3, 40}, {40},
              [](double a, double b) { return double(Half(float(a + b))); });
  checkBinary("mul", bundle::BF16, {3, 40}, {3, 1},
              [](double a, double b) { return double(BFloat16(float(a * b))); });
}

TEST(CpuKernels, BinaryIntegers) {
  for (DType t : {bundle::I64, bundle::I32}) {
    HT a = make(t, {2, 3}, {7, -7, 9, 100, -5, 0}), b = make(t, {3}, {2, 2, -4});
    HT y(t, {2, 3});
    ASSERT_OK(Op("div").run({&a, &b}, {&y}));
    expectEqual(y, {3, -3, -2, 50, -2, 0}); // truncation toward zero
    ASSERT_OK(Op("sub").run({&a, &b}, {&y}));
    expectEqual(y, {5, -9, 13, 98, -7, 4});
    ASSERT_OK(Op("max").run({&a, &b}, {&y}));
    expectEqual(y, {7, 2, 9, 100, 2, 0});
    HT e = make(t, {3}, {3, 0, 2});
    ASSERT_OK(Op("pow").run({&a, &e}, {&y}));
    expectEqual(y, {343, 1, 81, 1000000, 1, 0});
    HT zero = make(t, {3}, {1, 0, 1});
    Status st = Op("div").run({&a, &zero}, {&y});
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("division by zero"), std::string::npos) << st.message();
  }
  // Wrapping instead of UB on overflow; MIN / -1 does not trap.
  HT a = make(bundle::I32, {1}, {0}), b = make(bundle::I32, {1}, {-1}), y(bundle::I32, {1});
  a.data<int32_t>()[0] = INT32_MIN;
  ASSERT_OK(Op("div").run({&a, &b}, {&y}));
  EXPECT_EQ(y.data<int32_t>()[0], INT32_MIN);
  // Float base, integer exponent.
  HT x = make(bundle::F32, {3}, {2, 3, 0.5}), n = make(bundle::I64, {3}, {3, -1, 2});
  HT z(bundle::F32, {3});
  ASSERT_OK(Op("pow").run({&x, &n}, {&z}));
  expectNear(z, {8, 1.0 / 3, 0.25});
  // Mixed dtypes are rejected for plain arithmetic.
  HT i = make(bundle::I64, {3}, {1, 2, 3});
  EXPECT_FALSE(Op("add").run({&x, &i}, {&z}).isOk());
}

TEST(CpuKernels, CompareAndLogic) {
  const std::map<std::string, std::function<double(double, double)>> cmp = {
      {"equal", [](double a, double b) { return double(a == b); }},
      {"less", [](double a, double b) { return double(a < b); }},
      {"greater", [](double a, double b) { return double(a > b); }},
      {"less_equal", [](double a, double b) { return double(a <= b); }},
      {"greater_equal", [](double a, double b) { return double(a >= b); }}};
  for (auto &[op, f] : cmp) {
    // Small integers so that equality happens.
    for (DType t : {bundle::F32, bundle::I64, bundle::I32}) {
      HT a = make(t, {4, 5}, randomInts(20, -2, 2)), b = make(t, {5}, randomInts(5, -2, 2));
      HT y(bundle::BOOL, {4, 5});
      ASSERT_OK(Op(op).run({&a, &b}, {&y}));
      std::vector<double> want(20);
      for (int i = 0; i < 20; ++i)
        want[i] = f(a.at(i), b.at(i % 5));
      expectEqual(y, want, op);
    }
  }
  HT p = make(bundle::BOOL, {2, 2}, {0, 1, 0, 1}), q = make(bundle::BOOL, {2, 1}, {0, 1});
  HT y(bundle::BOOL, {2, 2});
  ASSERT_OK(Op("and").run({&p, &q}, {&y}));
  expectEqual(y, {0, 0, 0, 1});
  ASSERT_OK(Op("or").run({&p, &q}, {&y}));
  expectEqual(y, {0, 1, 1, 1});
  ASSERT_OK(Op("not").run({&p}, {&y}));
  expectEqual(y, {1, 0, 1, 0});
  ASSERT_OK(Op("equal").run({&p, &q}, {&y}));
  expectEqual(y, {1, 0, 0, 1});
  HT f = make(bundle::F32, {2, 2}, {0, 1, 0, 1});
  EXPECT_FALSE(Op("and").run({&f, &q}, {&y}).isOk()); // logic needs bool
  HT wrongOut(bundle::F32, {2, 2});
  EXPECT_FALSE(Op("less").run({&f, &f}, {&wrongOut}).isOk()); // compare yields bool
}

TEST(CpuKernels, Where) {
  HT c = make(bundle::BOOL, {3, 1}, {1, 0, 1});
  for (DType t : {bundle::F32, bundle::I64, bundle::F16, bundle::BOOL, bundle::I8}) {
    HT x = make(t, {4}, {1, 0, 1, 1}), z = make(t, {3, 4}, randomInts(12, 0, 1));
    HT y(t, {3, 4});
    ASSERT_OK(Op("where").run({&c, &x, &z}, {&y}));
    std::vector<double> want(12);
    for (int i = 0; i < 12; ++i)
      want[i] = c.at(i / 4) ? x.at(i % 4) : z.at(i);
    expectEqual(y, want, std::string(dtypeName(t)));
  }
  HT big = make(bundle::BOOL, {50000}, randomInts(50000, 0, 1));
  HT x = randomTensor(bundle::F64, {50000}), s = make(bundle::F64, {}, {-7}),
     y(bundle::F64, {50000});
  ASSERT_OK(Op("where").run({&big, &x, &s}, {&y}));
  std::vector<double> want(50000);
  for (int i = 0; i < 50000; ++i)
    want[i] = big.at(i) ? x.at(i) : -7;
  expectEqual(y, want);
}

double refGeluErf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double refGeluTanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(CpuKernels, UnaryFloat) {
  struct Case {
    Op op;
    std::function<double(double)> f;
    double lo = -4, hi = 4;
  };
  std::vector<Case> cases = {
      {Op("neg"), [](double x) { return -x; }},
      {Op("abs"), [](double x) { return std::abs(x); }},
      {Op("exp"), [](double x) { return std::exp(x); }},
      {Op("log"), [](double x) { return std::log(x); }, 0.01, 10},
      {Op("sqrt"), [](double x) { return std::sqrt(x); }, 0, 10},
      {Op("reciprocal"), [](double x) { return 1 / x; }, 0.1, 10},
      {Op("tanh"), [](double x) { return std::tanh(x); }},
      {Op("sigmoid"), [](double x) { return 1 / (1 + std::exp(-x)); }, -30, 30},
      {Op("relu"), [](double x) { return x > 0 ? x : 0; }},
      {Op("erf"), [](double x) { return std::erf(x); }},
      {Op("softplus"), [](double x) { return std::log1p(std::exp(x)); }, -30, 30},
      {Op("hard_swish"), [](double x) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }},
      {Op("leaky_relu").f("alpha", 0.1), [](double x) { return x < 0 ? 0.1 * x : x; }},
      {Op("elu").f("alpha", 1.5), [](double x) { return x < 0 ? 1.5 * std::expm1(x) : x; }},
      {Op("sin"), [](double x) { return std::sin(x); }},
      {Op("cos"), [](double x) { return std::cos(x); }},
      {Op("tan"), [](double x) { return std::tan(x); }, -1.4, 1.4},
      {Op("asin"), [](double x) { return std::asin(x); }, -1, 1},
      {Op("acos"), [](double x) { return std::acos(x); }, -1, 1},
      {Op("atan"), [](double x) { return std::atan(x); }, -10, 10},
      {Op("sinh"), [](double x) { return std::sinh(x); }},
      {Op("cosh"), [](double x) { return std::cosh(x); }},
      {Op("asinh"), [](double x) { return std::asinh(x); }, -100, 100},
      {Op("acosh"), [](double x) { return std::acosh(x); }, 1, 100},
      {Op("atanh"), [](double x) { return std::atanh(x); }, -0.99, 0.99},
      {Op("floor"), [](double x) { return std::floor(x); }},
      {Op("ceil"), [](double x) { return std::ceil(x); }},
      {Op("round"), [](double x) { return std::nearbyint(x); }},
      {Op("selu").f("alpha", 1.5).f("gamma", 1.25),
       [](double x) { return x > 0 ? 1.25 * x : 1.25 * 1.5 * (std::exp(x) - 1); }},
      {Op("thresholded_relu").f("alpha", 0.5), [](double x) { return x > 0.5 ? x : 0; }},
      {Op("gelu").s("approximate", "none"), refGeluErf},
      {Op("gelu").s("approximate", "tanh"), refGeluTanh},
      {Op("hard_sigmoid").f("alpha", 0.3).f("beta", 0.4),
       [](double x) { return std::clamp(0.3 * x + 0.4, 0.0, 1.0); }},
      {Op("clip").f("min", -0.5).f("max", 1.25),
       [](double x) { return std::clamp(x, -0.5, 1.25); }},
  };
  for (Case &c : cases)
    for (DType t : {bundle::F32, bundle::F64, bundle::F16, bundle::BF16}) {
      int64_t n = t == bundle::F32 ? 40000 : 301;
      HT x = randomTensor(t, {n}, c.lo, c.hi), y(t, {n});
      ASSERT_OK(c.op.run({&x}, {&y}));
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i)
        want[i] = c.f(x.at(i));
      double tol = tolFor(t);
      if (t == bundle::F16 || t == bundle::BF16) // input rounding grows through the op
        tol *= 4;
      expectNear(y, want, tol, tol, c.op.inst.op() + " " + std::string(dtypeName(t)));
    }
}

// gelu_grad against central differences of the float64 GELUs above (an
// independent reference: the kernel evaluates the closed-form derivative).
TEST(CpuKernels, GeluGradMatchesDifferencesOfGelu) {
  for (auto [approx, f] : {std::pair<const char *, double (*)(double)>{"none", refGeluErf},
                           std::pair<const char *, double (*)(double)>{"tanh", refGeluTanh}})
    for (DType t : {bundle::F32, bundle::F64}) {
      const int64_t n = 4001;
      HT x = randomTensor(t, {n}, -6, 6), dy = randomTensor(t, {n}, -2, 2), dx(t, {n});
      ASSERT_OK(Op("gelu_grad").s("approximate", approx).run({&dy, &x}, {&dx}));
      std::vector<double> want(n);
      const double h = 1e-5;
      for (int64_t i = 0; i < n; ++i)
        want[i] = dy.at(i) * (f(x.at(i) + h) - f(x.at(i) - h)) / (2 * h);
      // The differences' own error is ~1e-10; f32's rounding dominates.
      double tol = t == bundle::F32 ? 2e-6 : 1e-8;
      expectNear(dx, want, tol, tol, std::string("gelu_grad ") + approx);
    }
  HT a = randomTensor(bundle::F32, {4}), b = randomTensor(bundle::F32, {5}), c(bundle::F32, {4});
  Status st = Op("gelu_grad").s("approximate", "tanh").run({&a, &b}, {&c});
  EXPECT_FALSE(st.isOk()); // input of another shape than grad_output
  EXPECT_FALSE(Op("gelu_grad").s("approximate", "fast").run({&a, &a}, {&c}).isOk());
}

// The ReLU bitmask against its definition (rows of ceil(N / 128) * 16 bytes,
// bit j % 8 of byte j / 8), and the gradient it masks.
TEST(CpuKernels, ReluBitmaskAndItsGradient) {
  const int64_t m = 3, n = 130, bytes = 32; // two 128-bit words per row
  HT x = randomTensor(bundle::F32, {m, n}, -1, 1), mask(bundle::I8, {m, bytes});
  x.data<float>()[5] = 0.0f; // 0 is not > 0
  ASSERT_OK(Op("relu_bitmask").run({&x}, {&mask}));
  std::vector<double> want(m * bytes, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (x.at(i * n + j) > 0) {
        int64_t at = i * bytes + j / 8;
        int v = static_cast<int>(want[at]) & 0xff;
        v |= 1 << (j % 8);
        want[at] = static_cast<double>(static_cast<int8_t>(v));
      }
  for (int64_t k = 0; k < m * bytes; ++k)
    ASSERT_EQ(mask.at(k), want[k]) << "byte " << k;
  HT dy = randomTensor(bundle::F32, {m, n}), dx(bundle::F32, {m, n});
  ASSERT_OK(Op("relu_grad_bitmask").run({&dy, &mask}, {&dx}));
  for (int64_t k = 0; k < m * n; ++k)
    ASSERT_EQ(dx.at(k), x.at(k) > 0 ? dy.at(k) : 0.0) << "element " << k;
  HT small(bundle::I8, {m, 16});
  EXPECT_FALSE(Op("relu_bitmask").run({&x}, {&small}).isOk()); // rows of 16 bytes hold 128 bits
}

TEST(CpuKernels, UnaryIntegerAndErrors) {
  HT x = make(bundle::I64, {5}, {-3, -1, 0, 2, 9}), y(bundle::I64, {5});
  ASSERT_OK(Op("neg").run({&x}, {&y}));
  expectEqual(y, {3, 1, 0, -2, -9});
  ASSERT_OK(Op("abs").run({&x}, {&y}));
  expectEqual(y, {3, 1, 0, 2, 9});
  ASSERT_OK(Op("relu").run({&x}, {&y}));
  expectEqual(y, {0, 0, 0, 2, 9});
  ASSERT_OK(Op("clip").f("min", -2).f("max", INFINITY).run({&x}, {&y}));
  expectEqual(y, {-2, -1, 0, 2, 9});
  Status st = Op("exp").run({&x}, {&y});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("i64"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exp"), std::string::npos) << st.message();
  HT f = randomTensor(bundle::F32, {5}), g(bundle::F32, {5});
  EXPECT_FALSE(Op("leaky_relu").run({&f}, {&g}).isOk()); // missing alpha
  EXPECT_FALSE(Op("gelu").s("approximate", "fast").run({&f}, {&g}).isOk());
  EXPECT_FALSE(Op("gelu").i("approximate", 1).run({&f}, {&g}).isOk()); // wrong attr type
  HT nan = make(bundle::F32, {3}, {NAN, 1, -INFINITY}), b(bundle::BOOL, {3});
  ASSERT_OK(Op("isnan").run({&nan}, {&b}));
  expectEqual(b, {1, 0, 0});
  HT r(bundle::F32, {3});
  ASSERT_OK(Op("relu").run({&nan}, {&r}));
  expectEqual(r, {NAN, 1, 0}); // nan propagates
}

TEST(CpuKernels, UnaryFloatSpecialValues) {
  // Domain edges and non-finite inputs against the C library in double.
  HT x = make(bundle::F32, {9}, {INFINITY, -INFINITY, NAN, 1, -1, 0, 1.5, -1.5, 1e30});
  for (const char *op : {"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
                         "acosh", "atanh"}) {
    static const std::map<std::string, double (*)(double)> ref = {
        {"sin", std::sin},     {"cos", std::cos},     {"tan", std::tan},   {"asin", std::asin},
        {"acos", std::acos},   {"atan", std::atan},   {"sinh", std::sinh}, {"cosh", std::cosh},
        {"asinh", std::asinh}, {"acosh", std::acosh}, {"atanh", std::atanh}};
    HT y(bundle::F32, {9});
    ASSERT_OK(Op(op).run({&x}, {&y}));
    std::vector<double> want(9);
    for (int i = 0; i < 9; ++i)
      want[i] = double(float(ref.at(op)(x.at(i))));
    expectNear(y, want, 1e-6, 1e-7, op);
  }
  HT t = make(bundle::F32, {4}, {NAN, 1, 1.0001, INFINITY}), y(bundle::F32, {4});
  ASSERT_OK(Op("thresholded_relu").f("alpha", 1).run({&t}, {&y}));
  expectEqual(y, {0, 0, 1.0001f, INFINITY}); // nan -> 0 (x > alpha is false), as ONNX
  HT i = make(bundle::I32, {2}, {1, 2}), yi(bundle::I32, {2});
  EXPECT_FALSE(Op("sin").run({&i}, {&yi}).isOk());
  EXPECT_FALSE(Op("selu").f("alpha", 1).run({&t}, {&y}).isOk()); // missing gamma
}

TEST(CpuKernels, IsInf) {
  HT x = make(bundle::F32, {5}, {INFINITY, -INFINITY, NAN, 1e38, -0.0}), b(bundle::BOOL, {5});
  ASSERT_OK(Op("isinf").i("detect_positive", 1).i("detect_negative", 1).run({&x}, {&b}));
  expectEqual(b, {1, 1, 0, 0, 0});
  ASSERT_OK(Op("isinf").i("detect_positive", 1).i("detect_negative", 0).run({&x}, {&b}));
  expectEqual(b, {1, 0, 0, 0, 0});
  ASSERT_OK(Op("isinf").i("detect_positive", 0).i("detect_negative", 1).run({&x}, {&b}));
  expectEqual(b, {0, 1, 0, 0, 0});
  ASSERT_OK(Op("isinf").i("detect_positive", 0).i("detect_negative", 0).run({&x}, {&b}));
  expectEqual(b, {0, 0, 0, 0, 0});
  HT h = make(bundle::F16, {3}, {70000, -70000, 65504}), hb(bundle::BOOL, {3}); // f16 overflow
  ASSERT_OK(Op("isinf").i("detect_positive", 1).i("detect_negative", 1).run({&h}, {&hb}));
  expectEqual(hb, {1, 1, 0});
  EXPECT_FALSE(Op("isinf").run({&x}, {&b}).isOk()); // missing attributes
}

/// Python's % (floored) and C's fmod (truncated), in double.
double refMod(double a, double b, bool fmod) {
  return fmod ? std::fmod(a, b) : a - b * std::floor(a / b);
}

TEST(CpuKernels, Mod) {
  // Every sign combination, for both forms and several integer types.
  std::vector<double> av = {7, -7, 7, -7, 6, -6, 0, 13, -13, 5};
  std::vector<double> bv = {3, 3, -3, -3, 3, -3, 5, 13, 4, -4};
  for (int64_t fmod : {0, 1})
    for (DType t : {bundle::I64, bundle::I32, bundle::I8}) {
      HT a = make(t, {10}, av), b = make(t, {10}, bv), y(t, {10});
      ASSERT_OK(Op("mod").i("fmod", fmod).run({&a, &b}, {&y}));
      std::vector<double> want(10);
      for (int i = 0; i < 10; ++i)
        want[i] = refMod(av[i], bv[i], fmod);
      expectEqual(y, want, std::string(dtypeName(t)) + " fmod=" + std::to_string(fmod));
      HT zero = make(t, {10}, {1, 1, 1, 1, 0, 1, 1, 1, 1, 1});
      Status st = Op("mod").i("fmod", fmod).run({&a, &zero}, {&y});
      EXPECT_FALSE(st.isOk());
      EXPECT_NE(st.message().find("modulo by zero"), std::string::npos) << st.message();
    }
  HT u = make(bundle::U8, {3}, {250, 7, 9}), v = make(bundle::U8, {3}, {7, 250, 3});
  HT w(bundle::U8, {3});
  ASSERT_OK(Op("mod").i("fmod", 0).run({&u, &v}, {&w}));
  expectEqual(w, {5, 7, 0});
  // MIN % -1 is 0 without trapping; broadcasting.
  HT m = make(bundle::I32, {2, 1}, {0, 9}), n = make(bundle::I32, {2}, {-1, 4});
  HT r(bundle::I32, {2, 2});
  m.data<int32_t>()[0] = INT32_MIN;
  ASSERT_OK(Op("mod").i("fmod", 0).run({&m, &n}, {&r}));
  expectEqual(r, {0, 0, 0, 1});
  // Floats, broadcast, both forms, against double.
  for (int64_t fmod : {0, 1})
    for (DType t : {bundle::F32, bundle::F64}) {
      checkBinary(
          "mod", t, {3, 40}, {40},
          [&](double a, double b) {
            double r = refMod(a, b, fmod);
            return t == bundle::F32 ? double(float(r)) : r;
          },
          bundle::DTYPE_UNSPECIFIED, -5, 5, {{"fmod", fmod}});
    }
  HT f = make(bundle::F32, {2}, {5.5, -5.5}), z = make(bundle::F32, {2}, {0, 0});
  HT g(bundle::F32, {2});
  ASSERT_OK(Op("mod").i("fmod", 1).run({&f, &z}, {&g})); // float: nan, no error
  expectEqual(g, {NAN, NAN});
  EXPECT_FALSE(Op("mod").run({&f, &f}, {&g}).isOk()); // missing fmod
}

TEST(CpuKernels, BitwiseAndShifts) {
  const std::map<std::string, std::function<int64_t(int64_t, int64_t)>> fns = {
      {"bitwise_and", [](int64_t a, int64_t b) { return a & b; }},
      {"bitwise_or", [](int64_t a, int64_t b) { return a | b; }},
      {"bitwise_xor", [](int64_t a, int64_t b) { return a ^ b; }}};
  for (auto &[op, f] : fns)
    for (DType t : {bundle::I64, bundle::I32, bundle::I8, bundle::U8}) {
      bool u = t == bundle::U8;
      HT a = make(t, {4, 6}, randomInts(24, u ? 0 : -128, 127));
      HT b = make(t, {6}, randomInts(6, u ? 0 : -128, 127)), y(t, {4, 6});
      ASSERT_OK(Op(op).run({&a, &b}, {&y}));
      std::vector<double> want(24);
      for (int i = 0; i < 24; ++i)
        want[i] = double(f(int64_t(a.at(i)), int64_t(b.at(i % 6))));
      expectEqual(y, want, op + " " + std::string(dtypeName(t)));
    }
  HT x = make(bundle::I32, {4}, {0, -1, 5, -6}), nx(bundle::I32, {4});
  ASSERT_OK(Op("bitwise_not").run({&x}, {&nx}));
  expectEqual(nx, {-1, 0, -6, 5});
  HT ub = make(bundle::U8, {3}, {0, 255, 0x0f}), nub(bundle::U8, {3});
  ASSERT_OK(Op("bitwise_not").run({&ub}, {&nub}));
  expectEqual(nub, {255, 0, 0xf0});
  HT fl = make(bundle::F32, {4}, {1, 2, 3, 4}), fy(bundle::F32, {4});
  EXPECT_FALSE(Op("bitwise_and").run({&fl, &fl}, {&fy}).isOk());
  EXPECT_FALSE(Op("bitwise_not").run({&fl}, {&fy}).isOk());

  // Shifts: unsigned only; by the bit width or more gives 0.
  for (DType t : {bundle::U8, bundle::U32, bundle::U64}) {
    int bits = int(dtypeSize(t)) * 8;
    std::vector<double> av = {1, 3, 200, 255, 7, 1};
    std::vector<double> sv = {0, 2, 1, 7, double(bits), double(bits - 1)};
    HT a = make(t, {6}, av), s = make(t, {6}, sv), y(t, {6});
    uint64_t mask = bits == 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
    std::vector<double> left(6), right(6);
    for (int i = 0; i < 6; ++i) {
      uint64_t v = uint64_t(av[i]), n = uint64_t(sv[i]);
      left[i] = n >= uint64_t(bits) ? 0 : double((v << n) & mask);
      right[i] = n >= uint64_t(bits) ? 0 : double(v >> n);
    }
    ASSERT_OK(Op("bit_shift").s("direction", "LEFT").run({&a, &s}, {&y}));
    expectEqual(y, left, "left " + std::string(dtypeName(t)));
    ASSERT_OK(Op("bit_shift").s("direction", "RIGHT").run({&a, &s}, {&y}));
    expectEqual(y, right, "right " + std::string(dtypeName(t)));
  }
  HT a = make(bundle::U8, {2, 1}, {1, 128}), s = make(bundle::U8, {3}, {0, 1, 2});
  HT y(bundle::U8, {2, 3});
  ASSERT_OK(Op("bit_shift").s("direction", "RIGHT").run({&a, &s}, {&y})); // broadcast
  expectEqual(y, {1, 0, 0, 128, 64, 32});
  EXPECT_FALSE(Op("bit_shift").s("direction", "UP").run({&a, &a}, {&y}).isOk());
  HT si = make(bundle::I32, {4}, {1, 2, 3, 4}), so(bundle::I32, {4});
  Status st = Op("bit_shift").s("direction", "LEFT").run({&si, &si}, {&so});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("unsigned"), std::string::npos) << st.message();

  HT p = make(bundle::BOOL, {2, 2}, {0, 1, 0, 1}), q = make(bundle::BOOL, {2, 1}, {0, 1});
  HT b(bundle::BOOL, {2, 2});
  ASSERT_OK(Op("xor").run({&p, &q}, {&b}));
  expectEqual(b, {0, 1, 1, 0});
  EXPECT_FALSE(Op("xor").run({&x, &x}, {&nx}).isOk()); // logic needs bool
}

TEST(CpuKernels, Cast) {
  HT x = make(bundle::F32, {6}, {1.7, -1.7, 0, 300.5, -0.2, 2.5});
  HT y32(bundle::I32, {6});
  ASSERT_OK(Op("cast").dt("to", bundle::I32).run({&x}, {&y32}));
  expectEqual(y32, {1, -1, 0, 300, 0, 2});
  HT u8(bundle::U8, {6});
  ASSERT_OK(Op("cast").dt("to", bundle::U8).run({&x}, {&u8}));
  expectEqual(u8, {1, 0, 0, 255, 0, 2}); // saturating
  HT b(bundle::BOOL, {6});
  ASSERT_OK(Op("cast").dt("to", bundle::BOOL).run({&x}, {&b}));
  expectEqual(b, {1, 1, 0, 1, 1, 1});
  HT h(bundle::F16, {6}), bf(bundle::BF16, {6}), d(bundle::F64, {6});
  ASSERT_OK(Op("cast").dt("to", bundle::F16).run({&x}, {&h}));
  ASSERT_OK(Op("cast").dt("to", bundle::BF16).run({&h}, {&bf}));
  ASSERT_OK(Op("cast").dt("to", bundle::F64).run({&bf}, {&d}));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(d.at(i), double(BFloat16(float(Half(float(x.at(i)))))));
  // f64 -> f16/bf16 round once (no double rounding through f32): just above
  // a tie of the narrow format, below f32 resolution.
  HT d2 = make(bundle::F64, {2},
               {1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)});
  HT h2(bundle::F16, {2}), b2(bundle::BF16, {2});
  ASSERT_OK(Op("cast").dt("to", bundle::F16).run({&d2}, {&h2}));
  ASSERT_OK(Op("cast").dt("to", bundle::BF16).run({&d2}, {&b2}));
  EXPECT_EQ(h2.data<uint16_t>()[0], 0x3c01);
  EXPECT_EQ(b2.data<uint16_t>()[1], 0x3f81);
  HT bools = make(bundle::BOOL, {2}, {1, 0}), bf32(bundle::F32, {2});
  ASSERT_OK(Op("cast").dt("to", bundle::F32).run({&bools}, {&bf32}));
  expectEqual(bf32, {1, 0});
  HT big = make(bundle::I64, {2}, {123456789, -5}), i8(bundle::I8, {2}), f64(bundle::F64, {2});
  ASSERT_OK(Op("cast").dt("to", bundle::F64).run({&big}, {&f64}));
  expectEqual(f64, {123456789, -5});
  ASSERT_OK(Op("cast").dt("to", bundle::I8).run({&big}, {&i8}));
  expectEqual(i8, {double(int8_t(123456789 & 0xff)), -5}); // integer narrowing wraps
  HT same(bundle::F32, {6});
  ASSERT_OK(Op("cast").dt("to", bundle::F32).run({&x}, {&same}));
  expectEqual(same, x.values());
  EXPECT_FALSE(Op("cast").dt("to", bundle::I64).run({&x}, {&same}).isOk()); // result dtype
  EXPECT_FALSE(Op("cast").run({&x}, {&same}).isOk());                       // missing `to`
}

//===----------------------------------------------------------------------===//
// Reductions, scans, softmax
//===----------------------------------------------------------------------===//

std::vector<double> refReduce(const HT &x, const std::vector<int64_t> &axes,
                              const std::string &kind, std::vector<int64_t> &outShape,
                              bool keepdims) {
  std::vector<int64_t> kept = x.shape;
  for (int64_t a : axes)
    kept[a] = 1;
  outShape.clear();
  for (int64_t d = 0; d < (int64_t)x.shape.size(); ++d) {
    bool r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!r || keepdims)
      outShape.push_back(r ? 1 : x.shape[d]);
  }
  int64_t n = numElements(kept);
  std::vector<std::vector<double>> groups(n);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, x.shape);
    for (int64_t a : axes)
      idx[a] = 0;
    groups[ravel(idx, kept)].push_back(x.at(i));
  }
  std::vector<double> out(n);
  for (int64_t o = 0; o < n; ++o) {
    const auto &g = groups[o];
    double acc = kind == "prod" ? 1 : 0;
    if (kind == "max")
      acc = -INFINITY;
    if (kind == "min")
      acc = INFINITY;
    for (double v : g) {
      if (kind == "sum" || kind == "mean")
        acc += v;
      else if (kind == "prod")
        acc *= v;
      else if (kind == "l2")
        acc += v * v;
      else if (kind == "max")
        acc = std::max(acc, v);
      else
        acc = std::min(acc, v);
    }
    if (kind == "mean")
      acc /= double(g.size());
    if (kind == "l2")
      acc = std::sqrt(acc);
    out[o] = acc;
  }
  return out;
}

TEST(CpuKernels, Reductions) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4, 5, 6}, {0}},
      {{3, 4, 5, 6}, {1, 3}},
      {{3, 4, 5, 6}, {0, 2}},
      {{3, 4, 5, 6}, {3}},
      {{3, 4, 5, 6}, {0, 1, 2, 3}},
      {{3, 1, 5, 1}, {1, 2}},
      {{2, 700, 3}, {1}},
      {{200000}, {0}},
      {{4, 70000}, {1}},
      {{70000, 3}, {0}},
      {{5}, {}}};
  for (const std::string kind : {"sum", "mean", "max", "min", "prod", "l2"})
    for (auto &[shape, axes] : cases)
      for (bool keep : {false, true})
        for (DType t : {bundle::F32, bundle::F64}) {
          if (numElements(shape) > 1000 && (kind == "prod" || t == bundle::F64))
            continue;
          HT x = randomTensor(t, shape, kind == "prod" ? 0.5 : -1, kind == "prod" ? 1.5 : 1);
          std::vector<int64_t> outShape;
          std::vector<double> want = refReduce(x, axes, kind, outShape, keep);
          HT y(t, outShape);
          ASSERT_OK(Op("reduce_" + kind).ints("axes", axes).i("keepdims", keep).run({&x}, {&y}));
          expectNear(y, want, "reduce_" + kind + " " + shapeString(shape) + shapeString(axes));
        }
  HT xi = make(bundle::I64, {2, 3}, {1, 2, 3, 4, 5, 6}), yi(bundle::I64, {2});
  ASSERT_OK(Op("reduce_sum").ints("axes", {1}).i("keepdims", 0).run({&xi}, {&yi}));
  expectEqual(yi, {6, 15});
  ASSERT_OK(Op("reduce_max").ints("axes", {1}).i("keepdims", 0).run({&xi}, {&yi}));
  expectEqual(yi, {3, 6});
  // Booleans: max is "any", min is "all"; an empty reduction is the identity.
  HT xb = make(bundle::BOOL, {3, 2}, {0, 0, 1, 0, 1, 1}), yb(bundle::BOOL, {3});
  ASSERT_OK(Op("reduce_max").ints("axes", {1}).i("keepdims", 0).run({&xb}, {&yb}));
  expectEqual(yb, {0, 1, 1});
  ASSERT_OK(Op("reduce_min").ints("axes", {1}).i("keepdims", 0).run({&xb}, {&yb}));
  expectEqual(yb, {0, 0, 1});
  HT eb(bundle::BOOL, {2, 0}), ey(bundle::BOOL, {2});
  ASSERT_OK(Op("reduce_min").ints("axes", {1}).i("keepdims", 0).run({&eb}, {&ey}));
  expectEqual(ey, {1, 1});
  ASSERT_OK(Op("reduce_max").ints("axes", {1}).i("keepdims", 0).run({&eb}, {&ey}));
  expectEqual(ey, {0, 0});
  HT yh(bundle::F16, {2}), xh = make(bundle::F16, {2, 3}, {1, 2, 3, 4, 5, 6});
  ASSERT_OK(Op("reduce_mean").ints("axes", {1}).i("keepdims", 0).run({&xh}, {&yh}));
  expectEqual(yh, {2, 5});
  // f32 sums accumulate in double: 2^24 + many ones stays exact.
  std::vector<double> ones(100001, 1.0);
  ones[0] = 16777216.0;
  HT big = make(bundle::F32, {100001}, ones), s(bundle::F32, {});
  ASSERT_OK(Op("reduce_sum").ints("axes", {0}).i("keepdims", 0).run({&big}, {&s}));
  expectEqual(s, {16877216.0});
  // zero_outputs (forge-elide-centred-sums): [1, 3) of the column sums written as 0 whatever
  // the input, the rest summed; a range outside the result is refused.
  HT xz = make(bundle::F32, {2, 4}, {1, 2, 3, 4, 10, 20, 30, 40}), yz(bundle::F32, {4});
  ASSERT_OK(Op("reduce_sum")
                .ints("axes", {0})
                .i("keepdims", 0)
                .ints("zero_outputs", {1, 3})
                .run({&xz}, {&yz}));
  expectEqual(yz, {11, 0, 0, 44});
  EXPECT_FALSE(Op("reduce_sum")
                   .ints("axes", {0})
                   .i("keepdims", 0)
                   .ints("zero_outputs", {2, 5})
                   .run({&xz}, {&yz})
                   .isOk());
  EXPECT_FALSE(Op("reduce_sum")
                   .ints("axes", {0})
                   .i("keepdims", 0)
                   .ints("zero_outputs", {2, 2})
                   .run({&xz}, {&yz})
                   .isOk());
  // Errors: missing attribute, bad axis, wrong result shape.
  HT y(bundle::F32, {2});
  HT x = randomTensor(bundle::F32, {2, 3});
  EXPECT_FALSE(Op("reduce_sum").i("keepdims", 0).run({&x}, {&y}).isOk());
  EXPECT_FALSE(Op("reduce_sum").ints("axes", {2}).i("keepdims", 0).run({&x}, {&y}).isOk());
  EXPECT_FALSE(Op("reduce_sum").ints("axes", {0}).i("keepdims", 0).run({&x}, {&y}).isOk());
}

// A bf16 grad_output beside an f32 x (forge-assign-precision's low-norm-gradients): the
// registry stages every bf16 operand of a kernel with f32 ones through f32 (runCpuKernel), so
// the results equal those of the f32 grad_output with the same values, bit for bit; an integer
// grad_output is refused (the norm's own dtype check).
TEST(CpuKernels, LayerNormGradReadsALowGradOutput) {
  HT x = randomTensor(bundle::F32, {5, 24}), scale = randomTensor(bundle::F32, {24}, 0.5, 1.5);
  HT low = randomTensor(bundle::BF16, {5, 24});
  std::vector<double> values(low.numel());
  for (int64_t i = 0; i < low.numel(); ++i)
    values[i] = low.at(i);
  HT wide = make(bundle::F32, {5, 24}, values);
  auto run = [&](HT &dy, HT &dx, HT &ds, HT &db) {
    return Op("layer_norm_grad")
        .i("axis", 1)
        .f("epsilon", 1e-5)
        .i("input_grad", 1)
        .i("scale_grad", 1)
        .i("bias_grad", 1)
        .run({&x, &scale, &dy}, {&dx, &ds, &db});
  };
  HT dx(bundle::F32, {5, 24}), ds(bundle::F32, {24}), db(bundle::F32, {24});
  HT dxw(bundle::F32, {5, 24}), dsw(bundle::F32, {24}), dbw(bundle::F32, {24});
  ASSERT_OK(run(low, dx, ds, db));
  ASSERT_OK(run(wide, dxw, dsw, dbw));
  for (int64_t i = 0; i < dx.numel(); ++i)
    EXPECT_EQ(dx.at(i), dxw.at(i)) << i;
  for (int64_t i = 0; i < ds.numel(); ++i) {
    EXPECT_EQ(ds.at(i), dsw.at(i)) << i;
    EXPECT_EQ(db.at(i), dbw.at(i)) << i;
  }
  double biasSum = 0; // dbias is grad_output's column sum: a check that the values were read
  for (int64_t r = 0; r < 5; ++r)
    biasSum += values[r * 24 + 3];
  EXPECT_NEAR(db.at(3), biasSum, 1e-5);
  HT ints(bundle::I32, {5, 24});
  EXPECT_FALSE(run(ints, dx, ds, db).isOk());
}

TEST(CpuKernels, ArgMax) {
  HT x = make(bundle::F32, {2, 4}, {1, 3, 3, 0, -1, -1, -2, -5});
  HT y(bundle::I64, {2});
  ASSERT_OK(Op("argmax").i("axis", 1).i("keepdims", 0).i("select_last_index", 0).run({&x}, {&y}));
  expectEqual(y, {1, 0});
  ASSERT_OK(Op("argmax").i("axis", 1).i("keepdims", 0).i("select_last_index", 1).run({&x}, {&y}));
  expectEqual(y, {2, 1});
  HT yk(bundle::I64, {1, 4});
  ASSERT_OK(Op("argmax").i("axis", 0).i("keepdims", 1).i("select_last_index", 0).run({&x}, {&yk}));
  expectEqual(yk, {0, 0, 0, 0});
  HT r = randomTensor(bundle::F64, {3, 7, 5}), yr(bundle::I64, {3, 5});
  ASSERT_OK(Op("argmax").i("axis", 1).i("keepdims", 0).i("select_last_index", 0).run({&r}, {&yr}));
  for (int a = 0; a < 3; ++a)
    for (int c = 0; c < 5; ++c) {
      int best = 0;
      for (int b = 1; b < 7; ++b)
        if (r.at((a * 7 + b) * 5 + c) > r.at((a * 7 + best) * 5 + c))
          best = b;
      EXPECT_EQ(yr.at(a * 5 + c), best);
    }
  HT xi = make(bundle::I32, {3}, {4, 9, 9}), yi(bundle::I64, {});
  ASSERT_OK(Op("argmax").i("axis", 0).i("keepdims", 0).i("select_last_index", 0).run({&xi}, {&yi}));
  expectEqual(yi, {1});
}

TEST(CpuKernels, TopK) {
  // Against a reference per line: std::stable_sort of the positions by value
  // alone (stable: equal values keep the lower index first), the first k.
  // Values from a few integers, so most lines have ties; exact comparison
  // (values are copies). Axis in the middle, both directions, several dtypes.
  auto check = [](DType t, std::vector<double> vals, int64_t k, bool largest) {
    const int64_t outer = 3, n = 7, inner = 5;
    HT x = make(t, {outer, n, inner}, vals);
    HT v(t, {outer, k, inner}), ix(bundle::I64, {outer, k, inner});
    ASSERT_OK(
        Op("top_k").i("axis", 1).i("k", k).i("largest", largest).i("sorted", 1).run({&x}, {&v, &ix}));
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t c = 0; c < inner; ++c) {
        std::vector<int64_t> pos(n);
        std::iota(pos.begin(), pos.end(), 0);
        auto at = [&](int64_t b) { return x.at((a * n + b) * inner + c); };
        std::stable_sort(pos.begin(), pos.end(), [&](int64_t p, int64_t q) {
          return largest ? at(p) > at(q) : at(p) < at(q);
        });
        for (int64_t r = 0; r < k; ++r) {
          int64_t o = (a * k + r) * inner + c;
          EXPECT_EQ(ix.at(o), pos[r]) << "dtype " << t << " line " << a << "," << c << " rank " << r;
          EXPECT_EQ(v.at(o), at(pos[r])) << "dtype " << t << " line " << a << "," << c;
        }
      }
  };
  for (bool largest : {true, false}) {
    check(bundle::F32, randomInts(105, -3, 3), 4, largest);
    check(bundle::F64, randomValues(105), 7, largest);
    check(bundle::F16, randomInts(105, -2, 2), 3, largest);
    check(bundle::I32, randomInts(105, -4, 4), 1, largest);
    // Above 2^63: compared unsigned.
    std::vector<double> big = randomInts(105, 0, 3);
    for (double &b : big)
      b = b * 0x1p62;
    check(bundle::U64, big, 5, largest);
  }

  // NaN is above every number (onnx's reference): first for largest, last for
  // smallest, NaNs among themselves by index.
  HT x = make(bundle::F32, {1, 6}, {1, NAN, 3, NAN, -INFINITY, 3});
  HT v(bundle::F32, {1, 4}), ix(bundle::I64, {1, 4});
  ASSERT_OK(Op("top_k").i("axis", 1).i("k", 4).i("largest", 1).i("sorted", 1).run({&x}, {&v, &ix}));
  expectEqual(ix, {1, 3, 2, 5});
  EXPECT_TRUE(std::isnan(v.at(0)) && std::isnan(v.at(1)));
  EXPECT_EQ(v.at(2), 3);
  EXPECT_EQ(v.at(3), 3);
  HT all(bundle::F32, {1, 6}), ixAll(bundle::I64, {1, 6});
  ASSERT_OK(
      Op("top_k").i("axis", 1).i("k", 6).i("largest", 0).i("sorted", 0).run({&x}, {&all, &ixAll}));
  expectEqual(ixAll, {4, 0, 2, 5, 1, 3});

  // k = 0 is empty; k beyond the axis and a wrong result shape are errors.
  HT v0(bundle::F32, {1, 0}), ix0(bundle::I64, {1, 0});
  EXPECT_OK(Op("top_k").i("axis", 1).i("k", 0).i("largest", 1).i("sorted", 1).run({&x}, {&v0, &ix0}));
  HT v7(bundle::F32, {1, 7}), ix7(bundle::I64, {1, 7});
  EXPECT_FALSE(
      Op("top_k").i("axis", 1).i("k", 7).i("largest", 1).i("sorted", 1).run({&x}, {&v7, &ix7}).isOk());
  EXPECT_FALSE(
      Op("top_k").i("axis", 1).i("k", 3).i("largest", 1).i("sorted", 1).run({&x}, {&v, &ix}).isOk());
}

TEST(CpuKernels, CumSum) {
  HT x = randomTensor(bundle::F64, {3, 5, 4});
  for (int axis : {0, 1, 2})
    for (int exclusive : {0, 1})
      for (int reverse : {0, 1}) {
        HT y(bundle::F64, x.shape);
        ASSERT_OK(Op("cumsum")
                      .i("axis", axis)
                      .i("exclusive", exclusive)
                      .i("reverse", reverse)
                      .run({&x}, {&y}));
        std::vector<double> want(x.numel());
        for (int64_t i = 0; i < x.numel(); ++i) {
          auto idx = unravel(i, x.shape);
          double s = 0;
          for (int64_t j = 0; j < x.shape[axis]; ++j) {
            bool take = reverse ? (exclusive ? j > idx[axis] : j >= idx[axis])
                                : (exclusive ? j < idx[axis] : j <= idx[axis]);
            auto k = idx;
            k[axis] = j;
            if (take)
              s += x.at(ravel(k, x.shape));
          }
          want[i] = s;
        }
        expectNear(y, want, "cumsum");
      }
  HT xi = make(bundle::I32, {4}, {1, 2, 3, 4}), yi(bundle::I32, {4});
  ASSERT_OK(Op("cumsum").i("axis", 0).i("exclusive", 1).i("reverse", 0).run({&xi}, {&yi}));
  expectEqual(yi, {0, 1, 3, 6});
  EXPECT_FALSE(
      Op("cumsum").i("axis", 1).i("exclusive", 0).i("reverse", 0).run({&xi}, {&yi}).isOk());
}

TEST(CpuKernels, Softmax) {
  for (bool log : {false, true})
    for (auto [shape, axis] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
             {{4, 7}, 1}, {{3, 5, 6}, 1}, {{2, 3, 1000}, 2}, {{9}, 0}, {{6, 2}, 0}})
      for (DType t : {bundle::F32, bundle::F64, bundle::BF16}) {
        // Large offsets: a naive exp would overflow.
        HT x = randomTensor(t, shape, -5, 5);
        for (int64_t i = 0; i < x.numel(); i += 3)
          if (t != bundle::BF16)
            (t == bundle::F32 ? (void)(x.data<float>()[i] += 1000)
                              : (void)(x.data<double>()[i] += 1000));
        HT y(t, shape);
        ASSERT_OK(Op(log ? "log_softmax" : "softmax").i("axis", axis).run({&x}, {&y}));
        std::vector<double> want(x.numel());
        for (int64_t i = 0; i < x.numel(); ++i) {
          auto idx = unravel(i, shape);
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < shape[axis]; ++j) {
            auto k = idx;
            k[axis] = j;
            m = std::max(m, x.at(ravel(k, shape)));
          }
          for (int64_t j = 0; j < shape[axis]; ++j) {
            auto k = idx;
            k[axis] = j;
            s += std::exp(x.at(ravel(k, shape)) - m);
          }
          want[i] = log ? x.at(i) - m - std::log(s) : std::exp(x.at(i) - m) / s;
        }
        double tol = t == bundle::F32 ? 1e-5 : tolFor(t);
        // log_softmax of ~1000-sized inputs: absolute error scales with |x|.
        expectNear(y, want, tol, log && t == bundle::F32 ? 1e-3 : tol,
                   std::string(log ? "log_softmax " : "softmax ") + shapeString(shape));
      }
}

//===----------------------------------------------------------------------===//
// matmul, gemm
//===----------------------------------------------------------------------===//

void checkMatmul(DType t, std::vector<int64_t> sa, std::vector<int64_t> sb) {
  HT a = t == bundle::I64 || t == bundle::I32 ? make(t, sa, randomInts(numElements(sa), -5, 5))
                                              : randomTensor(t, sa);
  HT b = t == bundle::I64 || t == bundle::I32 ? make(t, sb, randomInts(numElements(sb), -5, 5))
                                              : randomTensor(t, sb);
  std::vector<int64_t> as = sa, bs = sb;
  if (as.size() == 1)
    as.insert(as.begin(), 1);
  if (bs.size() == 1)
    bs.push_back(1);
  int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  std::vector<int64_t> batch = broadcastShapes(ab, bb);
  std::vector<int64_t> out = batch;
  if (sa.size() > 1)
    out.push_back(m);
  if (sb.size() > 1)
    out.push_back(n);
  HT y(t, out);
  ASSERT_OK(Op("matmul").run({&a, &b}, {&y}));
  std::vector<double> want;
  int64_t nb = numElements(batch);
  for (int64_t bi = 0; bi < nb; ++bi) {
    auto idx = unravel(bi, batch);
    int64_t offA = broadcastOffset(idx, ab) * m * k, offB = broadcastOffset(idx, bb) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += a.at(offA + i * k + p) * b.at(offB + p * n + j);
        want.push_back(s);
      }
  }
  double tol = t == bundle::F16 ? 1e-2 : t == bundle::BF16 ? 5e-2 : tolFor(t);
  expectNear(y, want, tol, tol,
             "matmul " + std::string(dtypeName(t)) + shapeString(sa) + shapeString(sb));
}

TEST(CpuKernels, MatMul) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4}, {4, 5}}, {{2, 1, 3, 4}, {3, 4, 6}}, {{4}, {4, 5}},       {{2, 3, 4}, {4}},
      {{4}, {4}},       {{2, 5, 3, 4}, {4, 6}},    {{1, 4}, {2, 4, 3}}, {{64, 33}, {33, 17}},
      {{3, 0}, {0, 2}}, {{2, 3, 4}, {1, 4, 2}}};
  for (auto &[sa, sb] : cases)
    for (DType t : {bundle::F32, bundle::F64, bundle::I64, bundle::I32, bundle::F16, bundle::BF16})
      checkMatmul(t, sa, sb);
  HT a = randomTensor(bundle::F32, {3, 4}), b = randomTensor(bundle::F32, {5, 6});
  HT y(bundle::F32, {3, 6});
  EXPECT_FALSE(Op("matmul").run({&a, &b}, {&y}).isOk()); // contraction mismatch
}

// transA/transB swap an operand's last two dims: checked against the float64
// product of the explicitly transposed operands, batched and broadcast.
TEST(CpuKernels, MatMulTransposeFlags) {
  struct Case {
    std::vector<int64_t> a, b; // stored shapes
    bool ta, tb;
  };
  for (const Case &c : std::vector<Case>{{{4, 3}, {4, 5}, true, false},
                                         {{3, 4}, {5, 4}, false, true},
                                         {{2, 4, 3}, {2, 5, 4}, true, true},
                                         {{2, 4, 3}, {4, 5}, true, false},
                                         {{6, 3, 4}, {5, 4}, false, true},
                                         {{4, 3}, {2, 5, 4}, true, true}}) {
    HT a = randomTensor(bundle::F32, c.a), b = randomTensor(bundle::F32, c.b);
    auto logical = [](std::vector<int64_t> s, bool t) {
      if (t)
        std::swap(s[s.size() - 1], s[s.size() - 2]);
      return s;
    };
    std::vector<int64_t> as = logical(c.a, c.ta), bs = logical(c.b, c.tb);
    int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    std::vector<int64_t> batch = broadcastShapes(ab, bb), out = batch;
    out.push_back(m);
    out.push_back(n);
    HT y(bundle::F32, out);
    ASSERT_OK(Op("matmul").i("transA", c.ta).i("transB", c.tb).run({&a, &b}, {&y}));
    std::vector<double> want;
    for (int64_t bi = 0; bi < numElements(batch); ++bi) {
      auto idx = unravel(bi, batch);
      int64_t offA = broadcastOffset(idx, ab) * m * k, offB = broadcastOffset(idx, bb) * k * n;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += a.at(offA + (c.ta ? p * m + i : i * k + p)) *
                 b.at(offB + (c.tb ? j * k + p : p * n + j));
          want.push_back(s);
        }
    }
    expectNear(y, want, 1e-5, 1e-5, "matmul flags " + shapeString(c.a) + shapeString(c.b));
  }
  HT v = randomTensor(bundle::F32, {4}), w = randomTensor(bundle::F32, {4, 5});
  HT y(bundle::F32, {5});
  EXPECT_FALSE(Op("matmul").i("transA", 1).run({&v, &w}, {&y}).isOk()); // 1-d operand
}

TEST(CpuKernels, Gemm) {
  const int64_t m = 5, k = 7, n = 3;
  for (int ta : {0, 1})
    for (int tb : {0, 1})
      for (std::vector<int64_t> cs :
           std::vector<std::vector<int64_t>>{{}, {n}, {m, 1}, {m, n}, {1}})
        for (DType t : {bundle::F32, bundle::F64, bundle::I64}) {
          bool isInt = t == bundle::I64;
          auto gen = [&](std::vector<int64_t> s) {
            return isInt ? make(t, s, randomInts(numElements(s), -4, 4)) : randomTensor(t, s);
          };
          HT a = gen(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k});
          HT b = gen(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
          bool hasC = !cs.empty();
          HT c = hasC ? gen(cs) : HT();
          double alpha = isInt ? 2 : 0.75, beta = isInt ? 3 : -1.5;
          HT y(t, {m, n});
          ASSERT_OK(Op("gemm")
                        .i("transA", ta)
                        .i("transB", tb)
                        .f("alpha", alpha)
                        .f("beta", beta)
                        .run({&a, &b, hasC ? &c : nullptr}, {&y}));
          std::vector<double> want(m * n);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s += a.at(ta ? p * m + i : i * k + p) * b.at(tb ? j * k + p : p * n + j);
              double cv = hasC ? c.at(broadcastOffset({i, j}, cs)) : 0;
              want[i * n + j] = alpha * s + beta * cv;
            }
          expectNear(y, want, "gemm");
        }
  HT a = randomTensor(bundle::F32, {2, 3}), b = randomTensor(bundle::F32, {3, 2});
  HT y(bundle::F32, {2, 2});
  EXPECT_FALSE(Op("gemm").i("transA", 0).i("transB", 0).f("alpha", 1).run({&a, &b}, {&y}).isOk());
}

/// An E4M3FN (bias 7, max 448) or E5M2 (bias 15) byte as the value it
/// stands for, by the formats' definition (independent of the runtime's).
double float8Value(uint8_t byte, bool e5m2) {
  int mantissaBits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  int exponent = (byte & 0x7F) >> mantissaBits, mantissa = byte & ((1 << mantissaBits) - 1);
  double magnitude = exponent == 0
                         ? std::ldexp(mantissa, 1 - bias - mantissaBits)
                         : std::ldexp((1 << mantissaBits) + mantissa, exponent - bias - mantissaBits);
  return byte & 0x80 ? -magnitude : magnitude;
}

TEST(CpuKernels, ScaledGemm) {
  // y = alpha (sa A)(sb B^T) + beta C over float8 codes (no NaN/Inf codes),
  // against float64; outputs f32 and bf16, C absent, a bf16 bias row, full.
  const int64_t m = 6, k = 16, n = 5;
  std::uniform_int_distribution<int> code(0, 255);
  for (bool e5m2Lhs : {false, true})
    for (DType out : {bundle::F32, bundle::BF16})
      for (int cKind : {0, 1, 2}) {
        auto codes = [&](std::vector<int64_t> shape, bool e5m2) {
          HT t(e5m2 ? bundle::F8E5M2 : bundle::F8E4M3, shape);
          for (uint8_t &b : t.bytes) {
            do
              b = static_cast<uint8_t>(code(rng()));
            while (e5m2 ? (b & 0x7C) == 0x7C : (b & 0x7F) == 0x7F); // Inf/NaN codes
          }
          return t;
        };
        HT a = codes({m, k}, e5m2Lhs), b = codes({n, k}, false);
        HT sa = make(bundle::F32, {}, {0.125}), sb = make(bundle::F32, {}, {3.0});
        HT c = cKind == 1   ? randomTensor(bundle::BF16, {n})
               : cKind == 2 ? randomTensor(out, {m, n})
                            : HT();
        double alpha = 0.5, beta = cKind ? 1.0 : 0.0;
        HT y(out, {m, n});
        ASSERT_OK(Op("scaled_gemm")
                      .i("transA", 0)
                      .i("transB", 1)
                      .f("alpha", alpha)
                      .f("beta", beta)
                      .run({&a, &b, &sa, &sb, cKind ? &c : nullptr}, {&y}));
        std::vector<double> want(m * n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t p = 0; p < k; ++p)
              acc += 0.125 * float8Value(a.bytes[i * k + p], e5m2Lhs) * 3.0 *
                     float8Value(b.bytes[j * k + p], false);
            double cv = cKind == 1 ? c.at(j) : cKind == 2 ? c.at(i * n + j) : 0.0;
            want[i * n + j] = alpha * acc + beta * cv;
          }
        expectNear(y, want, out == bundle::BF16 ? 1e-2 : 1e-5, out == bundle::BF16 ? 1e-1 : 1e-3,
                   "scaled_gemm");
      }
  // Non-float8 operands and non-scalar scales are refused.
  HT a = randomTensor(bundle::F32, {2, 16}), b = randomTensor(bundle::F32, {2, 16});
  HT s = make(bundle::F32, {}, {1.0}), y(bundle::F32, {2, 2});
  EXPECT_FALSE(Op("scaled_gemm").i("transA", 0).i("transB", 1).f("alpha", 1).f("beta", 0)
                   .run({&a, &b, &s, &s}, {&y}).isOk());
}

//===----------------------------------------------------------------------===//
// conv, conv_transpose
//===----------------------------------------------------------------------===//

struct ConvCase {
  std::vector<int64_t> x, w, strides, pads, dilations;
  int64_t group;
  bool bias;
};

int64_t convOut(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pe, int64_t d) {
  return (in + pb + pe - d * (k - 1) - 1) / s + 1;
}

TEST(CpuKernels, Conv) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 11}, {4, 3, 3}, {2}, {1, 2}, {1}, 1, true},                   // 1-D
      {{2, 4, 9, 8}, {6, 2, 3, 2}, {1, 2}, {1, 0, 2, 1}, {2, 1}, 2, true},  // grouped 2-D
      {{1, 3, 7, 7}, {5, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false}, // same padding
      {{3, 8, 5, 6}, {8, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 8, true},  // depthwise
      {{2, 6, 5, 4}, {7, 6, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true},  // 1x1 direct
      {{1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1, 1, 0, 1}, {2, 1, 1}, 1, true}, // 3-D
      {{2, 3, 4, 4}, {2, 3, 5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}, 1, true}, // kernel > input
  };
  for (const ConvCase &cc : cases)
    for (DType t : {bundle::F32, bundle::F64, bundle::F16}) {
      const int64_t sp = cc.x.size() - 2;
      HT x = randomTensor(t, cc.x), w = randomTensor(t, cc.w), b = randomTensor(t, {cc.w[0]});
      std::vector<int64_t> os = {cc.x[0], cc.w[0]};
      for (int64_t d = 0; d < sp; ++d)
        os.push_back(convOut(cc.x[d + 2], cc.w[d + 2], cc.strides[d], cc.pads[d], cc.pads[d + sp],
                             cc.dilations[d]));
      HT y(t, os);
      ASSERT_OK(Op("conv")
                    .ints("strides", cc.strides)
                    .ints("pads", cc.pads)
                    .ints("dilations", cc.dilations)
                    .i("group", cc.group)
                    .run({&x, &w, cc.bias ? &b : nullptr}, {&y}));
      const int64_t cg = cc.x[1] / cc.group, mg = cc.w[0] / cc.group;
      std::vector<int64_t> ks(cc.w.begin() + 2, cc.w.end());
      std::vector<double> want(y.numel());
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto idx = unravel(i, os); // n, m, o...
        int64_t g = idx[1] / mg;
        double s = cc.bias ? b.at(idx[1]) : 0;
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t kk = 0; kk < numElements(ks); ++kk) {
            auto kpos = unravel(kk, ks);
            std::vector<int64_t> xi = {idx[0], g * cg + c};
            bool in = true;
            for (int64_t d = 0; d < sp; ++d) {
              int64_t p = idx[d + 2] * cc.strides[d] - cc.pads[d] + kpos[d] * cc.dilations[d];
              in &= p >= 0 && p < cc.x[d + 2];
              xi.push_back(p);
            }
            if (!in)
              continue;
            std::vector<int64_t> wi = {idx[1], c};
            wi.insert(wi.end(), kpos.begin(), kpos.end());
            s += x.at(ravel(xi, cc.x)) * w.at(ravel(wi, cc.w));
          }
        want[i] = s;
      }
      double tol = t == bundle::F16 ? 2e-2 : tolFor(t);
      expectNear(y, want, tol, tol, "conv " + shapeString(cc.x) + shapeString(cc.w));
    }
  // Errors: channel mismatch, wrong result shape, bad attrs.
  HT x = randomTensor(bundle::F32, {1, 3, 5, 5}), w = randomTensor(bundle::F32, {2, 2, 3, 3});
  HT y(bundle::F32, {1, 2, 3, 3});
  Op conv = Op("conv").ints("strides", {1, 1}).ints("pads", {0, 0, 0, 0}).ints("dilations", {1, 1});
  EXPECT_FALSE(Op(conv).i("group", 1).run({&x, &w}, {&y}).isOk());
  HT w3 = randomTensor(bundle::F32, {2, 3, 3, 3}), y2(bundle::F32, {1, 2, 4, 4});
  EXPECT_FALSE(Op(conv).i("group", 1).run({&x, &w3}, {&y2}).isOk());
  EXPECT_FALSE(Op(conv).run({&x, &w3}, {&y}).isOk()); // missing group
  EXPECT_OK(Op(conv).i("group", 1).run({&x, &w3}, {&y}));
}

struct ConvTCase {
  std::vector<int64_t> x, w, strides, pads, dilations, outputPadding;
  int64_t group;
  bool bias;
};

TEST(CpuKernels, ConvTranspose) {
  const std::vector<ConvTCase> cases = {
      {{2, 3, 5}, {3, 2, 3}, {2}, {1, 0}, {1}, {1}, 1, true},
      {{1, 4, 4, 3}, {4, 3, 3, 2}, {2, 1}, {1, 1, 0, 1}, {1, 2}, {1, 0}, 2, true},
      {{2, 2, 3, 3}, {2, 3, 2, 2}, {1, 1}, {0, 0, 0, 0}, {1, 1}, {0, 0}, 1, false},
      {{1, 2, 2, 3, 2},
       {2, 2, 2, 2, 3},
       {2, 1, 2},
       {0, 1, 0, 1, 0, 0},
       {1, 1, 1},
       {0, 0, 1},
       1,
       true},
  };
  for (const ConvTCase &cc : cases)
    for (DType t : {bundle::F32, bundle::F64}) {
      const int64_t sp = cc.x.size() - 2, m = cc.w[1] * cc.group;
      HT x = randomTensor(t, cc.x), w = randomTensor(t, cc.w), b = randomTensor(t, {m});
      std::vector<int64_t> os = {cc.x[0], m};
      for (int64_t d = 0; d < sp; ++d)
        os.push_back(cc.strides[d] * (cc.x[d + 2] - 1) + cc.outputPadding[d] +
                     (cc.w[d + 2] - 1) * cc.dilations[d] + 1 - cc.pads[d] - cc.pads[d + sp]);
      HT y(t, os);
      ASSERT_OK(Op("conv_transpose")
                    .ints("strides", cc.strides)
                    .ints("pads", cc.pads)
                    .ints("dilations", cc.dilations)
                    .ints("output_padding", cc.outputPadding)
                    .i("group", cc.group)
                    .run({&x, &w, cc.bias ? &b : nullptr}, {&y}));
      // Scatter reference: every input element spreads over its window.
      std::vector<double> want(y.numel(), 0.0);
      const int64_t cg = cc.x[1] / cc.group, mg = cc.w[1];
      std::vector<int64_t> ks(cc.w.begin() + 2, cc.w.end());
      for (int64_t i = 0; i < x.numel(); ++i) {
        auto xi = unravel(i, cc.x);
        int64_t g = xi[1] / cg;
        for (int64_t mo = 0; mo < mg; ++mo)
          for (int64_t kk = 0; kk < numElements(ks); ++kk) {
            auto kpos = unravel(kk, ks);
            std::vector<int64_t> yi = {xi[0], g * mg + mo};
            bool in = true;
            for (int64_t d = 0; d < sp; ++d) {
              int64_t p = xi[d + 2] * cc.strides[d] - cc.pads[d] + kpos[d] * cc.dilations[d];
              in &= p >= 0 && p < os[d + 2];
              yi.push_back(p);
            }
            if (!in)
              continue;
            std::vector<int64_t> wi = {xi[1], mo};
            wi.insert(wi.end(), kpos.begin(), kpos.end());
            want[ravel(yi, os)] += x.at(i) * w.at(ravel(wi, cc.w));
          }
      }
      if (cc.bias)
        for (int64_t i = 0; i < y.numel(); ++i)
          want[i] += b.at(unravel(i, os)[1]);
      expectNear(y, want, "conv_transpose " + shapeString(cc.x));
    }
}

//===----------------------------------------------------------------------===//
// Pools
//===----------------------------------------------------------------------===//

struct PoolCase {
  std::vector<int64_t> x, kernel, strides, pads, dilations;
  bool ceil, includePad;
};

int64_t poolOut(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pe, int64_t d, bool ceil) {
  double v = double(in + pb + pe - d * (k - 1) - 1) / double(s);
  int64_t out = int64_t(ceil ? std::ceil(v) : std::floor(v)) + 1;
  if (ceil && (out - 1) * s >= in + pb)
    --out;
  return out;
}

TEST(CpuKernels, Pools) {
  const std::vector<PoolCase> cases = {
      {{2, 3, 9, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false},
      {{2, 3, 9, 8}, {3, 2}, {2, 3}, {1, 0, 1, 1}, {1, 1}, true, true},
      {{1, 2, 10, 7}, {2, 3}, {2, 2}, {0, 1, 0, 1}, {2, 1}, true, false},
      {{3, 2, 13}, {4}, {3}, {2, 1}, {1}, true, true},
      {{1, 2, 5, 4, 6}, {2, 2, 3}, {1, 2, 2}, {1, 0, 1, 0, 1, 1}, {1, 1, 1}, false, true},
      {{1, 1, 5}, {2}, {2}, {0, 0}, {1}, true, true},
  };
  for (const PoolCase &pc : cases)
    for (bool isMax : {true, false})
      for (DType t : {bundle::F32, bundle::F64}) {
        const int64_t sp = pc.x.size() - 2;
        HT x = randomTensor(t, pc.x);
        std::vector<int64_t> os = {pc.x[0], pc.x[1]};
        for (int64_t d = 0; d < sp; ++d)
          os.push_back(poolOut(pc.x[d + 2], pc.kernel[d], pc.strides[d], pc.pads[d],
                               pc.pads[d + sp], pc.dilations[d], pc.ceil));
        HT y(t, os);
        Op op(isMax ? "max_pool" : "avg_pool");
        op.ints("kernel_shape", pc.kernel)
            .ints("strides", pc.strides)
            .ints("pads", pc.pads)
            .ints("dilations", pc.dilations)
            .i("ceil_mode", pc.ceil);
        if (!isMax)
          op.i("count_include_pad", pc.includePad);
        ASSERT_OK(op.run({&x}, {&y}));
        std::vector<double> want(y.numel());
        for (int64_t i = 0; i < y.numel(); ++i) {
          auto idx = unravel(i, os);
          double mx = -INFINITY, sum = 0, count = 0, padded = 0;
          for (int64_t kk = 0; kk < numElements(pc.kernel); ++kk) {
            auto kpos = unravel(kk, pc.kernel);
            std::vector<int64_t> xi = {idx[0], idx[1]};
            bool in = true, inPad = true;
            for (int64_t d = 0; d < sp; ++d) {
              int64_t p = idx[d + 2] * pc.strides[d] - pc.pads[d] + kpos[d] * pc.dilations[d];
              in &= p >= 0 && p < pc.x[d + 2];
              inPad &= p >= -pc.pads[d] && p < pc.x[d + 2] + pc.pads[d + sp];
              xi.push_back(p);
            }
            padded += inPad;
            if (!in)
              continue;
            double v = x.at(ravel(xi, pc.x));
            mx = std::max(mx, v);
            sum += v;
            count += 1;
          }
          want[i] = isMax ? mx : sum / (pc.includePad ? padded : count);
        }
        expectNear(y, want, std::string(isMax ? "max_pool " : "avg_pool ") + shapeString(pc.x));
      }
  // Hand-checked ceil-mode case (PyTorch avg_pool1d(k=2, s=2, ceil_mode=True)).
  HT x = make(bundle::F32, {1, 1, 5}, {1, 2, 3, 4, 5}), y(bundle::F32, {1, 1, 3});
  for (int include : {0, 1}) {
    ASSERT_OK(Op("avg_pool")
                  .ints("kernel_shape", {2})
                  .ints("strides", {2})
                  .ints("pads", {0, 0})
                  .ints("dilations", {1})
                  .i("ceil_mode", 1)
                  .i("count_include_pad", include)
                  .run({&x}, {&y}));
    expectEqual(y, {1.5, 3.5, 5});
  }
  HT xi = make(bundle::I32, {1, 1, 4}, {3, -1, 7, 2}), yi(bundle::I32, {1, 1, 2});
  ASSERT_OK(Op("max_pool")
                .ints("kernel_shape", {2})
                .ints("strides", {2})
                .ints("pads", {0, 0})
                .ints("dilations", {1})
                .i("ceil_mode", 0)
                .run({&xi}, {&yi}));
  expectEqual(yi, {3, 7});
  HT bad(bundle::F32, {1, 1, 2});
  EXPECT_FALSE(Op("max_pool")
                   .ints("kernel_shape", {2})
                   .ints("strides", {2})
                   .ints("pads", {0, 0})
                   .ints("dilations", {1})
                   .i("ceil_mode", 1)
                   .run({&x}, {&bad})
                   .isOk());
}

//===----------------------------------------------------------------------===//
// Normalizations
//===----------------------------------------------------------------------===//

TEST(CpuKernels, BatchNorm) {
  for (DType t : {bundle::F32, bundle::F64, bundle::F16}) {
    const std::vector<int64_t> shape = {3, 4, 5, 2};
    HT x = randomTensor(t, shape, -2, 3), scale = randomTensor(bundle::F32, {4}),
       bias = randomTensor(bundle::F32, {4}), mean = randomTensor(bundle::F32, {4}),
       var = randomTensor(bundle::F32, {4}, 0.5, 2);
    HT y(t, shape);
    ASSERT_OK(Op("batch_norm").f("epsilon", 1e-3).run({&x, &scale, &bias, &mean, &var}, {&y}));
    std::vector<double> want(x.numel());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t c = unravel(i, shape)[1];
      want[i] = (x.at(i) - mean.at(c)) / std::sqrt(var.at(c) + 1e-3) * scale.at(c) + bias.at(c);
    }
    double tol = t == bundle::F16 ? 1e-2 : tolFor(t);
    expectNear(y, want, tol, tol, "batch_norm");

    HT y2(t, shape), rm(bundle::F32, {4}), rv(bundle::F32, {4});
    ASSERT_OK(Op("batch_norm_training")
                  .f("epsilon", 1e-5)
                  .f("momentum", 0.9)
                  .run({&x, &scale, &bias, &mean, &var}, {&y2, &rm, &rv}));
    std::vector<double> bm(4, 0), bv(4, 0), cnt(4, 0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t c = unravel(i, shape)[1];
      bm[c] += x.at(i);
      cnt[c] += 1;
    }
    for (int c = 0; c < 4; ++c)
      bm[c] /= cnt[c];
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t c = unravel(i, shape)[1];
      bv[c] += (x.at(i) - bm[c]) * (x.at(i) - bm[c]) / cnt[c];
    }
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t c = unravel(i, shape)[1];
      want[i] = (x.at(i) - bm[c]) / std::sqrt(bv[c] + 1e-5) * scale.at(c) + bias.at(c);
    }
    expectNear(y2, want, tol, tol, "batch_norm_training y");
    std::vector<double> wm(4), wv(4);
    for (int c = 0; c < 4; ++c) {
      wm[c] = mean.at(c) * 0.9 + bm[c] * 0.1;
      wv[c] = var.at(c) * 0.9 + bv[c] * 0.1;
    }
    expectNear(rm, wm, "running_mean");
    expectNear(rv, wv, "running_var");
  }
  HT x = randomTensor(bundle::F32, {2, 3}), p = randomTensor(bundle::F32, {4}),
     y(bundle::F32, {2, 3});
  EXPECT_FALSE(Op("batch_norm").f("epsilon", 1e-5).run({&x, &p, &p, &p, &p}, {&y}).isOk());
}

TEST(CpuKernels, LayerNorm) {
  for (auto [shape, axis, scaleShape] :
       std::vector<std::tuple<std::vector<int64_t>, int64_t, std::vector<int64_t>>>{
           {{4, 6, 10}, 2, {10}},
           {{4, 6, 10}, 1, {6, 10}},
           {{4, 6, 10}, 1, {1, 10}},
           {{3, 5000}, 1, {5000}},
           {{2, 3}, 0, {2, 3}}})
    for (bool withBias : {true, false})
      for (DType t : {bundle::F32, bundle::F64, bundle::BF16}) {
        HT x = randomTensor(t, shape, -3, 2), scale = randomTensor(t, scaleShape),
           bias = randomTensor(t, scaleShape);
        HT y(t, shape);
        ASSERT_OK(Op("layer_norm")
                      .i("axis", axis)
                      .f("epsilon", 1e-5)
                      .run({&x, &scale, withBias ? &bias : nullptr}, {&y}));
        std::vector<int64_t> trailing(shape.begin() + axis, shape.end());
        int64_t d = numElements(trailing);
        std::vector<double> want(x.numel());
        for (int64_t r = 0; r < x.numel() / d; ++r) {
          double mean = 0, var = 0;
          for (int64_t i = 0; i < d; ++i)
            mean += x.at(r * d + i) / d;
          for (int64_t i = 0; i < d; ++i)
            var += (x.at(r * d + i) - mean) * (x.at(r * d + i) - mean) / d;
          for (int64_t i = 0; i < d; ++i) {
            int64_t so = broadcastOffset(unravel(i, trailing), scaleShape);
            want[r * d + i] = (x.at(r * d + i) - mean) / std::sqrt(var + 1e-5) * scale.at(so) +
                              (withBias ? bias.at(so) : 0);
          }
        }
        double tol = t == bundle::BF16 ? 4e-2 : t == bundle::F32 ? 1e-4 : tolFor(t);
        expectNear(y, want, tol, tol, "layer_norm " + shapeString(shape));
      }
}

TEST(CpuKernels, GroupNorm) {
  for (DType t : {bundle::F32, bundle::F64}) {
    const std::vector<int64_t> shape = {2, 6, 4, 3};
    for (int64_t groups : {1, 2, 3, 6}) {
      HT x = randomTensor(t, shape), scale = randomTensor(t, {6}), bias = randomTensor(t, {6});
      HT y(t, shape);
      ASSERT_OK(Op("group_norm")
                    .i("num_groups", groups)
                    .f("epsilon", 1e-5)
                    .run({&x, &scale, &bias}, {&y}));
      const int64_t len = 6 / groups * 12;
      std::vector<double> want(x.numel());
      for (int64_t gidx = 0; gidx < 2 * groups; ++gidx) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < len; ++i)
          mean += x.at(gidx * len + i) / len;
        for (int64_t i = 0; i < len; ++i)
          var += std::pow(x.at(gidx * len + i) - mean, 2) / len;
        for (int64_t i = 0; i < len; ++i) {
          int64_t c = unravel(gidx * len + i, shape)[1];
          want[gidx * len + i] =
              (x.at(gidx * len + i) - mean) / std::sqrt(var + 1e-5) * scale.at(c) + bias.at(c);
        }
      }
      expectNear(y, want, "group_norm");
    }
    HT x = randomTensor(t, shape), p = randomTensor(t, {6}), y(t, shape);
    EXPECT_FALSE(
        Op("group_norm").i("num_groups", 4).f("epsilon", 1e-5).run({&x, &p, &p}, {&y}).isOk());
  }
}

//===----------------------------------------------------------------------===//
// nll_loss
//===----------------------------------------------------------------------===//

// cross_entropy / cross_entropy_grad (forge-fuse's fused classifier loss)
// against float64: lse = log sum exp, loss = lse - x[t], and the gradient
// g * (softmax - one_hot); logits spread over +-30 so the max shift matters.
TEST(CpuKernels, CrossEntropy) {
  const int64_t n = 6, c = 7;
  for (DType t : {bundle::F32, bundle::F64})
    for (DType it : {bundle::I64, bundle::I32}) {
      HT x = randomTensor(t, {n, c}, -30, 30);
      HT target = make(it, {n}, randomInts(n, 0, c - 1));
      HT loss(t, {n}), lse(t, {n});
      ASSERT_OK(Op("cross_entropy").run({&x, &target}, {&loss, &lse}));
      std::vector<double> wantLoss, wantLse;
      for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY, e = 0;
        for (int64_t j = 0; j < c; ++j)
          m = std::max(m, x.at(i * c + j));
        for (int64_t j = 0; j < c; ++j)
          e += std::exp(x.at(i * c + j) - m);
        wantLse.push_back(m + std::log(e));
        wantLoss.push_back(wantLse.back() - x.at(i * c + int64_t(target.at(i))));
      }
      expectNear(loss, wantLoss, "cross_entropy loss");
      expectNear(lse, wantLse, "cross_entropy lse");
      for (const std::string red : {"none", "sum", "mean"}) {
        HT dy = red == "none" ? randomTensor(t, {n}, -2, 2) : randomTensor(t, {}, 0.5, 2);
        HT dx(t, {n, c});
        ASSERT_OK(Op("cross_entropy_grad").s("reduction", red).run({&x, &lse, &target, &dy},
                                                                   {&dx}));
        std::vector<double> want;
        for (int64_t i = 0; i < n; ++i) {
          double g = red == "none" ? dy.at(i) : red == "mean" ? dy.at(0) / n : dy.at(0);
          for (int64_t j = 0; j < c; ++j)
            want.push_back(g * (std::exp(x.at(i * c + j) - wantLse[i]) -
                                (j == int64_t(target.at(i)) ? 1.0 : 0.0)));
        }
        expectNear(dx, want, "cross_entropy_grad " + red);
        // cross_entropy_with_grad: both from the logits in one op, the
        // same float64 reference; then written over the logits (in place,
        // as forge-plan-memory may place it).
        HT loss2(t, {n}), dx2(t, {n, c});
        ASSERT_OK(Op("cross_entropy_with_grad").s("reduction", red).run({&x, &target, &dy},
                                                                        {&loss2, &dx2}));
        expectNear(loss2, wantLoss, "cross_entropy_with_grad loss " + red);
        expectNear(dx2, want, "cross_entropy_with_grad " + red);
        HT inPlace = x;
        ASSERT_OK(Op("cross_entropy_with_grad").s("reduction", red).run({&inPlace, &target, &dy},
                                                                        {&loss2, &inPlace}));
        expectNear(loss2, wantLoss, "cross_entropy_with_grad in place, loss " + red);
        expectNear(inPlace, want, "cross_entropy_with_grad in place " + red);
      }
    }
  HT x = randomTensor(bundle::F32, {2, 3});
  HT bad = make(bundle::I64, {2}, {1, 3});
  HT loss(bundle::F32, {2}), lse(bundle::F32, {2});
  Status s = Op("cross_entropy").run({&x, &bad}, {&loss, &lse});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("target 3 at position 1 is outside [0, 3)"), std::string::npos)
      << s.message();
}

// cross_entropy(_grad) with `classes`: rows of 9 values whose first 7 are the
// logits (padded for an aligned GEMM). The results equal the unpadded ops' on
// those 7 columns; the padding (huge values, which would dominate a softmax)
// is ignored and its gradient is exactly zero; a target in the padding faults.
TEST(CpuKernels, CrossEntropyPaddedRows) {
  const int64_t n = 5, c = 7, stride = 9;
  HT x = randomTensor(bundle::F32, {n, c}, -30, 30);
  std::vector<double> padded;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j)
      padded.push_back(x.at(i * c + j));
    padded.push_back(1e30);
    padded.push_back(-1e30);
  }
  HT xp = make(bundle::F32, {n, stride}, padded);
  HT target = make(bundle::I64, {n}, randomInts(n, 0, c - 1));
  HT loss(bundle::F32, {n}), lse(bundle::F32, {n}), lossP(bundle::F32, {n}), lseP(bundle::F32, {n});
  ASSERT_OK(Op("cross_entropy").run({&x, &target}, {&loss, &lse}));
  ASSERT_OK(Op("cross_entropy").i("classes", c).run({&xp, &target}, {&lossP, &lseP}));
  std::vector<double> wantLoss, wantLse;
  for (int64_t i = 0; i < n; ++i) {
    wantLoss.push_back(loss.at(i));
    wantLse.push_back(lse.at(i));
  }
  expectEqual(lossP, wantLoss, "padded loss");
  expectEqual(lseP, wantLse, "padded lse");
  HT dy = randomTensor(bundle::F32, {}, 0.5, 2);
  HT dx(bundle::F32, {n, c}), dxP(bundle::F32, {n, stride});
  ASSERT_OK(Op("cross_entropy_grad").s("reduction", "mean").run({&x, &lse, &target, &dy}, {&dx}));
  ASSERT_OK(Op("cross_entropy_grad").s("reduction", "mean").i("classes", c)
                .run({&xp, &lse, &target, &dy}, {&dxP}));
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j)
      want.push_back(dx.at(i * c + j));
    want.push_back(0.0);
    want.push_back(0.0);
  }
  expectEqual(dxP, want, "padded gradient");
  HT bad = make(bundle::I64, {n}, {0, 1, 7, 2, 3});
  Status st = Op("cross_entropy").i("classes", c).run({&xp, &bad}, {&lossP, &lseP});
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("target 7 at position 2 is outside [0, 7)"), std::string::npos)
      << st.message();
  st = Op("cross_entropy").i("classes", stride + 1).run({&xp, &target}, {&lossP, &lseP});
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("classes 10 is outside [1, 9]"), std::string::npos) << st.message();
}

TEST(CpuKernels, NllLoss) {
  const std::vector<int64_t> xs = {3, 5, 4}, ts = {3, 4};
  for (DType t : {bundle::F32, bundle::F64})
    for (DType it : {bundle::I64, bundle::I32})
      for (bool withWeight : {false, true})
        for (bool withIgnore : {false, true})
          for (const std::string red : {"none", "sum", "mean"}) {
            HT x = randomTensor(t, xs, -3, 0), w = randomTensor(t, {5}, 0.1, 2);
            HT target = make(it, ts, randomInts(12, 0, 4));
            Op op("nll_loss");
            op.s("reduction", red);
            if (withIgnore)
              op.i("ignore_index", 2);
            HT y(t, red == "none" ? ts : std::vector<int64_t>{});
            ASSERT_OK(op.run({&x, &target, withWeight ? &w : nullptr}, {&y}));
            std::vector<double> losses(12);
            double sum = 0, wsum = 0;
            for (int64_t i = 0; i < 12; ++i) {
              int64_t n = i / 4, d = i % 4, cls = int64_t(target.at(i));
              if (withIgnore && cls == 2)
                continue;
              double wt = withWeight ? w.at(cls) : 1;
              losses[i] = -x.at((n * 5 + cls) * 4 + d) * wt;
              sum += losses[i];
              wsum += wt;
            }
            std::vector<double> want = red == "none"  ? losses
                                       : red == "sum" ? std::vector<double>{sum}
                                                      : std::vector<double>{sum / wsum};
            expectNear(y, want, "nll_loss " + red);
          }
  // 2-D input, out-of-range target -> error; ignored out-of-range is fine.
  HT x = randomTensor(bundle::F32, {2, 3}), y(bundle::F32, {});
  HT bad = make(bundle::I64, {2}, {1, 3});
  Status st = Op("nll_loss").s("reduction", "mean").run({&x, &bad}, {&y});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("target"), std::string::npos) << st.message();
  HT ign = make(bundle::I64, {2}, {1, -100});
  ASSERT_OK(Op("nll_loss").s("reduction", "mean").i("ignore_index", -100).run({&x, &ign}, {&y}));
  expectNear(y, {-x.at(1)});
  EXPECT_FALSE(Op("nll_loss").s("reduction", "avg").run({&x, &ign}, {&y}).isOk());
}

//===----------------------------------------------------------------------===//
// Data movement (hand-computed cases)
//===----------------------------------------------------------------------===//

std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(CpuKernels, ReshapeTransposeBroadcast) {
  HT x = make(bundle::F32, {2, 3}, iota(6)), r(bundle::F32, {3, 2});
  ASSERT_OK(Op("reshape").ints("shape", {3, 2}).run({&x}, {&r}));
  expectEqual(r, iota(6));
  HT bad(bundle::F32, {4, 2});
  EXPECT_FALSE(Op("reshape").ints("shape", {4, 2}).run({&x}, {&bad}).isOk());

  for (DType t : {bundle::F32, bundle::I64, bundle::F16, bundle::BOOL, bundle::I8}) {
    HT a = make(t, {2, 3, 4}, t == bundle::BOOL ? randomInts(24, 0, 1) : iota(24));
    HT y(t, {4, 2, 3});
    ASSERT_OK(Op("transpose").ints("perm", {2, 0, 1}).run({&a}, {&y}));
    std::vector<double> want;
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          want.push_back(a.at((i * 3 + j) * 4 + k));
    expectEqual(y, want, "transpose");
  }
  HT big = randomTensor(bundle::F64, {37, 300, 5}), bt(bundle::F64, {5, 300, 37});
  ASSERT_OK(Op("transpose").ints("perm", {2, 1, 0}).run({&big}, {&bt}));
  std::vector<double> want(big.numel());
  for (int64_t i = 0; i < big.numel(); ++i) {
    auto idx = unravel(i, {5, 300, 37});
    want[i] = big.at(ravel({idx[2], idx[1], idx[0]}, big.shape));
  }
  expectEqual(bt, want);
  HT y(bundle::F32, {3, 2});
  EXPECT_FALSE(Op("transpose").ints("perm", {0, 0}).run({&x}, {&y}).isOk());

  HT b = make(bundle::I32, {3, 1}, {1, 2, 3}), bb(bundle::I32, {2, 3, 2});
  ASSERT_OK(Op("broadcast").ints("shape", {2, 3, 2}).run({&b}, {&bb}));
  expectEqual(bb, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  HT wrong(bundle::I32, {2, 4, 2});
  EXPECT_FALSE(Op("broadcast").ints("shape", {2, 4, 2}).run({&b}, {&wrong}).isOk());
}

TEST(CpuKernels, ConcatSplit) {
  HT a = make(bundle::I64, {2, 1, 2}, {0, 1, 2, 3}), b = make(bundle::I64, {2, 2, 2}, iota(8, 10)),
     c = make(bundle::I64, {2, 0, 2}, {});
  HT y(bundle::I64, {2, 3, 2});
  ASSERT_OK(Op("concat").i("axis", 1).run({&a, &b, &c}, {&y}));
  expectEqual(y, {0, 1, 10, 11, 12, 13, 2, 3, 14, 15, 16, 17});
  HT s0(bundle::I64, {2, 1, 2}), s1(bundle::I64, {2, 2, 2});
  ASSERT_OK(Op("split").i("axis", 1).ints("sizes", {1, 2}).run({&y}, {&s0, &s1}));
  expectEqual(s0, a.values());
  expectEqual(s1, b.values());
  HT bad(bundle::I64, {2, 4, 2});
  EXPECT_FALSE(Op("concat").i("axis", 1).run({&a, &b}, {&bad}).isOk());
  EXPECT_FALSE(Op("split").i("axis", 1).ints("sizes", {2, 1}).run({&y}, {&s0, &s1}).isOk());
  HT f = make(bundle::F32, {2}, {1, 2});
  EXPECT_FALSE(Op("concat").i("axis", 1).run({&a, &f}, {&y}).isOk()); // dtype mismatch
}

TEST(CpuKernels, Slice) {
  HT x = make(bundle::F32, {3, 5}, iota(15));
  HT y(bundle::F32, {2, 2});
  ASSERT_OK(Op("slice")
                .ints("starts", {1, 4})
                .ints("ends", {3, 0})
                .ints("steps", {1, -2})
                .run({&x}, {&y}));
  expectEqual(y, {9, 7, 14, 12});
  HT z(bundle::F32, {3, 2});
  ASSERT_OK(Op("slice")
                .ints("starts", {2, 0})
                .ints("ends", {-1, 5})
                .ints("steps", {-1, 3})
                .run({&x}, {&z}));
  expectEqual(z, {10, 13, 5, 8, 0, 3});
  HT e(bundle::F32, {0, 5});
  ASSERT_OK(Op("slice")
                .ints("starts", {2, 0})
                .ints("ends", {2, 5})
                .ints("steps", {1, 1})
                .run({&x}, {&e}));
  HT w(bundle::F32, {2, 2});
  EXPECT_FALSE(Op("slice")
                   .ints("starts", {2, 4})
                   .ints("ends", {4, 6})
                   .ints("steps", {1, 1})
                   .run({&x}, {&w})
                   .isOk()); // reads past the end
}

TEST(CpuKernels, Pad) {
  HT x = make(bundle::F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  // numpy.pad(x, ((1, 0), (2, 1)), mode=...)
  HT y(bundle::F32, {3, 6});
  ASSERT_OK(
      Op("pad").ints("pads", {1, 2, 0, 1}).s("mode", "constant").f("value", 9).run({&x}, {&y}));
  expectEqual(y, {9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 9, 9, 9, 4, 5, 6, 9});
  ASSERT_OK(
      Op("pad").ints("pads", {1, 2, 0, 1}).s("mode", "reflect").f("value", 0).run({&x}, {&y}));
  expectEqual(y, {6, 5, 4, 5, 6, 5, 3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5});
  ASSERT_OK(Op("pad").ints("pads", {1, 2, 0, 1}).s("mode", "edge").f("value", 0).run({&x}, {&y}));
  expectEqual(y, {1, 1, 1, 2, 3, 3, 1, 1, 1, 2, 3, 3, 4, 4, 4, 5, 6, 6});
  // Negative pads crop.
  HT c(bundle::F32, {2, 2});
  ASSERT_OK(
      Op("pad").ints("pads", {0, -1, 0, 0}).s("mode", "constant").f("value", 0).run({&x}, {&c}));
  expectEqual(c, {2, 3, 5, 6});
  HT r(bundle::F32, {2, 5});
  ASSERT_OK(
      Op("pad").ints("pads", {0, 3, 0, -1}).s("mode", "reflect").f("value", 0).run({&x}, {&r}));
  expectEqual(r, {2, 3, 2, 1, 2, 5, 6, 5, 4, 5}); // numpy reflect pad 3 then crop 1
  HT i = make(bundle::I64, {3}, {1, 2, 3}), iy(bundle::I64, {5});
  ASSERT_OK(Op("pad").ints("pads", {1, 1}).s("mode", "constant").f("value", -4).run({&i}, {&iy}));
  expectEqual(iy, {-4, 1, 2, 3, -4});
  // wrap (ONNX Pad-19): periodic, like numpy.pad(mode="wrap"), also past one period.
  HT w(bundle::I64, {8});
  ASSERT_OK(Op("pad").ints("pads", {4, 1}).s("mode", "wrap").f("value", 0).run({&i}, {&w}));
  expectEqual(w, {3, 1, 2, 3, 1, 2, 3, 1});
  EXPECT_FALSE(
      Op("pad").ints("pads", {1, 1}).s("mode", "circular").f("value", 0).run({&i}, {&iy}).isOk());
}

TEST(CpuKernels, TileGather) {
  HT x = make(bundle::F16, {2, 2}, {1, 2, 3, 4}), t(bundle::F16, {4, 6});
  ASSERT_OK(Op("tile").ints("repeats", {2, 3}).run({&x}, {&t}));
  expectEqual(t, {1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4});

  HT data = make(bundle::F32, {3, 4}, iota(12));
  for (DType it : {bundle::I64, bundle::I32}) {
    HT idx = make(it, {2, 2}, {2, -1, 0, 1}), y(bundle::F32, {3, 2, 2});
    ASSERT_OK(Op("gather").i("axis", 1).run({&data, &idx}, {&y}));
    expectEqual(y, {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9});
    HT y0(bundle::F32, {2, 2, 4});
    ASSERT_OK(Op("gather").i("axis", 0).run({&data, &idx}, {&y0}));
    expectEqual(y0, {8, 9, 10, 11, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7});
    HT bad = make(it, {2, 2}, {2, 4, 0, 1});
    Status st = Op("gather").i("axis", 1).run({&data, &bad}, {&y});
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
    HT neg = make(it, {2, 2}, {2, -5, 0, 1});
    EXPECT_FALSE(Op("gather").i("axis", 1).run({&data, &neg}, {&y}).isOk());
  }
  HT scalarIdx = make(bundle::I64, {}, {-2}), ys(bundle::F32, {4});
  ASSERT_OK(Op("gather").i("axis", 0).run({&data, &scalarIdx}, {&ys}));
  expectEqual(ys, {4, 5, 6, 7});

  HT ge = make(bundle::I64, {2, 3}, {0, 2, -1, 1, 0, 0}), gy(bundle::F32, {2, 3});
  ASSERT_OK(Op("gather_elements").i("axis", 1).run({&data, &ge}, {&gy}));
  expectEqual(gy, {0, 2, 3, 5, 4, 4});
  HT ge0 = make(bundle::I32, {1, 4}, {2, 0, 1, 2}), gy0(bundle::F32, {1, 4});
  ASSERT_OK(Op("gather_elements").i("axis", 0).run({&data, &ge0}, {&gy0}));
  expectEqual(gy0, {8, 1, 6, 11});
  HT geBad = make(bundle::I64, {2, 3}, {0, 2, 4, 1, 0, 0});
  EXPECT_FALSE(Op("gather_elements").i("axis", 1).run({&data, &geBad}, {&gy}).isOk());
}

// resized_crop against a float64 evaluation of its definition (ForgeOps.td): two samples of
// a 3x4 canvas, one box inside a 3x3 image with an upscale, one box reaching past the image
// (clamped to its last row and column) with a downscale; bf16 storage rounds once.
TEST(CpuKernels, ResizedCropMatchesFloat64) {
  const int64_t ch = 3, cw = 4, c = 2, oh = 2, ow = 3;
  std::vector<double> px;
  for (int64_t i = 0; i < 2 * ch * cw * c; ++i)
    px.push_back(static_cast<double>((i * 37 + 11) % 256));
  HT canvas = make(bundle::U8, {2, ch, cw, c}, px);
  const std::vector<double> geo = {0.5, 0.25, 2.0, 1.5, 3, 3, // x0 y0 w h imageW imageH
                                   1.0, 0.0,  5.0, 4.0, 4, 2};
  HT g = make(bundle::F32, {2, 6}, geo);
  HT out(bundle::F32, {2, oh, ow, c}), low(bundle::BF16, {2, oh, ow, c});
  ASSERT_OK(Op("resized_crop").i("height", oh).i("width", ow).run({&canvas, &g}, {&out}));
  ASSERT_OK(Op("resized_crop").i("height", oh).i("width", ow).run({&canvas, &g}, {&low}));
  auto tap = [](int64_t i, double origin, double box, int64_t size, double extent) {
    const double s = std::clamp(origin + (i + 0.5) * box / size - 0.5, 0.0, extent - 1);
    const int64_t lo = static_cast<int64_t>(s);
    return std::tuple{lo, std::min<int64_t>(lo + 1, static_cast<int64_t>(extent) - 1), s - lo};
  };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x)
        for (int64_t k = 0; k < c; ++k) {
          const double *q = geo.data() + b * 6;
          auto [x0, x1, fx] = tap(x, q[0], q[2], ow, q[4]);
          auto [y0, y1, fy] = tap(y, q[1], q[3], oh, q[5]);
          auto p = [&](int64_t yy, int64_t xx) { return px[((b * ch + yy) * cw + xx) * c + k]; };
          const double top = p(y0, x0) + (p(y0, x1) - p(y0, x0)) * fx;
          const double bottom = p(y1, x0) + (p(y1, x1) - p(y1, x0)) * fx;
          const double want = top + (bottom - top) * fy;
          const int64_t at = ((b * oh + y) * ow + x) * c + k;
          EXPECT_NEAR(out.at(at), want, 1e-4) << b << " " << y << " " << x << " " << k;
          EXPECT_NEAR(low.at(at), want, std::abs(want) * 0x1p-8 + 1e-4) << at;
        }
  HT badGeo(bundle::F32, {2, 5});
  EXPECT_FALSE(
      Op("resized_crop").i("height", oh).i("width", ow).run({&canvas, &badGeo}, {&out}).isOk());
  std::vector<double> nanGeo = geo;
  nanGeo[7] = std::nan("");
  HT gNan = make(bundle::F32, {2, 6}, nanGeo);
  Status st = Op("resized_crop").i("height", oh).i("width", ow).run({&canvas, &gNan}, {&out});
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("sample 1's crop box"), std::string::npos) << st.message();
}

TEST(CpuKernels, TriluOneHotConstant) {
  HT x = make(bundle::I32, {2, 3, 4}, iota(24, 1));
  HT u(bundle::I32, {2, 3, 4}), l(bundle::I32, {2, 3, 4});
  ASSERT_OK(Op("trilu").i("upper", 1).i("k", 1).run({&x}, {&u}));
  ASSERT_OK(Op("trilu").i("upper", 0).i("k", -1).run({&x}, {&l}));
  for (int64_t i = 0; i < 24; ++i) {
    int64_t r = (i / 4) % 3, c = i % 4;
    EXPECT_EQ(u.at(i), c - r >= 1 ? x.at(i) : 0) << i;
    EXPECT_EQ(l.at(i), c - r <= -1 ? x.at(i) : 0) << i;
  }

  HT idx = make(bundle::I64, {2, 2}, {0, -1, 5, 2}), oh(bundle::F32, {2, 3, 2});
  ASSERT_OK(Op("one_hot")
                .i("depth", 3)
                .i("axis", 1)
                .f("off_value", -1)
                .f("on_value", 4)
                .dt("dtype", bundle::F32)
                .run({&idx}, {&oh}));
  // oh[n, c, j] = on if idx[n, j] == c (-1 -> 2, 5 out of range).
  expectEqual(oh, {4, -1, -1, -1, -1, 4, -1, -1, -1, -1, -1, 4});
  HT oi(bundle::I64, {2, 2, 3});
  ASSERT_OK(Op("one_hot")
                .i("depth", 3)
                .i("axis", 2)
                .f("off_value", 0)
                .f("on_value", 1)
                .dt("dtype", bundle::I64)
                .run({&idx}, {&oi}));
  expectEqual(oi, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1});
  HT wrongType(bundle::F32, {2, 2, 3});
  EXPECT_FALSE(Op("one_hot")
                   .i("depth", 3)
                   .i("axis", 2)
                   .f("off_value", 0)
                   .f("on_value", 1)
                   .dt("dtype", bundle::I64)
                   .run({&idx}, {&wrongType})
                   .isOk());

  HT cst(bundle::F64, {2, 2});
  Op c("constant");
  c.attr("value").mutable_floats()->add_values(2.5);
  ASSERT_OK(c.run({}, {&cst}));
  expectEqual(cst, {2.5, 2.5, 2.5, 2.5});
  HT ci(bundle::I32, {3});
  ASSERT_OK(Op("constant").ints("value", {4, 5, 6}).run({}, {&ci}));
  expectEqual(ci, {4, 5, 6});
  EXPECT_FALSE(Op("constant").ints("value", {4, 5}).run({}, {&ci}).isOk());
}

} // namespace

TEST(CpuKernels, AttentionReadsQkvViews) {
  // forge-fold-attention-views: q, k and v as views into a fused projection
  // [B, T, 3 * H * D] (row_strides = 3 * H * D each) give what packed copies
  // give, bit for bit, forward and backward; too small a stride is refused.
  const int64_t B = 2, T = 5, H = 3, D = 4, N = 3 * H * D;
  HT qkv = randomTensor(bundle::F32, {B, T, N});
  std::vector<HT> parts;
  for (int p = 0; p < 3; ++p) {
    HT x(bundle::F32, {B, T, H, D});
    for (int64_t t = 0; t < B * T; ++t)
      for (int64_t c = 0; c < H * D; ++c)
        x.data<float>()[t * H * D + c] = qkv.data<float>()[t * N + p * H * D + c];
    parts.push_back(std::move(x));
  }
  auto views = [&] {
    std::vector<TensorView> v;
    for (int p = 0; p < 3; ++p)
      v.push_back(TensorView{qkv.data<float>() + p * H * D, bundle::F32, {B, T, H, D}});
    return v;
  };
  auto attention = [&](const std::string &op, bool strided) {
    Op a(op);
    a.f("scale", 0.5).i("causal", 1).s("layout", "bshd");
    if (strided)
      a.ints("row_strides", {N, N, N});
    return a;
  };
  HT o1(bundle::F32, {B, T, H, D}), l1(bundle::F32, {B, H, T}), o2 = o1, l2 = l1;
  EXPECT_OK(attention("attention", false).run({&parts[0], &parts[1], &parts[2]}, {&o1, &l1}));
  std::vector<TensorView> in = views(), out = {o2.view(), l2.view()};
  EXPECT_OK(runCpuKernel(attention("attention", true).inst, in, out, pool()));
  EXPECT_EQ(o1.bytes, o2.bytes);
  EXPECT_EQ(l1.bytes, l2.bytes);

  HT dout = randomTensor(bundle::F32, {B, T, H, D});
  HT dq1(bundle::F32, {B, T, H, D}), dk1 = dq1, dv1 = dq1, dq2 = dq1, dk2 = dq1, dv2 = dq1;
  EXPECT_OK(attention("attention_grad", false)
                .run({&parts[0], &parts[1], &parts[2], &o1, &l1, &dout}, {&dq1, &dk1, &dv1}));
  in = views();
  for (HT *h : {&o1, &l1, &dout})
    in.push_back(h->view());
  out = {dq2.view(), dk2.view(), dv2.view()};
  EXPECT_OK(runCpuKernel(attention("attention_grad", true).inst, in, out, pool()));
  EXPECT_EQ(dq1.bytes, dq2.bytes);
  EXPECT_EQ(dk1.bytes, dk2.bytes);
  EXPECT_EQ(dv1.bytes, dv2.bytes);
  // A nonzero gradient, or the comparison would prove little.
  EXPECT_NE(dk1.at(0), 0.0);

  in = views();
  out = {o2.view(), l2.view()};
  Op small = attention("attention", false);
  small.ints("row_strides", {N, H * D - 1, N});
  Status st = runCpuKernel(small.inst, in, out, pool());
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("row_strides"), std::string::npos) << st.message();
}

TEST(CpuKernels, AttentionGradWritesConcatPieces) {
  // forge-fold-attention-views' backward concat: dq and dv written into one
  // [B, T, 3 * H * D] buffer a token stride apart (out_row_strides, 0 for a
  // packed dk) hold what the packed kernel gives, and the bytes between the
  // rows (dk's piece) are left alone; too short a stride is refused.
  const int64_t B = 2, T = 5, H = 3, D = 4, N = 3 * H * D;
  HT q = randomTensor(bundle::F32, {B, T, H, D}), k = randomTensor(bundle::F32, {B, T, H, D}),
     v = randomTensor(bundle::F32, {B, T, H, D}), dout = randomTensor(bundle::F32, {B, T, H, D});
  HT o(bundle::F32, {B, T, H, D}), l(bundle::F32, {B, H, T});
  Op fwd("attention");
  fwd.f("scale", 0.5).i("causal", 1).s("layout", "bshd");
  ASSERT_OK(fwd.run({&q, &k, &v}, {&o, &l}));
  auto grad = [] {
    Op a("attention_grad");
    a.f("scale", 0.5).i("causal", 1).s("layout", "bshd");
    return a;
  };
  HT dq(bundle::F32, {B, T, H, D}), dk = dq, dv = dq, dk2 = dq;
  ASSERT_OK(grad().run({&q, &k, &v, &o, &l, &dout}, {&dq, &dk, &dv}));
  HT cat(bundle::F32, {B, T, N});
  for (int64_t i = 0; i < B * T * N; ++i)
    cat.data<float>()[i] = -7.0f; // dk's piece keeps it
  std::vector<TensorView> in;
  for (HT *h : {&q, &k, &v, &o, &l, &dout})
    in.push_back(h->view());
  std::vector<TensorView> out = {
      TensorView{cat.data<float>(), bundle::F32, {B, T, H, D}}, dk2.view(),
      TensorView{cat.data<float>() + 2 * H * D, bundle::F32, {B, T, H, D}}};
  Op strided = grad();
  strided.ints("out_row_strides", {N, 0, N});
  ASSERT_OK(runCpuKernel(strided.inst, in, out, pool()));
  for (int64_t t = 0; t < B * T; ++t)
    for (int64_t c = 0; c < H * D; ++c) {
      ASSERT_EQ(cat.data<float>()[t * N + c], dq.data<float>()[t * H * D + c]) << t << " " << c;
      ASSERT_EQ(cat.data<float>()[t * N + H * D + c], -7.0f) << t << " " << c;
      ASSERT_EQ(cat.data<float>()[t * N + 2 * H * D + c], dv.data<float>()[t * H * D + c]);
    }
  EXPECT_EQ(dk.bytes, dk2.bytes);
  // Nonzero gradients (the first query sees one key: its dq is 0), or the
  // comparison would prove little.
  EXPECT_NE(dq.at(B * T * H * D - 1), 0.0);
  EXPECT_NE(dv.at(0), 0.0);

  Op small = grad();
  small.ints("out_row_strides", {H * D - 1, 0, N});
  Status st = runCpuKernel(small.inst, in, out, pool());
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("out_row_strides"), std::string::npos) << st.message();
  Op count = grad();
  count.ints("out_row_strides", {N, N});
  st = runCpuKernel(count.inst, in, out, pool());
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("one token stride per output"), std::string::npos) << st.message();
}
