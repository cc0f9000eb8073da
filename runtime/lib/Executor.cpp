// The device-independent part of Executor (Executor.h) and the device choice.
#include "forge/runtime/Executor.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <zlib.h>
#include <cstring>

#include "forge/runtime/CpuExecutor.h"
#include "forge/runtime/Shards.h"
#ifdef FORGE_HAVE_CUDA
#include "cuda/Attention.h"
#include "cuda/CudaExecutor.h"
#include "cuda/LinearCrossEntropy.h"
#include "cuda/Matmul.h"
#endif

namespace forge::rt {

namespace {
std::string nameList(const bundle::Program &p, const std::vector<int32_t> &tensors) {
  std::string names;
  for (int32_t t : tensors)
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", p.tensors(t).name());
  return names.empty() ? "none" : names;
}
} // namespace

Executor::Executor(const Bundle &bundle, const std::vector<std::string> &routines)
    : bundle_(bundle) {
  const bundle::Program &p = bundle.program();
  for (const bundle::Routine &r : p.routines()) {
    routines_.push_back(&r);
    routineInputs_.emplace_back(r.inputs().begin(), r.inputs().end());
    routineOutputs_.emplace_back(r.outputs().begin(), r.outputs().end());
    loaded_.push_back(routines.empty() ||
                      std::find(routines.begin(), routines.end(), r.name()) != routines.end());
  }
  // Which persistent tensors get private writable storage.
  writable_.assign(p.tensors_size(), false);
  for (int t = 0; t < p.tensors_size(); ++t) {
    auto kind = p.tensors(t).kind();
    writable_[t] = kind == bundle::TensorInfo::STATE ||
                   (kind == bundle::TensorInfo::PARAMETER && p.training());
    if (kind == bundle::TensorInfo::STATE || kind == bundle::TensorInfo::PARAMETER)
      persistent_.push_back(t);
  }
  for (const bundle::Routine &r : p.routines())
    for (const bundle::Instruction &inst : r.instructions())
      for (int32_t t : inst.outputs())
        if (p.tensors(t).kind() == bundle::TensorInfo::PARAMETER)
          writable_[t] = true;
  // Low-precision copies (validated by the bundle loader: a PARAMETER of the
  // same shape exists by that name).
  for (int t = 0; t < p.tensors_size(); ++t) {
    if (p.tensors(t).copy_of().empty())
      continue;
    for (int32_t m : persistent_)
      if (p.tensors(m).kind() == bundle::TensorInfo::PARAMETER &&
          p.tensors(m).name() == p.tensors(t).copy_of())
        copies_.push_back({t, m});
  }
  // What the loaded routines touch; a parameter and its low copies go together
  // (the copy is made from the parameter).
  present_.assign(p.tensors_size(), true);
  if (!routines.empty()) {
    for (int32_t t : persistent_)
      present_[t] = false;
    for (int r = 0; r < p.routines_size(); ++r) {
      if (!loaded_[r])
        continue;
      for (const bundle::Instruction &inst : p.routines(r).instructions()) {
        for (int32_t t : inst.inputs())
          if (t >= 0)
            present_[t] = true;
        for (int32_t t : inst.outputs())
          present_[t] = true;
      }
    }
    for (auto [copy, m] : copies_)
      present_[copy] = present_[m] = present_[copy] || present_[m];
  }
}

bool Executor::isLoaded(int routine) const {
  return routine >= 0 && static_cast<size_t>(routine) < loaded_.size() && loaded_[routine];
}

bool Executor::isPresent(int32_t index) const {
  return index >= 0 && static_cast<size_t>(index) < present_.size() && present_[index];
}

std::pair<uint64_t, uint64_t> Executor::persistentBytes() const {
  uint64_t held = 0, all = 0;
  for (int32_t t : persistent_) {
    all += byteSize(tensorInfo(t));
    held += isPresent(t) ? byteSize(tensorInfo(t)) : 0;
  }
  return {held, all};
}

Status Executor::checkLoaded(int routine) const {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{} (the bundle has {})", bundle_.origin(), routine,
                         numRoutines());
  if (!isLoaded(routine))
    return Status::error("{}: routine '{}' was not loaded by this executor (it runs {})",
                         bundle_.origin(), routineName(routine), [&] {
                           std::string names;
                           for (int r = 0; r < numRoutines(); ++r)
                             if (isLoaded(r))
                               names += fmt::format("{}'{}'", names.empty() ? "" : ", ",
                                                    routineName(r));
                           return names;
                         }());
  return Status::ok();
}

bool Executor::isDerivedCopy(int32_t index) const {
  return std::any_of(copies_.begin(), copies_.end(),
                     [&](const auto &c) { return c.first == index; });
}

Status Executor::refreshCopies(int32_t master) {
  for (auto [copy, m] : copies_) {
    if ((master >= 0 && m != master) || !isPresent(copy))
      continue;
    const bundle::TensorInfo &info = tensorInfo(m);
    if (info.dtype() != bundle::F32)
      return Status::error("{}: '{}' copies parameter '{}', which is {} (f32 expected)",
                           bundle_.origin(), tensorInfo(copy).name(), info.name(),
                           dtypeName(info.dtype()));
    TensorView v = view(m);
    if (!v.data)
      return Status::error("{}: cannot read parameter '{}'", bundle_.origin(), info.name());
    std::vector<uint8_t> bytes =
        narrowFloats(static_cast<const uint8_t *>(v.data), v.bytes(), tensorInfo(copy).dtype());
    if (!bytes.empty())
      FORGE_RETURN_IF_ERROR(writePersistent(copy, bytes));
  }
  return Status::ok();
}

const std::string &Executor::routineName(int routine) const {
  static const std::string empty;
  if (routine < 0 || routine >= numRoutines())
    return empty;
  return routines_[routine]->name();
}

Expected<int> Executor::findRoutine(const std::string &name) const {
  for (int r = 0; r < numRoutines(); ++r)
    if (routines_[r]->name() == name)
      return r;
  std::string names;
  for (const bundle::Routine *r : routines_)
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", r->name());
  return Status::error("{} has no routine '{}' (routines: {})", bundle_.origin(), name,
                       names.empty() ? "none" : names);
}

const std::vector<int32_t> &Executor::inputs(int routine) const {
  static const std::vector<int32_t> empty;
  return routine >= 0 && routine < numRoutines() ? routineInputs_[routine] : empty;
}

const std::vector<int32_t> &Executor::outputs(int routine) const {
  static const std::vector<int32_t> empty;
  return routine >= 0 && routine < numRoutines() ? routineOutputs_[routine] : empty;
}

Expected<int32_t> Executor::findInput(int routine, const std::string &name) const {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{}", bundle_.origin(), routine);
  const bundle::Program &p = bundle_.program();
  for (int32_t t : routineInputs_[routine])
    if (p.tensors(t).name() == name)
      return t;
  return Status::error("'{}' is not an input of routine '{}' of {} (inputs: {})", name,
                       routineName(routine), bundle_.origin(),
                       nameList(p, routineInputs_[routine]));
}

Expected<int32_t> Executor::findOutput(int routine, const std::string &name) const {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{}", bundle_.origin(), routine);
  const bundle::Program &p = bundle_.program();
  for (int32_t t : routineOutputs_[routine])
    if (p.tensors(t).name() == name)
      return t;
  return Status::error("'{}' is not an output of routine '{}' of {} (outputs: {})", name,
                       routineName(routine), bundle_.origin(),
                       nameList(p, routineOutputs_[routine]));
}

const bundle::TensorInfo &Executor::tensorInfo(int32_t index) const {
  return bundle_.program().tensors(index);
}

namespace {
void freeAligned(void *p) { std::free(p); }
} // namespace

Expected<Executor::HostBuffer> Executor::allocateHostBuffer(size_t bytes,
                                                            const std::string &what) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void *p = std::aligned_alloc(64, rounded);
  if (!p)
    return Status::error("cannot allocate {} bytes of host memory for {}", bytes, what);
  return HostBuffer(p, HostFree{freeAligned});
}

Status Executor::bindInput(int32_t index, const void *host) {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return Status::error("{}: no tensor #{}", bundle_.origin(), index);
  void *dst = inputBuffer(index);
  if (!dst)
    return Status::error("{}: tensor '{}' is not a routine input", bundle_.origin(),
                         tensorInfo(index).name());
  if (host && host != dst)
    std::memcpy(dst, host, byteSize(tensorInfo(index)));
  return Status::ok();
}

Status Executor::bindDeviceInput(int32_t index, const void *device) {
  (void)index;
  (void)device;
  return Status::error("{}: this device ({}) reads inputs from host memory only", bundle_.origin(),
                       describe());
}

Status Executor::bindEncodedInput(int32_t index, const uint32_t *lengths) {
  (void)index;
  if (!lengths)
    return Status::ok();
  return Status::error("{}: this device ({}) decodes no images", bundle_.origin(), describe());
}

Expected<std::string> Executor::imageDecoder() {
  return Status::error("this device ({}) decodes no images", describe());
}

Status Executor::setInput(int routine, const std::string &name, const TensorView &data) {
  auto t = findInput(routine, name);
  if (!t)
    return t.status();
  const bundle::TensorInfo &info = tensorInfo(*t);
  if (data.dtype != info.dtype())
    return Status::error("input '{}': got dtype {}, the bundle expects {}", name,
                         dtypeName(data.dtype), dtypeName(info.dtype()));
  if (!std::equal(data.shape.begin(), data.shape.end(), info.shape().begin(), info.shape().end()))
    return Status::error("input '{}': got shape {}, the bundle expects {}", name,
                         shapeString(data.shape),
                         shapeString({info.shape().begin(), info.shape().end()}));
  size_t bytes = data.bytes();
  if (bytes > 0) {
    if (!data.data)
      return Status::error("input '{}': no data", name);
    FORGE_RETURN_IF_ERROR(waitInputsConsumed());
    std::memcpy(inputBuffer(*t), data.data, bytes);
  }
  return Status::ok();
}

bool Executor::isWritable(int32_t index) const {
  return index >= 0 && static_cast<size_t>(index) < writable_.size() && writable_[index];
}

Status Executor::setPersistent(int32_t index, std::span<const uint8_t> bytes) {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return Status::error("{}: no tensor #{}", bundle_.origin(), index);
  const bundle::TensorInfo &info = tensorInfo(index);
  if (info.kind() != bundle::TensorInfo::PARAMETER && info.kind() != bundle::TensorInfo::STATE)
    return Status::error("{}: tensor '{}' is not a parameter or state tensor", bundle_.origin(),
                         info.name());
  if (!isPresent(index))
    return Status::error("{}: tensor '{}' is not held here (none of this executor's routines "
                         "uses it: another pipeline stage's)",
                         bundle_.origin(), info.name());
  std::vector<int64_t> shape = canonicalShape(info);
  size_t expected = static_cast<size_t>(numElements(shape)) * dtypeSize(info.dtype());
  if (bytes.size() != expected)
    return Status::error("{}: tensor '{}' has {} bytes ({} {}), got {}", bundle_.origin(),
                         info.name(), expected, dtypeName(info.dtype()), shapeString(shape),
                         bytes.size());
  if (bytes.empty())
    return Status::ok();
  // Stored permuted (TensorInfo.layout_perm): the canonical bytes transposed.
  std::vector<uint8_t> stored;
  if (info.layout_perm_size() > 0) {
    stored = transposeBytes(bytes, shape,
                            std::span<const int64_t>(info.layout_perm().data(),
                                                     static_cast<size_t>(info.layout_perm_size())),
                            dtypeSize(info.dtype()));
    bytes = stored;
  }
  if (!writable_[index]) {
    TensorView v = view(index);
    if (std::memcmp(v.data, bytes.data(), bytes.size()) != 0)
      return Status::error("{}: parameter '{}' is read-only in this bundle and cannot take a "
                           "different value",
                           bundle_.origin(), info.name());
    return Status::ok();
  }
  FORGE_RETURN_IF_ERROR(writePersistent(index, bytes));
  return refreshCopies(index);
}

std::vector<std::string> externalParameters(const Bundle &bundle) {
  std::vector<std::string> names;
  for (const bundle::TensorInfo &t : bundle.program().tensors())
    if (t.has_external())
      names.push_back(t.name());
  return names;
}

Status loadExternalWeights(Executor &ex, const std::string &dir) {
  const bundle::Program &p = ex.bundle().program();
  std::vector<uint8_t> bytes;
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = p.tensors(t);
    if (!info.has_external() || !ex.isPresent(t)) // another pipeline stage's
      continue;
    const bundle::ExternalData &e = info.external();
    // As forgec required: a relative path that stays inside the weights
    // directory, symlinks resolved (the bundle may have been edited).
    if (e.location().empty() || e.location().front() == '/' ||
        e.location().find("..") != std::string::npos)
      return Status::error("parameter '{}': weights location '{}' is not a relative path inside "
                           "the weights directory",
                           info.name(), e.location());
    std::string path = dir.empty() ? e.location() : dir + "/" + e.location();
    {
      std::error_code ec1, ec2;
      auto realFile = std::filesystem::canonical(path, ec1);
      auto realDir = std::filesystem::canonical(dir.empty() ? "." : dir, ec2);
      if (!ec1 && !ec2) {
        std::string f = realFile.string(), d = realDir.string() + "/";
        if (f.compare(0, d.size(), d) != 0)
          return Status::error("parameter '{}': weights file {} resolves to {}, outside the "
                               "weights directory {}",
                               info.name(), path, f, realDir.string());
      }
    }
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return Status::error("parameter '{}': cannot open its weights file {} ({})", info.name(),
                           path, std::strerror(errno));
    in.seekg(0, std::ios::end);
    uint64_t size = static_cast<uint64_t>(in.tellg());
    if (e.offset() > size || size - e.offset() < e.length())
      return Status::error("parameter '{}': bytes [{}, +{}) lie outside {} ({} bytes); is it the "
                           "weights file this bundle was compiled against?",
                           info.name(), e.offset(), e.length(), path, size);
    bytes.resize(e.length());
    in.seekg(static_cast<std::streamoff>(e.offset()));
    if (!in.read(reinterpret_cast<char *>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
      return Status::error("parameter '{}': cannot read {} bytes at offset {} of {}", info.name(),
                           e.length(), e.offset(), path);
    if (e.has_crc32()) {
      uint32_t crc = static_cast<uint32_t>(
          ::crc32_z(::crc32_z(0L, Z_NULL, 0), bytes.data(), bytes.size()));
      if (crc != e.crc32())
        return Status::error("parameter '{}': the bytes at offset {} of {} have CRC-32 {:08x}, the "
                             "bundle was compiled against {:08x}: a different weights file",
                             info.name(), e.offset(), path, crc, e.crc32());
    }
    if (info.has_shard()) { // the whole tensor: this rank's slice
      auto index = shardIndex(info);
      if (!index)
        return index.status();
      bytes = sliceShard(info, bytes, *index);
    }
    FORGE_RETURN_IF_ERROR(ex.setPersistent(t, bytes).prefix(fmt::format("parameter '{}'",
                                                                          info.name())));
  }
  return Status::ok();
}

bool cudaAvailable() {
#ifdef FORGE_HAVE_CUDA
  return cudaDeviceCount() > 0;
#else
  return false;
#endif
}

Status checkLibraryCalls(const Bundle &bundle) {
#ifdef FORGE_HAVE_CUDA
  const bundle::Program &p = bundle.program();
  for (const bundle::Routine &r : p.routines())
    for (int i = 0; i < r.instructions_size(); ++i) {
      const bundle::Instruction &inst = r.instructions(i);
      if (inst.placement() != bundle::LIBRARY)
        continue;
      Status st;
      if (cuda::isAttentionOp(inst.op()))
        st = cuda::checkAttention(p, inst);
      else if (inst.op() == "matmul" || inst.op() == "gemm" || inst.has_matmul())
        st = cuda::matmulProblem(p, inst, false).status();
      else if (inst.op() == "linear_cross_entropy_with_grad")
        st = cuda::linearCrossEntropyProblem(p, inst).status();
      if (!st.isOk())
        return st.prefix(fmt::format("routine '{}' instruction #{} '{}' (op {})", r.name(), i,
                                     inst.name(), inst.op()));
    }
  return Status::ok();
#else
  (void)bundle;
  return Status::error("this build has no CUDA device: its library calls cannot be checked");
#endif
}

namespace {
/// Split parameters (forgec --tp): this rank's slice of each whole initial value
/// the bundle holds (thin bundles: loadExternalWeights slices).
Status loadShards(Executor &ex) {
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    if (!info.has_shard() || !ex.isPresent(t))
      continue;
    auto index = shardIndex(info);
    if (!index)
      return index.status().prefix(ex.bundle().origin());
    std::span<const uint8_t> whole = ex.bundle().tensorData(info);
    if (whole.empty())
      continue; // zero-initialized state, or external data
    FORGE_RETURN_IF_ERROR(ex.setPersistent(t, sliceShard(info, whole, *index)));
  }
  return Status::ok();
}
} // namespace

double Executor::densePeakFlops(const std::string &precision, bool tf32, int cc, int sms,
                                double clockHz) {
  if (cc != 80 && cc != 89 && cc != 90)
    return 0; // rates not known here (sm_86's, Blackwell's differ): no MFU
  const double fp32 = 2.0 * (cc == 80 ? 64 : 128) * sms * clockHz;
  const bool ada = cc == 89;
  if (precision == "fp8" && cc >= 89)
    return fp32 * (ada ? 8 : 32);
  if (precision == "bf16" || precision == "fp16" || precision == "fp8")
    return fp32 * (ada ? 4 : 16);
  if (tf32)
    return fp32 * (ada ? 2 : 8);
  return fp32;
}

Expected<std::unique_ptr<Executor>> createExecutor(const Bundle &bundle,
                                                   const ExecutorOptions &options) {
  const std::string &target = bundle.program().target();
  bool cudaBundle = target.rfind("cuda:", 0) == 0;
  std::string device = options.device;
  if (device == "auto")
    device = cudaBundle && cudaAvailable() ? "cuda" : "cpu";
  for (const std::string &name : options.routines)
    if (std::none_of(bundle.program().routines().begin(), bundle.program().routines().end(),
                     [&](const bundle::Routine &r) { return r.name() == name; }))
      return Status::error("{} has no routine '{}' to load", bundle.origin(), name);
  if (device == "cpu") {
    auto ex = CpuExecutor::create(bundle, CpuExecutorOptions{options.threads, options.routines});
    if (!ex)
      return ex.status();
    FORGE_RETURN_IF_ERROR(loadShards(**ex));
    FORGE_RETURN_IF_ERROR((*ex)->refreshCopies());
    return std::unique_ptr<Executor>(ex.take());
  }
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      auto [end, ec] = std::from_chars(device.data() + 5, device.data() + device.size(), index);
      if (ec != std::errc() || end != device.data() + device.size() || index < 0)
        return Status::error("--device '{}': expected cuda or cuda:N", device);
    }
    if (!cudaBundle)
      return Status::error("{} was compiled for target '{}'; recompile it with forgec --target "
                           "cuda:sm_90 (or sm_80, sm_89) to run it on a GPU",
                           bundle.origin(), target);
#ifdef FORGE_HAVE_CUDA
    auto ex = CudaExecutor::create(bundle, CudaExecutorOptions{index, options.threads,
                                                               options.cudaGraphs,
                                                               options.deterministicAttention,
                                                               options.routines});
    if (!ex)
      return ex.status();
    FORGE_RETURN_IF_ERROR(loadShards(**ex));
    FORGE_RETURN_IF_ERROR((*ex)->refreshCopies());
    return std::unique_ptr<Executor>(ex.take());
#else
    return Status::error("this build of Forge has no CUDA device (configure with the CUDA "
                         "toolkit installed)");
#endif
  }
  return Status::error("unknown device '{}' (cpu, cuda, cuda:N, auto)", device);
}

} // namespace forge::rt
