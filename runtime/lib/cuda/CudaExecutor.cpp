// The CUDA device (CudaExecutor.h).
#include "cuda/CudaExecutor.h"

#include <cstdlib>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <set>
#include <mutex>

#include <nvtx3/nvToolsExt.h>

#include "cuda/Attention.h"
#include "cuda/Conv.h"
#include "cuda/CudaApi.h"
#include "cuda/Jpeg.h"
#include "cuda/LinearCrossEntropy.h"
#include "cuda/Matmul.h"
#include "cuda/Nvml.h"
#include "forge/runtime/Collectives.h"
#include "forge/runtime/Kernels.h"
#include "forge/runtime/ThreadPool.h"

namespace forge::rt {

using namespace cuda;

namespace {

constexpr size_t kWorkspaceBytes = kGemmWorkspaceBytes; // cuBLASLt

#define CUDA_TRY(call, ...)                                                                     \
  do {                                                                                          \
    cudaError_t err_ = (call);                                                                  \
    if (err_ != cudaSuccess)                                                                    \
      return Status::error("{}: {}", fmt::format(__VA_ARGS__), errorString(err_));              \
  } while (0)

struct PinnedDeleter {
  void operator()(void *p) const {
    if (p)
      cudaFreeHost(p);
  }
};
using PinnedBuffer = std::unique_ptr<void, PinnedDeleter>;

Expected<PinnedBuffer> allocPinned(size_t bytes, const std::string &what) {
  void *p = nullptr;
  CUDA_TRY(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault),
           "cannot allocate {} bytes of pinned host memory for {}", bytes, what);
  return PinnedBuffer(p);
}

/// A HOST instruction: its CPU kernel on pinned copies of its operands, run
/// from a stream callback.
struct HostCall {
  const bundle::Instruction *inst = nullptr;
  std::string label;
  std::vector<TensorView> in, out; // pinned host views (absent inputs: default views)
  std::vector<PinnedBuffer> buffers;
  ThreadPool *pool = nullptr;
  std::mutex mutex;
  Status status; // first failure, read after the stream synchronizes

  static void CUDART_CB callback(void *self) {
    auto *h = static_cast<HostCall *>(self);
    Status s;
    try {
      s = runCpuKernel(*h->inst, h->in, h->out, *h->pool);
    } catch (const std::exception &e) {
      s = Status::error("kernel threw: {}", e.what());
    }
    if (!s.isOk()) {
      std::lock_guard<std::mutex> lock(h->mutex);
      if (h->status.isOk())
        h->status = s.prefix(h->label);
    }
  }
};

struct Step {
  enum Kind { Kernel, Library, Copy, Host, Collective } kind = Kernel;
  int index = 0;
  const bundle::Instruction *inst = nullptr;
  // Kernel
  CUfunction function = nullptr;
  unsigned grid = 1, block = 1, sharedBytes = 0; // sharedBytes: dynamic shared memory
  std::vector<CUdeviceptr> args;
  std::vector<void *> params;
  std::vector<std::pair<void *, size_t>> zero; // outputs cleared before the launch
  // KernelLaunch.copy_input: output 0 starts as input 0 (destination, source, bytes).
  void *copyTo = nullptr;
  const void *copyFrom = nullptr;
  size_t copyBytes = 0;
  // Kernels that check their data: the fault word and the code naming this
  // instruction (heap-held: params point at them while Steps move).
  struct FaultArgs {
    CUdeviceptr word = 0;
    int32_t code = 0;
  };
  std::unique_ptr<FaultArgs> fault;
  // Library
  std::unique_ptr<MatmulPlan> matmul;
  std::unique_ptr<ConvPlan> conv;
  std::vector<const void *> convIn;
  std::unique_ptr<AttentionPlan> attention;
  std::vector<void *> attnIn, attnOut; // its operands, in order
  MatmulOperands mm; // a cuBLASLt call's operands (matmulTensors)
  // linear_cross_entropy_with_grad (CUTLASS): the problem, x, w, target, grad_output and
  // loss, result; `fault` names the instruction for a target out of range.
  std::unique_ptr<cuda::LinearCrossEntropy> lce;
  std::vector<void *> lceIn, lceOut;
  size_t workspaceBytes = 0; // the shared workspace's bytes (lce)
  void *out = nullptr; // a cuDNN call's output
  void *workspace = nullptr; // its arena bytes (forge-plan-memory), else the shared workspace
  // Copy
  void *dst = nullptr;
  const void *src = nullptr;
  size_t bytes = 0;
  // A copy into its own source (a reshape sharing its operand's bytes) issues nothing.
  bool issuesNothing() const { return kind == Copy && (dst == src || bytes == 0); }
  // Host: device pointers of the operands, staged through call->in/out
  std::unique_ptr<HostCall> call;
  // Collective: one NCCL call per operand (all_reduce: an all-reduce each), in one
  // group call, on the collective stream. ZeRO-1's: reduce_scatter (count: the
  // rank's part), all_gather (count: the rank's part) and rank_slice (no NCCL: a
  // copy of the rank's part, `offset` bytes into the whole).
  enum class CollectiveOp { AllReduce, ReduceScatter, AllGather, RankSlice };
  CollectiveOp collectiveOp = CollectiveOp::AllReduce;
  struct Reduce {
    const void *in;
    void *out;
    size_t count;
    ncclDataType_t type;
    size_t offset = 0, bytes = 0; // rank_slice
  };
  std::vector<Reduce> reduces;
  ncclRedOp_t reduceOp = ncclSum;
  ncclComm_t comm = nullptr;
  // Any step (forge-schedule's edges): the stream it runs on, the events of
  // other streams' steps it waits for first, and its own event, recorded after
  // it. The memory plan keeps bytes a step on another stream than compute
  // reads or writes from reuse until the compute stream has waited for it.
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> waits;
  cudaEvent_t record = nullptr;
  std::vector<std::pair<const void *, size_t>> hostIn;
  std::vector<std::pair<void *, size_t>> hostOut;
};

struct Transfer {
  void *host;       // pinned (inputs: inputBuffer, or what bindInput named; only read)
  void *device;     // in the arena
  size_t bytes;
  size_t staged = 0; // inputs: the offset in the routine's device staging buffers
  int32_t tensor = -1; // inputs: the tensor (bindInput)
  bool fromDevice = false; // inputs: `host` is device memory (bindDeviceInput)
  // Inputs: samples that may arrive as JPEG bytes (bindEncodedInput), a canvas
  // [samples, H, W, C] of u8: sample b's slot is sampleBytes, its rows pitch apart.
  const uint32_t *lengths = nullptr;
  int64_t samples = 0, height = 0, width = 0;
  size_t sampleBytes = 0, pitch = 0;
};

struct RoutineState {
  std::vector<Step> steps;
  std::vector<cudaEvent_t> events;    // by event id - 1 (forge-schedule)
  std::vector<cudaEvent_t> joins;     // the compute stream waits for them at the end
  std::vector<cudaStream_t> sides;    // streams but compute that its steps use
  cudaEvent_t start = nullptr;        // the sides wait for it: the inputs are in the arena
  std::vector<Transfer> inputs;
  std::vector<Transfer> outputs[2]; // read-back buffers by run parity
  // Inputs are uploaded, outside the step (and its graph), into device
  // staging buffers by run parity on the copy stream; the step copies them
  // into the arena. The upload of step s+1 so overlaps step s, which still
  // reads its inputs from the arena (nothing but step s-1 reads the staging
  // buffers it overwrites: stagingFree). Graphs are per parity already.
  void *staging[2] = {nullptr, nullptr};
  cudaEvent_t stagingFree[2] = {nullptr, nullptr}, stagingFilled[2] = {nullptr, nullptr};
  bool warmedUp = false;
  cudaGraphExec_t graph[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> profileEvents; // created by the first runProfiled()
  // Parity is per routine: run n of this routine uses staging, graph and read-back
  // buffers n % 2, so its previous run's outputs stay readable while it runs again
  // however many runs of other routines (an accumulation loop's) come between.
  uint64_t runs = 0;
  int lastParity = 0;
  // After the outputs' download of a run of each parity: the compute stream joins the
  // copy stream back (outputsEvent); the host waits for the outputs (outputsDone,
  // recorded as an external node when captured: an event recorded only as a capture
  // dependency cannot be waited on from the host).
  cudaEvent_t outputsEvent[2] = {nullptr, nullptr}, outputsDone[2] = {nullptr, nullptr};
  // The fault word as read back with each run's outputs, by parity (Impl::faultWord).
  PinnedBuffer faultStage[2];
};

/// The routine that outputs tensor `index` (each arena output has one) if it has run.
const RoutineState *ranOutputOwner(const std::vector<std::vector<int32_t>> &outputs,
                                   const std::vector<RoutineState> &routines, int32_t index) {
  for (size_t i = 0; i < outputs.size() && i < routines.size(); ++i)
    if (routines[i].runs > 0 &&
        std::find(outputs[i].begin(), outputs[i].end(), index) != outputs[i].end())
      return &routines[i];
  return nullptr;
}

} // namespace

// cuda/LinearCrossEntropy.h
Expected<cuda::LinearCrossEntropy>
cuda::linearCrossEntropyProblem(const bundle::Program &p, const bundle::Instruction &inst) {
  if (inst.inputs_size() != 4 || inst.outputs_size() != 2 ||
      std::any_of(inst.inputs().begin(), inst.inputs().end(), [](int32_t t) { return t < 0; }))
    return Status::error("it takes x, w, target and grad_output and makes loss and result");
  const bundle::TensorInfo &x = p.tensors(inst.inputs(0)), &w = p.tensors(inst.inputs(1)),
                           &target = p.tensors(inst.inputs(2)), &dy = p.tensors(inst.inputs(3)),
                           &loss = p.tensors(inst.outputs(0)), &result = p.tensors(inst.outputs(1));
  AttrReader attrs(inst);
  auto reduction = attrs.getString("reduction");
  if (!reduction)
    return reduction.status();
  cuda::LinearCrossEntropy pr;
  if (*reduction == "none")
    pr.reduction = cuda::LinearCrossEntropy::Reduction::None;
  else if (*reduction == "sum")
    pr.reduction = cuda::LinearCrossEntropy::Reduction::Sum;
  else if (*reduction == "mean")
    pr.reduction = cuda::LinearCrossEntropy::Reduction::Mean;
  else
    return Status::error("reduction must be none, sum or mean, not '{}'", *reduction);
  if (x.shape_size() != 2 || w.shape_size() != 2 || x.shape(1) != w.shape(1))
    return Status::error("it needs x [N, K] and w [C, K]");
  pr.rows = x.shape(0);
  pr.k = x.shape(1);
  pr.columns = w.shape(0);
  pr.classes = pr.columns;
  if (attrs.has("classes")) {
    auto classes = attrs.getInt("classes");
    if (!classes)
      return classes.status();
    pr.classes = *classes;
  }
  auto shapeIs = [](const bundle::TensorInfo &t, std::initializer_list<int64_t> want) {
    return std::equal(t.shape().begin(), t.shape().end(), want.begin(), want.end());
  };
  if (x.dtype() != bundle::BF16 || w.dtype() != bundle::BF16 || result.dtype() != bundle::BF16 ||
      loss.dtype() != bundle::F32 || dy.dtype() != bundle::F32 ||
      (target.dtype() != bundle::I32 && target.dtype() != bundle::I64))
    return Status::error("it takes bf16 x, w and result, f32 loss and grad_output and an i32 or "
                         "i64 target");
  pr.targetI32 = target.dtype() == bundle::I32;
  const bool none = pr.reduction == cuda::LinearCrossEntropy::Reduction::None;
  if (!shapeIs(target, {pr.rows}) || !shapeIs(loss, {pr.rows}) ||
      !shapeIs(result, {pr.rows, pr.columns}) ||
      !(none ? shapeIs(dy, {pr.rows}) : dy.shape_size() == 0))
    return Status::error("its tensors' shapes do not agree: x [{}, {}], w [{}, {}]", pr.rows, pr.k,
                         pr.columns, pr.k);
  if (pr.k % 8 != 0 || pr.columns % 8 != 0 || pr.classes < 1 || pr.classes > pr.columns)
    return Status::error("K ({}) and C ({}) must be multiples of 8 and classes ({}) in 1..C", pr.k,
                         pr.columns, pr.classes);
  return pr;
}

struct CudaExecutor::Impl {
  CudaExecutorOptions options;
  cudaDeviceProp props{};
  const DriverApi *driver = nullptr;
  const CublasLtApi *lt = nullptr;
  cublasLtHandle_t ltHandle = nullptr;
  const CudnnApi *dnn = nullptr;
  const NcclApi *nccl = nullptr;                 // data-parallel bundles only
  std::map<std::string, ncclComm_t> comms;       // by collective group ("dp")
  cudnnHandle_t dnnHandle = nullptr; // bound to the compute stream
  // Per "compute.N" stream (N - 1): a cuDNN handle bound to it. Two streams'
  // calls through one handle computed wrong results inside CUDA graphs.
  std::vector<cudnnHandle_t> dnnSide;
  size_t workspaceBytes = 0;
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaStream_t collective = nullptr; // NCCL (data-parallel bundles), made with the first collective
  std::vector<cudaStream_t> extraCompute; // "compute.N" streams of the routines' schedules
  // Stream-ordering events (within a run, also inside graph captures) ...
  cudaEvent_t computeEvent = nullptr;
  // ... and the one the host waits on (the routines' own: RoutineState::outputsDone).
  cudaEvent_t inputsDone = nullptr;
  // Timed events on the compute stream around each run (outside its graph),
  // by run index % kRunTimes: the idle gap before run n is runEnd[n - 1] ->
  // runBegin[n]. With two steps in flight the collected step's first run and the run
  // before it must still hold their events: a step of an accumulation loop is K + 1 runs,
  // so 32 slots serve K up to 14.
  static constexpr uint64_t kRunTimes = 32;
  cudaEvent_t runBegin[kRunTimes] = {}, runEnd[kRunTimes] = {};
  void *deviceBase = nullptr;
  uint64_t deviceBytes = 0;
  void *workspace = nullptr;     // the compute stream's; compute.N's is N strides on
  uint64_t workspaceStride = 0;
  // The fault word: a checking kernel stores its instruction's code here when
  // its data is bad (an index out of range, ...). Zeroed once, when the device
  // memory is, and never by a run: it is sticky, so the copy read back with
  // each run's outputs holds every fault of that run and of all runs before
  // it, and a caller that runs three times before waiting still sees a fault
  // of the first (a fault fails the executor for good).
  int32_t *faultWord = nullptr;
  const bundle::Program *program = nullptr;
  std::vector<std::pair<int, int>> faultSite; // code - 1 -> (routine, instruction)
  CUmodule module = nullptr;
  std::unique_ptr<ThreadPool> pool;
  std::vector<void *> devicePtr;         // per tensor
  std::vector<PinnedBuffer> inputStage;  // per tensor (routine inputs)
  std::vector<PinnedBuffer> outputStage[2]; // per tensor (routine outputs), by its routine's
                                            // run parity (RoutineState::runs)
  uint64_t runs = 0;                        // run() calls of every routine
  mutable std::vector<std::unique_ptr<uint8_t[]>> mirror; // view() of other tensors
  std::vector<RoutineState> routines;
  int lastRoutine = -1;
  int hostInstructions = 0;
  int convs = 0, graphConvs = 0; // cuDNN convolutions, and those the graph API runs
  bool nvmlTried = false;
  std::optional<Nvml> nvml; // telemetry(); empty without NVML
  std::unique_ptr<JpegDecoder> jpeg; // bindEncodedInput's, made on first use
  std::string graphWarning;

  ~Impl() {
    jpeg.reset(); // its states and events before the streams they worked on
    for (RoutineState &r : routines) {
      for (cudaGraphExec_t g : r.graph)
        if (g)
          cudaGraphExecDestroy(g);
      for (cudaEvent_t e : r.profileEvents)
        cudaEventDestroy(e);
      if (r.staging[0])
        cudaFree(r.staging[0]); // both parities' buffers
      for (int parity : {0, 1}) {
        for (cudaEvent_t e : {r.stagingFree[parity], r.stagingFilled[parity]})
          if (e)
            cudaEventDestroy(e);
      }
    }
    for (RoutineState &r : routines) {
      for (cudaEvent_t e : r.events)
        if (e)
          cudaEventDestroy(e);
      if (r.start)
        cudaEventDestroy(r.start);
      for (cudaEvent_t e :
           {r.outputsEvent[0], r.outputsEvent[1], r.outputsDone[0], r.outputsDone[1]})
        if (e)
          cudaEventDestroy(e);
    }
    routines.clear(); // plans before the handle
    for (auto &[group, comm] : comms)
      if (comm && nccl)
        nccl->ncclCommDestroy(comm);
    if (module && driver)
      driver->cuModuleUnload(module);
    if (ltHandle && lt)
      lt->cublasLtDestroy(ltHandle);
    for (cudnnHandle_t h : dnnSide)
      if (h && dnn)
        dnn->cudnnDestroy(h);
    if (dnnHandle && dnn)
      dnn->cudnnDestroy(dnnHandle);
    for (cudaEvent_t e : {computeEvent, inputsDone})
      if (e)
        cudaEventDestroy(e);
    for (uint64_t i = 0; i < kRunTimes; ++i)
      for (cudaEvent_t e : {runBegin[i], runEnd[i]})
        if (e)
          cudaEventDestroy(e);
    for (cudaStream_t s : {compute, copy, collective})
      if (s)
        cudaStreamDestroy(s);
    for (cudaStream_t s : extraCompute)
      cudaStreamDestroy(s);
    if (deviceBase)
      cudaFree(deviceBase);
  }

  /// Compute stream n: 0 the compute stream, n >= 1 "compute.n" (made on first use).
  Expected<cudaStream_t> computeStreamAt(int n) {
    if (n == 0)
      return compute;
    if (extraCompute.size() < static_cast<size_t>(n))
      extraCompute.resize(static_cast<size_t>(n), nullptr);
    if (!extraCompute[n - 1])
      CUDA_TRY(cudaStreamCreateWithFlags(&extraCompute[n - 1], cudaStreamNonBlocking), "stream");
    return extraCompute[n - 1];
  }

  /// The NCCL communicator of collective group `group` of `size` ranks, made
  /// on first use: rank 0 makes NCCL's unique id and the process's CPU group
  /// (Collectives.h, Gloo) broadcasts it; a group of one needs no CPU group.
  Expected<ncclComm_t> communicator(const std::string &origin, const std::string &group,
                                    int64_t size) {
    if (auto it = comms.find(group); it != comms.end())
      return it->second;
    if (!nccl) {
      auto api = ncclApi();
      if (!api)
        return api.status();
      nccl = *api;
    }
    auto found = communicatorFor(group, size, origin);
    if (!found)
      return found.status();
    Communicator *cpu = *found;
    const int rank = cpu ? cpu->rank() : 0;
    ncclUniqueId id{};
    if (rank == 0) {
      ncclResult_t r = nccl->ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        return Status::error("ncclGetUniqueId: {}", nccl->ncclGetErrorString(r));
    }
    if (cpu)
      FORGE_RETURN_IF_ERROR(cpu->broadcast(&id, sizeof id, 0));
    ncclComm_t comm = nullptr;
    ncclResult_t r = nccl->ncclCommInitRank(&comm, static_cast<int>(size), id, rank);
    if (r != ncclSuccess)
      return Status::error("ncclCommInitRank (rank {} of {}, group '{}'): {}{}", rank, size, group,
                           nccl->ncclGetErrorString(r),
                           r == ncclInvalidUsage
                               ? "; NCCL needs one GPU per rank: give each rank its own device "
                                 "(forge-train --device cuda takes cuda:LOCAL_RANK)"
                               : "");
    comms[group] = comm;
    return comm;
  }

  std::string stepLabel(const std::string &origin, const bundle::Routine &r, const Step &s) const {
    std::string label = fmt::format("{}: routine '{}' instruction #{}", origin, r.name(), s.index);
    if (!s.inst->name().empty())
      label += fmt::format(" '{}'", s.inst->name());
    label += fmt::format(" (op {}", s.inst->op());
    if (s.kind == Step::Kernel)
      label += fmt::format(", kernel {}", s.inst->launch().kernel());
    else if (s.kind == Step::Library)
      label += s.conv || s.attention ? ", cuDNN" : s.lce ? ", CUTLASS" : ", cuBLASLt";
    else if (s.kind == Step::Host)
      label += ", on the host";
    else if (s.kind == Step::Collective)
      label += ", NCCL";
    return label + ")";
  }

  Status launch(Step &s) {
    switch (s.kind) {
    case Step::Kernel: {
      for (const auto &[ptr, bytes] : s.zero)
        CUDA_TRY(cudaMemsetAsync(ptr, 0, bytes, s.stream), "zeroing a kernel's output");
      if (s.copyBytes && s.copyTo != s.copyFrom)
        CUDA_TRY(cudaMemcpyAsync(s.copyTo, s.copyFrom, s.copyBytes, cudaMemcpyDeviceToDevice,
                                 s.stream),
                 "copying a kernel's input into its output");
      CUresult r = driver->cuLaunchKernel(s.function, s.grid, 1, 1, s.block, 1, 1, s.sharedBytes,
                                          s.stream, s.params.data(), nullptr);
      if (r != CUDA_SUCCESS)
        return Status::error("kernel launch failed: {}", errorString(*driver, r));
      return Status::ok();
    }
    case Step::Library:
      // A cuDNN call runs through its stream's handle; cuBLASLt takes the stream.
      if (s.conv)
        return s.conv->run(s.convIn, s.out, s.workspace);
      if (s.attention)
        return s.attention->run(s.attnIn, s.attnOut, s.workspace);
      if (s.lce)
        return runLinearCrossEntropy(s);
      return s.matmul->run(s.stream, s.mm, s.workspace);
    case Step::Copy:
      if (!s.issuesNothing())
        CUDA_TRY(cudaMemcpyAsync(s.dst, s.src, s.bytes, cudaMemcpyDeviceToDevice, s.stream),
                 "device copy");
      return Status::ok();
    case Step::Collective: {
      // On its stream (the collective stream: the compute stream goes on with
      // the backward pass), after the events it waits for.
      if (s.collectiveOp == Step::CollectiveOp::RankSlice) {
        for (const Step::Reduce &x : s.reduces)
          CUDA_TRY(cudaMemcpyAsync(x.out, static_cast<const uint8_t *>(x.in) + x.offset, x.bytes,
                                   cudaMemcpyDeviceToDevice, s.stream),
                   "rank slice");
        return Status::ok();
      }
      ncclResult_t r = nccl->ncclGroupStart();
      for (const Step::Reduce &x : s.reduces) {
        if (r != ncclSuccess)
          break;
        switch (s.collectiveOp) {
        case Step::CollectiveOp::AllReduce:
          r = nccl->ncclAllReduce(x.in, x.out, x.count, x.type, s.reduceOp, s.comm, s.stream);
          break;
        case Step::CollectiveOp::ReduceScatter:
          r = nccl->ncclReduceScatter(x.in, x.out, x.count, x.type, s.reduceOp, s.comm,
                                      s.stream);
          break;
        case Step::CollectiveOp::AllGather:
          r = nccl->ncclAllGather(x.in, x.out, x.count, x.type, s.comm, s.stream);
          break;
        case Step::CollectiveOp::RankSlice:
          break;
        }
      }
      ncclResult_t end = nccl->ncclGroupEnd();
      if (r == ncclSuccess)
        r = end;
      if (r != ncclSuccess)
        return Status::error("NCCL {} failed: {} ({})",
                             s.collectiveOp == Step::CollectiveOp::AllReduce       ? "all-reduce"
                             : s.collectiveOp == Step::CollectiveOp::ReduceScatter ? "reduce-scatter"
                                                                                   : "all-gather",
                             nccl->ncclGetErrorString(r), nccl->ncclGetLastError(s.comm));
      return Status::ok();
    }
    case Step::Host: {
      for (size_t i = 0; i < s.hostIn.size(); ++i)
        if (s.hostIn[i].second > 0)
          CUDA_TRY(cudaMemcpyAsync(s.call->in[i].data, s.hostIn[i].first, s.hostIn[i].second,
                                   cudaMemcpyDeviceToHost, compute),
                   "staging a host instruction's input");
      CUDA_TRY(cudaLaunchHostFunc(compute, &HostCall::callback, s.call.get()),
               "cudaLaunchHostFunc");
      for (size_t i = 0; i < s.hostOut.size(); ++i)
        if (s.hostOut[i].second > 0)
          CUDA_TRY(cudaMemcpyAsync(s.hostOut[i].first, s.call->out[i].data, s.hostOut[i].second,
                                   cudaMemcpyHostToDevice, compute),
                   "returning a host instruction's output");
      return Status::ok();
    }
    }
    return Status::ok();
  }

  /// The LM head's CUTLASS GEMM and streaming loss (cuda/LinearCrossEntropy.h).
  Status runLinearCrossEntropy(Step &s) {
#ifdef FORGE_HAVE_CUTLASS
    cudaError_t e = cuda::runLinearCrossEntropy(
        *s.lce, s.lceIn[0], s.lceIn[1], s.lceIn[2], static_cast<const float *>(s.lceIn[3]),
        static_cast<float *>(s.lceOut[0]), s.lceOut[1], reinterpret_cast<int32_t *>(s.fault->word),
        s.fault->code, s.workspace, s.workspaceBytes, s.stream);
    if (e == cudaErrorNotSupported)
      return Status::error("CUTLASS cannot run this problem (a tensor not 16-byte aligned, or "
                           "a workspace too small)");
    if (e != cudaSuccess)
      return Status::error("launch failed: {}", cudaGetErrorString(e));
    return Status::ok();
#else
    (void)s;
    return Status::error("this runtime was built without CUTLASS");
#endif
  }

  /// How enqueue() runs a routine.
  struct EnqueueMode {
    bool checked = false;   // synchronize after every instruction to name a failing one
    bool capturing = false; // inside a graph capture
    // Profiling: 2n+4 events (n instructions), recorded as 0/1 around the
    // inputs (copy stream), 2+2i/3+2i around instruction i, 2n+2/2n+3
    // around the outputs; each instruction also gets an NVTX range.
    const std::vector<cudaEvent_t> *timing = nullptr;
  };

  /// Uploads the staged host inputs into `r`'s device staging buffers of
  /// `parity` on the copy stream, once the run that last read them (two runs
  /// ago) is done; the compute stream's next work waits for the upload. Not
  /// captured: a graph launch waits for all earlier work on its stream, so an
  /// upload inside the graph could not overlap the previous step.
  Status uploadInputs(RoutineState &r, int parity) {
    // A caller's device memory (bindDeviceInput) is written on a stream this executor does
    // not know: wait for the whole device before reading it.
    if (std::any_of(r.inputs.begin(), r.inputs.end(), [](const Transfer &t) { return t.fromDevice; }))
      CUDA_TRY(cudaDeviceSynchronize(), "waiting for the device inputs' producer");
    CUDA_TRY(cudaStreamWaitEvent(copy, r.stagingFree[parity], 0), "stream wait");
    for (const Transfer &t : r.inputs) {
      if (!t.bytes)
        continue;
      char *to = static_cast<char *>(r.staging[parity]) + t.staged;
      if (t.lengths && !t.fromDevice) {
        FORGE_RETURN_IF_ERROR(uploadEncoded(t, to));
        continue;
      }
      CUDA_TRY(cudaMemcpyAsync(to, t.host, t.bytes,
                               t.fromDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                               copy),
               "input upload");
    }
    CUDA_TRY(cudaEventRecord(inputsDone, copy), "event record");
    CUDA_TRY(cudaEventRecord(r.stagingFilled[parity], copy), "event record");
    CUDA_TRY(cudaStreamWaitEvent(compute, r.stagingFilled[parity], 0), "stream wait");
    return Status::ok();
  }

  /// A canvas input's samples (bindEncodedInput): the JPEG ones decoded by nvJPEG into
  /// their slots of `to`, the pixel ones copied, all on the copy stream.
  Status uploadEncoded(const Transfer &t, char *to) {
    std::vector<JpegImage> images;
    const auto *from = static_cast<const uint8_t *>(t.host);
    for (int64_t b = 0; b < t.samples; ++b) {
      const size_t at = static_cast<size_t>(b) * t.sampleBytes;
      if (t.lengths[b] == 0) {
        CUDA_TRY(cudaMemcpyAsync(to + at, from + at, t.sampleBytes, cudaMemcpyHostToDevice, copy),
                 "input upload");
        continue;
      }
      if (t.lengths[b] > t.sampleBytes)
        return Status::error("the JPEG at batch position {} ({} bytes) does not fit its canvas "
                             "slot of {}",
                             b, t.lengths[b], t.sampleBytes);
      images.push_back({from + at, t.lengths[b], reinterpret_cast<uint8_t *>(to + at), t.pitch, b,
                        t.width, t.height});
    }
    if (images.empty())
      return Status::ok();
    if (!jpeg)
      return Status::error("internal: an encoded input without a JPEG decoder");
    return jpeg->decode(images, copy);
  }

  /// After a run of `parity` is enqueued: its staging buffers are free once
  /// the compute stream gets here.
  Status releaseInputs(RoutineState &r, int parity) {
    CUDA_TRY(cudaEventRecord(r.stagingFree[parity], compute), "event record");
    return Status::ok();
  }

  /// Enqueues the whole routine (inputs in, instructions, outputs out).
  Status enqueue(const std::string &origin, const bundle::Routine &proto, RoutineState &r,
                 int parity, EnqueueMode mode) {
    const unsigned hostVisible =
        mode.capturing ? cudaEventRecordExternal : cudaEventRecordDefault;
    const size_t n = r.steps.size();
    auto mark = [&](size_t i, cudaStream_t stream) {
      return mode.timing ? cudaEventRecord((*mode.timing)[i], stream) : cudaSuccess;
    };
    // Inputs: from this parity's staging buffers (uploadInputs) into the
    // arena, after the previous step (the stream's order).
    CUDA_TRY(mark(0, compute), "event record");
    for (const Transfer &t : r.inputs)
      if (t.bytes)
        CUDA_TRY(cudaMemcpyAsync(t.device, static_cast<char *>(r.staging[parity]) + t.staged,
                                 t.bytes, cudaMemcpyDeviceToDevice, compute),
                 "input copy into the arena");
    CUDA_TRY(mark(1, compute), "event record");
    // Every other stream starts here (which also brings it into a capture).
    if (!r.sides.empty()) {
      CUDA_TRY(cudaEventRecord(r.start, compute), "event record");
      for (cudaStream_t side : r.sides)
        CUDA_TRY(cudaStreamWaitEvent(side, r.start, 0), "stream wait");
    }
    for (size_t i = 0; i < n; ++i) {
      Step &s = r.steps[i];
      // The first (checked) run picks each convolution's fastest algorithm on
      // its real operands, which the previous instructions have just computed.
      if (mode.checked && s.kind == Step::Library && s.conv)
        if (Status st = s.conv->tune(s.convIn, s.out, s.workspace, s.stream); !st.isOk())
          return st.prefix(stepLabel(origin, proto, s) + ": tuning");
      // Likewise each matmul problem's fastest cuBLASLt algorithm.
      if (mode.checked && s.kind == Step::Library && s.matmul)
        if (Status st = s.matmul->tune(compute, s.mm, workspace); !st.isOk())
          return st.prefix(stepLabel(origin, proto, s) + ": tuning");
      if (mode.timing)
        nvtxRangePushA(fmt::format("#{} {} {}", s.index, s.inst->op(), s.inst->name()).c_str());
      for (cudaEvent_t e : s.waits) // other streams' steps whose results it reads
        CUDA_TRY(cudaStreamWaitEvent(s.stream, e, 0), "stream wait");
      CUDA_TRY(mark(2 + 2 * i, s.stream), "event record");
      Status st = launch(s);
      CUDA_TRY(mark(3 + 2 * i, s.stream), "event record");
      if (st.isOk() && s.record)
        st = cudaEventRecord(s.record, s.stream) == cudaSuccess
                 ? Status::ok()
                 : Status::error("CUDA error: recording the step's event");
      if (mode.timing)
        nvtxRangePop();
      if (st.isOk() && mode.checked) {
        cudaError_t e = cudaStreamSynchronize(s.stream);
        if (e == cudaSuccess)
          e = cudaGetLastError();
        if (e != cudaSuccess)
          st = Status::error("CUDA error: {}", errorString(e));
        else if (s.kind == Step::Host) {
          std::lock_guard<std::mutex> lock(s.call->mutex);
          st = s.call->status;
          s.call->status = Status::ok();
        }
      }
      if (!st.isOk())
        return st.prefix(stepLabel(origin, proto, s));
    }
    for (cudaEvent_t e : r.joins) // joins the other streams back
      CUDA_TRY(cudaStreamWaitEvent(compute, e, 0), "stream wait");
    CUDA_TRY(cudaEventRecord(computeEvent, compute), "event record");
    CUDA_TRY(cudaStreamWaitEvent(copy, computeEvent, 0), "stream wait");
    CUDA_TRY(mark(2 * n + 2, copy), "event record");
    for (const Transfer &t : r.outputs[parity])
      if (t.bytes)
        CUDA_TRY(cudaMemcpyAsync(t.host, t.device, t.bytes, cudaMemcpyDeviceToHost, copy),
                 "output download");
    CUDA_TRY(cudaMemcpyAsync(r.faultStage[parity].get(), faultWord, sizeof(int32_t),
                             cudaMemcpyDeviceToHost, copy),
             "fault word download");
    CUDA_TRY(mark(2 * n + 3, copy), "event record");
    // The host-visible records come before the joining events: captured, each
    // is a graph node of its own, and a capture only ends once every node on
    // the copy stream is joined back into the compute stream.
    CUDA_TRY(cudaEventRecordWithFlags(r.outputsDone[parity], copy, hostVisible), "event record");
    CUDA_TRY(cudaEventRecord(r.outputsEvent[parity], copy), "event record");
    // Joins the copy stream back (required to end a capture).
    CUDA_TRY(cudaStreamWaitEvent(compute, r.outputsEvent[parity], 0), "stream wait");
    return Status::ok();
  }

  /// Waits for the last run and reports a failed HOST instruction or a
  /// device fault.
  Status finish(const std::string &origin) const {
    cudaError_t e = cudaStreamSynchronize(compute);
    if (e != cudaSuccess)
      return deviceError(origin, e);
    FORGE_RETURN_IF_ERROR(hostErrors());
    if (lastRoutine < 0)
      return Status::ok();
    const RoutineState &last = routines[static_cast<size_t>(lastRoutine)];
    return runFault(origin, last, last.lastParity);
  }

  /// The fault a checking kernel reported in routine `r`'s run of `parity` or any run
  /// before it (the word is sticky; read after that run completed): names the
  /// instruction and what its kernel found.
  Status runFault(const std::string &origin, const RoutineState &r, int parity) const {
    if (r.runs == 0 || !r.faultStage[parity])
      return Status::ok();
    int32_t code = 0;
    std::memcpy(&code, r.faultStage[parity].get(), sizeof code);
    if (code == 0)
      return Status::ok();
    if (code < 0 || static_cast<size_t>(code) > faultSite.size())
      return Status::error("{}: a kernel reported the unknown fault code {}", origin, code);
    auto [routine, index] = faultSite[code - 1];
    const bundle::Routine &at = program->routines(routine);
    const bundle::Instruction &inst = at.instructions(index);
    // A generated kernel's launch says what its check found; the one library call that
    // checks its data (the LM head's CUTLASS call) checks its targets.
    const bool lce = inst.op() == "linear_cross_entropy_with_grad";
    return Status::error(
        "{}: routine '{}' instruction #{} '{}' (op {}, {}): {}", origin, at.name(), index,
        inst.name(), inst.op(), lce ? std::string("CUTLASS") : "kernel " + inst.launch().kernel(),
        lce ? std::string("a target is outside [0, classes)") : inst.launch().fault());
  }

  Status deviceError(const std::string &origin, cudaError_t e) const {
    return Status::error("{}: CUDA error while running routine #{}: {} (set FORGE_CUDA_CHECK=1 "
                         "to synchronize after every instruction and name the one that fails)",
                         origin, lastRoutine, errorString(e));
  }

  /// The first failure of a HOST instruction of any routine that has run.
  Status hostErrors() const {
    for (const RoutineState &r : routines)
      for (const Step &s : r.steps)
        if (s.kind == Step::Host) {
          std::lock_guard<std::mutex> lock(s.call->mutex);
          if (!s.call->status.isOk())
            return s.call->status;
        }
    return Status::ok();
  }
};

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear the error a missing driver leaves
    return 0;
  }
  return n;
}

CudaExecutor::CudaExecutor(const Bundle &bundle, const std::vector<std::string> &routines)
    : Executor(bundle, routines), impl_(std::make_unique<Impl>()) {}

CudaExecutor::~CudaExecutor() = default;

Expected<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const Bundle &bundle,
                                                             CudaExecutorOptions options) {
  const bundle::Program &p = bundle.program();
  const std::string &origin = bundle.origin();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::error("no CUDA device is available ({}); run with --device cpu",
                         e != cudaSuccess ? errorString(e) : "no GPU found");
  }
  if (options.device >= count)
    return Status::error("CUDA device {} does not exist ({} device{} visible)", options.device,
                         count, count == 1 ? "" : "s");

  std::unique_ptr<CudaExecutor> ex(new CudaExecutor(bundle, options.routines));
  Impl &im = *ex->impl_;
  im.options = options;
  CUDA_TRY(cudaSetDevice(options.device), "cudaSetDevice({})", options.device);
  CUDA_TRY(cudaGetDeviceProperties(&im.props, options.device), "cudaGetDeviceProperties");
  auto driver = driverApi();
  if (!driver)
    return driver.status();
  im.driver = *driver;
  im.pool = std::make_unique<ThreadPool>(options.threads);

  // The kernel module: the cubin when it was built for this GPU, else the PTX
  // (JIT-compiled by the driver for this GPU).
  const bundle::KernelModule &km = p.kernel_module();
  std::string arch = fmt::format("sm_{}{}", im.props.major, im.props.minor);
  int bundleArch = 0;
  if (km.arch().size() > 3)
    bundleArch = std::atoi(km.arch().c_str() + 3);
  if (bundleArch > im.props.major * 10 + im.props.minor)
    return Status::error("{} was compiled for {}, but {} is {}; recompile with forgec --target "
                         "cuda:{}",
                         origin, km.arch(), im.props.name, arch, arch);
  if (!km.kernels().empty()) {
    std::string image;
    if (km.cubin_section() >= 0 && km.arch() == arch) {
      auto bytes = bundle.section(static_cast<uint32_t>(km.cubin_section()));
      image.assign(reinterpret_cast<const char *>(bytes.data()), bytes.size());
    } else if (km.ptx_section() >= 0) {
      auto bytes = bundle.section(static_cast<uint32_t>(km.ptx_section()));
      image.assign(reinterpret_cast<const char *>(bytes.data()), bytes.size());
      image.push_back('\0'); // the driver reads PTX as a C string
    } else {
      return Status::error("{}: the kernel module has no PTX and its cubin is for {}, not {}",
                           origin, km.arch(), arch);
    }
    CUresult r = im.driver->cuModuleLoadData(&im.module, image.data());
    if (r != CUDA_SUCCESS)
      return Status::error("{}: cannot load the kernel module on {}: {}", origin, im.props.name,
                           errorString(*im.driver, r));
  }

  CUDA_TRY(cudaStreamCreateWithFlags(&im.compute, cudaStreamNonBlocking), "compute stream");
  CUDA_TRY(cudaStreamCreateWithFlags(&im.copy, cudaStreamNonBlocking), "copy stream");
  for (cudaEvent_t *ev : {&im.computeEvent, &im.inputsDone})
    CUDA_TRY(cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "event");
  for (uint64_t i = 0; i < Impl::kRunTimes; ++i)
    for (cudaEvent_t *ev : {&im.runBegin[i], &im.runEnd[i]})
      CUDA_TRY(cudaEventCreate(ev), "event");

  // Library plans (their workspace is part of the one allocation below).
  auto opt = p.build_options().find("tf32");
  bool tf32 = opt != p.build_options().end() && opt->second == "1";
  std::map<const bundle::Instruction *, std::unique_ptr<MatmulPlan>> matmuls;
  std::map<const bundle::Instruction *, std::unique_ptr<ConvPlan>> convs;
  std::map<const bundle::Instruction *, std::unique_ptr<AttentionPlan>> attentions;
  std::map<const bundle::Instruction *, cuda::LinearCrossEntropy> lces;
  // cuDNN calls whose workspace is their arena bytes (forge-plan-memory placed them where no
  // tensor lives at that instruction); the others use the shared workspace.
  std::set<const bundle::Instruction *> arenaWorkspace;
  // Plans share the graphs (each holds its own), built per cuDNN handle.
  std::map<cudnnHandle_t, AttentionCache> attentionGraphs;
  std::map<cudnnHandle_t, ConvGraphCache> convGraphs; // graphs are built per handle
  // The cuDNN handle of the stream an instruction runs on (a "compute.N" stream's own,
  // bound to it; the bundle was validated: its stream names are known).
  auto dnnHandleFor = [&](const bundle::Routine &proto,
                          const bundle::Instruction &inst) -> Expected<cudnnHandle_t> {
    const int n = static_cast<int>(inst.stream()) < proto.streams_size()
                      ? computeStreamIndex(proto.streams(static_cast<int>(inst.stream())))
                      : 0;
    if (n <= 0)
      return im.dnnHandle;
    auto stream = im.computeStreamAt(n);
    if (!stream)
      return stream.status();
    if (im.dnnSide.size() < static_cast<size_t>(n))
      im.dnnSide.resize(static_cast<size_t>(n), nullptr);
    if (!im.dnnSide[n - 1]) {
      cudnnStatus_t st = im.dnn->cudnnCreate(&im.dnnSide[n - 1]);
      if (st == CUDNN_STATUS_SUCCESS)
        st = im.dnn->cudnnSetStream(im.dnnSide[n - 1], *stream);
      if (st != CUDNN_STATUS_SUCCESS)
        return Status::error("cuDNN handle for compute.{}: {}", n,
                             im.dnn->cudnnGetErrorString(st));
    }
    return im.dnnSide[n - 1];
  };
  auto algos = std::make_shared<MatmulAlgoCache>();
  for (const bundle::Routine &proto : p.routines())
    for (int i = 0; i < proto.instructions_size(); ++i) {
      const bundle::Instruction &inst = proto.instructions(i);
      if (inst.placement() != bundle::LIBRARY)
        continue;
      auto fail = [&](Status why) {
        return why.prefix(fmt::format("{}: routine '{}' instruction #{} '{}' (op {})", origin,
                                      proto.name(), i, inst.name(), inst.op()));
      };
      if (inst.op() == "linear_cross_entropy_with_grad") {
        auto problem = cuda::linearCrossEntropyProblem(p, inst);
        if (!problem)
          return fail(problem.status());
#ifdef FORGE_HAVE_CUTLASS
        if (im.props.major != 9 || im.props.minor != 0)
          return fail(Status::error("its CUTLASS kernels are sm_90a code; this GPU is sm_{}{} "
                                    "(compile the bundle with --fuse-linear-cross-entropy=false)",
                                    im.props.major, im.props.minor));
        const size_t scratch = cuda::linearCrossEntropyWorkspaceBytes(*problem);
        if (scratch == 0 && problem->rows > 0) // (0 bytes: a problem the kernels do not take)
          return fail(Status::error("its CUTLASS kernels take at most 12272 groups of 128 "
                                    "columns and dimensions below 2^31"));
        im.workspaceBytes = std::max<uint64_t>(im.workspaceBytes, scratch);
        lces[&inst] = *problem;
        continue;
#else
        return fail(Status::error("this runtime was built without CUTLASS, which runs it "
                                  "(compile the bundle with --fuse-linear-cross-entropy=false)"));
#endif
      }
      if (inst.op() == "matmul" || inst.op() == "gemm" || inst.has_matmul()) {
        if (!im.lt) {
          auto lt = cublasLtApi();
          if (!lt)
            return lt.status();
          im.lt = *lt;
          cublasStatus_t st = im.lt->cublasLtCreate(&im.ltHandle);
          if (st != CUBLAS_STATUS_SUCCESS)
            return Status::error("cublasLtCreate failed: {}", im.lt->cublasLtGetStatusString(st));
        }
        auto problem = cuda::matmulProblem(p, inst, tf32);
        if (!problem)
          return fail(problem.status());
        auto plan = MatmulPlan::create(*im.lt, im.ltHandle, *problem, kWorkspaceBytes, algos);
        if (!plan)
          return fail(plan.status());
        matmuls[&inst] = plan.take();
        im.workspaceBytes = std::max(im.workspaceBytes, kWorkspaceBytes);
      } else {
        if (!im.dnn) {
          auto dnn = cudnnApi();
          if (!dnn)
            return dnn.status();
          im.dnn = *dnn;
          cudnnStatus_t st = im.dnn->cudnnCreate(&im.dnnHandle);
          if (st == CUDNN_STATUS_SUCCESS)
            st = im.dnn->cudnnSetStream(im.dnnHandle, im.compute);
          if (st != CUDNN_STATUS_SUCCESS)
            return Status::error("cuDNN initialization failed: {}",
                                 im.dnn->cudnnGetErrorString(st));
        }
        if (isAttentionOp(inst.op())) {
          auto handle = dnnHandleFor(proto, inst);
          if (!handle)
            return fail(handle.status());
          auto plan = AttentionPlan::create(*im.dnn, *handle, p, inst, &attentionGraphs[*handle],
                                            im.options.deterministicAttention);
          if (!plan)
            return fail(plan.status());
          if (inst.workspace_bytes() > 0 && (*plan)->workspaceBytes() <= inst.workspace_bytes())
            arenaWorkspace.insert(&inst);
          else
            im.workspaceBytes = std::max(im.workspaceBytes, (*plan)->workspaceBytes());
          attentions[&inst] = plan.take();
          continue;
        }
        // Algorithms that fit the instruction's arena workspace; when none does, any (up to
        // kMaxConvWorkspace) with the shared workspace.
        bool inArena = inst.workspace_bytes() > 0;
        auto handle = dnnHandleFor(proto, inst);
        if (!handle)
          return fail(handle.status());
        auto plan = ConvPlan::create(*im.dnn, *handle, p, inst, tf32, &convGraphs[*handle],
                                     inArena ? inst.workspace_bytes() : kMaxConvWorkspace);
        if (!plan && inArena) {
          inArena = false;
          plan = ConvPlan::create(*im.dnn, *handle, p, inst, tf32, &convGraphs[*handle]);
        }
        if (!plan)
          return fail(plan.status());
        if (inArena)
          arenaWorkspace.insert(&inst);
        else
          im.workspaceBytes = std::max(im.workspaceBytes, (*plan)->workspaceBytes());
        ++im.convs;
        im.graphConvs += (*plan)->usesGraphApi();
        convs[&inst] = plan.take();
      }
    }

  // Device memory: arena, persistent and constant tensors, workspace (the
  // layout plannedTensorBytes states for forgec --batch auto).
  std::vector<uint64_t> offset(p.tensors_size(), 0);
  uint64_t total = alignUp(p.arena_size(), kDeviceAlign);
  for (int t = 0; t < p.tensors_size(); ++t) {
    auto kind = p.tensors(t).kind();
    if (!ex->isPresent(t)) // another pipeline stage's parameter or state
      continue;
    if (kind == bundle::TensorInfo::PARAMETER || kind == bundle::TensorInfo::STATE ||
        kind == bundle::TensorInfo::CONSTANT) {
      offset[t] = total;
      total += alignUp(std::max<uint64_t>(byteSize(p.tensors(t)), 1), kDeviceAlign);
    }
  }
  // One shared workspace per compute stream (library calls on different streams may run
  // at once): "compute.N" of any routine's schedule needs N + 1.
  const uint64_t workspaceSlots = computeStreamCount(p);
  uint64_t workspaceOffset = total;
  im.workspaceStride = alignUp(im.workspaceBytes, kDeviceAlign);
  total += workspaceSlots * im.workspaceStride;
  uint64_t faultOffset = total;
  total += kDeviceAlign;
  e = cudaMalloc(&im.deviceBase, total);
  if (e != cudaSuccess) {
    size_t freeBytes = 0, totalBytes = 0;
    cudaGetLastError();
    cudaMemGetInfo(&freeBytes, &totalBytes);
    // A batch that would fit: the arena grows about linearly with the batch,
    // the rest (parameters, state, constants, workspace) does not.
    std::string hint = "use a smaller batch (forgec --batch, or --batch auto --device-memory) "
                       "or --micro-batches";
    auto batchOpt = p.build_options().find("batch");
    int64_t batch = 0;
    if (batchOpt != p.build_options().end() && p.arena_size() > 0 &&
        std::from_chars(batchOpt->second.data(),
                        batchOpt->second.data() + batchOpt->second.size(), batch)
                .ec == std::errc()) {
      const double fixed = double(total - alignUp(p.arena_size(), kDeviceAlign));
      const double room = 0.9 * double(freeBytes) - fixed;
      int64_t fits = room > 0 ? int64_t(double(batch) * room / double(p.arena_size())) : 0;
      if (fits >= 8)
        fits = fits / 8 * 8;
      if (fits >= 1 && fits < batch)
        hint = fmt::format("a batch of about {} would fit (forgec --batch {}, or --batch auto "
                           "--device-memory {:.0f}MB), or keep {} with --micro-batches",
                           fits, fits, freeBytes / 1e6, batch);
      else if (fits < 1)
        hint = "even a batch of 1 would not fit beside the parameters and optimizer state: "
               "free device memory, or use --precision bf16 or forgec --recompute attention";
    }
    return Status::error("{}: cannot allocate {:.1f} MiB on {} ({:.1f} MiB free): the plan "
                         "(arena {:.1f} MiB at batch {}, then the parameters, state, constants "
                         "and {:.1f} MiB of library workspace) does not fit; {}",
                         origin, total / 1048576.0, im.props.name, freeBytes / 1048576.0,
                         p.arena_size() / 1048576.0, batch ? std::to_string(batch) : "?",
                         im.workspaceBytes / 1048576.0, hint);
  }
  im.deviceBytes = total;
  auto *base = static_cast<uint8_t *>(im.deviceBase);
  if (im.workspaceBytes)
    im.workspace = base + workspaceOffset;
  im.faultWord = reinterpret_cast<int32_t *>(base + faultOffset);
  im.program = &p;
  CUDA_TRY(cudaMemset(im.deviceBase, 0, total), "clearing device memory");
  im.devicePtr.assign(p.tensors_size(), nullptr);
  for (int t = 0; t < p.tensors_size(); ++t) {
    const bundle::TensorInfo &info = p.tensors(t);
    auto kind = info.kind();
    if (!ex->isPresent(t))
      continue; // no storage (devicePtr null): no loaded routine touches it
    if (kind == bundle::TensorInfo::PARAMETER || kind == bundle::TensorInfo::STATE ||
        kind == bundle::TensorInfo::CONSTANT) {
      im.devicePtr[t] = base + offset[t];
      std::span<const uint8_t> bytes = bundle.tensorData(info);
      if (info.has_shard()) // the whole tensor: createExecutor loads this rank's slice
        bytes = {};
      if (!bytes.empty())
        CUDA_TRY(cudaMemcpy(im.devicePtr[t], bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
                 "uploading '{}'", info.name());
    } else if (kind != bundle::TensorInfo::LOCAL) { // locals: the CPU's, inside fused bodies
      im.devicePtr[t] = base + info.arena_offset();
    }
  }


  // Per routine: staged inputs/outputs and one ready-to-launch step per instruction.
  im.inputStage.resize(p.tensors_size());
  im.outputStage[0].resize(p.tensors_size());
  im.outputStage[1].resize(p.tensors_size());
  std::map<std::string, CUfunction> functions;
  for (int routine = 0; routine < p.routines_size(); ++routine) {
    const bundle::Routine &proto = p.routines(routine);
    RoutineState r;
    if (!ex->isLoaded(routine)) { // another pipeline stage's: never run here
      im.routines.push_back(std::move(r));
      continue;
    }
    size_t staged = 0;
    for (int32_t t : proto.inputs()) {
      auto buf = allocPinned(byteSize(p.tensors(t)), "input '" + p.tensors(t).name() + "'");
      if (!buf)
        return buf.status();
      r.inputs.push_back({buf->get(), im.devicePtr[t], byteSize(p.tensors(t)), staged, t});
      staged += (byteSize(p.tensors(t)) + 255) / 256 * 256;
      im.inputStage[t] = buf.take();
    }
    // One allocation holds both parities' staging buffers (staging[1] points into it).
    if (staged && cudaMalloc(&r.staging[0], 2 * staged) != cudaSuccess) {
      cudaGetLastError();
      return Status::error("{}: out of GPU memory for routine '{}''s input staging buffers "
                           "(2 x {:.1f} MiB)",
                           origin, proto.name(), staged / 1048576.0);
    }
    if (staged)
      r.staging[1] = static_cast<char *>(r.staging[0]) + staged;
    for (int parity : {0, 1}) {
      CUDA_TRY(cudaEventCreateWithFlags(&r.stagingFree[parity], cudaEventDisableTiming), "event");
      CUDA_TRY(cudaEventCreateWithFlags(&r.stagingFilled[parity], cudaEventDisableTiming),
               "event");
      CUDA_TRY(cudaEventCreateWithFlags(&r.outputsEvent[parity], cudaEventDisableTiming), "event");
      CUDA_TRY(cudaEventCreateWithFlags(&r.outputsDone[parity], cudaEventDisableTiming), "event");
      auto fault = allocPinned(sizeof(int32_t), "the fault word");
      if (!fault)
        return fault.status();
      r.faultStage[parity] = fault.take();
      std::memset(r.faultStage[parity].get(), 0, sizeof(int32_t));
    }
    for (int32_t t : proto.outputs())
      for (int parity : {0, 1}) {
        auto buf = allocPinned(byteSize(p.tensors(t)), "output '" + p.tensors(t).name() + "'");
        if (!buf)
          return buf.status();
        r.outputs[parity].push_back({buf->get(), im.devicePtr[t], byteSize(p.tensors(t))});
        im.outputStage[parity][t] = buf.take();
      }
    // The schedule's streams (none: everything on the compute stream) and events.
    std::vector<cudaStream_t> streams{im.compute};
    std::vector<int> slotOf{0}; // per stream: its shared workspace slot (-1: no library calls)
    for (int k = 1; k < proto.streams_size(); ++k) {
      // "compute.N" (validated), else the collective stream.
      const int n = computeStreamIndex(proto.streams(k));
      slotOf.push_back(n);
      cudaStream_t side = nullptr;
      if (n > 0) {
        auto stream = im.computeStreamAt(n);
        if (!stream)
          return stream.status();
        side = *stream;
      } else {
        if (!im.collective)
          CUDA_TRY(cudaStreamCreateWithFlags(&im.collective, cudaStreamNonBlocking),
                   "collective stream");
        side = im.collective;
      }
      streams.push_back(side);
      // Only a stream with work forks off the compute stream: a capture ends
      // only once every stream it reached has joined back.
      if (std::any_of(proto.instructions().begin(), proto.instructions().end(),
                      [&](const bundle::Instruction &inst) {
                        return inst.stream() == static_cast<uint32_t>(k);
                      }))
        r.sides.push_back(side);
    }
    if (!r.sides.empty())
      CUDA_TRY(cudaEventCreateWithFlags(&r.start, cudaEventDisableTiming), "event");
    r.events.assign(proto.events(), nullptr);
    for (cudaEvent_t &e : r.events)
      CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    for (int i = 0; i < proto.instructions_size(); ++i) {
      const bundle::Instruction &inst = proto.instructions(i);
      Step s;
      s.index = i;
      s.inst = &inst;
      auto fail = [&](const std::string &why) {
        return Status::error("{}: routine '{}' instruction #{} '{}' (op {}): {}", origin,
                             proto.name(), i, inst.name(), inst.op(), why);
      };
      // A step that checks its data: the fault word and a code naming this instruction.
      auto checksData = [&] {
        im.faultSite.push_back({routine, i});
        s.fault = std::make_unique<Step::FaultArgs>();
        s.fault->word = reinterpret_cast<CUdeviceptr>(im.faultWord);
        s.fault->code = static_cast<int32_t>(im.faultSite.size());
      };
      // forge-schedule's stream and edges (the bundle was validated: events in
      // range, recorded before they are waited for).
      s.stream = streams[inst.stream()];
      if ((inst.placement() == bundle::HOST && s.stream != im.compute) ||
          (inst.placement() == bundle::LIBRARY && slotOf[inst.stream()] < 0))
        return fail("host instructions run on the compute stream, library calls on a compute "
                    "stream");
      for (uint32_t e : inst.waits())
        s.waits.push_back(r.events[e - 1]);
      if (inst.event())
        s.record = r.events[inst.event() - 1];
      switch (inst.placement()) {
      case bundle::KERNEL: {
        s.kind = Step::Kernel;
        const std::string &name = inst.launch().kernel();
        auto it = functions.find(name);
        if (it == functions.end()) {
          CUfunction fn = nullptr;
          CUresult res = im.driver->cuModuleGetFunction(&fn, im.module, name.c_str());
          if (res != CUDA_SUCCESS)
            return fail(fmt::format("kernel {} is not in the module: {}", name,
                                    errorString(*im.driver, res)));
          // Without an opt-in a function gets 48 KiB of shared memory less its static bytes;
          // the opt-in (per function, up to the device's limit: 227 KiB on sm_90) is set for
          // every kernel that takes dynamic shared memory.
          if (uint32_t shared = inst.launch().shared_bytes(); shared > 0) {
            res = im.driver->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                static_cast<int>(shared));
            if (res != CUDA_SUCCESS)
              return fail(fmt::format("kernel {} needs {} bytes of shared memory a block, more "
                                      "than this GPU allows: {} (recompile for this GPU's "
                                      "--target)",
                                      name, shared, errorString(*im.driver, res)));
          }
          it = functions.emplace(name, fn).first;
        }
        s.function = it->second;
        s.sharedBytes = inst.launch().shared_bytes();
        s.grid = inst.launch().grid();
        s.block = inst.launch().block();
        for (int32_t t : inst.inputs())
          if (t >= 0)
            s.args.push_back(reinterpret_cast<CUdeviceptr>(im.devicePtr[t]));
        for (uint32_t o : inst.launch().zero_only())
          if (o >= static_cast<uint32_t>(inst.outputs_size()))
            return fail(fmt::format("zero_only names output {} of {}", o, inst.outputs_size()));
        for (int o = 0; o < inst.outputs_size(); ++o) {
          const int32_t t = inst.outputs(o);
          s.args.push_back(reinterpret_cast<CUdeviceptr>(im.devicePtr[t]));
          const auto &only = inst.launch().zero_only();
          if (inst.launch().zero_outputs() &&
              (only.empty() || std::find(only.begin(), only.end(), static_cast<uint32_t>(o)) !=
                                   only.end()))
            s.zero.push_back({im.devicePtr[t], byteSize(p.tensors(t))});
        }
        if (inst.launch().copy_input()) {
          if (inst.inputs_size() < 1 || inst.inputs(0) < 0 || inst.outputs_size() < 1 ||
              byteSize(p.tensors(inst.inputs(0))) != byteSize(p.tensors(inst.outputs(0))))
            return fail("copy_input needs input 0 and output 0 of one byte size");
          s.copyFrom = im.devicePtr[inst.inputs(0)];
          s.copyTo = im.devicePtr[inst.outputs(0)];
          s.copyBytes = byteSize(p.tensors(inst.outputs(0)));
        }
        for (CUdeviceptr &a : s.args)
          s.params.push_back(&a);
        if (!inst.launch().fault().empty()) {
          checksData();
          s.params.push_back(&s.fault->word);
          s.params.push_back(&s.fault->code);
        }
        break;
      }
      case bundle::LIBRARY: {
        s.kind = Step::Library;
        s.workspace = arenaWorkspace.count(&inst)
                          ? base + inst.workspace_offset()
                          : static_cast<uint8_t *>(im.workspace) +
                                slotOf[inst.stream()] * im.workspaceStride;
        if (auto conv = convs.find(&inst); conv != convs.end()) {
          s.conv = std::move(conv->second);
          for (int32_t t : inst.inputs())
            if (t >= 0)
              s.convIn.push_back(im.devicePtr[t]);
          s.out = im.devicePtr[inst.outputs(0)];
          break;
        }
        if (auto lce = lces.find(&inst); lce != lces.end()) {
          s.lce = std::make_unique<cuda::LinearCrossEntropy>(lce->second);
          for (int32_t t : inst.inputs()) // all present (linearCrossEntropyProblem)
            s.lceIn.push_back(im.devicePtr[t]);
          for (int32_t t : inst.outputs())
            s.lceOut.push_back(im.devicePtr[t]);
          s.workspaceBytes = im.workspaceStride;
          checksData();
          break;
        }
        if (auto attn = attentions.find(&inst); attn != attentions.end()) {
          s.attention = std::move(attn->second);
          // Every operand is present (checked by attentionProblem).
          for (int32_t t : inst.inputs())
            s.attnIn.push_back(im.devicePtr[t]);
          for (int32_t t : inst.outputs())
            s.attnOut.push_back(im.devicePtr[t]);
          break;
        }
        s.matmul = std::move(matmuls.at(&inst));
        // The tensors were checked by matmulProblem when the plan was made.
        MatmulTensors t = matmulTensors(inst, s.matmul->problem());
        auto ptr = [&](int32_t id) -> void * { return id >= 0 ? im.devicePtr[id] : nullptr; };
        s.mm = {ptr(t.lhs),    ptr(t.rhs),      ptr(t.c),       ptr(t.out),
                ptr(t.vector), ptr(t.aux), ptr(t.lhsScale), ptr(t.rhsScale)};
        break;
      }
      case bundle::DEVICE_COPY: {
        s.kind = Step::Copy;
        auto empty = [&](int32_t t) { return byteSize(p.tensors(t)) == 0; };
        if (inst.outputs_size() > 0 && std::all_of(inst.outputs().begin(), inst.outputs().end(), empty))
          break; // nothing to compute: no bytes to copy
        if (inst.inputs_size() < 1 || inst.outputs_size() != 1 || inst.inputs(0) < 0)
          return fail("a device copy needs one input and one output");
        s.src = im.devicePtr[inst.inputs(0)];
        s.dst = im.devicePtr[inst.outputs(0)];
        s.bytes = byteSize(p.tensors(inst.outputs(0)));
        if (byteSize(p.tensors(inst.inputs(0))) != s.bytes)
          return fail("a device copy between tensors of different sizes");
        break;
      }
      case bundle::COLLECTIVE: {
        s.kind = Step::Collective;
        AttrReader attrs(inst);
        const std::string &op = inst.op();
        const bool reduces = op == "all_reduce" || op == "reduce_scatter";
        auto group = attrs.getString("group");
        auto reduction = reduces ? attrs.getString("reduction") : Expected<std::string>(std::string("sum"));
        auto size = attrs.getInt("size");
        if (!group || !reduction || !size)
          return fail("a collective needs the attributes group, size (and reduction)");
        if (op == "all_reduce")
          s.collectiveOp = Step::CollectiveOp::AllReduce;
        else if (op == "reduce_scatter")
          s.collectiveOp = Step::CollectiveOp::ReduceScatter;
        else if (op == "all_gather")
          s.collectiveOp = Step::CollectiveOp::AllGather;
        else if (op == "rank_slice")
          s.collectiveOp = Step::CollectiveOp::RankSlice;
        else
          return fail("only all_reduce, reduce_scatter, all_gather and rank_slice are collectives");
        if (*reduction != "sum" && *reduction != "mean" &&
            !(*reduction == "max" && s.collectiveOp == Step::CollectiveOp::AllReduce))
          return fail("a collective's reduction is sum or mean (or max, for all_reduce)");
        if (inst.inputs_size() != inst.outputs_size() ||
            (s.collectiveOp != Step::CollectiveOp::AllReduce && inst.inputs_size() != 1))
          return fail("a collective has as many outputs as inputs (one, but for all_reduce)");
        int rank = 0; // rank_slice's part: this process's rank in the group
        if (s.collectiveOp == Step::CollectiveOp::RankSlice) {
          auto found = communicatorFor(*group, *size, origin);
          if (!found)
            return fail(found.status().message());
          rank = *found ? (*found)->rank() : 0;
        } else {
          auto comm = im.communicator(origin, *group, *size);
          if (!comm)
            return fail(comm.status().message());
          s.comm = *comm;
        }
        // A mean over a group of one is the sum: NCCL runs ncclAvg as a pre-multiply by
        // 1/n, which for one rank is a kernel of its own rewriting every byte (on at most 32
        // blocks, beside the backward pass), where an in-place sum of one rank launches
        // nothing (NCCL's ncclLaunchOneRank). Over more ranks the multiply is fused into the
        // reduction's own pass.
        s.reduceOp = *reduction == "max"                ? ncclMax
                     : *reduction == "mean" && *size > 1 ? ncclAvg
                                                          : ncclSum;
        for (int k = 0; k < inst.inputs_size(); ++k) {
          int32_t in = inst.inputs(k), out = inst.outputs(k);
          if (in < 0 || p.tensors(in).dtype() != p.tensors(out).dtype())
            return fail(fmt::format("operand {} and result {} differ", k, k));
          // all_reduce: equal sizes; ZeRO-1's: the part is 1/size of the whole.
          const size_t inBytes = byteSize(p.tensors(in)), outBytes = byteSize(p.tensors(out));
          const size_t n = static_cast<size_t>(*size);
          const bool partIn = s.collectiveOp == Step::CollectiveOp::AllGather;
          const bool partOut = s.collectiveOp == Step::CollectiveOp::ReduceScatter ||
                               s.collectiveOp == Step::CollectiveOp::RankSlice;
          if ((partIn && inBytes * n != outBytes) || (partOut && outBytes * n != inBytes) ||
              (!partIn && !partOut && inBytes != outBytes))
            return fail(fmt::format("operand {} ({} bytes) and result {} ({} bytes) do not "
                                    "match a group of {}",
                                    k, inBytes, k, outBytes, n));
          ncclDataType_t type;
          switch (p.tensors(in).dtype()) {
          case bundle::F32: type = ncclFloat32; break;
          case bundle::F16: type = ncclFloat16; break;
          case bundle::BF16: type = ncclBfloat16; break;
          case bundle::F64: type = ncclFloat64; break;
          default:
            return fail(fmt::format("NCCL reduces no {} tensors", dtypeName(p.tensors(in).dtype())));
          }
          // NCCL counts: all_reduce the whole; reduce_scatter and all_gather the part.
          const size_t count =
              static_cast<size_t>(numElements(shapeOf(p.tensors(partIn ? in : partOut ? out : in))));
          s.reduces.push_back({im.devicePtr[in], im.devicePtr[out], count, type,
                               static_cast<size_t>(rank) * outBytes, outBytes});
        }
        break;
      }
      case bundle::HOST:
      case bundle::PLACEMENT_DEFAULT: {
        if (!findCpuKernel(inst.op()))
          return fail("no CPU kernel for this host instruction");
        s.kind = Step::Host;
        ++im.hostInstructions;
        s.call = std::make_unique<HostCall>();
        s.call->inst = &inst;
        s.call->pool = im.pool.get();
        s.call->label = fmt::format("{}: routine '{}' instruction #{} '{}' (op {}, on the host)",
                                    origin, proto.name(), i, inst.name(), inst.op());
        auto stage = [&](int32_t t, bool output) -> Status {
          TensorView v;
          if (t < 0) {
            s.call->in.push_back(v);
            s.hostIn.push_back({nullptr, 0});
            return Status::ok();
          }
          const bundle::TensorInfo &info = p.tensors(t);
          v.dtype = info.dtype();
          v.shape.assign(info.shape().begin(), info.shape().end());
          auto buf = allocPinned(byteSize(info), "host instruction operand");
          if (!buf)
            return buf.status();
          v.data = buf->get();
          s.call->buffers.push_back(buf.take());
          if (output) {
            s.call->out.push_back(v);
            s.hostOut.push_back({im.devicePtr[t], byteSize(info)});
          } else {
            s.call->in.push_back(v);
            s.hostIn.push_back({im.devicePtr[t], byteSize(info)});
          }
          return Status::ok();
        };
        for (int32_t t : inst.inputs())
          FORGE_RETURN_IF_ERROR(stage(t, false));
        for (int32_t t : inst.outputs())
          FORGE_RETURN_IF_ERROR(stage(t, true));
        break;
      }
      default:
        return fail(fmt::format("unknown placement {}", static_cast<int>(inst.placement())));
      }
      r.steps.push_back(std::move(s));
    }
    for (uint32_t e : proto.joins())
      r.joins.push_back(r.events[e - 1]);
    im.routines.push_back(std::move(r));
  }
  im.mirror.resize(p.tensors_size());
  return ex;
}

std::string CudaExecutor::describe() const {
  const Impl &im = *impl_;
  std::string s = fmt::format("cuda:{} {} (sm_{}{}, {} SMs, {:.0f} MiB on the device)",
                              im.options.device, im.props.name, im.props.major, im.props.minor,
                              im.props.multiProcessorCount, im.deviceBytes / 1048576.0);
  if (im.hostInstructions)
    s += fmt::format(", {} host instruction{}", im.hostInstructions,
                     im.hostInstructions == 1 ? "" : "s");
  if (im.graphConvs)
    s += fmt::format(", {} of {} convolutions through cuDNN's graph API", im.graphConvs,
                     im.convs);
  if (!im.options.graphs)
    s += ", no CUDA graphs";
  return s;
}

void *CudaExecutor::inputBuffer(int32_t index) {
  if (index < 0 || static_cast<size_t>(index) >= impl_->inputStage.size())
    return nullptr;
  return impl_->inputStage[index].get();
}

namespace {
void freePinned(void *p) { cudaFreeHost(p); }
} // namespace

Expected<Executor::HostBuffer> CudaExecutor::allocateHostBuffer(size_t bytes,
                                                                const std::string &what) {
  auto buf = allocPinned(bytes, what);
  if (!buf)
    return buf.status();
  return HostBuffer(buf->release(), HostFree{freePinned});
}

Status CudaExecutor::bindInput(int32_t index, const void *host) {
  void *own = inputBuffer(index);
  if (!own)
    return Status::error("{}: tensor #{} is not a routine input", bundle_.origin(), index);
  // Uploads read Transfer::host on the copy stream (uploadInputs): a pointer swap.
  // cudaMemcpyAsync from pageable memory would still be correct, only synchronous.
  for (RoutineState &r : impl_->routines)
    for (Transfer &t : r.inputs)
      if (t.tensor == index) {
        t.host = host ? const_cast<void *>(host) : own;
        t.fromDevice = false;
      }
  return Status::ok();
}

Expected<std::string> CudaExecutor::imageDecoder() {
  Impl &im = *impl_;
  if (!im.jpeg) {
    auto d = JpegDecoder::create();
    if (!d)
      return d.status();
    im.jpeg = d.take();
  }
  return fmt::format("nvJPEG, {} backend", im.jpeg->backend());
}

Status CudaExecutor::bindEncodedInput(int32_t index, const uint32_t *lengths) {
  if (!inputBuffer(index))
    return Status::error("{}: tensor #{} is not a routine input", bundle_.origin(), index);
  const bundle::TensorInfo &info = tensorInfo(index);
  const std::vector<int64_t> shape = shapeOf(info);
  if (lengths && (info.dtype() != bundle::U8 || shape.size() != 4 || shape[3] != 3))
    return Status::error("{}: input '{}' is not a u8 canvas [B, H, W, 3] (JPEG samples)",
                         bundle_.origin(), info.name());
  if (lengths)
    FORGE_RETURN_IF_ERROR(imageDecoder().status());
  for (RoutineState &r : impl_->routines)
    for (Transfer &t : r.inputs)
      if (t.tensor == index) {
        t.lengths = lengths;
        if (lengths) {
          t.samples = shape[0], t.height = shape[1], t.width = shape[2];
          t.pitch = static_cast<size_t>(shape[2] * shape[3]);
          t.sampleBytes = static_cast<size_t>(shape[1]) * t.pitch;
        }
      }
  return Status::ok();
}

Status CudaExecutor::bindDeviceInput(int32_t index, const void *device) {
  if (!inputBuffer(index))
    return Status::error("{}: tensor #{} is not a routine input", bundle_.origin(), index);
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::error("input '{}': not CUDA memory ({})", tensorInfo(index).name(),
                         errorString(e));
  }
  if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != impl_->options.device)
    return Status::error("input '{}': the memory is {}, this executor runs on cuda:{}",
                         tensorInfo(index).name(),
                         attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged
                             ? fmt::format("on cuda:{}", attr.device)
                             : std::string("not device memory"),
                         impl_->options.device);
  for (RoutineState &r : impl_->routines)
    for (Transfer &t : r.inputs)
      if (t.tensor == index) {
        t.host = const_cast<void *>(device);
        t.fromDevice = true;
      }
  return Status::ok();
}

Status CudaExecutor::run(int routine) {
  FORGE_RETURN_IF_ERROR(checkLoaded(routine));
  Impl &im = *impl_;
  // No wait for the previous run: the stream orders the arena's reuse, and the
  // previous run of this routine has the other parity's read-back buffers (the caller
  // reads them with routineOutput() while this run proceeds).
  FORGE_RETURN_IF_ERROR(im.hostErrors());
  const bundle::Routine &proto = *routines_[routine];
  RoutineState &r = im.routines[routine];
  im.lastRoutine = routine;
  const uint64_t runIndex = im.runs++;
  const int parity = static_cast<int>(r.runs++ % 2);
  r.lastParity = parity;
  nvtxRangePushA(proto.name().c_str()); // the host side of the step (Nsight Systems)
  struct PopRange {
    ~PopRange() { nvtxRangePop(); }
  } pop;
  FORGE_RETURN_IF_ERROR(im.uploadInputs(r, parity));
  auto launchStep = [&]() -> Status {
    if (r.graph[parity]) {
      CUDA_TRY(cudaGraphLaunch(r.graph[parity], im.compute), "{}: replaying routine '{}'",
               bundle_.origin(), proto.name());
      return Status::ok();
    }
    // FORGE_CUDA_CHECK=1: every run instruction by instruction, synchronized.
    static const bool alwaysChecked = [] {
      const char *v = std::getenv("FORGE_CUDA_CHECK");
      return v && *v && std::string(v) != "0";
    }();
    if (!r.warmedUp || !im.options.graphs || alwaysChecked) {
      FORGE_RETURN_IF_ERROR(im.enqueue(bundle_.origin(), proto, r, parity,
                                       {.checked = !r.warmedUp || alwaysChecked}));
      r.warmedUp = true;
      return Status::ok();
    }
    // The first run of each parity after the warm-up: capture a graph (one per
    // parity: they differ in their read-back buffers), then replay it.
    CUDA_TRY(cudaStreamBeginCapture(im.compute, cudaStreamCaptureModeThreadLocal),
             "{}: capturing routine '{}'", bundle_.origin(), proto.name());
    Status st = im.enqueue(bundle_.origin(), proto, r, parity, {.capturing = true});
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(im.compute, &graph);
    if (st.isOk() && e == cudaSuccess)
      e = cudaGraphInstantiate(&r.graph[parity], graph, 0);
    if (graph)
      cudaGraphDestroy(graph);
    if (!st.isOk() || e != cudaSuccess) {
      cudaGetLastError();
      r.graph[parity] = nullptr;
      im.options.graphs = false; // keep running, launch by launch
      fmt::print(stderr, "forge-train: warning: {}: CUDA graph capture of routine '{}' failed ({}); "
                 "launching instruction by instruction\n",
                 bundle_.origin(), proto.name(), st.isOk() ? errorString(e) : st.message());
      return im.enqueue(bundle_.origin(), proto, r, parity, {});
    }
    CUDA_TRY(cudaGraphLaunch(r.graph[parity], im.compute), "{}: replaying routine '{}'",
             bundle_.origin(), proto.name());
    return Status::ok();
  };
  // The run's start once its inputs are on the device (uploadInputs made the
  // compute stream wait for them): an idle gap before it is the stream
  // waiting for this batch or for the host to launch it.
  CUDA_TRY(cudaEventRecord(im.runBegin[runIndex % Impl::kRunTimes], im.compute), "event record");
  Status st = launchStep();
  if (st.isOk())
    st = im.releaseInputs(r, parity);
  if (st.isOk())
    CUDA_TRY(cudaEventRecord(im.runEnd[runIndex % Impl::kRunTimes], im.compute), "event record");
  return st;
}

uint64_t CudaExecutor::runsIssued() const { return impl_->runs; }

std::optional<double> CudaExecutor::idleBefore(uint64_t run) {
  Impl &im = *impl_;
  // Both events must still hold runs run-1 and run (not overwritten by later
  // runs) and be complete.
  // Run run-1's slot is reused by run run+3.
  if (run == 0 || run >= im.runs || im.runs - run > Impl::kRunTimes - 1)
    return std::nullopt;
  cudaEvent_t end = im.runEnd[(run - 1) % Impl::kRunTimes];
  cudaEvent_t begin = im.runBegin[run % Impl::kRunTimes];
  if (cudaEventQuery(begin) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  float ms = 0;
  if (cudaEventElapsedTime(&ms, end, begin) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return std::max(0.0, static_cast<double>(ms) * 1e-3);
}

Status CudaExecutor::wait() { return impl_->finish(bundle_.origin()); }

Status CudaExecutor::waitInputsConsumed() {
  cudaError_t e = cudaEventSynchronize(impl_->inputsDone);
  return e == cudaSuccess ? Status::ok() : impl_->deviceError(bundle_.origin(), e);
}

Expected<TensorView> CudaExecutor::routineOutput(int32_t index, int runsAgo) {
  Impl &im = *impl_;
  // Two read-back sets per routine, by run parity: its last run's and the one before's.
  const RoutineState *owner = ranOutputOwner(routineOutputs_, im.routines, index);
  if (runsAgo < 0 || runsAgo > 1 || !owner || owner->runs <= static_cast<uint64_t>(runsAgo) ||
      !im.outputStage[owner->lastParity ^ runsAgo][index])
    return Status::error("{}: tensor #{} is not an output of a run {} run(s) before its "
                         "routine's last",
                         bundle_.origin(), index, runsAgo);
  const int parity = owner->lastParity ^ runsAgo;
  cudaError_t e = cudaEventSynchronize(owner->outputsDone[parity]);
  if (e != cudaSuccess)
    return im.deviceError(bundle_.origin(), e);
  FORGE_RETURN_IF_ERROR(im.hostErrors());
  FORGE_RETURN_IF_ERROR(im.runFault(bundle_.origin(), *owner, parity));
  const bundle::TensorInfo &info = tensorInfo(index);
  TensorView v;
  v.dtype = info.dtype();
  v.shape.assign(info.shape().begin(), info.shape().end());
  v.data = im.outputStage[parity][index].get();
  return v;
}

Executor::Telemetry CudaExecutor::telemetry() {
  Impl &im = *impl_;
  if (!im.nvmlTried) { // once: NVML's absence is not an error
    im.nvmlTried = true;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), im.options.device) == cudaSuccess)
      im.nvml = Nvml::open(bus);
    else
      cudaGetLastError();
  }
  return im.nvml ? im.nvml->read() : Telemetry{};
}

Executor::DeviceInfo CudaExecutor::deviceInfo() const {
  const Impl &im = *impl_;
  DeviceInfo info;
  info.planBytes = im.deviceBytes;
  size_t freeBytes = 0, totalBytes = 0;
  if (cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess) {
    info.memoryUsed = totalBytes - freeBytes;
    info.memoryTotal = totalBytes;
  }
  int clockKHz = 0;
  cudaDeviceGetAttribute(&clockKHz, cudaDevAttrClockRate, im.options.device);
  const auto &build = bundle_.program().build_options();
  auto option = [&](const char *key) {
    auto it = build.find(key);
    return it == build.end() ? std::string() : it->second;
  };
  info.peakFlops = densePeakFlops(option("precision"), option("tf32") == "1",
                                  im.props.major * 10 + im.props.minor,
                                  im.props.multiProcessorCount, clockKHz * 1e3);
  return info;
}

Expected<std::vector<Executor::Span>> CudaExecutor::runProfiled(int routine) {
  FORGE_RETURN_IF_ERROR(checkLoaded(routine));
  Impl &im = *impl_;
  if (im.lastRoutine >= 0)
    FORGE_RETURN_IF_ERROR(im.finish(bundle_.origin()));
  const bundle::Routine &proto = *routines_[routine];
  RoutineState &r = im.routines[routine];
  im.lastRoutine = routine;
  const uint64_t runIndex = im.runs++;
  const int parity = static_cast<int>(r.runs++ % 2);
  r.lastParity = parity;
  const size_t n = r.steps.size();
  if (r.profileEvents.empty()) {
    r.profileEvents.resize(2 * n + 4, nullptr);
    for (cudaEvent_t &e : r.profileEvents)
      CUDA_TRY(cudaEventCreate(&e), "profiling events");
  }
  FORGE_RETURN_IF_ERROR(im.uploadInputs(r, parity));
  // Its idle-gap events too (idleBefore of this run and the next).
  CUDA_TRY(cudaEventRecord(im.runBegin[runIndex % Impl::kRunTimes], im.compute), "event record");
  FORGE_RETURN_IF_ERROR(im.enqueue(bundle_.origin(), proto, r, parity,
                                   {.checked = false, .capturing = false,
                                    .timing = &r.profileEvents}));
  FORGE_RETURN_IF_ERROR(im.releaseInputs(r, parity));
  CUDA_TRY(cudaEventRecord(im.runEnd[runIndex % Impl::kRunTimes], im.compute), "event record");
  FORGE_RETURN_IF_ERROR(im.finish(bundle_.origin()));

  auto ev = [&](size_t i) { return r.profileEvents[i]; };
  std::vector<Span> spans;
  auto at = [&](size_t i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev(0), ev(i));
    return 1000.0 * ms;
  };
  spans.push_back({-1, 1, "inputs in", 0, at(1)});
  for (size_t i = 0; i < n; ++i)
    // No span for a step that issues nothing: its two events alone would read as ~1.5 us of
    // "copy" (GPT-2's 85 reshapes a step: 0.6 ms of copies that no step without --profile has).
    if (!r.steps[i].issuesNothing())
      spans.push_back({r.steps[i].index, r.steps[i].kind == Step::Host ? 2 : 0, "", at(2 + 2 * i),
                       at(3 + 2 * i) - at(2 + 2 * i)});
  spans.push_back({-1, 1, "outputs out", at(2 * n + 2), at(2 * n + 3) - at(2 * n + 2)});
  return spans;
}

TensorView CudaExecutor::view(int32_t index) const {
  const bundle::Program &p = bundle_.program();
  if (index < 0 || index >= p.tensors_size())
    return {};
  const Impl &im = *impl_;
  const bundle::TensorInfo &info = p.tensors(index);
  if (!isPresent(index))
    return {};
  TensorView v;
  v.dtype = info.dtype();
  v.shape.assign(info.shape().begin(), info.shape().end());
  if (im.inputStage[index]) {
    v.data = im.inputStage[index].get();
    return v;
  }
  Status st = im.finish(bundle_.origin());
  if (!st.isOk()) {
    fmt::print(stderr, "forge-train: error: {}\n", st.message());
    return {};
  }
  // A routine output: its routine's last run's read-back buffer.
  if (const RoutineState *owner = ranOutputOwner(routineOutputs_, im.routines, index);
      owner && im.outputStage[owner->lastParity][index]) {
    v.data = im.outputStage[owner->lastParity][index].get();
    return v;
  }
  size_t bytes = byteSize(info);
  if (!im.mirror[index])
    im.mirror[index].reset(new uint8_t[std::max<size_t>(bytes, 1)]);
  if (bytes && cudaMemcpy(im.mirror[index].get(), im.devicePtr[index], bytes,
                          cudaMemcpyDeviceToHost) != cudaSuccess) {
    fmt::print(stderr, "forge-train: error: reading '{}' from the GPU: {}\n", info.name(),
               errorString(cudaGetLastError()));
    return {};
  }
  v.data = im.mirror[index].get();
  return v;
}

Status CudaExecutor::writePersistent(int32_t index, std::span<const uint8_t> bytes) {
  FORGE_RETURN_IF_ERROR(impl_->finish(bundle_.origin()));
  CUDA_TRY(cudaMemcpy(impl_->devicePtr[index], bytes.data(), bytes.size(),
                      cudaMemcpyHostToDevice),
           "writing '{}' to the GPU", tensorInfo(index).name());
  return Status::ok();
}

} // namespace forge::rt
