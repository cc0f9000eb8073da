//===- OnnxImporter.cpp - ONNX ModelProto -> forge dialect ----------------===//
//
// Walks the graph in topological order (sorting it when the file is not),
// resolves every input shape to static dims, converts initializers and
// Constant nodes to forge.constant, and hands each node to its op rule
// (OnnxOps.cpp). Before converting anything, it checks that every node has a
// rule, so an unsupported model fails with one error listing all offenders.
//
//===----------------------------------------------------------------------===//
#include "forge/Import/OnnxImporter.h"
#include "ImportContext.h"

#include "forge/Conversion/Conversion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <onnx/defs/schema.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <fstream>

#include <zlib.h>

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::onnx_import;

//===----------------------------------------------------------------------===//
// Element types and tensors
//===----------------------------------------------------------------------===//

Type onnx_import::elementTypeFromOnnx(MLIRContext *ctx, int32_t t) {
  Builder b(ctx);
  switch (t) {
  case onnx::TensorProto::FLOAT: return b.getF32Type();
  case onnx::TensorProto::DOUBLE: return b.getF64Type();
  case onnx::TensorProto::FLOAT16: return b.getF16Type();
  case onnx::TensorProto::BFLOAT16: return b.getBF16Type();
  case onnx::TensorProto::INT64: return b.getIntegerType(64);
  case onnx::TensorProto::INT32: return b.getIntegerType(32);
  case onnx::TensorProto::INT16: return b.getIntegerType(16);
  case onnx::TensorProto::INT8: return b.getIntegerType(8);
  case onnx::TensorProto::UINT8: return b.getIntegerType(8, false);
  case onnx::TensorProto::UINT16: return b.getIntegerType(16, false);
  case onnx::TensorProto::UINT32: return b.getIntegerType(32, false);
  case onnx::TensorProto::UINT64: return b.getIntegerType(64, false);
  case onnx::TensorProto::BOOL: return b.getI1Type();
  case 17: return b.getFloat8E4M3FNType(); // FLOAT8E4M3FN (IR 9)
  case 19: return b.getFloat8E5M2Type();   // FLOAT8E5M2 (IR 9)
  case 18: return b.getFloat8E4M3FNUZType(); // FLOAT8E4M3FNUZ (IR 9)
  case 20: return b.getFloat8E5M2FNUZType(); // FLOAT8E5M2FNUZ (IR 9)
  default: return {};
  }
}

const char *onnx_import::onnxTypeName(int32_t t) {
  static const char *names[] = {"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16",
                                "INT32", "INT64", "STRING", "BOOL", "FLOAT16", "DOUBLE",
                                "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
                                "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1"};
  if (t >= 0 && t < (int32_t)std::size(names))
    return names[t];
  return "unknown";
}

namespace {
/// Appends the typed-field payload of a TensorProto as runtime-layout bytes.
template <typename Field, typename Elem>
void appendField(const Field &field, std::vector<uint8_t> &out) {
  for (auto v : field) {
    Elem e = static_cast<Elem>(v);
    const uint8_t *p = reinterpret_cast<const uint8_t *>(&e);
    out.insert(out.end(), p, p + sizeof(Elem));
  }
}
} // namespace

FailureOr<DenseElementsAttr>
onnx_import::tensorFromProto(MLIRContext *ctx, const onnx::TensorProto &tensor,
                             const std::string &externalDir,
                             function_ref<InFlightDiagnostic()> emitError, ExternalRef *thin) {
  Type element = elementTypeFromOnnx(ctx, tensor.data_type());
  if (!element)
    return emitError() << "tensor '" << tensor.name() << "' has unsupported element type "
                       << onnxTypeName(tensor.data_type());
  SmallVector<int64_t> shape;
  int64_t count = 1;
  for (int64_t d : tensor.dims()) {
    if (d < 0 || (d > 0 && count > (int64_t(1) << 40) / d))
      return emitError() << "tensor '" << tensor.name() << "' has invalid dims";
    shape.push_back(d);
    count *= d;
  }
  auto type = RankedTensorType::get(shape, element);
  size_t width = element.isInteger(1) ? 1 : (element.getIntOrFloatBitWidth() + 7) / 8;
  size_t expected = size_t(count) * width;
  std::vector<uint8_t> bytes;

  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    uint64_t offset = 0, length = 0;
    bool hasLength = false;
    for (const auto &kv : tensor.external_data()) {
      if (kv.key() == "location")
        location = kv.value();
      else if (kv.key() == "offset")
        offset = std::strtoull(kv.value().c_str(), nullptr, 10);
      else if (kv.key() == "length") {
        length = std::strtoull(kv.value().c_str(), nullptr, 10);
        hasLength = true;
      }
    }
    if (location.empty() || llvm::sys::path::is_absolute(location) ||
        StringRef(location).contains(".."))
      return emitError() << "tensor '" << tensor.name()
                         << "': external data location must be a relative path inside the "
                            "model directory, got '" << location << "'";
    SmallString<256> path(externalDir);
    llvm::sys::path::append(path, location);
    // A symlink inside the model directory must not lead outside it either.
    SmallString<256> realFile, realDir;
    if (!llvm::sys::fs::real_path(path, realFile) &&
        !llvm::sys::fs::real_path(externalDir.empty() ? "." : externalDir, realDir) &&
        !StringRef(realFile).starts_with((realDir + llvm::sys::path::get_separator()).str()))
      return emitError() << "tensor '" << tensor.name() << "': external data '" << location
                         << "' resolves to '" << realFile << "', outside the model directory '"
                         << realDir << "'";
    if (!hasLength)
      length = expected;
    if (length != expected)
      return emitError() << "tensor '" << tensor.name() << "': external data length " << length
                         << " != " << expected << " bytes for its shape and type";
    std::ifstream in(path.str().str(), std::ios::binary);
    if (thin && isa<FloatType>(element)) {
      // Thin bundle: the values are read at load time; hash them if they are here.
      thin->location = location;
      thin->offset = offset;
      thin->length = length;
      thin->crc32 = -1;
      if (in) {
        std::vector<char> data(length);
        in.seekg(offset);
        if (in.read(data.data(), static_cast<std::streamsize>(length)))
          thin->crc32 = ::crc32_z(::crc32_z(0L, Z_NULL, 0),
                                  reinterpret_cast<const Bytef *>(data.data()), length);
      }
      return DenseElementsAttr::get(type, FloatAttr::get(element, 0.0));
    }
    if (!in)
      return emitError() << "tensor '" << tensor.name() << "': cannot open external data file '"
                         << path << "'";
    in.seekg(0, std::ios::end);
    uint64_t fileSize = in.tellg();
    if (offset > fileSize || fileSize - offset < length)
      return emitError() << "tensor '" << tensor.name() << "': external data [" << offset << ", +"
                         << length << ") exceeds file '" << path << "' of " << fileSize
                         << " bytes";
    bytes.resize(length);
    in.seekg(offset);
    in.read(reinterpret_cast<char *>(bytes.data()), length);
  } else if (tensor.has_raw_data()) {
    const std::string &raw = tensor.raw_data();
    bytes.assign(raw.begin(), raw.end());
  } else {
    switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT: appendField<decltype(tensor.float_data()), float>(tensor.float_data(), bytes); break;
    case onnx::TensorProto::DOUBLE: appendField<decltype(tensor.double_data()), double>(tensor.double_data(), bytes); break;
    case onnx::TensorProto::INT64: appendField<decltype(tensor.int64_data()), int64_t>(tensor.int64_data(), bytes); break;
    case onnx::TensorProto::INT32: appendField<decltype(tensor.int32_data()), int32_t>(tensor.int32_data(), bytes); break;
    case onnx::TensorProto::INT16: appendField<decltype(tensor.int32_data()), int16_t>(tensor.int32_data(), bytes); break;
    case onnx::TensorProto::INT8: appendField<decltype(tensor.int32_data()), int8_t>(tensor.int32_data(), bytes); break;
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL: appendField<decltype(tensor.int32_data()), uint8_t>(tensor.int32_data(), bytes); break;
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: appendField<decltype(tensor.int32_data()), uint16_t>(tensor.int32_data(), bytes); break;
    case 17:
    case 18:
    case 19:
    case 20: appendField<decltype(tensor.int32_data()), uint8_t>(tensor.int32_data(), bytes); break;
    case onnx::TensorProto::UINT32: appendField<decltype(tensor.uint64_data()), uint32_t>(tensor.uint64_data(), bytes); break;
    case onnx::TensorProto::UINT64: appendField<decltype(tensor.uint64_data()), uint64_t>(tensor.uint64_data(), bytes); break;
    default: break;
    }
  }
  if (bytes.size() != expected)
    return emitError() << "tensor '" << tensor.name() << "' holds " << bytes.size()
                       << " bytes but its shape and type need " << expected;
  return elementsFromBytes(type, bytes);
}

//===----------------------------------------------------------------------===//
// NodeImporter
//===----------------------------------------------------------------------===//

Value NodeImporter::input(int64_t i) const {
  if (i < 0 || i >= node.input_size() || node.input(i).empty())
    return {};
  return graph.values.lookup(node.input(i));
}

RankedTensorType NodeImporter::inputType(int64_t i) const {
  Value v = input(i);
  return v ? llvm::cast<RankedTensorType>(v.getType()) : RankedTensorType();
}

DenseElementsAttr NodeImporter::constantInput(int64_t i) const {
  Value v = input(i);
  if (!v)
    return {};
  if (auto c = v.getDefiningOp<ConstantOp>())
    return dyn_cast<DenseElementsAttr>(c.getValue());
  return {};
}

FailureOr<SmallVector<int64_t>> NodeImporter::constantInts(int64_t i, StringRef what) {
  DenseElementsAttr c = constantInput(i);
  if (!c || !isa<IntegerType>(c.getElementType()))
    return error() << "input " << i << " (" << what
                   << ") must be an integer constant once shapes are fixed";
  SmallVector<int64_t> out;
  for (APInt v : c.getValues<APInt>())
    out.push_back(v.getSExtValue());
  return out;
}

FailureOr<double> NodeImporter::constantScalar(int64_t i, StringRef what) {
  DenseElementsAttr c = constantInput(i);
  if (!c || c.getNumElements() != 1)
    return error() << "input " << i << " (" << what << ") must be a constant scalar";
  Type e = c.getElementType();
  if (isa<FloatType>(e))
    return (*c.getValues<APFloat>().begin()).convertToDouble();
  if (e.isInteger(1))
    return *c.getValues<bool>().begin() ? 1.0 : 0.0;
  APInt v = *c.getValues<APInt>().begin();
  return llvm::cast<IntegerType>(e).isUnsigned() ? double(v.getZExtValue()) : double(v.getSExtValue());
}

LogicalResult NodeImporter::setOutput(int64_t i, Value v) {
  if (i >= node.output_size() || node.output(i).empty())
    return success();
  graph.values[node.output(i)] = v;
  return success();
}

const onnx::AttributeProto *NodeImporter::attr(StringRef name) const {
  for (const auto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t NodeImporter::intAttr(StringRef name, int64_t def) const {
  const auto *a = attr(name);
  return a ? a->i() : def;
}
double NodeImporter::floatAttr(StringRef name, double def) const {
  const auto *a = attr(name);
  return a ? a->f() : def;
}
std::string NodeImporter::stringAttr(StringRef name, StringRef def) const {
  const auto *a = attr(name);
  return a ? a->s() : def.str();
}
std::optional<SmallVector<int64_t>> NodeImporter::intsAttr(StringRef name) const {
  const auto *a = attr(name);
  if (!a)
    return std::nullopt;
  return SmallVector<int64_t>(a->ints().begin(), a->ints().end());
}

InFlightDiagnostic NodeImporter::error() {
  return emitError(loc) << node.op_type() << " (opset " << opset << ") node '" << node.name()
                        << "': ";
}

FailureOr<SmallVector<Value>> NodeImporter::create(StringRef opName, ArrayRef<Value> operands,
                                                   ArrayRef<NamedAttribute> attrs) {
  SmallVector<Value> present;
  for (Value v : operands)
    if (v)
      present.push_back(v);
  auto built = buildForgeOp(b, loc, opName, present, attrs, [&]() { return error(); });
  if (failed(built))
    return failure();
  Operation *op = *built;
  SmallVector<Value> results(op->getResults());
  // Fold when every operand is a constant: shape subgraphs vanish at import.
  // For training, float initializers (the future parameters) stay live.
  auto isFloatInitializer = [](Value v) {
    auto c = v.getDefiningOp<ConstantOp>();
    return c && c->hasAttr("forge.initializer") &&
           isa<FloatType>(getElementTypeOrSelf(v.getType()));
  };
  if (present.empty() ||
      !llvm::all_of(present, [](Value v) { return v.getDefiningOp<ConstantOp>(); }) ||
      (graph.keepFloatInitializers && llvm::any_of(present, isFloatInitializer)))
    return results;
  // Results beyond the budget stay ops, evaluated at run time.
  for (Value r : results)
    if (auto type = dyn_cast<RankedTensorType>(r.getType());
        type && type.hasStaticShape() && type.getNumElements() > graph.maxFoldElements) {
      graph.notFolded.push_back("'" + node.name() + "' (" + node.op_type() + ", " +
                                std::to_string(type.getNumElements()) + " elements)");
      return results;
    }
  SmallVector<Attribute> consts;
  for (Value v : operands)
    consts.push_back(v ? v.getDefiningOp<ConstantOp>().getValue() : Attribute());
  auto folded = evaluateOnConstants(op, consts);
  if (failed(folded))
    return results; // left for run time; the op itself is valid
  results.clear();
  for (DenseElementsAttr c : *folded)
    results.push_back(b.create<ConstantOp>(loc, c));
  op->erase();
  return results;
}

Value NodeImporter::constant(DenseElementsAttr value) {
  return b.create<ConstantOp>(loc, value);
}

Value NodeImporter::scalar(Type element, double value) {
  auto type = RankedTensorType::get({}, element);
  if (isa<FloatType>(element))
    return constant(DenseElementsAttr::get(type, b.getFloatAttr(element, value)));
  return constant(DenseElementsAttr::get(type, b.getIntegerAttr(element, (int64_t)value)));
}

FailureOr<Value> NodeImporter::reshape(Value v, ArrayRef<int64_t> shape) {
  if (llvm::cast<RankedTensorType>(v.getType()).getShape() == shape)
    return v;
  return create1("reshape", {v}, {ints("shape", shape)});
}

FailureOr<Value> NodeImporter::transpose(Value v, ArrayRef<int64_t> perm) {
  bool identity = true;
  for (auto [i, p] : llvm::enumerate(perm))
    identity &= (int64_t)i == p;
  if (identity)
    return v;
  return create1("transpose", {v}, {ints("perm", perm)});
}

FailureOr<Value> NodeImporter::cast(Value v, Type element) {
  if (!v)
    return error() << "missing input";
  if (llvm::cast<RankedTensorType>(v.getType()).getElementType() == element)
    return v;
  return create1("cast", {v}, {named("to", TypeAttr::get(element))});
}

//===----------------------------------------------------------------------===//
// Graph import
//===----------------------------------------------------------------------===//

namespace {

class GraphImporter {
public:
  GraphImporter(MLIRContext *ctx, const ImportOptions &options, std::string origin,
                std::string externalDir)
      : ctx(ctx), options(options), origin(std::move(origin)),
        externalDir(std::move(externalDir)), fileLoc(FileLineColLoc::get(ctx, this->origin, 0, 0)) {}

  OwningOpRef<ModuleOp> run(const onnx::ModelProto &model);

private:
  InFlightDiagnostic error() { return emitError(fileLoc) << origin << ": "; }
  FailureOr<RankedTensorType> inputType(const onnx::ValueInfoProto &info);
  /// The type the model declares for an input, with --batch/--dim/--shape applied.
  FailureOr<RankedTensorType> declaredInputType(const onnx::ValueInfoProto &info);
  /// The --dim names some input used (each must be).
  std::set<std::string> usedDims;
  LogicalResult checkSupported(const onnx::GraphProto &graph, int64_t opset);
  FailureOr<std::vector<const onnx::NodeProto *>> sortNodes(const onnx::GraphProto &graph,
                                                            const llvm::StringSet<> &available);
  Location nodeLoc(const onnx::NodeProto &node, size_t index);

  MLIRContext *ctx;
  const ImportOptions &options;
  std::string origin, externalDir;
  SmallVector<NamedAttribute> thinWeights; // ImportOptions::externalWeights
  Location fileLoc;
};

Location GraphImporter::nodeLoc(const onnx::NodeProto &node, size_t index) {
  std::string name = node.name().empty() ? node.op_type() + "_" + std::to_string(index) : node.name();
  return NameLoc::get(StringAttr::get(ctx, name), fileLoc);
}

namespace {
/// "" when `type`'s byte count fits in int64, else "d0 x d1 x ... elements x
/// N bytes": the product that overflows.
std::string overflowingProduct(RankedTensorType type) {
  int64_t bytes = std::max<int64_t>(1, type.getElementType().getIntOrFloatBitWidth() / 8);
  bool overflow = false;
  for (int64_t d : type.getShape())
    overflow |= llvm::MulOverflow(bytes, d, bytes);
  if (!overflow)
    return "";
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::interleave(type.getShape(), os, " x ");
  os << " elements x " << std::max<int64_t>(1, type.getElementType().getIntOrFloatBitWidth() / 8)
     << " bytes";
  return text;
}
} // namespace

FailureOr<RankedTensorType> GraphImporter::inputType(const onnx::ValueInfoProto &info) {
  FailureOr<RankedTensorType> type = declaredInputType(info);
  if (failed(type))
    return failure();
  if (std::string product = overflowingProduct(*type); !product.empty())
    return error() << "graph input '" << info.name() << "' of shape [" << type->getShape()
                   << "] is too large: " << product
                   << " overflows 64-bit arithmetic; lower --batch, --dim or --shape";
  return type;
}

FailureOr<RankedTensorType> GraphImporter::declaredInputType(const onnx::ValueInfoProto &info) {
  if (!info.type().has_tensor_type())
    return error() << "graph input '" << info.name() << "' is not a tensor (sequences, maps and "
                   << "optionals are unsupported)";
  const auto &tt = info.type().tensor_type();
  Type element = elementTypeFromOnnx(ctx, tt.elem_type());
  if (!element)
    return error() << "graph input '" << info.name() << "' has unsupported element type "
                   << onnxTypeName(tt.elem_type());
  SmallVector<int64_t> shape;
  auto explicitShape = options.inputShapes.find(info.name());
  if (explicitShape != options.inputShapes.end()) {
    shape.assign(explicitShape->second.begin(), explicitShape->second.end());
    if (tt.has_shape() && tt.shape().dim_size() != (int)shape.size())
      return error() << "the shape given for input '" << info.name()
                     << "' (--shape or --shapes-from) has " << shape.size()
                     << " dims but the model declares " << tt.shape().dim_size();
    for (int d = 0; tt.has_shape() && d < tt.shape().dim_size(); ++d) {
      const auto &dim = tt.shape().dim(d);
      if (dim.has_dim_value() && dim.dim_value() != shape[d])
        return error() << "the shape given for input '" << info.name()
                       << "' (--shape or --shapes-from) has " << shape[d] << " in dim " << d
                       << " but the model declares " << dim.dim_value();
      if (dim.has_dim_value())
        continue;
      // A symbolic dim that --dim or --batch also sets must agree.
      if (dim.has_dim_param()) {
        auto it = options.dimValues.find(dim.dim_param());
        if (it != options.dimValues.end()) {
          usedDims.insert(it->first);
          if (it->second != shape[d])
            return error() << "--dim " << dim.dim_param() << "=" << it->second
                           << " conflicts with the shape given for input '" << info.name()
                           << "', whose dim " << d << " ('" << dim.dim_param() << "') is "
                           << shape[d];
        }
      }
      if (d == 0 && options.batch > 0 && options.batch != shape[0])
        return error() << "--batch " << options.batch << " conflicts with the shape given for input '"
                       << info.name() << "', whose dim 0 is " << shape[0];
    }
    return RankedTensorType::get(shape, element);
  }
  if (!tt.has_shape())
    return error() << "graph input '" << info.name()
                   << "' has no shape; give it with --shape " << info.name() << "=d0,d1,...";
  for (int d = 0; d < tt.shape().dim_size(); ++d) {
    const auto &dim = tt.shape().dim(d);
    if (dim.has_dim_value() && dim.dim_value() >= 0) {
      shape.push_back(dim.dim_value());
      continue;
    }
    if (dim.has_dim_param()) {
      auto it = options.dimValues.find(dim.dim_param());
      if (it != options.dimValues.end()) {
        usedDims.insert(dim.dim_param());
        if (d == 0 && options.batch > 0 && options.batch != it->second)
          return error() << "--batch " << options.batch << " conflicts with --dim "
                         << dim.dim_param() << "=" << it->second << " (dim 0 of input '"
                         << info.name() << "')";
        shape.push_back(it->second);
        continue;
      }
    }
    if (d == 0 && options.batch > 0) {
      shape.push_back(options.batch);
      continue;
    }
    if (dim.has_dim_value()) // a negative size: no shape at all
      return error() << "graph input '" << info.name() << "' dim " << d << " is negative ("
                     << dim.dim_value() << "); set it with "
                     << (d == 0 ? "--batch N or " : "") << "--shape " << info.name() << "=...";
    return error() << "graph input '" << info.name() << "' dim " << d << " is symbolic ("
                   << (dim.has_dim_param() ? "'" + dim.dim_param() + "'" : std::string("unnamed"))
                   << "); set it with "
                   << (d == 0 ? "--batch N, " : "")
                   << (dim.has_dim_param() ? "--dim " + dim.dim_param() + "=N or " : std::string())
                   << "--shape " << info.name() << "=...";
  }
  return RankedTensorType::get(shape, element);
}

LogicalResult GraphImporter::checkSupported(const onnx::GraphProto &graph, int64_t opset) {
  const auto &rules = onnxOpRules();
  std::vector<std::string> problems;
  for (const auto &node : graph.node()) {
    bool defaultDomain = node.domain().empty() || node.domain() == "ai.onnx";
    if (defaultDomain && rules.count(node.op_type()))
      continue;
    problems.push_back(node.op_type() + " (domain '" +
                       (node.domain().empty() ? std::string("ai.onnx") : node.domain()) +
                       "', opset " + std::to_string(opset) + ", node '" + node.name() + "')");
  }
  // Required attributes, from ONNX's own schemas (a Concat without `axis` used
  // to import with axis 0).
  std::vector<std::string> missing, arity;
  const auto &versions = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const auto known = versions.find(onnx::ONNX_DOMAIN);
  const int64_t knownOpset = known != versions.end() ? known->second.second : 0;
  for (const auto &node : graph.node()) {
    bool defaultDomain = node.domain().empty() || node.domain() == "ai.onnx";
    const onnx::OpSchema *schema =
        defaultDomain ? onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(opset), "")
                      : nullptr;
    if (!schema)
      continue;
    // Input and output counts, and no empty name for a required input (op
    // imports may then take input(i) as present). Only where this libonnx knows
    // the model's opset: for a newer one Schema() answers with an older version
    // (ReduceMean-13's one input for opset 20's ReduceMean-18, which takes two).
    const int inputs = node.input_size(), outputs = node.output_size();
    const std::string label = node.op_type() + " node '" + node.name() + "': ";
    if (opset > knownOpset)
      ; // the op imports check what they take
    else if (inputs < schema->min_input() || inputs > schema->max_input())
      arity.push_back(label + std::to_string(inputs) + " inputs, the op takes " +
                      std::to_string(schema->min_input()) + " to " +
                      std::to_string(schema->max_input()));
    for (int i = 0; opset <= knownOpset && i < inputs &&
                    i < static_cast<int>(schema->inputs().size());
         ++i)
      if (node.input(i).empty() &&
          schema->inputs()[i].GetOption() == onnx::OpSchema::FormalParameterOption::Single)
        arity.push_back(label + "required input " + std::to_string(i) + " ('" +
                        schema->inputs()[i].GetName() + "') is empty");
    if (opset <= knownOpset &&
        (outputs < schema->min_output() || outputs > schema->max_output()))
      arity.push_back(label + std::to_string(outputs) + " outputs, the op gives " +
                      std::to_string(schema->min_output()) + " to " +
                      std::to_string(schema->max_output()));
    for (const auto &[name, attr] : schema->attributes()) {
      if (!attr.required)
        continue;
      bool present = llvm::any_of(node.attribute(), [&, &name = name](const onnx::AttributeProto &a) {
        return a.name() == name;
      });
      if (!present)
        missing.push_back(node.op_type() + " node '" + node.name() + "': required attribute '" +
                          name + "' is missing");
    }
  }
  if (!missing.empty()) {
    auto diag = error() << missing.size() << " node" << (missing.size() > 1 ? "s" : "")
                        << " without a required attribute (opset " << opset << "):";
    for (const auto &m : missing)
      diag << "\n  " << m;
    return diag;
  }
  if (!arity.empty()) {
    auto diag = error() << arity.size() << " node" << (arity.size() > 1 ? "s" : "")
                        << " with inputs or outputs their op does not take (opset " << opset
                        << "):";
    for (const auto &m : arity)
      diag << "\n  " << m;
    return diag;
  }
  if (problems.empty())
    return success();
  auto diag = error() << problems.size() << " unsupported op" << (problems.size() > 1 ? "s" : "")
                      << ":";
  for (const auto &p : problems)
    diag << "\n  " << p;
  return diag;
}

FailureOr<std::vector<const onnx::NodeProto *>>
GraphImporter::sortNodes(const onnx::GraphProto &graph, const llvm::StringSet<> &available) {
  // Kahn's algorithm over value names; keeps file order among ready nodes.
  llvm::StringMap<int> producer;
  for (int i = 0; i < graph.node_size(); ++i)
    for (const auto &out : graph.node(i).output())
      if (!out.empty()) {
        if (producer.count(out) || available.contains(out))
          return error() << "value '" << out << "' is produced twice (node '"
                         << graph.node(i).name() << "')";
        producer[out] = i;
      }
  std::vector<int> missing(graph.node_size(), 0);
  std::vector<std::vector<int>> consumers(graph.node_size());
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const auto &in : graph.node(i).input()) {
      if (in.empty() || available.contains(in))
        continue;
      auto it = producer.find(in);
      if (it == producer.end())
        return error() << "node '" << graph.node(i).name() << "' (" << graph.node(i).op_type()
                       << ") reads '" << in << "', which no node, input or initializer defines";
      ++missing[i];
      consumers[it->second].push_back(i);
    }
  }
  std::vector<const onnx::NodeProto *> order;
  std::vector<int> ready;
  for (int i = graph.node_size() - 1; i >= 0; --i)
    if (missing[i] == 0)
      ready.push_back(i);
  while (!ready.empty()) {
    int i = ready.back();
    ready.pop_back();
    order.push_back(&graph.node(i));
    std::vector<int> next;
    for (int c : consumers[i])
      if (--missing[c] == 0)
        next.push_back(c);
    std::sort(next.rbegin(), next.rend());
    ready.insert(ready.end(), next.begin(), next.end());
  }
  if ((int)order.size() != graph.node_size()) {
    // Every node left waits for a producer that is also left: walking from one
    // to such a producer must come back to a node seen before, and the nodes
    // from there on are the cycle (the others merely depend on it).
    auto waitsOn = [&](int i) {
      for (const auto &in : graph.node(i).input())
        if (auto it = producer.find(in); !in.empty() && it != producer.end() &&
                                         missing[it->second] > 0)
          return it->second;
      return -1;
    };
    int start = 0;
    while (missing[start] == 0)
      ++start;
    std::vector<int> path;
    std::vector<int> seenAt(graph.node_size(), -1);
    for (int i = start; i >= 0 && seenAt[i] < 0; i = waitsOn(i)) {
      seenAt[i] = static_cast<int>(path.size());
      path.push_back(i);
    }
    int repeat = path.empty() ? -1 : waitsOn(path.back());
    auto diag = error() << "the graph has a cycle:";
    if (repeat >= 0 && seenAt[repeat] >= 0) {
      // path runs consumer -> producer; print producer -> consumer.
      std::vector<int> cycle(path.begin() + seenAt[repeat], path.end());
      std::reverse(cycle.begin(), cycle.end());
      for (int i : cycle)
        diag << " '" << graph.node(i).name() << "' (" << graph.node(i).op_type() << ") ->";
      diag << " '" << graph.node(cycle.front()).name() << "'";
    }
    int dependents = graph.node_size() - static_cast<int>(order.size());
    diag << " (" << dependents << " node" << (dependents == 1 ? "" : "s")
         << " cannot be ordered because of it)";
    return diag;
  }
  return order;
}

OwningOpRef<ModuleOp> GraphImporter::run(const onnx::ModelProto &model) {
  if (model.ir_version() > 11) {
    error() << "IR version " << model.ir_version() << " is newer than supported (3..11)";
    return nullptr;
  }
  int64_t opset = -1;
  for (const auto &imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx")
      opset = imp.version();
  if (opset < 0) {
    // ONNX requires one; without it the ops' semantics are unknown (a cut file
    // that still parses, or a hand-made one).
    error() << "the model imports no default-domain opset (opset_import is "
            << (model.opset_import().empty() ? "empty" : "only other domains")
            << "); is the file cut or hand-made?";
    return nullptr;
  }
  // Old opset numbers are fine: a backend test of an op that never changed
  // imports opset 1. Rules check the opset where an op's semantics changed.
  if (opset > 23) {
    error() << "default-domain opset " << opset << " is newer than supported (up to 23)";
    return nullptr;
  }
  if (!model.has_graph()) {
    error() << "the model has no graph";
    return nullptr;
  }
  const onnx::GraphProto &graph = model.graph();
  if (failed(checkSupported(graph, opset)))
    return nullptr;

  OpBuilder b(ctx);
  OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
  module->getOperation()->setAttr("forge.onnx_opset", b.getI64IntegerAttr(opset));
  module->getOperation()->setAttr("forge.source", b.getStringAttr(origin));
  // Training semantics that differ between frameworks follow the producer
  // (BatchNorm's running variance: TrainOptions::unbiasedRunningVar).
  if (!model.producer_name().empty())
    module->getOperation()->setAttr("forge.producer", b.getStringAttr(model.producer_name()));

  llvm::StringSet<> initializerNames;
  for (const auto &init : graph.initializer())
    initializerNames.insert(init.name());

  SmallVector<Type> argTypes;
  SmallVector<const onnx::ValueInfoProto *> inputs, boundInputs;
  for (const auto &in : graph.input()) {
    if (initializerNames.contains(in.name()))
      continue; // IR < 4 lists initializers as inputs too
    if (options.constantInputs.count(in.name())) {
      boundInputs.push_back(&in);
      continue;
    }
    auto type = inputType(in);
    if (failed(type))
      return nullptr;
    argTypes.push_back(*type);
    inputs.push_back(&in);
  }
  // Every --shape and --dim must name something (a typo used to pass silently).
  {
    std::vector<std::string> inputNames;
    for (const auto &in : graph.input())
      if (!initializerNames.contains(in.name()))
        inputNames.push_back(in.name());
    std::string list = llvm::join(inputNames, ", ");
    for (const auto &[name, shape] : options.inputShapes)
      if (!options.optionalShapeNames.count(name) && !llvm::is_contained(inputNames, name)) {
        error() << "--shape names '" << name << "', which is not an input of the model (inputs: "
                << list << ")";
        return nullptr;
      }
    for (const auto &[name, value] : options.dimValues)
      if (!usedDims.count(name)) {
        error() << "--dim names '" << name
                << "', which is no symbolic dim of an input whose shape was not given (inputs: "
                << list << ")";
        return nullptr;
      }
  }

  auto func = func::FuncOp::create(fileLoc, "main", b.getFunctionType(argTypes, {}));
  module->push_back(func);
  Block *entry = func.addEntryBlock();
  b.setInsertionPointToStart(entry);
  GraphState state;
  state.keepFloatInitializers = options.keepFloatInitializers;
  state.maxFoldElements = options.maxFoldElements;
  state.untieSharedInitializers =
      options.keepFloatInitializers && options.untieSharedInitializers;
  llvm::StringSet<> available;
  for (auto [i, in] : llvm::enumerate(inputs)) {
    state.values[in->name()] = entry->getArgument(i);
    func.setArgAttr(i, "forge.name", b.getStringAttr(in->name()));
    available.insert(in->name());
  }
  for (const onnx::ValueInfoProto *in : boundInputs) {
    auto loc = NameLoc::get(b.getStringAttr(in->name()), fileLoc);
    state.values[in->name()] = b.create<ConstantOp>(loc, options.constantInputs.at(in->name()));
    available.insert(in->name());
  }
  for (const auto &init : graph.initializer()) {
    auto loc = NameLoc::get(b.getStringAttr(init.name()), fileLoc);
    ExternalRef ref;
    auto value = tensorFromProto(ctx, init, externalDir,
                                 [&]() { return emitError(loc) << origin << ": "; },
                                 options.externalWeights ? &ref : nullptr);
    if (failed(value))
      return nullptr;
    auto c = b.create<ConstantOp>(loc, *value);
    c->setAttr("forge.initializer", b.getStringAttr(init.name()));
    if (!ref.location.empty())
      thinWeights.push_back(b.getNamedAttr(
          init.name(), b.getArrayAttr({b.getStringAttr(ref.location),
                                       b.getI64IntegerAttr(static_cast<int64_t>(ref.offset)),
                                       b.getI64IntegerAttr(static_cast<int64_t>(ref.length)),
                                       b.getI64IntegerAttr(ref.crc32)})));
    state.values[init.name()] = c;
    available.insert(init.name());
  }

  auto order = sortNodes(graph, available);
  if (failed(order))
    return nullptr;
  const auto &rules = onnxOpRules();
  for (auto [index, node] : llvm::enumerate(*order)) {
    NodeImporter importer(b, state, *node, opset, nodeLoc(*node, index));
    for (int i = 0; i < node->input_size(); ++i)
      if (!node->input(i).empty() && !state.values.count(node->input(i))) {
        importer.error() << "input '" << node->input(i) << "' is undefined";
        return nullptr;
      }
    if (failed(rules.find(node->op_type())->second(importer)))
      return nullptr;
    for (int i = 0; i < node->output_size(); ++i)
      if (!node->output(i).empty() && !state.values.count(node->output(i))) {
        importer.error() << "output " << i << " ('" << node->output(i)
                         << "') is not supported by the import of this op";
        return nullptr;
      }
  }

  SmallVector<Value> results;
  SmallVector<Type> resultTypes;
  for (const auto &out : graph.output()) {
    Value v = state.values.lookup(out.name());
    if (!v) {
      error() << "graph output '" << out.name() << "' is never produced";
      return nullptr;
    }
    // Check declared element types and static dims against what we inferred.
    auto actual = cast<RankedTensorType>(v.getType());
    if (out.type().has_tensor_type()) {
      const auto &tt = out.type().tensor_type();
      Type declared = elementTypeFromOnnx(ctx, tt.elem_type());
      if (declared && declared != actual.getElementType()) {
        error() << "graph output '" << out.name() << "' is declared " << declared
                << " but computes " << actual.getElementType();
        return nullptr;
      }
      if (tt.has_shape() && tt.shape().dim_size() == actual.getRank())
        for (int d = 0; d < actual.getRank(); ++d)
          if (tt.shape().dim(d).has_dim_value() &&
              tt.shape().dim(d).dim_value() != actual.getDimSize(d)) {
            error() << "graph output '" << out.name() << "' dim " << d << " is declared "
                    << tt.shape().dim(d).dim_value() << " but computes " << actual.getDimSize(d);
            return nullptr;
          }
    }
    results.push_back(v);
    resultTypes.push_back(v.getType());
  }
  b.create<func::ReturnOp>(fileLoc, results);
  func.setFunctionType(b.getFunctionType(argTypes, resultTypes));
  for (auto [i, out] : llvm::enumerate(graph.output()))
    func.setResultAttr(i, "forge.name", b.getStringAttr(out.name()));
  if (!state.untied.empty()) {
    SmallVector<NamedAttribute> untied;
    for (const auto &[name, source] : state.untied) {
      untied.push_back(b.getNamedAttr(name, b.getStringAttr(source)));
      // A thin bundle reads the copy's initial value where the shared one lives.
      for (const NamedAttribute &w : SmallVector<NamedAttribute>(thinWeights))
        if (w.getName() == source)
          thinWeights.push_back(b.getNamedAttr(name, w.getValue()));
    }
    module->getOperation()->setAttr("forge.untied_initializers",
                                    DictionaryAttr::get(ctx, untied));
  }
  if (!thinWeights.empty())
    module->getOperation()->setAttr("forge.external_weights",
                                    DictionaryAttr::get(ctx, thinWeights));
  if (!state.notFolded.empty()) {
    auto warning = emitWarning(fileLoc)
                   << origin << ": " << state.notFolded.size() << " constant expression"
                   << (state.notFolded.size() > 1 ? "s" : "") << " larger than "
                   << options.maxFoldElements
                   << " elements kept as ops (evaluated at run time, not folded):";
    for (const std::string &what : state.notFolded)
      warning << " " << what;
  }
  // Shapes computed from large inputs (an outer product, a Tile, an Expand)
  // must still have byte counts that later arithmetic can hold.
  WalkResult tooLarge = module->walk([&](Operation *op) {
    for (Value r : op->getResults()) {
      auto type = dyn_cast<RankedTensorType>(r.getType());
      if (!type || !type.hasStaticShape())
        continue;
      if (std::string product = overflowingProduct(type); !product.empty()) {
        op->emitError() << "result of shape [" << type.getShape() << "] is too large: " << product
                        << " overflows 64-bit arithmetic; lower --batch, --dim or --shape";
        return WalkResult::interrupt();
      }
    }
    return WalkResult::advance();
  });
  if (tooLarge.wasInterrupted())
    return nullptr;
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

} // namespace

OwningOpRef<ModuleOp> mlir::forge::importOnnxBytes(MLIRContext *ctx, StringRef bytes,
                                                   const std::string &origin,
                                                   const ImportOptions &options) {
  ctx->loadDialect<ForgeDialect, func::FuncDialect>();
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), (int)bytes.size());
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    emitError(FileLineColLoc::get(ctx, origin, 0, 0))
        << origin << ": not a valid ONNX model (protobuf parse failed after "
        << coded.CurrentPosition() << " of " << bytes.size() << " bytes; truncated or not ONNX?)";
    return nullptr;
  }
  std::string dir = options.externalDataDir;
  if (dir.empty())
    dir = llvm::sys::path::parent_path(origin).str();
  GraphImporter importer(ctx, options, origin, dir);
  return importer.run(model);
}

OwningOpRef<ModuleOp> mlir::forge::importOnnxFile(MLIRContext *ctx, const std::string &path,
                                                  const ImportOptions &options) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer) {
    emitError(FileLineColLoc::get(ctx, path, 0, 0))
        << "cannot read '" << path << "': " << buffer.getError().message();
    return nullptr;
  }
  return importOnnxBytes(ctx, (*buffer)->getBuffer(), path, options);
}

FailureOr<DenseElementsAttr> mlir::forge::importTensorProto(MLIRContext *ctx, StringRef bytes,
                                                            const std::string &origin) {
  onnx::TensorProto tensor;
  auto loc = FileLineColLoc::get(ctx, origin, 0, 0);
  if (!tensor.ParseFromArray(bytes.data(), (int)bytes.size()))
    return emitError(loc) << origin << ": not a valid ONNX TensorProto";
  std::string dir = llvm::sys::path::parent_path(origin).str();
  return onnx_import::tensorFromProto(ctx, tensor, dir, [&]() { return emitError(loc) << origin << ": "; });
}

std::vector<std::string> mlir::forge::supportedOnnxOps() {
  std::vector<std::string> names;
  for (const auto &kv : onnx_import::onnxOpRules())
    names.push_back(kv.getKey().str());
  std::sort(names.begin(), names.end());
  return names;
}
