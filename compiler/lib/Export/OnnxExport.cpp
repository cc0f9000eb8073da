//===- OnnxExport.cpp - forge IR -> ONNX graph for viewing in Netron -------===//
#include "forge/Export/OnnxExport.h"

#include "forge/Conversion/Conversion.h"
#include "forge/Dialect/ForgeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

#include <onnx/onnx_pb.h>

#include <fstream>

using namespace mlir;
using namespace mlir::forge;

namespace {

int32_t onnxType(Type t) {
  if (t.isF32()) return onnx::TensorProto::FLOAT;
  if (t.isF64()) return onnx::TensorProto::DOUBLE;
  if (t.isF16()) return onnx::TensorProto::FLOAT16;
  if (t.isBF16()) return onnx::TensorProto::BFLOAT16;
  if (t.isInteger(1)) return onnx::TensorProto::BOOL;
  if (auto i = dyn_cast<IntegerType>(t)) {
    bool u = i.isUnsigned();
    switch (i.getWidth()) {
    case 8: return u ? onnx::TensorProto::UINT8 : onnx::TensorProto::INT8;
    case 16: return u ? onnx::TensorProto::UINT16 : onnx::TensorProto::INT16;
    case 32: return u ? onnx::TensorProto::UINT32 : onnx::TensorProto::INT32;
    case 64: return u ? onnx::TensorProto::UINT64 : onnx::TensorProto::INT64;
    }
  }
  return onnx::TensorProto::UNDEFINED;
}

void setType(onnx::ValueInfoProto &info, Type type) {
  auto tensor = cast<RankedTensorType>(type);
  auto *tt = info.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnxType(tensor.getElementType()));
  auto *shape = tt->mutable_shape();
  for (int64_t d : tensor.getShape())
    shape->add_dim()->set_dim_value(d);
}

} // namespace

LogicalResult mlir::forge::exportGraphToOnnx(ModuleOp module, const std::string &path,
                                             int64_t maxInlineElements) {
  // The routine a reader wants to see: the forward graph, else the training step.
  auto func = module.lookupSymbol<func::FuncOp>("main");
  if (!func)
    func = module.lookupSymbol<func::FuncOp>("train_step");
  if (!func) {
    auto funcs = module.getOps<func::FuncOp>();
    if (funcs.empty())
      return module.emitError("no function to export");
    func = *funcs.begin();
  }
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("forgec");
  auto *forgeOpset = model.add_opset_import();
  forgeOpset->set_domain("ai.forge");
  forgeOpset->set_version(1);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto *graph = model.mutable_graph();
  graph->set_name(func.getSymName().str());

  llvm::DenseMap<Value, std::string> names;
  int counter = 0;
  auto nameOf = [&](Value v) -> std::string {
    auto it = names.find(v);
    if (it != names.end())
      return it->second;
    std::string n = "v" + std::to_string(counter++);
    names[v] = n;
    return n;
  };
  for (auto [i, arg] : llvm::enumerate(func.getArguments())) {
    auto name = func.getArgAttrOfType<StringAttr>(i, "forge.name");
    names[arg] = name ? name.str() : "input" + std::to_string(i);
    auto *in = graph->add_input();
    in->set_name(names[arg]);
    setType(*in, arg.getType());
  }
  for (Operation &op : func.getBody().front()) {
    if (auto c = dyn_cast<ConstantOp>(op)) {
      auto init = op.getAttrOfType<StringAttr>("forge.initializer");
      std::string name = init ? init.str() : "const" + std::to_string(counter++);
      names[c.getResult()] = name;
      auto type = cast<RankedTensorType>(c.getType());
      auto *t = graph->add_initializer();
      t->set_name(name);
      t->set_data_type(onnxType(type.getElementType()));
      for (int64_t d : type.getShape())
        t->add_dims(d);
      if (type.getNumElements() <= maxInlineElements) {
        std::vector<uint8_t> bytes = elementsToBytes(c.getValue());
        t->set_raw_data(bytes.data(), bytes.size());
      } else {
        // Netron shows the shape; the payload would only bloat the dump.
        t->set_data_location(onnx::TensorProto::EXTERNAL);
        auto *kv = t->add_external_data();
        kv->set_key("location");
        kv->set_value("elided-by-forge-dump");
      }
      continue;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
        auto *out = graph->add_output();
        out->set_name(nameOf(v));
        setType(*out, v.getType());
      }
      continue;
    }
    onnx::NodeProto *node = graph->add_node();
    node->set_op_type(op.getName().stripDialect().str());
    node->set_domain("ai.forge");
    if (auto loc = dyn_cast<NameLoc>(op.getLoc()))
      node->set_name(loc.getName().str());
    for (Value v : op.getOperands())
      node->add_input(nameOf(v));
    for (Value r : op.getResults()) {
      node->add_output(nameOf(r));
      auto *vi = graph->add_value_info();
      vi->set_name(nameOf(r));
      setType(*vi, r.getType());
    }
    ::forge::bundle::Instruction inst;
    if (succeeded(encodeInstruction(&op, inst))) {
      for (const auto &[key, value] : inst.attrs()) {
        auto *a = node->add_attribute();
        a->set_name(key);
        switch (value.value_case()) {
        case ::forge::bundle::Attribute::kI: a->set_type(onnx::AttributeProto::INT); a->set_i(value.i()); break;
        case ::forge::bundle::Attribute::kF: a->set_type(onnx::AttributeProto::FLOAT); a->set_f(value.f()); break;
        case ::forge::bundle::Attribute::kS: a->set_type(onnx::AttributeProto::STRING); a->set_s(value.s()); break;
        case ::forge::bundle::Attribute::kDtype: a->set_type(onnx::AttributeProto::INT); a->set_i(value.dtype()); break;
        case ::forge::bundle::Attribute::kInts:
          a->set_type(onnx::AttributeProto::INTS);
          for (int64_t v : value.ints().values())
            a->add_ints(v);
          break;
        default: break;
        }
      }
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !model.SerializeToOstream(&out))
    return module.emitError() << "cannot write '" << path << "'";
  return success();
}
