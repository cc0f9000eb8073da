// forge-train: runs and trains a `.forge` bundle on the CPU. Modes:
//   forge-train BUNDLE --info
//   forge-train BUNDLE --forward --inputs in.npz [--input NAME=x.npy ...]
//               [--outputs out.npz] [--threads N]
//   forge-train BUNDLE --data train.npz (--steps N | --epochs E) [...]   (TrainMode.cpp)
// `forge-train --help` documents every option; a --recipe TOML file can give
// any long option (key = option name without "--"); flags on the command line
// win over the recipe.
//
// Structure: main() only parses flags into Options (Options.h) and dispatches
// to one function per mode, each returning a Status.
// Invariant: every failure is a message on stderr and exit code 1; no
// exception or abort reaches the user (../shared/DESIGN.md §10).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "Launch.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "Options.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Executor.h"
#include "forge/runtime/Npy.h"

using namespace forge::rt;
using forge::train::Options;
namespace bundle = forge::bundle;

namespace {

const char *kindName(bundle::TensorInfo::Kind k) {
  switch (k) {
  case bundle::TensorInfo::INTERMEDIATE:
    return "intermediate";
  case bundle::TensorInfo::INPUT:
    return "input";
  case bundle::TensorInfo::OUTPUT:
    return "output";
  case bundle::TensorInfo::CONSTANT:
    return "constant";
  case bundle::TensorInfo::PARAMETER:
    return "parameter";
  case bundle::TensorInfo::STATE:
    return "state";
  default:
    return "?";
  }
}

std::string count(int64_t n, const char *noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

std::string describeTensor(const bundle::TensorInfo &t) {
  return fmt::format("{} {}{}", t.name().empty() ? "<unnamed>" : t.name(), dtypeName(t.dtype()),
                     shapeString(shapeOf(t)));
}

// --- --info ------------------------------------------------------------------------

Status runInfo(const Options &opts) {
  auto loaded = Bundle::open(opts.bundlePath);
  if (!loaded)
    return loaded.status();
  const bundle::Program &p = (*loaded)->program();
  std::map<bundle::TensorInfo::Kind, std::pair<int, uint64_t>> byKind;
  for (const bundle::TensorInfo &t : p.tensors()) {
    auto &[count, bytes] = byKind[t.kind()];
    ++count;
    bytes += static_cast<uint64_t>(numElements(shapeOf(t))) * dtypeSize(t.dtype());
  }
  fmt::print("bundle:       {}\n", opts.bundlePath);
  fmt::print("target:       {}\n", p.target().empty() ? "<unset>" : p.target());
  if (!p.producer().empty())
    fmt::print("producer:     {}\n", p.producer());
  if (!p.source_hash().empty())
    fmt::print("source hash:  {}\n", p.source_hash());
  fmt::print("training:     {}\n", p.training() ? "yes" : "no");
  std::string kinds;
  for (const auto &[kind, cb] : byKind)
    kinds += fmt::format("{}{} {} ({} bytes)", kinds.empty() ? "" : ", ", cb.first, kindName(kind),
                         cb.second);
  fmt::print("tensors:      {}{}\n", p.tensors_size(), kinds.empty() ? "" : ": " + kinds);
  int numInstructions = 0;
  for (const bundle::Routine &r : p.routines())
    numInstructions += r.instructions_size();
  fmt::print("instructions: {}\n", numInstructions);
  fmt::print("arena size:   {} bytes\n", p.arena_size());
  // What forgec --batch auto fits into --device-memory (CUDA: one allocation).
  fmt::print("device plan:  {} bytes (arena, parameters, state and constants, aligned) + {} "
             "bytes of GEMM workspace ({} per compute stream)\n",
             plannedTensorBytes(p), plannedWorkspaceBytes(p) * computeStreamCount(p),
             plannedWorkspaceBytes(p));
  fmt::print("sections:     {}\n", p.sections_size());
  for (int i = 0; i < p.sections_size(); ++i)
    fmt::print("  [{}] {:<24} offset {:>12}  size {:>12}  crc32 {:#010x}\n", i,
               p.sections(i).name(), p.sections(i).offset(), p.sections(i).size(),
               p.sections(i).crc32());
  fmt::print("routines:     {}\n", p.routines_size());
  for (const bundle::Routine &r : p.routines()) {
    fmt::print("  {}: {}, {}, {}\n", r.name(), count(r.instructions_size(), "instruction"),
               count(r.inputs_size(), "input"), count(r.outputs_size(), "output"));
    if (r.streams_size() > 1) { // forge-schedule's streams beside the compute stream
      std::vector<int> per(r.streams_size(), 0);
      for (const bundle::Instruction &inst : r.instructions())
        if (inst.stream() < per.size())
          ++per[inst.stream()];
      std::vector<std::string> parts;
      for (int s = 0; s < r.streams_size(); ++s)
        parts.push_back(fmt::format("{} {}", r.streams(s), per[s]));
      fmt::print("    streams {}; {}, {} at the end\n", fmt::join(parts, ", "),
                 count(r.events(), "event"), r.joins_size());
    }
    for (int32_t t : r.inputs())
      fmt::print("    in  {}\n", describeTensor(p.tensors(t)));
    for (int32_t t : r.outputs())
      fmt::print("    out {}\n", describeTensor(p.tensors(t)));
  }
  for (const auto &[key, value] :
       std::map<std::string, std::string>(p.build_options().begin(), p.build_options().end()))
    fmt::print("option:       {} = {}\n", key, value);
  return Status::ok();
}

// --- --forward ---------------------------------------------------------------------

Expected<std::map<std::string, HostTensor>> loadInputs(const Options &opts) {
  std::map<std::string, HostTensor> arrays;
  if (!opts.inputsNpz.empty()) {
    auto npz = readNpz(opts.inputsNpz);
    if (!npz)
      return npz.status();
    arrays = npz.take();
  }
  for (const std::string &spec : opts.inputFiles) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return Status::error("--input '{}': expected NAME=file.npy", spec);
    auto t = readNpy(spec.substr(eq + 1));
    if (!t)
      return t.status();
    arrays[spec.substr(0, eq)] = t.take();
  }
  return arrays;
}

/// Output names for the .npz: the tensor names, made unique and non-empty.
std::vector<std::string> outputNames(const Executor &ex, int routine) {
  std::vector<std::string> names;
  std::set<std::string> used;
  for (size_t i = 0; i < ex.outputs(routine).size(); ++i) {
    std::string base = ex.tensorInfo(ex.outputs(routine)[i]).name();
    if (base.empty())
      base = fmt::format("output_{}", i);
    std::string name = base;
    for (int k = 1; used.count(name); ++k)
      name = fmt::format("{}_{}", base, k);
    used.insert(name);
    names.push_back(name);
  }
  return names;
}

Status runForward(const Options &opts) {
  auto loaded = Bundle::open(opts.bundlePath);
  if (!loaded)
    return loaded.status();
  auto ex = createExecutor(**loaded, ExecutorOptions{opts.device, opts.threads, !opts.noCudaGraph});
  if (!ex)
    return ex.status();
  if (!externalParameters(**loaded).empty()) {
    if (opts.weightsDir.empty())
      return Status::error("{} is a thin bundle: give --weights DIR (the directory holding its "
                           "external-data file)",
                           opts.bundlePath);
    FORGE_RETURN_IF_ERROR(loadExternalWeights(**ex, opts.weightsDir).prefix("--weights"));
  }
  auto routine = (*ex)->findRoutine("forward");
  if (!routine)
    return routine.status();
  const int r = *routine;
  auto inputs = loadInputs(opts);
  if (!inputs)
    return inputs.status();

  std::vector<std::string> missing;
  std::set<std::string> used;
  for (int32_t t : (*ex)->inputs(r)) {
    const std::string &name = (*ex)->tensorInfo(t).name();
    auto it = inputs->find(name);
    if (it == inputs->end()) {
      missing.push_back(describeTensor((*ex)->tensorInfo(t)));
      continue;
    }
    used.insert(name);
    if (Status s = (*ex)->setInput(r, name, it->second.view()); !s.isOk())
      return s;
  }
  if (!missing.empty())
    return Status::error("missing input{} {} (give --inputs FILE.npz or --input NAME=FILE.npy)",
                         missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
  for (const auto &[name, t] : *inputs)
    if (!used.count(name))
      fmt::print(stderr, "forge-train: warning: ignoring array '{}': not an input of {}\n", name,
                 opts.bundlePath);

  auto start = std::chrono::steady_clock::now();
  FORGE_RETURN_IF_ERROR((*ex)->run(r));
  FORGE_RETURN_IF_ERROR((*ex)->wait());
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::string written;
  if (!opts.outputsNpz.empty()) {
    std::vector<std::string> names = outputNames(**ex, r);
    std::map<std::string, TensorView> arrays;
    for (size_t i = 0; i < names.size(); ++i)
      arrays[names[i]] = (*ex)->view((*ex)->outputs(r)[i]);
    FORGE_RETURN_IF_ERROR(writeNpz(opts.outputsNpz, arrays));
    written = fmt::format(" -> {}", opts.outputsNpz);
  }
  const bundle::Program &p = (*loaded)->program();
  const bundle::Routine &fwd = p.routines(r);
  fmt::print("forward: {}, {}, {}, {:.3f} ms on {}{}\n",
             count(fwd.instructions_size(), "instruction"), count(fwd.inputs_size(), "input"),
             count(fwd.outputs_size(), "output"), ms, (*ex)->describe(), written);
  return Status::ok();
}

/// Declares every option on `app`, bound to `opts`.
void addOptions(CLI::App &app, Options &opts) {
  app.set_version_flag("--version", "forge-train 0.1.0");
  app.add_option("bundle", opts.bundlePath, "The .forge bundle (from forgec)")->required();

  const char *run = "Inspect / run once";
  app.add_flag("--info", opts.info, "Print the bundle's summary (routines, tensors, options), exit")
      ->group(run);
  app.add_flag("--forward", opts.forward,
               "Run the routine 'forward' once (inference bundle) and write its outputs")
      ->group(run);
  app.add_option("--inputs", opts.inputsNpz, "--forward: input arrays (.npz), by tensor name")
      ->check(CLI::ExistingFile)
      ->group(run);
  app.add_option("--input", opts.inputFiles,
                 "--forward: one input array NAME=file.npy (repeatable; overrides --inputs)")
      ->group(run);
  app.add_option("--outputs", opts.outputsNpz, "--forward: write all outputs to this .npz")
      ->group(run);

  const char *data = "Training data";
  app.add_option("--data", opts.data,
                 "Training data (repeatable): FILE.npz (arrays named like the bundle's data "
                 "inputs, dim 0 = sample), NAME=FILE.npy, FILE.bin (raw token shard: the "
                 "token input [B,T] gets tokens[o:o+T], the label input tokens[o+1:o+T+1]), or "
                 "an image folder DIR (DIR/CLASS/*.jpg|png: the image input and class labels)")
      ->group(data);
  app.add_option("--eval-data", opts.evalData,
                 "Evaluation data, same forms as --data (runs the routine 'eval')")
      ->group(data);
  app.add_option("--token-dtype", opts.tokenDType, "Element type of .bin token shards")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->default_str("uint16")
      ->group(data);
  app.add_option("--doc-separator", opts.docSeparator,
                 "Token shards as documents: each ends after token ID (e.g. GPT-2's 50256); a "
                 "sample is one document (longer ones cut at the token input's T), padded to "
                 "the smallest length bucket of the bundle that holds it (forgec "
                 "--length-buckets; labels padded with the loss's ignore=N)")
      ->check(CLI::NonNegativeNumber)
      ->group(data);
  app.add_option("--image-resize", opts.imageResize,
                 "Image folders: scale the shorter side to N pixels before the centre crop to "
                 "the image input's H x W (default: the smallest scale that covers the crop)")
      ->group(data);
  app.add_option("--image-mean", opts.imageMean,
                 "Image folders: per-channel mean R,G,B subtracted from pixel/255 (float inputs)")
      ->delimiter(',')
      ->expected(3)
      ->group(data);
  app.add_option("--image-std", opts.imageStd,
                 "Image folders: per-channel std R,G,B dividing pixel/255 - mean (float inputs)")
      ->delimiter(',')
      ->expected(3)
      ->group(data);
  app.add_option("--image-normalize", opts.imageNormalize,
                 "Image folders: 'imagenet' for ImageNet's mean and std (0.485,0.456,0.406 / "
                 "0.229,0.224,0.225) where --image-mean/--image-std are not given")
      ->check(CLI::IsMember({"imagenet", "none"}))
      ->group(data);
  app.add_flag("--random-resized-crop", opts.randomResizedCrop,
               "Image folders, --data only: a random box per sample and epoch (area share "
               "in --crop-scale, aspect ratio 3/4..4/3 log-uniform, as torchvision's "
               "RandomResizedCrop) scaled to the image input instead of the centre crop; "
               "seeded by --seed, the epoch and the sample (--eval-data keeps the centre "
               "crop)")
      ->group(data);
  app.add_option("--decode", opts.decode,
                 "Image folders of a canvas bundle (forgec --augment pixels,canvas=HxW), --data "
                 "only: 'gpu' decodes baseline JPEGs that fit the canvas on the GPU (nvJPEG: the "
                 "nvidia-nvjpeg wheel's libnvjpeg.so.13 on LD_LIBRARY_PATH), the CPU workers the "
                 "rest; 'auto' does so where it can; 'cpu' (default) decodes all on the CPU. A "
                 "JPEG nvJPEG cannot decode stops the run (its header is checked here)")
      ->check(CLI::IsMember({"cpu", "gpu", "auto"}))
      ->group(data);
  app.add_option("--crop-scale", opts.cropScale,
                 "--random-resized-crop's area share MIN,MAX (default 0.08,1)")
      ->delimiter(',')
      ->expected(2)
      ->group(data);
  app.add_option("--bad-records", opts.badRecords,
                 "A file that does not read or decode: 'fail' (default) stops with its path and "
                 "sample index; 'skip' warns once per file and uses the next good sample")
      ->check(CLI::IsMember({"fail", "skip"}))
      ->group(data);
  app.add_option("--seed", opts.seed,
                 "Shuffling seed (same seed, data and --threads: bit-identical losses); "
                 "default 0")
      ->group(data);
  app.add_flag("--no-shuffle", opts.noShuffle,
               "Visit samples in file order every epoch (default: a seeded permutation per "
               "epoch); the last partial batch of an epoch is always dropped")
      ->group(data);

  const char *loop = "Training loop";
  // CLI::PositiveNumber's message ("Value 0 not in range 0.000000 to 1.797693e+308") reads
  // like a machine wrote it.
  const CLI::Validator positive(
      [](std::string &input) -> std::string {
        char *end = nullptr;
        errno = 0;
        long long v = std::strtoll(input.c_str(), &end, 10);
        if (input.empty() || *end != '\0' || errno != 0 || v < 1)
          return "must be a whole number of at least 1 (got '" + input + "')";
        return "";
      },
      "N>=1");
  auto *steps = app.add_option("--steps", opts.steps,
                               "Train until this global optimizer step (counting the steps "
                               "restored by --resume)")
                    ->check(positive)
                    ->group(loop);
  auto *epochs = app.add_option("--epochs", opts.epochs,
                                "Train for this many epochs in all (E x floor(samples / "
                                "(micro-batches x batch)) steps)")
                     ->check(positive)
                     ->group(loop);
  steps->excludes(epochs);
  app.add_option("--eval-every", opts.evalEvery,
                 "Evaluate on --eval-data every N steps (and always after the last step)")
      ->check(positive)
      ->group(loop);
  app.add_option("--threads", opts.threads, "CPU worker threads (0: all cores)")
      ->check(CLI::NonNegativeNumber)
      ->group(loop);
  app.add_option("--workers", opts.workers,
                 "Data workers filling each batch side by side (.npz/.npy arrays; 0: one per "
                 "core, at most 8; 1: the training thread alone). The batch's bytes do not "
                 "depend on it")
      ->check(CLI::NonNegativeNumber)
      ->group(loop);
  app.add_option("--prefetch", opts.prefetch,
                 "Batches made ahead of the step that takes them, by a producer thread into a "
                 "ring of (pinned) host buffers; 0: each step fills its own batch while the GPU "
                 "runs the step before. The batches' bytes do not depend on it")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u))
      ->group(loop);
  app.add_option("--nproc", opts.nproc,
                 "Start N ranks of this command on this host, one data-parallel group (a bundle "
                 "from forgec --dp N): each gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                 "MASTER_PORT as from torchrun. Without it, those variables (torchrun, Slurm, "
                 "mpirun) make this process one rank")
      ->check(CLI::Range(1, 4096))
      ->group(loop);
  app.add_option("--timeout", opts.timeoutSeconds,
                 "Seconds a rank waits for the others (rendezvous, each collective) before it "
                 "stops with an error naming what it waited for")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(loop);
  app.add_option("--device", opts.device,
                 "Where to run: cpu, cuda, cuda:N or auto (CUDA for a CUDA bundle when a GPU is "
                 "present, else the CPU)")
      ->capture_default_str()
      ->group(loop);
  app.add_option("--weights", opts.weightsDir,
                 "Thin bundles (forgec --weights external): the directory holding the model's "
                 "external-data file(s); not needed when --resume restores a checkpoint")
      ->check(CLI::ExistingDirectory)
      ->group(loop);
  app.add_option("--profile", opts.profilePath,
                 "Write a Chrome-trace/Perfetto JSON of --profile-steps steps (every instruction "
                 "timed on its stream, with op, kernel, bytes and FLOPs)")
      ->group(loop);
  app.add_option("--profile-steps", opts.profileSteps,
                 "Steps timed by --profile (after two warm-up steps)")
      ->check(positive)
      ->capture_default_str()
      ->group(loop);
  app.add_flag("--no-pipeline", opts.noPipeline,
               "GPU: read each step's loss back before launching the next step (by default "
               "step s+1 is launched first)")
      ->group(loop);
  app.add_flag("--no-cuda-graph", opts.noCudaGraph,
               "CUDA: launch every instruction each step instead of replaying a CUDA graph")
      ->group(loop);
  app.add_option("--attention-backward", opts.attentionBackward,
                 "CUDA: cuDNN's fused attention backward: fast (its default algorithm, which "
                 "adds dq atomically, as PyTorch's flash backward does) or deterministic "
                 "(bit-identical gradients run to run, slower)")
      ->check(CLI::IsMember({"deterministic", "fast"}))
      ->capture_default_str()
      ->group(loop);
  app.add_option("--recipe", opts.recipe,
                 "TOML file of options (keys = long option names without --, e.g. "
                 "steps = 1000, data = [\"train.npz\"], resume = true); command-line flags "
                 "override it")
      ->check(CLI::ExistingFile)
      ->group(loop);

  const char *out = "Progress, metrics, checkpoints, export";
  app.add_option("--log-every", opts.logEvery,
                 "When stderr is not a terminal, print a progress line every N steps (on a "
                 "terminal one line updates in place); default 10")
      ->check(positive)
      ->group(out);
  app.add_option("--metrics", opts.metricsPath,
                 "Write one JSON object per step to this file (JSONL): step, epoch, loss, lr, "
                 "grad_norm (null unless the bundle computes it: forgec --clip-grad-norm, loss "
                 "scaling or --grad-norm), samples_per_s (and tokens_per_s), input_s, gpu_idle_s "
                 "(GPU: the input "
                 "stall before the step), time_s, plus eval_loss and "
                 "eval_accuracy on eval steps. With --resume, lines after the restored step "
                 "are dropped and new ones appended")
      ->group(out);
  app.add_option("--ckpt-dir", opts.ckptDir,
                 "Write checkpoints D/ckpt-<step>.forgeckpt (and D/latest) every --ckpt-every "
                 "steps and after the last step; existing files are never overwritten")
      ->group(out);
  app.add_option("--ckpt-every", opts.ckptEvery, "Checkpoint every N steps (needs --ckpt-dir)")
      ->check(positive)
      ->group(out);
  app.add_option("--ckpt-format", opts.ckptFormat,
                 "auto | whole | sharded: with several ranks (--nproc, a launcher), sharded "
                 "writes D/ckpt-<step>.forgeckpt/ as a directory of one file per rank, each "
                 "holding that rank's slices and parts, nothing gathered (auto: sharded with "
                 "several ranks); whole gathers every tensor to rank 0, which writes one file. "
                 "--resume reads either, on any layout")
      ->check(CLI::IsMember({"auto", "whole", "sharded"}))
      ->group(out);
  app.add_flag("--resume", opts.resume,
               "Continue from the newest valid checkpoint in --ckpt-dir (bit-identical to an "
               "uninterrupted run; corrupt checkpoints are skipped, another bundle's refused); "
               "starts from step 0 when there is none")
      ->group(out);
  app.add_option("--export-onnx", opts.exportOnnx,
                 "After training, write the source ONNX model with its initializers replaced by "
                 "the trained parameter (and state) values")
      ->group(out);
  app.add_option("--onnx-model", opts.onnxModel,
                 "The source ONNX model for --export-onnx (default: the bundle's build option "
                 "source_onnx)")
      ->group(out);
  app.add_option("--dump-params", opts.dumpParams,
                 "After training, write every parameter and state tensor to this .npz, by name")
      ->group(out);
  app.add_option("--dump-grads", opts.dumpGrads,
                 "After the first optimizer step of this run (step 1 unless --resume), write "
                 "every parameter's gradient (train_step outputs forge.grad.NAME: after "
                 "micro-batch accumulation, before clipping and weight decay) to this .npz, "
                 "keyed by parameter name; the bundle must be compiled with forgec "
                 "--expose-gradients")
      ->group(out);
}

/// Arguments for the long options the recipe sets (keys = option names
/// without "--") that the command line did not give.
Expected<std::vector<std::string>> recipeArgs(CLI::App &app, const std::string &path) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error &e) {
    return Status::error("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                         e.description());
  }
  std::vector<std::string> args;
  auto scalar = [](const toml::node &n) -> std::optional<std::string> {
    if (auto v = n.value_exact<std::string>())
      return *v;
    if (auto v = n.value_exact<int64_t>())
      return std::to_string(*v);
    if (auto v = n.value_exact<double>())
      return fmt::format("{}", *v);
    return std::nullopt;
  };
  for (auto &&[key, node] : table) {
    std::string name(key.str());
    if (name == "recipe" || name == "help" || name == "version")
      return Status::error("{}: key '{}' is not allowed in a recipe", path, name);
    CLI::Option *opt = app.get_option_no_throw("--" + name);
    if (!opt)
      return Status::error("{}: unknown key '{}' (keys are forge-train's long option names; see "
                           "--help)",
                           path, name);
    if (opt->count() > 0)
      continue; // the command line wins
    if (opt->get_expected_max() == 0) { // a flag
      auto b = node.value_exact<bool>();
      if (!b)
        return Status::error("{}: key '{}' must be true or false", path, name);
      if (*b)
        args.push_back("--" + name);
      continue;
    }
    std::vector<std::string> values;
    if (const toml::array *arr = node.as_array()) {
      for (const toml::node &item : *arr) {
        auto v = scalar(item);
        if (!v)
          return Status::error("{}: key '{}': list elements must be strings or numbers", path,
                               name);
        values.push_back(*v);
      }
      if (values.size() > 1 && opt->get_expected_max() <= 1)
        return Status::error("{}: key '{}' takes one value, not a list", path, name);
    } else if (auto v = scalar(node)) {
      values.push_back(*v);
    } else {
      return Status::error("{}: key '{}' must be a string, a number or a list", path, name);
    }
    for (const std::string &v : values) {
      args.push_back("--" + name);
      args.push_back(v);
    }
  }
  return args;
}

Status validate(const Options &o) {
  bool training = !o.data.empty();
  if (o.info || o.forward) {
    if (training)
      return Status::error("--data is for training; it cannot be combined with --info/--forward");
    if (o.nproc > 0)
      return Status::error("--nproc starts training ranks; it cannot be combined with "
                           "--info/--forward");
    return Status::ok();
  }
  if (!training)
    return Status::error("nothing to do: give --data (training), --forward or --info (see --help)");
  if (o.steps == 0 && o.epochs == 0)
    return Status::error("training needs --steps N or --epochs E");
  if (o.evalEvery > 0 && o.evalData.empty())
    return Status::error("--eval-every needs --eval-data");
  if ((o.ckptEvery > 0 || o.resume) && o.ckptDir.empty())
    return Status::error("--ckpt-every and --resume need --ckpt-dir");
  if (!o.onnxModel.empty() && o.exportOnnx.empty())
    return Status::error("--onnx-model is only used with --export-onnx");
  return Status::ok();
}

int realMain(int argc, char **argv) {
  const char *description =
      "forge-train: run or train a compiled .forge bundle on the CPU.\n\n"
      "  forge-train m.forge --info\n"
      "  forge-train m.forge --forward --inputs x.npz --outputs y.npz\n"
      "  forge-train m.forge --data train.npz --eval-data val.npz --steps 1000 \\\n"
      "              --eval-every 100 --metrics m.jsonl --ckpt-dir ckpt --ckpt-every 200\n"
      "  forge-train m.forge --recipe train.toml --resume\n";
  // Pass 1: the command line alone (also --help, and --recipe's path).
  Options opts;
  CLI::App app1{description};
  addOptions(app1, opts);
  try {
    app1.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    int rc = app1.exit(e); // prints help/version (rc 0) or the error
    return rc == 0 ? 0 : 1;
  }
  opts.seedGiven = app1.get_option("--seed")->count() > 0;
  if (!opts.recipe.empty()) {
    auto extra = recipeArgs(app1, opts.recipe);
    if (!extra) {
      fmt::print(stderr, "forge-train: error: {}\n", extra.status().message());
      return 1;
    }
    // Pass 2: the recipe's values first, then the command line.
    std::string recipe = opts.recipe;
    std::vector<std::string> args(argv + 1, argv + argc);
    args.insert(args.begin(), extra->begin(), extra->end());
    std::reverse(args.begin(), args.end()); // CLI11 takes a reversed vector
    opts = Options{};
    CLI::App app2{description};
    addOptions(app2, opts);
    try {
      app2.parse(args);
    } catch (const CLI::ParseError &e) {
      fmt::print(stderr, "forge-train: error: {} (options from recipe {})\n", e.what(), recipe);
      return 1;
    }
    opts.seedGiven = app2.get_option("--seed")->count() > 0;
  }
  // More workers than hardware threads only costs memory and process ids (a
  // huge --threads exhausted them): cap it, and say so.
  if (unsigned cores = std::thread::hardware_concurrency(); cores > 0 && opts.threads > cores) {
    fmt::print(stderr, "forge-train: warning: --threads {} exceeds the {} hardware threads; using {}\n",
               opts.threads, cores, cores);
    opts.threads = cores;
  }

  Status s = validate(opts);
  if (s.isOk() && opts.nproc > 0) {
    // The launcher: the same command line without --nproc, once per rank.
    std::vector<std::string> args;
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--nproc") {
        ++i;
        continue;
      }
      if (a.rfind("--nproc=", 0) == 0)
        continue;
      args.push_back(a);
    }
    return forge::train::launchRanks(opts.nproc, args);
  }
  if (s.isOk()) {
    if (opts.info)
      s = runInfo(opts);
    else if (opts.forward)
      s = runForward(opts);
    else
      return forge::train::runTrainMode(opts);
  }
  if (!s.isOk()) {
    fmt::print(stderr, "forge-train: error: {}\n", s.message());
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return realMain(argc, argv);
  } catch (const std::exception &e) {
    fmt::print(stderr, "forge-train: error: {}\n", e.what());
  } catch (...) {
    fmt::print(stderr, "forge-train: error: unknown exception\n");
  }
  return 1;
}
