// CpuExecutor: a hand-built bundle (add -> relu -> matmul with constants in a
// section) run and compared with hand-computed values; clear errors for a
// missing kernel and for bad inputs.
#include "forge/runtime/CpuExecutor.h"
#include "BundleTestUtil.h"

#include <cstring>

#include <gtest/gtest.h>

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fb = forge::bundle;

namespace {

int32_t addSectionTensor(BundleWriter &w, std::string name, fb::TensorInfo::Kind kind,
                         std::vector<int64_t> shape, uint32_t section, uint64_t offset) {
  int32_t i = addTensor(w.program(), std::move(name), kind, std::move(shape));
  fb::TensorInfo *t = w.program().mutable_tensors(i);
  t->set_section(section);
  t->set_data_offset(offset);
  t->set_data_size(static_cast<uint64_t>(numElements({t->shape().begin(), t->shape().end()})) * 4);
  return i;
}

/// The routine called `name`, created when absent.
fb::Routine *routine(fb::Program &p, const std::string &name = "forward") {
  for (fb::Routine &r : *p.mutable_routines())
    if (r.name() == name)
      return &r;
  fb::Routine *r = p.add_routines();
  r->set_name(name);
  return r;
}

void addInst(fb::Program &p, std::string op, std::vector<int32_t> in, std::vector<int32_t> out,
             const std::string &routineName = "forward") {
  fb::Routine *r = routine(p, routineName);
  fb::Instruction *inst = r->add_instructions();
  inst->set_op(std::move(op));
  inst->set_name("n" + std::to_string(r->instructions_size() - 1));
  for (int32_t t : in)
    inst->add_inputs(t);
  for (int32_t t : out)
    inst->add_outputs(t);
}

// y = relu(x + b) @ w, with b[2,3] and w[3,2] in one "params" section.
const std::vector<float> kB = {0.5f, -1.0f, 2.0f, -3.0f, 0.0f, 1.0f};
const std::vector<float> kW = {1, 2, 3, 4, 5, 6};

BundleWriter makeMlp() {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cpu");
  std::vector<float> params = kB;
  params.resize(16, 0.0f); // w starts at byte 64 of the section
  params.insert(params.end(), kW.begin(), kW.end());
  uint32_t sec = w.addSection("params", floatBytes(params));
  int32_t x = addTensor(p, "x", fb::TensorInfo::INPUT, {2, 3}, 0);
  int32_t b = addSectionTensor(w, "b", fb::TensorInfo::CONSTANT, {2, 3}, sec, 0);
  int32_t s = addTensor(p, "s", fb::TensorInfo::INTERMEDIATE, {2, 3}, 64);
  int32_t r = addTensor(p, "r", fb::TensorInfo::INTERMEDIATE, {2, 3}, 128);
  int32_t wt = addSectionTensor(w, "w", fb::TensorInfo::PARAMETER, {3, 2}, sec, 64);
  int32_t y = addTensor(p, "y", fb::TensorInfo::OUTPUT, {2, 2}, 0); // reuses x's slot
  p.set_arena_size(192);
  addInst(p, "add", {x, b}, {s});
  addInst(p, "relu", {s}, {r});
  addInst(p, "matmul", {r, wt}, {y});
  routine(p)->add_inputs(x);
  routine(p)->add_outputs(y);
  return w;
}

std::vector<float> expectedMlp(const std::vector<float> &x) {
  float r[6];
  for (int i = 0; i < 6; ++i)
    r[i] = std::max(0.0f, x[i] + kB[i]);
  std::vector<float> y(4, 0.0f);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k)
        y[i * 2 + j] += r[i * 3 + k] * kW[k * 2 + j];
  return y;
}

std::unique_ptr<Bundle> load(BundleWriter &w) {
  auto b = Bundle::fromBytes(w.serialize(), "mlp.forge");
  EXPECT_TRUE(b.isOk()) << b.status().message();
  return b.isOk() ? b.take() : nullptr;
}

std::vector<float> readFloats(const TensorView &v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  std::memcpy(out.data(), v.data, out.size() * 4);
  return out;
}

} // namespace

TEST(CpuExecutorTest, RunsAddReluMatMul) {
  BundleWriter w = makeMlp();
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  for (unsigned threads : {1u, 4u}) {
    auto ex = CpuExecutor::create(*bundle, {threads});
    ASSERT_TRUE(ex.isOk()) << ex.status().message();
    EXPECT_EQ((*ex)->inputs(), std::vector<int32_t>{0});
    EXPECT_EQ((*ex)->outputs(), std::vector<int32_t>{5});
    EXPECT_EQ((*ex)->tensorInfo(5).name(), "y");
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*ex)->view(0).data) % 64, 0u);

    for (const std::vector<float> &x :
         {std::vector<float>{1, 2, 3, 4, 5, 6}, std::vector<float>{-1, 0.5f, -2, 3, -0.25f, 0}}) {
      std::vector<float> xs = x;
      TensorView in{xs.data(), fb::F32, {2, 3}};
      ASSERT_TRUE((*ex)->setInput("x", in).isOk());
      Status s = (*ex)->run();
      ASSERT_TRUE(s.isOk()) << s.message();
      TensorView y = (*ex)->view(5);
      EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 2}));
      std::vector<float> got = readFloats(y), want = expectedMlp(x);
      for (int i = 0; i < 4; ++i)
        EXPECT_FLOAT_EQ(got[i], want[i]) << "element " << i;
    }
  }
}

TEST(CpuExecutorTest, ConstantsPointIntoTheBundle) {
  BundleWriter w = makeMlp();
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle);
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  EXPECT_EQ((*ex)->view(1).data, bundle->tensorData(bundle->program().tensors(1)).data());
  EXPECT_EQ(readFloats((*ex)->view(4)), kW);
  EXPECT_FALSE((*ex)->view(99).present());
}

TEST(CpuExecutorTest, MissingKernelFailsAtCreate) {
  BundleWriter w = makeMlp();
  routine(w.program())->mutable_instructions(1)->set_op("frobnicate");
  routine(w.program())->mutable_instructions(2)->set_op("teleport");
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle);
  ASSERT_FALSE(ex.isOk());
  std::string msg = ex.status().message();
  EXPECT_NE(msg.find("mlp.forge"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'frobnicate' (first at routine 'forward' instruction #1 'n1')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'teleport'"), std::string::npos) << msg;
}

TEST(CpuExecutorTest, SetInputChecks) {
  BundleWriter w = makeMlp();
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(ex.isOk());
  std::vector<float> xs(6, 1.0f);
  std::vector<double> xd(6, 1.0);

  Status wrongName = (*ex)->setInput("z", TensorView{xs.data(), fb::F32, {2, 3}});
  EXPECT_NE(wrongName.message().find("'z' is not an input"), std::string::npos)
      << wrongName.message();
  EXPECT_NE(wrongName.message().find("'x'"), std::string::npos);

  Status wrongType = (*ex)->setInput("x", TensorView{xd.data(), fb::F64, {2, 3}});
  EXPECT_NE(wrongType.message().find("got dtype f64, the bundle expects f32"), std::string::npos)
      << wrongType.message();

  Status wrongShape = (*ex)->setInput("x", TensorView{xs.data(), fb::F32, {3, 2}});
  EXPECT_NE(wrongShape.message().find("got shape [3, 2], the bundle expects [2, 3]"),
            std::string::npos)
      << wrongShape.message();

  Status noData = (*ex)->setInput("x", TensorView{nullptr, fb::F32, {2, 3}});
  EXPECT_FALSE(noData.isOk());
}

TEST(CpuExecutorTest, KernelErrorNamesTheInstruction) {
  BundleWriter w = makeMlp();
  // add of [2,3] and [3,2] does not broadcast: the kernel reports, the
  // executor prefixes the instruction.
  routine(w.program())->mutable_instructions(0)->set_inputs(1, 4);
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(ex.isOk());
  Status s = (*ex)->run();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("mlp.forge: routine 'forward' instruction #0"), std::string::npos) << s.message();
}

TEST(CpuExecutorTest, WrittenParametersGetAPrivateCopy) {
  BundleWriter w = makeMlp();
  // An instruction that overwrites the parameter w (as an optimizer step will).
  fb::Program &p = w.program();
  p.mutable_tensors(4)->set_shape(0, 2);
  p.mutable_tensors(4)->set_shape(1, 3);
  p.mutable_tensors(4)->set_data_size(24);
  routine(p)->clear_instructions();
  addInst(p, "relu", {0}, {4});
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  std::span<const uint8_t> original = bundle->tensorData(bundle->program().tensors(4));
  std::vector<uint8_t> before(original.begin(), original.end());

  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  EXPECT_NE((*ex)->view(4).data, original.data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*ex)->view(4).data) % 64, 0u);
  std::vector<float> xs = {-1, 2, -3, 4, -5, 6};
  ASSERT_TRUE((*ex)->setInput("x", TensorView{xs.data(), fb::F32, {2, 3}}).isOk());
  ASSERT_TRUE((*ex)->run().isOk());
  EXPECT_EQ(readFloats((*ex)->view(4)), (std::vector<float>{0, 2, 0, 4, 0, 6}));
  EXPECT_EQ(std::vector<uint8_t>(original.begin(), original.end()), before);
}

TEST(CpuExecutorTest, HugeArenaIsAnErrorNotACrash) {
  BundleWriter w = makeMlp();
  w.program().set_arena_size(~0ull - 10);
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_FALSE(ex.isOk());
  EXPECT_NE(ex.status().message().find("arena"), std::string::npos) << ex.status().message();
}

// A training-style bundle: routine "step" updates a PARAMETER in place
// (w = w - x) and accumulates a STATE counter (c = c + x, via a temporary and
// "copy"); routine "eval" reads w. Updates persist across run() calls and are
// visible to the other routine; the arena is shared by both routines.
TEST(CpuExecutorTest, PersistentTensorsSurviveAcrossRoutines) {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_training(true);
  uint32_t sec = w.addSection("params", floatBytes({1, 2, 3, 4}));
  int32_t x = addTensor(p, "x", fb::TensorInfo::INPUT, {4}, 0);
  int32_t wt = addSectionTensor(w, "w", fb::TensorInfo::PARAMETER, {4}, sec, 0);
  int32_t c = addTensor(p, "c", fb::TensorInfo::STATE, {4});
  int32_t tmp = addTensor(p, "tmp", fb::TensorInfo::INTERMEDIATE, {4}, 64);
  int32_t ex2 = addTensor(p, "x2", fb::TensorInfo::INPUT, {4}, 0); // same slot as x
  int32_t y = addTensor(p, "y", fb::TensorInfo::OUTPUT, {4}, 64);
  int32_t frozen = addSectionTensor(w, "frozen", fb::TensorInfo::PARAMETER, {4}, sec, 0);
  p.set_arena_size(128);
  addInst(p, "sub", {wt, x}, {wt}, "step");
  addInst(p, "add", {c, x}, {tmp}, "step");
  addInst(p, "copy", {tmp}, {c}, "step");
  routine(p, "step")->add_inputs(x);
  addInst(p, "mul", {wt, ex2}, {y}, "eval");
  routine(p, "eval")->add_inputs(ex2);
  routine(p, "eval")->add_outputs(y);
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto exe = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(exe.isOk()) << exe.status().message();
  CpuExecutor &e = **exe;

  EXPECT_EQ(e.numRoutines(), 2);
  auto step = e.findRoutine("step"), eval = e.findRoutine("eval");
  ASSERT_TRUE(step.isOk() && eval.isOk());
  EXPECT_EQ(*step, 0);
  EXPECT_EQ(*eval, 1);
  EXPECT_EQ(e.routineName(1), "eval");
  auto missing = e.findRoutine("train_step");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("no routine 'train_step' (routines: 'step', 'eval')"),
            std::string::npos)
      << missing.status().message();
  EXPECT_EQ(e.inputs(*eval), std::vector<int32_t>{ex2});
  EXPECT_EQ(e.outputs(*eval), std::vector<int32_t>{y});
  EXPECT_TRUE(e.outputs(5).empty());
  EXPECT_FALSE(e.run(5).isOk());
  EXPECT_EQ(e.persistentTensors(), (std::vector<int32_t>{wt, c, frozen}));
  EXPECT_TRUE(e.isWritable(wt) && e.isWritable(c) && e.isWritable(frozen));
  EXPECT_EQ(readFloats(e.view(c)), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_FALSE(e.setInput(*step, "x2", TensorView{nullptr, fb::F32, {4}}).isOk());

  std::vector<float> xs = {0.5f, 1, 0, -1};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(e.setInput(*step, "x", TensorView{xs.data(), fb::F32, {4}}).isOk());
    Status s = e.run(*step);
    ASSERT_TRUE(s.isOk()) << s.message();
  }
  EXPECT_EQ(readFloats(e.view(wt)), (std::vector<float>{-0.5f, -1, 3, 7}));
  EXPECT_EQ(readFloats(e.view(c)), (std::vector<float>{1.5f, 3, 0, -3}));
  std::vector<float> ones = {1, 1, 1, 1};
  ASSERT_TRUE(e.setInput(*eval, "x2", TensorView{ones.data(), fb::F32, {4}}).isOk());
  ASSERT_TRUE(e.run(*eval).isOk());
  EXPECT_EQ(readFloats(e.view(y)), (std::vector<float>{-0.5f, -1, 3, 7}));
  EXPECT_EQ(readFloats(e.view(wt)), (std::vector<float>{-0.5f, -1, 3, 7}));

  // setPersistent (checkpoint restore) checks the size.
  std::vector<uint8_t> restored = floatBytes({9, 8, 7, 6});
  ASSERT_TRUE(e.setPersistent(wt, restored).isOk());
  EXPECT_EQ(readFloats(e.view(wt)), (std::vector<float>{9, 8, 7, 6}));
  EXPECT_FALSE(e.setPersistent(wt, std::span<const uint8_t>(restored).first(8)).isOk());
  EXPECT_FALSE(e.setPersistent(x, restored).isOk());
}

TEST(CpuExecutorTest, InferenceParametersStayReadOnly) {
  BundleWriter w = makeMlp();
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(ex.isOk());
  EXPECT_EQ((*ex)->persistentTensors(), std::vector<int32_t>{4});
  EXPECT_FALSE((*ex)->isWritable(4));
  std::span<const uint8_t> original = bundle->tensorData(bundle->program().tensors(4));
  EXPECT_EQ((*ex)->view(4).data, original.data());
  std::vector<uint8_t> same(original.begin(), original.end());
  EXPECT_TRUE((*ex)->setPersistent(4, same).isOk());
  same[0] ^= 1;
  Status s = (*ex)->setPersistent(4, same);
  EXPECT_NE(s.message().find("read-only"), std::string::npos) << s.message();
}

TEST(CpuExecutorTest, CopyKernelChecksShapes) {
  BundleWriter w;
  fb::Program &p = w.program();
  int32_t x = addTensor(p, "x", fb::TensorInfo::INPUT, {2, 2}, 0);
  int32_t y = addTensor(p, "y", fb::TensorInfo::OUTPUT, {2, 2}, 64);
  int32_t z = addTensor(p, "z", fb::TensorInfo::OUTPUT, {4}, 128);
  p.set_arena_size(192);
  addInst(p, "copy", {x}, {y});
  routine(p)->add_inputs(x);
  auto bundle = load(w);
  ASSERT_TRUE(bundle);
  auto ex = CpuExecutor::create(*bundle, {1});
  ASSERT_TRUE(ex.isOk());
  std::vector<float> xs = {1, 2, 3, 4};
  ASSERT_TRUE((*ex)->setInput("x", TensorView{xs.data(), fb::F32, {2, 2}}).isOk());
  ASSERT_TRUE((*ex)->run().isOk());
  EXPECT_EQ(readFloats((*ex)->view(y)), xs);

  routine(w.program())->mutable_instructions(0)->set_outputs(0, z);
  auto bad = load(w);
  ASSERT_TRUE(bad);
  auto ex2 = CpuExecutor::create(*bad, {1});
  ASSERT_TRUE(ex2.isOk());
  Status s = (*ex2)->run();
  EXPECT_NE(s.message().find("op 'copy'"), std::string::npos) << s.message();
}

// MFU's denominator against NVIDIA's dense figures, each at the clock it is quoted at:
// A100 SXM (108 SMs, 1.41 GHz) 19.5 / 156 / 312 TFLOP/s FP32 / TF32 / BF16; H100 SXM (132
// SMs, 1.83 GHz) 989 BF16, 1979 FP8, 495 TF32; L40S (142 SMs, 2.52 GHz) 91.6 FP32, 183
// TF32, 733 FP8.
TEST(ExecutorTest, DensePeakFlopsFollowTheBundlesPrecision) {
  auto tflops = [](const std::string &precision, bool tf32, int cc, int sms, double ghz) {
    return forge::rt::Executor::densePeakFlops(precision, tf32, cc, sms, ghz * 1e9) / 1e12;
  };
  EXPECT_NEAR(tflops("", false, 80, 108, 1.41), 19.5, 0.2);
  EXPECT_NEAR(tflops("", true, 80, 108, 1.41), 156, 1.5);
  EXPECT_NEAR(tflops("bf16", true, 80, 108, 1.41), 312, 3);
  EXPECT_NEAR(tflops("bf16", true, 90, 132, 1.83), 989, 10);
  EXPECT_NEAR(tflops("fp16", true, 90, 132, 1.83), 989, 10);
  EXPECT_NEAR(tflops("fp8", true, 90, 132, 1.83), 1979, 20);
  EXPECT_NEAR(tflops("", true, 90, 132, 1.83), 495, 5);
  EXPECT_NEAR(tflops("", false, 89, 142, 2.52), 91.6, 1);
  EXPECT_NEAR(tflops("", true, 89, 142, 2.52), 183, 2);
  EXPECT_NEAR(tflops("fp8", true, 89, 142, 2.52), 733, 8);
  EXPECT_NEAR(tflops("bf16", true, 89, 142, 2.52), 366, 4);
  // No float8 tensor cores on sm_80: an fp8 bundle's GEMMs are bf16 there.
  EXPECT_NEAR(tflops("fp8", true, 80, 108, 1.41), 312, 3);
  // Rates this table does not know give no MFU rather than a wrong one.
  EXPECT_EQ(tflops("bf16", true, 86, 82, 1.7), 0.0);
}
