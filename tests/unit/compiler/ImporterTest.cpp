//===- ImporterTest.cpp - ONNX import: normalization and error paths -------===//
//
// Builds small ONNX models in memory and checks that import produces the
// expected forge IR, folds shape subgraphs, reads external data, and rejects
// malformed or unsupported models with one clear error (never a crash).
//
//===----------------------------------------------------------------------===//
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Import/OnnxImporter.h"
#include "forge/Pipeline/Pipeline.h"
#include "forge/Train/TrainGraph.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace mlir;

namespace {

struct ModelBuilder {
  onnx::ModelProto model;
  onnx::GraphProto *graph;
  explicit ModelBuilder(int opset = 17) {
    model.set_ir_version(8);
    model.add_opset_import()->set_version(opset);
    graph = model.mutable_graph();
    graph->set_name("g");
  }
  void input(const std::string &name, std::vector<int64_t> dims, int type = onnx::TensorProto::FLOAT,
             std::vector<std::string> params = {}) {
    auto *in = graph->add_input();
    in->set_name(name);
    auto *tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    auto *shape = tt->mutable_shape();
    for (size_t i = 0; i < dims.size(); ++i) {
      auto *d = shape->add_dim();
      if (i < params.size() && !params[i].empty())
        d->set_dim_param(params[i]);
      else
        d->set_dim_value(dims[i]);
    }
  }
  void output(const std::string &name) { graph->add_output()->set_name(name); }
  onnx::NodeProto *node(const std::string &type, std::vector<std::string> ins,
                        std::vector<std::string> outs, const std::string &name = "") {
    auto *n = graph->add_node();
    n->set_op_type(type);
    n->set_name(name.empty() ? type + std::to_string(graph->node_size()) : name);
    for (auto &i : ins)
      n->add_input(i);
    for (auto &o : outs)
      n->add_output(o);
    return n;
  }
  void initInts(const std::string &name, std::vector<int64_t> values) {
    auto *t = graph->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(values.size());
    for (int64_t v : values)
      t->add_int64_data(v);
  }
  void initFloats(const std::string &name, std::vector<int64_t> dims, std::vector<float> values) {
    auto *t = graph->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims)
      t->add_dims(d);
    for (float v : values)
      t->add_float_data(v);
  }
  std::string bytes() const { return model.SerializeAsString(); }
};

struct ImportResult {
  OwningOpRef<ModuleOp> module;
  std::string diagnostics;
};

ImportResult import(MLIRContext &ctx, const std::string &bytes, forge::ImportOptions options = {}) {
  ImportResult r;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
    r.diagnostics += d.str() + "\n";
    return success();
  });
  r.module = forge::importOnnxBytes(&ctx, bytes, "test.onnx", options);
  return r;
}

int count(ModuleOp m, StringRef opName) {
  int n = 0;
  m.walk([&](Operation *op) { n += op->getName().getStringRef() == opName; });
  return n;
}

TEST(Importer, MatMulAddRelu) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2, 3});
  m.input("w", {3, 4});
  m.node("MatMul", {"x", "w"}, {"y"});
  m.node("Relu", {"y"}, {"z"});
  m.output("z");
  auto r = import(ctx, m.bytes());
  ASSERT_TRUE(r.module) << r.diagnostics;
  EXPECT_EQ(count(*r.module, "forge.matmul"), 1);
  EXPECT_EQ(count(*r.module, "forge.relu"), 1);
}

TEST(Importer, UnsupportedOpsAreAllListedInOneError) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2, 3});
  m.node("Shrink", {"x"}, {"a"}, "first_shrink");
  m.node("Relu", {"a"}, {"b"});
  m.node("LpNormalization", {"b"}, {"c"}, "the_lp");
  auto *custom = m.node("FancyOp", {"c"}, {"d"}, "custom_node");
  custom->set_domain("com.example");
  m.output("d");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("3 unsupported ops"), std::string::npos) << r.diagnostics;
  EXPECT_NE(r.diagnostics.find("Shrink (domain 'ai.onnx', opset 17, node 'first_shrink')"),
            std::string::npos)
      << r.diagnostics;
  EXPECT_NE(r.diagnostics.find("LpNormalization"), std::string::npos);
  EXPECT_NE(r.diagnostics.find("FancyOp (domain 'com.example'"), std::string::npos);
}

TEST(Importer, TruncatedFileIsAClearError) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2, 3});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  std::string bytes = m.bytes();
  for (size_t len = 1; len < bytes.size(); len += 3) {
    auto r = import(ctx, bytes.substr(0, len));
    // Either a parse error or a structural error, never a crash.
    if (!r.module)
      EXPECT_FALSE(r.diagnostics.empty()) << "silent failure at length " << len;
  }
  auto r = import(ctx, "this is not a protobuf at all \xff\xff\xff");
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("not a valid ONNX model"), std::string::npos) << r.diagnostics;
}

TEST(Importer, DanglingInputNamesNodeAndValue) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2});
  m.node("Add", {"x", "ghost"}, {"y"}, "adder");
  m.output("y");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("node 'adder' (Add) reads 'ghost'"), std::string::npos) << r.diagnostics;
}

TEST(Importer, CycleIsRejected) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2});
  m.node("Add", {"x", "b"}, {"a"}, "na");
  m.node("Relu", {"a"}, {"b"}, "nb");
  m.output("b");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("cycle"), std::string::npos) << r.diagnostics;
}

TEST(Importer, UnsortedGraphIsSorted) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2});
  m.node("Relu", {"a"}, {"b"});
  m.node("Neg", {"x"}, {"a"});
  m.output("b");
  auto r = import(ctx, m.bytes());
  ASSERT_TRUE(r.module) << r.diagnostics;
}

TEST(Importer, WrongTypesAreRejected) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2}, onnx::TensorProto::FLOAT);
  m.input("i", {2}, onnx::TensorProto::INT64);
  m.node("Add", {"x", "i"}, {"y"}, "mixed");
  m.output("y");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("operand element types differ"), std::string::npos) << r.diagnostics;
  EXPECT_NE(r.diagnostics.find("mixed"), std::string::npos) << r.diagnostics;
}

TEST(Importer, SymbolicBatchNeedsAnOption) {
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {0, 3}, onnx::TensorProto::FLOAT, {"batch"});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("--batch N"), std::string::npos) << r.diagnostics;

  forge::ImportOptions options;
  options.batch = 5;
  auto ok = import(ctx, m.bytes(), options);
  ASSERT_TRUE(ok.module) << ok.diagnostics;
  auto func = ok.module->lookupSymbol<func::FuncOp>("main");
  EXPECT_EQ(cast<RankedTensorType>(func.getArgumentTypes()[0]).getDimSize(0), 5);

  forge::ImportOptions byName;
  byName.dimValues["batch"] = 7;
  auto named = import(ctx, m.bytes(), byName);
  ASSERT_TRUE(named.module) << named.diagnostics;
}

TEST(Importer, ShapeSubgraphFoldsToStaticReshape) {
  // y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])) : the pattern exporters emit.
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {0, 3, 4}, onnx::TensorProto::FLOAT, {"N"});
  m.initInts("zero", {0});
  m.initInts("minus_one", {-1});
  m.node("Shape", {"x"}, {"s"});
  m.node("Gather", {"s", "zero"}, {"n"});
  m.node("Concat", {"n", "minus_one"}, {"shape"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(0);
    return a;
  }());
  m.node("Reshape", {"x", "shape"}, {"y"});
  m.output("y");
  forge::ImportOptions options;
  options.batch = 2;
  auto r = import(ctx, m.bytes(), options);
  ASSERT_TRUE(r.module) << r.diagnostics;
  EXPECT_EQ(count(*r.module, "forge.gather"), 0);
  EXPECT_EQ(count(*r.module, "forge.concat"), 0);
  EXPECT_EQ(count(*r.module, "forge.reshape"), 1);
  auto func = r.module->lookupSymbol<func::FuncOp>("main");
  auto result = cast<RankedTensorType>(func.getResultTypes()[0]);
  EXPECT_EQ(result.getShape(), ArrayRef<int64_t>({2, 12}));
}

TEST(Importer, FloatInitializersStayLiveForTraining) {
  // y = x @ Transpose(W) + Gather(E, [1, 0]) (a tied/transposed weight and an embedding
  // lookup with constant indices, as training-mode exports emit). Inference folds both ops
  // on initializers; for training (keepFloatInitializers) they must read W and E, or the
  // parameters would be dead and a constant copy would be trained instead. Integer-only
  // subgraphs still fold.
  ModelBuilder m;
  m.input("x", {2, 3});
  m.initFloats("W", {4, 3}, std::vector<float>(12, 0.5f));
  m.initFloats("E", {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  m.initInts("idx", {1, 0});
  m.initInts("zero", {0});
  m.node("Transpose", {"W"}, {"Wt"});
  m.node("MatMul", {"x", "Wt"}, {"h"});
  m.node("Gather", {"E", "idx"}, {"e"});
  m.node("Add", {"h", "e"}, {"s"});
  m.node("Shape", {"s"}, {"shape"});
  m.node("Gather", {"shape", "zero"}, {"n"});
  m.node("Reshape", {"s", "shape"}, {"y"});
  m.output("y");
  m.output("n");
  {
    MLIRContext ctx;
    auto r = import(ctx, m.bytes());
    ASSERT_TRUE(r.module) << r.diagnostics;
    EXPECT_EQ(count(*r.module, "forge.transpose"), 0);
    EXPECT_EQ(count(*r.module, "forge.gather"), 0);
  }
  MLIRContext ctx;
  forge::ImportOptions options;
  options.keepFloatInitializers = true;
  auto r = import(ctx, m.bytes(), options);
  ASSERT_TRUE(r.module) << r.diagnostics;
  EXPECT_EQ(count(*r.module, "forge.transpose"), 1);
  EXPECT_EQ(count(*r.module, "forge.gather"), 1); // Gather(Shape(s), 0) folded
  r.module->walk([&](Operation *op) {
    StringRef name = op->getName().getStringRef();
    if (name != "forge.transpose" && name != "forge.gather")
      return;
    auto c = op->getOperand(0).getDefiningOp<forge::ConstantOp>();
    ASSERT_TRUE(c && c->hasAttr("forge.initializer")) << name.str() << " does not read W/E";
  });
}

TEST(Importer, ExternalDataIsReadAndChecked) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "forge_importer_external";
  fs::create_directories(dir);
  std::vector<float> weights = {1, 2, 3, 4, 5, 6};
  {
    std::ofstream out(dir / "weights.bin", std::ios::binary);
    float pad = 0;
    out.write(reinterpret_cast<const char *>(&pad), sizeof(pad));
    out.write(reinterpret_cast<const char *>(weights.data()), weights.size() * sizeof(float));
  }
  auto build = [&](const std::string &location, int64_t offset) {
    ModelBuilder m;
    m.input("x", {1, 2});
    auto *t = m.graph->add_initializer();
    t->set_name("w");
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(2);
    t->add_dims(3);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto *kv = t->add_external_data();
    kv->set_key("location");
    kv->set_value(location);
    kv = t->add_external_data();
    kv->set_key("offset");
    kv->set_value(std::to_string(offset));
    m.node("MatMul", {"x", "w"}, {"y"});
    m.output("y");
    return m.bytes();
  };
  MLIRContext ctx;
  forge::ImportOptions options;
  options.externalDataDir = dir.string();
  auto r = import(ctx, build("weights.bin", 4), options);
  ASSERT_TRUE(r.module) << r.diagnostics;
  bool found = false;
  r.module->walk([&](forge::ConstantOp c) {
    auto values = cast<DenseElementsAttr>(c.getValue()).getValues<float>();
    EXPECT_EQ(std::vector<float>(values.begin(), values.end()), weights);
    found = true;
  });
  EXPECT_TRUE(found);

  auto past = import(ctx, build("weights.bin", 8), options);
  EXPECT_FALSE(past.module);
  EXPECT_NE(past.diagnostics.find("exceeds file"), std::string::npos) << past.diagnostics;
  auto escape = import(ctx, build("../etc/passwd", 0), options);
  EXPECT_FALSE(escape.module);
  EXPECT_NE(escape.diagnostics.find("relative path inside the model directory"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Importer, NewerIrVersionIsRejected) {
  MLIRContext ctx;
  ModelBuilder m;
  m.model.set_ir_version(42);
  m.input("x", {2});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  auto r = import(ctx, m.bytes());
  EXPECT_FALSE(r.module);
  EXPECT_NE(r.diagnostics.find("IR version 42"), std::string::npos) << r.diagnostics;
}

} // namespace

namespace {

TEST(Importer, BatchNormMomentumReachesTheTrainingGraph) {
  // An inference-mode BatchNormalization becomes batch_norm_training in
  // @train_step with the model's own momentum (not a fixed default).
  MLIRContext ctx;
  ModelBuilder m;
  m.input("x", {2, 3, 4, 4});
  auto addVec = [&](const std::string &name, float value) {
    auto *t = m.graph->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(3);
    for (int i = 0; i < 3; ++i)
      t->add_float_data(value);
  };
  addVec("scale", 1.0f);
  addVec("bias", 0.0f);
  addVec("mean", 0.0f);
  addVec("var", 1.0f);
  auto *bn = m.node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn");
  auto *momentum = bn->add_attribute();
  momentum->set_name("momentum");
  momentum->set_type(onnx::AttributeProto::FLOAT);
  momentum->set_f(0.7f);
  m.node("ReduceMean", {"y"}, {"out"}, "mean_all");
  m.output("out");
  auto r = import(ctx, m.bytes());
  ASSERT_TRUE(r.module) << r.diagnostics;
  forge::TrainOptions options;
  options.loss.kind = "output";
  options.loss.output = "out";
  options.optimizer.kind = "sgd";
  ASSERT_TRUE(succeeded(forge::buildTrainingModule(*r.module, options)));
  int found = 0;
  r.module->walk([&](forge::BatchNormTrainingOp op) {
    EXPECT_NEAR(op.getMomentum().convertToDouble(), 0.7, 1e-6);
    ++found;
  });
  EXPECT_EQ(found, 1);
}

} // namespace
