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

} // namespace mlir::forge

#endif // FORGE_PASSES_PASSES_H
