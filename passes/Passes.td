//===- Passes.td - Forge graph passes ------------------------------------===//
//
// One pass per file in passes/, named after the verb; the flag is
// `--forge-<name>`. Each description is what `forge-opt --help` shows.
// The pipeline order is fixed in compiler/lib/Pipeline/Pipeline.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_PASSES_TD
#define FORGE_PASSES_TD

include "mlir/Pass/PassBase.td"

def FoldConstants : Pass<"forge-fold-constants", "::mlir::func::FuncOp"> {
  let summary = "Evaluate forge ops whose operands are all constants";
  let description = [{
    Replaces every forge op whose operands are all `forge.constant` with the
    constants it computes, evaluated by the runtime's CPU kernels (so every op
    folds with the exact semantics it has at run time). Results larger than
    `max-elements` are left alone so that folding never bloats a bundle (for
    example a broadcast of a scalar into a large tensor). Parameters (constants
    tagged `forge.initializer`) fold like any constant in inference graphs; the
    training pipeline runs this pass only after parameters became arguments.
  }];
  let options = [
    Option<"maxElements", "max-elements", "int64_t", /*default=*/"1 << 22",
           "Largest result (in elements) that folding may materialize">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def EliminateDeadCode : Pass<"forge-eliminate-dead-code", "::mlir::func::FuncOp"> {
  let summary = "Erase side-effect-free ops whose results are unused";
  let description = [{
    Walks the function backwards and erases every op that has no memory
    effects and no remaining uses, so chains of dead ops vanish in one sweep.
    Ops with side effects and terminators are kept.
  }];
}

#endif // FORGE_PASSES_TD
