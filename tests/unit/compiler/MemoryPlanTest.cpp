// The memory plan (forge-plan-memory) as the bundle carries it: a reshape's
// result shares its operand's bytes (the copy becomes a no-op), except from a
// routine input to a routine output; results still match a reference computed
// here.
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

#include <cstring>

using namespace mlir;
using namespace mlir::forge;
namespace rt = ::forge::rt;

namespace {

// %r = reshape(relu(x)) feeds another relu; %c = reshape(x) is returned as is.
constexpr const char *kModule = R"mlir(
func.func @main(%x: tensor<4x8xf32>) -> (tensor<32xf32>, tensor<32xf32>) {
  %a = forge.relu %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = forge.reshape %a {shape = array<i64: 32>} : (tensor<4x8xf32>) -> tensor<32xf32>
  %s = forge.reshape %r {shape = array<i64: 32>} : (tensor<32xf32>) -> tensor<32xf32>
  %b = forge.neg %s : (tensor<32xf32>) -> tensor<32xf32>
  %c = forge.reshape %x {shape = array<i64: 32>} : (tensor<4x8xf32>) -> tensor<32xf32>
  return %b, %c : tensor<32xf32>, tensor<32xf32>
}
)mlir";

TEST(MemoryPlan, ReshapeSharesItsOperandsBytes) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(kModule, &ctx);
  ASSERT_TRUE(module);
  PassManager pm(&ctx);
  buildBackendPipeline(pm, PipelineOptions{});
  ASSERT_TRUE(succeeded(pm.run(*module)));
  rt::BundleWriter writer;
  ASSERT_TRUE(succeeded(emitBundle(*module, {}, writer)));
  auto bundle = rt::Bundle::fromBytes(writer.serialize(), "memory-plan");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  const auto &p = (*bundle)->program();
  const auto &routine = p.routines(0);
  int reshapes = 0;
  for (const auto &inst : routine.instructions()) {
    if (inst.op() != "reshape")
      continue;
    ++reshapes;
    const auto &in = p.tensors(inst.inputs(0));
    const auto &out = p.tensors(inst.outputs(0));
    bool inputToOutput = in.kind() == ::forge::bundle::TensorInfo::INPUT &&
                         out.kind() == ::forge::bundle::TensorInfo::OUTPUT;
    if (inputToOutput)
      EXPECT_NE(in.arena_offset(), out.arena_offset()) << "input reshaped into an output";
    else
      EXPECT_EQ(in.arena_offset(), out.arena_offset()) << "reshape of " << in.name();
  }
  EXPECT_EQ(reshapes, 3);

  auto ex = rt::CpuExecutor::create(**bundle, {1});
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i)
    x[i] = static_cast<float>(i % 7) - 3.0f;
  rt::TensorView in{x.data(), ::forge::bundle::F32, {4, 8}};
  ASSERT_TRUE((*ex)->setInput(0, (*ex)->tensorInfo((*ex)->inputs(0)[0]).name(), in).isOk());
  ASSERT_TRUE((*ex)->run(0).isOk());
  rt::TensorView b = (*ex)->view((*ex)->outputs(0)[0]), c = (*ex)->view((*ex)->outputs(0)[1]);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(b.as<const float>()[i], -std::max(x[i], 0.0f)) << i;
    EXPECT_EQ(c.as<const float>()[i], x[i]) << i;
  }
}

} // namespace
