//===- DialectTableTest.cpp - every forge op carries the op-table facts ----===//
//
// ../shared/DESIGN.md §4: the dialect is the single op table. This test enumerates all
// registered forge ops and fails if any lacks its ONNX origin, opset range,
// fusion/precision class, gradient declaration, type inference, or a CPU
// kernel, or names an ONNX op type the importer does not handle.
//
//===----------------------------------------------------------------------===//
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Import/OnnxImporter.h"
#include "forge/runtime/Kernels.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringExtras.h"

#include <gtest/gtest.h>

#include <set>

using namespace mlir;
using namespace mlir::forge;

namespace {

/// The structural ops (fusion regions, the memory plan's copies, the
/// partitioning's collectives and splits, the accumulation loop's cut) are not
/// ONNX ops and carry none of the facts below; everything else in the dialect must.
const std::set<std::string> &structuralOps() {
  static const std::set<std::string> ops = {
      "forge.accumulated",
      "forge.all_gather",     "forge.all_reduce", "forge.copy",       "forge.enter_group",
      "forge.fusion",         "forge.rank_slice", "forge.recv",       "forge.reduce_scatter",
      "forge.send",           "forge.shard",      "forge.yield"};
  return ops;
}
bool isStructural(RegisteredOperationName name) {
  return structuralOps().count(name.getStringRef().str()) > 0;
}

std::vector<RegisteredOperationName> forgeOps(MLIRContext &ctx) {
  std::vector<RegisteredOperationName> ops;
  for (RegisteredOperationName name : ctx.getRegisteredOperations())
    if (name.getDialectNamespace() == "forge" && !isStructural(name))
      ops.push_back(name);
  return ops;
}

TEST(DialectTable, StructuralOpsAreExactlyRegionsCopiesCollectivesAndCuts) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  std::set<std::string> structural;
  for (RegisteredOperationName name : ctx.getRegisteredOperations())
    if (name.getDialectNamespace() == "forge" && !name.hasInterface<ForgeOpInterface>())
      structural.insert(name.getStringRef().str());
  EXPECT_EQ(structural, structuralOps());
}

TEST(DialectTable, EveryOpHasAllFacts) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  auto ops = forgeOps(ctx);
  ASSERT_GE(ops.size(), 60u) << "the op table shrank unexpectedly";

  std::vector<std::string> importerOps = supportedOnnxOps();
  std::set<std::string> imported(importerOps.begin(), importerOps.end());
  for (RegisteredOperationName name : ops) {
    SCOPED_TRACE(name.getStringRef().str());
    auto *facts = name.getInterface<ForgeOpInterface>();
    ASSERT_NE(facts, nullptr) << "missing ForgeOpInterface";
    auto *grad = name.getInterface<DifferentiableOpInterface>();
    ASSERT_NE(grad, nullptr) << "missing DifferentiableOpInterface";
    EXPECT_TRUE(name.hasInterface<InferTypeOpInterface>()) << "missing type inference";

    StringRef onnxTypes = facts->getOnnxOpTypes();
    // Ops only forge's own passes make (no ONNX op imports as them) say so here.
    const bool passMade = name.stripDialect() == "resized_crop"; // forge-augment-inputs
    EXPECT_EQ(onnxTypes.empty(), passMade) << "an ONNX op type, unless only a pass makes it";
    int lo = facts->getOnnxOpsetMin(), hi = facts->getOnnxOpsetMax();
    EXPECT_LE(lo, hi);
    EXPECT_GE(lo, 1);
    EXPECT_LE(hi, 23);
    for (StringRef type : llvm::split(onnxTypes, ','))
      if (!onnxTypes.empty())
        EXPECT_TRUE(imported.count(type.str())) << "ONNX op " << type.str() << " is not imported";

    // Classes are real enum values with names.
    EXPECT_FALSE(stringifyFusionClass(facts->getFusionClass()).empty());
    EXPECT_FALSE(stringifyPrecisionClass(facts->getPrecisionClass()).empty());
    (void)grad->isDifferentiable(); // declared either way: the facts exist

    // The CPU device can run every op (the numerical reference for the GPU).
    std::string mnemonic = name.stripDialect().str();
    EXPECT_NE(::forge::rt::findCpuKernel(mnemonic), nullptr) << "no CPU kernel for " << mnemonic;
  }
}

// The library class means a cuBLASLt/cuDNN/CUTLASS (OpenBLAS on the CPU) call: only
// GEMMs, convolutions, fused attention and the LM head's GEMM with its loss.
// Pools are generated window reductions.
TEST(DialectTable, LibraryClassIsGemmsConvolutionsAndAttention) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  std::set<std::string> library;
  for (RegisteredOperationName name : forgeOps(ctx))
    if (auto *facts = name.getInterface<ForgeOpInterface>();
        facts && facts->getFusionClass() == FusionClass::Library)
      library.insert(name.stripDialect().str());
  EXPECT_EQ(library, (std::set<std::string>{"matmul", "gemm", "scaled_gemm", "conv",
                                            "conv_transpose", "conv_grad_weight", "attention",
                                            "attention_grad", "linear_cross_entropy_with_grad"}));
}

TEST(DialectTable, IntegerAndMaskOpsAreNotDifferentiable) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  for (StringRef op : {"forge.argmax", "forge.equal", "forge.less", "forge.not", "forge.isnan",
                       "forge.one_hot", "forge.constant", "forge.and", "forge.isinf", "forge.xor",
                       "forge.bitwise_and", "forge.bitwise_not", "forge.bit_shift"}) {
    auto name = RegisteredOperationName::lookup(op, &ctx);
    ASSERT_TRUE(name.has_value()) << op.str();
    EXPECT_FALSE(name->getInterface<DifferentiableOpInterface>()->isDifferentiable()) << op.str();
  }
  // Backward-only ops: Forge builds no second-order gradients.
  for (RegisteredOperationName name : forgeOps(ctx))
    if (name.getStringRef().ends_with("_grad"))
      EXPECT_FALSE(name.getInterface<DifferentiableOpInterface>()->isDifferentiable())
          << name.getStringRef().str();
  for (StringRef op : {"forge.matmul", "forge.conv", "forge.softmax", "forge.add", "forge.layer_norm",
                       "forge.mod", "forge.asin", "forge.selu", "forge.top_k"}) {
    auto name = RegisteredOperationName::lookup(op, &ctx);
    ASSERT_TRUE(name.has_value()) << op.str();
    EXPECT_TRUE(name->getInterface<DifferentiableOpInterface>()->isDifferentiable()) << op.str();
  }
}

TEST(DialectTable, CostModelCountsMatmulFlops) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  OpBuilder b(&ctx);
  Location loc = b.getUnknownLoc();
  auto module = ModuleOp::create(loc);
  b.setInsertionPointToStart(module.getBody());
  auto f32 = b.getF32Type();
  auto lhs = b.create<ConstantOp>(loc, DenseElementsAttr::get(RankedTensorType::get({8, 16}, f32), 1.0f));
  auto rhs = b.create<ConstantOp>(loc, DenseElementsAttr::get(RankedTensorType::get({16, 4}, f32), 1.0f));
  auto mm = b.create<MatMulOp>(loc, lhs, rhs);
  OpCost cost = cast<ForgeOpInterface>(mm.getOperation()).getCost();
  EXPECT_EQ(cost.flops, 2 * 8 * 16 * 4);
  EXPECT_EQ(cost.bytes, 4 * (8 * 16 + 16 * 4 + 8 * 4));
  auto relu = b.create<ReluOp>(loc, mm.getResult());
  EXPECT_EQ(cast<ForgeOpInterface>(relu.getOperation()).getCost().flops, 8 * 4);
  // A sum over the 8 rows whose outputs [1, 3) are zero_outputs reads half of its input.
  auto sum = b.create<ReduceSumOp>(loc, mm.getResult(), b.getDenseI64ArrayAttr({0}),
                                   b.getBoolAttr(false), b.getDenseI64ArrayAttr({1, 3}));
  EXPECT_EQ(cast<ForgeOpInterface>(sum.getOperation()).getCost().bytes, 4 * (8 * 4 / 2 + 4));
  module.erase();
}

} // namespace
