//===- BuildTrainStep.cpp - @main -> @train_step and @eval ------------------===//
//
// The pass form of the training-step construction (compiler/lib/Train), so
// that the pipeline builds it as a named stage and forge-opt can reproduce it
// from the import dump. Runs before constant folding: parameters must become
// arguments before any folder could fold an initializer into a new constant.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Train/TrainGraph.h"

namespace mlir::forge {
#define GEN_PASS_DEF_BUILDTRAINSTEP
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {
struct BuildTrainStepPass
    : public mlir::forge::impl::BuildTrainStepBase<BuildTrainStepPass> {
  using BuildTrainStepBase::BuildTrainStepBase;

  void runOnOperation() override {
    TrainFlags flags;
    flags.loss = loss;
    flags.optimizer = optimizer;
    flags.lrSchedule = lrSchedule;
    flags.clipGradNorm = clipGradNorm;
    flags.microBatches = microBatches;
    flags.accumulate = accumulate;
    flags.dynamicMicroBatches = dynamicMicroBatches;
    flags.dataParallel = dataParallel;
    flags.zero = zero;
    flags.pipeline = pipeline;
    flags.freeze.assign(freeze.begin(), freeze.end());
    flags.exposeGradients = exposeGradients;
    flags.gradNorm = gradNorm;
    flags.batchnormRunningVar = batchnormRunningVar;
    flags.lossScale = lossScale;
    std::string error;
    FailureOr<TrainOptions> options = parseTrainFlags(flags, error);
    if (failed(options)) {
      getOperation().emitError() << error;
      return signalPassFailure();
    }
    if (failed(buildTrainingModule(getOperation(), *options)))
      return signalPassFailure();
  }
};
} // namespace
