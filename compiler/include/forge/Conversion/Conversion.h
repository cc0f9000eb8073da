//===- Conversion.h - forge IR <-> runtime bundle representations ---------===//
//
// The bridge between the dialect and the runtime's Program format: element
// types, attribute encoding (the contract documented in runtime Kernels.h),
// dense constants as raw little-endian bytes (booleans one byte each), and
// evaluation of an op on constant operands through the runtime's CPU kernels
// (which makes every op foldable without a second implementation).
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_CONVERSION_CONVERSION_H
#define FORGE_CONVERSION_CONVERSION_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"

#include "program.pb.h"

namespace mlir::forge {

/// Runtime element type of `type`; DTYPE_UNSPECIFIED if it has none.
::forge::bundle::DType dtypeFromType(Type type);

/// Fills `inst.op` and `inst.attrs` from a forge op's inherent attributes.
LogicalResult encodeInstruction(Operation *op, ::forge::bundle::Instruction &inst);

/// Dense bytes of a constant in runtime layout.
std::vector<uint8_t> elementsToBytes(ElementsAttr value);
/// A dense constant of `type` from runtime-layout bytes (size must match).
DenseElementsAttr elementsFromBytes(RankedTensorType type, ArrayRef<uint8_t> bytes);

/// Runs `op` on constant operands (null for an absent optional operand) with
/// the CPU kernels; returns one constant per result, or failure (with a
/// diagnostic on `op` when `emitErrors`).
FailureOr<SmallVector<DenseElementsAttr>> evaluateOnConstants(Operation *op,
                                                              ArrayRef<Attribute> operands,
                                                              bool emitErrors = false);

} // namespace mlir::forge

#endif // FORGE_CONVERSION_CONVERSION_H
