// forge-train: runs a `.forge` bundle on the CPU (later: trains it, on CPU or
// CUDA). Modes today:
//   forge-train --info BUNDLE
//   forge-train BUNDLE --forward --inputs in.npz [--input NAME=x.npy ...]
//               [--outputs out.npz] [--threads N]
//
// Structure: main() only parses flags into Options and dispatches to one
// function per mode, each returning a Status; training flags and a `train`
// mode are added to Options and dispatch without touching the others.
// Invariant: every failure is a message on stderr and exit code 1; no
// exception or abort reaches the user (DESIGN.md §10).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/CpuExecutor.h"
#include "forge/runtime/Npy.h"

using namespace forge::rt;
namespace bundle = forge::bundle;

namespace {

struct Options {
  std::string bundlePath;
  bool info = false;
  bool forward = false;
  std::string inputsNpz;
  std::vector<std::string> inputFiles; // NAME=file.npy
  std::string outputsNpz;
  unsigned threads = 0;
};

std::vector<int64_t> shapeOf(const bundle::TensorInfo &t) {
  return {t.shape().begin(), t.shape().end()};
}

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
  fmt::print("sections:     {}\n", p.sections_size());
  for (int i = 0; i < p.sections_size(); ++i)
    fmt::print("  [{}] {:<24} offset {:>12}  size {:>12}  crc32 {:#010x}\n", i,
               p.sections(i).name(), p.sections(i).offset(), p.sections(i).size(),
               p.sections(i).crc32());
  fmt::print("routines:     {}\n", p.routines_size());
  for (const bundle::Routine &r : p.routines()) {
    fmt::print("  {}: {}, {}, {}\n", r.name(), count(r.instructions_size(), "instruction"),
               count(r.inputs_size(), "input"), count(r.outputs_size(), "output"));
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
std::vector<std::string> outputNames(const CpuExecutor &ex, int routine) {
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
  auto ex = CpuExecutor::create(**loaded, CpuExecutorOptions{opts.threads});
  if (!ex)
    return ex.status();
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
  unsigned threads =
      opts.threads ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  const bundle::Routine &fwd = p.routines(r);
  fmt::print("forward: {}, {}, {}, {:.3f} ms on {}{}\n",
             count(fwd.instructions_size(), "instruction"), count(fwd.inputs_size(), "input"),
             count(fwd.outputs_size(), "output"), ms, count(threads, "thread"), written);
  return Status::ok();
}

int realMain(int argc, char **argv) {
  Options opts;
  CLI::App app{"forge-train: run (and, later, train) a compiled .forge bundle"};
  app.set_version_flag("--version", "forge-train 0.1.0");
  app.add_option("bundle", opts.bundlePath, "The .forge bundle")->required();
  auto *info = app.add_flag("--info", opts.info, "Print the bundle's program summary and exit");
  auto *forward = app.add_flag("--forward", opts.forward,
                               "Run the program once on the CPU (inference) and write its "
                               "outputs");
  info->excludes(forward);
  app.add_option("--inputs", opts.inputsNpz, "Input arrays (.npz), by tensor name")
      ->check(CLI::ExistingFile);
  app.add_option("--input", opts.inputFiles,
                 "One input array: NAME=file.npy (repeatable; overrides --inputs)");
  app.add_option("--outputs", opts.outputsNpz, "Write all program outputs to this .npz");
  app.add_option("--threads", opts.threads, "CPU worker threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    int rc = app.exit(e); // prints help/version (rc 0) or the error
    return rc == 0 ? 0 : 1;
  }

  Status s;
  if (opts.info)
    s = runInfo(opts);
  else if (opts.forward)
    s = runForward(opts);
  else
    s = Status::error("training is not implemented yet; use --forward or --info");
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
