//===- GenerateKernels.cpp - place every op of a CUDA bundle ---------------===//
//
// The placement decisions the bundle emitter used to make, as a pass: after
// it, every op of every function carries where it runs (forge.launch,
// forge.library, forge.placement), and the kernels are IR in the module.
//
//===----------------------------------------------------------------------===//
#include "forge/Codegen/Passes.h"

#include "KernelGenInternal.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"

#include <map>

namespace mlir::forge {
#define GEN_PASS_DEF_GENERATEKERNELS
#include "forge/Codegen/Passes.h.inc"
} // namespace mlir::forge

void mlir::forge::registerCodegenDialects(DialectRegistry &registry) {
  registry.insert<arith::ArithDialect, gpu::GPUDialect, math::MathDialect, memref::MemRefDialect,
                  scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect, NVVM::NVVMDialect>();
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
}

namespace {

DictionaryAttr launchAttr(Builder &b, const KernelLaunch &launch) {
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("kernel", b.getStringAttr(launch.name)),
      b.getNamedAttr("grid", b.getI64IntegerAttr(launch.grid)),
      b.getNamedAttr("block", b.getI64IntegerAttr(launch.block))};
  if (launch.zeroOutputs)
    entries.push_back(b.getNamedAttr("zero_outputs", b.getUnitAttr()));
  if (launch.zeroOutputs && !launch.zeroOnly.empty()) {
    SmallVector<int64_t> only(launch.zeroOnly.begin(), launch.zeroOnly.end());
    entries.push_back(b.getNamedAttr("zero_only", b.getDenseI64ArrayAttr(only)));
  }
  if (launch.copyInput)
    entries.push_back(b.getNamedAttr("copy_input", b.getUnitAttr()));
  if (!launch.fault.empty())
    entries.push_back(b.getNamedAttr("fault", b.getStringAttr(launch.fault)));
  if (launch.sharedBytes > 0)
    entries.push_back(b.getNamedAttr("shared_bytes", b.getI64IntegerAttr(launch.sharedBytes)));
  return b.getDictionaryAttr(entries);
}

struct GenerateKernelsPass
    : public mlir::forge::impl::GenerateKernelsBase<GenerateKernelsPass> {
  using GenerateKernelsBase::GenerateKernelsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::optional<CudaTarget> cuda = parseCudaTarget(target);
    if (!cuda) {
      module.emitError() << "unknown target '" << target
                         << "' (cuda:sm_80, cuda:sm_89, cuda:sm_90)";
      return signalPassFailure();
    }
    if (!module.getOps<gpu::GPUModuleOp>().empty()) {
      module.emitError("the module already has generated kernels");
      return signalPassFailure();
    }
    KernelGenerator kernels(&getContext(), *cuda);
    Builder b(&getContext());
    std::map<std::string, int> hostOps;
    for (auto func : module.getOps<func::FuncOp>()) {
      if (!func.getBody().hasOneBlock())
        continue; // the bundle emitter reports it
      Block &body = func.getBody().front();
      // Regions first: one kernel each, or their ops (placed below).
      for (FusionOp fusion : llvm::to_vector(body.getOps<FusionOp>())) {
        if (fusion->hasAttr("forge.library"))
          continue; // a gemm region: one library call (forge-select-library)
        if (std::optional<KernelLaunch> launch = kernels.kernelFor(fusion)) {
          fusion->setAttr("forge.launch", launchAttr(b, *launch));
        } else if (fusion->hasAttr("forge.out_row_strides")) {
          // Its ops' kernels would write the concat's piece packed.
          fusion.emitError("forge-generate-kernels: a loop region writing a concat's piece "
                           "(forge.out_row_strides, forge-fold-attention-views) has no kernel");
          return signalPassFailure();
        } else {
          fusion.inlineBody();
        }
      }
      for (Operation &op : body) {
        if (isa<ConstantOp, FusionOp>(op) || op.hasTrait<OpTrait::IsTerminator>() ||
            op.hasAttr("forge.library") || op.hasAttr("forge.placement"))
          continue; // a library call, or placed already (a view: no instruction)
        auto empty = [](Type t) {
          auto tt = dyn_cast<RankedTensorType>(t);
          return tt && tt.hasStaticShape() && tt.getNumElements() == 0;
        };
        if (isa<SendOp, RecvOp>(op)) {
          // Pipeline messages go through the host's communicator for now
          // (NCCL send/recv on the collective stream is #15's).
          op.setAttr("forge.placement", b.getStringAttr("host"));
          ++hostOps[op.getName().stripDialect().str()];
        } else if (isa<AllReduceOp, ReduceScatterOp, AllGatherOp, RankSliceOp>(op)) {
          // NCCL, on the group its attributes name (rank_slice: a copy of this
          // rank's part, on the same stream)
          op.setAttr("forge.placement", b.getStringAttr("collective"));
        } else if ((op.getNumResults() > 0 && llvm::all_of(op.getResultTypes(), empty)) ||
                   isCopyOp(op.getName().stripDialect())) {
          op.setAttr("forge.placement", b.getStringAttr("copy"));
        } else if (std::optional<KernelLaunch> launch = kernels.kernelFor(&op)) {
          op.setAttr("forge.launch", launchAttr(b, *launch));
        } else {
          op.setAttr("forge.placement", b.getStringAttr("host"));
          ++hostOps[op.getName().stripDialect().str()];
        }
      }
    }
    kernels.moveKernelsInto(module);
    if (!hostOps.empty()) {
      std::string list;
      int total = 0;
      for (const auto &[op, n] : hostOps) {
        list += (list.empty() ? "" : ", ") + op + " x" + std::to_string(n);
        total += n;
      }
      module.emitWarning() << total << " instruction" << (total == 1 ? "" : "s")
                           << " run on the host (no CUDA kernel yet): " << list;
    }
  }
};

} // namespace
