//===- ImportContext.h - state shared by the ONNX graph walker and op rules ===//
//
// Private to compiler/lib/Import. One NodeImporter per ONNX node gives the op
// rules (OnnxOps.cpp) typed access to inputs, attributes with their ONNX
// defaults, known-constant inputs, and a checked op builder that folds ops
// whose operands are all constants.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_IMPORT_IMPORTCONTEXT_H
#define FORGE_IMPORT_IMPORTCONTEXT_H

#include "forge/Dialect/ForgeDialect.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

#include <onnx/onnx_pb.h>

#include <functional>
#include <optional>

namespace mlir::forge::onnx_import {

/// Graph-wide value table.
struct GraphState {
  llvm::StringMap<Value> values;
  /// ImportOptions::keepFloatInitializers: create() does not fold ops that
  /// read a float initializer.
  bool keepFloatInitializers = false;
  /// ImportOptions::untieSharedInitializers: Identity(float initializer)
  /// imports as a copy of the initializer under the Identity output's name;
  /// `untied` lists (that name, the shared initializer's name).
  bool untieSharedInitializers = false;
  std::vector<std::pair<std::string, std::string>> untied;
  /// ImportOptions::maxFoldElements, and what was left unfolded because of
  /// it ("node 'name' (Op, N elements)"), for one warning after the import.
  int64_t maxFoldElements = kMaxFoldElements;
  std::vector<std::string> notFolded;
};

class NodeImporter {
public:
  NodeImporter(OpBuilder &builder, GraphState &graph, const onnx::NodeProto &node,
               int64_t opset, Location loc)
      : b(builder), graph(graph), node(node), opset(opset), loc(loc) {}

  OpBuilder &b;
  GraphState &graph;
  const onnx::NodeProto &node;
  int64_t opset;
  Location loc;

  // Inputs.
  int64_t numInputs() const { return node.input_size(); }
  /// Input `i`, or null when absent (index past the end or empty name).
  Value input(int64_t i) const;
  RankedTensorType inputType(int64_t i) const;
  /// The constant value of input `i` if it is known at import time.
  DenseElementsAttr constantInput(int64_t i) const;
  /// Constant input `i` as integers; error naming the input when not constant.
  FailureOr<SmallVector<int64_t>> constantInts(int64_t i, StringRef what);
  FailureOr<double> constantScalar(int64_t i, StringRef what);

  // Outputs.
  int64_t numOutputs() const { return node.output_size(); }
  bool outputUsed(int64_t i) const { return i < node.output_size() && !node.output(i).empty(); }
  LogicalResult setOutput(int64_t i, Value v);

  // Attributes with ONNX defaults.
  const onnx::AttributeProto *attr(StringRef name) const;
  int64_t intAttr(StringRef name, int64_t def) const;
  double floatAttr(StringRef name, double def) const;
  std::string stringAttr(StringRef name, StringRef def) const;
  std::optional<SmallVector<int64_t>> intsAttr(StringRef name) const;

  /// Error on this node (names op type, node name and opset).
  InFlightDiagnostic error();

  /// Builds forge op `name` with `operands` (null = absent optional) and
  /// inherent attributes; validates type inference and the verifier (errors
  /// point at this node), and folds to a constant when every operand is one
  /// (unless one is a float initializer and GraphState::keepFloatInitializers).
  FailureOr<SmallVector<Value>> create(StringRef opName, ArrayRef<Value> operands,
                                       ArrayRef<NamedAttribute> attrs = {});
  FailureOr<Value> create1(StringRef opName, ArrayRef<Value> operands,
                           ArrayRef<NamedAttribute> attrs = {}) {
    auto results = create(opName, operands, attrs);
    if (failed(results))
      return failure();
    return (*results)[0];
  }
  Value constant(DenseElementsAttr value);
  /// Scalar (rank-0) constant of `element` type.
  Value scalar(Type element, double value);

  NamedAttribute named(StringRef name, Attribute value) { return b.getNamedAttr(name, value); }
  NamedAttribute i64(StringRef name, int64_t v) { return named(name, b.getI64IntegerAttr(v)); }
  NamedAttribute f64(StringRef name, double v) { return named(name, b.getF64FloatAttr(v)); }
  NamedAttribute flag(StringRef name, bool v) { return named(name, b.getBoolAttr(v)); }
  NamedAttribute str(StringRef name, StringRef v) { return named(name, b.getStringAttr(v)); }
  NamedAttribute ints(StringRef name, ArrayRef<int64_t> v) {
    return named(name, b.getDenseI64ArrayAttr(v));
  }

  // Frequently used shape helpers.
  FailureOr<Value> reshape(Value v, ArrayRef<int64_t> shape);
  FailureOr<Value> transpose(Value v, ArrayRef<int64_t> perm);
  FailureOr<Value> cast(Value v, Type element);
};

using OpRule = std::function<LogicalResult(NodeImporter &)>;

/// Normalizes an axis into [0, rank); fails with a node error when out of range.
FailureOr<int64_t> normAxis(NodeImporter &n, int64_t axis, int64_t rank);
/// The axes of a reduction-like op: input `inputIndex` (a constant) when
/// present, else the `axes` attribute, else none.
FailureOr<std::optional<SmallVector<int64_t>>> axesOf(NodeImporter &n, int64_t inputIndex);
/// Axes normalized into [0, rank), sorted; repeated axes are an error.
FailureOr<SmallVector<int64_t>> normAxes(NodeImporter &n, ArrayRef<int64_t> axes, int64_t rank);

/// Explicit begin-then-end pads of a sliding-window op from ONNX's auto_pad / pads.
FailureOr<SmallVector<int64_t>> resolvePads(NodeImporter &n, ArrayRef<int64_t> inSpatial,
                                            ArrayRef<int64_t> kernel, ArrayRef<int64_t> strides,
                                            ArrayRef<int64_t> dilations);
/// The ints attribute `name`, or `count` copies of `def` when absent or empty.
SmallVector<int64_t> intsOr(NodeImporter &n, StringRef name, size_t count, int64_t def);

/// A sliding window's geometry from kernel_shape, strides, dilations and the
/// resolved pads (the node's input 0 is the N-d input, rank >= 3).
struct PoolWindow {
  SmallVector<int64_t> kernel, strides, dilations, pads;
};
FailureOr<PoolWindow> poolWindow(NodeImporter &n);
/// MaxPool's Indices output (OnnxComposite.cpp) for the values of type `pooled`.
LogicalResult importMaxPoolIndices(NodeImporter &n, const PoolWindow &w,
                                   RankedTensorType pooled);

/// Ops imported as compositions of forge primitives (OnnxComposite.cpp): their
/// gradients come from the primitives' rules.
void addCompositeRules(llvm::StringMap<OpRule> &rules);
/// LSTM, GRU and RNN unrolled over the sequence (OnnxRecurrent.cpp).
void addRecurrentRules(llvm::StringMap<OpRule> &rules);

/// Rules for the default ONNX domain, keyed by op type.
const llvm::StringMap<OpRule> &onnxOpRules();

/// Converts an ONNX tensor element type; null if unsupported.
Type elementTypeFromOnnx(MLIRContext *ctx, int32_t onnxType);
const char *onnxTypeName(int32_t onnxType);

/// Decodes a TensorProto (raw, typed fields or external data) into a constant.
/// Where a float initializer's bytes live, for a thin bundle (ImportOptions::externalWeights).
struct ExternalRef {
  std::string location;
  uint64_t offset = 0, length = 0;
  int64_t crc32 = -1; // -1: the data file was not there to hash
};

/// With `thin` set, a float tensor in external data is not read: it imports
/// as zeros and `thin` receives where its bytes are (hashed when present).
FailureOr<DenseElementsAttr> tensorFromProto(MLIRContext *ctx, const onnx::TensorProto &tensor,
                                             const std::string &externalDir,
                                             function_ref<InFlightDiagnostic()> emitError,
                                             ExternalRef *thin = nullptr);

} // namespace mlir::forge::onnx_import

#endif // FORGE_IMPORT_IMPORTCONTEXT_H
