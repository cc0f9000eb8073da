//===- Pipeline.cpp - the Forge pass pipeline and its dumps ----------------===//
#include "forge/Pipeline/Pipeline.h"

#include "Passes.h"
#include "forge/Codegen/Passes.h"
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Export/OnnxExport.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::forge;

namespace {

/// Stage "graph cleanup": canonical form. Canonicalize first so folders
/// (identity reshapes, transposes, casts) shrink the graph before constants are
/// evaluated; constant folding then exposes more duplicates for CSE; dead-code
/// elimination last removes what folding and CSE left unused.
void addGraphCleanup(OpPassManager &pm, const PipelineOptions &options) {
  pm.addPass(createCanonicalizerPass());
  pm.addNestedPass<func::FuncOp>(createFoldConstants());
  // CUDA: cuDNN takes symmetric padding only, so asymmetric conv padding becomes
  // an explicit pad first; before CSE, which merges the equal pads that a conv
  // and its conv_grad_weight put on one input.
  // Likewise cuBLASLt's fast GEMMs need aligned rows: contractions get padded
  // dims, also before CSE (a weight padded for its forward and backward GEMMs).
  if (StringRef(options.target).starts_with("cuda")) {
    pm.addNestedPass<func::FuncOp>(createSymmetrizeConvPadding());
    PadContractionsOptions pad;
    pad.minFlops = options.gemmPadMinFlops;
    // bf16/f16 storage (the precision stage, later) needs rows of 8 elements.
    if (options.precision == "bf16" || options.precision == "fp16" || options.precision == "fp8")
      pad.minElements = 8;
    pm.addNestedPass<func::FuncOp>(createPadContractions(pad));
  }
  pm.addPass(createCSEPass());
  pm.addNestedPass<func::FuncOp>(createEliminateDeadCode());
}

/// Stage "fusion": after the graph cleanup, so that regions form over the
/// final ops (no dead ops, folded constants, merged duplicates) of the
/// forward, backward and optimizer together. On every target: the CPU bundle
/// runs a region's ops one by one, so the CPU tests exercise the pass too.
void addFusion(OpPassManager &pm, const PipelineOptions &options) {
  FuseOptions fuse;
  // GEMM epilogues are a GEMM library's (cuBLASLt): CUDA only.
  fuse.gemmEpilogues = StringRef(options.target).starts_with("cuda");
  // The GELU's aux epilogues by default in bf16 only: GPT-2 124M ran 4% faster with them in
  // bf16 and slower in TF32; the ReLU's were slower in both (bench/RESULTS.md).
  fuse.auxEpilogues =
      fuse.gemmEpilogues && (options.auxEpilogues == "on" ||
                             (options.auxEpilogues == "auto" && options.precision == "bf16"));
  fuse.reluAuxEpilogues = fuse.gemmEpilogues && options.auxEpilogues == "on";
  pm.addPass(createFuse(fuse));
}

/// Which attention chains forge-recognize-composites turns into one op.
RecognizeCompositesOptions recognizeOptions(const PipelineOptions &options, bool training) {
  RecognizeCompositesOptions recognize;
  bool low = training && (options.precision == "bf16" || options.precision == "fp16" ||
                          options.precision == "fp8");
  if (StringRef(options.target).starts_with("cuda"))
    recognize.attention = low ? "cudnn" : "none";
  else
    recognize.attention = "all";
  return recognize;
}

/// forge-augment-inputs when --augment asks for it (before anything folds or
/// fuses: its ops then fuse with the model's first ones).
void addAugmentInputs(OpPassManager &pm, const PipelineOptions &options) {
  if (options.augment.input.empty())
    return;
  AugmentInputsOptions augment;
  augment.input = options.augment.input;
  augment.pixels = options.augment.pixels;
  augment.mean = options.augment.mean;
  augment.stddev = options.augment.std;
  augment.flip = options.augment.flip;
  augment.canvasHeight = options.augment.canvasHeight;
  augment.canvasWidth = options.augment.canvasWidth;
  pm.addNestedPass<func::FuncOp>(createAugmentInputs(augment));
}

/// Stage "placement", last: where each op runs, decided on the final graph
/// (later stages would change what a kernel computes). CUDA: library calls
/// are marked first, so that the kernel generator skips them; the generator
/// then gives every region and op a kernel, a copy or the host, and adds the
/// kernels to the module. CPU: regions become their ops again (a CPU bundle
/// runs them op by op). After this stage the bundle emitter only serializes.
void addPlacement(OpPassManager &pm, const PipelineOptions &options) {
  if (StringRef(options.target).starts_with("cuda")) {
    // Scalar regions into other kernels first: after every pass that
    // rewrites regions by their kind (precision, the accumulation split), and
    // before the kernel generator, which gives each region one launch. The
    // CPU runs regions op by op: a launch saved is nothing there.
    pm.addNestedPass<func::FuncOp>(createMergeScalarRegions());
    // After the riders joined their hosts (the sums' scalar readers are then
    // the optimizer's late members), before the generator.
    if (options.mergeReductions)
      pm.addNestedPass<func::FuncOp>(createMergeReductions());
    // Sums of centred pieces marked zero: after the merge (its multi_reduce
    // kernels do not take the mark), before forge-fold-attention-views (which
    // turns the concat it looks through into a view).
    if (options.elideCentredSums)
      pm.addNestedPass<func::FuncOp>(createElideCentredSums());
    pm.addNestedPass<func::FuncOp>(createSelectLibrary());
    // After the library marks (it folds only into cuDNN attention) and before
    // the generator, which would give a folded split a kernel.
    if (options.foldAttentionViews)
      pm.addNestedPass<func::FuncOp>(createFoldAttentionViews());
    // After the strided views (it leaves their concats alone), before the
    // generator.
    if (options.foldContiguousViews)
      pm.addNestedPass<func::FuncOp>(createFoldContiguousViews());
    GenerateKernelsOptions generate;
    generate.target = options.target;
    pm.addPass(createGenerateKernels(generate));
  } else {
    pm.addNestedPass<func::FuncOp>(createInlineFusions());
  }
}

/// Stage "schedule", after placement (what is a kernel, a library call or a
/// collective is known: the streams follow from it) and before the memory
/// plan, which keeps bytes from reuse until the streams are ordered after
/// their readers, and whose copies (added at the end) are on the compute
/// stream. The CPU runs the same order (its streams are ignored).
void addSchedule(OpPassManager &pm, const PipelineOptions &options) {
  ScheduleOptions schedule;
  schedule.order = options.scheduleOrder;
  // The CPU runs one op at a time: further streams would only lengthen live ranges.
  schedule.computeStreams =
      StringRef(options.target).starts_with("cuda") ? options.computeStreams : 1;
  schedule.streamMemoryGrowth = options.streamMemoryGrowth;
  schedule.maxStreamPins = options.maxStreamPins;
  schedule.report = options.scheduleReport;
  schedule.reportFile = options.scheduleFile;
  pm.addNestedPass<func::FuncOp>(createSchedule(schedule));
}

/// Stage "memory plan", after placement: whether an update may be written in
/// place depends on how its op runs (a pointwise kernel reads each element
/// before writing it; a horizontal region's kernel does not order its
/// members), and the copies it adds must be placed too (it places them).
void addMemoryPlan(OpPassManager &pm, const PipelineOptions &options) {
  PlanMemoryOptions plan;
  plan.report = options.memoryReport;
  pm.addNestedPass<func::FuncOp>(createPlanMemory(plan));
}

} // namespace

void mlir::forge::buildTrainingPipeline(OpPassManager &pm, const PipelineOptions &options) {
  // Stage "import cleanup": drop what the importer left unused (outputs of
  // multi-output nodes nobody reads), so the train step differentiates only
  // live ops. Nothing that folds: initializers are still constants here and
  // must reach the train-step stage unchanged to become parameters.
  // Composites first (the tanh GELU as one op), so that the train step
  // differentiates the op by its own rule; they leave their chains dead.
  // Attention is formed only where the target has a fused kernel for it (the
  // CPU always; CUDA: cuDNN's flash attention, which takes bf16/fp16 only,
  // the types forge-assign-precision gives it later); elsewhere its chain
  // stays, and the remark says why.
  pm.addNestedPass<func::FuncOp>(createRecognizeComposites(recognizeOptions(options, true)));
  pm.addNestedPass<func::FuncOp>(createEliminateDeadCode());
  // The input transforms (--augment) belong to the model's forward: before
  // the train step is built, so that train_step and eval both take them.
  addAugmentInputs(pm, options);
  // Stage "tensor parallelism" (--tp): Megatron's column/row splits of the
  // forward's matmul pairs, with the collectives they imply. Before the train
  // step, which differentiates the collectives by their rules (so the
  // backward gets its own) and makes each split initializer a parameter of
  // its slice's type; after the import cleanup, so only live ops are split.
  if (options.tensorParallel > 1) {
    ShardTensorParallelOptions tp;
    tp.size = options.tensorParallel;
    tp.loss = options.train.loss; // a cross_entropy's logits: split by vocabulary
    pm.addNestedPass<func::FuncOp>(createShardTensorParallel(tp));
  }
  // Stage "pipeline stages" (--pp): the forward cut into cost-balanced
  // stages. After tensor parallelism (which would see the marks as noise) and
  // before the train step, which carries each forward op's stage to its
  // gradient and each parameter's to its update.
  if (options.train.pipeline > 1) {
    AssignPipelineStagesOptions stages;
    stages.stages = options.train.pipeline;
    pm.addNestedPass<func::FuncOp>(createAssignPipelineStages(stages));
  }
  // Stage "train-step construction": @main -> @train_step + @eval. Before the
  // graph cleanup, which would fold parameter initializers into constants;
  // after it, the forward, backward and optimizer are one graph that the
  // following stages optimize together.
  BuildTrainStepOptions train;
  train.loss = options.train.loss;
  train.optimizer = options.train.optimizer;
  train.lrSchedule = options.train.lrSchedule;
  train.clipGradNorm = options.train.clipGradNorm;
  train.microBatches = options.train.microBatches;
  train.accumulate = options.train.accumulate;
  train.dynamicMicroBatches = options.train.dynamicMicroBatches;
  train.dataParallel = options.train.dataParallel;
  train.zero = options.train.zero;
  train.freeze = options.train.freeze;
  train.exposeGradients = options.train.exposeGradients;
  train.gradNorm = options.train.gradNorm;
  train.batchnormRunningVar = options.train.batchnormRunningVar;
  train.lossScale = options.train.lossScale;
  train.pipeline = options.train.pipeline;
  pm.addPass(createBuildTrainStep(train));
  // Then one routine per stage, with its sends and receives, in 1F1B order:
  // right after construction, before the graph cleanup (whose folding and
  // CSE make ops without marks, and would merge ops of different stages).
  if (options.train.pipeline > 1)
    pm.addPass(createSplitPipelineStages());
  // Stage "graph cleanup" (see addGraphCleanup). Later stages need its
  // canonical form: folded constants, no duplicates, no dead ops.
  addGraphCleanup(pm, options);
  // Stage "layout": after the graph cleanup (convolution pads made symmetric,
  // constants folded, duplicates merged), so that each convolution is
  // converted once; before fusion, which fuses the pointwise ops and column
  // sums that the expanded batch norms become (../shared/DESIGN.md puts layout after
  // precision: see the design notes). CSE then merges the forward's and the
  // gradient's batch statistics and the transposes of shared operands.
  if (options.layout == "nhwc") {
    AssignLayoutOptions layout;
    layout.layout = options.layout;
    pm.addNestedPass<func::FuncOp>(createAssignLayout(layout));
    pm.addPass(createCSEPass());
    pm.addNestedPass<func::FuncOp>(createEliminateDeadCode());
    // Then weights stored channels-last, with their gradients and optimizer
    // state: after CSE, which leaves one transpose per weight and per
    // gradient to match; before fusion and precision, which would fold the
    // transposes into regions and give the weights low copies of the old
    // shape.
    if (options.permuteParameters)
      pm.addPass(createPermuteParameters());
  }
  // Stage "recomputation": after the last CSE, which would merge each clone
  // back into its original; before fusion, which fuses a recomputed chain
  // (scale, mask, softmax) into one row region as it does the forward's.
  if (options.recompute != "none") {
    RematerializeOptions remat;
    remat.recompute = options.recompute;
    pm.addNestedPass<func::FuncOp>(createRematerialize(remat));
  }
  addFusion(pm, options);
  // Stage "precision": after fusion, so that each cast lands in the region
  // that makes or reads the value (and a parameter's low copy in the
  // optimizer's region) instead of running as a kernel of its own; before
  // placement, which states each GEMM's operand types to cuBLASLt.
  if (options.precision == "bf16" || options.precision == "fp16" || options.precision == "fp8") {
    AssignPrecisionOptions precision;
    precision.precision = options.precision;
    precision.fp8Scaling = options.fp8Scaling;
    precision.fp8History = options.fp8History;
    precision.fp8Gradients = options.fp8Gradients;
    precision.lowNormGradients = options.lowNormGradients;
    pm.addPass(createAssignPrecision(precision));
    // The f32 views its low copies replaced (a transposed weight) are dead.
    pm.addNestedPass<func::FuncOp>(createEliminateDeadCode());
  }
  // Stage "memory shaping": the loss head in row chunks, so that its logits
  // and their gradient are never all live. After fusion, which forms the
  // cross_entropy ops it matches, and after precision, whose types the
  // chunks keep; before placement, which states the new GEMMs' problems, and
  // the memory plan, which reuses one chunk's buffers for the next.
  const bool fuseHead =
      StringRef(options.target).starts_with("cuda:sm_90") && options.fuseLinearCrossEntropy;
  ChunkCrossEntropyOptions chunk;
  chunk.maxBytes = options.lossChunkBytes;
  // The head forge-fuse-linear-cross-entropy takes (below) stores no f32 logits: with
  // chunkFusedHead its chunks count the bf16 gradient (GPT-2 B16: 2 chunks, not 4).
  chunk.fusedHead = options.chunkFusedHead && fuseHead;
  pm.addPass(createChunkCrossEntropy(chunk));
  // Then each loss and its gradient in one row kernel: after chunking, which
  // matches them as a pair (and whose chunks each merge); before placement,
  // which gives the merged op its kernel.
  pm.addPass(createMergeCrossEntropyGrad());
  // Then each chunk's GEMM and loss as one CUTLASS call (sm_90a kernels):
  // after the merge, which makes the cross_entropy_with_grad it matches;
  // before placement, which gives it to the library.
  if (fuseHead)
    pm.addPass(createFuseLinearCrossEntropy());
  // Then the column sums (bias gradients) into the loop regions that make
  // what they sum: after precision, whose stored types the sums keep reading,
  // and after the loss head's stages (their gradients feed these regions);
  // before partition, which buckets the sums, and placement.
  // (CUDA only: the CPU runs regions op by op, forge-inline-fusions would
  // only take it apart again.)
  if (StringRef(options.target).starts_with("cuda") && options.fuseColumnSums)
    pm.addPass(createFuseColumnSums());
  // And a reduction over a middle axis into the loop region reading it and its
  // input (dk's centring): after precision (stored types kept) and the loss
  // head's stages, before placement, whose forge-fold-attention-views lets
  // the region write a concat's piece. (CUDA only, as the column sums.)
  if (StringRef(options.target).starts_with("cuda") && options.fuseLineReductions)
    pm.addPass(createFuseLineReductions());
  // Then a layer norm's gradient with the region reading its dx (often one
  // of those column_reduce regions): after them, before placement.
  if (StringRef(options.target).starts_with("cuda") && options.fuseNormGradEpilogues)
    pm.addPass(createFuseNormGradEpilogues());
  // Stage "partition": the gradient all-reduce (--dp) in buckets placed as
  // the backward pass makes them. After everything that changes what the
  // step computes or where its values are made (fusion, precision, the loss
  // head); before placement, which places the collectives. Only with --dp:
  // without a collective it has nothing to do (and no dump of its own).
  if (options.train.dataParallel >= 1)
    pm.addNestedPass<func::FuncOp>(createPartition());
  // Stage "accumulation" (--micro-batches K, the loop): the step cut into
  // @accumulate, one micro-batch's forward and backward that the runtime runs
  // K times, and the rest. Last of the graph stages, so that every one
  // before it sees the whole step (the gradient buckets read the sums;
  // nothing fuses across forge.accumulated); before placement, which places
  // each routine's ops, and the schedule and memory plan, one per routine.
  if (options.train.microBatches > 1) {
    SplitAccumulationOptions split;
    split.gemmAccumulation = StringRef(options.target).starts_with("cuda");
    pm.addPass(createSplitAccumulation(split));
  }
  addPlacement(pm, options);
  addSchedule(pm, options);
  addMemoryPlan(pm, options);
}

void mlir::forge::buildInferencePipeline(OpPassManager &pm, const PipelineOptions &options) {
  // No train step: initializers are constants and may fold. Composites
  // first, before folding could take their constants apart. No precision
  // pass here: CUDA keeps attention's chain (cuDNN takes no f32).
  pm.addNestedPass<func::FuncOp>(createRecognizeComposites(recognizeOptions(options, false)));
  addAugmentInputs(pm, options);
  addGraphCleanup(pm, options);
  // Layout, as in training (after the cleanup, before fusion): channels-last
  // convolutions for a forward on tensor cores. The weights are constants
  // here, so their transposes fold (training transposes parameters per step).
  if (options.layout == "nhwc") {
    AssignLayoutOptions layout;
    layout.layout = options.layout;
    pm.addNestedPass<func::FuncOp>(createAssignLayout(layout));
    pm.addNestedPass<func::FuncOp>(createFoldConstants());
    pm.addPass(createCSEPass());
    pm.addNestedPass<func::FuncOp>(createEliminateDeadCode());
  }
  addFusion(pm, options);
  addPlacement(pm, options);
  addSchedule(pm, options);
  addMemoryPlan(pm, options);
}

void mlir::forge::buildBackendPipeline(OpPassManager &pm, const PipelineOptions &options) {
  addPlacement(pm, options);
  addSchedule(pm, options);
  addMemoryPlan(pm, options);
}

void mlir::forge::registerForgeDialects(DialectRegistry &registry) {
  registry.insert<ForgeDialect, func::FuncDialect>();
  registerCodegenDialects(registry); // modules after forge-generate-kernels hold kernels
}

namespace {
/// forge-opt's options of the named pipelines: forgec's flags of the same names.
/// The options both pipelines take: forgec's target, schedule and fusion flags.
template <typename Derived> struct CommonPipelineCLOptions : public PassPipelineOptions<Derived> {
  template <typename T> using Opt = mlir::detail::PassOptions::Option<T>;
  Opt<std::string> target{*this, "target", llvm::cl::desc("cpu | cuda:sm_NN"),
                          llvm::cl::init("cpu")};
  Opt<int64_t> computeStreams{*this, "compute-streams",
                              llvm::cl::desc("as forgec --compute-streams"), llvm::cl::init(2)};
  Opt<int64_t> streamMemoryGrowth{*this, "stream-memory-growth",
                                  llvm::cl::desc("as forgec --stream-memory-growth"),
                                  llvm::cl::init(1)};
  Opt<int64_t> maxStreamPins{*this, "max-stream-pins",
                             llvm::cl::desc("as forgec --max-stream-pins"), llvm::cl::init(8)};
  Opt<std::string> scheduleOrder{*this, "schedule-order",
                                 llvm::cl::desc("as forgec --schedule-order"),
                                 llvm::cl::init("memory")};
  Opt<std::string> gemmAuxEpilogues{*this, "gemm-aux-epilogues",
                                    llvm::cl::desc("as forgec --gemm-aux-epilogues: auto "
                                                   "(default; forgec's without the flag), "
                                                   "true or false"),
                                    llvm::cl::init("auto")};
  Opt<bool> permuteParameters{*this, "permute-parameters",
                              llvm::cl::desc("as forgec --permute-parameters"),
                              llvm::cl::init(true)};
  Opt<bool> foldAttentionViews{*this, "fold-attention-views",
                               llvm::cl::desc("as forgec --fold-attention-views"),
                               llvm::cl::init(true)};
  Opt<bool> fuseNormGradEpilogues{*this, "fuse-norm-grad-epilogues",
                                  llvm::cl::desc("as forgec --fuse-norm-grad-epilogues"),
                                  llvm::cl::init(true)};
  Opt<bool> fuseLinearCrossEntropy{*this, "fuse-linear-cross-entropy",
                                   llvm::cl::desc("as forgec --fuse-linear-cross-entropy"),
                                   llvm::cl::init(true)};
  Opt<bool> foldContiguousViews{*this, "fold-contiguous-views",
                                llvm::cl::desc("as forgec --fold-contiguous-views"),
                                llvm::cl::init(true)};
  void apply(PipelineOptions &options) const {
    options.target = target;
    options.computeStreams = computeStreams;
    options.streamMemoryGrowth = streamMemoryGrowth;
    options.maxStreamPins = maxStreamPins;
    options.scheduleOrder = scheduleOrder;
    const std::string &aux = gemmAuxEpilogues;
    options.auxEpilogues = aux == "true" || aux == "on"     ? "on"
                           : aux == "false" || aux == "off" ? "off"
                                                            : "auto";
    options.foldAttentionViews = foldAttentionViews;
    options.foldContiguousViews = foldContiguousViews;
    options.fuseNormGradEpilogues = fuseNormGradEpilogues;
    options.permuteParameters = permuteParameters;
    options.fuseLinearCrossEntropy = fuseLinearCrossEntropy;
  }
};
struct InferencePipelineCLOptions : public CommonPipelineCLOptions<InferencePipelineCLOptions> {};
struct TrainingPipelineCLOptions : public CommonPipelineCLOptions<TrainingPipelineCLOptions> {
  Option<std::string> loss{*this, "loss", llvm::cl::desc("as forgec --loss")};
  Option<std::string> optimizer{*this, "optimizer", llvm::cl::desc("as forgec --optimizer")};
  Option<std::string> lrSchedule{*this, "lr-schedule", llvm::cl::desc("as forgec --lr-schedule"),
                                 llvm::cl::init("constant")};
  Option<double> clipGradNorm{*this, "clip-grad-norm",
                              llvm::cl::desc("as forgec --clip-grad-norm"), llvm::cl::init(0.0)};
  Option<int64_t> microBatches{*this, "micro-batches",
                               llvm::cl::desc("as forgec --micro-batches"), llvm::cl::init(1)};
  Option<std::string> accumulate{*this, "accumulate", llvm::cl::desc("as forgec --accumulate")};
  Option<bool> dynamicMicroBatches{*this, "dynamic-micro-batches",
                                   llvm::cl::desc("as forgec --batch-schedule (at most "
                                                  "micro-batches per step)"),
                                   llvm::cl::init(false)};
  Option<int64_t> dataParallel{*this, "dp", llvm::cl::desc("as forgec --dp"), llvm::cl::init(0)};
  Option<int64_t> tensorParallel{*this, "tp", llvm::cl::desc("as forgec --tp"), llvm::cl::init(1)};
  Option<int64_t> zero{*this, "zero", llvm::cl::desc("as forgec --zero"), llvm::cl::init(0)};
  Option<int64_t> pipeline{*this, "pp", llvm::cl::desc("as forgec --pp"), llvm::cl::init(1)};
  ListOption<std::string> freeze{*this, "freeze", llvm::cl::desc("as forgec --freeze")};
  Option<bool> exposeGradients{*this, "expose-gradients",
                               llvm::cl::desc("as forgec --expose-gradients"),
                               llvm::cl::init(false)};
  Option<bool> gradNorm{*this, "grad-norm", llvm::cl::desc("as forgec --grad-norm"),
                        llvm::cl::init(false)};
  Option<std::string> batchnormRunningVar{*this, "batchnorm-running-var",
                                          llvm::cl::desc("as forgec --batchnorm-running-var")};
  Option<std::string> precision{*this, "precision", llvm::cl::desc("as forgec --precision"),
                                llvm::cl::init("fp32")};
  Option<bool> lowNormGradients{*this, "low-norm-gradients",
                                llvm::cl::desc("as forgec --low-norm-gradients"),
                                llvm::cl::init(false)};
  Option<std::string> layout{*this, "layout",
                             llvm::cl::desc("nchw | nhwc (forgec --layout after resolving auto)"),
                             llvm::cl::init("nchw")};
  Option<std::string> lossScale{*this, "loss-scale", llvm::cl::desc("as forgec --loss-scale")};
  Option<int64_t> lossChunkBytes{*this, "loss-chunk-bytes",
                                 llvm::cl::desc("as forgec --loss-chunk-bytes"),
                                 llvm::cl::init(int64_t(1) << 30)};
  Option<std::string> recompute{*this, "recompute", llvm::cl::desc("as forgec --recompute"),
                                llvm::cl::init("none")};
};
} // namespace

void mlir::forge::registerForgePassesAndPipelines() {
  registerForgePasses();
  registerForgeCodegenPasses();
  registerCanonicalizerPass();
  registerCSEPass();
  PassPipelineRegistration<InferencePipelineCLOptions>(
      "forge-inference-pipeline", "The Forge pipeline of inference bundles (forgec --inference-only)",
      [](OpPassManager &pm, const InferencePipelineCLOptions &cl) {
        PipelineOptions options;
        cl.apply(options);
        buildInferencePipeline(pm, options);
      });
  PassPipelineRegistration<TrainingPipelineCLOptions>(
      "forge-training-pipeline", "The Forge pipeline of training bundles (forgec's default)",
      [](OpPassManager &pm, const TrainingPipelineCLOptions &cl) {
        PipelineOptions options;
        cl.apply(options);
        options.train.loss = cl.loss;
        options.train.optimizer = cl.optimizer;
        options.train.lrSchedule = cl.lrSchedule;
        options.train.clipGradNorm = cl.clipGradNorm;
        options.train.microBatches = cl.microBatches;
        options.train.accumulate = cl.accumulate;
        options.train.dynamicMicroBatches = cl.dynamicMicroBatches;
        options.train.dataParallel = cl.dataParallel;
        options.tensorParallel = cl.tensorParallel;
        options.train.zero = cl.zero;
        options.train.pipeline = cl.pipeline;
        options.train.freeze.assign(cl.freeze.begin(), cl.freeze.end());
        options.train.exposeGradients = cl.exposeGradients;
        options.train.gradNorm = cl.gradNorm;
        options.train.batchnormRunningVar = cl.batchnormRunningVar;
        options.train.lossScale = cl.lossScale;
        options.precision = cl.precision;
        options.lowNormGradients = cl.lowNormGradients;
        options.layout = cl.layout;
        options.lossChunkBytes = cl.lossChunkBytes;
        options.recompute = cl.recompute;
        buildTrainingPipeline(pm, options);
      });
}

namespace {

struct GraphSummary {
  // launches: ops that run as their own kernel or library call, i.e. all but
  // reshapes (views: the memory plan aliases them) and constants; a fusion
  // region is one. library: those of the library class (cuBLASLt/cuDNN) and
  // gemm regions.
  // bytes and FLOPs: of the launches (reshapes move nothing).
  int64_t ops = 0, launches = 0, library = 0, bytes = 0, flops = 0;
  std::vector<std::pair<std::string, int64_t>> launchesPerFunction;
  // Each launch's estimate, for costs.txt: its routine, "op [kind]", its node.
  struct Launch {
    std::string func, op, node;
    OpCost cost;
  };
  std::vector<Launch> entries;
};

GraphSummary summarize(ModuleOp module) {
  GraphSummary s;
  for (auto func : module.getOps<func::FuncOp>()) {
    int64_t before = s.launches;
    func.walk<WalkOrder::PreOrder>([&](Operation *op) {
      // A fusion region is one launch; its body's values stay in registers,
      // so its bytes are its inputs and results (FusionOp::getCost).
      if (auto fusion = dyn_cast<FusionOp>(op)) {
        fusion.getBlock().walk([&](ForgeOpInterface) { ++s.ops; });
        ++s.launches;
        if (fusion.getKind() == "gemm") // a library call with its epilogue
          ++s.library;
        OpCost c = fusion.getCost();
        s.bytes += c.bytes;
        s.flops += c.flops;
        s.entries.push_back({func.getSymName().str(), launchKind(op), sourceNodeName(op).str(), c});
        return WalkResult::skip();
      }
      auto forgeOp = dyn_cast<ForgeOpInterface>(op);
      if (!forgeOp || isa<ConstantOp>(op))
        return WalkResult::advance();
      ++s.ops;
      auto placement = op->getAttrOfType<StringAttr>("forge.placement");
      if (isa<ReshapeOp>(op) || (placement && placement.getValue() == "view"))
        return WalkResult::advance(); // a view: no launch, no traffic (the memory plan aliases it)
      ++s.launches;
      if (forgeOp.getFusionClass() == FusionClass::Library)
        ++s.library;
      OpCost c = forgeOp.getCost();
      s.bytes += c.bytes;
      s.flops += c.flops;
      s.entries.push_back({func.getSymName().str(), launchKind(op), sourceNodeName(op).str(), c});
      return WalkResult::advance();
    });
    s.launchesPerFunction.push_back({func.getSymName().str(), s.launches - before});
  }
  return s;
}

std::string sanitize(StringRef name) {
  std::string out;
  for (char c : name)
    out.push_back(llvm::isAlnum(c) || c == '-' || c == '_' ? c : '-');
  return out;
}

/// costs.txt, rewritten after every stage (so it describes the last one):
/// each routine's launches by estimated bytes, largest first, then their sums
/// by kind. The floor is max(bytes / 3 TB/s, FLOPs / 700 TFLOP/s), roughly an
/// H100's memory and bf16 GEMM rates: a yardstick for finding the kernels
/// whose traffic or work dominates without a GPU, not a prediction.
LogicalResult writeCosts(ModuleOp module, const GraphSummary &s, StringRef dir, int index,
                         StringRef stage) {
  std::error_code ec;
  llvm::raw_fd_ostream out((dir + "/costs.txt").str(), ec);
  if (ec)
    return module.emitError() << "cannot write costs.txt: " << ec.message();
  auto floorUs = [](const OpCost &c) {
    return std::max(double(c.bytes) / 3e12, double(c.flops) / 7e14) * 1e6;
  };
  out << llvm::formatv("# {0:2}-{1}: launches by estimated bytes; floor = max(bytes / 3 TB/s, "
                       "FLOPs / 700 TFLOP/s)\n",
                       index, stage);
  for (auto [func, count] : s.launchesPerFunction) {
    std::vector<const GraphSummary::Launch *> rows;
    for (const GraphSummary::Launch &l : s.entries)
      if (l.func == func)
        rows.push_back(&l);
    std::stable_sort(rows.begin(), rows.end(),
                     [](auto *a, auto *b) { return a->cost.bytes > b->cost.bytes; });
    OpCost total;
    double floor = 0;
    llvm::StringMap<std::pair<int64_t, OpCost>> byKind;
    std::vector<std::string> kinds; // first-seen order, for a stable listing
    for (const GraphSummary::Launch *l : rows) {
      total.bytes += l->cost.bytes, total.flops += l->cost.flops;
      floor += floorUs(l->cost);
      auto [it, fresh] = byKind.try_emplace(l->op, 0, OpCost{});
      if (fresh)
        kinds.push_back(l->op);
      ++it->second.first;
      it->second.second.bytes += l->cost.bytes, it->second.second.flops += l->cost.flops;
    }
    out << llvm::formatv("\n## {0}: {1} launches, {2} bytes, {3} FLOPs, floor {4:F1} us\n", func,
                         count, total.bytes, total.flops, floor);
    out << llvm::formatv("{0,14} {1,18} {2,10}  launch\n", "bytes", "FLOPs", "floor_us");
    for (const GraphSummary::Launch *l : rows)
      out << llvm::formatv("{0,14} {1,18} {2,10:F1}  {3}{4}\n", l->cost.bytes, l->cost.flops,
                           floorUs(l->cost), l->op,
                           l->node.empty() ? std::string() : " '" + l->node + "'");
    out << llvm::formatv("## {0} by kind\n{1,6} {2,14} {3,18}  kind\n", func, "count", "bytes",
                         "FLOPs");
    std::stable_sort(kinds.begin(), kinds.end(), [&](const std::string &a, const std::string &b) {
      return byKind[a].second.bytes > byKind[b].second.bytes;
    });
    for (const std::string &k : kinds)
      out << llvm::formatv("{0,6} {1,14} {2,18}  {3}\n", byKind[k].first, byKind[k].second.bytes,
                           byKind[k].second.flops, k);
  }
  return success();
}

LogicalResult writeDumpFiles(ModuleOp module, StringRef dir, int index, StringRef stage) {
  if (auto ec = llvm::sys::fs::create_directories(dir))
    return module.emitError() << "cannot create dump directory '" << dir << "': " << ec.message();
  std::string base = llvm::formatv("{0}/{1:2}-{2}", dir, index, sanitize(stage)).str();
  {
    std::error_code ec;
    llvm::raw_fd_ostream out(base + ".mlir", ec);
    if (ec)
      return module.emitError() << "cannot write '" << base << ".mlir': " << ec.message();
    // Large constants are elided so dumps stay readable; the round-trip test
    // covers printing without elision.
    OpPrintingFlags flags;
    flags.elideLargeElementsAttrs(64);
    module.print(out, flags);
  }
  if (failed(exportGraphToOnnx(module, base + ".onnx")))
    return failure();
  GraphSummary s = summarize(module);
  // One run's stages, in order: a stage numbered at or before the file's last
  // line belongs to a new run (forgec or forge-opt again into the same
  // directory), which starts the file afresh rather than appending to it.
  std::string summaryPath = (dir + "/summary.txt").str();
  auto openMode = llvm::sys::fs::OF_Append;
  if (auto old = llvm::MemoryBuffer::getFile(summaryPath)) {
    StringRef text = (*old)->getBuffer().rtrim();
    StringRef last = text.substr(text.rfind('\n') + 1);
    int previous = -1;
    if (!last.take_while(llvm::isDigit).getAsInteger(10, previous) && previous >= index)
      openMode = llvm::sys::fs::OF_None;
  }
  std::error_code ec;
  llvm::raw_fd_ostream summary(summaryPath, ec, openMode);
  if (ec)
    return module.emitError() << "cannot write summary: " << ec.message();
  summary << llvm::formatv("{0:2}-{1}: {2} ops, {3} launches ({4} library calls), {5} bytes, "
                           "{6} FLOPs",
                           index, stage, s.ops, s.launches, s.library, s.bytes, s.flops);
  // Per function when there are several (a training bundle: train_step, eval).
  if (s.launchesPerFunction.size() > 1)
    for (auto [i, entry] : llvm::enumerate(s.launchesPerFunction))
      summary << (i == 0 ? "; launches by routine: " : ", ") << entry.first << " "
              << entry.second;
  summary << "\n";
  return writeCosts(module, s, dir, index, stage);
}

class DumpInstrumentation : public PassInstrumentation {
public:
  DumpInstrumentation(std::string dir, int next) : dir(std::move(dir)), next(next) {}
  void runAfterPass(Pass *pass, Operation *op) override {
    auto module = dyn_cast<ModuleOp>(op);
    if (!module)
      module = op->getParentOfType<ModuleOp>();
    if (!module)
      return;
    // Pass-manager adaptors (nesting into functions) have no argument and are
    // not stages of their own.
    StringRef name = pass->getArgument();
    if (name.empty())
      return;
    // A function pass runs once per function (in order, multithreading is
    // off): dump once, after the last function.
    if (isa<func::FuncOp>(op))
      for (Operation *next = op->getNextNode(); next; next = next->getNextNode())
        if (isa<func::FuncOp>(next))
          return;
    (void)writeDumpFiles(module, dir, next++, name);
  }

private:
  std::string dir;
  int next;
};

} // namespace

void mlir::forge::addDumpInstrumentation(PassManager &pm, StringRef dir, int firstIndex) {
  // Dumps must see the whole module after each pass: no multi-threaded nesting.
  pm.getContext()->disableMultithreading();
  pm.addInstrumentation(std::make_unique<DumpInstrumentation>(dir.str(), firstIndex));
}

LogicalResult mlir::forge::writeStageDump(ModuleOp module, StringRef dir, int index,
                                          StringRef stage) {
  return writeDumpFiles(module, dir, index, stage);
}
