// Convolutions through the cuDNN frontend's graph API (Conv.h, FORGE_CONV_API=graph).
//
// One graph per problem (ConvGraphCache): conv_fprop, conv_dgrad or conv_wgrad, plus a
// pointwise add of the bias for conv and conv_transpose (cuDNN's runtime fusion; the legacy
// path adds it with a second call). The candidates are the first kCandidates execution
// plans of heuristics mode A then the fallback list that build within the problem's
// workspace limit (its arena bytes, forge-plan-memory; kMaxConvWorkspace at most);
// tune() times them on the real operands once per problem (plans of one problem share the
// choice) and keeps the fastest.
//
// The frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING on the libcudnn
// handle CudaApi.cpp dlopens (Attention.cpp defines cudnn_dlhandle); frontend exceptions
// become a Status. Built without the frontend, buildGraph() refuses and the legacy path runs.
#ifdef FORGE_HAVE_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#endif

#include "cuda/Conv.h"

#include <exception>

#include <fmt/ranges.h>

namespace forge::rt::cuda {

#ifdef FORGE_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

struct ConvGraphCache::Entry {
  std::shared_ptr<fe::graph::Graph> graph;
  struct Candidate {
    int64_t index; // execution plan index
    size_t workspace;
  };
  std::vector<Candidate> candidates; // built, heuristic order
  Candidate chosen{};
  bool tuned = false;
  ConvGeometry::Kind kind = ConvGeometry::Forward;
  bool hasBias = false;
  mutable std::unordered_map<int64_t, void *> pack;
};

namespace {

// Operand uids.
enum Uid : int64_t { A = 1, W, B, Bias, Out };

std::string feMessage(fe::error_t e) {
  return fmt::format("cuDNN frontend error {}: {}", static_cast<int>(e.get_code()),
                     e.get_message());
}

constexpr int64_t kCandidates = 8;

/// The graph of `geo` with its candidate plans built, or cuDNN's refusal.
Expected<std::shared_ptr<ConvGraphCache::Entry>>
buildEntry(const CudnnApi &api, cudnnHandle_t handle, const ConvGeometry &geo,
           const std::string &key) {
  if (!api.library)
    return Status::error("cuDNN is not loaded");
  fe::cudnn_dlhandle = api.library;
  auto entry = std::make_shared<ConvGraphCache::Entry>();
  entry->kind = geo.kind;
  entry->hasBias = geo.hasBias;
  try {
    auto g = std::make_shared<fe::graph::Graph>();
    const fe::DataType_t io = geo.dtype == bundle::BF16  ? fe::DataType_t::BFLOAT16
                              : geo.dtype == bundle::F16 ? fe::DataType_t::HALF
                                                         : fe::DataType_t::FLOAT;
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char *name, int64_t uid, const std::vector<int64_t> &dims,
                      const std::vector<int64_t> &strides) {
      return g->tensor(
          fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
              strides));
    };
    auto window = [&](auto attrs) {
      attrs.set_padding(geo.pads).set_stride(geo.strides).set_dilation(geo.dilations);
      return attrs;
    };
    std::shared_ptr<fe::graph::Tensor_attributes> out;
    std::vector<int64_t> outDims, outStrides;
    if (geo.kind == ConvGeometry::Forward) {
      auto x = tensor("x", A, geo.a, geo.aStrides), w = tensor("w", W, geo.w, geo.wStrides);
      out = g->conv_fprop(x, w, window(fe::graph::Conv_fprop_attributes().set_name("conv")));
      outDims = geo.b, outStrides = geo.bStrides;
    } else if (geo.kind == ConvGeometry::BackwardData) {
      auto dy = tensor("dy", B, geo.b, geo.bStrides), w = tensor("w", W, geo.w, geo.wStrides);
      out = g->conv_dgrad(dy, w,
                          window(fe::graph::Conv_dgrad_attributes().set_name("conv_dgrad")));
      outDims = geo.a, outStrides = geo.aStrides;
    } else {
      auto x = tensor("x", A, geo.a, geo.aStrides), dy = tensor("dy", B, geo.b, geo.bStrides);
      out = g->conv_wgrad(dy, x,
                          window(fe::graph::Conv_wgrad_attributes().set_name("conv_wgrad")));
      outDims = geo.w, outStrides = geo.wStrides;
    }
    out->set_dim(outDims).set_stride(outStrides);
    if (geo.hasBias) {
      // [1, C, 1, ...] of the output's channels, strides as the output's.
      std::vector<int64_t> dims(outDims.size(), 1), strides(outDims.size(), 1);
      dims[1] = outDims[1];
      strides[0] = dims[1];
      auto bias = tensor("bias", Bias, dims, strides);
      out->set_data_type(fe::DataType_t::FLOAT); // the conv's result stays in f32 inside
      out = g->pointwise(out, bias,
                         fe::graph::Pointwise_attributes().set_name("bias").set_mode(
                             fe::PointwiseMode_t::ADD));
      out->set_dim(outDims).set_stride(outStrides);
    }
    out->set_output(true).set_uid(Out).set_data_type(io);
    fe::error_t e = g->validate();
    if (e.is_good())
      e = g->build_operation_graph(handle);
    if (e.is_good())
      e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (e.is_good()) {
      // Engines that convert f32 inputs to f16, or reduce in less than f32, are not the
      // arithmetic the bundle asked for.
      g->deselect_numeric_notes(
          {fe::NumericalNote_t::DOWN_CONVERT_INPUTS, fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION});
      g->deselect_workspace_greater_than(static_cast<int64_t>(geo.maxWorkspace));
      e = g->check_support(handle);
    }
    if (e.is_bad())
      return Status::error("{}", feMessage(e));
    const int64_t plans = g->get_execution_plan_count();
    for (int64_t i = 0; i < plans && static_cast<int64_t>(entry->candidates.size()) < kCandidates;
         ++i) {
      if (g->build_plan_at_index(i).is_bad())
        continue;
      int64_t ws = 0;
      if (g->get_workspace_size_plan_at_index(i, ws).is_bad() || ws < 0 ||
          static_cast<size_t>(ws) > geo.maxWorkspace)
        continue;
      entry->candidates.push_back({i, static_cast<size_t>(ws)});
    }
    if (entry->candidates.empty())
      return Status::error("no cuDNN execution plan builds for {}", key);
    entry->chosen = entry->candidates.front();
    entry->graph = std::move(g);
  } catch (const std::exception &ex) {
    return Status::error("the cuDNN frontend failed: {}", ex.what());
  }
  return entry;
}

} // namespace

Expected<std::shared_ptr<ConvGraphCache::Entry>>
ConvPlan::buildGraph(const CudnnApi &api, cudnnHandle_t handle, const ConvGeometry &geo,
                     ConvGraphCache *cache) {
  // Refusals are remembered too (null): a net repeats its problems, and asking cuDNN's
  // heuristics again would only cost load time.
  const std::string key = geo.key();
  if (cache)
    if (auto it = cache->built.find(key); it != cache->built.end()) {
      if (!it->second)
        return Status::error("cuDNN's graph API refused {} before", key);
      return it->second;
    }
  auto entry = buildEntry(api, handle, geo, key);
  if (cache)
    cache->built[key] = entry ? *entry : nullptr;
  return entry;
}

size_t ConvPlan::graphWorkspaceBytes() const {
  size_t bytes = 0;
  for (const auto &c : graph_->candidates)
    bytes = std::max(bytes, c.workspace);
  return bytes;
}

Status ConvPlan::graphRun(const std::vector<const void *> &in, void *out, void *workspace) const {
  ConvGraphCache::Entry &e = *graph_;
  auto &pack = e.pack;
  pack.clear();
  auto put = [&](int64_t uid, const void *p) { pack[uid] = const_cast<void *>(p); };
  switch (e.kind) {
  case ConvGeometry::Forward:
    put(A, in[0]), put(W, in[1]);
    break;
  case ConvGeometry::BackwardData:
    put(B, in[0]), put(W, in[1]);
    break;
  case ConvGeometry::BackwardFilter:
    put(A, in[0]), put(B, in[1]);
    break;
  }
  if (e.hasBias)
    put(Bias, in[2]);
  put(Out, out);
  try {
    if (fe::error_t err = e.graph->execute_plan_at_index(handle_, pack, workspace, e.chosen.index);
        err.is_bad())
      return Status::error("cuDNN convolution (graph plan {}) failed: {}", e.chosen.index,
                           feMessage(err));
  } catch (const std::exception &ex) {
    return Status::error("cuDNN convolution failed: {}", ex.what());
  }
  return Status::ok();
}

void ConvPlan::traceChoice(const ConvGraphCache::Entry &e, const std::string &why) const {
  if (!convTrace())
    return;
  auto name = [&](int64_t index) {
    std::string n;
    try {
      if (e.graph->get_plan_name_at_index(index, n).is_bad())
        n = "?";
    } catch (const std::exception &) {
      n = "?";
    }
    return n;
  };
  std::vector<std::string> all;
  for (const auto &c : e.candidates)
    all.push_back(fmt::format("{} {}", c.index, name(c.index)));
  fmt::print(stderr, "conv trace: {}: graph plan {} '{}' ({}; candidates: {})\n", problem_,
             e.chosen.index, name(e.chosen.index), why, fmt::join(all, ", "));
}

Status ConvPlan::graphTune(const std::vector<const void *> &in, void *out, void *workspace,
                           cudaStream_t stream) {
  ConvGraphCache::Entry &e = *graph_;
  if (e.tuned)
    return Status::ok();
  e.tuned = true;
  if (const int forced = forcedGraphPlan(); forced >= 0) { // a diagnostic (Conv.h)
    if (static_cast<size_t>(forced) >= e.candidates.size())
      return Status::error("FORGE_CONV_GRAPH_PLAN={}: {} has {} candidates", forced, problem_,
                           e.candidates.size());
    e.chosen = e.candidates[static_cast<size_t>(forced)];
    e.candidates = {e.chosen};
    traceChoice(e, "forced");
    return Status::ok();
  }
  if (e.candidates.size() < 2) {
    traceChoice(e, "the only candidate");
    return Status::ok();
  }
  auto timed = timeCandidates(e.candidates.size(), stream, [&](size_t i) {
    e.chosen = e.candidates[i];
    return graphRun(in, out, workspace);
  });
  if (!timed)
    return timed.status();
  std::vector<ConvGraphCache::Entry::Candidate> working;
  for (size_t i : timed->ran)
    working.push_back(e.candidates[i]);
  e.chosen = e.candidates[timed->fastest];
  e.candidates = std::move(working);
  traceChoice(e, fmt::format("the fastest of {} that ran", e.candidates.size()));
  return Status::ok();
}

#else // no cuDNN frontend

struct ConvGraphCache::Entry {};

Expected<std::shared_ptr<ConvGraphCache::Entry>>
ConvPlan::buildGraph(const CudnnApi &, cudnnHandle_t, const ConvGeometry &, ConvGraphCache *) {
  return Status::error("this build has no cuDNN frontend");
}
size_t ConvPlan::graphWorkspaceBytes() const { return 0; }
Status ConvPlan::graphRun(const std::vector<const void *> &, void *, void *) const {
  return Status::error("convolution: this build has no cuDNN frontend");
}
Status ConvPlan::graphTune(const std::vector<const void *> &, void *, void *, cudaStream_t) {
  return Status::error("convolution: this build has no cuDNN frontend");
}
void ConvPlan::traceChoice(const ConvGraphCache::Entry &, const std::string &) const {}

#endif // FORGE_HAVE_CUDNN_FRONTEND

} // namespace forge::rt::cuda
