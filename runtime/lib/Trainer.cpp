// Trainer (Trainer.h): train_step / eval routines bound to data sources.
//
// Invariants:
//  * All binding happens in create(): input tensors are looked up once and
//    step() fills the executor's input buffers in place (no allocation, no
//    name lookups), sets forge.step and runs the routine. With a prefetch
//    ring, a producer thread fills the ring's buffers (allocated in create())
//    ahead of the steps and launch() points the inputs at them (bindInput).
//  * The ring changes when a batch is made, never what it holds: the producer
//    draws from a copy of the sampler at the same position, and launch()
//    checks each slot's indices against the sampler's own.
//  * The only state that changes between steps, besides the executor's
//    persistent tensors, is step_ and the sampler's position; state() and
//    restore() carry exactly that, so resuming is bit-exact.
#include "forge/runtime/Trainer.h"

#include "cpu/KernelUtil.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include <fmt/ranges.h>

namespace forge::rt {

namespace {

/// A positive integer build option (1 when absent).
Expected<int64_t> positiveBuildOption(const Bundle &bundle, const std::string &key) {
  int64_t v = 1;
  if (std::string s = buildOption(bundle.program(), key); !s.empty()) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 1)
      return Status::error("{}: build option {} = '{}' is not a positive integer",
                           bundle.origin(), key, s);
  }
  return v;
}

/// The bundle's data-, pipeline- and tensor-parallel sizes (forgec --dp, --pp,
/// --tp; 1 where absent).
struct ParallelSizes {
  int64_t dp, pp, tp;
};
Expected<ParallelSizes> parallelSizes(const Bundle &bundle) {
  ParallelSizes sizes{};
  for (auto [key, size] :
       {std::pair{"data_parallel", &sizes.dp}, std::pair{"pipeline_parallel", &sizes.pp},
        std::pair{"tensor_parallel", &sizes.tp}}) {
    auto v = positiveBuildOption(bundle, key);
    if (!v)
      return v.status();
    *size = *v;
  }
  return sizes;
}

/// The options after OUTPUT,LABEL of the bundle's cross_entropy loss (build
/// option "loss": "cross_entropy:OUT,LABEL,smoothing=S,probs,ignore=N").
std::vector<std::string> crossEntropyOptions(const bundle::Program &p) {
  const std::string loss = buildOption(p, "loss");
  size_t colon = loss.find(':');
  std::vector<std::string> options;
  if (colon == std::string::npos || loss.compare(0, colon, "cross_entropy") != 0)
    return options;
  int part = 0; // OUTPUT, LABEL, then options
  for (size_t at = colon + 1; at <= loss.size(); ++part) {
    size_t comma = std::min(loss.find(',', at), loss.size());
    if (part >= 2)
      options.push_back(loss.substr(at, comma - at));
    at = comma + 1;
  }
  return options;
}

/// The class count of the (first) nll_loss in the bundle: its input 0 is
/// [N, C, ...]. Zero when there is none (logits split by vocabulary, --tp).
/// The ignored label: the nll_loss's ignore_index, else the loss option's
/// ignore=N (the split form has no nll_loss).
void classesOf(const bundle::Program &p, int64_t &numClasses, std::optional<int64_t> &ignore) {
  numClasses = 0;
  for (const bundle::Routine &r : p.routines())
    for (const bundle::Instruction &inst : r.instructions()) {
      if (inst.op() != "nll_loss" || inst.inputs_size() < 1 || inst.inputs(0) < 0)
        continue;
      const bundle::TensorInfo &in = p.tensors(inst.inputs(0));
      if (in.shape_size() < 2)
        continue;
      numClasses = in.shape(1);
      auto it = inst.attrs().find("ignore_index");
      if (it != inst.attrs().end() && it->second.value_case() == bundle::Attribute::kI)
        ignore = it->second.i();
      return;
    }
  for (const std::string &option : crossEntropyOptions(p)) {
    int64_t v = 0;
    const char *begin = option.data() + 7, *end = option.data() + option.size();
    if (option.rfind("ignore=", 0) == 0 && option.size() > 7) {
      auto [ptr, ec] = std::from_chars(begin, end, v);
      if (ec == std::errc() && ptr == end)
        ignore = v;
    }
  }
}

/// Whether the bundle's loss takes class probabilities (forgec --loss
/// cross_entropy:OUT,LABEL,probs): a label row of C values is one prediction.
bool labelsAreProbabilities(const bundle::Program &p) {
  std::vector<std::string> options = crossEntropyOptions(p);
  return std::find(options.begin(), options.end(), "probs") != options.end();
}

/// A scalar f32 output (numel 1) of `routine`, or an error / -1 when optional.
Expected<int32_t> scalarOutput(const Executor &ex, int routine, const std::string &name,
                               bool required) {
  auto t = ex.findOutput(routine, name);
  if (!t)
    return required ? Expected<int32_t>(t.status()) : Expected<int32_t>(-1);
  const bundle::TensorInfo &info = ex.tensorInfo(*t);
  if (info.dtype() != bundle::F32 || numElements(shapeOf(info)) != 1)
    return Status::error("{}: output '{}' of routine '{}' is {}{}, expected an f32 scalar",
                         ex.bundle().origin(), name, ex.routineName(routine),
                         dtypeName(info.dtype()), shapeString(shapeOf(info)));
  return *t;
}

float readScalar(const Executor &ex, int32_t t) {
  float v;
  std::memcpy(&v, ex.view(t).data, sizeof(v));
  return v;
}

} // namespace

Expected<std::unique_ptr<Trainer>> Trainer::create(const Bundle &bundle,
                                                   std::unique_ptr<DataSource> train,
                                                   std::unique_ptr<DataSource> eval,
                                                   TrainerOptions options) {
  const bundle::Program &p = bundle.program();
  const std::string &origin = bundle.origin();
  // Pipeline parallelism (forgec --pp P): rank r runs its stage s (RankLayout),
  // whose routines are train_step@pp<s> and eval@pp<s>: the executor loads those
  // alone, and holds only the parameters and state they touch (the stage's own).
  auto sizes = parallelSizes(bundle);
  if (!sizes)
    return sizes.status();
  const int64_t ppSize = sizes->pp, tpSize = sizes->tp;
  std::string suffix;
  std::vector<std::string> stageRoutines;
  if (ppSize > 1) {
    suffix = fmt::format("@pp{}", RankLayout::of(options.rank, options.worldSize,
                                                 static_cast<int>(ppSize), static_cast<int>(tpSize))
                                      .stage);
    for (const bundle::Routine &r : p.routines())
      if (r.name() == "train_step" + suffix || r.name() == "eval" + suffix)
        stageRoutines.push_back(r.name()); // none: reported below, with the routines there are
  }
  const ExecutorOptions executorOptions{options.device, options.threads, options.cudaGraphs,
                                        options.deterministicAttention, stageRoutines};
  auto exec = options.makeExecutor ? options.makeExecutor(bundle, executorOptions)
                                   : createExecutor(bundle, executorOptions);
  if (!exec)
    return exec.status();
  std::unique_ptr<Trainer> tr(new Trainer());
  tr->exec_ = exec.take();
  tr->options_ = options;
  Executor &ex = *tr->exec_;
  tr->ppSize_ = ppSize;
  tr->routineSuffix_ = suffix;
  const std::string trainName = "train_step" + tr->routineSuffix_;
  auto trainIndex = ex.findRoutine(trainName);
  if (!trainIndex)
    return Status::error("{}: not a training bundle (no routine '{}'; routines: {}); "
                         "compile it with forgec --loss/--optimizer, without --inference-only",
                         origin, trainName, [&] {
                           std::vector<std::string> names;
                           for (int r = 0; r < ex.numRoutines(); ++r)
                             names.push_back(ex.routineName(r));
                           return names.empty() ? std::string("none")
                                                : fmt::format("{}", fmt::join(names, ", "));
                         }());
  tr->train_.index = *trainIndex;
  for (const bundle::Instruction &inst : p.routines(*trainIndex).instructions())
    tr->trainFlops_ += static_cast<double>(inst.flops());

  // Micro-batches, from the build options.
  auto microOption = positiveBuildOption(bundle, "micro_batches");
  if (!microOption)
    return microOption.status();
  const int64_t micro = *microOption;
  tr->micro_ = micro;
  // The accumulation loop: its body reads the data, K times a step.
  if (suffix.empty())
    if (auto acc = ex.findRoutine("accumulate")) {
      if (micro < 2)
        return Status::error("{}: routine 'accumulate' with micro_batches = {} (an "
                             "accumulation loop needs 2 or more)",
                             origin, micro);
      tr->accum_.index = *acc;
      for (const bundle::Instruction &inst : p.routines(*acc).instructions())
        tr->accumFlops_ += static_cast<double>(inst.flops());
    }
  const bool loop = tr->accum_.index >= 0;
  std::vector<std::vector<int32_t>> tensors; // data inputs [field][k]
  int32_t rankInput = -1;                    // forge.dp_rank
  FORGE_RETURN_IF_ERROR(tr->bindDataInputs(tensors, rankInput));

  FORGE_RETURN_IF_ERROR(tr->bindScalarOutputs(tr->train_, /*train=*/true));

  // Gradient outputs (forgec --expose-gradients): forge.grad.NAME.
  const std::string gradPrefix = "forge.grad.";
  for (int32_t t : ex.outputs(tr->train_.index)) {
    const std::string &name = ex.tensorInfo(t).name();
    if (name.size() > gradPrefix.size() && name.compare(0, gradPrefix.size(), gradPrefix) == 0)
      tr->gradOutputs_.emplace_back(name.substr(gradPrefix.size()), t);
  }

  FORGE_RETURN_IF_ERROR(tr->checkRankLayout(bundle, options, sizes->dp, tpSize));
  const int64_t pp = tr->ppSize_;
  if (rankInput >= 0) // the same every step: the executor uploads it with each step's inputs
    std::memcpy(ex.inputBuffer(rankInput), &tr->dpRank_, sizeof(int64_t));
  tr->microIndex_.assign(static_cast<size_t>(micro), 0); // set per step (runStep)
  FORGE_RETURN_IF_ERROR(tr->bindBatchSchedule());

  if (const std::string text = buildOption(p, "length_buckets"); !text.empty())
    FORGE_RETURN_IF_ERROR(tr->bindBuckets(text, tensors));
  if (train)
    FORGE_RETURN_IF_ERROR(tr->bindTrainData(std::move(train), tensors));
  FORGE_RETURN_IF_ERROR(tr->chooseImageDecode(options.imageDecode, pp));
  for (const DataField &f : tr->fields_)
    tr->sampleBytes_.push_back(static_cast<size_t>(numElements(f.sampleShape)) *
                               dtypeSize(f.dtype));
  {
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    unsigned workers = options.workers ? options.workers : std::min(8u, hw);
    // Without a source, stepOn()'s batches are arrays (concurrent fills).
    if (workers > 1 && (!tr->trainData_ || tr->trainData_->concurrentFill()) && tr->batch_ > 1)
      tr->dataPool_ = std::make_unique<ThreadPool>(workers);
  }
  FORGE_RETURN_IF_ERROR(tr->allocateBatchBuffers(tensors, loop, options.prefetch));
  if (eval)
    FORGE_RETURN_IF_ERROR(tr->setEvalData(std::move(eval)));
  return tr;
}

/// create()'s step: the data inputs of train_step (or of the loop's accumulate and
/// accumulate_first), grouped by name over micro-batches into fields_ ([field][k] tensors),
/// the routines' scalar inputs, the batch size, and the token length.
Status Trainer::bindDataInputs(std::vector<std::vector<int32_t>> &tensors, int32_t &rankInput) {
  Executor &ex = *exec_;
  const bundle::Program &p = ex.bundle().program();
  const std::string &origin = ex.bundle().origin();
  const int64_t micro = micro_;
  const bool loop = accum_.index >= 0;
  const int dataRoutine = loop ? accum_.index : train_.index;
  const char *dataRoutineName = loop ? "accumulate" : "train_step";
  const std::string label = buildOption(p, "label_input");
  int64_t numClasses = 0;
  std::optional<int64_t> ignore;
  classesOf(p, numClasses, ignore);

  std::map<std::string, size_t> fieldOf;
  auto checkScalar = [&](const bundle::TensorInfo &info, bundle::DType dtype,
                         const char *what) -> Status {
    if (info.dtype() != dtype || numElements(shapeOf(info)) != 1)
      return Status::error("{}: input '{}' is {}{}, expected {} scalar", origin, info.name(),
                           dtypeName(info.dtype()), shapeString(shapeOf(info)), what);
    return Status::ok();
  };
  if (loop) // the rest of the step reads no data
    for (int32_t t : ex.inputs(train_.index)) {
      const bundle::TensorInfo &info = ex.tensorInfo(t);
      if (info.name() == "forge.micro_count") {
        FORGE_RETURN_IF_ERROR(checkScalar(info, bundle::I64, "an i64"));
        trainCountInput_ = t;
        continue;
      }
      if (info.name() != "forge.step")
        return Status::error("{}: train_step reads input '{}'; with an accumulation loop only "
                             "'accumulate' reads the data",
                             origin, info.name());
      FORGE_RETURN_IF_ERROR(checkScalar(info, bundle::F32, "an f32"));
      stepInput_ = t;
    }
  for (int32_t t : ex.inputs(dataRoutine)) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const std::string &name = info.name();
    if (name == "forge.step") {
      FORGE_RETURN_IF_ERROR(checkScalar(info, bundle::F32, "an f32"));
      (loop ? accumStepInput_ : stepInput_) = t;
      continue;
    }
    if (loop && name == "forge.micro_index") { // dropout masks by global sample
      FORGE_RETURN_IF_ERROR(checkScalar(info, bundle::I64, "an i64"));
      microIndexInput_ = t;
      continue;
    }
    if (loop && name == "forge.micro_count") { // the step's micro-batches (a schedule)
      FORGE_RETURN_IF_ERROR(checkScalar(info, bundle::I64, "an i64"));
      accumCountInput_ = t;
      continue;
    }
    if (name == "forge.dp_rank") { // dropout masks by global sample (DropoutMaskOp)
      if (info.dtype() != bundle::I64 || numElements(shapeOf(info)) != 1)
        return Status::error("{}: input 'forge.dp_rank' is {}{}, expected an i64 scalar", origin,
                             dtypeName(info.dtype()), shapeString(shapeOf(info)));
      rankInput = t;
      continue;
    }
    std::string base = name;
    int64_t k = 0;
    if (micro > 1 && !loop) {
      size_t at = name.rfind('@');
      const char *first = name.data() + (at == std::string::npos ? 0 : at + 1);
      const char *last = name.data() + name.size();
      auto [end, ec] = std::from_chars(first, last, k);
      if (at == std::string::npos || ec != std::errc() || end != last || k < 0 || k >= micro)
        return Status::error("{}: train_step input '{}' has no micro-batch suffix @0..@{} "
                             "(micro_batches = {})",
                             origin, name, micro - 1, micro);
      base = name.substr(0, at);
    }
    if (info.shape_size() == 0)
      return Status::error("{}: data input '{}' is a scalar; data inputs need a batch dim 0",
                           origin, name);
    auto [it, fresh] = fieldOf.emplace(base, fields_.size());
    if (fresh) {
      DataField f;
      f.name = base;
      f.dtype = info.dtype();
      f.sampleShape.assign(info.shape().begin() + 1, info.shape().end());
      f.isLabel = !label.empty() && base == label;
      if (f.isLabel) {
        f.numClasses = numClasses;
        f.ignoreValue = ignore;
      }
      fields_.push_back(f);
      tensors.emplace_back(static_cast<size_t>(micro), -1);
    }
    const DataField &f = fields_[it->second];
    std::vector<int64_t> sample(info.shape().begin() + 1, info.shape().end());
    if (info.dtype() != f.dtype || sample != f.sampleShape)
      return Status::error("{}: micro-batch inputs of '{}' differ: '{}' is {}{}", origin, base,
                           name, dtypeName(info.dtype()), shapeString(shapeOf(info)));
    if (tensors[it->second][k] >= 0)
      return Status::error("{}: {} has input '{}' twice", origin, dataRoutineName, name);
    if (loop) // every micro-batch's run reads it
      std::fill(tensors[it->second].begin(), tensors[it->second].end(), t);
    else
      tensors[it->second][k] = t;
    if (batch_ == 0)
      batch_ = info.shape(0);
    else if (info.shape(0) != batch_)
      return Status::error("{}: data inputs disagree on the batch size: '{}' has {}, expected {}",
                           origin, name, info.shape(0), batch_);
  }
  if (fields_.empty())
    return Status::error("{}: {} has no data inputs", origin, dataRoutineName);
  // The first micro-batch's routine: the same inputs, its own tensors.
  if (loop)
    if (auto first = ex.findRoutine("accumulate_first")) {
      firstAccum_.index = *first;
      size_t found = 0;
      for (int32_t t : ex.inputs(*first)) {
        const bundle::TensorInfo &info = ex.tensorInfo(t);
        const std::string &name = info.name();
        int32_t *scalar = name == "forge.step"          ? &firstStepInput_
                          : name == "forge.micro_index" ? &firstMicroIndexInput_
                          : name == "forge.micro_count" ? &firstCountInput_
                                                        : nullptr;
        if (scalar) {
          *scalar = t;
          continue;
        }
        auto it = fieldOf.find(name);
        const int32_t twin = it == fieldOf.end() ? -1 : tensors[it->second][0];
        if (twin < 0 || info.dtype() != ex.tensorInfo(twin).dtype() ||
            shapeOf(info) != shapeOf(ex.tensorInfo(twin)))
          return Status::error("{}: accumulate_first's input '{}' ({}{}) is not one of "
                               "accumulate's",
                               origin, name, dtypeName(info.dtype()), shapeString(shapeOf(info)));
        tensors[it->second][0] = t;
        ++found;
      }
      if (found != fields_.size() || (firstMicroIndexInput_ < 0) != (microIndexInput_ < 0) ||
          (firstCountInput_ < 0) != (accumCountInput_ < 0))
        return Status::error("{}: accumulate_first and accumulate take different inputs",
                             origin);
    }
  if (batch_ <= 0)
    return Status::error("{}: the batch size (dim 0 of the data inputs) is {}", origin, batch_);
  for (size_t f = 0; f < fields_.size(); ++f)
    for (int64_t k = 0; k < micro; ++k)
      if (tensors[f][k] < 0)
        return Status::error("{}: train_step has no input '{}@{}' (micro_batches = {})", origin,
                             fields_[f].name, k, micro);

  // Tokens: one integer [B, T] data input besides the label.
  int tokenInputs = 0;
  int64_t seqLen = 0;
  for (const DataField &f : fields_)
    if (!f.isLabel && f.sampleShape.size() == 1 && !isFloatType(f.dtype)) {
      ++tokenInputs;
      seqLen = f.sampleShape[0];
    }
  size_t nonLabel =
      std::count_if(fields_.begin(), fields_.end(), [](const DataField &f) { return !f.isLabel; });
  if (tokenInputs == 1 && nonLabel == 1)
    seqLen_ = seqLen;
  return Status::ok();
}

/// create()'s step: build option batch_schedule (K per step, at most micro_batches).
Status Trainer::bindBatchSchedule() {
  const bundle::Program &p = exec_->bundle().program();
  const std::string &origin = exec_->bundle().origin();
  const int64_t micro = micro_;
  const bool loop = accum_.index >= 0;
  if (const std::string text = buildOption(p, "batch_schedule"); !text.empty()) {
    std::string why;
    if (!BatchSchedule::parse(text, schedule_, why))
      return Status::error("{}: build option batch_schedule: {}", origin, why);
    if (!loop || accumCountInput_ < 0)
      return Status::error("{}: a batch-size schedule needs the accumulation loop with input "
                           "forge.micro_count (compile it with forgec --batch-schedule)",
                           origin);
    for (const BatchSchedule::Stage &s : schedule_.stages)
      if (s.samples % batch_ != 0 || s.samples > micro * batch_)
        return Status::error("{}: batch_schedule '{}': {} samples is not a multiple of the "
                             "micro-batch {} up to {} micro-batches",
                             origin, text, s.samples, batch_, micro);
  } else if (accumCountInput_ >= 0 || trainCountInput_ >= 0) {
    return Status::error("{}: input forge.micro_count without a batch_schedule build option",
                         origin);
  }
  return Status::ok();
}

/// create()'s step: the training data, bound to fields_; documents (variable-length
/// data) go to their length buckets; the sampler.
Status Trainer::bindTrainData(std::unique_ptr<DataSource> train,
                              const std::vector<std::vector<int32_t>> &tensors) {
  const std::string &origin = exec_->bundle().origin();
  const int64_t micro = micro_, dp = dpSize_, pp = ppSize_;
  const int64_t perStep = globalSamplesPerStep();
  FORGE_RETURN_IF_ERROR(train->bind(fields_));
  if (train->numSamples() < perStep)
    return Status::error("{}: {} training samples, fewer than one step needs ({}{} "
                         "micro-batch{} x batch {} = {})",
                         train->describe(), train->numSamples(),
                         dp > 1 ? fmt::format("{} ranks x ", dp) : std::string(), micro,
                         micro > 1 ? "es" : "", batch_, perStep);
  trainData_ = std::move(train);
  if (trainData_->variableLength()) {
    // Documents: each sample in the smallest bucket that holds it (without
    // buckets, the one of train_step's T); a step's samples share a bucket.
    // With --dp, a step's global samples are one run of the sampler: every
    // rank's share is of the same bucket, so the ranks run the same routine.
    // (Unrolled micro-batches: a bucket's step binds one micro-batch's inputs.)
    if (pp > 1 || !schedule_.empty() || (micro > 1 && accum_.index < 0))
      return Status::error("{}: variable-length data ({}) with {} is not supported yet", origin,
                           trainData_->describe(),
                           pp > 1               ? "--pp"
                           : !schedule_.empty() ? "a batch-size schedule"
                                                : "unrolled micro-batches (forgec "
                                                  "--accumulate unroll; the loop works)");
    if (buckets_.empty())
      buckets_.push_back(plainBucket(fields_.front().sampleShape.at(0), tensors));
    const int64_t n = trainData_->numSamples();
    sampleBucket_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      sampleBucket_[static_cast<size_t>(i)] =
          static_cast<int32_t>(bucketOf(trainData_->sampleLength(i)));
    bucketed_ = true;
  }
  sampler_ = makeSampler(options_.seed, options_.shuffle);
  if (bucketed_ && sampler_->epochSamples() < perStep)
    return Status::error(
        "{}: no length bucket holds a step's {} samples (the {} samples by "
        "bucket: {})",
        trainData_->describe(), perStep, trainData_->numSamples(), [&] {
          std::vector<std::string> parts;
          for (size_t b = 0; b < buckets_.size(); ++b)
            parts.push_back(fmt::format(
                "T={}: {}", buckets_[b].length,
                std::count(sampleBucket_.begin(), sampleBucket_.end(), static_cast<int32_t>(b))));
          return fmt::format("{}", fmt::join(parts, ", "));
        }());
  return Status::ok();
}

/// TrainerOptions::imageDecode: whether the device decodes the training folder's JPEGs
/// (encodedField_, imageDecoder_), after the data is bound and before the batch buffers
/// (which then get the lengths buffers).
Status Trainer::chooseImageDecode(const std::string &mode, int64_t pp) {
  if (mode != "cpu" && mode != "gpu" && mode != "auto")
    return Status::error("image decode '{}' is not cpu, gpu or auto", mode);
  if (mode == "cpu")
    return Status::ok();
  Status why = Status::ok();
  if (!trainData_)
    why = Status::error("no training data");
  else if (bucketed_ || pp > 1)
    why = Status::error("not with {}", pp > 1 ? "--pp" : "length buckets");
  auto decoder = why.isOk() ? exec_->imageDecoder() : Expected<std::string>(why);
  auto field = decoder ? trainData_->encodeImages() : Expected<int>(decoder.status());
  if (field) {
    encodedField_ = *field;
    imageDecoder_ = *decoder;
  } else if (mode == "gpu") {
    return field.status().prefix("--decode gpu");
  }
  return Status::ok();
}

namespace {
/// Whether `worldSize` ranks are the D x P x T of `sizes` (the bundle at `origin`).
Status checkParallelCount(const std::string &origin, const ParallelSizes &sizes,
                          int64_t worldSize) {
  const int64_t dp = sizes.dp, pp = sizes.pp, tp = sizes.tp;
  if (pp > 1 && dp * tp * pp != worldSize)
    return Status::error("{} was compiled for {} pipeline stages (forgec --pp {}), this run has "
                         "{} rank{}: start it with forge-train --nproc {} (or WORLD_SIZE={} from "
                         "a launcher)",
                         origin, pp, pp, worldSize, worldSize > 1 ? "s" : "", dp * tp * pp,
                         dp * tp * pp);
  if (pp == 1 && dp * tp != worldSize) {
    const std::string layout =
        tp > 1 ? fmt::format("{} rank{} ({} data-parallel x {} tensor-parallel: forgec --dp {} "
                             "--tp {})",
                             dp * tp, dp * tp > 1 ? "s" : "", dp, tp, dp, tp)
               : fmt::format("{} data-parallel rank{} (forgec --dp {})", dp, dp > 1 ? "s" : "",
                             dp);
    return Status::error("{} was compiled for {}, this run has {}: {}", origin, layout, worldSize,
                         dp * tp > 1
                             ? fmt::format("start it with forge-train --nproc {} (or WORLD_SIZE="
                                           "{} from a launcher)",
                                           dp * tp, dp * tp)
                             : std::string("compile it with forgec --dp N for N ranks"));
  }
  return Status::ok();
}
} // namespace

Status Trainer::checkRankCount(const Bundle &bundle, int64_t worldSize) {
  auto sizes = parallelSizes(bundle);
  if (!sizes)
    return sizes.status();
  return checkParallelCount(bundle.origin(), *sizes, worldSize);
}

/// Data, pipeline and tensor parallelism: the bundle's layout (D x P x T
/// ranks, the T of a tensor-parallel group consecutive; `dp` and `tp` as
/// create() read them, P = ppSize_) and this process's group must agree. Sets
/// the data-parallel size, rank and the tensor-parallel size.
Status Trainer::checkRankLayout(const Bundle &bundle, const TrainerOptions &options, int64_t dp,
                                int64_t tp) {
  const int64_t pp = ppSize_;
  if (options.worldSize < 1 || options.rank < 0 || options.rank >= options.worldSize)
    return Status::error("rank {} of {} is not a data-parallel rank", options.rank,
                         options.worldSize);
  FORGE_RETURN_IF_ERROR(checkParallelCount(bundle.origin(), {dp, pp, tp}, options.worldSize));
  dpSize_ = dp;
  tpSize_ = tp;
  dpRank_ = options.rank / (tp * pp);
  return Status::ok();
}

/// Where each micro-batch's fields are written: the routine's input buffers,
/// or (an accumulation loop, length buckets) host buffers of their own bound
/// for each run; and the prefetch ring's sets (--prefetch K: K + 1, the one
/// the device reads and the batches ahead of it).
Status Trainer::allocateBatchBuffers(const std::vector<std::vector<int32_t>> &tensors, bool loop,
                                     unsigned prefetch) {
  Executor &ex = *exec_;
  const int64_t micro = micro_;
  microOuts_.assign(static_cast<size_t>(micro), {});
  microInputs_.assign(static_cast<size_t>(micro), {});
  for (int64_t k = 0; k < micro; ++k)
    for (size_t f = 0; f < fields_.size(); ++f) {
      void *out = ex.inputBuffer(tensors[f][k]);
      // One input, K batches (a loop), or the inputs of the step's bucket: each
      // its own buffer, bound for its run.
      if (loop || bucketed_) {
        auto buf = ex.allocateHostBuffer(
            static_cast<size_t>(batch_) * sampleBytes_[f],
            fmt::format("micro-batch {} of input '{}'", k, fields_[f].name));
        if (!buf)
          return buf.status();
        out = buf->get();
        loopBuffers_.push_back(buf.take());
      }
      microOuts_[k].push_back(out);
      microInputs_[k].push_back(tensors[f][k]);
    }
  // Device-decoded images: each micro-batch's JPEG lengths, after the fields' buffers.
  auto lengthsBuffer = [&](const std::string &what) -> Expected<void *> {
    auto buf = ex.allocateHostBuffer(static_cast<size_t>(batch_) * sizeof(uint32_t), what);
    if (!buf)
      return buf.status();
    void *p = buf->get();
    loopBuffers_.push_back(buf.take());
    return p;
  };
  for (int64_t k = 0; encodedField_ >= 0 && k < micro; ++k) {
    auto p = lengthsBuffer(fmt::format("micro-batch {}'s JPEG lengths", k));
    if (!p)
      return p.status();
    microOuts_[k].push_back(*p);
  }
  if (prefetch > 0 && trainData_) {
    // The ring's buffers: prefetch + 1 sets (the one the device reads, and the
    // batches ahead of it).
    ring_.resize(static_cast<size_t>(prefetch) + 1);
    for (size_t i = 0; i < ring_.size(); ++i) {
      Slot &slot = ring_[i];
      slot.outs.assign(static_cast<size_t>(micro), {});
      for (int64_t k = 0; k < micro; ++k)
        for (size_t f = 0; f < fields_.size(); ++f) {
          auto buf = ex.allocateHostBuffer(
              static_cast<size_t>(batch_) * sampleBytes_[f],
              fmt::format("prefetched batch {} of input '{}'", i, fields_[f].name));
          if (!buf)
            return buf.status();
          slot.outs[k].push_back(buf->get());
          slot.buffers.push_back(buf.take());
        }
      for (int64_t k = 0; encodedField_ >= 0 && k < micro; ++k) {
        auto p = lengthsBuffer(fmt::format("prefetched batch {}'s JPEG lengths", i));
        if (!p)
          return p.status();
        slot.outs[k].push_back(*p);
      }
    }
  }
  return Status::ok();
}

std::unique_ptr<EpochSampler> Trainer::makeSampler(uint64_t seed, bool shuffle) const {
  auto sampler = std::make_unique<EpochSampler>(trainData_->numSamples(), globalSamplesPerStep(),
                                                seed, shuffle);
  if (bucketed_)
    sampler->setGroups(sampleBucket_);
  return sampler;
}

Trainer::Bucket Trainer::plainBucket(int64_t length,
                                     const std::vector<std::vector<int32_t>> &tensors) const {
  Bucket b;
  b.length = length;
  b.train = train_;
  b.stepInput = stepInput_;
  b.flops = flopsPerStep();
  for (const std::vector<int32_t> &perField : tensors) {
    b.inputs.push_back(perField.front());
    b.firstInputs.push_back(perField.front()); // a loop's micro-batch 0: accumulate_first's
    b.accumInputs.push_back(perField.back());  // and the others: accumulate's
  }
  b.accum = accum_;
  b.firstAccum = firstAccum_;
  b.accumStep = accumStepInput_;
  b.firstStep = firstStepInput_;
  b.microIndex = microIndexInput_;
  b.firstMicroIndex = firstMicroIndexInput_;
  return b;
}

Status Trainer::bindBuckets(const std::string &text,
                            const std::vector<std::vector<int32_t>> &tensors) {
  const std::string &origin = exec_->bundle().origin();
  std::vector<int64_t> lengths;
  const size_t eq = text.find('=');
  for (size_t at = eq == std::string::npos ? text.size() : eq + 1; at < text.size();) {
    size_t comma = std::min(text.find(',', at), text.size());
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data() + at, text.data() + comma, v);
    if (ec != std::errc() || end != text.data() + comma || v < 1 ||
        (!lengths.empty() && v <= lengths.back()))
      return Status::error("{}: build option length_buckets '{}' is not NAME=T1,T2,... with "
                           "increasing lengths",
                           origin, text);
    lengths.push_back(v);
    at = comma + 1;
  }
  if (lengths.size() < 2)
    return Status::error("{}: build option length_buckets '{}' names fewer than two lengths",
                         origin, text);
  if (ppSize_ > 1 || !schedule_.empty() || (micro_ > 1 && accum_.index < 0))
    return Status::error("{}: length buckets with --pp, a batch-size schedule or unrolled "
                         "micro-batches are not supported",
                         origin);
  const int64_t top = lengths.back();
  // A field's shape at length T: train_step's with each dim of `top` replaced by T.
  auto shapeAt = [&](const DataField &f, int64_t t) {
    std::vector<int64_t> shape{batch_};
    for (int64_t d : f.sampleShape)
      shape.push_back(d == top ? t : d);
    return shape;
  };
  buckets_.clear();
  for (int64_t length : lengths) {
    Bucket b;
    b.length = length;
    if (length == top) { // the plain routines
      buckets_.push_back(plainBucket(length, tensors));
      continue;
    }
    // A routine of this bucket: its index, its forge.step / forge.micro_index
    // inputs, and its data inputs by field (none: a loop's train_step).
    auto resolve = [&](const std::string &name, bool data, double runs, Routine &routine,
                       int32_t &step, int32_t *microIndex, std::vector<int32_t> &inputs) -> Status {
      auto index = exec_->findRoutine(name);
      if (!index)
        return Status::error("{}: build option length_buckets '{}' but no routine '{}'", origin,
                             text, name);
      routine.index = *index;
      inputs.assign(data ? fields_.size() : 0, -1);
      for (int32_t t : exec_->inputs(*index)) {
        const bundle::TensorInfo &info = exec_->tensorInfo(t);
        const bool scalar = numElements(shapeOf(info)) == 1;
        if (info.name() == "forge.step" && scalar && info.dtype() == bundle::F32) {
          step = t;
          continue;
        }
        if (info.name() == "forge.micro_index" && microIndex && scalar &&
            info.dtype() == bundle::I64) {
          *microIndex = t;
          continue;
        }
        auto f = std::find_if(fields_.begin(), fields_.end(),
                              [&](const DataField &d) { return d.name == info.name(); });
        if (!data || f == fields_.end())
          return Status::error("{}: {} reads input '{}' ({}{}), which the plain routine does not",
                               origin, name, info.name(), dtypeName(info.dtype()),
                               shapeString(shapeOf(info)));
        if (info.dtype() != f->dtype || shapeOf(info) != shapeAt(*f, length))
          return Status::error("{}: {} input '{}' is {}{}, expected {}{} (the plain routine's "
                               "at T = {})",
                               origin, name, info.name(), dtypeName(info.dtype()),
                               shapeString(shapeOf(info)), dtypeName(f->dtype),
                               shapeString(shapeAt(*f, length)), length);
        inputs[static_cast<size_t>(f - fields_.begin())] = t;
      }
      for (size_t f = 0; f < inputs.size(); ++f)
        if (inputs[f] < 0)
          return Status::error("{}: {} has no input '{}'", origin, name, fields_[f].name);
      for (const bundle::Instruction &inst :
           exec_->bundle().program().routines(*index).instructions())
        b.flops += static_cast<double>(inst.flops()) * runs;
      return Status::ok();
    };
    const std::string name = fmt::format("train_step@len{}", length);
    const bool loop = accum_.index >= 0;
    FORGE_RETURN_IF_ERROR(resolve(name, !loop, 1.0, b.train, b.stepInput, nullptr, b.inputs));
    if (loop) {
      const bool first = firstAccum_.index >= 0; // it runs micro-batch 0
      FORGE_RETURN_IF_ERROR(resolve(fmt::format("accumulate@len{}", length), true,
                                    static_cast<double>(micro_ - (first ? 1 : 0)), b.accum,
                                    b.accumStep, &b.microIndex, b.accumInputs));
      if (first)
        FORGE_RETURN_IF_ERROR(resolve(fmt::format("accumulate_first@len{}", length), true, 1.0,
                                      b.firstAccum, b.firstStep, &b.firstMicroIndex,
                                      b.firstInputs));
      if ((b.microIndex < 0) != (microIndexInput_ < 0))
        return Status::error("{}: accumulate@len{} and accumulate disagree on forge.micro_index",
                             origin, length);
    }
    FORGE_RETURN_IF_ERROR(bindScalarOutputs(b.train, /*train=*/true));
    buckets_.push_back(b);
  }
  return Status::ok();
}

Status Trainer::bindBucketEvals(const std::vector<int32_t> &plainEvalInputs) {
  const std::string &origin = exec_->bundle().origin();
  if (buckets_.empty()) { // no length_buckets: the eval routine's T alone
    Bucket plain;
    plain.length = evalFields_.front().sampleShape.at(0);
    buckets_.push_back(plain);
  }
  for (Bucket &b : buckets_) {
    if (&b == &buckets_.back()) {
      b.eval = eval_;
      b.evalInputs = plainEvalInputs;
      b.evalWeight = evalWeight_;
      continue;
    }
    const std::string name = fmt::format("eval@len{}", b.length);
    auto index = exec_->findRoutine(name);
    if (!index)
      return Status::error("{}: variable-length eval data needs routine '{}'", origin, name);
    b.eval.index = *index;
    b.evalInputs.assign(evalFields_.size(), -1);
    b.evalWeight = -1;
    for (int32_t t : exec_->inputs(*index)) {
      const bundle::TensorInfo &info = exec_->tensorInfo(t);
      if (info.name() == kSampleWeight) {
        b.evalWeight = t;
        continue;
      }
      auto f = std::find_if(evalFields_.begin(), evalFields_.end(),
                            [&](const DataField &d) { return d.name == info.name(); });
      if (f == evalFields_.end() || info.dtype() != f->dtype || info.shape_size() != 2 ||
          info.shape(0) != evalBatch_ || info.shape(1) != b.length)
        return Status::error("{}: {} input '{}' ({}{}) is not an eval input at T = {}", origin,
                             name, info.name(), dtypeName(info.dtype()),
                             shapeString(shapeOf(info)), b.length);
      b.evalInputs[static_cast<size_t>(f - evalFields_.begin())] = t;
    }
    for (size_t f = 0; f < evalFields_.size(); ++f)
      if (b.evalInputs[f] < 0)
        return Status::error("{}: {} has no input '{}'", origin, name, evalFields_[f].name);
    if ((b.evalWeight < 0) != (evalWeight_ < 0))
      return Status::error("{}: {} and eval disagree on input '{}'", origin, name, kSampleWeight);
    FORGE_RETURN_IF_ERROR(bindScalarOutputs(b.eval, /*train=*/false));
  }
  // The batches' buffers, at the largest length (fillAt writes shorter rows packed).
  evalBuffers_.clear();
  for (const DataField &f : evalFields_) {
    auto buf = exec_->allocateHostBuffer(
        static_cast<size_t>(evalBatch_ * numElements(f.sampleShape)) * dtypeSize(f.dtype),
        fmt::format("eval batch of input '{}'", f.name));
    if (!buf)
      return buf.status();
    evalBuffers_.push_back(buf.take());
  }
  return Status::ok();
}

Expected<EvalResult> Trainer::evaluateBuckets() {
  // Each bucket's samples in order, in batches of evalBatch_ (a last partial
  // one padded with weight-0 repeats), weighted by their labels' count.
  EvalResult r;
  const int64_t n = evalData_->numSamples();
  std::vector<std::vector<int64_t>> members(buckets_.size());
  for (int64_t i = 0; i < n; ++i)
    members[bucketOf(evalData_->sampleLength(i))].push_back(i);
  std::vector<void *> outs;
  for (const Executor::HostBuffer &buf : evalBuffers_)
    outs.push_back(buf.get());
  EvalTally tally;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket &bucket = buckets_[b];
    const std::vector<int64_t> &list = members[b];
    if (!list.empty() && bucket.evalWeight < 0 && list.size() % static_cast<size_t>(evalBatch_) != 0)
      return Status::error("the eval routine has no {} input: {} eval samples of length bucket "
                           "{} are not whole batches of {}",
                           kSampleWeight, list.size(), bucket.length, evalBatch_);
    for (size_t start = 0; start < list.size(); start += static_cast<size_t>(evalBatch_)) {
      const int64_t real = std::min<int64_t>(evalBatch_, static_cast<int64_t>(list.size() - start));
      for (int64_t i = 0; i < evalBatch_; ++i)
        evalIndices_[static_cast<size_t>(i)] = list[start + static_cast<size_t>(i % real)];
      FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
      FORGE_RETURN_IF_ERROR(evalData_->fillAt(evalIndices_, outs, bucket.length));
      for (size_t f = 0; f < bucket.evalInputs.size(); ++f)
        FORGE_RETURN_IF_ERROR(exec_->bindInput(bucket.evalInputs[f], outs[f]));
      if (bucket.evalWeight >= 0) {
        auto *w = static_cast<float *>(exec_->inputBuffer(bucket.evalWeight));
        for (int64_t i = 0; i < evalBatch_; ++i)
          w[i] = i < real ? 1.0f : 0.0f;
      }
      FORGE_RETURN_IF_ERROR(exec_->run(bucket.eval.index));
      FORGE_RETURN_IF_ERROR(exec_->wait());
      tally.add(*exec_, bucket.eval, real);
      r.samples += real;
      ++r.batches;
    }
  }
  r.loss = tally.labels > 0 ? tally.loss / tally.labels : std::nan("");
  if (buckets_.back().eval.extra1 >= 0)
    r.accuracy = tally.labels > 0 ? tally.correct / tally.labels : std::nan("");
  return r;
}

Status Trainer::bindScalarOutputs(Routine &r, bool train) const {
  auto loss = scalarOutput(*exec_, r.index, "loss", true);
  if (!loss)
    return loss.status();
  r.loss = *loss;
  using Out = std::pair<const char *, int32_t *>;
  const std::vector<Out> optional =
      train ? std::vector<Out>{{"forge.lr", &r.extra1},
                               {"forge.grad_norm", &r.extra2},
                               {"forge.loss_scale_used", &r.scale},
                               {"forge.skipped", &r.skipped}}
            : std::vector<Out>{{"forge.correct", &r.extra1}, {"forge.label_count", &r.extra2}};
  for (auto [name, into] : optional) {
    auto t = scalarOutput(*exec_, r.index, name, false);
    if (!t)
      return t.status();
    *into = *t;
  }
  return Status::ok();
}

void Trainer::EvalTally::add(const Executor &ex, const Routine &eval, int64_t real) {
  const double count =
      eval.extra2 >= 0 ? readScalar(ex, eval.extra2) : static_cast<double>(real);
  if (count > 0) // a batch of ignored labels only has a NaN mean and no weight
    loss += static_cast<double>(readScalar(ex, eval.loss)) * count;
  labels += count;
  if (eval.extra1 >= 0)
    correct += readScalar(ex, eval.extra1);
}

Status Trainer::setEvalData(std::unique_ptr<DataSource> eval) {
  if (!eval)
    return Status::error("internal: setEvalData without a source");
  if (inFlight_ != 0)
    return Status::error("internal: setEvalData() with {} step(s) in flight", inFlight_);
  const bundle::Program &p = exec_->bundle().program();
  const std::string &origin = exec_->bundle().origin();
  const std::string label = buildOption(p, "label_input");
  int64_t numClasses = 0;
  std::optional<int64_t> ignore;
  classesOf(p, numClasses, ignore);
  // A second source replaces the first: the binding starts over.
  evalData_.reset();
  evalFields_.clear();
  evalOuts_.clear();
  evalBatch_ = 0;
  evalLabelElements_ = 0;
  evalWeight_ = -1;
  auto evalIndex = exec_->findRoutine("eval" + routineSuffix_);
  if (!evalIndex)
    return Status::error("eval data was given but {} has no 'eval{}' routine", origin,
                         routineSuffix_);
  eval_.index = *evalIndex;
  std::vector<int32_t> evalTensors;
  for (int32_t t : exec_->inputs(eval_.index)) {
    const bundle::TensorInfo &info = exec_->tensorInfo(t);
    if (info.name() == kSampleWeight) { // not data: evaluate() fills it
      if (info.dtype() != bundle::F32 || info.shape_size() != 1)
        return Status::error("{}: eval input '{}' must be f32 [batch], is {}{}", origin,
                             info.name(), dtypeName(info.dtype()),
                             shapeString(shapeOf(info)));
      evalWeight_ = t;
      continue;
    }
    if (info.shape_size() == 0)
      return Status::error("{}: eval input '{}' is a scalar; data inputs need a batch dim 0",
                           origin, info.name());
    DataField f;
    f.name = info.name();
    f.dtype = info.dtype();
    f.sampleShape.assign(info.shape().begin() + 1, info.shape().end());
    f.isLabel = !label.empty() && f.name == label;
    if (f.isLabel) {
      f.numClasses = numClasses;
      f.ignoreValue = ignore;
      evalLabelElements_ = numElements(shapeOf(info));
      if (labelsAreProbabilities(p) && info.shape_size() > 1) // a row of C per prediction
        evalLabelElements_ /= info.shape(info.shape_size() - 1);
    }
    if (evalBatch_ == 0)
      evalBatch_ = info.shape(0);
    else if (info.shape(0) != evalBatch_)
      return Status::error("{}: eval inputs disagree on the batch size: '{}' has {}, expected "
                           "{}",
                           origin, f.name, info.shape(0), evalBatch_);
    evalFields_.push_back(f);
    evalTensors.push_back(t);
  }
  if (evalFields_.empty() || evalBatch_ <= 0)
    return Status::error("{}: the eval routine has no data inputs", origin);
  if (evalLabelElements_ == 0)
    evalLabelElements_ = evalBatch_;
  FORGE_RETURN_IF_ERROR(bindScalarOutputs(eval_, /*train=*/false));
  FORGE_RETURN_IF_ERROR(eval->bind(evalFields_));
  if (eval->numSamples() < evalBatch_)
    return Status::error("{}: {} eval samples, fewer than one batch ({})", eval->describe(),
                         eval->numSamples(), evalBatch_);
  evalData_ = std::move(eval);
  for (int32_t t : evalTensors)
    evalOuts_.push_back(exec_->inputBuffer(t));
  if (evalData_->variableLength())
    FORGE_RETURN_IF_ERROR(bindBucketEvals(evalTensors));
  evalIndices_.resize(static_cast<size_t>(evalBatch_));
  if (evalWeight_ >= 0 && exec_->tensorInfo(evalWeight_).shape(0) != evalBatch_)
    return Status::error("{}: eval input '{}' has {} weights for batches of {}", origin,
                         kSampleWeight, exec_->tensorInfo(evalWeight_).shape(0),
                         evalBatch_);
  return Status::ok();
}

Status Trainer::launch(std::vector<Executor::Span> *profile) {
  if (inFlight_ >= 2)
    return Status::error("internal: two steps are in flight; collect one first");
  if (profile && inFlight_ != 0)
    return Status::error("internal: a profiled step needs the device idle");
  if (!trainData_)
    return Status::error("this trainer has no training data: pass each batch to the step "
                         "(Trainer::stepOn)");
  FORGE_RETURN_IF_ERROR(failedError());
  if (!ring_.empty() && !producer_.joinable())
    FORGE_RETURN_IF_ERROR(startProducer()); // from the sampler's position, before next()
  const int64_t s = step_ + inFlight_ + 1;
  std::span<const int64_t> global = sampler_->next(globalSamplesAt(s));
  if (global.size() != static_cast<size_t>(globalSamplesAt(s)))
    return Status::error("internal: the sampler returned {} indices, expected {}",
                         global.size(), globalSamplesAt(s));
  std::span<const int64_t> indices = rankShare(global, samplesAt(s));
  int64_t realTokens = 0;
  if (bucketed_) { // every sample of a step is of one bucket (the sampler's groups)
    curBucket_ = static_cast<size_t>(sampleBucket_[static_cast<size_t>(global.front())]);
    for (int64_t i : global)
      realTokens += trainData_->sampleLength(i);
  }
  const int64_t length = bucketed_ ? buckets_[curBucket_].length : 0;
  const auto t0 = std::chrono::steady_clock::now();
  FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
  const std::vector<std::vector<void *>> *outs = &microOuts_; // the step's batch, per k
  if (ring_.empty()) {
    std::lock_guard<std::mutex> fill(fillMutex_);
    trainData_->setEpoch(sampler_->position().epoch); // the epoch of `indices`
    FORGE_RETURN_IF_ERROR(fillStep(*trainData_, indices, microOuts_, length));
  } else {
    // The device has taken the last run's inputs: its slot is free. Then wait
    // for this step's batch (the stall) and point the inputs at it.
    Slot *slot;
    {
      std::unique_lock<std::mutex> lock(ringMutex_);
      inUse_ = -1;
      ringCv_.notify_all();
      const size_t at = static_cast<size_t>(consumed_ % static_cast<int64_t>(ring_.size()));
      ringCv_.wait(lock, [&] { return ring_[at].ready || producerDone_; });
      if (!ring_[at].ready)
        return Status::error("the data prefetch thread stopped after an earlier failed batch");
      slot = &ring_[at];
      slot->ready = false;
      inUse_ = static_cast<int>(at);
      ++consumed_;
    }
    ringCv_.notify_all();
    FORGE_RETURN_IF_ERROR(slot->status);
    if (!std::equal(indices.begin(), indices.end(), slot->indices.begin(), slot->indices.end()))
      return Status::error("internal: the prefetched batch holds other samples than step {}'s",
                           step_ + inFlight_ + 1);
    outs = &slot->outs;
    if (accum_.index < 0 && !bucketed_) // a loop or a bucket binds its inputs for its run
      for (size_t k = 0; k < microInputs_.size(); ++k)
        for (size_t f = 0; f < microInputs_[k].size(); ++f)
          FORGE_RETURN_IF_ERROR(exec_->bindInput(microInputs_[k][f], slot->outs[k][f]));
  }
  // A loop binds each micro-batch's JPEG lengths for its run (bindMicroBatch); one run
  // reads every micro-batch's canvas input: bind them all now (evaluate() unbinds them).
  for (size_t k = 0; accum_.index < 0 && k < microInputs_.size(); ++k)
    FORGE_RETURN_IF_ERROR(bindEncodedLengths(outs, k));
  const double inputSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::optional<uint64_t> run =
      profile ? std::nullopt : std::optional<uint64_t>(exec_->runsIssued());
  FORGE_RETURN_IF_ERROR(
      runStep([&](int64_t k) { return bindMicroBatch(*outs, k); }, profile));
  ++inFlight_;
  launched_.push_back({run, inputSeconds, curBucket_, realTokens});
  return Status::ok();
}

Status Trainer::startProducer() {
  stopProducer();
  lookahead_ = makeSampler(options_.seed, options_.shuffle);
  lookahead_->seek(sampler_->position());
  for (Slot &slot : ring_)
    slot.ready = false;
  produced_ = consumed_ = 0;
  ringStep_ = step_ + inFlight_;
  inUse_ = -1;
  stopProducer_ = false;
  producerDone_ = false;
  try {
    producer_ = std::thread(&Trainer::produce, this);
  } catch (const std::system_error &e) {
    return Status::error("cannot start the data prefetch thread: {}", e.what());
  }
  return Status::ok();
}

void Trainer::stopProducer() {
  if (!producer_.joinable())
    return;
  {
    std::lock_guard<std::mutex> lock(ringMutex_);
    stopProducer_ = true;
  }
  ringCv_.notify_all();
  producer_.join();
}

void Trainer::produce() {
  const size_t n = ring_.size();
  struct Done { // wakes a launch() waiting for a batch this thread will not make
    Trainer &t;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(t.ringMutex_);
        t.producerDone_ = true;
      }
      t.ringCv_.notify_all();
    }
  } done{*this};
  for (;;) {
    Slot *slot;
    {
      std::unique_lock<std::mutex> lock(ringMutex_);
      ringCv_.wait(lock, [&] {
        const size_t at = static_cast<size_t>(produced_ % static_cast<int64_t>(n));
        return stopProducer_ || (!ring_[at].ready && static_cast<int>(at) != inUse_);
      });
      if (stopProducer_)
        return;
      slot = &ring_[static_cast<size_t>(produced_ % static_cast<int64_t>(n))];
    }
    // The slot is neither ready nor read by the device: only this thread touches it.
    const int64_t step = ringStep_ + produced_ + 1; // produced_ is this thread's alone to change
    std::span<const int64_t> indices =
        rankShare(lookahead_->next(globalSamplesAt(step)), samplesAt(step));
    slot->indices.assign(indices.begin(), indices.end());
    const int64_t length =
        bucketed_ && !indices.empty()
            ? buckets_[static_cast<size_t>(sampleBucket_[static_cast<size_t>(indices.front())])]
                  .length
            : 0;
    {
      std::lock_guard<std::mutex> fill(fillMutex_);
      trainData_->setEpoch(lookahead_->position().epoch); // the epoch of `indices`
      slot->status = fillStep(*trainData_, indices, slot->outs, length);
    }
    const bool failed = !slot->status.isOk();
    {
      std::lock_guard<std::mutex> lock(ringMutex_);
      slot->ready = true;
      ++produced_;
    }
    ringCv_.notify_all();
    if (failed) // launch() reports it with the step that needs this batch
      return;
  }
}

Trainer::~Trainer() {
  stopProducer();
  // The ring's buffers go before the executor: let the device finish reading them.
  if (exec_ && !ring_.empty())
    (void)exec_->waitInputsConsumed();
}

Status Trainer::fillStep(DataSource &source, std::span<const int64_t> indices,
                         const std::vector<std::vector<void *>> &outsPerMicro, int64_t length) {
  // At a bucket's length every field is a sequence [length] (DataSource::fillAt).
  auto bytesOf = [&](size_t f) {
    if (f == fields_.size()) // encodeImages()'s lengths
      return sizeof(uint32_t);
    return length > 0 ? static_cast<size_t>(length) * dtypeSize(fields_[f].dtype) : sampleBytes_[f];
  };
  auto fillPart = [&](std::span<const int64_t> part, std::span<void *const> outs) {
    return length > 0 ? source.fillAt(part, outs, length) : source.fill(part, outs);
  };
  // Each micro-batch's samples, split over the data workers: sample i of
  // micro-batch k lands at i * sampleBytes_[f] of field f's buffer, so the
  // bytes do not depend on how many workers there are.
  const int64_t micro = static_cast<int64_t>(indices.size()) / batch_; // this step's
  for (int64_t k = 0; k < micro; ++k) {
    std::span<const int64_t> part =
        indices.subspan(static_cast<size_t>(k * batch_), static_cast<size_t>(batch_));
    const std::vector<void *> &micro = outsPerMicro[static_cast<size_t>(k)];
    if (!dataPool_) {
      FORGE_RETURN_IF_ERROR(fillPart(part, micro));
      continue;
    }
    // A bad sample's error is the first sample's of the batch, however the work was split.
    std::mutex mutex;
    Status first = Status::ok();
    int64_t firstBegin = batch_;
    dataPool_->parallelFor(batch_, 1, [&](int64_t begin, int64_t end) {
      std::vector<void *> outs;
      for (size_t f = 0; f < micro.size(); ++f)
        outs.push_back(static_cast<uint8_t *>(micro[f]) + static_cast<size_t>(begin) * bytesOf(f));
      Status st = fillPart(
          part.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)), outs);
      if (!st.isOk()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (begin < firstBegin) {
          firstBegin = begin;
          first = std::move(st);
        }
      }
    });
    FORGE_RETURN_IF_ERROR(first);
  }
  return Status::ok();
}

Expected<StepResult> Trainer::collect() {
  if (inFlight_ == 0)
    return Status::error("internal: no step in flight");
  if (launched_.size() != static_cast<size_t>(inFlight_))
    return Status::error("internal: {} steps in flight, {} launched", inFlight_, launched_.size());
  const Launched mine = launched_.front();
  StepResult r;
  // The older of two in flight: its routine ran again in the newer step unless that
  // step was of another length bucket (another routine).
  const int runsAgo = inFlight_ == 2 && launched_[1].bucket == mine.bucket ? 1 : 0;
  auto read = [&](int32_t t) -> Expected<float> {
    float v;
    if (inFlight_ == 2) {
      auto view = exec_->routineOutput(t, runsAgo);
      if (!view)
        return view.status();
      std::memcpy(&v, view->data, sizeof(v));
    } else {
      v = readScalar(*exec_, t);
    }
    return v;
  };
  // A failure the device reports after the run: the step (and any after it) is lost.
  auto abandon = [&](const Status &st) {
    failed_ = fmt::format("step {} failed on the device ({})", step_ + 1, st.message());
    inFlight_ = 0;
    launched_.clear();
    return st;
  };
  if (inFlight_ == 1)
    if (Status st = exec_->wait(); !st.isOk())
      return abandon(st);
  const Routine &routine = bucketed_ ? buckets_[mine.bucket].train : train_;
  auto loss = read(routine.loss);
  if (!loss)
    return abandon(loss.status());
  r.loss = *loss;
  // The optional scalar outputs (-1: the bundle has none).
  for (auto [t, into] : {std::pair{routine.extra1, &r.lr}, std::pair{routine.extra2, &r.gradNorm},
                         std::pair{routine.scale, &r.lossScale}}) {
    if (t < 0)
      continue;
    auto v = read(t);
    if (!v)
      return abandon(v.status());
    *into = *v;
  }
  if (routine.skipped >= 0) {
    auto skipped = read(routine.skipped);
    if (!skipped)
      return abandon(skipped.status());
    r.skipped = *skipped != 0.0f;
  }
  --inFlight_;
  r.step = ++step_;
  r.samples = samplesAt(r.step);
  r.flops = flopsAt(r.step);
  if (bucketed_) {
    r.length = buckets_[mine.bucket].length;
    r.realTokens = mine.realTokens;
    r.flops = buckets_[mine.bucket].flops;
  }
  r.inputSeconds = mine.inputSeconds;
  if (mine.run)
    r.idleSeconds = exec_->idleBefore(*mine.run);
  launched_.pop_front();
  return r;
}

Expected<StepResult> Trainer::step(std::vector<Executor::Span> *profile) {
  if (inFlight_ != 0)
    return Status::error("internal: step() with {} step(s) in flight", inFlight_);
  FORGE_RETURN_IF_ERROR(launch(profile));
  return collect();
}

Status Trainer::failedError() const {
  if (failed_.empty())
    return Status::ok();
  return Status::error("{}: its update may be partly applied and the device stays failed; "
                       "continue with a new trainer (a new process) resumed from a checkpoint",
                       failed_);
}

Status Trainer::bindEncodedLengths(const std::vector<std::vector<void *>> *outs, size_t k) {
  if (encodedField_ < 0)
    return Status::ok();
  // The JPEG lengths fillStep wrote after the fields' buffers.
  const auto *lengths = outs ? static_cast<const uint32_t *>((*outs)[k][fields_.size()]) : nullptr;
  return exec_->bindEncodedInput(microInputs_[k][static_cast<size_t>(encodedField_)], lengths);
}

Status Trainer::refuseCallerImages() const {
  if (encodedField_ < 0)
    return Status::ok();
  return Status::error("this trainer's images are decoded on the device ({}); it takes no "
                       "batches from the caller",
                       imageDecoder_);
}

Status Trainer::bindMicroBatch(const std::vector<std::vector<void *>> &outs, int64_t k) {
  if (bucketed_) {
    const Bucket &b = buckets_[curBucket_];
    const bool first = k == 0 && b.firstAccum.index >= 0;
    const std::vector<int32_t> &inputs = b.accum.index < 0 ? b.inputs
                                         : first           ? b.firstInputs
                                                           : b.accumInputs;
    for (size_t f = 0; f < inputs.size(); ++f)
      FORGE_RETURN_IF_ERROR(exec_->bindInput(inputs[f], outs[k][f]));
    if (int32_t t = first ? b.firstMicroIndex : b.microIndex; b.accum.index >= 0 && t >= 0)
      FORGE_RETURN_IF_ERROR(exec_->bindInput(t, &microIndex_[k]));
    return Status::ok();
  }
  for (size_t f = 0; f < microInputs_[k].size(); ++f)
    FORGE_RETURN_IF_ERROR(exec_->bindInput(microInputs_[k][f], outs[k][f]));
  FORGE_RETURN_IF_ERROR(bindEncodedLengths(&outs, static_cast<size_t>(k)));
  if (int32_t t = microIndexInputOf(k); t >= 0)
    FORGE_RETURN_IF_ERROR(exec_->bindInput(t, &microIndex_[k]));
  return Status::ok();
}

Status Trainer::runStep(const std::function<Status(int64_t)> &bind,
                        std::vector<Executor::Span> *profile) {
  const int64_t step = step_ + inFlight_ + 1;
  const float s = static_cast<float>(step);
  const int64_t micro = microAt(step);
  // A routine's scalar inputs right before its run: on the CPU an input's
  // buffer is arena memory, which another run (another micro-batch's, or
  // accumulate's before train_step) may have reused.
  auto scalars = [&](int32_t stepInput, int32_t countInput) {
    if (stepInput >= 0)
      std::memcpy(exec_->inputBuffer(stepInput), &s, sizeof(s));
    if (countInput >= 0)
      std::memcpy(exec_->inputBuffer(countInput), &micro, sizeof(micro));
  };
  for (int64_t k = 0; k < micro; ++k) // micro-batch k's place among the ranks' micro-batches
    microIndex_[static_cast<size_t>(k)] = dpRank_ * micro + k;
  if (profile)
    profile->clear();
  auto runOne = [&](int routine) -> Status {
    if (!profile)
      return exec_->run(routine);
    auto spans = exec_->runProfiled(routine);
    if (!spans)
      return spans.status();
    double end = 0; // the runs end to end, 1 us apart
    for (const Executor::Span &sp : *profile)
      end = std::max(end, sp.startUs + sp.durationUs);
    const double offset = profile->empty() ? 0.0 : end + 1.0;
    for (Executor::Span &sp : *spans) {
      if (accum_.index >= 0)
        sp.routine = routine;
      sp.startUs += offset;
      profile->push_back(std::move(sp));
    }
    return Status::ok();
  };
  if (bucketed_) { // the step's bucket's routines (no batch-size schedule: K = micro_)
    const Bucket &b = buckets_[curBucket_];
    if (b.accum.index < 0) {
      FORGE_RETURN_IF_ERROR(bind(0));
    } else {
      for (int64_t k = 0; k < micro; ++k) {
        FORGE_RETURN_IF_ERROR(bind(k));
        const bool first = k == 0 && b.firstAccum.index >= 0;
        scalars(first ? b.firstStep : b.accumStep, -1);
        FORGE_RETURN_IF_ERROR(runOne(first ? b.firstAccum.index : b.accum.index));
      }
    }
    scalars(b.stepInput, -1);
    return runOne(b.train.index);
  }
  for (int64_t k = 0; accum_.index >= 0 && k < micro; ++k) {
    FORGE_RETURN_IF_ERROR(bind(k));
    const bool first = k == 0 && firstAccum_.index >= 0;
    scalars(first ? firstStepInput_ : accumStepInput_, first ? firstCountInput_ : accumCountInput_);
    FORGE_RETURN_IF_ERROR(runOne(first ? firstAccum_.index : accum_.index));
  }
  scalars(stepInput_, trainCountInput_);
  return runOne(train_.index);
}

Status Trainer::runNextStep(double inputSeconds, const std::function<Status(int64_t)> &bind) {
  const uint64_t run = exec_->runsIssued();
  FORGE_RETURN_IF_ERROR(runStep(bind ? bind : [&](int64_t k) { return bindMicroBatch(microOuts_, k); },
                                nullptr));
  ++inFlight_;
  launched_.push_back({run, inputSeconds, curBucket_, 0});
  return Status::ok();
}

Expected<StepResult> Trainer::stepOn(DataSource &batch) {
  if (inFlight_ != 0)
    return Status::error("internal: stepOn() with {} step(s) in flight", inFlight_);
  FORGE_RETURN_IF_ERROR(failedError());
  if (bucketed_)
    return Status::error("this trainer batches its variable-length data by length; it takes "
                         "no batches from the caller");
  FORGE_RETURN_IF_ERROR(refuseCallerImages());
  FORGE_RETURN_IF_ERROR(batch.bind(fields_));
  const int64_t next = step_ + 1, micro = microAt(next);
  if (batch.numSamples() != samplesAt(next))
    return Status::error("{}: the batch has {} samples, a step takes {}{}{}", batch.describe(),
                         batch.numSamples(), samplesAt(next),
                         micro > 1 ? fmt::format(" ({} micro-batches x {})", micro, batch_)
                                   : std::string(),
                         schedule_.empty()
                             ? std::string()
                             : fmt::format(" (step {} of the batch-size schedule)", next));
  std::vector<int64_t> indices(static_cast<size_t>(samplesAt(next)));
  for (size_t i = 0; i < indices.size(); ++i)
    indices[i] = static_cast<int64_t>(i);
  const auto t0 = std::chrono::steady_clock::now();
  FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
  // A ring launch may have pointed the inputs at a slot: fill the executor's own buffers.
  for (const std::vector<int32_t> &micro : microInputs_)
    for (int32_t t : micro)
      FORGE_RETURN_IF_ERROR(exec_->bindInput(t, nullptr));
  FORGE_RETURN_IF_ERROR(fillStep(batch, indices, microOuts_));
  const double inputSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FORGE_RETURN_IF_ERROR(runNextStep(inputSeconds));
  return collect();
}

Expected<StepResult> Trainer::stepOnDevice(std::span<const void *const> fields) {
  if (inFlight_ != 0)
    return Status::error("internal: stepOnDevice() with {} step(s) in flight", inFlight_);
  FORGE_RETURN_IF_ERROR(refuseCallerImages());
  FORGE_RETURN_IF_ERROR(failedError());
  if (bucketed_)
    return Status::error("this trainer batches its variable-length data by length; it takes "
                         "no batches from the caller");
  if (fields.size() != fields_.size())
    return Status::error("internal: {} device arrays for {} data fields", fields.size(),
                         fields_.size());
  FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
  auto rebindHost = [&] {
    for (const std::vector<int32_t> &micro : microInputs_)
      for (int32_t t : micro)
        (void)exec_->bindInput(t, nullptr);
  };
  auto bindDevice = [&](int64_t k) -> Status {
    for (size_t f = 0; f < fields_.size(); ++f) {
      const auto *at = static_cast<const uint8_t *>(fields[f]) +
                       static_cast<size_t>(k * batch_) * sampleBytes_[f];
      FORGE_RETURN_IF_ERROR(exec_->bindDeviceInput(microInputs_[k][f], at));
    }
    if (int32_t t = microIndexInputOf(k); t >= 0)
      FORGE_RETURN_IF_ERROR(exec_->bindInput(t, &microIndex_[k]));
    return Status::ok();
  };
  for (int64_t k = 0; accum_.index < 0 && k < micro_; ++k) // a loop binds k for its run
    if (Status st = bindDevice(k); !st.isOk()) {
      rebindHost();
      return st;
    }
  if (Status st = runNextStep(0.0, bindDevice); !st.isOk()) {
    rebindHost();
    return st;
  }
  auto r = collect(); // waits for the run, so the caller's arrays are read
  rebindHost();
  return r;
}

Expected<EvalResult> Trainer::evaluate() {
  if (!evalData_)
    return Status::error("no eval data");
  if (evalData_->variableLength())
    return evaluateBuckets();
  // The eval routine may read the training canvas's tensor: its samples are pixels.
  for (size_t k = 0; k < microInputs_.size(); ++k)
    FORGE_RETURN_IF_ERROR(bindEncodedLengths(nullptr, k));
  // Every sample counts. A last partial batch is padded by repeating its own
  // samples with weight 0 (forge.sample_weight), so the bundle's loss and
  // correct count cover the real samples only; each batch's mean loss is then
  // weighted by its real samples. Bundles without sample weights (a loss that
  // is the model's own scalar) evaluate the full batches only.
  EvalResult r;
  const int64_t total = evalData_->numSamples();
  const bool weighted = evalWeight_ >= 0;
  r.batches = weighted ? (total + evalBatch_ - 1) / evalBatch_ : total / evalBatch_;
  // With forge.label_count (cross_entropy's ignore=N) a batch's loss is the mean over
  // its counted labels: batches are weighted by that count, and so is the accuracy.
  EvalTally tally;
  for (int64_t b = 0; b < r.batches; ++b) {
    const int64_t real = std::min(evalBatch_, total - b * evalBatch_);
    for (int64_t i = 0; i < evalBatch_; ++i)
      evalIndices_[static_cast<size_t>(i)] = b * evalBatch_ + i % real;
    FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
    FORGE_RETURN_IF_ERROR(evalData_->fill(evalIndices_, evalOuts_));
    if (weighted) {
      auto *w = static_cast<float *>(exec_->inputBuffer(evalWeight_));
      for (int64_t i = 0; i < evalBatch_; ++i)
        w[i] = i < real ? 1.0f : 0.0f;
    }
    FORGE_RETURN_IF_ERROR(exec_->run(eval_.index));
    FORGE_RETURN_IF_ERROR(exec_->wait());
    tally.add(*exec_, eval_, real);
    r.samples += real;
  }
  r.loss = tally.labels > 0 ? tally.loss / tally.labels : std::nan("");
  if (eval_.extra1 >= 0 && eval_.extra2 >= 0)
    r.accuracy = tally.labels > 0 ? tally.correct / tally.labels : std::nan("");
  else if (eval_.extra1 >= 0 && r.samples)
    r.accuracy = tally.correct / (static_cast<double>(r.samples) *
                               static_cast<double>(evalLabelElements_) /
                               static_cast<double>(evalBatch_));
  return r;
}

int64_t Trainer::stepsForEpochs(int64_t epochs) const {
  if (schedule_.empty() || !trainData_)
    return epochs * stepsPerEpoch();
  // The schedule's steps differ: walk the sampler's positions (no orders drawn).
  const int64_t n = trainData_->numSamples();
  EpochSampler::Position pos;
  int64_t steps = 0;
  for (;;) {
    const int64_t count = globalSamplesAt(steps + 1);
    EpochSampler::Position start = EpochSampler::startOf(pos, count, n);
    if (count > n || start.epoch >= static_cast<uint64_t>(epochs))
      return steps;
    pos = {start.epoch, start.index + count};
    ++steps;
  }
}

double Trainer::epochsDone() const {
  if (!sampler_)
    return 0;
  const int64_t perStep = globalSamplesAt(step_ + 1);
  const int64_t perEpoch =
      trainData_ && perStep > 0 ? trainData_->numSamples() / perStep * perStep : 0;
  if (perEpoch <= 0)
    return 0;
  EpochSampler::Position pos = sampler_->position();
  // The sampler is past the launched, uncollected steps' samples too.
  int64_t ahead = 0;
  for (int i = 1; i <= inFlight_; ++i)
    ahead += globalSamplesAt(step_ + i);
  return static_cast<double>(pos.epoch) +
         static_cast<double>(pos.index - ahead) / static_cast<double>(perEpoch);
}

CheckpointState Trainer::state() const {
  CheckpointState s;
  s.step = step_;
  if (sampler_) {
    s.epoch = sampler_->position().epoch;
    s.index = sampler_->position().index;
  }
  s.seed = options_.seed;
  s.shuffle = options_.shuffle;
  s.trainSamples = trainData_ ? trainData_->numSamples() : 0;
  s.samplesPerStep = globalSamplesPerStep(); // the global layout: resumable on another --dp
  return s;
}

Status Trainer::restore(const CheckpointState &state) {
  if (!trainData_) {
    // Batches come from stepOn(): only the step count continues (forge.step, the schedule).
    if (inFlight_ != 0)
      return Status::error("internal: restore() with {} step(s) in flight", inFlight_);
    step_ = state.step;
    return Status::ok();
  }
  if (state.trainSamples != trainData_->numSamples())
    return Status::error("the checkpoint was taken with {} training samples, the data ({}) has "
                         "{}; resuming needs the same training data",
                         state.trainSamples, trainData_->describe(), trainData_->numSamples());
  if (state.samplesPerStep != globalSamplesPerStep())
    return Status::error("the checkpoint was taken with {} samples per step, this bundle takes {}"
                         "{}",
                         state.samplesPerStep, globalSamplesPerStep(),
                         dpSize_ > 1
                             ? fmt::format(" ({} ranks x {})", dpSize_, samplesPerStep())
                             : std::string());
  if (state.index < 0 || state.index > state.trainSamples)
    return Status::error("the checkpoint's data position {} is outside [0, {}]", state.index,
                         state.trainSamples);
  if (inFlight_ != 0)
    return Status::error("internal: restore() with {} step(s) in flight", inFlight_);
  // The prefetched batches belong to the old position: drop them (the ring
  // restarts at the next launch()).
  stopProducer();
  FORGE_RETURN_IF_ERROR(exec_->waitInputsConsumed());
  options_.seed = state.seed;
  options_.shuffle = state.shuffle;
  sampler_ = makeSampler(state.seed, state.shuffle);
  sampler_->seek({state.epoch, state.index});
  step_ = state.step;
  return Status::ok();
}

std::optional<std::string> Trainer::nonFiniteInputs(int64_t step) {
  // Documents (length buckets) are token ids, which hold nothing non-finite (and this
  // replay of the sampler knows no bucket groups).
  if (!trainData_ || bucketed_)
    return std::nullopt;
  const int64_t n = samplesAt(step), global = globalSamplesAt(step);
  const int64_t numSamples = trainData_->numSamples();
  if (step < 1 || global > numSamples)
    return std::nullopt;
  // The sampler is a pure function of (seed, epoch): the step's samples again,
  // from where steps 1..step-1 left it (their sizes may differ: a schedule).
  EpochSampler::Position pos;
  for (int64_t i = 1; i < step; ++i) {
    const int64_t count = globalSamplesAt(i);
    EpochSampler::Position start = EpochSampler::startOf(pos, count, numSamples);
    pos = {start.epoch, start.index + count};
  }
  pos = EpochSampler::startOf(pos, global, numSamples);
  EpochSampler replay(numSamples, global, options_.seed, options_.shuffle);
  std::vector<int64_t> order = replay.orderOf(pos.epoch);
  const int64_t first = pos.index + dpRank_ * n; // this rank's share
  std::vector<int64_t> indices(order.begin() + first, order.begin() + first + n);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<void *> outs;
  for (const DataField &f : fields_) {
    buffers.emplace_back(static_cast<size_t>(n * numElements(f.sampleShape)) *
                         dtypeSize(f.dtype));
    outs.push_back(buffers.back().data());
  }
  std::vector<uint32_t> lengths(static_cast<size_t>(n)); // encodeImages()'s, unused here
  if (encodedField_ >= 0)
    outs.push_back(lengths.data());
  bool filled;
  {
    // The prefetch thread may be filling: one fill (with its epoch) at a time;
    // every fill sets its own epoch first, so none is restored after this one.
    std::lock_guard<std::mutex> fill(fillMutex_);
    trainData_->setEpoch(pos.epoch);
    filled = trainData_->fill(indices, outs).isOk();
  }
  if (!filled)
    return std::nullopt;
  for (size_t k = 0; k < fields_.size(); ++k) {
    const DataField &f = fields_[k];
    const int64_t per = numElements(f.sampleShape);
    std::vector<int64_t> bad;
    double firstBad = 0;
    // Float inputs as the step saw them (f32 data narrowed to a bf16/f16 input included);
    // other dtypes cannot hold a NaN: visitFloat refuses them, and `bad` stays empty.
    (void)cpu::visitFloat(f.dtype, [&](auto tag) -> Status {
      using T = typename decltype(tag)::type;
      const T *values = reinterpret_cast<const T *>(buffers[k].data());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < per; ++j) {
          double v = static_cast<double>(values[i * per + j]);
          if (!std::isfinite(v)) {
            if (bad.empty())
              firstBad = v;
            bad.push_back(indices[i]);
            break;
          }
        }
      return Status::ok();
    });
    if (!bad.empty()) {
      std::sort(bad.begin(), bad.end());
      std::vector<int64_t> shown(bad.begin(), bad.begin() + std::min<size_t>(bad.size(), 8));
      return fmt::format("input '{}' holds {} in sample{} {}{} of {}", f.name, firstBad,
                         bad.size() > 1 ? "s" : "", fmt::join(shown, ", "),
                         bad.size() > shown.size() ? fmt::format(" and {} more", bad.size() - shown.size()) : "",
                         trainData_->describe());
    }
  }
  return std::nullopt;
}

} // namespace forge::rt
