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
//  * A fused instruction (op "fusion") runs its body, instruction by
//    instruction; the body's LOCAL tensors live in the local area after the
//    persistent storage (Program.local_size bytes, laid out by the compiler).
//  * No exception escapes: allocation failure in create() and anything a
//    kernel throws in run() become a Status.
#include "forge/runtime/CpuExecutor.h"

#include <algorithm>
#include <chrono>
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

} // namespace

CpuExecutor::CpuExecutor(const Bundle &bundle, CpuExecutorOptions options)
    : Executor(bundle, options.routines), pool_(options.threads) {}

std::string CpuExecutor::describe() const {
  return fmt::format("cpu, {} thread{}", pool_.size(), pool_.size() == 1 ? "" : "s");
}

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Bundle &bundle,
                                                           CpuExecutorOptions options) {
  const bundle::Program &p = bundle.program();
  const std::string &origin = bundle.origin();

  // What runs: instructions, fused ones replaced by their bodies.
  std::vector<std::vector<Step>> steps(p.routines_size());
  for (int r = 0; r < p.routines_size(); ++r)
    for (int i = 0; i < p.routines(r).instructions_size(); ++i) {
      const bundle::Instruction &inst = p.routines(r).instructions(i);
      if (inst.body_size() == 0)
        steps[r].push_back({&inst, i});
      for (const bundle::Instruction &inner : inst.body())
        steps[r].push_back({&inner, i});
    }

  // Every op must have a kernel before anything is allocated; name them all.
  std::map<std::string, std::string> missing; // op -> first instruction
  for (int r = 0; r < p.routines_size(); ++r)
    for (const Step &step : steps[r])
      if (!findCpuKernel(step.inst->op()))
        missing.emplace(step.inst->op(), instLabel(p.routines(r).name(),
                                                   p.routines(r).instructions(step.index),
                                                   step.index));
  if (!missing.empty()) {
    std::string list;
    for (const auto &[op, where] : missing)
      list += fmt::format("{}'{}' (first at {})", list.empty() ? "" : ", ", op, where);
    return Status::error("{}: the CPU device has no kernel for op{} {}", origin,
                         missing.size() > 1 ? "s" : "", list);
  }

  std::unique_ptr<CpuExecutor> ex(new CpuExecutor(bundle, options));
  const std::vector<bool> &writable = ex->writable_;
  uint64_t total;
  if (!alignUpOk(p.arena_size(), total))
    return Status::error("{}: arena_size {} is too large", origin, p.arena_size());
  std::vector<uint64_t> persistentOffset(p.tensors_size(), 0);
  for (int t = 0; t < p.tensors_size(); ++t) {
    if (!writable[t] || !ex->isPresent(t)) // absent: another pipeline stage's
      continue;
    uint64_t bytes;
    persistentOffset[t] = total;
    if (!alignUpOk(byteSize(p.tensors(t)), bytes) || __builtin_add_overflow(total, bytes, &total))
      return Status::error("{}: arena plus persistent tensors overflow 64 bits", origin);
  }
  const uint64_t localOffset = total;
  if (__builtin_add_overflow(total, p.local_size(), &total))
    return Status::error("{}: arena, persistent and local tensors overflow 64 bits", origin);

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
  ex->allocated_ = total;
  uintptr_t base = reinterpret_cast<uintptr_t>(ex->storage_.get());
  ex->arena_ = ex->storage_.get() + ((kAlign - base % kAlign) % kAlign);

  size_t numOperands = 0;
  for (const std::vector<Step> &routine : steps)
    for (const Step &step : routine)
      numOperands += static_cast<size_t>(step.inst->inputs_size()) + step.inst->outputs_size();
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
      if (info.has_shard()) // the whole tensor: createExecutor loads this rank's slice
        bytes = {};
      if (!ex->isPresent(t)) {
        v.data = nullptr; // no storage: no loaded routine touches it
      } else if (writable[t]) {
        uint8_t *dst = ex->arena_ + persistentOffset[t];
        if (!bytes.empty())
          std::memcpy(dst, bytes.data(), bytes.size());
        v.data = dst;
      } else {
        // Read-only: kernels take inputs as const, and no instruction writes
        // a constant (loader) or a non-writable parameter (above).
        v.data = const_cast<uint8_t *>(bytes.data());
      }
      break;
    }
    case bundle::TensorInfo::LOCAL:
      v.data = ex->arena_ + localOffset + info.arena_offset();
      break;
    default:
      v.data = ex->arena_ + info.arena_offset();
      break;
    }
    ex->views_.push_back(std::move(v));
  }
  for (const std::vector<Step> &routine : steps) {
    ex->firstOperand_.push_back(ex->views_.size());
    for (const Step &step : routine) {
      for (int32_t t : step.inst->inputs())
        ex->views_.push_back(t < 0 ? TensorView{} : ex->views_[t]);
      for (int32_t t : step.inst->outputs())
        ex->views_.push_back(ex->views_[t]);
    }
  }
  ex->steps_ = std::move(steps);
  return ex;
}

Status CpuExecutor::run(int routine) {
  FORGE_RETURN_IF_ERROR(checkLoaded(routine));
  return runInstructions(routine, nullptr);
}

Executor::DeviceInfo CpuExecutor::deviceInfo() const {
  DeviceInfo info;
  info.planBytes = allocated_;
  return info;
}

Expected<std::vector<Executor::Span>> CpuExecutor::runProfiled(int routine) {
  FORGE_RETURN_IF_ERROR(checkLoaded(routine));
  std::vector<Span> spans;
  FORGE_RETURN_IF_ERROR(runInstructions(routine, &spans));
  return spans;
}

Status CpuExecutor::runInstructions(int routine, std::vector<Span> *spans) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto us = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - start).count();
  };
  if (routine < 0 || routine >= numRoutines())
    return Status::error("{}: no routine #{} (the bundle has {})", bundle_.origin(), routine,
                         numRoutines());
  const bundle::Routine &r = *routines_[routine];
  size_t pos = firstOperand_[routine];
  const std::vector<Step> &steps = steps_[routine];
  for (size_t k = 0; k < steps.size(); ++k) {
    const bundle::Instruction &inst = *steps[k].inst;
    const int i = steps[k].index;
    std::span<const TensorView> in(views_.data() + pos, inst.inputs_size());
    pos += inst.inputs_size();
    std::span<TensorView> out(views_.data() + pos, inst.outputs_size());
    pos += inst.outputs_size();
    Status s;
    const auto t0 = spans ? Clock::now() : start;
    try {
      s = runCpuKernel(inst, in, out, pool_);
    } catch (const std::exception &e) {
      s = Status::error("kernel threw: {}", e.what());
    } catch (...) {
      s = Status::error("kernel threw an unknown exception");
    }
    if (!s.isOk())
      return s.prefix(fmt::format("{}: routine '{}' instruction #{}", bundle_.origin(),
                                  r.name(), i));
    if (spans) {
      // A fused instruction is one span over its body's instructions.
      if (!spans->empty() && spans->back().instruction == i)
        spans->back().durationUs = us(Clock::now()) - spans->back().startUs;
      else
        spans->push_back({i, 2, "", us(t0), us(Clock::now()) - us(t0)});
    }
  }
  return Status::ok();
}

TensorView CpuExecutor::view(int32_t index) const {
  if (index < 0 || index >= bundle_.program().tensors_size())
    return {};
  return views_[index];
}

Status CpuExecutor::writePersistent(int32_t index, std::span<const uint8_t> bytes) {
  std::memcpy(views_[index].data, bytes.data(), bytes.size());
  return Status::ok();
}

} // namespace forge::rt
