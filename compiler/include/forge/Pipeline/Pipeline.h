//===- Pipeline.h - the Forge pass pipeline and its dumps -----------------===//
#ifndef FORGE_PIPELINE_PIPELINE_H
#define FORGE_PIPELINE_PIPELINE_H

#include <string>
#include <vector>

#include "forge/Train/TrainFlags.h"

#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/StringRef.h"

namespace mlir {
class OpPassManager;
class PassManager;
class ModuleOp;
class DialectRegistry;
} // namespace mlir

namespace mlir::forge {

/// Everything a stage of the pipeline needs (forgec's flags).
struct PipelineOptions {
  std::string target = "cpu"; // cpu | cuda:sm_NN
  TrainFlags train;           // the train-step stage (training pipeline only)
  bool memoryReport = false;  // the memory plan prints its peak (forgec --memory-report)
  // forge-fuse's aux-epilogues and relu-aux-epilogues (forgec --gemm-aux-epilogues): auto
  // (the GELU's in bf16, none otherwise), on (the GELU's and the ReLU's), off.
  std::string auxEpilogues = "auto";
  bool foldAttentionViews = true; // forge-fold-attention-views (forgec --fold-attention-views)
  bool foldContiguousViews = true; // forge-fold-contiguous-views (forgec --fold-contiguous-views)
  bool fuseNormGradEpilogues =
      true; // forge-fuse-norm-grad-epilogues (forgec --fuse-norm-grad-epilogues)
  bool permuteParameters = true;  // forge-permute-parameters (forgec --permute-parameters)
  std::string scheduleOrder = "memory"; // forge-schedule's order (forgec --schedule-order)
  int64_t computeStreams = 2;   // forge-schedule's compute streams, CUDA (forgec --compute-streams)
  int64_t streamMemoryGrowth = 1; // ... and the peak growth they may cost, % (--stream-memory-growth)
  // ... side ops put back in order for it (--max-stream-pins): GPT-2 bf16 B16 keeps 7 of its
  // 322 side ops in order (the LM head's chunks) and runs the rest beside within the 1%
  // (-0.20 ms a step on an H100; bench/RESULTS.md "thirty-ninth session").
  int64_t maxStreamPins = 8;
  bool scheduleReport = false;  // forge-schedule prints its timeline (forgec --schedule-report)
  std::string scheduleFile;     // ... and appends it here (forgec --dump-dir: schedule.txt)
  int64_t gemmPadMinFlops = int64_t(1) << 30; // forge-pad-contractions (forgec --gemm-pad-min-flops)
  std::string precision = "fp32"; // forge-assign-precision (forgec --precision)
  bool fuseColumnSums = true;     // forge-fuse-column-sums (forgec --fuse-column-sums)
  bool fuseLineReductions = true; // forge-fuse-line-reductions (forgec --fuse-line-reductions)
  // forge-fuse-linear-cross-entropy (forgec --fuse-linear-cross-entropy; cuda:sm_90 only)
  bool fuseLinearCrossEntropy = true;
  // forge-chunk-cross-entropy's fused-head: a fusible head's chunks count its bf16 gradient,
  // not the f32 logits it never stores (GPT-2 B16: 2 chunks, not 4; -0.17 ms a step on an
  // H200, bench/RESULTS.md "thirty-ninth session").
  bool chunkFusedHead = true;
  bool mergeReductions = true;    // forge-merge-reductions (forgec --merge-reductions)
  // forge-elide-centred-sums (forgec --elide-centred-sums): GPT-2 bf16 -0.15 ms a step on an
  // H100 (bench/RESULTS.md "fortieth session"), first losses within 6.6e-4 of the unmarked sums'.
  bool elideCentredSums = true;
  std::string fp8Scaling = "current"; // ... its fp8 scaling (forgec --fp8-scaling)
  unsigned fp8History = 16;       // ... delayed scaling's amax history (forgec --fp8-history)
  std::string fp8Gradients = "bf16"; // ... the backward's GEMMs (forgec --fp8-gradients)
  // forge-assign-precision's low-norm-gradients (forgec --low-norm-gradients): a layer norm's
  // gradient reads its grad_output (the next linear layer's dX) in bf16/f16. Off: GPT-2 bf16
  // -0.20 ms on an H100 and its numerics test passes, but the small fixtures' norm biases
  // (sums of the rounded dy) leave the bf16 parameter tolerances (bench/RESULTS.md "fortieth").
  bool lowNormGradients = false;
  std::string layout = "nchw";    // forge-assign-layout (forgec --layout)
  int64_t lossChunkBytes = int64_t(1) << 30; // forge-chunk-cross-entropy (forgec --loss-chunk-bytes)
  std::string recompute = "none"; // forge-rematerialize (forgec --recompute)
  int64_t tensorParallel = 1;     // forge-shard-tensor-parallel (forgec --tp; 1: none)
  /// forge-augment-inputs (forgec --augment): the image input, raw u8 pixels, normalization.
  struct Augment {
    std::string input; // empty: no augmentation
    bool pixels = false, flip = false;
    std::vector<double> mean, std;
    int64_t canvasHeight = 0, canvasWidth = 0; // pixels in a canvas, cropped in the graph
  } augment;
};

/// The pipeline of a training bundle, in named stages (../shared/DESIGN.md §4): import
/// cleanup -> train-step construction -> graph cleanup -> layout ->
/// recomputation -> fusion -> precision -> memory shaping -> placement ->
/// memory plan (partition and schedule go before placement as those passes
/// land). The ordering constraint of every stage is commented in Pipeline.cpp.
void buildTrainingPipeline(OpPassManager &pm, const PipelineOptions &options);
/// The pipeline of an inference bundle (`forgec --inference-only`): the
/// training pipeline without the train-step stage.
void buildInferencePipeline(OpPassManager &pm, const PipelineOptions &options);

/// The last stages alone (placement, memory plan): what a module built by
/// hand (tests) needs before the bundle emitter takes it.
void buildBackendPipeline(OpPassManager &pm, const PipelineOptions &options);

/// Registers the forge dialect, func, and all Forge passes and named pipelines
/// (for forge-opt and forgec).
void registerForgeDialects(DialectRegistry &registry);
void registerForgePassesAndPipelines();

/// After every pass, writes `dir/NN-passname.mlir`, for graph-level stages
/// `dir/NN-passname.onnx`, and appends a summary line (ops, kernels, bytes,
/// FLOPs) to `dir/summary.txt`. `firstIndex` numbers the first pass.
void addDumpInstrumentation(PassManager &pm, llvm::StringRef dir, int firstIndex = 1);
/// Writes the same files for a stage that is not a pass (e.g. "import").
LogicalResult writeStageDump(ModuleOp module, llvm::StringRef dir, int index,
                             llvm::StringRef stage);

} // namespace mlir::forge

#endif // FORGE_PIPELINE_PIPELINE_H
