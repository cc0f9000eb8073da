//===- ForgeInterfaces.td - op interfaces of the forge dialect ------------===//
#ifndef FORGE_DIALECT_FORGEINTERFACES_TD
#define FORGE_DIALECT_FORGEINTERFACES_TD

include "mlir/IR/OpBase.td"

//===----------------------------------------------------------------------===//
// Interfaces
//===----------------------------------------------------------------------===//

def Forge_OpInterface : OpInterface<"ForgeOpInterface"> {
  let cppNamespace = "::mlir::forge";
  let description = [{
    Static facts of a forge op (ONNX origin, fusion and precision class) and its
    cost model. Implemented by every op through `Forge_Op`.
  }];
  let methods = [
    StaticInterfaceMethod<"Comma-separated ONNX op types imported into this op",
      "::llvm::StringRef", "getOnnxOpTypes", (ins), [{ return ConcreteOp::kOnnxOpTypes; }]>,
    StaticInterfaceMethod<"Lowest ONNX opset whose semantics the import handles",
      "int", "getOnnxOpsetMin", (ins), [{ return ConcreteOp::kOpsetMin; }]>,
    StaticInterfaceMethod<"Highest ONNX opset whose semantics the import handles",
      "int", "getOnnxOpsetMax", (ins), [{ return ConcreteOp::kOpsetMax; }]>,
    StaticInterfaceMethod<"How the fusion passes may group this op",
      "::mlir::forge::FusionClass", "getFusionClass", (ins),
      [{ return ConcreteOp::kFusionClass; }]>,
    StaticInterfaceMethod<"Which precision precision assignment may give this op",
      "::mlir::forge::PrecisionClass", "getPrecisionClass", (ins),
      [{ return ConcreteOp::kPrecisionClass; }]>,
    InterfaceMethod<"FLOPs and bytes moved by one execution of this op",
      "::mlir::forge::OpCost", "getCost", (ins), [{}],
      [{
        // Ops with a cost model of their own (matmul, conv, ...) define computeCost().
        if constexpr (requires(ConcreteOp op) { op.computeCost(); })
          return $_op.computeCost();
        else
          return ::mlir::forge::estimateDefaultCost($_op.getOperation(),
                                                    ConcreteOp::kFlopsPerElement);
      }]>,
  ];
}

def Forge_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mlir::forge";
  let description = [{
    Reverse-mode gradient hook (DESIGN.md §4 "Training graph").

    `isDifferentiable` is false for ops with no gradient at all (integer or
    boolean results, masks, indices, constants): autodiff treats their results
    as constants, and `buildGradient` on them appends one null per operand.
    Differentiable ops define `buildGradientRule` (declared for every op with
    the `diff` bit by `Forge_Op`; the rules live in compiler/lib/Autodiff, so a
    differentiable op without a rule fails to link).

    Contract of `buildGradient(builder, resultGrads, operandGrads)`:
      * `resultGrads` has exactly one entry per result; an entry is either null
        (that result does not reach the loss: treated as zero) or a value of
        exactly the result's type.
      * It appends exactly one entry per operand, in operand order (an absent
        optional operand is not an operand and gets no entry). An entry is
        null where no gradient flows: integer/boolean operands (indices,
        conditions, targets), operands the op treats as constants (batch_norm
        mean/var, nll_loss weight), or a structurally zero gradient. A non-null
        entry has exactly the operand's type (broadcast operands are summed
        back to their own shape).
      * When every result gradient is null, or no result or no operand has a
        float element type, it appends nulls and creates nothing.
      * Ops are created at the builder's insertion point, which the caller
        sets (after the forward op, and before every use of the gradients);
        they are forge ops only and carry the forward op's location. Rules
        never create ops for operands that get no gradient; gradients nobody
        uses are removed by DCE, and unused outputs of the fused backward ops
        (layer_norm_grad, ...) by their canonicalization.
      * Non-smooth points follow one documented convention per op (ties of
        min/max go to the lhs, reduce_max/min split ties evenly, relu/clip
        kinks get the gradient of the inside branch, see the rules).
    Violations of the contract by a rule are reported as errors on the op.
  }];
  let methods = [
    StaticInterfaceMethod<"Whether gradients flow through this op",
      "bool", "isDifferentiable", (ins), [{ return ConcreteOp::kDifferentiable; }]>,
    InterfaceMethod<"Emit the gradient of every operand (see the contract above)",
      "::llvm::LogicalResult", "buildGradient",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::ValueRange":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads), [{}],
      [{
        if constexpr (ConcreteOp::kDifferentiable)
          return ::mlir::forge::runGradientRule(
              $_op.getOperation(), resultGrads, operandGrads, [&]() {
                return $_op.buildGradientRule(builder, resultGrads, operandGrads);
              });
        else
          return ::mlir::forge::runGradientRule($_op.getOperation(), resultGrads,
                                                operandGrads, nullptr);
      }]>,
  ];
}

#endif // FORGE_DIALECT_FORGEINTERFACES_TD
