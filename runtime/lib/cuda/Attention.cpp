// cuDNN fused flash attention plans (Attention.h), through the cuDNN frontend's graph API.
//
// The frontend (header-only, found at configure time: runtime/CMakeLists.txt) is compiled
// here alone, with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: it resolves every cuDNN symbol with dlsym on
// cudnn_frontend::cudnn_dlhandle, which is the libcudnn handle CudaApi.cpp dlopens, so
// forge-train still starts without cuDNN. In that mode the frontend also dlopens
// libcudart.so.12/.13 itself for a few runtime calls (device properties, ...), while the
// runtime links cudart statically: two cudart copies in the process, both on the device's
// primary context, which is harmless; but libcudart.so must be findable (LD_LIBRARY_PATH,
// e.g. /usr/local/cuda/lib64) where attention runs. Frontend exceptions never escape: they
// become a Status.
//
// The backward takes cuDNN's default algorithm (atomic dq), or its deterministic one where
// the executor asks (forge-train --attention-backward deterministic: bit-identical runs,
// README invariants); where cuDNN refuses that, the default is used (deterministic() is
// false then). The plan is heuristics A's first; FORGE_ATTENTION_FWD_PLAN /
// FORGE_ATTENTION_BWD_PLAN = MODE:N pick another (planChoice: a diagnostic, to time in a
// whole step what bench/attention_plans_probe.cpp times alone).
// Built without the frontend (FORGE_HAVE_CUDNN_FRONTEND unset), the checks stay and plans
// are refused with a message saying so.
#ifdef FORGE_HAVE_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#endif

#include "cuda/Attention.h"
#include "forge/runtime/Bundle.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fmt/ranges.h>
#include <string>
#include <string_view>
#include <unordered_map>

#ifdef FORGE_HAVE_CUDNN_FRONTEND
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend
#endif

namespace forge::rt::cuda {

#ifdef FORGE_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;
#endif

namespace {

std::vector<int64_t> shapeOf(const bundle::Program &p, int32_t t) { return rt::shapeOf(p.tensors(t)); }

std::vector<int64_t> packedStrides(const std::vector<int64_t> &dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * dims[d + 1];
  return s;
}

// Operand uids: the instruction's inputs then its outputs, from 1; the bias last.
enum Uid : int64_t { Q = 1, K, V, O, Lse, DO, DQ, DK, DV, Bias };

} // namespace

Expected<AttentionProblem> attentionProblem(const bundle::Program &p,
                                            const bundle::Instruction &inst) {
  AttentionProblem pr;
  const std::string &op = inst.op();
  if (!isAttentionOp(op))
    return Status::error("op '{}' is not attention or attention_grad", op);
  pr.grad = op == "attention_grad";
  const int nIn = pr.grad ? 6 : 3, nOut = pr.grad ? 3 : 2;
  if ((inst.inputs_size() != nIn && inst.inputs_size() != nIn + 1) ||
      inst.outputs_size() != nOut)
    return Status::error("{} needs {} inputs ({}, and optionally a bias) and {} outputs ({}), "
                         "not {} and {}",
                         op, nIn, pr.grad ? "q, k, v, o, lse, do" : "q, k, v", nOut,
                         pr.grad ? "dq, dk, dv" : "o, lse", inst.inputs_size(),
                         inst.outputs_size());
  pr.bias = inst.inputs_size() == nIn + 1;
  for (int32_t t : inst.inputs())
    if (t < 0 || t >= p.tensors_size())
      return Status::error("{} has an absent or unknown operand", op);
  for (int32_t t : inst.outputs())
    if (t < 0 || t >= p.tensors_size())
      return Status::error("{} has an absent or unknown result", op);

  // Operand names and their expected shapes ("q" = [B, H, Tq, D], "k" = [B, Hk, Tk, D]).
  const char *const fwdNames[] = {"q", "k", "v", "o", "lse"};
  const char *const gradNames[] = {"q", "k", "v", "o", "lse", "do", "dq", "dk", "dv"};
  std::vector<int32_t> ids(inst.inputs().begin(), inst.inputs().begin() + nIn);
  ids.insert(ids.end(), inst.outputs().begin(), inst.outputs().end());
  auto name = [&](size_t i) { return pr.grad ? gradNames[i] : fwdNames[i]; };

  if (auto layout = inst.attrs().find("layout"); layout != inst.attrs().end()) {
    if (layout->second.value_case() != bundle::Attribute::kS ||
        (layout->second.s() != "bhsd" && layout->second.s() != "bshd"))
      return Status::error("{}: attribute 'layout' must be \"bhsd\" or \"bshd\"", op);
    pr.bshd = layout->second.s() == "bshd";
  }
  // [B, T, H, D] read as [B, H, T, D] from here on (and back for the checks below).
  auto logical = [&](std::vector<int64_t> x) {
    if (pr.bshd && x.size() == 4)
      std::swap(x[1], x[2]);
    return x;
  };
  std::vector<int64_t> q = logical(shapeOf(p, ids[0])), k = logical(shapeOf(p, ids[1]));
  if (q.size() != 4 || k.size() != 4)
    return Status::error("{}: q and k must be rank 4 ([B, H, Tq, D] and [B, Hk, Tk, D]); q is "
                         "{}, k is {}",
                         op, shapeString(q), shapeString(k));
  for (int64_t d : q)
    if (d < 1)
      return Status::error("{}: q {} has an empty dim", op, shapeString(q));
  for (int64_t d : k)
    if (d < 1)
      return Status::error("{}: k {} has an empty dim", op, shapeString(k));
  pr.batch = q[0];
  pr.heads = q[1];
  pr.queries = q[2];
  pr.headDim = q[3];
  pr.kvHeads = k[1];
  pr.keys = k[2];
  if (k[0] != pr.batch || k[3] != pr.headDim)
    return Status::error("{}: k {} does not match q {} (batch and head dim)", op, shapeString(k),
                         shapeString(q));
  if (pr.heads % pr.kvHeads != 0)
    return Status::error("{}: q's {} heads are not a multiple of k/v's {} heads", op, pr.heads,
                         pr.kvHeads);
  if (pr.headDim % 8 != 0 || pr.headDim > 128)
    return Status::error("{}: head dim {} is not a multiple of 8 at most 128 (cuDNN's fused "
                         "attention)",
                         op, pr.headDim);
  const std::vector<int64_t> qShape = q, kShape = k,
                             lseShape = {pr.batch, pr.heads, pr.queries};
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string n = name(i);
    const std::vector<int64_t> &want =
        n == "lse" ? lseShape : (n == "k" || n == "v" || n == "dk" || n == "dv") ? kShape : qShape;
    std::vector<int64_t> got = n == "lse" ? shapeOf(p, ids[i]) : logical(shapeOf(p, ids[i]));
    if (got != want)
      return Status::error("{}: {} is {}, expected {}", op, n, shapeString(got),
                           shapeString(want));
  }
  pr.dtype = p.tensors(ids[0]).dtype();
  if (pr.dtype != bundle::BF16 && pr.dtype != bundle::F16)
    return Status::error("{}: q is {}; cuDNN's fused attention takes bf16 or f16", op,
                         dtypeName(pr.dtype));
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string n = name(i);
    DType want = n == "lse" ? bundle::F32 : pr.dtype;
    if (p.tensors(ids[i]).dtype() != want)
      return Status::error("{}: {} is {}, expected {}", op, n, dtypeName(p.tensors(ids[i]).dtype()),
                           dtypeName(want));
  }

  if (pr.bias) {
    const int32_t id = inst.inputs(nIn);
    std::vector<int64_t> b = shapeOf(p, id);
    const int64_t scores[4] = {pr.batch, pr.heads, pr.queries, pr.keys};
    bool fits = b.size() == 4;
    for (size_t d = 0; fits && d < 4; ++d)
      fits = b[d] == 1 || b[d] == scores[d];
    if (!fits)
      return Status::error("{}: bias is {}, expected [B, H, Tq, Tk] = [{}, {}, {}, {}] with "
                           "dims of 1 broadcast",
                           op, shapeString(b), pr.batch, pr.heads, pr.queries, pr.keys);
    if (p.tensors(id).dtype() != pr.dtype)
      return Status::error("{}: bias is {}, expected {}", op, dtypeName(p.tensors(id).dtype()),
                           dtypeName(pr.dtype));
    pr.biasStrides = packedStrides(b);
    for (size_t d = 0; d < 4; ++d)
      if (b[d] == 1)
        pr.biasStrides[d] = 0;
  }

  auto scale = inst.attrs().find("scale");
  if (scale == inst.attrs().end() || scale->second.value_case() != bundle::Attribute::kF ||
      !std::isfinite(scale->second.f()) || scale->second.f() == 0.0)
    return Status::error("{}: attribute 'scale' must be a finite nonzero float", op);
  pr.scale = scale->second.f();
  auto causal = inst.attrs().find("causal");
  if (causal == inst.attrs().end() || causal->second.value_case() != bundle::Attribute::kI ||
      (causal->second.i() != 0 && causal->second.i() != 1))
    return Status::error("{}: attribute 'causal' must be an integer, 0 or 1", op);
  pr.causal = causal->second.i() == 1;
  if (auto rows = inst.attrs().find("row_strides"); rows != inst.attrs().end()) {
    if (rows->second.value_case() != bundle::Attribute::kInts ||
        rows->second.ints().values_size() != 3)
      return Status::error("{}: attribute 'row_strides' must be three integers (q, k, v)", op);
    if (!pr.bshd)
      return Status::error("{}: attribute 'row_strides' needs layout bshd", op);
    const int64_t own[3] = {pr.heads * pr.headDim, pr.kvHeads * pr.headDim,
                            pr.kvHeads * pr.headDim};
    for (int i = 0; i < 3; ++i) {
      int64_t r = rows->second.ints().values(i);
      if (r < own[i])
        return Status::error("{}: row_strides[{}] = {} is less than the {} elements of a token's "
                             "{} row",
                             op, i, r, own[i], "qkv"[i]);
      pr.rowStrides.push_back(r);
    }
  }
  if (auto rows = inst.attrs().find("out_row_strides"); rows != inst.attrs().end()) {
    // dq, dk, dv written into a concat's bytes (the loader checked the count and range).
    if (!pr.grad || !pr.bshd || rows->second.value_case() != bundle::Attribute::kInts ||
        rows->second.ints().values_size() != 3)
      return Status::error("{}: attribute 'out_row_strides' needs attention_grad in layout "
                           "bshd, one stride per gradient (dq, dk, dv)",
                           op);
    const int64_t own[3] = {pr.heads * pr.headDim, pr.kvHeads * pr.headDim,
                            pr.kvHeads * pr.headDim};
    for (int i = 0; i < 3; ++i) {
      const int64_t r = rows->second.ints().values(i);
      if (r != 0 && r < own[i])
        return Status::error("{}: out_row_strides[{}] = {} is less than the {} elements of a "
                             "token's d{} row",
                             op, i, r, own[i], "qkv"[i]);
      pr.outRowStrides.push_back(r == 0 ? own[i] : r);
    }
  }
  if (pr.causal && pr.bias)
    return Status::error("{}: causal with a bias: cuDNN's causal mask hides keys with a finite "
                         "fill, so a row whose visible keys the bias all masks would not be 0; "
                         "give the triangle in the bias instead",
                         op);
  return pr;
}

#ifdef FORGE_HAVE_CUDNN_FRONTEND

struct AttentionCache::Entry {
  std::shared_ptr<fe::graph::Graph> graph; // built: execute() only
  size_t workspace = 0;
  bool deterministic = true;
  int64_t planIndex = -1; // a plan chosen by the environment (planChoice), else -1
};

struct AttentionPlan::Impl {
  std::shared_ptr<AttentionCache::Entry> built;
  mutable std::unordered_map<int64_t, void *> pack; // uid -> device pointer, filled by run()
};

AttentionPlan::~AttentionPlan() = default;
size_t AttentionPlan::workspaceBytes() const { return impl_->built->workspace; }
bool AttentionPlan::deterministic() const { return impl_->built->deterministic; }

namespace {

std::string feMessage(fe::error_t e) {
  return fmt::format("cuDNN frontend error {}: {}", static_cast<int>(e.get_code()),
                     e.get_message());
}

/// Which of cuDNN's plans runs: by default heuristics A's first (build_plans).
/// FORGE_ATTENTION_FWD_PLAN / FORGE_ATTENTION_BWD_PLAN = MODE:N (MODE A, B or
/// fallback) runs plan N of that mode's list instead: a diagnostic, to time in a
/// whole step the plans bench/attention_plans_probe.cpp times alone.
struct PlanChoice {
  fe::HeurMode_t mode = fe::HeurMode_t::A;
  int64_t index = -1; // -1: build_plans' choice
};

Expected<PlanChoice> planChoice(bool grad) {
  const char *name = grad ? "FORGE_ATTENTION_BWD_PLAN" : "FORGE_ATTENTION_FWD_PLAN";
  const char *v = std::getenv(name);
  if (!v || !*v)
    return PlanChoice{};
  auto bad = [&] {
    return Status::error("{}={}: expected MODE:N, MODE one of A, B, fallback and N a plan index",
                         name, v);
  };
  std::string_view text(v);
  size_t colon = text.find(':');
  if (colon == std::string_view::npos)
    return bad();
  PlanChoice c;
  std::string_view mode = text.substr(0, colon), index = text.substr(colon + 1);
  if (mode == "A")
    c.mode = fe::HeurMode_t::A;
  else if (mode == "B")
    c.mode = fe::HeurMode_t::B;
  else if (mode == "fallback")
    c.mode = fe::HeurMode_t::FALLBACK;
  else
    return bad();
  auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), c.index);
  if (index.empty() || ec != std::errc() || end != index.data() + index.size() || c.index < 0)
    return bad();
  return c;
}

/// The graph for `pr`, built and planned; the error is the frontend's.
Expected<std::shared_ptr<fe::graph::Graph>> buildGraph(cudnnHandle_t handle,
                                                       const AttentionProblem &pr,
                                                       bool deterministic, PlanChoice choice) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(pr.dtype == bundle::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> qDims = {pr.batch, pr.heads, pr.queries, pr.headDim},
                             kDims = {pr.batch, pr.kvHeads, pr.keys, pr.headDim},
                             lseDims = {pr.batch, pr.heads, pr.queries, 1};
  // cuDNN's dims are [B, H, T, D]; layout bshd stores [B, T, H, D]: the strides say so.
  auto strides = [&](const std::vector<int64_t> &dims) {
    if (!pr.bshd || dims[3] == 1) // lse is [B, H, Tq(, 1)] in both layouts
      return packedStrides(dims);
    return std::vector<int64_t>{dims[2] * dims[1] * dims[3], dims[3], dims[1] * dims[3], 1};
  };
  auto tensor = [&](const char *name, int64_t uid, const std::vector<int64_t> &dims) {
    std::vector<int64_t> st = strides(dims);
    // q, k and v may be views into a fused projection: their tokens are a row apart.
    const int which = uid == Q ? 0 : uid == K ? 1 : uid == V ? 2 : -1;
    if (which >= 0 && !pr.rowStrides.empty()) {
      st[2] = pr.rowStrides[which];     // T
      st[0] = dims[2] * st[2];          // B
    }
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(dims)
                         .set_stride(st));
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid,
                    const std::vector<int64_t> &dims) {
    std::vector<int64_t> st = strides(dims);
    // dq, dk and dv may be pieces of a concat: their tokens are a row apart.
    const int which = uid == DQ ? 0 : uid == DK ? 1 : uid == DV ? 2 : -1;
    if (which >= 0 && !pr.outRowStrides.empty()) {
      st[2] = pr.outRowStrides[which]; // T
      st[0] = dims[2] * st[2];         // B
    }
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(st);
  };
  auto q = tensor("q", Q, qDims), k = tensor("k", K, kDims), v = tensor("v", V, kDims);
  const float scale = static_cast<float>(pr.scale);
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (pr.bias)
    bias = g->tensor(fe::graph::Tensor_attributes()
                         .set_name("bias")
                         .set_uid(Bias)
                         .set_dim({pr.batch, pr.heads, pr.queries, pr.keys})
                         .set_stride(pr.biasStrides));
  if (!pr.grad) {
    auto attrs = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true)
                     .set_attn_scale(scale);
    if (pr.causal)
      attrs.set_causal_mask(true);
    if (bias)
      attrs.set_bias(bias);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    output(o, O, qDims);
    output(stats, Lse, lseDims);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = tensor("o", O, qDims), dO = tensor("do", DO, qDims);
    auto lse = tensor("lse", Lse, lseDims);
    lse->set_data_type(fe::DataType_t::FLOAT);
    auto attrs = fe::graph::SDPA_backward_attributes().set_name("attention_grad")
                     .set_attn_scale(scale);
    if (pr.causal)
      attrs.set_causal_mask(true);
    if (deterministic)
      attrs.set_deterministic_algorithm(true);
    if (bias)
      attrs.set_bias(bias);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, lse, attrs);
    output(dq, DQ, qDims);
    output(dk, DK, kDims);
    output(dv, DV, kDims);
  }
  fe::error_t e = g->validate();
  if (e.is_good())
    e = g->build_operation_graph(handle);
  if (e.is_good())
    e = g->create_execution_plans({choice.mode});
  if (e.is_good())
    e = g->check_support(handle);
  if (e.is_good() && choice.index >= g->get_execution_plan_count())
    return Status::error("plan {} of {} (FORGE_ATTENTION_*_PLAN)", choice.index,
                         g->get_execution_plan_count());
  if (e.is_good())
    e = choice.index < 0 ? g->build_plans(handle) : g->build_plan_at_index(choice.index);
  if (e.is_bad())
    return Status::error("{}", feMessage(e));
  return g;
}

} // namespace

Expected<std::unique_ptr<AttentionPlan>> AttentionPlan::create(const CudnnApi &api,
                                                               cudnnHandle_t handle,
                                                               const bundle::Program &p,
                                                               const bundle::Instruction &inst,
                                                               AttentionCache *cache,
                                                               bool deterministic) {
  auto pr = attentionProblem(p, inst);
  if (!pr)
    return pr.status();
  if (!api.library)
    return Status::error("{}: cuDNN is not loaded", inst.op());
  fe::cudnn_dlhandle = api.library; // the same handle every time
  std::unique_ptr<AttentionPlan> plan(new AttentionPlan());
  plan->handle_ = handle;
  plan->problem_ = *pr;
  plan->impl_ = std::make_unique<Impl>();
  std::string key = fmt::format(
      "{} {} q [{}, {}, {}, {}] k/v [{}, {}, {}, {}]{}{} scale {}", inst.op(), dtypeName(pr->dtype),
      pr->batch, pr->heads, pr->queries, pr->headDim, pr->batch, pr->kvHeads, pr->keys,
      pr->headDim, pr->causal ? " causal" : "", pr->bshd ? " bshd" : "",
      static_cast<float>(pr->scale));
  if (pr->bias)
    key += fmt::format(" bias strides [{}]", fmt::join(pr->biasStrides, ", "));
  if (!pr->rowStrides.empty())
    key += fmt::format(" row strides [{}]", fmt::join(pr->rowStrides, ", "));
  if (!pr->outRowStrides.empty())
    key += fmt::format(" output row strides [{}]", fmt::join(pr->outRowStrides, ", "));
  if (pr->grad && !deterministic)
    key += " fast"; // the default backward: another graph
  if (cache)
    if (auto it = cache->built.find(key); it != cache->built.end())
      plan->impl_->built = it->second;
  if (!plan->impl_->built) {
    auto entry = std::make_shared<AttentionCache::Entry>();
    try {
      auto choice = planChoice(pr->grad);
      if (!choice)
        return choice.status();
      entry->planIndex = choice->index;
      // The forward is deterministic either way.
      entry->deterministic = !pr->grad || deterministic;
      auto g = buildGraph(handle, *pr, pr->grad && deterministic, *choice);
      if (!g && pr->grad && deterministic) { // cuDNN refused the deterministic backward: its default one
        entry->deterministic = false;
        g = buildGraph(handle, *pr, false, *choice);
      }
      if (!g)
        return g.status().prefix(fmt::format("cuDNN has no fused attention for {}", key));
      int64_t ws = 0;
      fe::error_t e = entry->planIndex < 0
                          ? (*g)->get_workspace_size(ws)
                          : (*g)->get_workspace_size_plan_at_index(entry->planIndex, ws);
      if (e.is_bad())
        return Status::error("{}: workspace size: {}", inst.op(), feMessage(e));
      entry->workspace = static_cast<size_t>(std::max<int64_t>(ws, 0));
      entry->graph = g.take();
    } catch (const std::exception &ex) {
      return Status::error("{}: the cuDNN frontend failed: {}", inst.op(), ex.what());
    }
    plan->impl_->built = entry;
    if (cache)
      cache->built[key] = std::move(entry);
  }
  for (int64_t uid = Q; uid <= (pr->grad ? DV : Lse); ++uid)
    plan->impl_->pack[uid] = nullptr;
  if (pr->bias)
    plan->impl_->pack[Bias] = nullptr;
  return plan;
}

Status AttentionPlan::run(const std::vector<void *> &inputs, const std::vector<void *> &outputs,
                          void *workspace) const {
  const size_t nIn = (problem_.grad ? 6 : 3) + (problem_.bias ? 1 : 0);
  const size_t nOut = problem_.grad ? 3 : 2;
  if (inputs.size() != nIn || outputs.size() != nOut)
    return Status::error("attention: {} inputs and {} outputs given, expected {} and {}",
                         inputs.size(), outputs.size(), nIn, nOut);
  auto &pack = impl_->pack;
  if (!problem_.grad) {
    pack[Q] = inputs[0], pack[K] = inputs[1], pack[V] = inputs[2];
    pack[O] = outputs[0], pack[Lse] = outputs[1];
  } else {
    for (int64_t i = 0; i < 6; ++i)
      pack[Q + i] = inputs[static_cast<size_t>(i)];
    for (int64_t i = 0; i < 3; ++i)
      pack[DQ + i] = outputs[static_cast<size_t>(i)];
  }
  if (problem_.bias)
    pack[Bias] = inputs.back();
  try {
    const AttentionCache::Entry &built = *impl_->built;
    fe::error_t e =
        built.planIndex < 0
            ? built.graph->execute(handle_, pack, workspace)
            : built.graph->execute_plan_at_index(handle_, pack, workspace, built.planIndex);
    if (e.is_bad())
      return Status::error("cuDNN attention failed: {}", feMessage(e));
  } catch (const std::exception &ex) {
    return Status::error("cuDNN attention failed: {}", ex.what());
  }
  return Status::ok();
}

#else // no cuDNN frontend

struct AttentionCache::Entry {};
struct AttentionPlan::Impl {};
AttentionPlan::~AttentionPlan() = default;
size_t AttentionPlan::workspaceBytes() const { return 0; }
bool AttentionPlan::deterministic() const { return false; }

Expected<std::unique_ptr<AttentionPlan>> AttentionPlan::create(const CudnnApi &, cudnnHandle_t,
                                                               const bundle::Program &p,
                                                               const bundle::Instruction &inst,
                                                               AttentionCache *, bool) {
  if (auto pr = attentionProblem(p, inst); !pr)
    return pr.status();
  return Status::error("{}: this build has no cuDNN frontend (tools/setup.sh installs the "
                       "nvidia-cudnn-frontend headers where CUDA is present; rebuild)",
                       inst.op());
}

Status AttentionPlan::run(const std::vector<void *> &, const std::vector<void *> &,
                          void *) const {
  return Status::error("attention: this build has no cuDNN frontend");
}

#endif // FORGE_HAVE_CUDNN_FRONTEND

} // namespace forge::rt::cuda
