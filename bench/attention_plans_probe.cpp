// attention_plans_probe: every plan cuDNN offers for GPT-2 124M's fused attention, timed
// (#11 item 5: the attention backward is the kernel furthest above its floor in
// `forgec --dump-dir`'s costs.txt: 3.4-4.2 ms a step on an H100 against 12 x 64.4 GFLOP
// = 1.10 ms at 700 TFLOP/s).
//
// Forge's runtime (runtime/lib/cuda/Attention.cpp) builds heuristics A's first plan for
// each attention problem. This builds the same graphs (bf16 I/O, f32 compute, causal,
// layout bshd with q, k and v read as views of the fused [B, T, 3 * H * D] projection and
// dq, dk, dv written as views of one such buffer, o and do contiguous), asks heuristics A,
// B and the fallback list for their plans, and times each (3 warm-up and 20 timed runs),
// with TFLOP/s at the causal FLOPs (forward 2 B H T^2 D, backward 2.5 times that), then
// heuristics A's plans for two other layouts (each tensor contiguous bshd; bhsd). If a
// plan other than A's first were clearly faster, Attention.cpp should time its candidates
// as Matmul.cpp times cuBLASLt's. On an H100 with cuDNN 9.19 (RESULTS, thirty-third
// session) A's first was the fastest everywhere, and bhsd saved 0-5%.
//
// Build (host code, cuDNN 9 and the header-only frontend, as bench/cudnn_fusion_probe.cpp):
//   g++ -O2 -std=c++17 bench/attention_plans_probe.cpp -I$FRONTEND_INCLUDE \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudnn -lnvrtc -lcudart \
//       -Wno-unused-result -o attention_plans_probe
// Run: ./attention_plans_probe   (LD_LIBRARY_PATH with cuDNN's and cudart's directories)
#include "cudnn_plan_timing.h"

#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

namespace {

// GPT-2 124M at the bench's batch.
constexpr int64_t B = 16, H = 12, T = 1024, D = 64, C = H * D, ROW = 3 * C;
enum Uid : int64_t { Q = 1, K, V, O, DO, LSE, DQ, DK, DV };

// The memory layout timed: Forge's (bshd, q/k/v and dq/dk/dv rows of one packed
// [B, T, 3 * H * D] buffer), bshd with each tensor contiguous, or bhsd (each head's rows
// contiguous), to see whether cuDNN's kernels care about the packed strides.
enum class Layout { PackedBshd, Bshd, Bhsd };
Layout layout = Layout::PackedBshd;

std::shared_ptr<fe::graph::Graph> buildGraph(cudnnHandle_t handle, bool grad, bool deterministic,
                                             fe::HeurMode_t mode) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> dims = {B, H, T, D}, lseDims = {B, H, T, 1};
  // [B, H, T, D] dims over bshd memory: a packed projection's rows (ROW apart) or a
  // contiguous [B, T, H, D] tensor (C apart).
  auto strides = [](int64_t row) {
    if (layout == Layout::Bhsd)
      return std::vector<int64_t>{H * T * D, T * D, D, 1};
    if (layout == Layout::Bshd)
      row = C;
    return std::vector<int64_t>{T * row, D, row, 1};
  };
  auto in = [&](const char *name, Uid uid, int64_t row) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims)
                         .set_stride(strides(row)));
  };
  auto q = in("q", Q, ROW), k = in("k", K, ROW), v = in("v", V, ROW);
  const float scale = 0.125f; // 1 / sqrt(64)
  if (!grad) {
    auto attrs = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true)
                     .set_attn_scale(scale).set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    o->set_output(true).set_uid(O).set_dim(dims).set_stride(strides(C));
    stats->set_output(true).set_uid(LSE).set_dim(lseDims)
        .set_stride({H * T, T, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = in("o", O, C), dO = in("do", DO, C);
    auto lse = g->tensor(fe::graph::Tensor_attributes().set_name("lse").set_uid(LSE)
                             .set_dim(lseDims).set_stride({H * T, T, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
    auto attrs = fe::graph::SDPA_backward_attributes().set_name("attention_grad")
                     .set_attn_scale(scale).set_causal_mask(true);
    if (deterministic)
      attrs.set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, lse, attrs);
    dq->set_output(true).set_uid(DQ).set_dim(dims).set_stride(strides(ROW));
    dk->set_output(true).set_uid(DK).set_dim(dims).set_stride(strides(ROW));
    dv->set_output(true).set_uid(DV).set_dim(dims).set_stride(strides(ROW));
  }
  fe::error_t e = g->validate();
  if (e.is_good())
    e = g->build_operation_graph(handle);
  if (e.is_good())
    e = g->create_execution_plans({mode});
  if (e.is_good())
    e = g->check_support(handle);
  if (e.is_bad()) {
    std::printf("    refused: %s\n", e.get_message().c_str());
    return nullptr;
  }
  return g;
}

void timePlans(cudnnHandle_t handle, bool grad, bool deterministic, fe::HeurMode_t mode,
               const char *modeName, std::unordered_map<int64_t, void *> &pack, void *ws,
               size_t wsBytes) {
  const double flops = 2.0 * B * H * T * T * D * (grad ? 2.5 : 1.0);
  std::printf("  %s%s, heuristics %s:\n", grad ? "backward" : "forward",
              grad ? (deterministic ? " (deterministic)" : " (atomic dq)") : "", modeName);
  auto g = buildGraph(handle, grad, deterministic, mode);
  if (!g)
    return;
  const int64_t plans = g->get_execution_plan_count();
  for (int64_t i = 0; i < plans && i < 16; ++i) {
    std::string name = "?";
    g->get_plan_name_at_index(i, name);
    int64_t need = 0;
    const float ms = timePlanAtIndex(*g, handle, pack, ws, wsBytes, i, need);
    if (ms == kPlanNotBuilt)
      std::printf("    plan %lld %s: not built\n", (long long)i, name.c_str());
    else if (ms == kPlanWorkspace)
      std::printf("    plan %lld %s: workspace %lld bytes\n", (long long)i, name.c_str(),
                  (long long)need);
    else if (ms < 0)
      std::printf("    plan %lld %s: did not run\n", (long long)i, name.c_str());
    else
      std::printf("    plan %lld %-40s %8.3f ms/layer (x12: %6.2f ms)  %6.1f TFLOP/s  ws %lld\n",
                  (long long)i, name.c_str(), ms, 12 * ms, flops / (ms * 1e-3) / 1e12,
                  (long long)need);
  }
}

} // namespace

int main() {
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed\n");
    return 1;
  }
  const size_t proj = size_t(B) * T * ROW * 2, act = size_t(B) * T * C * 2,
               lse = size_t(B) * H * T * 4, wsBytes = size_t(1) << 30;
  char *qkv = nullptr, *dqkv = nullptr, *o = nullptr, *dO = nullptr, *stats = nullptr;
  void *ws = nullptr;
  if (cudaMalloc(&qkv, proj) != cudaSuccess || cudaMalloc(&dqkv, proj) != cudaSuccess ||
      cudaMalloc(&o, act) != cudaSuccess || cudaMalloc(&dO, act) != cudaSuccess ||
      cudaMalloc(&stats, lse) != cudaSuccess || cudaMalloc(&ws, wsBytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  // Small finite values (bf16 0x3c3c ~ 0.0115; lse the same as f32): timing only.
  cudaMemset(qkv, 0x3c, proj);
  cudaMemset(o, 0x3c, act);
  cudaMemset(dO, 0x3c, act);
  cudaMemset(stats, 0x3c, lse);
  std::unordered_map<int64_t, void *> pack = {
      {Q, qkv}, {K, qkv + C * 2}, {V, qkv + 2 * C * 2}, {O, o}, {DO, dO}, {LSE, stats},
      {DQ, dqkv}, {DK, dqkv + C * 2}, {DV, dqkv + 2 * C * 2}};
  std::printf("cuDNN %zu; GPT-2 attention B%lld H%lld T%lld D%lld bf16 causal, bshd (packed qkv)\n",
              cudnnGetVersion(), (long long)B, (long long)H, (long long)T, (long long)D);
  const std::pair<fe::HeurMode_t, const char *> modes[] = {
      {fe::HeurMode_t::A, "A"}, {fe::HeurMode_t::B, "B"}, {fe::HeurMode_t::FALLBACK, "fallback"}};
  auto run = [&](fe::HeurMode_t mode, const char *name, std::unordered_map<int64_t, void *> &all) {
    std::unordered_map<int64_t, void *> fwd = {
        {Q, all[Q]}, {K, all[K]}, {V, all[V]}, {O, all[O]}, {LSE, all[LSE]}};
    timePlans(handle, false, false, mode, name, fwd, ws, wsBytes);
    timePlans(handle, true, true, mode, name, all, ws, wsBytes);
    timePlans(handle, true, false, mode, name, all, ws, wsBytes);
  };
  for (auto [mode, name] : modes)
    run(mode, name, pack);
  // The other layouts, heuristics A only: q, k, v (and dq, dk, dv) in thirds of the buffers.
  std::unordered_map<int64_t, void *> split = {{Q, qkv},   {K, qkv + act},   {V, qkv + 2 * act},
                                               {O, o},     {DO, dO},         {LSE, stats},
                                               {DQ, dqkv}, {DK, dqkv + act}, {DV, dqkv + 2 * act}};
  std::printf("layout bshd (each tensor contiguous [B, T, H, D])\n");
  layout = Layout::Bshd;
  run(fe::HeurMode_t::A, "A (bshd)", split);
  std::printf("layout bhsd (each tensor contiguous [B, H, T, D])\n");
  layout = Layout::Bhsd;
  run(fe::HeurMode_t::A, "A (bhsd)", split);
  return 0;
}
