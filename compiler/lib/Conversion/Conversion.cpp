//===- Conversion.cpp - forge IR <-> runtime bundle representations -------===//
#include "forge/Conversion/Conversion.h"

#include "forge/Dialect/ForgeDialect.h"
#include "forge/runtime/Kernels.h"

#include "mlir/IR/Diagnostics.h"

using namespace mlir;
using namespace mlir::forge;
#include <unistd.h>

namespace pb = ::forge::bundle;

pb::DType mlir::forge::dtypeFromType(Type type) {
  if (type.isF32()) return pb::F32;
  if (type.isF16()) return pb::F16;
  if (type.isBF16()) return pb::BF16;
  if (type.isF64()) return pb::F64;
  if (type.isFloat8E4M3FN()) return pb::F8E4M3;
  if (type.isFloat8E5M2()) return pb::F8E5M2;
  if (type.isFloat8E4M3FNUZ()) return pb::F8E4M3FNUZ;
  if (type.isFloat8E5M2FNUZ()) return pb::F8E5M2FNUZ;
  auto integer = dyn_cast<IntegerType>(type);
  if (!integer)
    return pb::DTYPE_UNSPECIFIED;
  bool isUnsigned = integer.isUnsigned();
  switch (integer.getWidth()) {
  case 1: return pb::BOOL;
  case 8: return isUnsigned ? pb::U8 : pb::I8;
  case 16: return isUnsigned ? pb::U16 : pb::I16;
  case 32: return isUnsigned ? pb::U32 : pb::I32;
  case 64: return isUnsigned ? pb::U64 : pb::I64;
  default: return pb::DTYPE_UNSPECIFIED;
  }
}

LogicalResult mlir::forge::encodeInstruction(Operation *op, pb::Instruction &inst) {
  auto info = op->getName().getRegisteredInfo();
  if (!info || op->getDialect()->getNamespace() != "forge")
    return op->emitError("only forge ops can become bundle instructions");
  inst.set_op(op->getName().stripDialect().str());
  DictionaryAttr all = op->getAttrDictionary();
  for (StringAttr name : info->getAttributeNames()) {
    Attribute attr = all.get(name);
    if (!attr)
      continue; // absent optional attribute
    pb::Attribute encoded;
    if (auto b = dyn_cast<BoolAttr>(attr))
      encoded.set_i(b.getValue());
    else if (auto i = dyn_cast<IntegerAttr>(attr))
      encoded.set_i(i.getInt());
    else if (auto f = dyn_cast<FloatAttr>(attr))
      encoded.set_f(f.getValueAsDouble());
    else if (auto s = dyn_cast<StringAttr>(attr))
      encoded.set_s(s.str());
    else if (auto ints = dyn_cast<DenseI64ArrayAttr>(attr)) {
      auto *values = encoded.mutable_ints(); // set even when empty (rank-0 shapes)
      for (int64_t v : ints.asArrayRef())
        values->add_values(v);
    }
    else if (auto t = dyn_cast<TypeAttr>(attr)) {
      pb::DType dtype = dtypeFromType(t.getValue());
      if (dtype == pb::DTYPE_UNSPECIFIED)
        return op->emitError() << "attribute '" << name.getValue() << "' has unsupported type "
                               << t.getValue();
      encoded.set_dtype(dtype);
    } else if (isa<ElementsAttr>(attr))
      continue; // constant payloads travel as tensor data, not attributes
    else
      return op->emitError() << "attribute '" << name.getValue()
                             << "' has no bundle encoding: " << attr;
    (*inst.mutable_attrs())[name.str()] = std::move(encoded);
  }
  return success();
}

std::vector<uint8_t> mlir::forge::elementsToBytes(ElementsAttr value) {
  auto type = cast<ShapedType>(value.getType());
  int64_t n = type.getNumElements();
  Type element = type.getElementType();
  if (element.isInteger(1)) {
    std::vector<uint8_t> out;
    out.reserve(n);
    for (bool b : value.getValues<bool>())
      out.push_back(b ? 1 : 0);
    return out;
  }
  auto dense = dyn_cast<DenseElementsAttr>(value);
  size_t width = (element.getIntOrFloatBitWidth() + 7) / 8;
  std::vector<uint8_t> out(n * width);
  if (dense) {
    ArrayRef<char> raw = dense.getRawData();
    if (dense.isSplat()) {
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(out.data() + i * width, raw.data(), width);
    } else {
      std::memcpy(out.data(), raw.data(), out.size());
    }
    return out;
  }
  // Resource or other elements attrs: go through APInt/APFloat values.
  int64_t i = 0;
  if (isa<FloatType>(element)) {
    for (APFloat v : value.getValues<APFloat>()) {
      APInt bits = v.bitcastToAPInt();
      std::memcpy(out.data() + (i++) * width, bits.getRawData(), width);
    }
  } else {
    for (APInt v : value.getValues<APInt>())
      std::memcpy(out.data() + (i++) * width, v.getRawData(), width);
  }
  return out;
}

DenseElementsAttr mlir::forge::elementsFromBytes(RankedTensorType type, ArrayRef<uint8_t> bytes) {
  if (type.getElementType().isInteger(1)) {
    SmallVector<bool> values(bytes.begin(), bytes.end());
    return DenseElementsAttr::get(type, values);
  }
  return DenseElementsAttr::getFromRawBuffer(
      type, ArrayRef<char>(reinterpret_cast<const char *>(bytes.data()), bytes.size()));
}

namespace {
FailureOr<SmallVector<DenseElementsAttr>> evaluate(Operation *op, ArrayRef<Attribute> operands,
                                                   bool emitErrors) {
  auto fail = [&](const Twine &msg) -> FailureOr<SmallVector<DenseElementsAttr>> {
    if (emitErrors)
      op->emitError() << msg;
    return failure();
  };
  pb::Instruction inst;
  if (failed(encodeInstruction(op, inst)))
    return failure();
  if (!::forge::rt::findCpuKernel(inst.op()))
    return fail("no CPU kernel to evaluate '" + inst.op() + "'");

  auto toShape = [](ShapedType t) { return std::vector<int64_t>(t.getShape().begin(), t.getShape().end()); };
  std::vector<std::vector<uint8_t>> inputBytes(operands.size());
  std::vector<::forge::rt::TensorView> inputs(operands.size());
  for (auto [i, attr] : llvm::enumerate(operands)) {
    if (!attr)
      continue; // absent optional operand
    auto elements = dyn_cast<ElementsAttr>(attr);
    if (!elements)
      return fail("operand is not a constant tensor");
    auto type = cast<ShapedType>(elements.getType());
    inputBytes[i] = elementsToBytes(elements);
    inputs[i] = {inputBytes[i].data(), dtypeFromType(type.getElementType()), toShape(type)};
  }
  std::vector<std::vector<uint8_t>> outputBytes(op->getNumResults());
  std::vector<::forge::rt::TensorView> outputs(op->getNumResults());
  for (auto [i, result] : llvm::enumerate(op->getResults())) {
    auto type = cast<RankedTensorType>(result.getType());
    pb::DType dtype = dtypeFromType(type.getElementType());
    outputBytes[i].assign(type.getNumElements() * ::forge::rt::dtypeSize(dtype), 0);
    outputs[i] = {outputBytes[i].data(), dtype, toShape(type)};
  }
  static ::forge::rt::ThreadPool pool(1);
  ::forge::rt::Status status = ::forge::rt::runCpuKernel(inst, inputs, outputs, pool);
  if (!status.isOk())
    return fail("constant evaluation failed: " + status.message());
  SmallVector<DenseElementsAttr> results;
  for (auto [i, result] : llvm::enumerate(op->getResults()))
    results.push_back(elementsFromBytes(cast<RankedTensorType>(result.getType()), outputBytes[i]));
  return results;
}
} // namespace

FailureOr<SmallVector<DenseElementsAttr>>
mlir::forge::evaluateOnConstants(Operation *op, ArrayRef<Attribute> operands, bool emitErrors) {
  // The operands' and results' bytes are host buffers: a result too large for
  // this machine is an ordinary failure (left for run time), not an abort or
  // the kernel's OOM killer (Linux overcommits, so bad_alloc alone is not enough).
  double bytes = 0;
  for (Type t : op->getResultTypes())
    if (auto type = dyn_cast<RankedTensorType>(t); type && type.hasStaticShape())
      bytes += double(type.getNumElements()) *
               double(std::max(1u, type.getElementType().getIntOrFloatBitWidth() / 8));
  long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && pageSize > 0 && bytes > 0.5 * double(pages) * double(pageSize)) {
    if (emitErrors)
      op->emitError() << "constant evaluation would need " << bytes
                      << " bytes, more than half of this machine's memory";
    return failure();
  }
  try {
    return evaluate(op, operands, emitErrors);
  } catch (const std::bad_alloc &) {
    if (emitErrors)
      op->emitError("constant evaluation needs more memory than this machine can allocate");
    return failure();
  } catch (const std::length_error &) {
    if (emitErrors)
      op->emitError("constant evaluation needs more memory than this machine can allocate");
    return failure();
  }
}
