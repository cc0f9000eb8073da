//===- Passes.h - Forge graph passes -------------------------------------===//
#ifndef FORGE_PASSES_PASSES_H
#define FORGE_PASSES_PASSES_H

#include "forge/Dialect/ForgeDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::forge {

#define GEN_PASS_DECL
#include "Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Passes.h.inc"

/// Whether every operand and result of `op` is a static f32 tensor with
/// elements: what the GPU libraries' calls take (cuBLASLt refuses k = 0, and
/// an op whose results are empty is a zero-byte copy). forge-select-library
/// marks only such ops; forge-fuse forms GEMM epilogue regions only of them.
bool isStaticNonEmptyF32(Operation *op);

} // namespace mlir::forge

#endif // FORGE_PASSES_PASSES_H
