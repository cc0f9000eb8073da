//===- Passes.h - Forge code generation passes --------------------*- C++ -*-===//
//
// The code generator's passes (Passes.td here). Kept apart
// from KernelGen.h, which stays MLIR-light for the bundle emitter and forgec.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_CODEGEN_PASSES_H
#define FORGE_CODEGEN_PASSES_H

#include "mlir/Pass/Pass.h"

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mlir::forge {

#define GEN_PASS_DECL
#include "forge/Codegen/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "forge/Codegen/Passes.h.inc"

/// The dialects generated kernels are made of, and what lowering them to PTX
/// needs (the NVVM target and the LLVM IR translations): forge-opt parses and
/// prints modules holding kernels with them.
void registerCodegenDialects(DialectRegistry &registry);

} // namespace mlir::forge

#endif // FORGE_CODEGEN_PASSES_H
