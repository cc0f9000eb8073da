// cuDNN convolution plans (Conv.h).
#include "cuda/Conv.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <fmt/ranges.h>

namespace forge::rt::cuda {

namespace {

#define DNN_CHECK(call)                                                                         \
  do {                                                                                          \
    cudnnStatus_t status_ = (call);                                                             \
    if (status_ != CUDNN_STATUS_SUCCESS)                                                        \
      return Status::error("cuDNN {} failed: {}", #call, api.cudnnGetErrorString(status_));     \
  } while (0)

std::vector<int> dimsOf(const bundle::Program &p, int32_t t) {
  std::vector<int> d;
  for (int64_t v : p.tensors(t).shape())
    d.push_back(static_cast<int>(v));
  return d;
}

std::vector<int64_t> intsAttr(const bundle::Instruction &inst, const char *name) {
  auto it = inst.attrs().find(name);
  if (it == inst.attrs().end() || it->second.value_case() != bundle::Attribute::kInts)
    return {};
  return {it->second.ints().values().begin(), it->second.ints().values().end()};
}

std::vector<int> packedStrides(const std::vector<int> &dims) {
  std::vector<int> s(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * dims[d + 1];
  return s;
}

} // namespace

Expected<TimedCandidates> timeCandidates(size_t count, cudaStream_t stream,
                                         const std::function<Status(size_t)> &run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
    return Status::error("cudaEventCreate failed while tuning a convolution");
  // A candidate that does not run (cuDNN ranks some it then rejects for these
  // operands) is dropped, not fatal; tuning fails only when none runs.
  constexpr int kRuns = 3; // after one untimed run of each candidate
  TimedCandidates result;
  float best = 0;
  Status lastFailure;
  for (size_t c = 0; c < count; ++c) {
    Status status = run(c); // warm-up (and: does it run at all?)
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    cudaEventRecord(start, stream);
    for (int i = 0; i < kRuns && status.isOk(); ++i)
      status = run(c);
    cudaEventRecord(stop, stream);
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    float ms = 0;
    if (cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return Status::error("CUDA error while timing convolution candidate {}: {}", c,
                           cudaGetErrorString(cudaGetLastError()));
    }
    if (result.ran.empty() || ms < best) {
      best = ms;
      result.fastest = c;
    }
    result.ran.push_back(c);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (result.ran.empty())
    return lastFailure;
  return result;
}

ConvApi convApi() {
  static const ConvApi api = [] {
    const char *v = std::getenv("FORGE_CONV_API");
    const std::string api = v ? v : "";
    return api == "legacy" ? ConvApi::Legacy : api == "graph" ? ConvApi::Graph : ConvApi::Auto;
  }();
  return api;
}

bool convTrace() {
  static const bool on = std::getenv("FORGE_CONV_TRACE") != nullptr;
  return on;
}

bool graphKindAllowed(int kind) {
  static const std::string kinds = [] {
    const char *v = std::getenv("FORGE_CONV_GRAPH_KINDS");
    return v ? "," + std::string(v) + "," : std::string();
  }();
  if (kinds.empty())
    return true;
  static const char *names[] = {",fprop,", ",dgrad,", ",wgrad,"};
  return kind >= 0 && kind < 3 && kinds.find(names[kind]) != std::string::npos;
}

int forcedGraphPlan() {
  static const int plan = [] {
    const char *v = std::getenv("FORGE_CONV_GRAPH_PLAN");
    return v && *v ? std::atoi(v) : -1;
  }();
  return plan;
}

std::string ConvGeometry::key() const {
  return fmt::format("{} {} tf32 {} bias {} a [{}]/[{}] b [{}]/[{}] w [{}]/[{}] pads [{}] "
                     "strides [{}] dilations [{}] workspace {}",
                     static_cast<int>(kind), static_cast<int>(dtype), tf32, hasBias,
                     fmt::join(a, ","), fmt::join(aStrides, ","), fmt::join(b, ","),
                     fmt::join(bStrides, ","), fmt::join(w, ","), fmt::join(wStrides, ","),
                     fmt::join(pads, ","), fmt::join(strides, ","), fmt::join(dilations, ","),
                     maxWorkspace);
}

Expected<std::unique_ptr<ConvPlan>> ConvPlan::create(const CudnnApi &api, cudnnHandle_t handle,
                                                     const bundle::Program &p,
                                                     const bundle::Instruction &inst, bool tf32,
                                                     ConvGraphCache *graphs, size_t maxWorkspace) {
  std::unique_ptr<ConvPlan> plan(new ConvPlan());
  plan->api_ = &api;
  plan->handle_ = handle;
  const std::string &op = inst.op();
  plan->kind_ = op == "conv" ? Forward : op == "conv_transpose" ? BackwardData : BackwardFilter;
  if (op != "conv" && op != "conv_transpose" && op != "conv_grad_weight")
    return Status::error("op '{}' is not a convolution", op);
  if (inst.inputs_size() < 2 || inst.inputs(0) < 0 || inst.inputs(1) < 0 ||
      inst.outputs_size() != 1)
    return Status::error("{} needs two inputs and one output", op);
  // One storage type for every operand (cuDNN's legacy API; bf16/f16 are its
  // "pseudo" configurations, which accumulate in f32).
  const bundle::DType dtype = p.tensors(inst.outputs(0)).dtype();
  if (dtype != bundle::F32 && dtype != bundle::BF16 && dtype != bundle::F16)
    return Status::error("{} on cuDNN takes f32, bf16 or f16 tensors", op);
  for (int i = 0; i < inst.inputs_size(); ++i)
    if (inst.inputs(i) >= 0 && p.tensors(inst.inputs(i)).dtype() != dtype)
      return Status::error("{} on cuDNN takes operands of one type (input {} differs)", op, i);
  const cudnnDataType_t dnnType = dtype == bundle::F32    ? CUDNN_DATA_FLOAT
                                  : dtype == bundle::BF16 ? CUDNN_DATA_BFLOAT16
                                                          : CUDNN_DATA_HALF;
  // forge-layout's channels-last form: tensors [N, spatial..., C] and filters
  // [M, k..., C/group] in memory; cuDNN's descriptors take the channels-first
  // dims with NHWC strides (filters: the NHWC format).
  auto last = inst.attrs().find("channels_last");
  const bool channelsLast = last != inst.attrs().end() && last->second.i() != 0;
  auto logical = [&](std::vector<int> d) {
    if (channelsLast && d.size() >= 3)
      std::rotate(d.begin() + 1, d.end() - 1, d.end());
    return d;
  };
  std::vector<int> x = logical(dimsOf(p, inst.inputs(0)));
  std::vector<int> second = logical(dimsOf(p, inst.inputs(1)));
  std::vector<int> y = logical(dimsOf(p, inst.outputs(0)));
  const int spatial = static_cast<int>(x.size()) - 2;
  if (spatial < 1 || spatial > 3)
    return Status::error("{} with {} spatial dims has no cuDNN form", op, spatial);
  std::vector<int64_t> strides = intsAttr(inst, "strides"), pads = intsAttr(inst, "pads"),
                       dilations = intsAttr(inst, "dilations");
  auto groupIt = inst.attrs().find("group");
  int groups = groupIt != inst.attrs().end() ? static_cast<int>(groupIt->second.i()) : 1;
  if (static_cast<int>(strides.size()) != spatial || static_cast<int>(dilations.size()) != spatial ||
      static_cast<int>(pads.size()) != 2 * spatial)
    return Status::error("{}: strides/dilations/pads do not match {} spatial dims", op, spatial);
  std::vector<int> padA, strideA, dilationA;
  for (int d = 0; d < spatial; ++d) {
    if (pads[d] != pads[d + spatial])
      return Status::error("{}: asymmetric pads have no cuDNN form", op);
    padA.push_back(static_cast<int>(pads[d]));
    strideA.push_back(static_cast<int>(strides[d]));
    dilationA.push_back(static_cast<int>(dilations[d]));
  }
  // The filter: conv's weight, conv_transpose's weight, conv_grad_weight's result.
  std::vector<int> w = plan->kind_ == BackwardFilter ? y : second;
  // The forward convolution's input and output ("a" and "b" below).
  std::vector<int> a = x, b = plan->kind_ == Forward ? y : plan->kind_ == BackwardData ? x : second;
  if (plan->kind_ == BackwardData)
    a = y; // conv_transpose: its output is the transposed convolution's input
  if (spatial == 1) {
    for (auto *v : {&a, &b, &w})
      v->push_back(1);
    padA.push_back(0);
    strideA.push_back(1);
    dilationA.push_back(1);
  }
  const int nd = static_cast<int>(a.size());
  // Strides of logical dims `d` (channels-first order): packed channels-first,
  // or packed channels-last (the channel innermost, then the spatial dims).
  auto stridesOf = [&](const std::vector<int> &d) {
    if (!channelsLast)
      return packedStrides(d);
    std::vector<int> s(d.size());
    int step = 1;
    s[1] = step;
    step *= d[1];
    for (int i = static_cast<int>(d.size()) - 1; i >= 2; --i) {
      s[i] = step;
      step *= d[i];
    }
    s[0] = step;
    return s;
  };
  DNN_CHECK(api.cudnnCreateTensorDescriptor(&plan->a_));
  DNN_CHECK(api.cudnnCreateTensorDescriptor(&plan->b_));
  DNN_CHECK(api.cudnnCreateFilterDescriptor(&plan->w_));
  DNN_CHECK(api.cudnnCreateConvolutionDescriptor(&plan->conv_));
  DNN_CHECK(api.cudnnSetTensorNdDescriptor(plan->a_, dnnType, nd, a.data(), stridesOf(a).data()));
  DNN_CHECK(api.cudnnSetTensorNdDescriptor(plan->b_, dnnType, nd, b.data(), stridesOf(b).data()));
  DNN_CHECK(api.cudnnSetFilterNdDescriptor(
      plan->w_, dnnType, channelsLast ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, nd, w.data()));
  DNN_CHECK(api.cudnnSetConvolutionNdDescriptor(plan->conv_, nd - 2, padA.data(), strideA.data(),
                                                dilationA.data(), CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT));
  DNN_CHECK(api.cudnnSetConvolutionGroupCount(plan->conv_, groups));
  // bf16/f16 run on tensor cores; f32 on them (TF32) only with --tf32.
  DNN_CHECK(api.cudnnSetConvolutionMathType(
      plan->conv_, dtype != bundle::F32 || tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  if (inst.inputs_size() > 2 && inst.inputs(2) >= 0 && plan->kind_ != BackwardFilter) {
    plan->hasBias_ = true;
    std::vector<int> bias(static_cast<size_t>(nd), 1);
    bias[1] = b[1];
    if (plan->kind_ == BackwardData)
      bias[1] = a[1];
    DNN_CHECK(api.cudnnCreateTensorDescriptor(&plan->bias_));
    DNN_CHECK(api.cudnnSetTensorNdDescriptor(plan->bias_, dnnType, nd, bias.data(),
                                             packedStrides(bias).data()));
  }

  if (convTrace())
    plan->problem_ = fmt::format("{} '{}' a [{}] b [{}] w [{}] dtype {} tf32 {}", op, inst.name(),
                                 fmt::join(a, ","), fmt::join(b, ","), fmt::join(w, ","),
                                 static_cast<int>(dtype), tf32);
  // bf16/f16 (and TF32 when asked) through the graph API, whose engines include ones the
  // legacy algorithms do not reach; a problem it refuses runs legacy (Conv.h).
  const ConvApi which = convApi();
  if (((which == ConvApi::Auto && dtype != bundle::F32) ||
       (which == ConvApi::Graph && (dtype != bundle::F32 || tf32))) &&
      graphKindAllowed(plan->kind_)) {
    ConvGeometry g;
    g.kind = static_cast<ConvGeometry::Kind>(plan->kind_);
    g.dtype = dtype;
    g.tf32 = tf32;
    g.hasBias = plan->hasBias_;
    auto widen = [](const std::vector<int> &v) { return std::vector<int64_t>(v.begin(), v.end()); };
    g.a = widen(a), g.aStrides = widen(stridesOf(a));
    g.b = widen(b), g.bStrides = widen(stridesOf(b));
    g.w = widen(w), g.wStrides = widen(stridesOf(w));
    g.pads = widen(padA), g.strides = widen(strideA), g.dilations = widen(dilationA);
    g.maxWorkspace = maxWorkspace;
    auto built = buildGraph(api, handle, g, graphs);
    if (built) {
      plan->graph_ = built.take();
      return plan;
    }
  }

  // cuDNN's heuristic ranking: the algorithms that work within the limit are
  // the candidates (tune() times them), the first is the choice until then.
  constexpr int kCandidates = 8;
  int found = 0;
  auto pick = [&](auto *results, auto workspaceOf) -> Status {
    for (int i = 0; i < found; ++i) {
      if (results[i].status != CUDNN_STATUS_SUCCESS)
        continue;
      size_t bytes = 0;
      if (workspaceOf(results[i].algo, bytes) != CUDNN_STATUS_SUCCESS || bytes > maxWorkspace)
        continue;
      plan->candidates_.push_back({static_cast<int>(results[i].algo), bytes});
    }
    if (!plan->candidates_.empty()) {
      plan->algo_ = plan->candidates_[0].algo;
      plan->workspace_ = plan->candidates_[0].workspace;
      return Status::ok();
    }
    return Status::error("cuDNN offers no algorithm for {} (x {}, filter {}, groups {}) within "
                         "{} bytes of workspace",
                         op, shapeString({a.begin(), a.end()}), shapeString({w.begin(), w.end()}),
                         groups, maxWorkspace);
  };
  if (plan->kind_ == Forward) {
    cudnnConvolutionFwdAlgoPerf_t r[kCandidates];
    DNN_CHECK(api.cudnnGetConvolutionForwardAlgorithm_v7(handle, plan->a_, plan->w_, plan->conv_,
                                                         plan->b_, kCandidates, &found, r));
    FORGE_RETURN_IF_ERROR(pick(r, [&](cudnnConvolutionFwdAlgo_t algo, size_t &bytes) {
      return api.cudnnGetConvolutionForwardWorkspaceSize(handle, plan->a_, plan->w_, plan->conv_,
                                                         plan->b_, algo, &bytes);
    }));
  } else if (plan->kind_ == BackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t r[kCandidates];
    DNN_CHECK(api.cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, plan->w_, plan->b_, plan->conv_, plan->a_, kCandidates, &found, r));
    FORGE_RETURN_IF_ERROR(pick(r, [&](cudnnConvolutionBwdDataAlgo_t algo, size_t &bytes) {
      return api.cudnnGetConvolutionBackwardDataWorkspaceSize(handle, plan->w_, plan->b_,
                                                              plan->conv_, plan->a_, algo, &bytes);
    }));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t r[kCandidates];
    DNN_CHECK(api.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, plan->a_, plan->b_, plan->conv_, plan->w_, kCandidates, &found, r));
    FORGE_RETURN_IF_ERROR(pick(r, [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t &bytes) {
      return api.cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, plan->a_, plan->b_, plan->conv_, plan->w_, algo, &bytes);
    }));
  }
  return plan;
}

ConvPlan::~ConvPlan() {
  if (!api_)
    return;
  for (cudnnTensorDescriptor_t d : {a_, b_, bias_})
    if (d)
      api_->cudnnDestroyTensorDescriptor(d);
  if (w_)
    api_->cudnnDestroyFilterDescriptor(w_);
  if (conv_)
    api_->cudnnDestroyConvolutionDescriptor(conv_);
}

size_t ConvPlan::workspaceBytes() const {
  if (graph_)
    return graphWorkspaceBytes();
  size_t bytes = 0;
  for (const Candidate &c : candidates_)
    bytes = std::max(bytes, c.workspace);
  return bytes;
}

Status ConvPlan::tune(const std::vector<const void *> &in, void *out, void *workspace,
                      cudaStream_t stream) {
  if (graph_)
    return graphTune(in, out, workspace, stream);
  if (tuned_ || candidates_.size() < 2)
    return Status::ok();
  tuned_ = true;
  auto timed = timeCandidates(candidates_.size(), stream, [&](size_t i) {
    algo_ = candidates_[i].algo;
    workspace_ = candidates_[i].workspace;
    return run(in, out, workspace);
  });
  if (!timed)
    return timed.status();
  std::vector<Candidate> working;
  for (size_t i : timed->ran)
    working.push_back(candidates_[i]);
  const Candidate chosen = candidates_[timed->fastest];
  candidates_ = std::move(working);
  algo_ = chosen.algo;
  workspace_ = chosen.workspace;
  if (convTrace())
    fmt::print(stderr, "conv trace: {}: legacy algorithm {} (of {} that ran)\n", problem_, algo_,
               candidates_.size());
  return Status::ok(); // the caller then runs the chosen algorithm
}

Status ConvPlan::run(const std::vector<const void *> &in, void *out, void *workspace) const {
  if (graph_)
    return graphRun(in, out, workspace);
  const CudnnApi &api = *api_;
  const float one = 1.0f, zero = 0.0f;
  switch (kind_) {
  case Forward: // a = x, b = y
    DNN_CHECK(api.cudnnConvolutionForward(handle_, &one, a_, in[0], w_, in[1], conv_,
                                          static_cast<cudnnConvolutionFwdAlgo_t>(algo_),
                                          workspace, workspace_, &zero, b_, out));
    if (hasBias_)
      DNN_CHECK(api.cudnnAddTensor(handle_, &one, bias_, in[2], &one, b_, out));
    break;
  case BackwardData: // a = the result (y), b = the input (x)
    DNN_CHECK(api.cudnnConvolutionBackwardData(handle_, &one, w_, in[1], b_, in[0], conv_,
                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(algo_),
                                               workspace, workspace_, &zero, a_, out));
    if (hasBias_)
      DNN_CHECK(api.cudnnAddTensor(handle_, &one, bias_, in[2], &one, a_, out));
    break;
  case BackwardFilter: // a = x, b = dy
    DNN_CHECK(api.cudnnConvolutionBackwardFilter(
        handle_, &one, a_, in[0], b_, in[1], conv_,
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo_), workspace, workspace_, &zero, w_,
        out));
    break;
  }
  return Status::ok();
}

} // namespace forge::rt::cuda
