// cuDNN convolutions as library calls of the CUDA executor (cuda/Conv.h): hand-built bundles
// with one channels-last conv, conv_transpose (the data gradient) and conv_grad_weight each,
// run on the GPU and on the CPU executor (whose kernels define the ops' semantics; bf16
// operands staged through f32 there) from the same inputs, and compared. Depthwise, strided
// (with an output padding), grouped and dense cases with a bias, in bf16 and in f32 with and
// without TF32. Bf16 convolutions run through cuDNN's graph API unless FORGE_CONV_API=legacy,
// TF32 ones only with FORGE_CONV_API=graph (tests/gpu/suite.sh runs this binary all three
// ways); strict f32 always runs the legacy API. Skipped without a GPU.
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Executor.h"
#include "BundleTestUtil.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fb = forge::bundle;

namespace {

struct Case {
  const char *name;
  fb::DType dtype;
  bool tf32;
  int64_t n, h, w, c, m, k, stride, pad, group;
  bool bias;
  // dy's scale: small gradients catch an engine that converts f32 operands to f16
  // (values near 1e-6 lose most of their bits there, none in TF32).
  float gradScale = 1.0f;
};

void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

int64_t outSize(int64_t in, const Case &c) { return (in + 2 * c.pad - c.k) / c.stride + 1; }

void setInts(fb::Instruction *inst, const char *name, std::vector<int64_t> values) {
  auto *ints = (*inst->mutable_attrs())[name].mutable_ints();
  for (int64_t v : values)
    ints->add_values(v);
}

/// Routines "conv" (x, w[, bias] -> y), "dgrad" (conv_transpose: dy, w -> dx) and
/// "wgrad" (conv_grad_weight: x, dy -> dw), channels-last.
std::unique_ptr<Bundle> makeBundle(const Case &c) {
  BundleWriter bw;
  fb::Program &p = bw.program();
  p.set_target("cuda:sm_90");
  p.set_producer("ConvGpuTest");
  if (c.tf32)
    (*p.mutable_build_options())["tf32"] = "1";
  const int64_t oh = outSize(c.h, c), ow = outSize(c.w, c);
  const std::vector<int64_t> xs = {c.n, c.h, c.w, c.c}, ws = {c.m, c.k, c.k, c.c / c.group},
                             ys = {c.n, oh, ow, c.m};
  int64_t offset = 0;
  auto add = [&](const char *name, fb::TensorInfo::Kind kind, const std::vector<int64_t> &shape) {
    int32_t t = addTensor(p, name, kind, shape, offset);
    p.mutable_tensors(t)->set_dtype(c.dtype);
    offset += (numElements(shape) * static_cast<int64_t>(dtypeSize(c.dtype)) + 255) / 256 * 256;
    return t;
  };
  const auto IN = fb::TensorInfo::INPUT, OUT = fb::TensorInfo::OUTPUT;
  auto routine = [&](const char *name, const char *op, std::vector<int32_t> in, int32_t out) {
    fb::Routine *r = p.add_routines();
    r->set_name(name);
    fb::Instruction *inst = r->add_instructions();
    inst->set_op(op);
    inst->set_name(std::string("layer/") + op);
    inst->set_placement(fb::LIBRARY);
    for (int32_t t : in) {
      inst->add_inputs(t);
      r->add_inputs(t);
    }
    inst->add_outputs(out);
    r->add_outputs(out);
    (*inst->mutable_attrs())["channels_last"].set_i(1);
    (*inst->mutable_attrs())["group"].set_i(c.group);
    setInts(inst, "strides", {c.stride, c.stride});
    setInts(inst, "pads", {c.pad, c.pad, c.pad, c.pad});
    setInts(inst, "dilations", {1, 1});
    return inst;
  };
  std::vector<int32_t> convIn = {add("x", IN, xs), add("w", IN, ws)};
  if (c.bias)
    convIn.push_back(add("bias", IN, {c.m}));
  routine("conv", "conv", convIn, add("y", OUT, ys));
  fb::Instruction *dgrad =
      routine("dgrad", "conv_transpose", {add("dy", IN, ys), add("gw", IN, ws)}, add("dx", OUT, xs));
  // The rows and columns a strided forward dropped come back as output padding.
  auto dropped = [&](int64_t in, int64_t out) {
    return in - ((out - 1) * c.stride - 2 * c.pad + c.k);
  };
  setInts(dgrad, "output_padding", {dropped(c.h, oh), dropped(c.w, ow)});
  fb::Instruction *wgrad = routine("wgrad", "conv_grad_weight", {add("gx", IN, xs), add("gdy", IN, ys)},
                                   add("dw", OUT, ws));
  setInts(wgrad, "kernel_shape", {c.k, c.k});
  p.set_arena_size(offset);
  auto bundle = Bundle::fromBytes(bw.serialize(), "conv.forge");
  EXPECT_TRUE(bundle.isOk()) << bundle.status().message();
  return bundle ? bundle.take() : nullptr;
}

/// Uniform values in [-scale, scale] as the case's dtype.
std::vector<uint8_t> randomBytes(int64_t n, fb::DType t, float scale, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> f(static_cast<size_t>(n));
  for (float &v : f)
    v = u(rng);
  return narrowFloats(reinterpret_cast<const uint8_t *>(f.data()), f.size() * sizeof(float), t);
}

double valueAt(const TensorView &v, int64_t i) {
  if (v.dtype == fb::F32)
    return v.as<float>()[i];
  uint16_t h; // bf16 (the only 2-byte type the cases use)
  std::memcpy(&h, static_cast<const uint8_t *>(v.data) + 2 * i, 2);
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Conv.h: bf16 on the graph API unless FORGE_CONV_API=legacy; TF32 only with =graph.
bool graphExpected(const Case &c) {
  const char *v = std::getenv("FORGE_CONV_API");
  const std::string api = v ? v : "";
  if (api == "legacy")
    return false;
  return c.dtype != fb::F32 || (c.tf32 && api == "graph");
}

void runCase(const Case &c) {
  auto bundle = makeBundle(c);
  ASSERT_TRUE(bundle);
  auto gpu = createExecutor(*bundle, ExecutorOptions{"cuda", 0, true});
  ASSERT_TRUE(gpu.isOk()) << gpu.status().message();
  auto cpu = createExecutor(*bundle, ExecutorOptions{"cpu", 0, true});
  ASSERT_TRUE(cpu.isOk()) << cpu.status().message();
  const std::string device = (*gpu)->describe();
  EXPECT_EQ(device.find("3 of 3 convolutions through cuDNN's graph API") != std::string::npos,
            graphExpected(c))
      << device;

  std::mt19937 rng(1234);
  const int64_t oh = outSize(c.h, c), ow = outSize(c.w, c);
  const std::vector<int64_t> xs = {c.n, c.h, c.w, c.c}, ws = {c.m, c.k, c.k, c.c / c.group},
                             ys = {c.n, oh, ow, c.m};
  struct Input {
    const char *name;
    std::vector<int64_t> shape;
    float scale;
  };
  const std::vector<std::pair<const char *, std::vector<Input>>> routines = {
      {"conv", {{"x", xs, 1.0f}, {"w", ws, 0.5f}, {"bias", {c.m}, 1.0f}}},
      {"dgrad", {{"dy", ys, c.gradScale}, {"gw", ws, 0.5f}}},
      {"wgrad", {{"gx", xs, 1.0f}, {"gdy", ys, c.gradScale}}}};
  const char *outputs[] = {"y", "dx", "dw"};
  for (int r = 0; r < 3; ++r) {
    const auto &[routine, inputs] = routines[static_cast<size_t>(r)];
    for (const Input &in : inputs) {
      if (std::string(in.name) == "bias" && !c.bias)
        continue;
      std::vector<uint8_t> bytes = randomBytes(numElements(in.shape), c.dtype, in.scale, rng);
      for (Executor *e : {gpu->get(), cpu->get()}) {
        Status st = e->setInput(r, in.name, TensorView{bytes.data(), c.dtype, in.shape});
        ASSERT_TRUE(st.isOk()) << routine << " " << in.name << ": " << st.message();
      }
    }
    // Three GPU runs: the first checked (and tuning), then graph capture and replay.
    for (int run = 0; run < 3; ++run) {
      Status st = (*gpu)->run(r);
      ASSERT_TRUE(st.isOk()) << routine << ": " << st.message();
      st = (*gpu)->wait();
      ASSERT_TRUE(st.isOk()) << routine << ": " << st.message();
    }
    Status st = (*cpu)->run(r);
    ASSERT_TRUE(st.isOk()) << routine << " on the CPU: " << st.message();
    auto out = (*gpu)->findOutput(r, outputs[r]);
    ASSERT_TRUE(out.isOk());
    TensorView got = (*gpu)->view(*out), want = (*cpu)->view(*(*cpu)->findOutput(r, outputs[r]));
    ASSERT_EQ(got.numel(), want.numel());
    double err = 0, mag = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      double g = valueAt(got, i), w = valueAt(want, i);
      ASSERT_TRUE(std::isfinite(g)) << routine << " element " << i << " is " << g;
      err = std::max(err, std::fabs(g - w));
      mag = std::max(mag, std::fabs(w));
    }
    // bf16 outputs round to 8 bits (2^-9 relative) after f32 sums in another order; TF32
    // rounds operands to 11 bits, and the sums here have at most 9 * 64 terms per output
    // and 4 * 20 * 20 per weight gradient.
    const double tol = c.dtype == fb::BF16 ? 1.5e-2 : c.tf32 ? 4e-3 : 1e-5;
    ASSERT_GT(mag, 0) << routine;
    EXPECT_LE(err / mag, tol) << c.name << " " << routine << ": max error " << err
                              << " against a largest value of " << mag;
    std::printf("[%s] %s: max error / max value %.3g (<= %g)\n", c.name, routine, err / mag, tol);
  }
}

} // namespace

class ConvCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(ConvCaseTest, MatchesTheCpu) {
  if (!cudaAvailable())
    GTEST_SKIP() << "no GPU";
  runCase(GetParam());
}

// The reference half alone (runs anywhere): each case's bundle loads on the CPU executor and
// its three routines give finite results, not all zero.
TEST_P(ConvCaseTest, CpuReferenceRuns) {
  const Case &c = GetParam();
  auto bundle = makeBundle(c);
  ASSERT_TRUE(bundle);
  auto cpu = createExecutor(*bundle, ExecutorOptions{"cpu", 0, true});
  ASSERT_TRUE(cpu.isOk()) << cpu.status().message();
  std::mt19937 rng(7);
  const char *outputs[] = {"y", "dx", "dw"};
  for (int r = 0; r < 3; ++r) {
    for (int32_t t : (*cpu)->inputs(r)) {
      const fb::TensorInfo &info = (*cpu)->tensorInfo(t);
      std::vector<int64_t> shape(info.shape().begin(), info.shape().end());
      std::vector<uint8_t> bytes = randomBytes(numElements(shape), c.dtype, 1.0f, rng);
      Status st = (*cpu)->setInput(r, info.name(), TensorView{bytes.data(), c.dtype, shape});
      ASSERT_TRUE(st.isOk()) << st.message();
    }
    Status st = (*cpu)->run(r);
    ASSERT_TRUE(st.isOk()) << outputs[r] << ": " << st.message();
    TensorView v = (*cpu)->view(*(*cpu)->findOutput(r, outputs[r]));
    double mag = 0;
    for (int64_t i = 0; i < v.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(valueAt(v, i))) << outputs[r] << " element " << i;
      mag = std::max(mag, std::fabs(valueAt(v, i)));
    }
    EXPECT_GT(mag, 0) << outputs[r];
  }
}

INSTANTIATE_TEST_SUITE_P(
    ConvGpuTest, ConvCaseTest,
    ::testing::Values(
        // name, dtype, tf32, n, h, w, c, m, k, stride, pad, group, bias[, dy scale]
        Case{"bf16 depthwise 3x3", fb::BF16, false, 4, 20, 20, 32, 32, 3, 1, 1, 32, false},
        Case{"bf16 depthwise 3x3 stride 2 (output padding)", fb::BF16, false, 4, 20, 20, 48, 48,
             3, 2, 1, 48, false},
        Case{"bf16 grouped 3x3 with bias", fb::BF16, false, 2, 12, 12, 32, 64, 3, 1, 1, 4, true},
        Case{"bf16 dense 1x1 with bias", fb::BF16, false, 4, 14, 14, 64, 96, 1, 1, 0, 1, true},
        Case{"tf32 depthwise 3x3, small gradients", fb::F32, true, 4, 20, 20, 32, 32, 3, 1, 1,
             32, false, 1e-6f},
        Case{"tf32 dense 3x3 stride 2 with bias, small gradients", fb::F32, true, 2, 16, 16, 16,
             32, 3, 2, 1, 1, true, 1e-6f},
        Case{"f32 dense 3x3 (legacy, FMA)", fb::F32, false, 2, 12, 12, 16, 24, 3, 1, 1, 1, true},
        // 3-channel stems (NHWC rows of 6 or 12 bytes): the cnn fixture's first layer, whose
        // TF32 graph-API gradients came out 2.5-4.5% off in gpu_models_tf32 (genuine TF32,
        // bench/tf32_sensitivity_cnn.py).
        Case{"bf16 3-channel stem 3x3 with bias", fb::BF16, false, 8, 32, 32, 3, 16, 3, 1, 1, 1,
             true},
        Case{"tf32 3-channel stem 3x3 with bias, small gradients", fb::F32, true, 8, 32, 32, 3,
             16, 3, 1, 1, 1, true, 1e-6f},
        // The cnn fixture's second layer (its TF32 forward alone moves the cnn's step-1
        // gradients by up to 4.5%: bench/tf32_sensitivity_cnn.py).
        Case{"tf32 cnn second layer 3x3 with bias", fb::F32, true, 8, 16, 16, 16, 32, 3, 1, 1, 1,
             true}),
    [](const ::testing::TestParamInfo<Case> &info) { return std::to_string(info.index); });
