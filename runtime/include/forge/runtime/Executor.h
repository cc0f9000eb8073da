// The device interface (../shared/DESIGN.md §7): runs a bundle's routines on one device
// (CpuExecutor, CudaExecutor) behind one API, so the trainer, checkpoints and
// export do not care where the step runs.
//
// Invariants shared by every device:
//  * create() validates and allocates everything; run() allocates nothing.
//  * PARAMETER and STATE tensors persist across run() calls of any routine.
//  * inputBuffer(t) is host memory the next run() reads routine input t from
//    (the CPU arena itself, or a pinned staging buffer on CUDA).
//  * view(t) is host memory holding tensor t's current value; on a GPU it
//    waits for the device and copies back first. Arena tensors stay valid until
//    the next run(); persistent tensors until they are next written.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

class Executor {
public:
  virtual ~Executor() = default;

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

  /// One line for logs: "cpu, 4 threads", "cuda:0 NVIDIA H200 (sm_90)".
  virtual std::string describe() const = 0;

  /// Copies `data` into routine input `name` (dtype and shape must match).
  Status setInput(int routine, const std::string &name, const TensorView &data);
  Status setInput(const std::string &name, const TensorView &data) {
    return setInput(0, name, data);
  }
  /// Host memory of routine input `index` (see the invariants above).
  virtual void *inputBuffer(int32_t index) = 0;
  /// Host memory that inputs can be filled into outside the executor (the
  /// trainer's prefetch ring): pinned on a GPU, so uploads from it run
  /// asynchronously on the copy stream. Freed by the buffer's deleter.
  struct HostFree {
    void (*release)(void *) = nullptr;
    void operator()(void *p) const {
      if (p && release)
        release(p);
    }
  };
  using HostBuffer = std::unique_ptr<void, HostFree>;
  virtual Expected<HostBuffer> allocateHostBuffer(size_t bytes, const std::string &what);
  /// The next run()s read routine input `index` from `host` (its byte size,
  /// e.g. an allocateHostBuffer) instead of inputBuffer(index), until it is
  /// bound again; nullptr binds inputBuffer(index) again. `host` must stay
  /// unchanged until waitInputsConsumed() returns after the last run that reads
  /// it. The default copies into inputBuffer(index) at once (devices whose run()
  /// reads its inputs before returning).
  virtual Status bindInput(int32_t index, const void *host);
  /// As bindInput, but `device` is memory of this executor's GPU (a caller's CUDA tensor,
  /// the Python API's): the next run()s copy it device to device, after waiting for all
  /// work on the device (the producer's stream is not known). bindInput() rebinds host
  /// memory. Devices without device memory refuse.
  virtual Status bindDeviceInput(int32_t index, const void *device);
  /// GPU image decoding (forge-train --decode gpu): input `index` is a u8 canvas
  /// [B, H, W, C] whose sample b, when lengths[b] > 0, arrives as the lengths[b] bytes of a
  /// baseline JPEG at the start of its slot in the bound host buffer, decoded on the device
  /// into the slot's top-left corner (rows W * C bytes apart); samples of length 0 are
  /// pixels, copied as they are. `lengths` stays bound (and unchanged while the host buffer
  /// must be) until bound again; nullptr unbinds. Devices without a decoder refuse.
  virtual Status bindEncodedInput(int32_t index, const uint32_t *lengths);
  /// The decoder bindEncodedInput uses ("nvJPEG, hardware backend"), or why none.
  virtual Expected<std::string> imageDecoder();
  /// Starts routine `routine` (a GPU may still be running it on return).
  virtual Status run(int routine) = 0;
  Status run() { return run(0); }
  /// Waits for the last run() and reports what failed while it ran.
  virtual Status wait() { return Status::ok(); }

  // --- pipelining (devices whose run() returns before the work is done) -------
  /// True when run() may start before the previous run's outputs are read:
  /// they stay readable through routineOutput() until that routine's next run.
  virtual bool canPipeline() const { return false; }
  /// Waits until the last run() no longer reads its inputBuffer()s (they may
  /// be refilled for the next run).
  virtual Status waitInputsConsumed() { return Status::ok(); }
  /// Runs issued so far (run() and runProfiled() calls of any routine).
  virtual uint64_t runsIssued() const { return 0; }
  /// Seconds the device's compute stream sat idle between run `run - 1`'s
  /// end and run `run`'s start (0-based, as counted by runsIssued() before
  /// that run), once run `run` has finished; nullopt where the device does
  /// not know (the CPU, the first run, a run too old to remember).
  virtual std::optional<double> idleBefore(uint64_t run) { return std::nullopt; }
  /// Output `index` as a run of the routine that outputs it left it: `runsAgo` 0 is that
  /// routine's last run, 1 the one before (runs of other routines may come between).
  /// Waits for that run's read-back only, not for later runs.
  virtual Expected<TensorView> routineOutput(int32_t index, int runsAgo) {
    return Status::error("this device does not pipeline runs");
  }
  /// Host view of tensor `index` (an empty view when out of range).
  virtual TensorView view(int32_t index) const = 0;

  // --- profiling ----------------------------------------------------------------
  struct DeviceInfo {
    double peakFlops = 0;            // per second, for the bundle's math (0: unknown)
    uint64_t memoryUsed = 0;         // on the device now (0: unknown)
    uint64_t memoryTotal = 0;
    uint64_t planBytes = 0;          // what this executor allocated for the bundle
  };
  virtual DeviceInfo deviceInfo() const = 0;
  /// The dense peak FLOP/s of a bundle's math on a GPU of compute capability `cc` (80, 89,
  /// 90, ...) with `sms` SMs at `clockHz` (MFU's denominator): the FP32 FMA units' rate
  /// (2 FLOPs x 64 FMAs a clock per SM on sm_80, 128 elsewhere) for an f32 bundle, times the
  /// tensor cores' factor for the bundle's build options: `precision` bf16/fp16 16x (4x on
  /// sm_89), fp8 32x on sm_90 (8x on sm_89; bf16's rate where the GPU has no float8), `tf32`
  /// 8x (2x on sm_89); 0 (unknown) on other GPUs. At H100 SXM's 1.98 GHz bf16 is 1070
  /// TFLOP/s (NVIDIA's 989 is at 1.83 GHz). An fp8 bundle's backward GEMMs run in bf16 unless
  /// fp8_gradients=e5m2, so its MFU against the fp8 rate understates them.
  static double densePeakFlops(const std::string &precision, bool tf32, int cc, int sms,
                               double clockHz);
  /// A reading of the device's sensors (CUDA: NVML); fields the device or its driver does
  /// not give stay empty, and the CPU gives none.
  struct Telemetry {
    std::optional<double> powerWatts;
    std::optional<unsigned> smClockMHz, temperatureC;
    std::optional<unsigned> busyPercent; // time a kernel ran over the driver's last sample period
  };
  virtual Telemetry telemetry() { return {}; }
  /// One timed span of a profiled run (microseconds from the run's start).
  struct Span {
    int instruction = -1; // -1: a transfer (inputs in, outputs out)
    int stream = 0;       // 0 compute, 1 copy, 2 host
    std::string what;     // for transfers
    double startUs = 0, durationUs = 0;
    int routine = -1; // whose instruction; -1: the routine run (Trainer sets it for the
                      // runs of a step with an accumulation loop)
  };
  /// Runs `routine` once, timing every instruction (CUDA: events around each
  /// launch, no graph), and returns the spans in start order (none for a copy that
  /// issues nothing: a reshape whose result shares its operand's bytes).
  virtual Expected<std::vector<Span>> runProfiled(int routine) = 0;

  // --- persistent tensors (checkpoints, export) ------------------------------
  /// Every PARAMETER and STATE tensor, in tensor-table order (present or not).
  const std::vector<int32_t> &persistentTensors() const { return persistent_; }
  /// Whether routine `routine` was loaded (ExecutorOptions::routines) and may run.
  bool isLoaded(int routine) const;
  /// Whether this executor holds tensor `index`: every tensor but the
  /// persistent ones that no loaded routine touches (a pipeline stage holds
  /// its own parameters and state only). An absent tensor has no storage: its
  /// view is empty and setPersistent refuses it.
  bool isPresent(int32_t index) const;
  /// Bytes of the persistent tensors this executor holds, and of all of them.
  std::pair<uint64_t, uint64_t> persistentBytes() const;
  /// True when the tensor has private writable storage (every STATE tensor;
  /// a PARAMETER of a training bundle or one that some instruction writes).
  bool isWritable(int32_t index) const;
  /// Overwrites persistent tensor `index` with `bytes` (its exact byte size),
  /// in its canonical layout (a tensor stored permuted, TensorInfo.layout_perm,
  /// is transposed here; view() shows the stored bytes, wholeView() in Shards.h
  /// the canonical ones). A read-only parameter accepts only its current
  /// value. The parameter's low-precision copies (TensorInfo.copy_of) follow.
  Status setPersistent(int32_t index, std::span<const uint8_t> bytes);
  /// Whether `index` is a low-precision copy of a parameter (derived from it:
  /// checkpoints leave it out).
  bool isDerivedCopy(int32_t index) const;
  /// Sets every low-precision copy (or those of parameter `master`) from
  /// its parameter's current value. createExecutor() calls it once.
  Status refreshCopies(int32_t master = -1);

protected:
  /// `routines`: the names of the routines to load (empty: all; the caller
  /// checked that they exist).
  explicit Executor(const Bundle &bundle, const std::vector<std::string> &routines = {});
  /// The error for running routine `routine` when it was not loaded, else ok.
  Status checkLoaded(int routine) const;
  /// Device part of setPersistent (arguments already checked; `bytes` non-empty
  /// and the tensor writable).
  virtual Status writePersistent(int32_t index, std::span<const uint8_t> bytes) = 0;

  const Bundle &bundle_;
  std::vector<const bundle::Routine *> routines_;
  std::vector<std::vector<int32_t>> routineInputs_, routineOutputs_;
  std::vector<bool> writable_;
  std::vector<int32_t> persistent_;
  std::vector<std::pair<int32_t, int32_t>> copies_; // (copy, its parameter)
  std::vector<bool> loaded_, present_;               // per routine, per tensor
};

struct ExecutorOptions {
  std::string device = "cpu"; // cpu, cuda, cuda:N, auto
  unsigned threads = 0;       // CPU threads (0: hardware concurrency)
  bool cudaGraphs = true;     // capture each routine into a CUDA graph after warm-up
  // CUDA: cuDNN's deterministic attention backward (bit-identical dq/dk/dv run to run,
  // slower); false (default): its default backward, which accumulates dq with atomics
  // (as PyTorch's flash backward does; GPT-2 124M bf16: ~0.5 ms of 33 a step faster).
  bool deterministicAttention = false;
  // The routines this process runs (empty: all): a pipeline stage's
  // (train_step@pp<s>, eval@pp<s>). Persistent tensors that none of them
  // touches get no storage.
  std::vector<std::string> routines;
};

/// The executor for `options.device`. "auto" picks CUDA for a CUDA bundle when
/// a GPU is present, else the CPU. Errors say why a device is unavailable.
Expected<std::unique_ptr<Executor>> createExecutor(const Bundle &bundle,
                                                   const ExecutorOptions &options);

/// True when this build has the CUDA device and a GPU is visible.
bool cudaAvailable();

/// Checks a CUDA bundle's library calls as the CUDA executor does before it
/// runs them (each matmul/gemm's stated cuBLASLt problem against its tensors,
/// each attention/attention_grad's shapes, dtypes and attributes), without a GPU. Errors name the routine and instruction.
Status checkLibraryCalls(const Bundle &bundle);

/// Names of the parameters of a thin bundle (forgec --weights external) whose
/// initial values are not in the bundle.
std::vector<std::string> externalParameters(const Bundle &bundle);
/// Reads every external parameter from DIR/LOCATION[offset, +length), checks
/// its length and CRC-32 (when forgec recorded one) and stores it with
/// setPersistent. Errors name the parameter, file and offset.
Status loadExternalWeights(Executor &executor, const std::string &dir);

} // namespace forge::rt
