//===- ForgeDialect.h - the forge dialect, its interfaces and ops ----------===//
//
// Include this (an MLIR-heavy header) only from compiler/, passes/ and tools.
// The runtime never includes it.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_DIALECT_FORGEDIALECT_H
#define FORGE_DIALECT_FORGEDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace mlir::forge {

/// The most elements a compile-time constant may get from folding (import,
/// folders, forge-fold-constants' default): larger results stay ops.
inline constexpr int64_t kMaxFoldElements = int64_t(1) << 22;

/// How fusion passes may group an op. Elementwise means pointwise: result
/// element i is a function of the operands' elements at i (NumPy broadcasting)
/// and nothing else, so a loop fusion region evaluates it per element.
enum class FusionClass { Elementwise, Reduction, Library, Opaque, Shape };
/// Which precision `forge-assign-precision` may give an op.
enum class PrecisionClass { TensorCore, KeepFP32, FollowsInput };

llvm::StringRef stringifyFusionClass(FusionClass c);
llvm::StringRef stringifyPrecisionClass(PrecisionClass c);

/// Cost of one execution: arithmetic and the fewest bytes moved (each operand
/// read once, each result written once).
struct OpCost {
  int64_t flops = 0;
  int64_t bytes = 0;
};

/// Default estimate: `flopsPerElement` per result element, bytes of all
/// operands and results.
OpCost estimateDefaultCost(Operation *op, int64_t flopsPerElement);
/// The checked body of DifferentiableOpInterface::buildGradient: validates
/// `resultGrads`, appends nulls without calling `rule` when nothing can flow
/// (null `rule` = not differentiable, all result gradients null, or no float
/// result/operand), else runs `rule` and checks what it appended (one entry
/// per operand, each null or of exactly the operand's float type).
LogicalResult runGradientRule(Operation *op, ValueRange resultGrads,
                              SmallVectorImpl<Value> &operandGrads,
                              llvm::function_ref<LogicalResult()> rule);

/// NumPy broadcast of all operand shapes; element type from the first operand
/// unless `resultElement` is given.
LogicalResult inferBroadcastType(std::optional<Location> loc, ValueRange operands,
                                 Type resultElement, SmallVectorImpl<Type> &inferred);
/// Shape after reducing `axes` (keepdims keeps them as 1).
LogicalResult inferReduceType(std::optional<Location> loc, Type input,
                              ArrayRef<int64_t> axes, bool keepdims, Type resultElement,
                              SmallVectorImpl<Type> &inferred);
/// A reduction's `zero_outputs` (absent, or [begin, end) with 0 <= begin < end <= the
/// result's element count).
LogicalResult checkZeroOutputs(std::optional<Location> loc,
                               std::optional<ArrayRef<int64_t>> zeroOutputs, Type result);
/// Creates `forge.<name>` at `builder`'s insertion point with `operands` and
/// inherent `attrs`, inferring result types and verifying the op first. The
/// generated builders abort when inference fails; this reports through
/// `emitError` instead (prefixing "cannot build forge.<name>" or "forge.<name>
/// failed verification") and leaves nothing behind.
FailureOr<Operation *> buildForgeOp(OpBuilder &builder, Location loc, StringRef name,
                                    ValueRange operands, ArrayRef<NamedAttribute> attrs,
                                    function_ref<InFlightDiagnostic()> emitError);
/// Broadcast two shapes; failure if incompatible.
FailureOr<SmallVector<int64_t>> broadcastShapes(ArrayRef<int64_t> a, ArrayRef<int64_t> b);
/// The leading `shape` part of `v` (a forge.slice from 0 with unit steps), or
/// `v` itself when it has that shape.
Value createLeadingSlice(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> shape);
/// softmax, log_softmax, softmax_grad or log_softmax_grad over the innermost
/// axis of a statically shaped tensor: the op a forge.fusion "row" is built around.
bool isInnermostRowOp(Operation *op);

/// Result-type check of every forge op: `actual` equals `inferred`, except
/// that a float tensor may have another float element type (its storage
/// precision, set by forge-assign-precision).
bool isStorageCompatible(TypeRange inferred, TypeRange actual);

/// The ONNX node a location names: a NameLoc's name, or the first name among a
/// FusedLoc's locations (a fusion region, a merged op); empty when none.
/// Reports, costs.txt and the bundle's instruction names all use it.
llvm::StringRef sourceNodeName(Location loc);
inline llvm::StringRef sourceNodeName(Operation *op) { return sourceNodeName(op->getLoc()); }
/// What an op runs, for reports: its name without the dialect, and a fusion
/// region's kind ("gemm", "fusion norm_grad", "attention_grad").
std::string launchKind(Operation *op);

} // namespace mlir::forge

#include "forge/Dialect/ForgeDialect.h.inc"
#include "forge/Dialect/ForgeInterfaces.h.inc"

#define GET_OP_CLASSES
#include "forge/Dialect/ForgeOps.h.inc"

#endif // FORGE_DIALECT_FORGEDIALECT_H
