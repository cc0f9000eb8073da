//===- TrainGraph.h - inference graph -> training step ---------------------===//
//
// Turns the imported `@main` into the two routines of a training bundle
// (docs/bundle-format.md): `@train_step` (forward, loss, reverse-mode
// gradients through DifferentiableOpInterface, optional gradient clipping,
// learning-rate schedule, optimizer update of every trainable parameter, all
// as ordinary forge ops) and `@eval` (forward and loss, plus the number of
// correct predictions for classification losses).
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_TRAIN_TRAINGRAPH_H
#define FORGE_TRAIN_TRAINGRAPH_H

#include <optional>
#include <string>
#include <vector>

#include "forge/Train/TrainFlags.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::forge {

struct LossSpec {
  /// "output" (the model computes its loss), "cross_entropy", "mse", "bce"
  /// (binary cross-entropy on logits).
  std::string kind;
  /// The model output the loss reads (or that is the loss for "output").
  std::string output;
  /// Name of the label input Forge adds (not used for "output").
  std::string label;
  /// cross_entropy's label smoothing (PyTorch's label_smoothing): the training loss is
  /// (1 - s) * NLL + s * mean over classes of -log p; eval reports the plain NLL.
  double smoothing = 0.0;
  /// cross_entropy's `probs`: the label input holds class probabilities (float, the
  /// output's shape: one-hot, soft or mixed targets, PyTorch's probability targets)
  /// instead of class indices. The loss is -sum_c q_c log p_c per row, q smoothed
  /// as (1 - s) q + s / C with smoothing S.
  bool probs = false;
  /// cross_entropy's `ignore=N`: label N marks a position without a target (padding of a
  /// length bucket, PyTorch's ignore_index): no loss term, no gradient; the mean is over
  /// the other labels, and eval also returns their count (forge.label_count).
  std::optional<int64_t> ignoreIndex;
};

struct OptimizerSpec {
  /// "sgd" (momentum > 0 gives heavy-ball momentum, nesterov for Nesterov),
  /// "adam" (L2 weight decay added to the gradient), "adamw" (decoupled).
  std::string kind = "sgd";
  double lr = 1e-3;
  double momentum = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weightDecay = 0.0;
};

struct ScheduleSpec {
  /// "constant", "cosine" (linear warm-up then cosine decay to minRatio*lr),
  /// "linear" (linear warm-up then linear decay to minRatio*lr).
  std::string kind = "constant";
  int64_t warmupSteps = 0;
  int64_t totalSteps = 0;
  double minRatio = 0.0;
};

/// Dynamic loss scaling (fp16): the loss is multiplied by `scale` before the
/// backward pass and the gradients divided by it after; a step whose
/// gradients are not finite changes nothing but the scale (times `backoff`),
/// and `interval` finite steps in a row multiply it by `growth`. The scale
/// and the count of good steps are state (forge.loss_scale,
/// forge.good_steps); the step reports the scale it used and whether it
/// skipped (forge.skipped).
struct LossScaleSpec {
  bool dynamic = false;
  double init = 65536.0;
  int64_t interval = 2000;
  double growth = 2.0, backoff = 0.5;
};

/// Parses "dynamic[:init=S,interval=N,growth=G,backoff=B]" ("" or "none": off).
FailureOr<LossScaleSpec> parseLossScaleSpec(llvm::StringRef text, std::string &error);

struct TrainOptions {
  LossSpec loss;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  /// Clip the global gradient norm to this value (0: off).
  double clipGradNorm = 0.0;
  LossScaleSpec lossScale;
  /// Gradient accumulation: micro-batches per optimizer step.
  int64_t microBatches = 1;
  /// With microBatches > 1: one micro-batch's forward and backward, run K times
  /// (the routine @accumulate after forge-split-accumulation), adding each
  /// gradient into a persistent f32 accumulator (state "NAME.grad_accum", role
  /// "grad_accumulator"; the first micro-batch's gradient replaces its value),
  /// which the rest of the step (norm, collectives, optimizer) reads. False:
  /// K unrolled copies in one step (what pipeline stages reorder into 1F1B).
  bool accumulateLoop = false;
  /// The loop runs a varying number of times per step (forgec --batch-schedule;
  /// at most microBatches): the step reads its count as the i64 input
  /// forge.micro_count (the first micro-batch is index % count == 0; the
  /// gradients and the loss are scaled by 1 / count) instead of constants.
  bool dynamicMicroBatches = false;
  /// Data parallelism: the step runs on `dataParallel` ranks, each on its own
  /// batch; the gradients (and the reported loss) are averaged over them by one
  /// forge.all_reduce (group "dp") before the norm and the optimizer, which
  /// forge-partition splits into buckets. 0: no collective; 1: the collective
  /// over a group of one (the code path of D ranks, on one device).
  int64_t dataParallel = 0;
  /// Pipeline parallelism: the forward's ops carry forge.stage marks
  /// (forge-assign-pipeline-stages) and every op the step builds from them is
  /// marked too: a gradient rule's ops with its forward op's stage, an
  /// optimizer update with its parameter's stage (that of its first forward
  /// use), and each micro-batch's ops with forge.micro (and forge.backward),
  /// which forge-split-pipeline-stages needs for the 1F1B order. 1: none.
  int64_t pipeline = 1;
  /// ZeRO-1 (with dataParallel >= 1): the optimizer state of each parameter
  /// whose dim 0 divides by dataParallel is split over the ranks along it;
  /// each rank reduces its part of the gradient (forge.reduce_scatter),
  /// updates its part of the parameter and state, and the ranks gather the
  /// parameter (forge.all_gather). 0: off.
  int64_t zero = 0;
  /// Glob patterns of initializer names that stay frozen.
  std::vector<std::string> freeze;
  /// Also return every parameter's gradient (after accumulation, before
  /// clipping) as train_step outputs `forge.grad.<name>` (for parity tests
  /// and debugging; it keeps the gradients alive, so it costs memory).
  bool exposeGradients = false;
  /// Compute the global gradient norm and output it (forge.grad_norm) even where neither
  /// clipping nor dynamic loss scaling reads it (a pass over every gradient: ~1% of GPT-2
  /// 124M's bf16 step on an H100).
  bool gradNorm = false;
  /// BatchNorm's running variance from the unbiased batch variance (PyTorch)
  /// rather than the biased one (ONNX's rule). Unset: unbiased when the
  /// module's `forge.producer` is PyTorch.
  std::optional<bool> unbiasedRunningVar;
};

/// Parses "kind:key=value,..." option strings; errors name the bad part.
FailureOr<LossSpec> parseLossSpec(llvm::StringRef text, std::string &error);
FailureOr<OptimizerSpec> parseOptimizerSpec(llvm::StringRef text, std::string &error);
FailureOr<ScheduleSpec> parseScheduleSpec(llvm::StringRef text, std::string &error);

/// Parses and checks the text form of the options (forgec's flags, the
/// forge-build-train-step pass options); `error` names the flag at fault
/// ("--loss: ...").
FailureOr<TrainOptions> parseTrainFlags(const TrainFlags &flags, std::string &error);

/// Replaces `@main` with `@train_step` and `@eval`.
LogicalResult buildTrainingModule(ModuleOp module, const TrainOptions &options);

/// Pipeline stages (forgec --pp): the stage forge-assign-pipeline-stages (or
/// the train step built from its marks) gave `op`, its `forge.stage`, if any.
std::optional<int64_t> pipelineStageOf(Operation *op);
/// The stage `v` is made on as forge-split-pipeline-stages places it: its
/// producer's mark, else the latest of its operands' stages (a sum of
/// gradient contributions); -1 for constants and arguments. `memo` caches the
/// producers seen (one per routine).
int64_t pipelineStageMaking(Value v, llvm::DenseMap<Operation *, int64_t> &memo);

} // namespace mlir::forge

#endif // FORGE_TRAIN_TRAINGRAPH_H
