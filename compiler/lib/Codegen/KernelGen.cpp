//===- KernelGen.cpp - forge ops -> gpu.func kernels ----------------------===//
//
// The kernel generator's dispatch (Impl::generate picks a family per op; the
// families live in one file each, listed in KernelGenInternal.h), its public
// API (kernel dedup by content, the copy rule) and the
// lowering of the kernel module gpu -> NVVM -> PTX -> cubin.
//
//===----------------------------------------------------------------------===//
#include "KernelGenInternal.h"

#include "forge/Codegen/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/raw_ostream.h"

std::optional<CudaTarget> mlir::forge::parseCudaTarget(llvm::StringRef target) {
  CudaTarget t;
  if (target == "cuda:sm_90") {
    t.chip = "sm_90";
  } else if (target == "cuda:sm_80") {
    t.chip = "sm_80";
    t.sharedBytesPerSM = 164 * 1024;
    t.typicalSMs = 108;
  } else if (target == "cuda:sm_89") {
    t.chip = "sm_89";
    t.maxThreadsPerSM = 1536;
    t.maxBlocksPerSM = 24;
    t.sharedBytesPerSM = 100 * 1024;
    t.typicalSMs = 142;
  } else {
    return std::nullopt;
  }
  return t;
}

bool mlir::forge::isCopyOp(llvm::StringRef op) { return op == "copy" || op == "reshape"; }

/// What a kernel of `op` checks its data for (empty: nothing): the CPU
/// kernels report these as errors, so the GPU ones do too (Body::fault).
std::string kernelgen::faultOf(Operation *op) {
  StringRef name = op->getName().stripDialect();
  if (llvm::is_contained({"gather", "gather_grad", "gather_elements", "gather_elements_grad",
                          "scatter_elements"},
                         name))
    return "an index is outside [-size, size) of its axis";
  if (isa<NllLossOp>(op))
    return "a target class is outside [0, classes) and not the ignore_index";
  if (isa<CrossEntropyOp, CrossEntropyWithGradOp>(op))
    return "a target class is outside [0, classes)";
  if (isa<DivOp>(op) && isa<IntegerType>(tensorType(op->getResult(0)).getElementType()))
    return "integer division by zero";
  if (isa<ModOp>(op) && isa<IntegerType>(tensorType(op->getResult(0)).getElementType()))
    return "integer modulo by zero";
  return "";
}

std::optional<KernelLaunch> KernelGenerator::Impl::generate(Operation *op, StringRef name) {
  fault = op->getNumResults() >= 1 && tensorType(op->getResult(0)) ? faultOf(op) : "";
  if (auto fusion = dyn_cast<FusionOp>(op)) {
    fault.clear(); // set from the body's ops
    for (Value v : fusion.getBlock().getArguments())
      if (!tensorType(v) || !supportedElement(tensorType(v).getElementType()))
        return std::nullopt;
    bool supported = true;
    fusion.getBlock().walk([&](Operation *inner) {
      for (Value v : inner->getResults())
        supported &= tensorType(v) && supportedElement(tensorType(v).getElementType());
    });
    if (!supported)
      return std::nullopt;
    if (fusion.getKind() == "loop")
      return loopFusionKernel(fusion, name);
    if (fusion.getKind() == "horizontal")
      return horizontalFusionKernel(fusion, name);
    if (fusion.getKind() == "row")
      return rowFusionKernel(fusion, name);
    if (fusion.getKind() == "multi_reduce")
      return multiReduceKernel(fusion, name);
    if (fusion.getKind() == "column_reduce")
      return columnReduceKernel(fusion, name);
    if (fusion.getKind() == "lines")
      return linesKernel(fusion, name);
    if (fusion.getKind() == "norm_grad") // the verifier: a layer_norm_grad first
      return layerNormGradKernel(&fusion.getBlock().front(), name, fusion);
    if (fusion.getKind() == "batch_norm") {
      for (Operation &op : fusion.getBlock().without_terminator())
        if (isa<BatchNormTrainingOp, BatchNormTrainingGradOp>(op))
          return batchNormTrainingKernel(&op, name, isa<BatchNormTrainingGradOp>(op), fusion);
      return std::nullopt;
    }
    return std::nullopt;
  }
  for (Value v : op->getOperands())
    if (!tensorType(v) || !tensorType(v).hasStaticShape() ||
        !supportedElement(tensorType(v).getElementType()))
      return std::nullopt;
  for (Value v : op->getResults())
    if (!tensorType(v) || !tensorType(v).hasStaticShape() ||
        !supportedElement(tensorType(v).getElementType()))
      return std::nullopt;
  auto float8 = [](Value v) { return isFloat8(tensorType(v).getElementType()); };
  // float8 values are only made and read by casts, and moved as bytes by a
  // transpose (the transposed copy a float8 GEMM reads).
  if (!isa<CastOp, TransposeOp>(op) && (llvm::any_of(op->getOperands(), float8) ||
                                        llvm::any_of(op->getResults(), float8)))
    return std::nullopt;
  // Ops with several results first; every other generator makes one result.
  if (isa<SplitOp>(op))
    return splitKernel(op, name);
  if (isa<LayerNormGradOp>(op))
    return layerNormGradKernel(op, name);
  if (isa<GroupNormGradOp>(op))
    return groupNormKernel(op, name, true);
  if (isa<BatchNormTrainingOp, BatchNormTrainingGradOp>(op))
    return batchNormTrainingKernel(op, name, isa<BatchNormTrainingGradOp>(op));
  if (isa<TopKOp>(op))
    return topKKernel(op, name);
  if (isa<CrossEntropyOp>(op))
    return crossEntropyKernel(op, name, CrossEntropyMode::Forward);
  if (isa<CrossEntropyGradOp>(op))
    return crossEntropyKernel(op, name, CrossEntropyMode::Gradient);
  if (isa<CrossEntropyWithGradOp>(op))
    return crossEntropyKernel(op, name, CrossEntropyMode::Both);
  if (op->getNumResults() != 1)
    return std::nullopt;
  auto outShape = tensorType(op->getResult(0)).getShape();
  if (isa<DropoutMaskOp>(op))
    return dropoutMaskKernel(op, name);
  if (isa<GatherOp, GatherGradOp>(op))
    return gatherKernel(op, name, isa<GatherGradOp>(op));
  if (isa<NllLossOp>(op))
    return nllLossKernel(op, name);
  if (isa<NllLossGradOp>(op))
    return nllLossGradKernel(op, name);
  if (isa<ArgMaxOp>(op))
    return argmaxKernel(op, name);
  if (isa<LayerNormOp>(op))
    return layerNormKernel(op, name);
  if (isa<ConcatOp>(op))
    return concatKernel(op, name);
  if (isa<BatchNormOp>(op))
    return batchNormKernel(op, name);
  if (isa<PadOp, TileOp, TriluOp>(op))
    return remapKernel(op, name);
  if (isa<AvgPoolOp, AvgPoolGradOp>(op))
    return avgPoolKernel(op, name, isa<AvgPoolGradOp>(op));
  if (isa<GatherElementsOp, GatherElementsGradOp>(op))
    return gatherElementsKernel(op, name, isa<GatherElementsGradOp>(op));
  if (isa<ScatterElementsOp>(op))
    return scatterElementsKernel(op, name);
  if (isa<OneHotOp>(op))
    return oneHotKernel(op, name);
  if (isa<ResizedCropOp>(op))
    return resizedCropKernel(op, name);
  if (isa<CumSumOp>(op))
    return cumsumKernel(op, name);
  if (isa<SliceGradOp, PadGradOp>(op))
    return scatterGradKernel(op, name);
  if (isa<GroupNormOp>(op))
    return groupNormKernel(op, name, false);
  if (isa<MatMulOp, GemmOp>(op))
    return matmulKernel(op, name);
  if (isa<ConvOp, ConvTransposeOp, ConvGradWeightOp>(op))
    return convKernel(op, name);
  if (isa<MaxPoolOp, MaxPoolGradOp>(op))
    return maxPoolKernel(op, name, isa<MaxPoolGradOp>(op));
  if (reduceKind(op)) // the reduce_* ops
    return reduceKernel(op, name);
  if (isa<SoftmaxOp, LogSoftmaxOp, SoftmaxGradOp, LogSoftmaxGradOp>(op))
    return rowKernel(op, name);

  SmallVector<OperandMap> maps;
  if (auto transpose = dyn_cast<TransposeOp>(op)) {
    SmallVector<int64_t> inStrides = contiguousStrides(tensorType(transpose.getInput()).getShape());
    OperandMap m;
    for (int64_t p : transpose.getPerm())
      m.strides.push_back(inStrides[p]);
    maps.push_back(m);
    Type elem = tensorType(transpose.getResult()).getElementType();
    if (isFloat8(elem)) // bytes moved as they are (no float8 arithmetic)
      return pointwiseKernel(name, op->getLoc(), outShape, std::move(maps), {elem},
                             {tensorType(transpose.getInput()).getNumElements()}, {elem},
                             [](Body &, ArrayRef<Value> in) { return SmallVector<Value>{in[0]}; });
    return mapKernel(op, name, maps);
  }
  if (auto broadcast = dyn_cast<BroadcastOp>(op)) {
    maps.push_back({broadcastStrides(tensorType(broadcast.getInput()).getShape(), outShape)});
    return mapKernel(op, name, maps);
  }
  if (auto slice = dyn_cast<SliceOp>(op)) { // element i of dim d is input element starts[d] + i * steps[d]
    ArrayRef<int64_t> starts = slice.getStarts(), steps = slice.getSteps();
    auto inShape = tensorType(slice.getInput()).getShape();
    if (starts.size() != inShape.size() || steps.size() != inShape.size())
      return std::nullopt;
    SmallVector<int64_t> inStrides = contiguousStrides(inShape);
    OperandMap m;
    for (size_t d = 0; d < inShape.size(); ++d) {
      m.strides.push_back(steps[d] * inStrides[d]);
      m.offset += starts[d] * inStrides[d];
    }
    maps.push_back(m);
    return mapKernel(op, name, maps);
  }
  auto iface = dyn_cast<ForgeOpInterface>(op);
  if (!iface || iface.getFusionClass() != FusionClass::Elementwise)
    return std::nullopt;
  for (Value v : op->getOperands())
    maps.push_back({broadcastStrides(tensorType(v).getShape(), outShape)});
  return mapKernel(op, name, maps);
}

KernelGenerator::Impl::Impl(MLIRContext *ctx, CudaTarget t)
    : context(ctx), target(std::move(t)) {
  context->loadDialect<arith::ArithDialect, gpu::GPUDialect, math::MathDialect,
                       memref::MemRefDialect, scf::SCFDialect, vector::VectorDialect,
                       LLVM::LLVMDialect, NVVM::NVVMDialect>();
  OpBuilder b(context);
  module = ModuleOp::create(UnknownLoc::get(context));
  module->getOperation()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
  b.setInsertionPointToEnd(module->getBody());
  gpuModule = b.create<gpu::GPUModuleOp>(module->getLoc(), "forge_kernels");
  // Ada and Hopper convert to float8 in hardware (encodeFloat8).
  if (this->target.chip == "sm_89" || this->target.chip == "sm_90")
    gpuModule->setAttr(kFloat8CvtAttr, b.getUnitAttr());
}

KernelGenerator::KernelGenerator(MLIRContext *context, CudaTarget target)
    : impl(std::make_unique<Impl>(context, std::move(target))) {}
KernelGenerator::~KernelGenerator() = default;

size_t KernelGenerator::numKernels() const { return impl->names.size(); }

std::optional<KernelLaunch> KernelGenerator::kernelFor(Operation *op) {
  if (isCopyOp(op->getName().stripDialect()))
    return std::nullopt;
  // Ops with equal name, attributes and types share one kernel; fusion
  // regions with equal text (their bodies printed in a local scope, without
  // locations).
  std::string key;
  if (isa<FusionOp>(op)) {
    llvm::raw_string_ostream os(key);
    op->print(os, OpPrintingFlags().useLocalScope().printGenericOpForm());
  } else {
    llvm::raw_string_ostream os(key);
    os << op->getName() << op->getAttrDictionary() << "(";
    for (Type t : op->getOperandTypes())
      os << t << ",";
    os << ")->(";
    for (Type t : op->getResultTypes())
      os << t << ",";
    os << ")";
  }
  auto it = impl->cache.find(key);
  if (it != impl->cache.end())
    return it->second;
  std::string name = "k" + std::to_string(impl->names.size()) + "_" +
                     op->getName().stripDialect().str();
  std::optional<KernelLaunch> launch = impl->generate(op, name);
  if (launch) {
    launch->fault = impl->fault;
    impl->names.push_back(name);
  }
  impl->cache[key] = launch;
  return launch;
}

namespace {
/// gpu -> NVVM (lowerModule's pipeline up to the binary).
void addLoweringPasses(PassManager &pm, const CudaTarget &target) {
  GpuNVVMAttachTargetOptions attach;
  attach.chip = target.chip;
  attach.features = "+ptx78";
  attach.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(attach));
  OpPassManager &gpm = pm.nest<gpu::GPUModuleOp>();
  gpm.addPass(createConvertSCFToCFPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.useBarePtrCallConv = true;
  nvvm.indexBitwidth = 32; // tensors fit 2^31 elements (checked by the emitter)
  gpm.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  gpm.addPass(createConvertVectorToLLVMPass());
  gpm.addPass(createCanonicalizerPass());
  gpm.addPass(createCSEPass());
  gpm.addPass(createReconcileUnrealizedCastsPass());
}

/// gpu.dynamic_shared_memory lowers (MLIR 19) to an internal zero-length
/// shared array, which NVPTX demotes to a one-byte static variable placed
/// among the static ones (`.shared .b8 __dynamic_shmem__0;`): a kernel's
/// dynamic shared memory then overlapped its static buffers. External
/// linkage makes it the `.extern .shared` array that starts where the
/// launch's dynamic bytes do.
void externDynamicSharedMemory(ModuleOp module) {
  module.walk([](LLVM::GlobalOp global) {
    if (global.getSymName().starts_with("__dynamic_shmem__"))
      global.setLinkage(LLVM::Linkage::External);
  });
}

/// Lowers a module holding one gpu.module (gpu.container_module) to PTX.
FailureOr<std::string> lowerModule(ModuleOp module, const CudaTarget &target) {
  MLIRContext *ctx = module.getContext();
  std::string toolkit;
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *p = std::getenv(env); p && *p && !toolkit.size())
      toolkit = p;
  if (toolkit.empty())
    toolkit = "/usr/local/cuda";
  SmallString<256> libdevice(toolkit);
  llvm::sys::path::append(libdevice, "nvvm", "libdevice", "libdevice.10.bc");
  if (!llvm::sys::fs::exists(libdevice))
    return module.emitError() << "the CUDA target needs libdevice (" << libdevice
                              << " does not exist): set CUDA_HOME to the CUDA toolkit";

  PassManager pm(ctx);
  addLoweringPasses(pm, target);
  if (failed(pm.run(module)))
    return failure();
  externDynamicSharedMemory(module);
  PassManager binaryPm(ctx);
  GpuModuleToBinaryPassOptions binary;
  binary.toolkitPath = toolkit;
  binary.compilationTarget = "isa";
  binaryPm.addPass(createGpuModuleToBinaryPass(binary));
  if (failed(binaryPm.run(module)))
    return failure();
  for (auto bin : module.getOps<gpu::BinaryOp>())
    for (Attribute a : bin.getObjects()) {
      std::string ptx = cast<gpu::ObjectAttr>(a).getObject().str();
      // The PTX string inside gpu.binary ends with a NUL byte (../shared/DESIGN.md §5).
      while (!ptx.empty() && ptx.back() == '\0')
        ptx.pop_back();
      return ptx;
    }
  return module.emitError("GPU lowering produced no binary");
}
} // namespace

void KernelGenerator::moveKernelsInto(ModuleOp module) {
  if (impl->names.empty())
    return;
  OpBuilder b(impl->context);
  module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
  b.setInsertionPointToEnd(module.getBody());
  b.clone(*impl->gpuModule);
}

namespace {
/// The kernels of `module` (forge-generate-kernels), or null.
gpu::GPUModuleOp kernelModule(ModuleOp module) {
  auto modules = module.getOps<gpu::GPUModuleOp>();
  return modules.empty() ? gpu::GPUModuleOp() : *modules.begin();
}

/// A module holding `fn` alone (or all of `kernels`), ready for lowerModule.
/// Lowering needs the NVVM target and the LLVM IR translations registered.
OwningOpRef<ModuleOp> containerFor(Operation *kernels, StringRef name) {
  MLIRContext *ctx = kernels->getContext();
  DialectRegistry registry;
  registerCodegenDialects(registry);
  ctx->appendDialectRegistry(registry);
  OpBuilder b(ctx);
  OwningOpRef<ModuleOp> single = ModuleOp::create(kernels->getLoc());
  single->getOperation()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
  b.setInsertionPointToEnd(single->getBody());
  if (isa<gpu::GPUModuleOp>(kernels)) {
    b.clone(*kernels);
  } else {
    auto gm = b.create<gpu::GPUModuleOp>(kernels->getLoc(), name);
    b.setInsertionPointToStart(gm.getBody());
    b.clone(*kernels);
  }
  return single;
}
} // namespace

namespace {
/// One top-level entity of a PTX module: a kernel, a function (definition or
/// prototype) or a variable, with the comment lines before it.
struct PtxEntity {
  std::string name, text;
  bool entry = false, body = false;
};

/// The symbol an entity's first line declares: the last identifier (not a
/// directive) followed by '(', '[', ';', '=' or the line's end.
std::string ptxSymbol(StringRef line) {
  std::string found;
  for (size_t i = 0; i < line.size();) {
    char c = line[i];
    bool start = std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$';
    if (!start || (i > 0 && (line[i - 1] == '.' || line[i - 1] == '%'))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < line.size() && (std::isalnum(static_cast<unsigned char>(line[j])) ||
                               line[j] == '_' || line[j] == '$'))
      ++j;
    size_t k = j;
    while (k < line.size() && line[k] == ' ')
      ++k;
    if (k == line.size() || llvm::is_contained(StringRef("([;="), line[k]))
      found = line.slice(i, j).str();
    i = j;
  }
  return found;
}

/// Splits LLVM's PTX output into its header (.version, .target,
/// .address_size) and its top-level entities. Bodies are brace-delimited;
/// a declaration without a body ends at a ';' at depth 0.
LogicalResult splitPtx(StringRef ptx, std::string &header, std::vector<PtxEntity> &out) {
  SmallVector<StringRef> lines;
  ptx.split(lines, '\n');
  std::string pending; // comments and blank lines before the next entity
  PtxEntity cur;
  bool inEntity = false;
  int depth = 0;
  auto finish = [&] {
    cur.text = pending + cur.text;
    pending.clear();
    out.push_back(std::move(cur));
    cur = PtxEntity();
    inEntity = false;
  };
  for (StringRef line : lines) {
    StringRef t = line.trim();
    if (!inEntity) {
      if (t.starts_with(".version") || t.starts_with(".target") ||
          t.starts_with(".address_size")) {
        header += line.str() + "\n";
        continue;
      }
      if (t.empty() || t.starts_with("//")) {
        pending += line.str() + "\n";
        continue;
      }
      if (!t.starts_with("."))
        return failure(); // something this splitter does not know
      inEntity = true;
      cur.name = ptxSymbol(t);
      cur.entry = t.contains(".entry");
    }
    cur.text += line.str() + "\n";
    for (char c : line) {
      if (c == '{') {
        ++depth;
        cur.body = true;
      } else if (c == '}') {
        --depth;
      }
    }
    if (depth < 0)
      return failure();
    // A body's closing brace, or a ';' at depth 0: a prototype, or a
    // variable (with its initializer's braces on the line).
    if (depth == 0 && (t.ends_with("}") || t.ends_with(";")))
      finish();
  }
  if (inEntity) // a body or declaration that never ends
    return failure();
  return success();
}

} // namespace

FailureOr<std::string> mlir::forge::mergePtxModules(ArrayRef<std::string> parts) {
  std::string header, merged;
  llvm::StringSet<> defined, declared;
  for (const std::string &part : parts) {
    std::string partHeader;
    std::vector<PtxEntity> entities;
    if (failed(splitPtx(part, partHeader, entities)) || (!header.empty() && partHeader != header))
      return failure();
    header = partHeader;
    for (PtxEntity &e : entities) {
      if (e.name.empty())
        return failure();
      if (e.entry && defined.contains(e.name))
        return failure(); // a kernel twice: not chunks of one module
      if (!e.entry && (e.body ? defined.contains(e.name)
                              : declared.contains(e.name) || defined.contains(e.name)))
        continue;
      (e.body || e.entry ? defined : declared).insert(e.name);
      merged += e.text;
    }
  }
  return header + "\n" + merged;
}

namespace {
/// Hardware threads the lowering may use (1 when the context is single-threaded).
size_t loweringThreads(MLIRContext *ctx) {
  return ctx->isMultithreadingEnabled()
             ? std::max<size_t>(1, llvm::hardware_concurrency().compute_thread_count())
             : 1;
}

/// Each container module of `modules` lowered to PTX, side by side. A pass
/// manager's run appends to its context's dialect registry, which is not
/// thread-safe: each is lowered in a context of its own, from its printed
/// form (a few MB of IR parse in well under the lowering's time).
FailureOr<std::vector<std::string>> lowerEach(ArrayRef<OwningOpRef<ModuleOp>> modules,
                                              const CudaTarget &target, size_t threads) {
  std::vector<std::string> text(modules.size()), ptx(modules.size());
  for (size_t c = 0; c < modules.size(); ++c) {
    llvm::raw_string_ostream os(text[c]);
    modules[c].get()->print(os, OpPrintingFlags().printGenericOpForm().enableDebugInfo(false));
  }
  std::vector<char> ok(modules.size(), 0);
  {
    llvm::StdThreadPool pool(llvm::hardware_concurrency(static_cast<unsigned>(threads)));
    for (size_t c = 0; c < modules.size(); ++c)
      pool.async([&, c] {
        DialectRegistry registry;
        registerCodegenDialects(registry);
        MLIRContext local(registry, MLIRContext::Threading::DISABLED);
        local.allowUnregisteredDialects();
        OwningOpRef<ModuleOp> chunk = parseSourceString<ModuleOp>(text[c], &local);
        if (!chunk)
          return;
        FailureOr<std::string> lowered = lowerModule(*chunk, target);
        if (succeeded(lowered)) {
          ptx[c] = std::move(*lowered);
          ok[c] = 1;
        }
      });
    pool.wait();
  }
  if (llvm::is_contained(ok, 0))
    return failure();
  return ptx;
}
} // namespace

FailureOr<std::string> mlir::forge::lowerKernelsToPtx(ModuleOp module, const CudaTarget &target) {
  gpu::GPUModuleOp kernels = kernelModule(module);
  if (!kernels)
    return std::string();
  // LLVM's NVPTX back end runs a module on one thread: the kernels go in
  // chunks, one per hardware thread, lowered side by side and merged into
  // one PTX module (a kernel's code does not depend on its neighbours; only
  // libdevice helpers repeat). Few kernels: one chunk.
  constexpr size_t kKernelsPerChunk = 16;
  SmallVector<gpu::GPUFuncOp> fns(kernels.getOps<gpu::GPUFuncOp>());
  size_t threads = loweringThreads(module.getContext());
  size_t chunks = std::min(threads, std::max<size_t>(1, fns.size() / kKernelsPerChunk));
  if (chunks <= 1) {
    OwningOpRef<ModuleOp> copy = containerFor(kernels, "");
    return lowerModule(*copy, target);
  }
  // Chunk c: the whole gpu.module without the kernels of the other chunks
  // (kernel i goes to chunk i mod chunks; sizes vary less than names).
  SmallVector<OwningOpRef<ModuleOp>> copies;
  for (size_t c = 0; c < chunks; ++c) {
    copies.push_back(containerFor(kernels, ""));
    auto gm = *(*copies.back()).getOps<gpu::GPUModuleOp>().begin();
    size_t i = 0;
    for (auto fn : llvm::make_early_inc_range(gm.getOps<gpu::GPUFuncOp>()))
      if (i++ % chunks != c)
        fn.erase();
  }
  FailureOr<std::vector<std::string>> ptx = lowerEach(copies, target, threads);
  if (failed(ptx))
    return module.emitError("lowering the kernels to PTX failed (see above)");
  FailureOr<std::string> merged = mergePtxModules(*ptx);
  if (failed(merged))
    return module.emitError("internal error: the kernels' PTX chunks could not be merged "
                            "(an unexpected top-level PTX form)");
  return merged;
}

LogicalResult mlir::forge::dumpKernels(ModuleOp module, const CudaTarget &target,
                                       llvm::StringRef dir) {
  gpu::GPUModuleOp kernels = kernelModule(module);
  if (!kernels)
    return success();
  SmallString<256> kernelDir(dir);
  llvm::sys::path::append(kernelDir, "kernels");
  if (std::error_code ec = llvm::sys::fs::create_directories(kernelDir))
    return module.emitError() << "cannot create " << kernelDir << ": " << ec.message();
  // Every kernel alone, lowered side by side (as the bundle's chunks are).
  std::vector<std::string> names;
  SmallVector<OwningOpRef<ModuleOp>> singles;
  for (auto fn : kernels.getOps<gpu::GPUFuncOp>()) {
    names.push_back(fn.getName().str());
    singles.push_back(containerFor(fn, names.back()));
  }
  auto write = [&](const std::string &file,
                   function_ref<void(llvm::raw_ostream &)> body) -> LogicalResult {
    SmallString<256> path(kernelDir);
    llvm::sys::path::append(path, file);
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    if (ec)
      return module.emitError() << "cannot write " << path << ": " << ec.message();
    body(os);
    return success();
  };
  for (auto [name, single] : llvm::zip(names, singles))
    if (failed(write(name + ".mlir", [&](llvm::raw_ostream &os) { single.get()->print(os); })))
      return failure();
  FailureOr<std::vector<std::string>> ptx =
      lowerEach(singles, target, loweringThreads(module.getContext()));
  if (failed(ptx))
    return module.emitError("lowering the kernels to PTX failed (see above)");
  for (auto [name, text] : llvm::zip(names, *ptx))
    if (failed(write(name + ".ptx", [&, &text = text](llvm::raw_ostream &os) { os << text; })))
      return failure();
  return success();
}

FailureOr<std::optional<std::string>> mlir::forge::assemblePtx(llvm::StringRef ptx,
                                                               llvm::StringRef chip,
                                                               std::string &error) {
  SmallVector<StringRef> paths;
  std::string cudaHome;
  if (const char *p = std::getenv("CUDA_HOME"); p && *p)
    cudaHome = std::string(p) + "/bin";
  auto found = llvm::sys::findProgramByName("ptxas");
  if (!found && !cudaHome.empty())
    found = llvm::sys::findProgramByName("ptxas", {cudaHome});
  if (!found)
    found = llvm::sys::findProgramByName("ptxas", {"/usr/local/cuda/bin"});
  if (!found)
    return std::optional<std::string>();

  SmallString<128> in, out, log;
  int fd;
  if (llvm::sys::fs::createTemporaryFile("forge-kernels", "ptx", fd, in) ||
      llvm::sys::fs::createTemporaryFile("forge-kernels", "cubin", out) ||
      llvm::sys::fs::createTemporaryFile("forge-ptxas", "log", log)) {
    error = "cannot create temporary files for ptxas";
    return failure();
  }
  auto cleanup = llvm::make_scope_exit([&] {
    llvm::sys::fs::remove(in);
    llvm::sys::fs::remove(out);
    llvm::sys::fs::remove(log);
  });
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    os << ptx;
  }
  std::string arch = "-arch=" + chip.str();
  // --split-compile 0: ptxas optimizes on every CPU (the code is the same).
  SmallVector<StringRef> args = {*found, arch, "-O3", "--split-compile", "0", in, "-o", out};
  std::optional<StringRef> redirects[] = {std::nullopt, StringRef(log), StringRef(log)};
  int rc = llvm::sys::ExecuteAndWait(*found, args, std::nullopt, redirects);
  if (rc != 0) {
    auto text = llvm::MemoryBuffer::getFile(log);
    error = "ptxas " + arch + " failed (exit " + std::to_string(rc) + ")" +
            (text ? ": " + (*text)->getBuffer().str() : std::string());
    return failure();
  }
  auto cubin = llvm::MemoryBuffer::getFile(out, /*IsText=*/false);
  if (!cubin) {
    error = "cannot read ptxas output " + out.str().str();
    return failure();
  }
  return std::optional<std::string>((*cubin)->getBuffer().str());
}
