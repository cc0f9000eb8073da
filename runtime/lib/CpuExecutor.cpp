// Runs a bundle's instruction list on the CPU (CpuExecutor.h).
//
// Invariants:
//  * The Bundle outlives the executor; its tensor table was validated by the
//    loader, so every index and byte range used here is in bounds.
//  * One 64-byte-aligned allocation holds the arena (arena_size bytes, laid
//    out by the compile-time memory plan) followed by writable copies of the
//    PARAMETER tensors that some instruction writes (the bundle's sections
//    are read-only, possibly mmap'd). CONSTANTs and read-only parameters
//    point straight into the bundle's sections.
//  * views_ holds, first, one TensorView per tensor, then, per instruction in
//    order, the views of its inputs (a default view for an absent optional
//    operand) followed by its outputs. run() walks that table with spans and
//    so allocates nothing and copies no shapes.
//  * No exception escapes: allocation failure in create() and anything a
//    kernel throws in run() become a Status.
#include "forge/runtime/CpuExecutor.h"

#include <cstring>
#include <exception>
#include <map>

namespace forge::rt {

namespace {
constexpr uint64_t kAlign = 64;

bool alignUpOk(uint64_t v, uint64_t &out) {
  if (__builtin_add_overflow(v, kAlign - 1, &out))
    return false;
  out = out / kAlign * kAlign;
  return true;
}

std::string instLabel(const bundle::Instruction &inst, int index) {
  return inst.name().empty() ? fmt::format("instruction #{}", index)
                             : fmt::format("instruction #{} '{}'", index, inst.name());
}
} // namespace

CpuExecutor::CpuExecutor(const Bundle &bundle, CpuExecutorOptions options)
    : bundle_(bundle), pool_(options.threads) {}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Bundle &bundle,
                                                           CpuExecutorOptions options) {
  const bundle::Program &p = bundle.program();
  const std::string &origin = bundle.origin();

  // Every op must have a kernel before anything is allocated; name them all.
  std::map<std::string, int> missing; // op -> first instruction
  for (int i = 0; i < p.instructions_size(); ++i)
    if (!findCpuKernel(p.instructions(i).op()))
      missing.emplace(p.instructions(i).op(), i);
  if (!missing.empty()) {
    std::string list;
    for (const auto &[op, i] : missing)
      list += fmt::format("{}'{}' (first at {})", list.empty() ? "" : ", ", op,
                          instLabel(p.instructions(i), i));
    return Status::error("{}: the CPU device has no kernel for op{} {}", origin,
                         missing.size() > 1 ? "s" : "", list);
  }

  // Parameters that some instruction writes need a writable copy.
  std::vector<bool> writable(p.tensors_size(), false);
  for (const bundle::Instruction &inst : p.instructions())
    for (int32_t t : inst.outputs())
      if (p.tensors(t).kind() == bundle::TensorInfo::PARAMETER)
        writable[t] = true;

  uint64_t total;
  if (!alignUpOk(p.arena_size(), total))
    return Status::error("{}: arena_size {} is too large", origin, p.arena_size());
  std::vector<uint64_t> paramOffset(p.tensors_size(), 0);
  for (int t = 0; t < p.tensors_size(); ++t) {
    if (!writable[t])
      continue;
    uint64_t bytes;
    paramOffset[t] = total;
    if (!alignUpOk(p.tensors(t).data_size(), bytes) || __builtin_add_overflow(total, bytes, &total))
      return Status::error("{}: arena plus writable parameters overflow 64 bits", origin);
  }

  std::unique_ptr<CpuExecutor> ex(new CpuExecutor(bundle, options));
  try {
    // Over-allocate so the arena can start on a 64-byte boundary; the
    // storage is zero-filled, so uninitialized reads are at least repeatable.
    uint64_t alloc;
    if (__builtin_add_overflow(total, kAlign, &alloc) || alloc > SIZE_MAX / 2)
      throw std::bad_alloc();
    ex->arenaStorage_.resize(static_cast<size_t>(alloc));
  } catch (const std::exception &) {
    return Status::error("{}: cannot allocate the {}-byte arena (arena_size {})", origin, total,
                         p.arena_size());
  }
  uintptr_t base = reinterpret_cast<uintptr_t>(ex->arenaStorage_.data());
  ex->arena_ = ex->arenaStorage_.data() + ((kAlign - base % kAlign) % kAlign);

  size_t numOperands = 0;
  for (const bundle::Instruction &inst : p.instructions())
    numOperands += static_cast<size_t>(inst.inputs_size()) + inst.outputs_size();
  ex->views_.reserve(p.tensors_size() + numOperands);
  for (int t = 0; t < p.tensors_size(); ++t) {
    const bundle::TensorInfo &info = p.tensors(t);
    TensorView v;
    v.dtype = info.dtype();
    v.shape.assign(info.shape().begin(), info.shape().end());
    switch (info.kind()) {
    case bundle::TensorInfo::CONSTANT:
    case bundle::TensorInfo::PARAMETER: {
      std::span<const uint8_t> bytes = bundle.tensorData(info);
      if (writable[t]) {
        uint8_t *dst = ex->arena_ + paramOffset[t];
        if (!bytes.empty())
          std::memcpy(dst, bytes.data(), bytes.size());
        v.data = dst;
      } else {
        // Read-only: kernels take inputs as const, and the loader refused
        // instructions that write constants.
        v.data = const_cast<uint8_t *>(bytes.data());
      }
      break;
    }
    default:
      v.data = ex->arena_ + info.arena_offset();
      break;
    }
    ex->views_.push_back(std::move(v));
  }
  for (const bundle::Instruction &inst : p.instructions()) {
    for (int32_t t : inst.inputs())
      ex->views_.push_back(t < 0 ? TensorView{} : ex->views_[t]);
    for (int32_t t : inst.outputs())
      ex->views_.push_back(ex->views_[t]);
  }
  ex->inputs_.assign(p.inputs().begin(), p.inputs().end());
  ex->outputs_.assign(p.outputs().begin(), p.outputs().end());
  return ex;
}

const bundle::TensorInfo &CpuExecutor::tensorInfo(int32_t index) const {
  return bundle_.program().tensors(index);
}

Status CpuExecutor::setInput(const std::string &name, const TensorView &data) {
  const bundle::Program &p = bundle_.program();
  for (int32_t t : inputs_) {
    const bundle::TensorInfo &info = p.tensors(t);
    if (info.name() != name)
      continue;
    if (data.dtype != info.dtype())
      return Status::error("input '{}': got dtype {}, the bundle expects {}", name,
                           dtypeName(data.dtype), dtypeName(info.dtype()));
    if (!std::equal(data.shape.begin(), data.shape.end(), info.shape().begin(), info.shape().end()))
      return Status::error("input '{}': got shape {}, the bundle expects {}", name,
                           shapeString(data.shape),
                           shapeString({info.shape().begin(), info.shape().end()}));
    size_t bytes = views_[t].bytes();
    if (bytes > 0) {
      if (!data.data)
        return Status::error("input '{}': no data", name);
      std::memcpy(views_[t].data, data.data, bytes);
    }
    return Status::ok();
  }
  std::string names;
  for (int32_t t : inputs_)
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", p.tensors(t).name());
  return Status::error("'{}' is not an input of {} (inputs: {})", name, bundle_.origin(),
                       names.empty() ? "none" : names);
}

Status CpuExecutor::run() {
  const bundle::Program &p = bundle_.program();
  size_t pos = static_cast<size_t>(p.tensors_size());
  for (int i = 0; i < p.instructions_size(); ++i) {
    const bundle::Instruction &inst = p.instructions(i);
    std::span<const TensorView> in(views_.data() + pos, inst.inputs_size());
    pos += inst.inputs_size();
    std::span<TensorView> out(views_.data() + pos, inst.outputs_size());
    pos += inst.outputs_size();
    Status s;
    try {
      s = runCpuKernel(inst, in, out, pool_);
    } catch (const std::exception &e) {
      s = Status::error("kernel threw: {}", e.what());
    } catch (...) {
      s = Status::error("kernel threw an unknown exception");
    }
    if (!s.isOk())
      return s.prefix(fmt::format("{}: instruction #{}", bundle_.origin(), i));
  }
  return Status::ok();
}

TensorView CpuExecutor::view(int32_t index) const {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return {};
  return views_[index];
}

} // namespace forge::rt
