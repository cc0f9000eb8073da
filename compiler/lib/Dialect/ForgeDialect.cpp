//===- ForgeDialect.cpp - dialect registration and shared op helpers -------===//
#include "forge/Dialect/ForgeDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace mlir::forge;

#include "forge/Dialect/ForgeDialect.cpp.inc"
#include "forge/Dialect/ForgeInterfaces.cpp.inc"

void ForgeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "forge/Dialect/ForgeOps.cpp.inc"
      >();
}

Operation *ForgeDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                             Type type, Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return builder.create<ConstantOp>(loc, elements);
}

StringRef mlir::forge::stringifyFusionClass(FusionClass c) {
  switch (c) {
  case FusionClass::Elementwise: return "elementwise";
  case FusionClass::Reduction: return "reduction";
  case FusionClass::Library: return "library";
  case FusionClass::Opaque: return "opaque";
  case FusionClass::Shape: return "shape";
  }
  llvm_unreachable("unknown fusion class");
}

StringRef mlir::forge::stringifyPrecisionClass(PrecisionClass c) {
  switch (c) {
  case PrecisionClass::TensorCore: return "tensor-core";
  case PrecisionClass::KeepFP32: return "keep-fp32";
  case PrecisionClass::FollowsInput: return "follows-input";
  }
  llvm_unreachable("unknown precision class");
}

static int64_t tensorBytes(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape())
    return 0;
  int64_t bits = tensor.getElementType().getIntOrFloatBitWidth();
  return tensor.getNumElements() * std::max<int64_t>(bits, 8) / 8;
}

OpCost mlir::forge::estimateDefaultCost(Operation *op, int64_t flopsPerElement) {
  OpCost cost;
  for (Type t : op->getOperandTypes())
    cost.bytes += tensorBytes(t);
  for (Type t : op->getResultTypes()) {
    cost.bytes += tensorBytes(t);
    if (auto tensor = dyn_cast<RankedTensorType>(t); tensor && tensor.hasStaticShape())
      cost.flops += flopsPerElement * tensor.getNumElements();
  }
  // A reduction's zero_outputs (forge-elide-centred-sums): the input's share of those
  // outputs is not read.
  if (auto zero = op->getAttrOfType<DenseI64ArrayAttr>("zero_outputs");
      zero && zero.size() == 2 && op->getNumOperands() == 1 && op->getNumResults() == 1) {
    auto result = dyn_cast<RankedTensorType>(op->getResult(0).getType());
    if (result && result.hasStaticShape() && result.getNumElements() > 0)
      cost.bytes -=
          tensorBytes(op->getOperand(0).getType()) * (zero[1] - zero[0]) / result.getNumElements();
  }
  return cost;
}

static bool hasFloatElements(Type t) {
  auto tensor = dyn_cast<RankedTensorType>(t);
  return tensor && isa<FloatType>(tensor.getElementType());
}

LogicalResult mlir::forge::runGradientRule(Operation *op, ValueRange resultGrads,
                                           SmallVectorImpl<Value> &operandGrads,
                                           llvm::function_ref<LogicalResult()> rule) {
  if (resultGrads.size() != op->getNumResults())
    return op->emitError() << "buildGradient got " << resultGrads.size()
                           << " result gradients for " << op->getNumResults() << " results";
  bool anyGrad = false;
  for (auto [i, g] : llvm::enumerate(resultGrads)) {
    if (!g)
      continue;
    if (g.getType() != op->getResult(i).getType())
      return op->emitError() << "gradient of result " << i << " has type " << g.getType()
                             << ", expected " << op->getResult(i).getType();
    anyGrad = true;
  }
  // Nothing can flow: no rule, no incoming gradient, or integer-only math
  // (shape arithmetic on i64 uses the same ops as float math).
  bool floatResult = llvm::any_of(op->getResultTypes(), hasFloatElements);
  bool floatOperand = llvm::any_of(op->getOperandTypes(), hasFloatElements);
  size_t first = operandGrads.size();
  if (!rule || !anyGrad || !floatResult || !floatOperand) {
    operandGrads.append(op->getNumOperands(), Value());
    return success();
  }
  if (failed(rule()))
    return failure();
  if (operandGrads.size() - first != op->getNumOperands())
    return op->emitError() << "internal: gradient rule produced " << operandGrads.size() - first
                           << " gradients for " << op->getNumOperands() << " operands";
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    Value g = operandGrads[first + i];
    if (!g)
      continue;
    Type expected = op->getOperand(i).getType();
    if (!hasFloatElements(expected) || g.getType() != expected)
      return op->emitError() << "internal: gradient of operand " << i << " has type "
                             << g.getType() << ", expected " << expected
                             << (hasFloatElements(expected) ? "" : " to get no gradient");
  }
  return success();
}

FailureOr<Operation *> mlir::forge::buildForgeOp(OpBuilder &builder, Location loc, StringRef name,
                                                 ValueRange operands,
                                                 ArrayRef<NamedAttribute> attrs,
                                                 function_ref<InFlightDiagnostic()> emitError) {
  MLIRContext *ctx = builder.getContext();
  std::string fullName = ("forge." + name).str();
  std::optional<RegisteredOperationName> info = RegisteredOperationName::lookup(fullName, ctx);
  if (!info)
    return emitError() << "internal: no op " << fullName;
  DictionaryAttr dict = DictionaryAttr::get(ctx, attrs);
  SmallVector<Type> types;
  {
    // Properties hold the inherent attributes; fill them from the dictionary
    // first so inference sees them (as OperationState does on creation).
    int bytes = info->getOpPropertyByteSize();
    std::vector<std::max_align_t> storage((bytes + sizeof(std::max_align_t) - 1) /
                                              sizeof(std::max_align_t) + 1);
    OpaqueProperties props(bytes > 0 ? storage.data() : nullptr);
    if (bytes > 0)
      info->initOpProperties(props, nullptr);
    LogicalResult ok =
        bytes > 0 ? info->setOpPropertiesFromAttribute(*info, props, dict, emitError) : success();
    auto infer = info->getInterface<InferTypeOpInterface>();
    if (succeeded(ok))
      ok = infer ? infer->inferReturnTypes(ctx, loc, operands, dict, props, {}, types) : failure();
    if (bytes > 0)
      info->destroyOpProperties(props);
    if (failed(ok))
      return emitError() << "cannot build " << fullName;
  }
  OperationState state(loc, *info);
  state.addOperands(operands);
  state.addAttributes(attrs);
  state.addTypes(types);
  Operation *op = builder.create(state);
  if (failed(verify(op))) {
    op->erase();
    return emitError() << fullName << " failed verification";
  }
  return op;
}
