// forge-train's training mode: the CLI around forge::rt::Trainer (data,
// steps/epochs, evaluation, progress line, metrics JSONL, checkpoints and
// --resume, --export-onnx, --dump-params, --dump-grads).
//
// Invariants:
//  * Every failure is a Status printed once as "forge-train: error: ...";
//    the exit code is 1 (130 after Ctrl-C/SIGTERM, which first finishes the
//    running step and writes a checkpoint when --ckpt-dir is given).
//  * Nothing here changes the numerics: the Trainer alone decides what each
//    step computes, so progress, metrics and checkpoint cadence never change
//    the losses, and a resumed run is bit-identical to an uninterrupted one.
//  * Metrics lines are flushed as they are written; numbers are printed with
//    enough digits to round-trip (floats as %.9g), non-finite values as null.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "Options.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/Collectives.h"
#include "forge/runtime/FileUtil.h"
#include "forge/runtime/Npy.h"
#include "forge/runtime/Shards.h"
#include "forge/runtime/Trainer.h"
#ifdef FORGE_HAVE_ONNX_EXPORT
#include "forge/runtime/OnnxExport.h"
#endif

namespace forge::train {

using namespace forge::rt;

namespace {

std::atomic<bool> gInterrupted{false};
extern "C" void onInterrupt(int) { gInterrupted = true; }

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string jsonNumber(double v) {
  return std::isfinite(v) ? fmt::format("{:.9g}", v) : std::string("null");
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0)
    return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600)
    return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60)
    return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string rate(double v) {
  if (!std::isfinite(v))
    return "?";
  if (v >= 1e6)
    return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4)
    return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

/// The progress line on stderr: rewritten in place on a terminal, one line
/// per --log-every steps otherwise.
class Progress {
public:
  explicit Progress(int64_t logEvery) : tty_(::isatty(STDERR_FILENO) == 1), logEvery_(logEvery) {}
  bool due(int64_t step, bool last) const {
    if (last || step == 1)
      return true;
    if (tty_)
      return secondsSince(lastDraw_) >= 0.1;
    return step % logEvery_ == 0;
  }
  /// Ranks other than 0 of a data-parallel group draw nothing and print only errors.
  void setQuiet(bool quiet) { quiet_ = quiet; }
  void draw(const std::string &line) {
    if (quiet_)
      return;
    if (tty_) {
      std::string padded = line;
      if (padded.size() < width_)
        padded.append(width_ - padded.size(), ' ');
      width_ = line.size();
      fmt::print(stderr, "\r{}", padded);
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
    open_ = tty_;
    lastDraw_ = Clock::now();
  }
  /// A line of its own (eval results, checkpoints, warnings).
  void message(const std::string &text) {
    if (quiet_ && text.find("error") == std::string::npos)
      return;
    if (open_) {
      fmt::print(stderr, "\n");
      open_ = false;
      width_ = 0;
    }
    fmt::print(stderr, "{}\n", text);
    std::fflush(stderr);
  }
  void finish() {
    if (open_)
      fmt::print(stderr, "\n");
    open_ = false;
  }

private:
  bool tty_;
  bool quiet_ = false;
  int64_t logEvery_;
  bool open_ = false;
  size_t width_ = 0;
  Clock::time_point lastDraw_ = Clock::now();
};

/// The --metrics file. On resume the lines of steps after the restored one
/// (written by the interrupted run after its last checkpoint) are dropped.
class Metrics {
public:
  Status open(const std::string &path, std::optional<int64_t> keepUpToStep) {
    path_ = path;
    std::string kept;
    if (keepUpToStep) {
      std::ifstream in(path);
      std::string line;
      while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("step") &&
            j["step"].is_number_integer() && j["step"].get<int64_t>() <= *keepUpToStep)
          kept += line + "\n";
      }
    }
    file_ = std::fopen(path.c_str(), "w");
    if (!file_)
      return Status::error("{}: cannot write the metrics file: {}", path, std::strerror(errno));
    std::fputs(kept.c_str(), file_);
    std::fflush(file_);
    return Status::ok();
  }
  Status write(const std::string &line) {
    if (!file_)
      return Status::ok();
    if (std::fprintf(file_, "%s\n", line.c_str()) < 0 || std::fflush(file_) != 0)
      return Status::error("{}: write failed: {}", path_, std::strerror(errno));
    return Status::ok();
  }
  ~Metrics() {
    if (file_)
      std::fclose(file_);
  }

private:
  std::string path_;
  FILE *file_ = nullptr;
};

/// The GPU's sensor readings of a run (Executor::telemetry), for its closing line.
class SensorLog {
public:
  void add(const Executor::Telemetry &t) {
    if (t.powerWatts)
      power_.push_back(*t.powerWatts);
    if (t.smClockMHz)
      clock_.push_back(*t.smClockMHz);
    if (t.temperatureC)
      temperature_.push_back(*t.temperatureC);
    if (t.busyPercent)
      busy_.push_back(*t.busyPercent);
  }
  /// "GPU sensors (NVML, N readings): busy X% | power X W (max Y) | SM clock X MHz (min Y) |
  /// temperature max X C", or nothing without readings.
  std::optional<std::string> summary() const {
    std::vector<std::string> parts;
    auto mean = [](const std::vector<double> &v) {
      double sum = 0;
      for (double x : v)
        sum += x;
      return sum / static_cast<double>(v.size());
    };
    if (!busy_.empty())
      parts.push_back(fmt::format("busy {:.0f}%", mean(busy_)));
    if (!power_.empty())
      parts.push_back(fmt::format("power {:.0f} W (max {:.0f})", mean(power_),
                                  *std::max_element(power_.begin(), power_.end())));
    if (!clock_.empty())
      parts.push_back(fmt::format("SM clock {:.0f} MHz (min {:.0f})", mean(clock_),
                                  *std::min_element(clock_.begin(), clock_.end())));
    if (!temperature_.empty())
      parts.push_back(fmt::format("temperature max {:.0f} C",
                                  *std::max_element(temperature_.begin(), temperature_.end())));
    if (parts.empty())
      return std::nullopt;
    size_t n = std::max({busy_.size(), power_.size(), clock_.size(), temperature_.size()});
    return fmt::format("GPU sensors (NVML, {} reading{} after the warm-up): {}", n,
                       n == 1 ? "" : "s", fmt::join(parts, " | "));
  }

private:
  std::vector<double> power_, clock_, temperature_, busy_;
};

/// One --metrics JSONL line: the step's numbers, its throughput over `dt`
/// seconds, the run's `elapsed` seconds, and the evaluation after it.
std::string metricsLine(const Trainer &tr, const StepResult &r, double dt, bool tokens,
                        double elapsed, const std::optional<EvalResult> &ev,
                        const Executor::Telemetry &gpu) {
  std::string line = fmt::format(R"({{"step": {}, "epoch": {}, "loss": {}, "lr": {}, )"
                                 R"("grad_norm": {}, "samples_per_s": {})",
                                 r.step, jsonNumber(tr.epochsDone()), jsonNumber(r.loss),
                                 r.lr ? jsonNumber(*r.lr) : "null",
                                 r.gradNorm ? jsonNumber(*r.gradNorm) : "null",
                                 jsonNumber(static_cast<double>(r.samples) / dt));
  if (r.length > 0) // documents in length buckets: labelled tokens (no padding)
    line += fmt::format(R"(, "tokens_per_s": {}, "length": {}, "padding": {})",
                        jsonNumber(static_cast<double>(r.realTokens) / dt), r.length,
                        jsonNumber(1.0 - static_cast<double>(r.realTokens) /
                                             static_cast<double>(r.samples * r.length)));
  else if (tokens)
    line += fmt::format(R"(, "tokens_per_s": {})",
                        jsonNumber(static_cast<double>(tr.globalTokensAt(r.step) /
                                                       tr.dataParallelSize()) / dt));
  if (r.lossScale)
    line += fmt::format(R"(, "loss_scale": {}, "skipped": {})", jsonNumber(*r.lossScale),
                        r.skipped ? 1 : 0);
  line += fmt::format(R"(, "input_s": {})", jsonNumber(r.inputSeconds));
  if (r.idleSeconds)
    line += fmt::format(R"(, "gpu_idle_s": {})", jsonNumber(*r.idleSeconds));
  line += fmt::format(R"(, "time_s": {})", jsonNumber(elapsed));
  // The GPU's sensors where this line sampled them (at each progress line).
  if (gpu.powerWatts)
    line += fmt::format(R"(, "gpu_power_w": {})", jsonNumber(*gpu.powerWatts));
  if (gpu.smClockMHz)
    line += fmt::format(R"(, "gpu_sm_clock_mhz": {})", *gpu.smClockMHz);
  if (gpu.temperatureC)
    line += fmt::format(R"(, "gpu_temp_c": {})", *gpu.temperatureC);
  if (gpu.busyPercent)
    line += fmt::format(R"(, "gpu_busy_pct": {})", *gpu.busyPercent);
  if (ev) {
    line += fmt::format(R"(, "eval_loss": {})", jsonNumber(ev->loss));
    if (ev->accuracy)
      line += fmt::format(R"(, "eval_accuracy": {})", jsonNumber(*ev->accuracy));
  }
  return line + "}";
}

/// --dump-params: whole tensors (`whole`: the split ones, gathered); not an
/// accumulation loop's accumulators (scratch between steps, as in checkpoints).
Status dumpParams(const std::string &path, const Executor &ex, const WholeTensors &whole) {
  std::map<std::string, TensorView> arrays;
  for (int32_t t : ex.persistentTensors())
    if ((!ex.tensorInfo(t).has_shard() || whole.count(t)) &&
        !isGradAccumulator(ex.tensorInfo(t)))
      arrays[ex.tensorInfo(t).name()] = wholeView(ex, t, &whole);
  return writeNpz(path, arrays);
}

/// --dump-grads: the gradient outputs of the step that just ran, keyed by
/// parameter name (arena tensors: call before anything else runs).
Status dumpGrads(const std::string &path, const Trainer &tr) {
  std::map<std::string, TensorView> arrays;
  for (const auto &[name, t] : tr.gradientOutputs())
    arrays[name] = tr.executor().view(t);
  return writeNpz(path, arrays);
}

/// --export-onnx; with `checkOnly`, before training: the source model must
/// exist and match the bundle (found after hours of training, it was too late).
Status exportModel(const Options &opts, const Bundle &bundle, const Executor &ex,
                   Progress &progress, bool checkOnly = false,
                   const WholeTensors *whole = nullptr) {
#ifdef FORGE_HAVE_ONNX_EXPORT
  std::string source = opts.onnxModel.empty() ? buildOption(bundle.program(), "source_onnx")
                                              : opts.onnxModel;
  if (source.empty())
    return Status::error("--export-onnx: {} does not record its source model (build option "
                         "source_onnx); give --onnx-model PATH",
                         bundle.origin());
  auto report = exportOnnx(source, checkOnly ? "" : opts.exportOnnx, ex, whole);
  if (!report)
    return report.status().prefix("--export-onnx");
  if (checkOnly)
    return Status::ok();
  if (!report->missingParameters.empty())
    progress.message(fmt::format("forge-train: warning: no initializer in {} for parameter{} {}",
                                 source, report->missingParameters.size() > 1 ? "s" : "",
                                 fmt::join(report->missingParameters, ", ")));
  progress.message(fmt::format("exported {} initializer{} into {} (from {})",
                               report->replaced.size(), report->replaced.size() == 1 ? "" : "s",
                               opts.exportOnnx, source));
  return Status::ok();
#else
  (void)bundle;
  (void)ex;
  (void)progress;
  (void)checkOnly;
  return Status::error("--export-onnx {}: this forge-train was built without ONNX support "
                       "(libonnx-dev)",
                       opts.exportOnnx);
#endif
}

std::string evalText(const EvalResult &e) {
  std::string s = fmt::format("eval loss {:.6g}", e.loss);
  if (e.accuracy)
    s += fmt::format(", accuracy {:.2f}%", 100.0 * *e.accuracy);
  return s + fmt::format(" ({} samples)", e.samples);
}

/// Chrome-trace / Perfetto JSON ("X" slices, one track per stream) of the
/// profiled steps, laid end to end.
class TraceWriter {
public:
  explicit TraceWriter(const Executor &ex) : ex_(ex) {}

  void addStep(int routine, int64_t step, const std::vector<Executor::Span> &spans) {
    const bundle::Routine &r = ex_.bundle().program().routines(routine);
    double end = 0;
    for (const Executor::Span &s : spans) {
      nlohmann::json e = {{"ph", "X"}, {"pid", 0}, {"tid", s.stream},
                          {"ts", offset_ + s.startUs}, {"dur", s.durationUs}};
      nlohmann::json args = {{"step", step}};
      if (s.instruction >= 0) {
        const bundle::Instruction &inst =
            (s.routine >= 0 ? ex_.bundle().program().routines(s.routine) : r)
                .instructions(s.instruction);
        std::string kernel =
            inst.placement() == bundle::KERNEL ? inst.launch().kernel()
            : inst.placement() == bundle::LIBRARY
                ? (inst.op().rfind("conv", 0) == 0 || inst.op().rfind("attention", 0) == 0 ? "cuDNN"
                   : inst.op() == "linear_cross_entropy_with_grad" ? "CUTLASS"
                                                                   : "cuBLASLt")
            : inst.placement() == bundle::HOST        ? "host (CPU kernel)"
            : inst.placement() == bundle::DEVICE_COPY ? "memcpy"
                                                      : "cpu";
        e["name"] = inst.op();
        e["cat"] = kernel;
        args["instruction"] = s.instruction;
        args["node"] = inst.name();
        args["op"] = inst.op();
        args["kernel"] = kernel;
        args["bytes"] = inst.bytes();
        args["flops"] = inst.flops();
        if (s.durationUs > 0) {
          args["GB/s"] = static_cast<double>(inst.bytes()) / (s.durationUs * 1e3);
          args["TFLOP/s"] = static_cast<double>(inst.flops()) / (s.durationUs * 1e6);
        }
      } else {
        e["name"] = s.what;
        e["cat"] = "transfer";
      }
      e["args"] = args;
      events_.push_back(std::move(e));
      end = std::max(end, s.startUs + s.durationUs);
    }
    offset_ += end + 10; // a visible gap between steps
  }

  Status write(const std::string &path) const {
    nlohmann::json trace;
    nlohmann::json events = events_;
    const char *names[] = {"compute stream", "copy stream", "host"};
    for (int tid = 0; tid < 3; ++tid)
      events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", tid}, {"name", "thread_name"},
                        {"args", {{"name", names[tid]}}}});
    events.push_back({{"ph", "M"}, {"pid", 0}, {"name", "process_name"},
                      {"args", {{"name", "forge-train " + ex_.describe()}}}});
    trace["traceEvents"] = events;
    trace["displayTimeUnit"] = "ms";
    std::string text = trace.dump();
    return writeFileAtomically(path, {reinterpret_cast<const uint8_t *>(text.data()),
                                      text.size()});
  }

  /// The instructions that took the most time over the profiled steps.
  std::string top(int n) const {
    std::map<std::string, std::pair<double, int>> byName;
    double total = 0;
    for (const nlohmann::json &e : events_) {
      if (e["cat"] == "transfer")
        continue;
      std::string key = e["name"].get<std::string>() + " [" + e["cat"].get<std::string>() + "]";
      byName[key].first += e["dur"].get<double>();
      byName[key].second += 1;
      total += e["dur"].get<double>();
    }
    std::vector<std::pair<double, std::string>> order;
    for (const auto &[k, v] : byName)
      order.push_back({v.first, k});
    std::sort(order.rbegin(), order.rend());
    std::string s;
    for (int i = 0; i < n && i < static_cast<int>(order.size()); ++i)
      s += fmt::format("\n  {:5.1f}%  {:10.1f} us  {} (x{})", 100.0 * order[i].first / total,
                       order[i].first, order[i].second, byName[order[i].second].second);
    return s;
  }

private:
  const Executor &ex_;
  std::vector<nlohmann::json> events_;
  double offset_ = 0;
};

std::string bytesText(double b) {
  if (b >= 1 << 30)
    return fmt::format("{:.2f} GiB", b / (1 << 30));
  return fmt::format("{:.0f} MiB", b / (1 << 20));
}

/// The training data (and --eval-data's): images keep the centre crop for
/// evaluation, the training data takes the random crops.
struct DataSources {
  std::unique_ptr<DataSource> train, eval;
};

Expected<DataSources> openData(const Options &opts, const Bundle &bundle) {
  DataSourceOptions dataOptions;
  // A bundle that crops images on the device (forgec --augment canvas=HxW).
  FORGE_RETURN_IF_ERROR(
      applyImageCropOption(buildOption(bundle.program(), "image_crop"), dataOptions.image)
          .prefix(opts.bundlePath));
  dataOptions.tokenDType = opts.tokenDType == "uint32" ? TokenDType::U32 : TokenDType::U16;
  dataOptions.docSeparator = opts.docSeparator;
  ImageSettings image{opts.imageResize, opts.imageMean,
                      opts.imageStd,    opts.randomResizedCrop,
                      opts.cropScale,   opts.badRecords == "skip",
                      opts.seed};
  if (opts.imageNormalize == "imagenet") {
    if (image.mean.empty())
      image.mean.assign(std::begin(kImageNetMean), std::end(kImageNetMean));
    if (image.std.empty())
      image.std.assign(std::begin(kImageNetStd), std::end(kImageNetStd));
  }
  DataSourceOptions trainOptions; // eval data (dataOptions) keeps the centre crop
  FORGE_RETURN_IF_ERROR(
      applyImageSettings(image, SettingSpelling::Flags, dataOptions, trainOptions));
  auto trainData = openDataSource(opts.data, trainOptions);
  if (!trainData)
    return trainData.status().prefix("--data");
  DataSources out;
  out.train = trainData.take();
  if (!opts.evalData.empty()) {
    auto e = openDataSource(opts.evalData, dataOptions);
    if (!e)
      return e.status().prefix("--eval-data");
    out.eval = e.take();
  }
  return out;
}

/// This process's place among the ranks: the world group, and the "tp", "pp"
/// and "dp" subgroups the collectives use (set while this lives: it outlives
/// the trainer).
struct RankGroups {
  std::unique_ptr<Communicator> world, tpGroup, dpGroup, ppGroup;
  int64_t pp = 1, tp = 1;
  RankGroups() = default;
  RankGroups(const RankGroups &) = delete;
  RankGroups &operator=(const RankGroups &) = delete;
  ~RankGroups() {
    setCollectiveGroup("dp", nullptr);
    setCollectiveGroup("tp", nullptr);
    setCollectiveGroup("pp", nullptr);
  }
};

Status joinRankGroups(const Options &opts, const Bundle &bundle, TrainerOptions &trainerOptions,
                      Progress &progress, RankGroups &groups) {
  // Data parallelism (forgec --dp): this process is one rank of a group when a launcher
  // (forge-train --nproc, torchrun, Slurm, mpirun) set WORLD_SIZE. The group outlives the
  // trainer (declared first); rank 0 alone writes metrics, checkpoints and files.
  auto rendezvous = rendezvousFromEnvironment();
  if (!rendezvous)
    return rendezvous.status();
  // Tensor and pipeline parallelism (forgec --tp T, --pp P): the world of
  // D x P x T ranks splits into groups "tp" (T consecutive ranks, which read one
  // batch), "pp" (a pipeline's stages) and "dp" (the ranks with the same place
  // in their pipeline). Subgroups go before the world does.
  std::unique_ptr<Communicator> &group = groups.world;
  int64_t &pp = groups.pp, &tp = groups.tp;
  if (std::string p = buildOption(bundle.program(), "pipeline_parallel"); !p.empty())
    pp = std::max<int64_t>(1, std::atoll(p.c_str())); // the trainer checks it
  if (std::string t = buildOption(bundle.program(), "tensor_parallel"); !t.empty())
    tp = std::max<int64_t>(1, std::atoll(t.c_str())); // the trainer checks it
  if (*rendezvous && (*rendezvous)->size > 1) {
    Rendezvous r = **rendezvous;
    r.timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.timeoutSeconds * 1000));
    // The layout first, before any rank connects: every rank then gives this
    // error (a rank that connected and left would make the others' connects
    // fail with a transport error instead).
    if (tp > 1 && r.size % tp != 0)
      return Status::error("{} was compiled for groups of {} tensor-parallel ranks (forgec --tp "
                           "{}), this run has {}: start D x {} ranks (--nproc)",
                           bundle.origin(), tp, tp, r.size, tp);
    if (pp > 1 && r.size % (pp * tp) != 0)
      return Status::error("{} was compiled for {} pipeline stages (forgec --pp {}{}), this run "
                           "has {} ranks: start D x {} ranks (--nproc)",
                           bundle.origin(), pp, pp, tp > 1 ? fmt::format(" --tp {}", tp) : "",
                           r.size, pp * tp);
    // The whole count too (the trainer checks it again): with a wrong --nproc
    // for a --dp bundle, a rank still connecting when the others had
    // connected, failed the check and left got "connection closed" instead.
    FORGE_RETURN_IF_ERROR(Trainer::checkRankCount(bundle, r.size));
    auto connected = connectCpuGroup(r);
    if (!connected)
      return connected.status();
    group = connected.take();
    trainerOptions.rank = r.rank;
    trainerOptions.worldSize = r.size;
    if (opts.device == "cuda") // one GPU per rank, by its local rank
      trainerOptions.device = fmt::format("cuda:{}", r.localRank);
    progress.setQuiet(r.rank != 0);
    // D x P x T ranks (RankLayout). A group of every rank is the world itself.
    const RankLayout place = RankLayout::of(r.rank, r.size, static_cast<int>(pp),
                                            static_cast<int>(tp));
    const int p = place.pp, t = place.tp, dp = place.dp;
    auto join = [&](const char *name, std::vector<int> ranks,
                    std::unique_ptr<Communicator> &slot) -> Status {
      if (static_cast<int>(ranks.size()) == r.size) {
        setCollectiveGroup(name, group.get());
        return Status::ok();
      }
      auto g = group->subgroup(name, ranks);
      if (!g)
        return g.status();
      slot = g.take();
      setCollectiveGroup(name, slot.get());
      return Status::ok();
    };
    std::vector<int> ppRanks, dpRanks, tpRanks;
    for (int i = 0; i < p; ++i)
      ppRanks.push_back(place.rankOf(place.d, i, place.t));
    for (int i = 0; i < dp; ++i)
      dpRanks.push_back(place.rankOf(i, place.stage, place.t));
    for (int i = 0; i < t; ++i)
      tpRanks.push_back(place.rankOf(place.d, place.stage, i));
    // Every rank makes the same subgroups in the same order (each is a rendezvous).
    if (p > 1)
      FORGE_RETURN_IF_ERROR(join("pp", ppRanks, groups.ppGroup));
    if (dp > 1)
      FORGE_RETURN_IF_ERROR(join("dp", dpRanks, groups.dpGroup));
    if (t > 1)
      FORGE_RETURN_IF_ERROR(join("tp", tpRanks, groups.tpGroup));
    if (p > 1)
      progress.message(fmt::format("pipeline parallel: {} ranks: {} data-parallel x {} stages{} "
                                   "({})",
                                   r.size, dp, p,
                                   t > 1 ? fmt::format(" x {} tensor-parallel", t) : "",
                                   group->describe()));
    else if (t > 1)
      progress.message(fmt::format("{} ranks: {} data-parallel x {} tensor-parallel ({})",
                                   r.size, dp, t, group->describe()));
    else
      progress.message(fmt::format("data parallel: {} ranks ({})", r.size, group->describe()));
  }
  return Status::ok();
}

/// The run's starting state: the checkpoint directory prepared (a directory
/// that cannot take checkpoints fails now, not hours into the run), --resume's
/// checkpoint restored, else a thin bundle's parameters read from --weights.
/// Returns the step resumed at, if any.
Expected<std::optional<int64_t>> startingState(const Options &opts, const Bundle &bundle,
                                               Trainer &tr, std::optional<CheckpointDir> &ckpt,
                                               bool lead, Progress &progress) {
  if (ckpt && lead) // checked by rank 0, once
    FORGE_RETURN_IF_ERROR(ckpt->prepare([&](const std::string &w) {
                            progress.message("forge-train: warning: " + w);
                          }).prefix("--ckpt-dir"));
  std::optional<int64_t> resumedAt;
  if (opts.resume) { // option parsing made --resume need --ckpt-dir
    auto state = ckpt->resume(tr.executor(), [&](const std::string &w) {
      progress.message("forge-train: warning: " + w);
    });
    if (!state)
      return state.status();
    if (*state) {
      const CheckpointState &s = **state;
      FORGE_RETURN_IF_ERROR(tr.restore(s).prefix("--resume"));
      if (opts.seedGiven && opts.seed != s.seed)
        progress.message(fmt::format("forge-train: warning: --seed {} ignored: the checkpoint "
                                     "continues with seed {}",
                                     opts.seed, s.seed));
      if (opts.noShuffle == s.shuffle)
        progress.message(fmt::format("forge-train: warning: the checkpoint was taken with "
                                     "shuffling {}; continuing that way",
                                     s.shuffle ? "on" : "off"));
      resumedAt = s.step;
      progress.message(fmt::format("resumed from {} at step {} (epoch {:.2f})", ckpt->path(),
                                   s.step, tr.epochsDone()));
    } else {
      progress.message(fmt::format("no checkpoint in {}; starting from step 0", opts.ckptDir));
    }
  }

  // Thin bundle: initial parameters from the external-data file (a checkpoint
  // restored above already holds them).
  if (std::vector<std::string> thin = externalParameters(bundle); !thin.empty() && !resumedAt) {
    if (opts.weightsDir.empty())
      return Status::error("{} is a thin bundle ({} parameters, e.g. '{}', live in the model's "
                           "external-data file): give --weights DIR, or --resume a checkpoint",
                           opts.bundlePath, thin.size(), thin.front());
    FORGE_RETURN_IF_ERROR(loadExternalWeights(tr.executor(), opts.weightsDir).prefix("--weights"));
    progress.message(fmt::format("read {} parameters from {}", thin.size(), opts.weightsDir));
  }
  return resumedAt;
}

/// The run's opening lines: the image decoder, a pipeline stage's share of the parameters,
/// data arrays the bundle does not read, then what is trained where.
void announceRun(const Options &opts, Trainer &tr, const TrainerOptions &trainerOptions, int64_t pp,
                 int64_t tp, int64_t total, Progress &progress) {
  if (!tr.imageDecoder().empty())
    progress.message(fmt::format("JPEGs decoded on the device ({}); others by the data workers",
                                 tr.imageDecoder()));
  else if (opts.decode == "auto" && !opts.data.empty())
    progress.message("--decode auto: the data workers decode every image");
  if (pp > 1) { // each stage holds its own parameters and optimizer state
    auto [held, all] = tr.executor().persistentBytes();
    progress.message(fmt::format("pipeline stage {} holds {} of the {} bytes of parameters and "
                                 "state ({:.0f}%)",
                                 RankLayout::of(trainerOptions.rank, trainerOptions.worldSize,
                                                static_cast<int>(pp), static_cast<int>(tp))
                                     .stage,
                                 held, all,
                                 all ? 100.0 * double(held) / double(all) : 0.0));
  }

  for (const std::string &a : tr.trainData().unusedArrays())
    progress.message(fmt::format("forge-train: warning: --data array {} is not an input of the "
                                 "bundle; ignored",
                                 a));
  if (tr.evalData())
    for (const std::string &a : tr.evalData()->unusedArrays())
      progress.message(fmt::format("forge-train: warning: --eval-data array {} is not an input "
                                   "of the bundle; ignored",
                                   a));

  std::string layout =
      !tr.batchSchedule().empty()
          ? fmt::format("batch schedule {} of micro-batches of {}",
                        buildOption(tr.executor().bundle().program(), "batch_schedule"),
                        tr.batchSize())
      : tr.microBatches() > 1 ? fmt::format("{} micro-batches x batch {}", tr.microBatches(),
                                            tr.batchSize())
                              : fmt::format("batch {}", tr.batchSize());
  progress.message(fmt::format(
      "forge-train: {}: {} training samples ({}), {} steps/epoch, {} steps{}; {}",
      opts.bundlePath, tr.trainSamples(), layout, tr.stepsPerEpoch(), total,
      tr.hasEval() ? fmt::format("; {} eval samples", tr.evalSamples()) : "",
      tr.executor().describe()));
}

Expected<int> train(const Options &opts, Progress &progress) {
  auto loaded = Bundle::open(opts.bundlePath);
  if (!loaded)
    return loaded.status();
  const Bundle &bundle = **loaded;

  auto data = openData(opts, bundle);
  if (!data)
    return data.status();
  std::unique_ptr<DataSource> trainData = std::move(data->train), evalData = std::move(data->eval);
  TrainerOptions trainerOptions;
  trainerOptions.threads = opts.threads;
  trainerOptions.workers = opts.workers;
  trainerOptions.prefetch = opts.prefetch;
  trainerOptions.imageDecode = opts.decode;
  trainerOptions.device = opts.device;
  trainerOptions.cudaGraphs = !opts.noCudaGraph;
  trainerOptions.deterministicAttention = opts.attentionBackward != "fast";
  trainerOptions.seed = opts.seed;
  trainerOptions.shuffle = !opts.noShuffle;
  RankGroups groups;
  FORGE_RETURN_IF_ERROR(joinRankGroups(opts, bundle, trainerOptions, progress, groups));
  const int64_t pp = groups.pp, tp = groups.tp;
  Communicator *group = groups.world.get(); // null in a single-process run
  const bool lead = trainerOptions.rank == 0;
  auto created = Trainer::create(bundle, std::move(trainData), std::move(evalData), trainerOptions);
  if (!created)
    return created.status();
  Trainer &tr = **created;
  const int64_t total = opts.steps > 0 ? opts.steps : tr.stepsForEpochs(opts.epochs);
  announceRun(opts, tr, trainerOptions, pp, tp, total, progress);

  if (!opts.exportOnnx.empty())
    FORGE_RETURN_IF_ERROR(exportModel(opts, bundle, tr.executor(), progress, /*checkOnly=*/true));

  // --ckpt-dir, --resume, then a thin bundle's weights.
  std::optional<CheckpointDir> ckpt;
  if (!opts.ckptDir.empty())
    ckpt.emplace(opts.ckptDir);
  auto resumed = startingState(opts, bundle, tr, ckpt, lead, progress);
  if (!resumed)
    return resumed.status();
  const std::optional<int64_t> resumedAt = *resumed;

  if (!opts.dumpGrads.empty() && tr.gradientOutputs().empty())
    return Status::error("--dump-grads: {} has no gradient outputs (train_step outputs "
                         "forge.grad.NAME); compile it with forgec --expose-gradients",
                         opts.bundlePath);

  Metrics metrics;
  if (!opts.metricsPath.empty())
    FORGE_RETURN_IF_ERROR(metrics.open(opts.metricsPath, resumedAt));

  std::signal(SIGINT, onInterrupt);
  std::signal(SIGTERM, onInterrupt);

  const auto start = Clock::now();
  double stepSeconds = 0, windowSeconds = 0;
  // The compute stream's idle time before steps (GPU), over the run and the
  // progress window: the input stall. From this run's 4th step: before it
  // the host also warms up and captures the CUDA graphs (one per parity).
  double idleSeconds = 0, windowIdle = 0, timedSeconds = 0, windowTimed = 0;
  int64_t ranSteps = 0, windowSteps = 0;
  int64_t skippedSteps = 0; // loss-scaled steps that skipped their update (this run)
  int64_t lastCkpt = -1;
  float lastLoss = std::nanf("");
  const bool tokens = tr.tokensPerStep() > 0;
  // Throughput over every data-parallel rank, summed per step (a batch-size
  // schedule's steps differ), over the run and the progress window.
  // Documents in length buckets count their labelled tokens (padding is not throughput).
  auto unitsOf = [&](const StepResult &r) {
    if (r.length > 0)
      return static_cast<double>(r.realTokens);
    return static_cast<double>(tokens ? tr.globalTokensAt(r.step) : tr.globalSamplesAt(r.step));
  };
  double runUnits = 0, windowUnits = 0, runFlops = 0, windowFlops = 0;
  const char *unit = tokens ? "tok/s" : "samples/s";

  // --profile: steps 3.. of this run (the first two warm up and capture the graph).
  std::optional<TraceWriter> trace;
  if (!opts.profilePath.empty())
    trace.emplace(tr.executor());
  int64_t profiled = 0;
  const int64_t profileFrom = std::min<int64_t>(3, total - tr.stepsDone());
  const Executor::DeviceInfo device = tr.executor().deviceInfo();
  SensorLog sensors;

  // Several ranks write a sharded checkpoint (each its own pieces) unless
  // --ckpt-format whole asks for one file that rank 0 writes.
  const bool sharded = group && opts.ckptFormat != "whole";
  auto saveCheckpoint = [&]() -> Status {
    if (sharded) { // every rank writes its file; a collective
      auto path = ckpt->saveSharded(tr.executor(), tr.state(), *group);
      if (!path)
        return path.status().prefix("checkpoint");
      lastCkpt = tr.stepsDone();
      progress.message(fmt::format("checkpoint {} (step {}, {} ranks' files)", *path,
                                   tr.stepsDone(), group->size()));
      return Status::ok();
    }
    // Split tensors (--tp) whole, from every rank: checkpoints hold whole tensors.
    auto whole = gatherShards(tr.executor());
    if (!whole)
      return whole.status().prefix("checkpoint");
    if (!lead) { // rank 0 writes the group's checkpoint (every rank holds the same state)
      lastCkpt = tr.stepsDone();
      return Status::ok();
    }
    auto path = ckpt->save(tr.executor(), tr.state(), &*whole);
    if (!path)
      return path.status();
    lastCkpt = tr.stepsDone();
    progress.message(fmt::format("checkpoint {} (step {})", *path, tr.stepsDone()));
    return Status::ok();
  };

  // On a GPU, step s+1 is launched before step s's loss is read back (the
  // read-back never holds up the next launch), except after steps whose
  // results something must see with the device idle: evaluation, checkpoints,
  // --dump-grads, the last step, and the step before a profiled one.
  const bool pipeline = tr.canPipeline() && !opts.noPipeline;
  if (pipeline)
    progress.message("steps pipelined: each is launched before the last one's loss is read "
                     "back (--no-pipeline: one at a time)");
  auto quietAfter = [&](int64_t s, int64_t ranBefore) {
    bool nextProfiled = trace && ranBefore + 2 >= profileFrom && profiled < opts.profileSteps;
    return s >= total || nextProfiled || (ranBefore == 0 && !opts.dumpGrads.empty()) ||
           (tr.hasEval() && opts.evalEvery > 0 && s % opts.evalEvery == 0) ||
           (ckpt && opts.ckptEvery > 0 && s % opts.ckptEvery == 0);
  };

  // Ctrl-C or SIGTERM with several ranks: a rank that got the signal may be a step
  // ahead of another, and one stopping alone would leave the rest waiting in a
  // collective until --timeout. So before each step the ranks agree (the sum of
  // their flags over the world group, one small all-reduce), and all stop after
  // the same step and write one checkpoint together.
  bool stop = false;
  auto agreeStop = [&]() -> Status {
    if (!group) {
      stop = gInterrupted;
      return Status::ok();
    }
    float flag = gInterrupted ? 1.0f : 0.0f;
    FORGE_RETURN_IF_ERROR(group->allReduceSum(&flag, 1).prefix("agreeing on an interrupt"));
    stop = flag > 0;
    return Status::ok();
  };
  for (;;) {
    FORGE_RETURN_IF_ERROR(agreeStop());
    if (!((tr.stepsDone() < total && !stop) || tr.inFlight() > 0))
      break;
    auto t0 = Clock::now();
    std::vector<Executor::Span> spans;
    const bool profileThis = trace && tr.inFlight() == 0 && ranSteps + 1 >= profileFrom &&
                             profiled < opts.profileSteps;
    auto r = [&]() -> Expected<StepResult> {
      if (profileThis || !pipeline)
        return tr.step(profileThis ? &spans : nullptr);
      const int64_t next = tr.stepsDone() + 1;
      if (tr.inFlight() == 0)
        FORGE_RETURN_IF_ERROR(tr.launch());
      if (tr.inFlight() == 1 && !stop && !quietAfter(next, ranSteps))
        FORGE_RETURN_IF_ERROR(tr.launch()); // step next+1 overlaps next's read-back
      return tr.collect();
    }();
    if (!r)
      return r.status().prefix(fmt::format("step {}", tr.stepsDone() + 1));
    double dt = secondsSince(t0);
    stepSeconds += dt;
    windowSeconds += dt;
    ++ranSteps;
    ++windowSteps;
    runUnits += unitsOf(*r);
    windowUnits += unitsOf(*r);
    runFlops += r->flops;
    windowFlops += r->flops;
    lastLoss = r->loss;
    if (r->idleSeconds && ranSteps > 3) {
      // A gap can reach back before this step's wall time (the first counted step's
      // covers a graph capture): at most the step's own time counts as its stall. A
      // tiny MLP printed "stall 13474%" on an H200 without this.
      const double idle = std::min(*r->idleSeconds, dt);
      idleSeconds += idle;
      windowIdle += idle;
      timedSeconds += dt;
      windowTimed += dt;
    }
    const int64_t s = r->step;
    if (profileThis) {
      trace->addStep(tr.trainRoutine(), s, spans);
      ++profiled;
    }
    const bool last = s == total;

    // The gradient outputs live in the arena: write them before eval runs.
    if (ranSteps == 1 && !opts.dumpGrads.empty()) {
      FORGE_RETURN_IF_ERROR(dumpGrads(opts.dumpGrads, tr).prefix("--dump-grads"));
      progress.message(fmt::format("wrote the gradients of step {} ({} tensors) to {}", s,
                                   tr.gradientOutputs().size(), opts.dumpGrads));
    }

    std::optional<EvalResult> ev;
    if (tr.hasEval() && ((opts.evalEvery > 0 && s % opts.evalEvery == 0) || last)) {
      auto e = tr.evaluate();
      if (!e)
        return e.status().prefix(fmt::format("eval after step {}", s));
      ev = *e;
    }

    skippedSteps += r->skipped ? 1 : 0;
    const bool report = progress.due(s, last) || ev;
    // After the warm-up, each progress line samples the GPU's sensors (NVML).
    Executor::Telemetry gpu;
    if (report && ranSteps > 3) {
      gpu = tr.executor().telemetry();
      sensors.add(gpu);
    }
    FORGE_RETURN_IF_ERROR(
        metrics.write(metricsLine(tr, *r, dt, tokens, secondsSince(start), ev, gpu)));

    if (!std::isfinite(r->loss)) {
      // Bad data first: then the learning rate is not to blame.
      if (std::optional<std::string> bad = tr.nonFiniteInputs(s))
        return Status::error("the loss is {} at step {}: {}; fix or drop those samples",
                             r->loss, s, *bad);
      return Status::error("the loss is {} at step {}; stopping (the batch's inputs are finite: "
                           "try a lower learning rate or forgec --clip-grad-norm)",
                           r->loss, s);
    }

    if (report) {
      double perStep = stepSeconds / static_cast<double>(ranSteps);
      std::string text = fmt::format("step {}/{} | epoch {:.2f} | loss {:.4f}", s, total,
                                     tr.epochsDone(), r->loss);
      if (r->lr)
        text += fmt::format(" | lr {:.3g}", *r->lr);
      if (r->lossScale)
        text += fmt::format(" | scale {:g} ({} skipped)", *r->lossScale, skippedSteps);
      text += fmt::format(" | {} {}", rate(windowUnits / windowSeconds), unit);
      if (tr.flopsPerStep() > 0) {
        double flops = windowFlops / windowSeconds;
        text += fmt::format(" | {:.2f} TFLOP/s", flops / 1e12);
        if (device.peakFlops > 0)
          text += fmt::format(" (MFU {:.1f}%)", 100.0 * flops / device.peakFlops);
      }
      if (device.memoryTotal > 0)
        text += fmt::format(" | mem {} (plan {})",
                            bytesText(static_cast<double>(tr.executor().deviceInfo().memoryUsed)),
                            bytesText(static_cast<double>(device.planBytes)));
      if (windowTimed > 0)
        text += fmt::format(" | stall {:.1f}%", 100.0 * windowIdle / windowTimed);
      // The NVML readings that say whether the GPU works flat out: power, SM clock
      // (throttling), the driver's busy share.
      if (gpu.powerWatts)
        text += fmt::format(" | {:.0f} W", *gpu.powerWatts);
      if (gpu.smClockMHz)
        text += fmt::format(" {} MHz", *gpu.smClockMHz);
      if (gpu.busyPercent)
        text += fmt::format(" busy {}%", *gpu.busyPercent);
      text += fmt::format(" | ETA {}", duration(perStep * static_cast<double>(total - s)));
      progress.draw(text);
      windowSeconds = 0;
      windowSteps = 0;
      windowUnits = windowFlops = 0;
      windowIdle = 0;
      windowTimed = 0;
    }
    if (ev)
      progress.message(fmt::format("step {}: {}", s, evalText(*ev)));
    if (ckpt && ((opts.ckptEvery > 0 && s % opts.ckptEvery == 0) || last))
      FORGE_RETURN_IF_ERROR(saveCheckpoint());
  }
  progress.finish();
  if (trace) {
    FORGE_RETURN_IF_ERROR(trace->write(opts.profilePath).prefix("--profile"));
    progress.message(fmt::format("wrote {} profiled step{} to {}; top instructions:{}", profiled,
                                 profiled == 1 ? "" : "s", opts.profilePath, trace->top(8)));
  }

  if (stop) {
    progress.message(fmt::format("interrupted after step {}", tr.stepsDone()));
    if (ckpt && lastCkpt != tr.stepsDone() && ranSteps > 0)
      FORGE_RETURN_IF_ERROR(saveCheckpoint());
    return 130;
  }
  if (ranSteps == 0) {
    progress.message(fmt::format("already at step {} of {}; nothing to train", tr.stepsDone(),
                                 total));
    if (!opts.dumpGrads.empty())
      return Status::error("--dump-grads {}: no step ran, so there are no gradients to write",
                           opts.dumpGrads);
    if (tr.hasEval()) {
      auto e = tr.evaluate();
      if (!e)
        return e.status().prefix("eval");
      progress.message(fmt::format("step {}: {}", tr.stepsDone(), evalText(*e)));
    }
  } else {
    double wall = secondsSince(start);
    progress.message(fmt::format("trained {} step{} in {} ({} {}); final loss {:.6g}", ranSteps,
                                 ranSteps == 1 ? "" : "s", duration(wall),
                                 rate(runUnits / stepSeconds),
                                 unit, lastLoss));
    if (tr.flopsPerStep() > 0 && stepSeconds > 0) {
      const double flops = runFlops / stepSeconds;
      std::string text = fmt::format("utilization: {:.2f} TFLOP/s", flops / 1e12);
      if (device.peakFlops > 0)
        text += fmt::format(" (MFU {:.1f}% of {:.0f} TFLOP/s)", 100.0 * flops / device.peakFlops,
                            device.peakFlops / 1e12);
      if (device.planBytes > 0)
        text += fmt::format(", device memory {} (one allocation)",
                            bytesText(static_cast<double>(device.planBytes)));
      progress.message(text);
    }
    if (timedSeconds > 0)
      progress.message(fmt::format("input stall: the GPU waited {:.1f} ms over {:.3f} s of steps "
                                   "after the warm-up ({:.1f}%) for its batches or their launch",
                                   1e3 * idleSeconds, timedSeconds,
                                   100.0 * idleSeconds / timedSeconds));
    if (std::optional<std::string> text = sensors.summary())
      progress.message(*text);
  }
  WholeTensors gathered;
  if (!opts.dumpParams.empty() || !opts.exportOnnx.empty() || opts.gatherForRankZero) {
    auto whole = gatherShards(tr.executor()); // every rank: a collective with --tp
    if (!whole)
      return whole.status().prefix("--dump-params");
    gathered = whole.take();
  }
  if (!opts.dumpParams.empty()) {
    FORGE_RETURN_IF_ERROR(dumpParams(opts.dumpParams, tr.executor(), gathered));
    progress.message(fmt::format("wrote {} tensors to {}", tr.executor().persistentTensors().size(),
                                 opts.dumpParams));
  }
  if (!opts.exportOnnx.empty())
    FORGE_RETURN_IF_ERROR(exportModel(opts, bundle, tr.executor(), progress, false, &gathered));
  return 0;
}

} // namespace

int runTrainMode(const Options &given) {
  Options opts = given;
  // A data-parallel rank other than 0 writes no files: rank 0 writes the group's.
  if (auto r = rendezvousFromEnvironment(); r && *r && (*r)->rank != 0) {
    opts.metricsPath.clear();
    opts.gatherForRankZero = !opts.dumpParams.empty() || !opts.exportOnnx.empty();
    opts.dumpParams.clear();
    opts.dumpGrads.clear();
    opts.exportOnnx.clear();
    opts.profilePath.clear();
  }
  Progress progress(opts.logEvery);
  auto rc = train(opts, progress);
  if (!rc) {
    auto r = rendezvousFromEnvironment();
    const std::string who = r && *r && (*r)->size > 1 ? fmt::format("rank {}: ", (*r)->rank) : "";
    progress.message(fmt::format("forge-train: {}error: {}", who, rc.status().message()));
    return 1;
  }
  return *rc;
}

} // namespace forge::train
