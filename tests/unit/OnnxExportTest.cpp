// exportOnnx: trained values replace the source model's initializers by name
// (tiny ONNX model built with the onnx protobuf; a hand-built training bundle).
#include "forge/runtime/CpuExecutor.h"
#include "forge/runtime/OnnxExport.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "TrainTestUtil.h"
#include "forge/runtime/Trainer.h"

using namespace forge::rt;
using namespace forge::rt::testing;

namespace {

onnx::ModelProto tinyModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto *g = m.mutable_graph();
  g->set_name("linear");
  onnx::TensorProto *w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  w->add_dims(1);
  for (float v : {0.5f, -0.25f, 0.125f})
    w->add_float_data(v);
  onnx::TensorProto *other = g->add_initializer();
  other->set_name("other");
  other->set_data_type(onnx::TensorProto::FLOAT);
  other->add_dims(2);
  float raw[2] = {7, 8};
  other->set_raw_data(raw, sizeof(raw));
  onnx::NodeProto *n = g->add_node();
  n->set_op_type("MatMul");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  return m;
}

std::string write(const onnx::ModelProto &m, const std::string &name) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream f(path, std::ios::binary);
  m.SerializeToOstream(&f);
  return path;
}

onnx::ModelProto read(const std::string &path) {
  onnx::ModelProto m;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&f));
  return m;
}

std::vector<std::pair<std::string, HostTensor>> data(int64_t n) {
  HostTensor x, y;
  x.dtype = y.dtype = forge::bundle::F32;
  x.shape = {n, 3};
  y.shape = {n, 1};
  x.bytes.resize(static_cast<size_t>(n * 12));
  y.bytes.resize(static_cast<size_t>(n * 4));
  for (int64_t i = 0; i < n * 3; ++i) {
    float v = static_cast<float>(i % 5) * 0.2f - 0.4f;
    std::memcpy(x.bytes.data() + i * 4, &v, 4);
  }
  return {{"x", std::move(x)}, {"y", std::move(y)}};
}

} // namespace

TEST(OnnxExportTest, ReplacesInitializersByName) {
  auto bundle = Bundle::fromBytes(makeLinearBundle().serialize(), "linear.forge");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  auto tr = Trainer::create(**bundle, makeArraySource(data(8)), nullptr, {1, 0, true});
  ASSERT_TRUE(tr.isOk()) << tr.status().message();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE((*tr)->step().isOk());

  std::string src = write(tinyModel(), "export_src.onnx");
  std::string out = ::testing::TempDir() + "export_out.onnx";
  auto report = exportOnnx(src, out, (*tr)->executor());
  ASSERT_TRUE(report.isOk()) << report.status().message();
  EXPECT_EQ(report->replaced, std::vector<std::string>{"w"});
  EXPECT_TRUE(report->missingParameters.empty());

  onnx::ModelProto m = read(out);
  ASSERT_EQ(m.graph().initializer_size(), 2);
  const onnx::TensorProto &w = m.graph().initializer(0);
  EXPECT_EQ(w.name(), "w");
  EXPECT_EQ(w.data_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(w.float_data_size(), 0);
  ASSERT_EQ(w.raw_data().size(), 12u);
  float trained[3];
  std::memcpy(trained, w.raw_data().data(), 12);
  TensorView v = (*tr)->executor().view(0);
  EXPECT_EQ(std::memcmp(trained, v.data, 12), 0);
  EXPECT_NE(trained[0], 0.5f); // it changed
  EXPECT_EQ(m.graph().initializer(1).raw_data(), tinyModel().graph().initializer(1).raw_data());
  EXPECT_EQ(m.graph().node_size(), 1);
  // The source is untouched.
  EXPECT_EQ(read(src).graph().initializer(0).float_data_size(), 3);
}

TEST(OnnxExportTest, MismatchesAreErrors) {
  auto bundle = Bundle::fromBytes(makeLinearBundle().serialize(), "linear.forge");
  ASSERT_TRUE(bundle.isOk());
  auto ex = CpuExecutor::create(**bundle, {1});
  ASSERT_TRUE(ex.isOk());
  std::string out = ::testing::TempDir() + "export_bad.onnx";
  std::filesystem::remove(out);

  onnx::ModelProto dims = tinyModel();
  dims.mutable_graph()->mutable_initializer(0)->set_dims(0, 1);
  dims.mutable_graph()->mutable_initializer(0)->set_dims(1, 3);
  auto r = exportOnnx(write(dims, "export_dims.onnx"), out, **ex);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("initializer 'w' has dims [1, 3], the bundle's tensor [3, 1]"),
            std::string::npos)
      << r.status().message();

  onnx::ModelProto type = tinyModel();
  type.mutable_graph()->mutable_initializer(0)->set_data_type(onnx::TensorProto::DOUBLE);
  r = exportOnnx(write(type, "export_type.onnx"), out, **ex);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("ONNX element type DOUBLE"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(out));

  // A model none of whose initializers names a parameter is not the source
  // model (issue #18: forge-train checks this before training, outPath "").
  onnx::ModelProto none = tinyModel();
  none.mutable_graph()->mutable_initializer(0)->set_name("renamed");
  r = exportOnnx(write(none, "export_none.onnx"), "", **ex);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("no initializer (or Identity of one) is named like a "
                                      "parameter of this bundle"),
            std::string::npos)
      << r.status().message();
  r = exportOnnx(write(tinyModel(), "export_check.onnx"), "", **ex);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r->replaced, std::vector<std::string>{"w"});
  EXPECT_FALSE(std::filesystem::exists(out)); // a check writes nothing

  r = exportOnnx(::testing::TempDir() + "no_such.onnx", out, **ex);
  EXPECT_FALSE(r.isOk());
}
