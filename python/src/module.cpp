// forge._forge: the runtime (bundles, the training loop, checkpoints, ONNX export)
// bound into Python with nanobind. The compiler is not linked here: forge.compile
// runs forgec (python/forge/__init__.py), so this module stays MLIR-free like every
// runtime consumer (../shared/DESIGN.md §1) and a compile error cannot take the interpreter down.
//
// Invariants:
//  * Every runtime error surfaces as forge.ForgeError carrying the runtime's message
//    (the same text forge-train prints); nothing here aborts the process.
//  * Batches are read in place: a C-contiguous host array (NumPy, or any object with
//    __dlpack__ on the CPU) is viewed, not copied, until the step has filled the
//    device's input buffers from it; other layouts are made contiguous once. A batch of
//    CUDA arrays (all of it) is copied device to device by the executor.
//  * The GIL is released while a step or an evaluation runs; the arrays it reads are
//    held by the call's arguments until it returns.
//  * A Trainer keeps its Bundle alive (the executor reads the bundle's sections).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include <fmt/format.h>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/Executor.h"
#include "forge/runtime/Shards.h"
#include "forge/runtime/Trainer.h"
#ifdef FORGE_HAVE_ONNX_EXPORT
#include "forge/runtime/OnnxExport.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace forge::py {
namespace {

/// forge.ForgeError: a runtime Status that was not ok.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(const rt::Status &st) {
  if (!st.isOk())
    throw Error(st.message());
}
template <typename T> T take(rt::Expected<T> e) {
  if (!e.isOk())
    throw Error(e.status().message());
  return e.take();
}

// --- dtypes -------------------------------------------------------------------------

rt::DType dtypeOf(nb::dlpack::dtype d, const std::string &what) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (d.lanes == 1) {
    switch (code) {
    case C::Float:
      if (d.bits == 32) return forge::bundle::F32;
      if (d.bits == 16) return forge::bundle::F16;
      if (d.bits == 64) return forge::bundle::F64;
      break;
    case C::Bfloat:
      if (d.bits == 16) return forge::bundle::BF16;
      break;
    case C::Int:
      if (d.bits == 64) return forge::bundle::I64;
      if (d.bits == 32) return forge::bundle::I32;
      if (d.bits == 16) return forge::bundle::I16;
      if (d.bits == 8) return forge::bundle::I8;
      break;
    case C::UInt:
      if (d.bits == 8) return forge::bundle::U8;
      if (d.bits == 16) return forge::bundle::U16;
      if (d.bits == 32) return forge::bundle::U32;
      if (d.bits == 64) return forge::bundle::U64;
      break;
    case C::Bool:
      return forge::bundle::BOOL;
    default:
      break;
    }
  }
  throw Error(what + ": an array of an element type Forge has no input for (code " +
              std::to_string(d.code) + ", " + std::to_string(d.bits) + " bits, " +
              std::to_string(d.lanes) + " lanes)");
}

/// The NumPy dtype of a runtime dtype (bf16 and fp8 have none: the caller widens them).
std::optional<nb::dlpack::dtype> numpyDtype(rt::DType t) {
  switch (t) {
  case forge::bundle::F32: return nb::dtype<float>();
  case forge::bundle::F64: return nb::dtype<double>();
  case forge::bundle::F16: return nb::dlpack::dtype{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
  case forge::bundle::I64: return nb::dtype<int64_t>();
  case forge::bundle::I32: return nb::dtype<int32_t>();
  case forge::bundle::I16: return nb::dtype<int16_t>();
  case forge::bundle::I8: return nb::dtype<int8_t>();
  case forge::bundle::U8: return nb::dtype<uint8_t>();
  case forge::bundle::U16: return nb::dtype<uint16_t>();
  case forge::bundle::U32: return nb::dtype<uint32_t>();
  case forge::bundle::U64: return nb::dtype<uint64_t>();
  case forge::bundle::BOOL: return nb::dtype<bool>();
  default: return std::nullopt;
  }
}

/// A NumPy array owning a copy of `view` (bf16 widened to f32, the only low type a
/// persistent tensor has besides f16).
nb::object toNumpy(const rt::TensorView &view, const std::string &name) {
  std::vector<size_t> shape(view.shape.begin(), view.shape.end());
  rt::DType out = view.dtype;
  std::optional<nb::dlpack::dtype> dt = numpyDtype(out);
  const size_t n = static_cast<size_t>(view.numel());
  if (!dt && view.dtype == forge::bundle::BF16) {
    out = forge::bundle::F32;
    dt = nb::dtype<float>();
  }
  if (!dt)
    throw Error("tensor '" + name + "' is " + std::string(rt::dtypeName(view.dtype)) +
                ", which NumPy cannot hold");
  auto *bytes = new uint8_t[n * rt::dtypeSize(out) + 1];
  if (out == view.dtype) {
    std::memcpy(bytes, view.data, view.bytes());
  } else { // bf16 -> f32: the high half of the f32's bits
    const auto *src = static_cast<const uint16_t *>(view.data);
    auto *dst = reinterpret_cast<uint32_t *>(bytes);
    for (size_t i = 0; i < n; ++i)
      dst[i] = static_cast<uint32_t>(src[i]) << 16;
  }
  nb::capsule owner(bytes, [](void *p) noexcept { delete[] static_cast<uint8_t *>(p); });
  return nb::cast(nb::ndarray<nb::numpy>(bytes, shape.size(), shape.data(), owner, nullptr, *dt));
}

// --- arrays in --------------------------------------------------------------------

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

/// Views of a dict's arrays (made contiguous where they were not), kept alive by `keep`.
std::vector<std::pair<std::string, rt::MappedArray>> viewArrays(nb::dict batch,
                                                                std::vector<HostArray> &keep,
                                                                const char *what) {
  std::vector<std::pair<std::string, rt::MappedArray>> arrays;
  for (auto [key, value] : batch) {
    std::string name = nb::cast<std::string>(nb::str(key));
    HostArray a;
    if (!nb::try_cast<HostArray>(value, a, /*convert=*/true)) {
      std::string type = nb::cast<std::string>(nb::str(value.type()));
      nb::object device = nb::getattr(value, "device", nb::none());
      throw Error(std::string(what) + ": '" + name + "' is not an array (" + type +
                  (device.is_none() ? std::string()
                                    : ", device " + nb::cast<std::string>(nb::str(device))) +
                  "); pass NumPy arrays, or tensors with __dlpack__ (all on the CPU, or all on "
                  "the trainer's GPU)");
    }
    rt::MappedArray m;
    m.dtype = dtypeOf(a.dtype(), std::string(what) + ": '" + name + "'");
    for (size_t d = 0; d < a.ndim(); ++d)
      m.shape.push_back(static_cast<int64_t>(a.shape(d)));
    m.data = static_cast<const uint8_t *>(a.data());
    m.size = a.nbytes();
    keep.push_back(a);
    arrays.emplace_back(std::move(name), std::move(m));
  }
  return arrays;
}

// --- Bundle -------------------------------------------------------------------------

struct PyBundle {
  std::shared_ptr<rt::Bundle> bundle;
  std::string path;

  explicit PyBundle(const std::string &p) : path(p) {
    nb::gil_scoped_release release;
    bundle = std::shared_ptr<rt::Bundle>(take(rt::Bundle::open(p)).release());
  }
  const forge::bundle::Program &program() const { return bundle->program(); }

  std::vector<std::string> routines() const {
    std::vector<std::string> out;
    for (const auto &r : program().routines())
      out.push_back(r.name());
    return out;
  }
  nb::dict buildOptions() const {
    nb::dict d;
    for (const auto &[k, v] : program().build_options())
      d[nb::str(k.c_str())] = nb::str(v.c_str());
    return d;
  }
  /// [(name, dtype, shape)] of a routine's inputs or outputs.
  nb::list signature(const std::string &routine, bool outputs) const {
    for (const auto &r : program().routines()) {
      if (r.name() != routine)
        continue;
      nb::list out;
      for (int32_t t : outputs ? r.outputs() : r.inputs()) {
        const auto &info = program().tensors(t);
        nb::list shape;
        for (int64_t d : info.shape())
          shape.append(d);
        out.append(nb::make_tuple(info.name(), std::string(rt::dtypeName(info.dtype())),
                                  nb::tuple(shape)));
      }
      return out;
    }
    throw Error(bundle->origin() + ": no routine '" + routine + "' (routines: " + [&] {
      std::string s;
      for (const std::string &n : routines())
        s += (s.empty() ? "" : ", ") + n;
      return s.empty() ? std::string("none") : s;
    }() + ")");
  }
};

// --- Trainer ------------------------------------------------------------------------

nb::dict stepDict(const rt::StepResult &r) {
  nb::dict d;
  d["step"] = r.step;
  d["loss"] = r.loss;
  if (r.lr)
    d["lr"] = *r.lr;
  if (r.gradNorm)
    d["grad_norm"] = *r.gradNorm;
  if (r.lossScale) {
    d["loss_scale"] = *r.lossScale;
    d["skipped"] = r.skipped;
  }
  d["input_seconds"] = r.inputSeconds;
  if (r.length > 0) { // documents in length buckets: the step's bucket and labelled tokens
    d["length"] = r.length;
    d["tokens"] = r.realTokens;
  }
  return d;
}

rt::DataSourceOptions sourceOptions(const std::string &tokenDtype, int64_t docSeparator) {
  rt::DataSourceOptions o;
  if (docSeparator >= 0) // token shards as documents, batched by length (length buckets)
    o.docSeparator = docSeparator;
  if (tokenDtype == "u16")
    o.tokenDType = rt::TokenDType::U16;
  else if (tokenDtype == "u32")
    o.tokenDType = rt::TokenDType::U32;
  else
    throw Error("token_dtype must be 'u16' or 'u32', not '" + tokenDtype + "'");
  return o;
}

struct PyTrainer {
  std::shared_ptr<rt::Bundle> bundle; // outlives `trainer`
  std::unique_ptr<rt::Trainer> trainer;

  PyTrainer(const PyBundle &b, const std::string &device, std::vector<std::string> data,
            std::vector<std::string> evalData, uint64_t seed, bool shuffle, unsigned threads,
            unsigned workers, unsigned prefetch, bool cudaGraphs, const std::string &weights,
            const std::string &tokenDtype, int64_t docSeparator, int64_t imageResize,
            std::vector<float> imageMean, std::vector<float> imageStd, bool randomResizedCrop,
            std::vector<double> cropScale, bool skipBadRecords, const std::string &decode,
            const std::string &attentionBackward)
      : bundle(b.bundle) {
    if (attentionBackward != "fast" && attentionBackward != "deterministic")
      throw nb::value_error(
          ("attention_backward must be 'fast' or 'deterministic', not '" + attentionBackward + "'")
              .c_str());
    rt::DataSourceOptions so = sourceOptions(tokenDtype, docSeparator);
    check(rt::applyImageCropOption(rt::buildOption(b.bundle->program(), "image_crop"), so.image));
    // Image folders: forge-train's --image-* options (the eval data keeps the centre crop).
    rt::DataSourceOptions trainOptions;
    check(rt::applyImageSettings({imageResize, std::move(imageMean), std::move(imageStd),
                                  randomResizedCrop, std::move(cropScale), skipBadRecords, seed},
                                 rt::SettingSpelling::Keywords, so, trainOptions));
    nb::gil_scoped_release release;
    std::unique_ptr<rt::DataSource> train, eval;
    if (!data.empty())
      train = take(rt::openDataSource(data, trainOptions));
    if (!evalData.empty())
      eval = take(rt::openDataSource(evalData, so));
    rt::TrainerOptions o;
    o.device = device;
    o.seed = seed;
    o.shuffle = shuffle;
    o.threads = threads;
    o.workers = workers;
    o.prefetch = train ? prefetch : 0;
    o.cudaGraphs = cudaGraphs;
    o.imageDecode = decode;
    o.deterministicAttention = attentionBackward == "deterministic";
    trainer = take(rt::Trainer::create(*bundle, std::move(train), std::move(eval), o));
    std::vector<std::string> thin = rt::externalParameters(*bundle);
    if (!thin.empty()) {
      if (weights.empty())
        throw Error(bundle->origin() + " is a thin bundle (" + std::to_string(thin.size()) +
                    " parameters, e.g. '" + thin.front() +
                    "', live in the model's external-data file): give weights=DIR, or "
                    "resume() a checkpoint before the first step");
      check(rt::loadExternalWeights(trainer->executor(), weights));
    }
  }

  /// A batch of CUDA arrays (e.g. PyTorch CUDA tensors): checked here (the device cannot
  /// be read for messages), then copied device to device into the step's inputs.
  rt::StepResult stepOnDevice(nb::dict batch) {
    std::vector<const void *> ptrs;
    std::vector<nb::ndarray<nb::ro>> keep;
    const int64_t rows = trainer->samplesAt(trainer->stepsDone() + 1); // a schedule's step's
    for (const rt::DataField &f : trainer->dataFields()) {
      nb::object value = batch.contains(f.name.c_str()) ? nb::borrow(batch[f.name.c_str()])
                                                          : nb::object();
      std::vector<int64_t> want{rows};
      want.insert(want.end(), f.sampleShape.begin(), f.sampleShape.end());
      const std::string needs = fmt::format("{} {}", rt::dtypeName(f.dtype), rt::shapeString(want));
      if (!value.is_valid())
        throw Error(fmt::format("step(batch): no array for the bundle input '{}' ({})", f.name,
                                needs));
      nb::ndarray<nb::ro> a;
      if (!nb::try_cast(value, a, false) || a.device_type() != nb::device::cuda::value)
        throw Error(fmt::format("step(batch): '{}' is not a CUDA array, the others are (a "
                                "batch is all host or all CUDA arrays)",
                                f.name));
      const rt::DType dt = dtypeOf(a.dtype(), "step(batch): '" + f.name + "'");
      std::vector<int64_t> shape;
      for (size_t d = 0; d < a.ndim(); ++d)
        shape.push_back(static_cast<int64_t>(a.shape(d)));
      if (dt != f.dtype || shape != want)
        throw Error(fmt::format("step(batch): CUDA array '{}' is {} {}, the bundle input needs "
                                "{} (no conversion on the device)",
                                f.name, rt::dtypeName(dt), rt::shapeString(shape), needs));
      int64_t stride = 1;
      for (size_t d = a.ndim(); d-- > 0;) {
        if (a.shape(d) != 1 && a.stride(d) != stride)
          throw Error(fmt::format("step(batch): CUDA array '{}' is not C-contiguous (e.g. "
                                  "call .contiguous())",
                                  f.name));
        stride *= static_cast<int64_t>(a.shape(d));
      }
      ptrs.push_back(a.data());
      keep.push_back(a);
    }
    nb::gil_scoped_release release;
    return take(trainer->stepOnDevice(ptrs));
  }

  nb::dict step(std::optional<nb::dict> batch) {
    rt::StepResult r;
    bool device = false;
    if (batch)
      for (auto [key, value] : *batch) {
        nb::ndarray<nb::ro> a;
        if (nb::try_cast(value, a, false) && a.device_type() == nb::device::cuda::value)
          device = true;
      }
    if (!batch) {
      nb::gil_scoped_release release;
      r = take(trainer->step());
    } else if (device) {
      r = stepOnDevice(*batch);
    } else {
      std::vector<HostArray> keep;
      auto arrays = viewArrays(*batch, keep, "step(batch)");
      nb::gil_scoped_release release;
      std::unique_ptr<rt::DataSource> source = rt::makeArrayViewSource(std::move(arrays), "batch");
      r = take(trainer->stepOn(*source));
    }
    return stepDict(r);
  }

  nb::dict evaluate(std::optional<nb::dict> arrays) {
    if (arrays) {
      // Copied: the trainer keeps its eval data between calls.
      std::vector<HostArray> keep;
      auto views = viewArrays(*arrays, keep, "evaluate(batches)");
      std::vector<std::pair<std::string, rt::HostTensor>> owned;
      for (auto &[name, m] : views) {
        rt::HostTensor t;
        t.dtype = m.dtype;
        t.shape = m.shape;
        t.bytes.assign(m.data, m.data + m.size);
        owned.emplace_back(name, std::move(t));
      }
      nb::gil_scoped_release release;
      check(trainer->setEvalData(rt::makeArraySource(std::move(owned),
                                                     std::vector<std::string>(views.size(), "eval batches"))));
    }
    rt::EvalResult r;
    {
      nb::gil_scoped_release release;
      r = take(trainer->evaluate());
    }
    nb::dict d;
    d["loss"] = r.loss;
    if (r.accuracy)
      d["accuracy"] = *r.accuracy;
    d["samples"] = r.samples;
    d["batches"] = r.batches;
    return d;
  }

  /// A file, or in a directory (forge-train's --ckpt-dir layout: ckpt-<step>.forgeckpt and
  /// `latest`); returns the file written.
  std::string saveCheckpoint(const std::string &path, bool directory) {
    nb::gil_scoped_release release;
    if (directory) {
      rt::CheckpointDir dir(path);
      check(dir.create());
      return take(dir.save(trainer->executor(), trainer->state()));
    }
    check(rt::writeCheckpoint(path, trainer->executor(), trainer->state()));
    return path;
  }

  /// Restores a checkpoint file, or the newest valid one of a directory (corrupt files
  /// skipped, with a warning each). Returns (the step it continues from, or None when
  /// the directory holds none; the warnings).
  nb::tuple resume(const std::string &path, bool directory) {
    std::vector<std::string> warnings;
    std::optional<int64_t> step;
    {
      nb::gil_scoped_release release;
      std::optional<rt::CheckpointState> state;
      if (directory) {
        state = take(rt::CheckpointDir(path).resume(
            trainer->executor(), [&](const std::string &w) { warnings.push_back(w); }));
      } else {
        state = take(rt::readCheckpoint(path, trainer->executor()));
      }
      if (state) {
        check(trainer->restore(*state));
        step = state->step;
      }
    }
    return nb::make_tuple(step, warnings);
  }

  std::vector<std::string> exportOnnx(const std::string &out, const std::string &source) {
#ifdef FORGE_HAVE_ONNX_EXPORT
    nb::gil_scoped_release release;
    rt::OnnxExportReport report = take(rt::exportOnnx(source, out, trainer->executor()));
    return report.replaced;
#else
    throw Error("export_onnx: this build of forge has no ONNX support (libonnx-dev)");
#endif
  }

  /// Persistent tensors by name: PARAMETERs, or with `state` the optimizer's
  /// moments and running statistics too (copies).
  nb::dict tensors(bool state) {
    const rt::Executor &ex = trainer->executor();
    const rt::WholeTensors canonical = rt::permutedWhole(ex); // weights stored permuted
    nb::dict d;
    for (int32_t t : ex.persistentTensors()) {
      const auto &info = ex.tensorInfo(t);
      if (info.kind() != forge::bundle::TensorInfo::PARAMETER && !state)
        continue;
      d[nb::str(info.name().c_str())] = toNumpy(rt::wholeView(ex, t, &canonical), info.name());
    }
    return d;
  }

  nb::list fields() const {
    nb::list out;
    for (const rt::DataField &f : trainer->dataFields()) {
      nb::list shape;
      shape.append(trainer->batchSize());
      for (int64_t d : f.sampleShape)
        shape.append(d);
      out.append(nb::make_tuple(f.name, std::string(rt::dtypeName(f.dtype)), nb::tuple(shape)));
    }
    return out;
  }
};

} // namespace
} // namespace forge::py

NB_MODULE(_forge, m) {
  using namespace forge::py;
  m.doc() = "Forge's runtime: bundles, the training loop, checkpoints and ONNX export.";
  nb::exception<Error>(m, "ForgeError", PyExc_RuntimeError);
  m.attr("IMAGENET_MEAN") = nb::make_tuple(forge::rt::kImageNetMean[0], forge::rt::kImageNetMean[1],
                                           forge::rt::kImageNetMean[2]);
  m.attr("IMAGENET_STD") = nb::make_tuple(forge::rt::kImageNetStd[0], forge::rt::kImageNetStd[1],
                                          forge::rt::kImageNetStd[2]);

  nb::class_<PyBundle>(m, "Bundle", "A compiled .forge bundle, opened and validated.")
      .def(nb::init<const std::string &>(), "path"_a,
           "Opens and validates the bundle at `path` (raises ForgeError naming the problem).")
      .def_ro("path", &PyBundle::path, "The file the bundle was opened from.")
      .def_prop_ro("routines", &PyBundle::routines,
                   "Routine names: 'train_step' and 'eval' for a training bundle (and "
                   "'accumulate', one micro-batch's forward and backward, with an "
                   "accumulation loop), 'forward' for an inference bundle.")
      .def_prop_ro("build_options", &PyBundle::buildOptions,
                   "The options forgec recorded (target, batch, loss, optimizer, ...).")
      .def("inputs", [](const PyBundle &b, const std::string &r) { return b.signature(r, false); },
           "routine"_a = "train_step", "[(name, dtype, shape)] of a routine's inputs.")
      .def("outputs", [](const PyBundle &b, const std::string &r) { return b.signature(r, true); },
           "routine"_a = "train_step", "[(name, dtype, shape)] of a routine's outputs.");

  nb::class_<PyTrainer>(m, "Trainer", "The runtime's training loop (forge.Trainer wraps it).")
      .def(nb::init<const PyBundle &, const std::string &, std::vector<std::string>,
                    std::vector<std::string>, uint64_t, bool, unsigned, unsigned, unsigned, bool,
                    const std::string &, const std::string &, int64_t, int64_t, std::vector<float>,
                    std::vector<float>, bool, std::vector<double>, bool, const std::string &,
                    const std::string &>(),
           "bundle"_a, "device"_a = "cpu", "data"_a = std::vector<std::string>(),
           "eval_data"_a = std::vector<std::string>(), "seed"_a = 0, "shuffle"_a = true,
           "threads"_a = 0, "workers"_a = 0, "prefetch"_a = 2, "cuda_graphs"_a = true,
           "weights"_a = "", "token_dtype"_a = "u16", "doc_separator"_a = -1, "image_resize"_a = 0,
           "image_mean"_a = std::vector<float>(), "image_std"_a = std::vector<float>(),
           "random_resized_crop"_a = false, "crop_scale"_a = std::vector<double>(),
           "skip_bad_records"_a = false, "decode"_a = "cpu", "attention_backward"_a = "fast")
      .def("step", &PyTrainer::step, "batch"_a = nb::none(),
           "One optimizer step: on `batch` (dict of arrays) or on the next samples of the data.")
      .def("evaluate", &PyTrainer::evaluate, "arrays"_a = nb::none(),
           "Mean eval loss (and accuracy) over `arrays` (which become the eval data) or the "
           "eval data.")
      .def("save_checkpoint", &PyTrainer::saveCheckpoint, "path"_a, "directory"_a,
           "Writes parameters, optimizer state and the step/data position atomically, to a "
           "file or into a checkpoint directory; returns the file.")
      .def("resume", &PyTrainer::resume, "path"_a, "directory"_a,
           "Restores a checkpoint file or a directory's newest valid one: (step or None, "
           "warnings).")
      .def("export_onnx", &PyTrainer::exportOnnx, "path"_a, "source"_a,
           "Writes `source` (an ONNX model) with the trained values to `path`; returns the "
           "initializers replaced.")
      .def("tensors", &PyTrainer::tensors, "state"_a = false,
           "Parameters by name as NumPy arrays (copies); with state=True the optimizer's "
           "state and running statistics too.")
      .def_prop_ro("fields", &PyTrainer::fields, "[(name, dtype, batch shape)] a step takes.")
      .def_prop_ro("steps_done", [](const PyTrainer &t) { return t.trainer->stepsDone(); })
      .def_prop_ro("batch_size", [](const PyTrainer &t) { return t.trainer->batchSize(); })
      .def_prop_ro("micro_batches", [](const PyTrainer &t) { return t.trainer->microBatches(); })
      .def_prop_ro(
          "samples_per_step",
          [](const PyTrainer &t) { return t.trainer->samplesAt(t.trainer->stepsDone() + 1); })
      .def_prop_ro("device", [](const PyTrainer &t) { return t.trainer->executor().describe(); });
}
