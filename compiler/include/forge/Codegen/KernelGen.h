//===- KernelGen.h - forge ops -> generated GPU kernels ---------*- C++ -*-===//
//
// Code generation for the CUDA target (../shared/DESIGN.md §5), driven by the pass
// forge-generate-kernels (Passes.h). Every forge op that is neither a library
// call (cuBLASLt, cuDNN: forge-select-library) nor a plain copy gets a kernel,
// written as a `gpu.func` on flat static memrefs (the bare-pointer calling
// convention: one pointer per non-absent input, then one per output) and
// lowered gpu -> NVVM -> PTX in one module. Kernels are shared between ops of
// equal name, attributes and types.
//
// Ops without a generator yet are reported (kernelFor() returns no kernel):
// the pass marks them as host instructions and the CUDA runtime runs the CPU
// kernel on staged copies.
//
// This header is MLIR-light on purpose (forward declarations only): it is
// included by BundleEmitter and forgec.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_CODEGEN_KERNELGEN_H
#define FORGE_CODEGEN_KERNELGEN_H

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "mlir/Support/LogicalResult.h"

namespace mlir {
class MLIRContext;
class ModuleOp;
class Operation;
} // namespace mlir

namespace mlir::forge {

/// `--target cuda:sm_NN` and the occupancy limits of that architecture.
struct CudaTarget {
  std::string chip;            // "sm_90"
  int maxThreadsPerSM = 2048;  // resident threads per SM
  int maxBlocksPerSM = 32;     // resident blocks per SM
  int registersPerSM = 65536;  // 32-bit registers
  int sharedBytesPerSM = 228 * 1024;
  int typicalSMs = 132;        // of the common part (H100/H200; A100 108; L40S 142): sizes splits
};

/// Parses "cuda:sm_80", "cuda:sm_89" or "cuda:sm_90"; std::nullopt otherwise.
std::optional<CudaTarget> parseCudaTarget(llvm::StringRef target);

/// True for ops the CUDA runtime executes as a device-to-device copy.
bool isCopyOp(llvm::StringRef mnemonic);

struct KernelLaunch {
  std::string name;
  int64_t grid = 1, block = 1;
  bool zeroOutputs = false; // accumulates into its outputs with atomics
  /// With zeroOutputs: only these outputs are zeroed (empty: all). A kernel
  /// that writes some outputs whole beside accumulated ones (layer_norm_grad's
  /// dx beside dscale/dbias) spares the memset of the whole ones.
  std::vector<unsigned> zeroOnly;
  bool copyInput = false;   // output 0 starts as a copy of input 0 (scatters update it)
  std::string fault;        // non-empty: reports bad data via the fault word (what it found)
  int64_t sharedBytes = 0;  // dynamic shared memory a block takes (gpu.dynamic_shared_memory)
};

class KernelGenerator {
public:
  KernelGenerator(MLIRContext *context, CudaTarget target);
  ~KernelGenerator();

  /// The kernel that computes `op`, an op or a fusion region (generated on
  /// first use); std::nullopt when it has no generator for its attributes and
  /// types. Library calls are the caller's decision (forge-select-library).
  std::optional<KernelLaunch> kernelFor(Operation *op);
  size_t numKernels() const;

  /// Adds the kernels (`gpu.module @forge_kernels`) to `module`, which
  /// becomes a gpu.container_module; nothing when there are none.
  void moveKernelsInto(ModuleOp module);

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

/// Lowers the kernels that forge-generate-kernels added to `module` into one
/// PTX module (text, no trailing NUL); an empty string when it has none.
FailureOr<std::string> lowerKernelsToPtx(ModuleOp module, const CudaTarget &target);
/// PTX modules made by LLVM from chunks of one kernel module, as one module:
/// one header (all must be equal), every kernel, and each helper function or
/// variable once (libdevice's repeat across chunks; a definition wins over a
/// prototype). Failure on a top-level form it does not know, different
/// headers or a kernel in two parts. lowerKernelsToPtx's merge.
FailureOr<std::string> mergePtxModules(llvm::ArrayRef<std::string> parts);
/// Writes DIR/kernels/NAME.mlir (the kernel before lowering) and
/// DIR/kernels/NAME.ptx for every kernel of `module`.
LogicalResult dumpKernels(ModuleOp module, const CudaTarget &target, llvm::StringRef dir);

/// Assembles `ptx` for `chip` with `ptxas` (PATH, $CUDA_HOME/bin or
/// /usr/local/cuda/bin). Returns the cubin, std::nullopt when no ptxas is
/// found, or failure with ptxas' messages in `error`.
FailureOr<std::optional<std::string>> assemblePtx(llvm::StringRef ptx, llvm::StringRef chip,
                                                  std::string &error);

} // namespace mlir::forge

#endif // FORGE_CODEGEN_KERNELGEN_H
