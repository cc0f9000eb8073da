//===- BundleEmitter.h - forge IR -> .forge bundle -------------------------===//
//
// Turns the lowered `@main` function into a runtime Program: one tensor per
// SSA value (inputs, outputs, intermediates in the arena, constants in a data
// section), one instruction per forge op in program order, and a static
// memory plan (liveness-based first-fit offsets in one arena, 64-byte aligned).
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_BUNDLE_BUNDLEEMITTER_H
#define FORGE_BUNDLE_BUNDLEEMITTER_H

#include <map>
#include <string>

#include "mlir/IR/BuiltinOps.h"

namespace forge::rt {
class BundleWriter;
}

namespace mlir::forge {

struct BundleEmitOptions {
  std::string target = "cpu";
  std::string sourceHash;
  std::map<std::string, std::string> buildOptions;
};

LogicalResult emitBundle(ModuleOp module, const BundleEmitOptions &options,
                         ::forge::rt::BundleWriter &writer);

} // namespace mlir::forge

#endif // FORGE_BUNDLE_BUNDLEEMITTER_H
