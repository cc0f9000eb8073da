// Runs a bundle's routines on the CPU (CpuExecutor.h).
//
// Invariants:
//  * The Bundle outlives the executor; its tensor table and routines were
//    validated by the loader, so every index and byte range used here is in
//    bounds.
//  * One 64-byte-aligned allocation holds the arena (arena_size bytes, laid
//    out by the compile-time memory plan and shared by all routines, which run
//    one at a time) followed by the persistent storage: a writable copy of
//    every STATE tensor (its section bytes, or zeros) and of every PARAMETER
//    that is writable (training bundles, or written by some instruction),
//    initialized from its section bytes. Nothing else ever writes persistent
//    storage, so parameter and state updates survive across run() calls.
//    CONSTANTs and read-only parameters point straight into the bundle's
//    (read-only, possibly mmap'd) sections.
//  * views_ holds, first, one TensorView per tensor, then, per routine and
//    per instruction in order, the views of its inputs (a default view for an
//    absent optional operand) followed by its outputs. run() walks that table
//    with spans and so allocates nothing and copies no shapes.
//  * No exception escapes: allocation failure in create() and anything a
//    kernel throws in run() become a Status.
#include "forge/runtime/CpuExecutor.h"

#include <algorithm>
#include <cstdlib>
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

std::string instLabel(const std::string &routine, const bundle::Instruction &inst, int index) {
  return inst.name().empty()
             ? fmt::format("routine '{}' instruction #{}", routine, index)
             : fmt::format("routine '{}' instruction #{} '{}'", routine, index, inst.name());
}

uint64_t byteSize(const bundle::TensorInfo &t) {
  // Validated by the loader: no overflow.
  return static_cast<uint64_t>(numElements({t.shape().begin(), t.shape().end()})) *
         dtypeSize(t.dtype());
}

std::string nameList(const bundle::Program &p, const std::vector<int32_t> &tensors) {
  std::string names;
  for (int32_t t : tensors)
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", p.tensors(t).name());
  return names.empty() ? "none" : names;
}
} // namespace

CpuExecutor::CpuExecutor(const Bundle &bundle, CpuExecutorOptions options)
    : bundle_(bundle), pool_(options.threads) {}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Bundle &bundle,
                                                           CpuExecutorOptions options) {
  const bundle::Program &p = bundle.program();
  const std::string &origin = bundle.origin();

  // Every op must have a kernel before anything is allocated; name them all.
  std::map<std::string, std::string> missing; // op -> first instruction
  for (const bundle::Routine &r : p.routines())
    for (int i = 0; i < r.instructions_size(); ++i)
      if (!findCpuKernel(r.instructions(i).op()))
        missing.emplace(r.instructions(i).op(), instLabel(r.name(), r.instructions(i), i));
  if (!missing.empty()) {
    std::string list;
    for (const auto &[op, where] : missing)
      list += fmt::format("{}'{}' (first at {})", list.empty() ? "" : ", ", op, where);
    return Status::error("{}: the CPU device has no kernel for op{} {}", origin,
                         missing.size() > 1 ? "s" : "", list);
  }

  // Which persistent tensors get private writable storage.
  std::vector<bool> writable(p.tensors_size(), false);
  for (int t = 0; t < p.tensors_size(); ++t) {
    auto kind = p.tensors(t).kind();
    writable[t] = kind == bundle::TensorInfo::STATE ||
                  (kind == bundle::TensorInfo::PARAMETER && p.training());
  }
  for (const bundle::Routine &r : p.routines())
    for (const bundle::Instruction &inst : r.instructions())
      for (int32_t t : inst.outputs())
        if (p.tensors(t).kind() == bundle::TensorInfo::PARAMETER)
          writable[t] = true;

  uint64_t total;
  if (!alignUpOk(p.arena_size(), total))
    return Status::error("{}: arena_size {} is too large", origin, p.arena_size());
  std::vector<uint64_t> persistentOffset(p.tensors_size(), 0);
  for (int t = 0; t < p.tensors_size(); ++t) {
    if (!writable[t])
      continue;
    uint64_t bytes;
    persistentOffset[t] = total;
    if (!alignUpOk(byteSize(p.tensors(t)), bytes) || __builtin_add_overflow(total, bytes, &total))
      return Status::error("{}: arena plus persistent tensors overflow 64 bits", origin);
  }

  std::unique_ptr<CpuExecutor> ex(new CpuExecutor(bundle, options));
  // Over-allocate so the arena can start on a 64-byte boundary. calloc gives
  // zeroed storage (uninitialized reads are at least repeatable, and
  // zero-initialized STATE needs no pass) without touching fresh pages.
  uint64_t alloc;
  if (!__builtin_add_overflow(total, kAlign, &alloc) && alloc <= SIZE_MAX / 2)
    ex->storage_.reset(static_cast<uint8_t *>(std::calloc(static_cast<size_t>(alloc), 1)));
  if (!ex->storage_)
    return Status::error("{}: cannot allocate {} bytes for the arena (arena_size {}) and the "
                         "persistent tensors",
                         origin, total, p.arena_size());
  uintptr_t base = reinterpret_cast<uintptr_t>(ex->storage_.get());
  ex->arena_ = ex->storage_.get() + ((kAlign - base % kAlign) % kAlign);
  ex->writable_ = writable;

  size_t numOperands = 0;
  for (const bundle::Routine &r : p.routines())
    for (const bundle::Instruction &inst : r.instructions())
      numOperands += static_cast<size_t>(inst.inputs_size()) + inst.outputs_size();
  ex->views_.reserve(p.tensors_size() + numOperands);
  for (int t = 0; t < p.tensors_size(); ++t) {
    const bundle::TensorInfo &info = p.tensors(t);
    TensorView v;
    v.dtype = info.dtype();
    v.shape.assign(info.shape().begin(), info.shape().end());
    switch (info.kind()) {
    case bundle::TensorInfo::CONSTANT:
    case bundle::TensorInfo::PARAMETER:
    case bundle::TensorInfo::STATE: {
      std::span<const uint8_t> bytes = bundle.tensorData(info);
      if (writable[t]) {
        uint8_t *dst = ex->arena_ + persistentOffset[t];
        if (!bytes.empty())
          std::memcpy(dst, bytes.data(), bytes.size());
        v.data = dst;
      } else {
        // Read-only: kernels take inputs as const, and no instruction writes
        // a constant (loader) or a non-writable parameter (above).
        v.data = const_cast<uint8_t *>(bytes.data());
      }
      if (info.kind() != bundle::TensorInfo::CONSTANT)
        ex->persistent_.push_back(t);
      break;
    }
    default:
      v.data = ex->arena_ + info.arena_offset();
      break;
    }
    ex->views_.push_back(std::move(v));
  }
  for (const bundle::Routine &r : p.routines()) {
    Routine routine{&r, ex->views_.size(), {r.inputs().begin(), r.inputs().end()},
                    {r.outputs().begin(), r.outputs().end()}};
    for (const bundle::Instruction &inst : r.instructions()) {
      for (int32_t t : inst.inputs())
        ex->views_.push_back(t < 0 ? TensorView{} : ex->views_[t]);
      for (int32_t t : inst.outputs())
        ex->views_.push_back(ex->views_[t]);
    }
    ex->routines_.push_back(std::move(routine));
  }
  return ex;
}

const std::string &CpuExecutor::routineName(int routine) const {
  static const std::string empty;
  if (routine < 0 || routine >= numRoutines())
    return empty;
  return routines_[routine].proto->name();
}

Expected<int> CpuExecutor::findRoutine(const std::string &name) const {
  for (int r = 0; r < numRoutines(); ++r)
    if (routines_[r].proto->name() == name)
      return r;
  std::string names;
  for (const Routine &r : routines_)
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", r.proto->name());
  return Status::error("{} has no routine '{}' (routines: {})", bundle_.origin(), name,
                       names.empty() ? "none" : names);
}

const std::vector<int32_t> &CpuExecutor::inputs(int routine) const {
  static const std::vector<int32_t> empty;
  return routine >= 0 && routine < numRoutines() ? routines_[routine].inputs : empty;
}

const std::vector<int32_t> &CpuExecutor::outputs(int routine) const {
  static const std::vector<int32_t> empty;
  return routine >= 0 && routine < numRoutines() ? routines_[routine].outputs : empty;
}

Expected<int32_t> CpuExecutor::findInput(int routine, const std::string &name) const {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{}", bundle_.origin(), routine);
  const bundle::Program &p = bundle_.program();
  for (int32_t t : routines_[routine].inputs)
    if (p.tensors(t).name() == name)
      return t;
  return Status::error("'{}' is not an input of routine '{}' of {} (inputs: {})", name,
                       routineName(routine), bundle_.origin(),
                       nameList(p, routines_[routine].inputs));
}

Expected<int32_t> CpuExecutor::findOutput(int routine, const std::string &name) const {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{}", bundle_.origin(), routine);
  const bundle::Program &p = bundle_.program();
  for (int32_t t : routines_[routine].outputs)
    if (p.tensors(t).name() == name)
      return t;
  return Status::error("'{}' is not an output of routine '{}' of {} (outputs: {})", name,
                       routineName(routine), bundle_.origin(),
                       nameList(p, routines_[routine].outputs));
}

const bundle::TensorInfo &CpuExecutor::tensorInfo(int32_t index) const {
  return bundle_.program().tensors(index);
}

Status CpuExecutor::setInput(int routine, const std::string &name, const TensorView &data) {
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
  size_t bytes = views_[*t].bytes();
  if (bytes > 0) {
    if (!data.data)
      return Status::error("input '{}': no data", name);
    std::memcpy(views_[*t].data, data.data, bytes);
  }
  return Status::ok();
}

Status CpuExecutor::run(int routine) {
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{} (the bundle has {})", bundle_.origin(), routine,
                         numRoutines());
  const Routine &r = routines_[routine];
  size_t pos = r.firstOperand;
  for (int i = 0; i < r.proto->instructions_size(); ++i) {
    const bundle::Instruction &inst = r.proto->instructions(i);
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
      return s.prefix(fmt::format("{}: routine '{}' instruction #{}", bundle_.origin(),
                                  r.proto->name(), i));
  }
  return Status::ok();
}

TensorView CpuExecutor::view(int32_t index) const {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return {};
  return views_[index];
}

bool CpuExecutor::isWritable(int32_t index) const {
  return index >= 0 && static_cast<size_t>(index) < writable_.size() && writable_[index];
}

Status CpuExecutor::setPersistent(int32_t index, std::span<const uint8_t> bytes) {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return Status::error("{}: no tensor #{}", bundle_.origin(), index);
  const bundle::TensorInfo &info = tensorInfo(index);
  if (info.kind() != bundle::TensorInfo::PARAMETER && info.kind() != bundle::TensorInfo::STATE)
    return Status::error("{}: tensor '{}' is not a parameter or state tensor", bundle_.origin(),
                         info.name());
  const TensorView &v = views_[index];
  if (bytes.size() != v.bytes())
    return Status::error("{}: tensor '{}' has {} bytes ({} {}), got {}", bundle_.origin(),
                         info.name(), v.bytes(), dtypeName(v.dtype), shapeString(v.shape),
                         bytes.size());
  if (bytes.empty())
    return Status::ok();
  if (!writable_[index]) {
    if (std::memcmp(v.data, bytes.data(), bytes.size()) != 0)
      return Status::error("{}: parameter '{}' is read-only in this bundle and cannot take a "
                           "different value",
                           bundle_.origin(), info.name());
    return Status::ok();
  }
  std::memcpy(v.data, bytes.data(), bytes.size());
  return Status::ok();
}

} // namespace forge::rt
