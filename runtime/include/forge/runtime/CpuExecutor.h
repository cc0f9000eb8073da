// Runs a bundle's routines on the CPU device.
// Invariants: all tensor storage is the arena (sized by the compile-time memory
// plan), the persistent storage of PARAMETER/STATE tensors, or the bundle's
// read-only sections; run() allocates nothing. Persistent tensors keep their
// values across run() calls of any routine (training updates them in place).
#pragma once

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/Kernels.h"

namespace forge::rt {

struct CpuExecutorOptions {
  unsigned threads = 0; // 0: hardware concurrency
};

class CpuExecutor {
public:
  /// Validates that every instruction has a CPU kernel, allocates the arena
  /// and the persistent storage, and initializes parameters and state.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Bundle &bundle,
                                                       CpuExecutorOptions options = {});

  // --- routines ---------------------------------------------------------------
  int numRoutines() const { return static_cast<int>(routines_.size()); }
  /// The routine's name ("" when `routine` is out of range).
  const std::string &routineName(int routine) const;
  /// Index of the routine called `name`, or an error listing the routines.
  Expected<int> findRoutine(const std::string &name) const;
  /// Tensor indices of a routine's inputs/outputs (empty when out of range).
  const std::vector<int32_t> &inputs(int routine = 0) const;
  const std::vector<int32_t> &outputs(int routine = 0) const;
  /// Tensor index of the routine's input/output called `name`.
  Expected<int32_t> findInput(int routine, const std::string &name) const;
  Expected<int32_t> findOutput(int routine, const std::string &name) const;

  const bundle::TensorInfo &tensorInfo(int32_t index) const;
  const Bundle &bundle() const { return bundle_; }
  unsigned threads() const { return pool_.size(); }

  /// Copies `data` into the routine's input `name`; dtype and shape must
  /// match exactly. The value lives until another routine runs (the arena is
  /// shared between routines).
  Status setInput(int routine, const std::string &name, const TensorView &data);
  Status setInput(const std::string &name, const TensorView &data) {
    return setInput(0, name, data);
  }
  Status run(int routine);
  Status run() { return run(0); }
  /// View of a tensor's current storage. Arena tensors stay valid until the
  /// next run(); persistent tensors for the executor's lifetime.
  TensorView view(int32_t index) const;

  // --- persistent tensors (checkpoints, export) ------------------------------
  /// Every PARAMETER and STATE tensor, in tensor-table order.
  const std::vector<int32_t> &persistentTensors() const { return persistent_; }
  /// True when the tensor has private writable storage (every STATE tensor;
  /// a PARAMETER of a training bundle or one that some instruction writes).
  /// Other parameters are read in place from the bundle's sections.
  bool isWritable(int32_t index) const;
  /// Overwrites persistent tensor `index` with `bytes` (its exact byte size).
  /// A read-only parameter accepts only its current value.
  Status setPersistent(int32_t index, std::span<const uint8_t> bytes);

private:
  struct Routine {
    const bundle::Routine *proto;
    size_t firstOperand; // into views_
    std::vector<int32_t> inputs, outputs;
  };

  CpuExecutor(const Bundle &bundle, CpuExecutorOptions options);

  const Bundle &bundle_;
  ThreadPool pool_;
  struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], FreeDeleter> storage_;
  uint8_t *arena_ = nullptr;
  std::vector<TensorView> views_;
  std::vector<bool> writable_;
  std::vector<int32_t> persistent_;
  std::vector<Routine> routines_;
};

} // namespace forge::rt
