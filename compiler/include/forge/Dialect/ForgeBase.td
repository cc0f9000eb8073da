//===- ForgeBase.td - forge dialect, interfaces and op base classes -------===//
//
// The forge dialect is Forge's single op table (DESIGN.md §4). Every op carries,
// through the base class `Forge_Op`, the facts every later stage needs:
//   * the ONNX op types it imports from and the opset range it is checked against,
//   * its fusion class and precision class,
//   * whether it is differentiable (`diff`; ops that are not say so explicitly).
//     A differentiable op gets a `buildGradientRule` declaration here, defined
//     in compiler/lib/Autodiff, so an op without a rule fails to link;
//   * type inference (InferTypeOpAdaptor) and a cost model (FLOPs, bytes).
// tests/unit/compiler/DialectTableTest.cpp enumerates the dialect and fails if any op
// lacks one of these.
//
//===----------------------------------------------------------------------===//

#ifndef FORGE_DIALECT_FORGEBASE_TD
#define FORGE_DIALECT_FORGEBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Forge_Dialect : Dialect {
  let name = "forge";
  let cppNamespace = "::mlir::forge";
  let summary = "Forge training-graph dialect";
  let description = [{
    Tensor-level ops imported from ONNX (normalized: constant inputs become
    attributes, defaults are filled in, shapes are static), plus the ops the
    training graph adds. Each op is the unit of gradient rules, cost model,
    fusion and precision assignment.
  }];
  let hasConstantMaterializer = 1;
}

include "forge/Dialect/ForgeInterfaces.td"

//===----------------------------------------------------------------------===//
// Op base classes
//===----------------------------------------------------------------------===//

// Fusion classes (C++ enum ::mlir::forge::FusionClass).
defvar FusionElementwise = "Elementwise";
defvar FusionReduction = "Reduction";
defvar FusionLibrary = "Library";
defvar FusionOpaque = "Opaque";
defvar FusionShape = "Shape";
// Precision classes (C++ enum ::mlir::forge::PrecisionClass).
defvar PrecisionTensorCore = "TensorCore";
defvar PrecisionKeepFP32 = "KeepFP32";
defvar PrecisionFollowsInput = "FollowsInput";

// `onnx`: ONNX op types imported into this op; `fusion`/`precision`: classes above;
// `diff`: whether the op has a gradient rule (backward ops have diff = 0).
class Forge_Op<string mnemonic, string onnx, string fusion, string precision,
               bit diff, list<Trait> traits = []>
    : Op<Forge_Dialect, mnemonic,
         !listconcat(traits, [Pure, InferTypeOpAdaptor,
                              DeclareOpInterfaceMethods<Forge_OpInterface>,
                              DeclareOpInterfaceMethods<Forge_DifferentiableOpInterface>])> {
  int opsetMin = 13;
  int opsetMax = 21;
  // Cost model: FLOPs per result element for the default estimate.
  int flopsPerElement = 1;
  // Extra C++ declarations of a concrete op (appended after the table facts).
  code extraDecl = "";
  let extraClassDeclaration = [{
    static constexpr ::llvm::StringLiteral kOnnxOpTypes = "}] # onnx # [{";
    static constexpr int kOpsetMin = }] # opsetMin # [{;
    static constexpr int kOpsetMax = }] # opsetMax # [{;
    static constexpr int64_t kFlopsPerElement = }] # flopsPerElement # [{;
    static constexpr ::mlir::forge::FusionClass kFusionClass =
        ::mlir::forge::FusionClass::}] # fusion # [{;
    static constexpr ::mlir::forge::PrecisionClass kPrecisionClass =
        ::mlir::forge::PrecisionClass::}] # precision # [{;
    static constexpr bool kDifferentiable = }] # !if(diff, "true", "false") # [{;
    /// A float result may be stored in another float type than the inferred
    /// one (forge-assign-precision): the op computes as inferred and its
    /// store converts. Shapes and every other element type must match.
    static bool isCompatibleReturnTypes(::mlir::TypeRange inferred, ::mlir::TypeRange actual) {
      return ::mlir::forge::isStorageCompatible(inferred, actual);
    }
  }] # !if(diff, [{
    /// The reverse-mode rule (compiler/lib/Autodiff); call it through
    /// DifferentiableOpInterface::buildGradient, which checks the contract.
    ::llvm::LogicalResult buildGradientRule(::mlir::OpBuilder &builder,
        ::mlir::ValueRange resultGrads, ::llvm::SmallVectorImpl<::mlir::Value> &operandGrads);
  }], "") # extraDecl;
}

defvar AnyForgeTensor = AnyRankedTensor;

#endif // FORGE_DIALECT_FORGEBASE_TD
