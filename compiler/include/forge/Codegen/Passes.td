//===- Passes.td - Forge code generation passes -------------*- tablegen -*-===//
//
// Passes of the code generator (compiler/lib/Codegen), apart from the graph
// passes in passes/Passes.td: they depend on the GPU, NVVM and LLVM dialects,
// which the graph passes must not link.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_CODEGEN_PASSES_TD
#define FORGE_CODEGEN_PASSES_TD

include "mlir/Pass/PassBase.td"

def GenerateKernels : Pass<"forge-generate-kernels", "::mlir::ModuleOp"> {
  let summary = "Generate a CUDA kernel for every op and fusion region that is not a library call";
  let description = [{
    Decides where each op of a CUDA bundle runs and generates its kernel:
      * a fusion region gets one kernel (`forge.launch`), or, when its body
        has no generator, is replaced by its ops, which are then placed one by
        one;
      * an op marked `forge.library` (forge-select-library) is left alone;
      * an op whose results are all empty, a reshape and a copy get
        `forge.placement = "copy"` (a device-to-device copy);
      * every other op gets its kernel (`forge.launch`) or, without a
        generator for its types and attributes, `forge.placement = "host"`
        (its CPU kernel on staged copies), listed in a warning.
    `forge.launch` is a dictionary: `kernel` (the gpu.func's name), `grid` and
    `block` (1-d launch), and the flags `zero_outputs` (the kernel accumulates
    into zeroed outputs; `zero_only` lists which), `copy_input` (output 0
    starts as a copy of input 0), `fault` (what the kernel checks its data
    for) and `shared_bytes` (its dynamic shared memory a block). Kernels are shared by
    ops of equal name, attributes and types, and by regions of equal body.
    They are `gpu.func`s in `gpu.module @forge_kernels`, added to the module
    (which becomes a `gpu.container_module`); the bundle emitter lowers that
    module to PTX and a cubin.

    Within a function the regions are generated first, then the other ops in
    program order (the kernels' names number them in that order).
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cuda:sm_90\"",
           "cuda:sm_80, cuda:sm_89 or cuda:sm_90">,
  ];
  let dependentDialects = [
    "::mlir::forge::ForgeDialect", "::mlir::arith::ArithDialect", "::mlir::gpu::GPUDialect",
    "::mlir::math::MathDialect", "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect", "::mlir::LLVM::LLVMDialect", "::mlir::NVVM::NVVMDialect"
  ];
}

def CheckCoalescing : Pass<"forge-check-coalescing", "::mlir::ModuleOp"> {
  let summary = "Check that every generated kernel's global loads and stores are coalesced";
  let description = [{
    An analysis of the kernels forge-generate-kernels made (`gpu.func`s in the
    module's `gpu.module`s): for every load, store and atomic on global memory
    it evaluates the index expression for each thread of a warp (thread id x
    0..31 of block 1; every loop's induction variable at its first value).
    An access is coalesced when the warp's indices form one contiguous range
    (consecutive threads at consecutive elements, 16-byte vectors when the
    memref holds vectors; a broadcast; a per-column vector read cyclically),
    or two ascending runs with one drop to the lowest index (a broadcast row
    read across its end, as a misaligned contiguous access costs).
    An index read from memory (a gather or scatter) is data-dependent and
    counted as such. Each other access is an error naming the kernel, the op
    and the strides between adjacent threads; with `report`, every kernel
    gets a remark with its counts.
  }];
  let options = [
    Option<"report", "report", "bool", /*default=*/"false",
           "A remark per kernel: coalesced, broadcast and data-dependent accesses">,
  ];
}

#endif // FORGE_CODEGEN_PASSES_TD
