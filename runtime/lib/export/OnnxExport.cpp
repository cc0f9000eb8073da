// exportOnnx (OnnxExport.h): trained PARAMETER/STATE values into the source
// ONNX model's initializers.
//
// Invariants: the source file is only read; the output is written through a
// temporary file, fsync and rename (FileUtil.h), so a failed export never leaves a
// half-written model; nothing is written unless every matched initializer
// has the tensor's element type and dims.
#include "forge/runtime/OnnxExport.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/ranges.h>
#include "forge_onnx.pb.h" // onnx.proto, package forge_onnx (runtime/CMakeLists.txt)

#include "forge/runtime/FileUtil.h"

namespace forge::rt {

namespace {

/// ONNX TensorProto.DataType of a bundle dtype (0 when none).
int onnxTypeOf(DType t) {
  using TP = forge_onnx::TensorProto;
  switch (t) {
  case bundle::F32:
    return TP::FLOAT;
  case bundle::F16:
    return TP::FLOAT16;
  case bundle::BF16:
    return TP::BFLOAT16;
  case bundle::F64:
    return TP::DOUBLE;
  case bundle::I64:
    return TP::INT64;
  case bundle::I32:
    return TP::INT32;
  case bundle::I16:
    return TP::INT16;
  case bundle::I8:
    return TP::INT8;
  case bundle::U8:
    return TP::UINT8;
  case bundle::U16:
    return TP::UINT16;
  case bundle::U32:
    return TP::UINT32;
  case bundle::U64:
    return TP::UINT64;
  case bundle::BOOL:
    return TP::BOOL;
  default:
    return 0;
  }
}

} // namespace

Expected<OnnxExportReport> exportOnnx(const std::string &sourcePath, const std::string &outPath,
                                      const Executor &ex, const WholeTensors *whole) {
  WholeTensors local; // tensors stored permuted, canonical (gatherShards adds them too)
  if (!whole) {
    local = permutedWhole(ex);
    whole = &local;
  }
  forge_onnx::ModelProto model;
  {
    std::ifstream in(sourcePath, std::ios::binary);
    if (!in)
      return Status::error("{}: cannot open the source ONNX model: {}", sourcePath,
                           std::strerror(errno));
    if (!model.ParseFromIstream(&in))
      return Status::error("{}: not a valid ONNX model", sourcePath);
  }
  std::map<std::string, int32_t> byName;
  for (int32_t t : ex.persistentTensors())
    byName.emplace(ex.tensorInfo(t).name(), t);

  OnnxExportReport report;
  std::map<std::string, bool> used;
  forge_onnx::GraphProto *graph = model.mutable_graph();
  // Check everything first, then modify.
  std::vector<std::pair<forge_onnx::TensorProto *, int32_t>> updates;
  for (forge_onnx::TensorProto &init : *graph->mutable_initializer()) {
    auto it = byName.find(init.name());
    if (it == byName.end())
      continue;
    const bundle::TensorInfo &info = ex.tensorInfo(it->second);
    std::vector<int64_t> dims(init.dims().begin(), init.dims().end());
    std::vector<int64_t> shape = wholeShape(info);
    int type = onnxTypeOf(info.dtype());
    if (type == 0 || init.data_type() != type)
      return Status::error("{}: initializer '{}' has ONNX element type {}, the bundle's tensor is "
                           "{}; cannot export it",
                           sourcePath, init.name(),
                           forge_onnx::TensorProto::DataType_Name(
                               static_cast<forge_onnx::TensorProto::DataType>(init.data_type())),
                           dtypeName(info.dtype()));
    if (dims != shape)
      return Status::error("{}: initializer '{}' has dims {}, the bundle's tensor {}", sourcePath,
                           init.name(), shapeString(dims), shapeString(shape));
    updates.emplace_back(&init, it->second);
    used[init.name()] = true;
  }
  // Parameters that forgec untied (an exporter had merged them into one
  // initializer, leaving Identity(initializer) nodes named after them): each
  // such Identity becomes an initializer of its own with the trained value.
  std::map<std::string, const forge_onnx::TensorProto *> initByName;
  for (const forge_onnx::TensorProto &init : graph->initializer())
    initByName.emplace(init.name(), &init);
  // Identity(Identity(initializer)) chains: each output's root initializer.
  std::map<std::string, const forge_onnx::TensorProto *> rootOf(initByName);
  for (bool grew = true; grew;) {
    grew = false;
    for (const forge_onnx::NodeProto &node : graph->node())
      if (node.op_type() == "Identity" && node.input_size() == 1 && node.output_size() == 1 &&
          rootOf.count(node.input(0)) && !rootOf.count(node.output(0))) {
        rootOf[node.output(0)] = rootOf[node.input(0)];
        grew = true;
      }
  }
  std::vector<std::pair<int, int32_t>> untied; // (Identity node index, tensor)
  for (int i = 0; i < graph->node_size(); ++i) {
    const forge_onnx::NodeProto &node = graph->node(i);
    if (node.op_type() != "Identity" || node.input_size() != 1 || node.output_size() != 1)
      continue;
    auto it = byName.find(node.output(0));
    auto source = rootOf.find(node.input(0));
    if (it == byName.end() || used.count(node.output(0)) || source == rootOf.end())
      continue;
    const bundle::TensorInfo &info = ex.tensorInfo(it->second);
    std::vector<int64_t> dims(source->second->dims().begin(), source->second->dims().end());
    std::vector<int64_t> shape = wholeShape(info);
    if (source->second->data_type() != onnxTypeOf(info.dtype()) || dims != shape)
      return Status::error("{}: '{}' (Identity of initializer '{}') does not match the bundle's "
                           "tensor ({}{}); cannot export it",
                           sourcePath, node.output(0), node.input(0), dtypeName(info.dtype()),
                           shapeString(shape));
    untied.emplace_back(i, it->second);
    used[node.output(0)] = true;
  }
  if (used.empty())
    return Status::error("{}: no initializer (or Identity of one) is named like a parameter of "
                         "this bundle; is it the model the bundle was compiled from?",
                         sourcePath);
  if (outPath.empty()) { // a check only
    for (const auto &[tensor, t] : updates)
      report.replaced.push_back(tensor->name());
    for (const auto &[index, t] : untied)
      report.replaced.push_back(ex.tensorInfo(t).name());
    return report;
  }
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    if (info.has_shard() && info.shard().size() > 1 && (!whole || !whole->count(t)))
      return Status::error("'{}' is split over ranks and was not gathered", info.name());
  }
  for (const auto &[tensor, t] : updates) {
    TensorView v = wholeView(ex, t, whole);
    tensor->clear_float_data();
    tensor->clear_int32_data();
    tensor->clear_int64_data();
    tensor->clear_double_data();
    tensor->clear_uint64_data();
    tensor->clear_string_data();
    tensor->clear_external_data();
    tensor->clear_data_location();
    tensor->set_raw_data(v.data, v.bytes());
    report.replaced.push_back(tensor->name());
  }
  for (auto it = untied.rbegin(); it != untied.rend(); ++it) { // back to front: indices hold
    const auto [index, t] = *it;
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const forge_onnx::TensorProto *source = rootOf.at(graph->node(index).input(0));
    forge_onnx::TensorProto *init = graph->add_initializer();
    init->set_name(info.name());
    init->set_data_type(source->data_type());
    *init->mutable_dims() = source->dims();
    TensorView v = wholeView(ex, t, whole);
    init->set_raw_data(v.data, v.bytes());
    graph->mutable_node()->DeleteSubrange(index, 1);
    report.replaced.push_back(info.name());
  }
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    if (info.kind() == bundle::TensorInfo::PARAMETER && !used.count(info.name()))
      report.missingParameters.push_back(info.name());
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    return Status::error("{}: cannot serialize the model (over 2 GiB?)", outPath);
  FORGE_RETURN_IF_ERROR(writeFileAtomically(outPath, bytes));
  return report;
}

} // namespace forge::rt
