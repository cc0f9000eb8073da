// Runs a bundle's instruction list on the CPU device.
// Invariant: all tensor storage is the arena (sized by the compile-time memory
// plan) or the bundle's read-only sections; run() allocates nothing.
#pragma once

#include <memory>
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
  /// Validates that every instruction has a CPU kernel and allocates the arena.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Bundle &bundle,
                                                       CpuExecutorOptions options = {});

  const std::vector<int32_t> &inputs() const { return inputs_; }
  const std::vector<int32_t> &outputs() const { return outputs_; }
  const bundle::TensorInfo &tensorInfo(int32_t index) const;

  /// Copies `data` into input `name`; dtype and shape must match exactly.
  Status setInput(const std::string &name, const TensorView &data);
  Status run();
  /// View of a tensor's current storage (valid until the next run()).
  TensorView view(int32_t index) const;

private:
  CpuExecutor(const Bundle &bundle, CpuExecutorOptions options);

  const Bundle &bundle_;
  ThreadPool pool_;
  std::vector<uint8_t, std::allocator<uint8_t>> arenaStorage_;
  uint8_t *arena_ = nullptr;
  std::vector<TensorView> views_;
  std::vector<int32_t> inputs_, outputs_;
};

} // namespace forge::rt
