// Runs a CUDA bundle's routines on one NVIDIA GPU (Executor.h; ../shared/DESIGN.md §7).
// No CUDA header leaks out of this file: the state lives in Impl.
//
// Invariants:
//  * One cudaMalloc holds everything the device reads or writes: the arena
//    (the compile-time memory plan), every PARAMETER/STATE/CONSTANT tensor and
//    the cuBLASLt workspace. Pinned host buffers: one per routine input
//    (inputBuffer), one per routine output (read back after each run) and one
//    per operand of a HOST instruction. Nothing is allocated by run().
//  * Streams: instructions run in order on the compute stream; the copy
//    stream moves routine inputs in and outputs out, ordered against compute
//    by events only where data flows.
//  * The first run() of a routine launches instruction by instruction and
//    synchronizes after each, so an error names the instruction, its op and
//    kernel. Later runs replay a CUDA graph captured on the second run (unless
//    graphs are disabled).
//  * run() returns once the step is enqueued, without waiting for the previous
//    run: routine outputs are read back into one of two pinned buffer sets,
//    alternating by run, so the previous run's outputs stay readable
//    (routineOutput) while the next run proceeds. view() of a routine output
//    waits for the last run's read-back; view() of anything else synchronizes
//    and copies.
#pragma once

#include <memory>

#include "forge/runtime/Executor.h"

namespace forge::rt {

/// GPUs visible to this process (0 without a driver or device).
int cudaDeviceCount();

struct CudaExecutorOptions {
  int device = 0;
  unsigned threads = 0; // CPU threads for HOST instructions
  bool graphs = true;
  bool deterministicAttention = false; // ExecutorOptions::deterministicAttention
  std::vector<std::string> routines;   // ExecutorOptions::routines (empty: all)
};

class CudaExecutor final : public Executor {
public:
  static Expected<std::unique_ptr<CudaExecutor>> create(const Bundle &bundle,
                                                        CudaExecutorOptions options);
  ~CudaExecutor() override;

  std::string describe() const override;
  void *inputBuffer(int32_t index) override;
  Expected<HostBuffer> allocateHostBuffer(size_t bytes, const std::string &what) override;
  Status bindInput(int32_t index, const void *host) override;
  Status bindDeviceInput(int32_t index, const void *device) override;
  Status bindEncodedInput(int32_t index, const uint32_t *lengths) override;
  Expected<std::string> imageDecoder() override;
  using Executor::run;
  Status run(int routine) override;
  Status wait() override;
  bool canPipeline() const override { return true; }
  Status waitInputsConsumed() override;
  uint64_t runsIssued() const override;
  std::optional<double> idleBefore(uint64_t run) override;
  Expected<TensorView> routineOutput(int32_t index, int runsAgo) override;
  TensorView view(int32_t index) const override;
  DeviceInfo deviceInfo() const override;
  Telemetry telemetry() override;
  Expected<std::vector<Span>> runProfiled(int routine) override;

  struct Impl;

private:
  CudaExecutor(const Bundle &bundle, const std::vector<std::string> &routines);
  Status writePersistent(int32_t index, std::span<const uint8_t> bytes) override;

  std::unique_ptr<Impl> impl_;
};

} // namespace forge::rt
