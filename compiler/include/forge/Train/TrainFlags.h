//===- TrainFlags.h - the training options as text --------------*- C++ -*-===//
//
// The training step's options as the user writes them (forgec's flags, a
// recipe, or the options of the `forge-build-train-step` pass). Plain C++ on
// purpose: forge/Pipeline/Pipeline.h carries it without MLIR headers. The
// parsed form is `TrainOptions` (forge/Train/TrainGraph.h, parseTrainFlags).
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_TRAIN_TRAINFLAGS_H
#define FORGE_TRAIN_TRAINFLAGS_H

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::forge {

struct TrainFlags {
  std::string loss;                   // cross_entropy:OUT,LABEL | mse:.. | bce:.. | output:NAME
  std::string optimizer;              // sgd|momentum|nesterov|adam|adamw[:k=v,...]
  std::string lrSchedule = "constant";
  double clipGradNorm = 0.0;          // 0: off
  int64_t microBatches = 1;
  std::string accumulate;             // "" (auto) | loop | unroll (forgec --accumulate)
  bool dynamicMicroBatches = false;   // K varies per step, <= microBatches (--batch-schedule)
  int64_t dataParallel = 0;           // ranks of the data-parallel group (forgec --dp; 0: none)
  int64_t pipeline = 1;               // pipeline stages (forgec --pp; 1: none)
  int64_t zero = 0;                   // ZeRO stage (forgec --zero; 0: none, 1: optimizer state split)
  std::vector<std::string> freeze;    // glob patterns of initializer names
  bool exposeGradients = false;
  bool gradNorm = false;              // forge.grad_norm without clipping or loss scaling
  std::string batchnormRunningVar;    // "", "biased" or "unbiased"
  std::string lossScale;              // "" (none) | dynamic[:init=,interval=,growth=,backoff=]
};

} // namespace mlir::forge

#endif // FORGE_TRAIN_TRAINFLAGS_H
