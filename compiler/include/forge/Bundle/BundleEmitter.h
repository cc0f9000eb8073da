//===- BundleEmitter.h - forge IR -> .forge bundle -------------------------===//
//
// Turns every function of the module into a routine of a runtime Program
// (`@main` becomes "forward"; docs/bundle-format.md): one tensor per SSA value
// (inputs, outputs, intermediates in the arena, constants in a data section),
// one instruction per forge op in program order, and a static memory plan per
// routine (liveness-based first-fit offsets, 64-byte aligned, one shared arena).
// Function arguments with `forge.kind = "parameter"|"state"` become persistent
// tensors shared by name across routines (initial value `forge.initial_value`);
// a result with `forge.updates = NAME` is written into that persistent tensor,
// in place when no later instruction reads the old value, else by a copy.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_BUNDLE_BUNDLEEMITTER_H
#define FORGE_BUNDLE_BUNDLEEMITTER_H

#include <map>
#include <string>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/Timing.h"

namespace forge::rt {
class BundleWriter;
}

namespace mlir::forge {

struct BundleEmitOptions {
  std::string target = "cpu"; // or cuda:sm_80|sm_89|sm_90
  /// CUDA targets: write every generated kernel to DIR/kernels/ when set.
  std::string kernelDumpDir;
  std::string sourceHash;
  std::map<std::string, std::string> buildOptions;
  /// forgec --mlir-timing: the kernels' lowering and ptxas are nested here.
  TimingScope *timing = nullptr;
};

LogicalResult emitBundle(ModuleOp module, const BundleEmitOptions &options,
                         ::forge::rt::BundleWriter &writer);

} // namespace mlir::forge

#endif // FORGE_BUNDLE_BUNDLEEMITTER_H
