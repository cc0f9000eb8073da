// forge-pad-contractions and the loss over padded logits keep results: an
// LM-head step (matmul to 10 classes, cross-entropy, and the two gradient
// GEMMs, one with a C operand) compiled with every misaligned dim padded
// (N = 10 -> 12, K = 10 -> 12, M = 10 -> 12) and run on the CPU gives the
// unpadded module's loss and gradients (the padding adds exact zeros; only
// the GEMM kernel's summation may regroup: relative 1e-6). The padded module
// must really be padded: the check fails if the pass did nothing.
#include "Passes.h"

#include "forge/Bundle/BundleEmitter.h"
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Pipeline/Pipeline.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/CpuExecutor.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace mlir;
using namespace mlir::forge;
namespace rt = ::forge::rt;

namespace {

constexpr const char *kModule = R"mlir(
func.func @main(%x: tensor<6x8xf32>, %w: tensor<10x8xf32>, %t: tensor<6xi64>, %one: tensor<f32>, %c: tensor<10x8xf32>) -> (tensor<f32>, tensor<6x8xf32>, tensor<10x8xf32>) {
  %l = forge.matmul %x, %w {transB = true} : (tensor<6x8xf32>, tensor<10x8xf32>) -> tensor<6x10xf32>
  %ls = forge.log_softmax %l {axis = 1 : i64} : (tensor<6x10xf32>) -> tensor<6x10xf32>
  %loss = forge.nll_loss %ls, %t {reduction = "mean"} : (tensor<6x10xf32>, tensor<6xi64>) -> tensor<f32>
  %ng = forge.nll_loss_grad %one, %t {num_classes = 10 : i64, reduction = "mean"} : (tensor<f32>, tensor<6xi64>) -> tensor<6x10xf32>
  %d = forge.log_softmax_grad %ls, %ng {axis = 1 : i64} : (tensor<6x10xf32>, tensor<6x10xf32>) -> tensor<6x10xf32>
  %dx = forge.gemm %d, %w {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = false} : (tensor<6x10xf32>, tensor<10x8xf32>) -> tensor<6x8xf32>
  %dw = forge.gemm %d, %x, %c {alpha = 1.0 : f64, beta = 1.0 : f64, transA = true, transB = false} : (tensor<6x10xf32>, tensor<6x8xf32>, tensor<10x8xf32>) -> tensor<10x8xf32>
  return %loss, %dx, %dw : tensor<f32>, tensor<6x8xf32>, tensor<10x8xf32>
}
)mlir";

struct Compiled {
  std::vector<std::vector<float>> outputs;
  int pads = 0, classes = 0;
};

/// Compiles kModule for the CPU (forge-fuse, then the backend stages), with
/// forge-pad-contractions first when `pad`, and runs it on fixed inputs.
Compiled compileAndRun(bool pad) {
  Compiled r;
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(kModule, &ctx);
  EXPECT_TRUE(module);
  if (!module)
    return r;
  PassManager pm(&ctx);
  if (pad) {
    PadContractionsOptions options;
    options.minFlops = 0;
    pm.addNestedPass<func::FuncOp>(createPadContractions(options));
  }
  pm.addPass(createFuse());
  EXPECT_TRUE(succeeded(pm.run(*module)));
  module->walk([&](Operation *op) {
    r.pads += isa<PadOp>(op);
    r.classes += op->hasAttr("classes");
  });
  PassManager backend(&ctx);
  buildBackendPipeline(backend, PipelineOptions{});
  EXPECT_TRUE(succeeded(backend.run(*module)));
  rt::BundleWriter writer;
  EXPECT_TRUE(succeeded(emitBundle(*module, {}, writer)));
  auto bundle = rt::Bundle::fromBytes(writer.serialize(), "pad-contractions");
  EXPECT_TRUE(bundle.isOk()) << bundle.status().message();
  if (!bundle.isOk())
    return r;
  auto ex = rt::CpuExecutor::create(**bundle, {1});
  EXPECT_TRUE(ex.isOk()) << ex.status().message();
  if (!ex.isOk())
    return r;
  std::vector<float> x(48), w(80), c(80), one{1.0f};
  std::vector<int64_t> t{0, 9, 3, 7, 5, 1};
  for (int i = 0; i < 48; ++i)
    x[i] = std::sin(0.7f * i);
  for (int i = 0; i < 80; ++i) {
    w[i] = std::cos(0.3f * i) * 0.5f;
    c[i] = 0.01f * (i % 9) - 0.04f;
  }
  rt::TensorView views[] = {{x.data(), ::forge::bundle::F32, {6, 8}},
                            {w.data(), ::forge::bundle::F32, {10, 8}},
                            {t.data(), ::forge::bundle::I64, {6}},
                            {one.data(), ::forge::bundle::F32, {}},
                            {c.data(), ::forge::bundle::F32, {10, 8}}};
  for (int i = 0; i < 5; ++i) {
    const std::string &name = (*ex)->tensorInfo((*ex)->inputs(0)[i]).name();
    EXPECT_TRUE((*ex)->setInput(0, name, views[i]).isOk()) << name;
  }
  auto status = (*ex)->run(0);
  EXPECT_TRUE(status.isOk()) << status.message();
  for (int32_t o : (*ex)->outputs(0)) {
    rt::TensorView v = (*ex)->view(o);
    int64_t n = 1;
    for (int64_t d : v.shape)
      n *= d;
    r.outputs.emplace_back(v.as<const float>(), v.as<const float>() + n);
  }
  return r;
}

TEST(PadContractions, PaddedLmHeadKeepsLossAndGradients) {
  Compiled plain = compileAndRun(false), padded = compileAndRun(true);
  EXPECT_EQ(plain.pads, 0);
  EXPECT_GE(padded.pads, 2) << "forge-pad-contractions padded nothing";
  EXPECT_EQ(padded.classes, 2) << "the loss and its gradient should read the padded logits";
  ASSERT_EQ(plain.outputs.size(), 3u);
  ASSERT_EQ(padded.outputs.size(), 3u);
  for (size_t o = 0; o < 3; ++o) {
    ASSERT_EQ(plain.outputs[o].size(), padded.outputs[o].size()) << "output " << o;
    for (size_t i = 0; i < plain.outputs[o].size(); ++i)
      EXPECT_NEAR(padded.outputs[o][i], plain.outputs[o][i],
                  1e-6 * std::max(1.0f, std::fabs(plain.outputs[o][i])))
          << "output " << o << " element " << i;
  }
}

} // namespace
