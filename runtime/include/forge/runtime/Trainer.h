// The training loop's engine (docs/bundle-format.md "Routines"): binds a
// training bundle's `train_step` and `eval` routines to data sources, runs
// optimizer steps and evaluations on a device (Executor.h), and exposes the state a
// checkpoint needs. forge-train adds the CLI, progress and metrics around it.
//
// Invariants:
//  * create() checks everything that can be checked before the first step:
//    the routines and their outputs, the data inputs (with micro-batches K,
//    `NAME@0..NAME@{K-1}`; a common batch size B), and the data against them
//    (DataSource::bind). Errors name the bundle input and the file.
//  * A bundle with an accumulation loop (forgec --accumulate loop, the
//    default with K > 1) has a routine `accumulate` (one micro-batch's forward
//    and backward, data inputs NAME) that a step runs K times, each on its
//    micro-batch's buffers (and forge.micro_index = rank * K + k; the first
//    micro-batch through `accumulate_first` where the bundle has it), then
//    train_step once. Such steps pipeline as plain ones do (the device keeps
//    each routine's previous read-back apart, Executor::routineOutput).
//  * A batch-size schedule (forgec --batch-schedule, build option
//    "batch_schedule") sets K per step: step s takes samplesAt(s) = K_s * B
//    samples (K_s <= the bundle's micro_batches), runs accumulate K_s times and
//    feeds forge.micro_count = K_s; when fewer than the step's samples are left
//    in the epoch, the rest is dropped and the next epoch starts.
//  * Step s (1-based) feeds forge.step = s and the next K*B samples of the
//    EpochSampler (micro-batch k gets samples [k*B, (k+1)*B)), so the losses
//    are a function of (bundle, data, seed, thread count) only, and a run
//    restored from a checkpoint taken after step k continues identically.
//  * Length buckets (forgec --length-buckets, build option length_buckets
//    "NAME=T1,...,Tn"): train_step/eval run T = Tn, train_step@lenTk/eval@lenTk
//    the smaller Tk. With variable-length data (DataSource::variableLength:
//    documents), every sample belongs to the smallest bucket that holds it; the
//    sampler's steps each take samples of one bucket (EpochSampler groups),
//    filled at the bucket's length (fillAt: padded) into the trainer's own
//    buffers, and run that bucket's routine. They pipeline too: each launched
//    step keeps its bucket, and the older of two in flight reads its loss from
//    its routine's last run, or the one before when the newer step ran the same
//    bucket. Evaluation runs each bucket's eval on its samples, in order.
//  * evaluate() reads parameters but never changes them or the sampler.
//  * gradientOutputs() (bundles from forgec --expose-gradients) are arena
//    tensors: they hold the last step's gradients until the next step() or
//    evaluate().
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "forge/runtime/BatchSchedule.h"
#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/Executor.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/ThreadPool.h"

namespace forge::rt {

/// Where a rank sits among D x P x T ranks (forgec --dp, --pp P, --tp T): rank =
/// (d * P + stage) * T + t. The T ranks of a tensor-parallel group are consecutive,
/// a pipeline is the P ranks of one (d, t), a data-parallel group the D ranks of
/// one (stage, t). The one statement of the layout: the trainer picks the stage's
/// routines by it, forge-train makes the groups by it.
struct RankLayout {
  int dp = 1, pp = 1, tp = 1; // group sizes (world = dp * pp * tp)
  int d = 0, stage = 0, t = 0; // this rank's place
  static RankLayout of(int rank, int world, int pp, int tp) {
    RankLayout l;
    l.pp = std::max(pp, 1), l.tp = std::max(tp, 1);
    l.dp = std::max(world / (l.pp * l.tp), 1);
    l.d = rank / (l.pp * l.tp), l.stage = rank / l.tp % l.pp, l.t = rank % l.tp;
    return l;
  }
  int rankOf(int d_, int stage_, int t_) const { return (d_ * pp + stage_) * tp + t_; }
};

struct TrainerOptions {
  unsigned threads = 0; // CPU threads (0: all cores)
  /// Data workers: threads that fill a step's batch side by side, each its own
  /// samples (sources whose fill() may run concurrently: arrays, token shards). 0: one per
  /// hardware thread, at most 8; 1: the calling thread alone.
  unsigned workers = 0;
  /// Batches made ahead of the step that takes them: a producer thread (with the
  /// data workers) fills the next `prefetch` steps' batches into a ring of
  /// prefetch + 1 host buffer sets (pinned on a GPU), so a slow batch is absorbed
  /// by the ones before it. 0: launch() fills each batch itself (still while the
  /// GPU runs the step before). The batches' bytes do not depend on it.
  unsigned prefetch = 2;
  /// Data parallelism (forgec --dp D): this process is rank `rank` of `worldSize`
  /// (D), connected through collectiveGroup("dp"). Every rank draws the same global
  /// order of D * K * B samples per step and takes its own share
  /// [rank * K * B, (rank + 1) * K * B); checkpoints store the global layout, so a
  /// run resumes on another D with the same global batch.
  int rank = 0, worldSize = 1;
  uint64_t seed = 0;    // shuffling seed
  bool shuffle = true;  // false: visit samples in file order every epoch
  std::string device = "cpu"; // Executor.h: cpu, cuda, cuda:N, auto
  bool cudaGraphs = true;
  bool deterministicAttention = false; // ExecutorOptions::deterministicAttention
  /// JPEGs of the training image folder decoded by the device (Executor::bindEncodedInput,
  /// DataSource::encodeImages; a canvas bundle): "gpu" (an error where it cannot), "auto"
  /// (where it can), "cpu" (never: the data workers decode).
  std::string imageDecode = "cpu";
  /// Makes the executor instead of createExecutor (tests: an executor wrapping another).
  std::function<Expected<std::unique_ptr<Executor>>(const Bundle &, const ExecutorOptions &)>
      makeExecutor;
};

struct StepResult {
  int64_t step = 0; // 1-based global step just completed
  int64_t samples = 0; // this rank's samples of the step (Trainer::samplesAt)
  /// Variable-length data: the step's length bucket (its sequence length), and the
  /// tokens with a label over every rank (padding excluded); 0 otherwise.
  int64_t length = 0, realTokens = 0;
  double flops = 0;    // the step's FLOPs by the compiler's cost model (0 if unknown)
  float loss = 0;
  std::optional<float> lr, gradNorm;
  // Dynamic loss scaling (forgec --loss-scale): the scale the step used, and
  // whether it skipped its update (gradients not finite).
  std::optional<float> lossScale;
  bool skipped = false;
  /// Input pipeline: host seconds launch() spent making the step's batch
  /// (waiting for the device to take the previous inputs, then filling it, or
  /// with a prefetch ring waiting for it to be ready), and,
  /// on a GPU, how long the compute stream sat idle before the step began
  /// (waiting for its batch or its launch); nullopt where unknown.
  double inputSeconds = 0;
  std::optional<double> idleSeconds;
};

struct EvalResult {
  double loss = 0;                 // mean over the evaluated samples
  std::optional<double> accuracy;  // sum(forge.correct) / labels, when the bundle has it
  int64_t samples = 0, batches = 0;
};

class Trainer {
public:
  /// `eval` may be null (no evaluation). `train` may be null too: the trainer
  /// then takes every batch from stepOn() (the Python API's step(batch)), and
  /// step()/launch() refuse. The bundle must outlive the trainer.
  static Expected<std::unique_ptr<Trainer>> create(const Bundle &bundle,
                                                   std::unique_ptr<DataSource> train,
                                                   std::unique_ptr<DataSource> eval,
                                                   TrainerOptions options = {});

  /// Runs one optimizer step on the next K*B samples (launch() then collect(),
  /// with nothing in flight before or after).
  Expected<StepResult> step(std::vector<Executor::Span> *profile = nullptr);

  /// One optimizer step on the caller's samples instead of the training
  /// source's: `batch` is bound to the data fields as a training source is
  /// (the same checks and messages) and must hold exactly samplesPerStep()
  /// samples, micro-batch k taking [k*B, (k+1)*B). forge.step advances; the
  /// sampler does not. Nothing may be in flight; `batch` is not kept.
  Expected<StepResult> stepOn(DataSource &batch);
  /// The same on arrays in the executor's device memory (Executor::bindDeviceInput):
  /// `fields[f]` holds samplesPerStep() samples of dataFields()[f], in its dtype (the
  /// caller checked dtype and shape; the device cannot check label ranges before the
  /// step, its kernels fault on bad ones). The inputs are host-bound again afterwards.
  Expected<StepResult> stepOnDevice(std::span<const void *const> fields);

  /// Pipelined stepping, for devices that can (Executor::canPipeline): launch()
  /// starts the next step on the next K*B samples without waiting for the
  /// steps before it (only for the device to have read their inputs), and
  /// collect() returns the oldest launched step's result. At most two steps
  /// are launched and not collected. stepsDone() counts collected steps;
  /// state(), evaluate() and the executor's persistent tensors are meaningful
  /// only when nothing is in flight (inFlight() == 0).
  bool canPipeline() const { return exec_->canPipeline(); }
  /// The bundle's length buckets, ascending (the last: train_step's T); empty: none.
  std::vector<int64_t> lengthBuckets() const {
    std::vector<int64_t> out;
    for (const Bucket &b : buckets_)
      out.push_back(b.length);
    return out;
  }
  /// Whether steps take variable-length samples padded to their bucket.
  bool bucketed() const { return bucketed_; }
  /// The device's image decoder the training data goes through ("" : the CPU decodes).
  const std::string &imageDecoder() const { return imageDecoder_; }
  /// The routine index of the accumulation loop's body (-1: none).
  int accumulateRoutine() const { return accum_.index; }
  /// With `profile` (nothing in flight), the step is timed instruction by
  /// instruction (Executor::runProfiled) into it.
  Status launch(std::vector<Executor::Span> *profile = nullptr);
  /// A step whose run fails on the device (found here, after it ran) leaves nothing in
  /// flight and the trainer refusing further steps (failedError()).
  Expected<StepResult> collect();
  int inFlight() const { return inFlight_; }
  /// FLOPs of one train_step by the compiler's cost model (0 if unknown; with a
  /// batch-size schedule, of its largest step).
  double flopsPerStep() const {
    return trainFlops_ + static_cast<double>(micro_) * accumFlops_; // 0 without a loop
  }
  /// Mean loss (and accuracy) over every sample of the eval data (a last
  /// partial batch included, when the bundle's eval routine takes
  /// forge.sample_weight; else over the full batches).
  Expected<EvalResult> evaluate();
  /// Binds (or replaces) the eval data: the bundle's `eval` routine and the
  /// source are checked as create() checks them.
  Status setEvalData(std::unique_ptr<DataSource> eval);
  bool hasEval() const { return evalData_ != nullptr; }

  int64_t stepsDone() const { return step_; }
  int64_t batchSize() const { return batch_; }
  /// Micro-batches per step (at most, with a batch-size schedule).
  int64_t microBatches() const { return micro_; }
  /// Samples per step (at most, with a batch-size schedule).
  int64_t samplesPerStep() const { return batch_ * micro_; }
  /// Micro-batches and this rank's samples of (1-based) step `step`.
  int64_t microAt(int64_t step) const {
    return schedule_.empty() ? micro_ : schedule_.samplesAt(step) / batch_;
  }
  int64_t samplesAt(int64_t step) const { return microAt(step) * batch_; }
  int64_t globalSamplesAt(int64_t step) const { return samplesAt(step) * dpSize_; }
  /// Tokens of step `step` over every data-parallel rank (token data), else 0.
  int64_t globalTokensAt(int64_t step) const { return globalSamplesAt(step) * seqLen_; }
  /// FLOPs of step `step` by the cost model (0 if unknown).
  double flopsAt(int64_t step) const {
    return trainFlops_ + static_cast<double>(microAt(step)) * accumFlops_;
  }
  /// The steps that `epochs` epochs of the training data take (a schedule's
  /// steps differ in size).
  int64_t stepsForEpochs(int64_t epochs) const;
  /// The bundle's batch-size schedule (empty: every step takes samplesPerStep()).
  const BatchSchedule &batchSchedule() const { return schedule_; }
  /// Samples of one step over every data-parallel rank.
  int64_t globalSamplesPerStep() const { return samplesPerStep() * dpSize_; }
  /// The layout of the ranks (forgec --dp D --tp T, world D x T): this rank's
  /// data-parallel rank and the group's size; the T ranks of one tensor-parallel
  /// group (consecutive ranks) read the same batch.
  int64_t dataParallelRank() const { return dpRank_; }
  int64_t dataParallelSize() const { return dpSize_; }
  int64_t tensorParallelSize() const { return tpSize_; }
  /// Pipeline stages (forgec --pp P): this rank runs stage rank % P.
  int64_t pipelineSize() const { return ppSize_; }
  /// The routine index of this rank's training step (train_step, or its stage's).
  int trainRoutine() const { return train_.index; }
  /// Without a training source (stepOn() only): 0 steps per epoch, 0 samples.
  int64_t stepsPerEpoch() const { return sampler_ ? sampler_->stepsPerEpoch() : 0; }
  int64_t trainSamples() const { return trainData_ ? trainData_->numSamples() : 0; }
  bool hasTrainData() const { return trainData_ != nullptr; }
  int64_t evalSamples() const { return evalData_ ? evalData_->numSamples() : 0; }
  /// Tokens per step when the data input is an integer [B, T] tensor, else 0.
  int64_t tokensPerStep() const { return globalSamplesPerStep() * seqLen_; }
  /// Epochs completed, fractional.
  double epochsDone() const;
  /// Names of the data inputs (without micro-batch suffixes) and the label input.
  const std::vector<DataField> &dataFields() const { return fields_; }
  const DataSource &trainData() const { return *trainData_; } // hasTrainData()
  const DataSource *evalData() const { return evalData_.get(); }
  /// The train_step outputs `forge.grad.NAME` (forgec --expose-gradients),
  /// as (NAME, tensor index) in output order; empty for other bundles. Read
  /// them with executor().view() right after step(), before anything else
  /// runs.
  const std::vector<std::pair<std::string, int32_t>> &gradientOutputs() const {
    return gradOutputs_;
  }

  Executor &executor() { return *exec_; }
  const Executor &executor() const { return *exec_; }

  /// The state a checkpoint stores (persistent tensors are in the executor).
  CheckpointState state() const;
  /// After a non-finite loss at (1-based) `step`: the samples of that step
  /// whose float inputs hold NaN or Inf, as "input 'x' of samples 3, 17 (first:
  /// nan)"; nullopt when the batch is finite (then the training diverged).
  std::optional<std::string> nonFiniteInputs(int64_t step);
  /// Continues from `state` (after readCheckpoint restored the tensors);
  /// refuses a state taken with other data or another batch layout.
  Status restore(const CheckpointState &state);
  ~Trainer();

private:
  Trainer() = default;
  /// Fills `outs` ([micro-batch][field] -> buffer) with the step's samples of `source`
  /// (at sequence length `length` through fillAt when > 0).
  Status fillStep(DataSource &source, std::span<const int64_t> indices,
                  const std::vector<std::vector<void *>> &outs, int64_t length = 0);
  /// create()'s steps: the data inputs ([field][k] tensors, forge.dp_rank); the batch-size
  /// schedule; the training data; the ranks' layout against the bundle's; the batches'
  /// buffers.
  Status bindDataInputs(std::vector<std::vector<int32_t>> &tensors, int32_t &rankInput);
  Status bindBatchSchedule();
  Status bindTrainData(std::unique_ptr<DataSource> train,
                       const std::vector<std::vector<int32_t>> &tensors);
  Status checkRankLayout(const Bundle &bundle, const TrainerOptions &options, int64_t dp,
                         int64_t tp);

public:
  /// Whether `worldSize` ranks are the D x P x T the bundle was compiled for
  /// (its data_parallel, pipeline_parallel and tensor_parallel options, 1 when
  /// absent): forge-train checks it before any rank connects, create() again.
  static Status checkRankCount(const Bundle &bundle, int64_t worldSize);

private:
  Status allocateBatchBuffers(const std::vector<std::vector<int32_t>> &tensors, bool loop,
                              unsigned prefetch);
  /// Length buckets: resolves train_step@len<T> (create) and eval@len<T> (setEvalData).
  Status bindBuckets(const std::string &text, const std::vector<std::vector<int32_t>> &tensors);
  Status bindBucketEvals(const std::vector<int32_t> &plainEvalInputs);
  /// evaluate() on variable-length eval data: each bucket's samples by its eval.
  Expected<EvalResult> evaluateBuckets();
  /// stepOn()/stepOnDevice(): feeds forge.step and runs train_step on the bound inputs.
  /// With an accumulation loop, `bind(k)` points accumulate's inputs at micro-batch k
  /// before its run (default: microOuts_[k]).
  Status runNextStep(double inputSeconds,
                     const std::function<Status(int64_t)> &bind = nullptr);
  /// The runs of one step: accumulate K times (binding micro-batch k with
  /// `bind`), then train_step; profiled into `profile` when given (each span
  /// naming its routine, the runs laid end to end).
  Status runStep(const std::function<Status(int64_t)> &bind,
                 std::vector<Executor::Span> *profile);
  /// forge.micro_index of the routine that runs micro-batch k (-1: none).
  int32_t microIndexInputOf(int64_t k) const {
    return k == 0 && firstAccum_.index >= 0 ? firstMicroIndexInput_ : microIndexInput_;
  }
  /// Points accumulate's data inputs at `outs[k]` and forge.micro_index at k's value.
  Status bindMicroBatch(const std::vector<std::vector<void *>> &outs, int64_t k);
  /// Binds micro-batch k's canvas input to the JPEG lengths after `outs[k]`'s fields (null
  /// `outs`: unbound, every sample pixels); nothing without device decoding.
  Status bindEncodedLengths(const std::vector<std::vector<void *>> *outs, size_t k);
  /// stepOn()/stepOnDevice() with device-decoded images: refused.
  Status refuseCallerImages() const;
  /// This rank's share of a step's global indices (TrainerOptions::rank).
  std::span<const int64_t> rankShare(std::span<const int64_t> global, int64_t perRank) const {
    return global.subspan(static_cast<size_t>(dpRank_ * perRank), static_cast<size_t>(perRank));
  }
  /// The prefetch ring (TrainerOptions::prefetch > 0).
  Status startProducer();
  void stopProducer();
  void produce();

  struct Routine {
    int index = -1;
    int32_t loss = -1, extra1 = -1, extra2 = -1; // train: lr, grad_norm; eval: correct, label_count
    int32_t scale = -1, skipped = -1;             // train: forge.loss_scale_used, forge.skipped
  };
  /// One length bucket's routines and tensors; the last bucket is the plain
  /// train_step/eval (train_, eval_, microInputs_[0]).
  struct Bucket {
    int64_t length = 0;
    Routine train, eval;
    int32_t stepInput = -1, evalWeight = -1;
    std::vector<int32_t> inputs, evalInputs; // per field of fields_ / evalFields_
    double flops = 0;                        // of a step (every run), by the cost model
    // The accumulation loop (accum.index >= 0): accumulate@len<T> and
    // accumulate_first@len<T>, their scalar and data inputs (per field).
    Routine accum, firstAccum;
    int32_t accumStep = -1, firstStep = -1, microIndex = -1, firstMicroIndex = -1;
    std::vector<int32_t> accumInputs, firstInputs;
  };
  /// The plain routines (train_step, accumulate, ...) as a bucket of length `length`;
  /// `tensors`: create()'s data inputs [field][micro-batch].
  Bucket plainBucket(int64_t length, const std::vector<std::vector<int32_t>> &tensors) const;
  std::vector<Bucket> buckets_;
  std::vector<int32_t> sampleBucket_; // bucketed_: each training sample's bucket
  /// The sampler of the training data (its groups the buckets when bucketed_).
  std::unique_ptr<EpochSampler> makeSampler(uint64_t seed, bool shuffle) const;
  bool bucketed_ = false; // variable-length training data: steps pick their bucket
  /// TrainerOptions::imageDecode took: the image field whose JPEGs the device decodes
  /// (each batch set then has one more buffer: the u32 lengths), and the decoder's name.
  int encodedField_ = -1;
  std::string imageDecoder_;
  Status chooseImageDecode(const std::string &mode, int64_t pp);
  size_t curBucket_ = 0; // the step being launched's (bucketed_; Launched::bucket after)
  std::vector<Executor::HostBuffer> evalBuffers_; // bucketed eval batches, per eval field
  /// The smallest bucket holding a sample of `length` positions (the last: any longer).
  size_t bucketOf(int64_t length) const {
    size_t b = 0;
    while (b + 1 < buckets_.size() && buckets_[b].length < length)
      ++b;
    return b;
  }
  /// `r`'s loss (required) and its optional scalar outputs (-1 when absent): a
  /// train routine's forge.lr, grad_norm, loss_scale_used, skipped; an eval
  /// routine's forge.correct and forge.label_count.
  Status bindScalarOutputs(Routine &r, bool train) const;
  /// An eval run's contribution to evaluate(): its loss weighted by its counted
  /// labels (forge.label_count, else the real samples), its correct count.
  struct EvalTally {
    double loss = 0, correct = 0, labels = 0;
    void add(const Executor &ex, const Routine &eval, int64_t real);
  };
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<DataSource> trainData_, evalData_;
  std::unique_ptr<EpochSampler> sampler_;
  TrainerOptions options_;
  std::vector<DataField> fields_, evalFields_;
  Routine train_, eval_;
  int32_t stepInput_ = -1;
  // The accumulation loop (accum_.index >= 0): accumulate's forge.step and
  // forge.micro_index inputs, the values fed to the latter (one per k, bound
  // per run, unchanged), and the host buffers its data inputs read from when
  // no prefetch slot holds the batch (microOuts_ points into them).
  Routine accum_;
  int32_t accumStepInput_ = -1, microIndexInput_ = -1;
  // accumulate_first (forge-split-accumulation): accumulate for a step's first
  // micro-batch (-1: accumulate runs every micro-batch). Its data inputs are
  // microInputs_[0].
  Routine firstAccum_;
  int32_t firstStepInput_ = -1, firstMicroIndexInput_ = -1, firstCountInput_ = -1;
  int32_t accumCountInput_ = -1, trainCountInput_ = -1; // forge.micro_count of each
  BatchSchedule schedule_;
  double trainFlops_ = 0, accumFlops_ = 0; // per run of train_step / accumulate
  int64_t seqLen_ = 0;                     // tokens per sample (token data), else 0
  int64_t ringStep_ = 0;                   // steps done when the prefetch ring (re)started
  std::vector<int64_t> microIndex_;
  std::vector<Executor::HostBuffer> loopBuffers_;
  int64_t batch_ = 0, micro_ = 1, evalBatch_ = 0, step_ = 0;
  int64_t dpRank_ = 0, dpSize_ = 1, tpSize_ = 1; // dataParallelRank() ...
  int64_t ppSize_ = 1;         // pipeline stages (forgec --pp)
  std::string routineSuffix_;  // "@pp<stage>" with --pp, else ""
  int64_t evalLabelElements_ = 0;
  int32_t evalWeight_ = -1; // eval input forge.sample_weight (-1: none)
  static constexpr const char *kSampleWeight = "forge.sample_weight";
  int inFlight_ = 0; // launched, not collected
  /// Set when a launched step failed on the device (a kernel fault found after the
  /// run): its update may be partly applied and the executor stays failed (CUDA's
  /// fault word), so launch()/stepOn() refuse from then on, naming the step.
  std::string failed_;
  Status failedError() const;
  // Per launched step, oldest first. (A profiled step has no run to ask the
  // executor about.)
  struct Launched {
    std::optional<uint64_t> run; // its first executor run (Executor::runsIssued)
    double inputSeconds = 0;
    size_t bucket = 0;      // its length bucket (bucketed_)
    int64_t realTokens = 0; // its labelled tokens, all ranks (bucketed_)
  };
  std::deque<Launched> launched_;
  std::unique_ptr<ThreadPool> dataPool_; // --workers > 1 and a concurrent source
  std::vector<size_t> sampleBytes_;      // per field: bytes of one sample
  std::vector<std::vector<void *>> microOuts_; // [k][field] -> input buffer
  std::vector<std::vector<int32_t>> microInputs_; // [k][field] -> input tensor
  // Prefetch ring: the producer thread fills slot (seq % size) with the batch of
  // the seq-th step after the ring (re)started, drawn from `lookahead_` (a copy
  // of the sampler that runs ahead); launch() takes the slots in order. A slot
  // stays `inUse_` until the next launch() saw the device take its inputs.
  struct Slot {
    std::vector<Executor::HostBuffer> buffers;
    std::vector<std::vector<void *>> outs; // [k][field]
    std::vector<int64_t> indices;
    Status status;
    bool ready = false;
  };
  std::vector<Slot> ring_;
  std::unique_ptr<EpochSampler> lookahead_;
  std::thread producer_;
  std::mutex ringMutex_;                  // guards the fields below and Slot::ready
  std::mutex fillMutex_;                  // one fill (and its setEpoch) at a time
  std::condition_variable ringCv_;
  bool stopProducer_ = false;
  bool producerDone_ = false;            // produce() returned (stopped, or after a bad batch)
  int64_t produced_ = 0, consumed_ = 0;  // steps filled / taken since the ring started
  int inUse_ = -1;                        // slot the last launched run reads (-1: none)
  std::vector<void *> evalOuts_;
  std::vector<int64_t> evalIndices_;
  std::vector<std::pair<std::string, int32_t>> gradOutputs_;
};

} // namespace forge::rt
