// forge-train's parsed command line (main.cpp fills it from the flags and the
// --recipe TOML file; the modes read it). Plain data, no logic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::train {

struct Options {
  std::string bundlePath;
  std::string device = "auto";
  std::string weightsDir; // thin bundles: where the external-data files are // cpu, cuda, cuda:N, auto (Executor.h)
  bool noCudaGraph = false;
  std::string attentionBackward = "fast"; // fast | deterministic (cuDNN)
  bool noPipeline = false;
  unsigned threads = 0;
  unsigned workers = 0; // data workers (TrainerOptions::workers)
  unsigned prefetch = 2; // batches made ahead (TrainerOptions::prefetch)
  int nproc = 0;          // --nproc: start this many ranks (Launch.h); 0: this process is one
  double timeoutSeconds = 600; // collectives and the rendezvous (data parallelism)

  // --info / --forward
  bool info = false;
  bool forward = false;
  std::string inputsNpz;
  std::vector<std::string> inputFiles; // NAME=file.npy
  std::string outputsNpz;

  // training
  std::string recipe;
  std::vector<std::string> data, evalData;
  std::string tokenDType = "uint16";
  std::optional<int64_t> docSeparator; // token shards as documents (length buckets)
  // Image folders (--data DIR): decoding and normalization.
  int64_t imageResize = 0;
  std::vector<float> imageMean, imageStd;
  std::string imageNormalize; // "imagenet": ImageNet's mean/std unless given
  std::string badRecords = "fail";
  bool randomResizedCrop = false;
  std::string decode = "cpu";    // --decode: who decodes the JPEGs (TrainerOptions::imageDecode)
  std::vector<double> cropScale; // min,max of the area share (--random-resized-crop)
  int64_t steps = 0, epochs = 0;
  uint64_t seed = 0;
  bool seedGiven = false;
  bool noShuffle = false;
  int64_t evalEvery = 0;
  std::string metricsPath;
  std::string ckptDir;
  int64_t ckptEvery = 0;
  /// auto | whole | sharded: with several ranks, auto is sharded (one file per
  /// rank in a directory, no gather); whole gathers every tensor to rank 0.
  std::string ckptFormat = "auto";
  bool resume = false;
  std::string exportOnnx, onnxModel;
  std::string dumpParams;
  /// Rank 0 writes --dump-params or --export-onnx: this rank takes part in
  /// gathering their split tensors (forgec --tp, --zero 1).
  bool gatherForRankZero = false;
  std::string dumpGrads;
  int64_t logEvery = 10;
  std::string profilePath; // --profile trace.json
  int64_t profileSteps = 5;
};

/// Training mode (TrainMode.cpp).
int runTrainMode(const Options &opts);

} // namespace forge::train
