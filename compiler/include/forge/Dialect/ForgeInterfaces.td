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
    Reverse-mode gradient hook. `isDifferentiable` is false for ops that have no
    gradient (integer/boolean results, shape ops on indices): autodiff treats
    their results as constants. `buildGradient` receives one gradient per
    result (null where the result does not reach the loss) and appends one
    gradient per operand (null where none flows).
  }];
  let methods = [
    StaticInterfaceMethod<"Whether gradients flow through this op",
      "bool", "isDifferentiable", (ins), [{ return ConcreteOp::kDifferentiable; }]>,
    InterfaceMethod<"Emit the gradient of every operand",
      "::llvm::LogicalResult", "buildGradient",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::ValueRange":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads), [{}],
      [{
        // Rules live in compiler/lib/Autodiff as ConcreteOp::buildGradientRule.
        if constexpr (requires { &ConcreteOp::buildGradientRule; })
          return $_op.buildGradientRule(builder, resultGrads, operandGrads);
        else
          return ::mlir::forge::gradientRuleMissing($_op.getOperation());
      }]>,
  ];
}

#endif // FORGE_DIALECT_FORGEINTERFACES_TD
