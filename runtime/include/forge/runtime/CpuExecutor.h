// Runs a bundle's routines on the CPU device (Executor.h).
// Invariants: all tensor storage is the arena (sized by the compile-time memory
// plan), the persistent storage of PARAMETER/STATE tensors, or the bundle's
// read-only sections; run() allocates nothing. Instruction placements of CUDA
// bundles are ignored: every op runs its CPU kernel.
#pragma once

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forge/runtime/Executor.h"
#include "forge/runtime/Kernels.h"

namespace forge::rt {

struct CpuExecutorOptions {
  unsigned threads = 0; // 0: hardware concurrency
  std::vector<std::string> routines; // ExecutorOptions::routines (empty: all)
};

class CpuExecutor final : public Executor {
public:
  /// Validates that every instruction has a CPU kernel, allocates the arena
  /// and the persistent storage, and initializes parameters and state.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Bundle &bundle,
                                                       CpuExecutorOptions options = {});

  std::string describe() const override;
  unsigned threads() const { return pool_.size(); }
  void *inputBuffer(int32_t index) override { return views_[index].data; }
  using Executor::run;
  Status run(int routine) override;
  TensorView view(int32_t index) const override;
  DeviceInfo deviceInfo() const override;
  Expected<std::vector<Span>> runProfiled(int routine) override;

private:
  Status runInstructions(int routine, std::vector<Span> *spans);
  CpuExecutor(const Bundle &bundle, CpuExecutorOptions options);
  Status writePersistent(int32_t index, std::span<const uint8_t> bytes) override;

  ThreadPool pool_;
  struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], FreeDeleter> storage_;
  uint8_t *arena_ = nullptr;
  uint64_t allocated_ = 0; // arena, persistent and local storage (deviceInfo().planBytes)
  std::vector<TensorView> views_;
  std::vector<size_t> firstOperand_; // per routine, into views_
  /// Per routine, what runs in order: an instruction, or for a fused
  /// instruction each instruction of its body; with the index of the routine
  /// instruction it belongs to (errors and profiles name that one).
  struct Step {
    const bundle::Instruction *inst;
    int index;
  };
  std::vector<std::vector<Step>> steps_;
};

} // namespace forge::rt
