// cudnn_fusion_probe: what cuDNN's runtime fusion (graph API) would save on ResNet-50's
// bf16 channels-last convolutions against Forge's generated batch-norm kernels (#12 item 3:
// "generated kernels, or cuDNN's runtime fusion where it is faster; measure both").
//
// Forge today runs, per convolution + training-mode BatchNorm + ReLU: the convolution
// (cuDNN graph API, y in bf16), a column-sum kernel over y (per-channel sum and sum of
// squares, f32) and a loop kernel applying the normalization and ReLU (reads y, writes z).
// cuDNN's fusions that cover the same work (the MLPerf ResNet pattern):
//   G2  conv_fprop -> genstats(y): the statistics in the convolution's epilogue;
//   G3  relu(x * scale + bias) -> conv_fprop: the previous layer's normalize + ReLU in this
//       convolution's prologue (z is never written);
//   G4  both.
// For each shape it prints each graph's best time over cuDNN's candidates (heuristics A,
// then the fallback list; 3 warm-up and 20 timed runs each), or why cuDNN refused it, and
// the memory-bound time of Forge's two separate passes at PASS_TBS (a measured figure:
// Forge's column_reduce reached 2.63 TB/s in bf16, bench/RESULTS.md), so that
//   saved ~= G1 + passes - G4   (the passes' y reads and z write, minus what G4 costs more).
//
// Build (host code, cuDNN 9 and the header-only frontend):
//   g++ -O2 -std=c++17 bench/cudnn_fusion_probe.cpp -I$FRONTEND_INCLUDE \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudnn -lnvrtc -lcudart \
//       -Wno-unused-result -o cudnn_fusion_probe
// Run: ./cudnn_fusion_probe   (LD_LIBRARY_PATH with cuDNN's and cudart's directories)
#include "cudnn_plan_timing.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

namespace {

constexpr double PASS_TBS = 2.63; // Forge's bf16 column_reduce, TB/s

struct Shape {
  const char *name;
  int64_t n, c, h, w, k, r, stride, pad;
};

std::vector<int64_t> nhwcStrides(int64_t n, int64_t c, int64_t h, int64_t w) {
  (void)n;
  return {c * h * w, 1, c * w, c};
}

enum class Kind { Conv, ConvStats, PrologueConv, PrologueConvStats };
const char *kindName(Kind k) {
  switch (k) {
  case Kind::Conv: return "G1 conv";
  case Kind::ConvStats: return "G2 conv+genstats";
  case Kind::PrologueConv: return "G3 scale-bias-relu+conv";
  case Kind::PrologueConvStats: return "G4 scale-bias-relu+conv+genstats";
  }
  return "?";
}

/// Best time in ms of `kind` on `s`, or a negative value after printing why not.
double timeGraph(cudnnHandle_t handle, const Shape &s, Kind kind, char *pool, void *ws,
                 size_t wsBytes) {
  auto g = std::make_shared<fe::graph::Graph>();
  // PROBE_HALF=1: f16 operands (the MLPerf pattern's type) instead of bf16.
  const fe::DataType_t io =
      std::getenv("PROBE_HALF") ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t oh = (s.h + 2 * s.pad - s.r) / s.stride + 1, ow = (s.w + 2 * s.pad - s.r) / s.stride + 1;
  auto x = g->tensor(fe::graph::Tensor_attributes().set_name("x").set_uid(1)
                         .set_dim({s.n, s.c, s.h, s.w}).set_stride(nhwcStrides(s.n, s.c, s.h, s.w)));
  auto w = g->tensor(fe::graph::Tensor_attributes().set_name("w").set_uid(2)
                         .set_dim({s.k, s.c, s.r, s.r}).set_stride(nhwcStrides(s.k, s.c, s.r, s.r)));
  std::shared_ptr<fe::graph::Tensor_attributes> in = x;
  const bool prologue = kind == Kind::PrologueConv || kind == Kind::PrologueConvStats;
  const bool stats = kind == Kind::ConvStats || kind == Kind::PrologueConvStats;
  if (prologue) {
    auto vec = [&](const char *name, int64_t uid) {
      return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid)
                           .set_dim({1, s.c, 1, 1}).set_stride({s.c, 1, s.c, s.c})
                           .set_data_type(io)); // f32 coefficients are refused
    };
    auto scaled = g->pointwise(in, vec("scale", 3), fe::graph::Pointwise_attributes()
                                                      .set_mode(fe::PointwiseMode_t::MUL));
    auto biased = g->pointwise(scaled, vec("bias", 4), fe::graph::Pointwise_attributes()
                                                         .set_mode(fe::PointwiseMode_t::ADD));
    in = g->pointwise(biased, fe::graph::Pointwise_attributes().set_mode(
                                  fe::PointwiseMode_t::RELU_FWD));
  }
  auto y = g->conv_fprop(in, w, fe::graph::Conv_fprop_attributes()
                                     .set_padding({s.pad, s.pad})
                                     .set_stride({s.stride, s.stride})
                                     .set_dilation({1, 1}));
  y->set_output(true).set_uid(5).set_dim({s.n, s.k, oh, ow}).set_stride(nhwcStrides(s.n, s.k, oh, ow));
  if (stats) {
    auto [sum, sq] = g->genstats(y, fe::graph::Genstats_attributes());
    sum->set_output(true).set_uid(6).set_data_type(fe::DataType_t::FLOAT);
    sq->set_output(true).set_uid(7).set_data_type(fe::DataType_t::FLOAT);
  }
  fe::error_t e = g->validate();
  if (e.is_good())
    e = g->build_operation_graph(handle);
  if (e.is_good())
    e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_good())
    e = g->check_support(handle);
  if (e.is_bad()) {
    std::printf("  %-34s refused: %s\n", kindName(kind), e.get_message().c_str());
    return -1;
  }
  // Operands carved from one pool (values do not matter for timing; zeros).
  char *p = pool;
  auto take = [&](size_t bytes) {
    char *r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  std::unordered_map<int64_t, void *> pack = {
      {1, take(s.n * s.c * s.h * s.w * 2)}, {2, take(s.k * s.c * s.r * s.r * 2)},
      {5, take(s.n * s.k * oh * ow * 2)}};
  if (prologue)
    pack[3] = take(s.c * 2), pack[4] = take(s.c * 2);
  if (stats)
    pack[6] = take(s.k * 4), pack[7] = take(s.k * 4);
  double best = -1;
  std::string bestName;
  const int64_t plans = g->get_execution_plan_count();
  for (int64_t i = 0; i < plans && i < 12; ++i) {
    int64_t need = 0;
    const float ms = timePlanAtIndex(*g, handle, pack, ws, wsBytes, i, need);
    if (ms >= 0 && (best < 0 || ms < best)) {
      best = ms;
      g->get_plan_name_at_index(i, bestName);
    }
  }
  if (best < 0)
    std::printf("  %-34s no candidate ran (%lld plans)\n", kindName(kind), (long long)plans);
  else
    std::printf("  %-34s %8.3f ms  (%s)\n", kindName(kind), best, bestName.c_str());
  return best;
}

} // namespace

int main() {
  // ResNet-50 B128, bf16, NHWC: a 1x1 expand, 3x3s of each stage, a 1x1 reduce.
  const Shape shapes[] = {
      {"layer1 1x1 64->256 56x56", 128, 64, 56, 56, 256, 1, 1, 0},
      {"layer1 3x3 64->64 56x56", 128, 64, 56, 56, 64, 3, 1, 1},
      {"layer2 3x3 128->128 28x28", 128, 128, 28, 28, 128, 3, 1, 1},
      {"layer3 1x1 1024->256 14x14", 128, 1024, 14, 14, 256, 1, 1, 0},
      {"layer3 3x3 256->256 14x14", 128, 256, 14, 14, 256, 3, 1, 1},
      {"layer4 3x3 512->512 7x7", 128, 512, 7, 7, 512, 3, 1, 1},
  };
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed\n");
    return 1;
  }
  const size_t poolBytes = size_t(1) << 30, wsBytes = size_t(1) << 30;
  char *pool = nullptr;
  void *ws = nullptr;
  if (cudaMalloc(&pool, poolBytes) != cudaSuccess || cudaMalloc(&ws, wsBytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(pool, 0, poolBytes);
  std::printf("cuDNN %zu; Forge's passes at %.2f TB/s\n", cudnnGetVersion(), PASS_TBS);
  for (const Shape &s : shapes) {
    const int64_t oh = (s.h + 2 * s.pad - s.r) / s.stride + 1;
    const double yBytes = double(s.n) * s.k * oh * oh * 2;
    // Column sums read y; normalize+ReLU reads y and writes z.
    const double passes = 3 * yBytes / (PASS_TBS * 1e12) * 1e3;
    std::printf("%s (y %.1f MB; Forge's stats + normalize/ReLU passes ~%.3f ms)\n", s.name,
                yBytes / 1e6, passes);
    double t[4];
    for (int k = 0; k < 4; ++k)
      t[k] = timeGraph(handle, s, static_cast<Kind>(k), pool, ws, wsBytes);
    if (t[0] > 0 && t[3] > 0)
      std::printf("  saved by G4 ~ %.3f ms (G1 + passes - G4)\n", t[0] + passes - t[3]);
  }
  return 0;
}
