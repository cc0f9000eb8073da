// conv, conv_transpose and conv_grad_weight instructions as cuDNN calls.
//
// conv is cudnnConvolutionForward (+ cudnnAddTensor for the bias); conv_transpose is the
// backward-data pass of the convolution it transposes (ONNX's ConvTranspose weight
// [C, M/group, k...] is exactly that convolution's filter); conv_grad_weight is
// cudnnConvolutionBackwardFilter. NCHW (and NCDHW), or channels-last (forge-layout's
// channels_last: [N, spatial..., C], filters [M, k..., C/group]); f32, or bf16/f16 on tensor
// cores, one type for all operands; 1-d convolutions get a unit second
// spatial dim. cuDNN pads symmetrically, so the compiler places only symmetric-pad
// convolutions on the library (passes/SelectLibrary.cpp). Math: FMA only
// (exact fp32) unless the bundle was built with --tf32. The algorithm is cuDNN's first
// heuristic choice whose workspace fits kMaxWorkspace, until tune() times the candidates.
//
// Two cuDNN interfaces (see convApi()):
//  * legacy: cudnnConvolutionForward/BackwardData/BackwardFilter with the algorithms of
//    cudnnGet*Algorithm_v7 (+ cudnnAddTensor for a bias);
//  * graph: the cuDNN frontend's graph API (ConvGraph.cpp): conv_fprop/dgrad/wgrad, a bias
//    as a fused pointwise add, and every engine cuDNN's heuristics (mode A, then the
//    fallback list) offer, which include engines the legacy algorithms do not reach (the
//    channels-last depthwise kernels: MobileNetV2 bf16 4x faster). Engines that
//    down-convert f32 inputs or reduce in less than f32 are excluded. A problem the graph
//    API refuses runs legacy.
// By default bf16/f16 convolutions take the graph API and f32 ones (TF32 or not) the legacy
// one: with --tf32 the graph API was barely faster on ResNet-50 (0.8%), and its engines do
// genuine TF32 where the legacy heuristics pick exact FMA algorithms for small problems, which
// gpu_models_tf32's cnn amplifies to 2.5-4.9% in its step-1 gradients (reproduced on the CPU
// by bench/tf32_sensitivity_cnn.py; docs/design-notes.md).
// FORGE_CONV_API=graph also puts TF32 convolutions on the graph API, =legacy every one on
// the legacy API.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/CudaApi.h"
#include "forge/runtime/Tensor.h"
#include "program.pb.h"

namespace forge::rt::cuda {

inline constexpr size_t kMaxConvWorkspace = size_t(1) << 30;

enum class ConvApi { Legacy, Auto, Graph };
/// FORGE_CONV_API (legacy|graph; else Auto: the graph API for bf16/f16), read once.
ConvApi convApi();

/// Diagnostics, read once. FORGE_CONV_TRACE (any value): each tuned problem prints its
/// chosen algorithm or graph plan to stderr. FORGE_CONV_GRAPH_KINDS (a comma list of
/// fprop, dgrad, wgrad): only those kinds may take the graph API, to bisect a mismatch.
/// FORGE_CONV_GRAPH_PLAN=i: graph-API problems take their i-th candidate plan untimed
/// (-1 when unset), to compare engines' results.
bool convTrace();
bool graphKindAllowed(int kind); // ConvGeometry::Kind
int forcedGraphPlan();

/// One convolution in the channels-first logical form both interfaces take: dims and
/// element strides of the forward convolution's input `a`, output `b` and filter `w`
/// (channels-last tensors are channels-first dims with NHWC strides).
struct ConvGeometry {
  enum Kind { Forward, BackwardData, BackwardFilter } kind = Forward;
  bundle::DType dtype = bundle::F32;
  bool tf32 = false, hasBias = false;
  std::vector<int64_t> a, aStrides, b, bStrides, w, wStrides;
  std::vector<int64_t> pads, strides, dilations; // per spatial dim (symmetric pads)
  size_t maxWorkspace = kMaxConvWorkspace; // candidates need at most this much
  std::string key() const; // equal problems, equal keys
};

/// Times candidates 0..count-1 on `stream` (one untimed run each, then three timed; `run(i)`
/// runs candidate i and may fail, which drops it). Fails only when none runs.
struct TimedCandidates {
  std::vector<size_t> ran; // in order
  size_t fastest = 0;
};
Expected<TimedCandidates> timeCandidates(size_t count, cudaStream_t stream,
                                         const std::function<Status(size_t)> &run);

/// Built graph-API convolutions by problem, shared by an executor's plans (a net repeats
/// its convolutions; a plan build can compile kernels).
struct ConvGraphCache {
  struct Entry; // ConvGraph.cpp
  std::map<std::string, std::shared_ptr<Entry>> built;
};

class ConvPlan {
public:
  static Expected<std::unique_ptr<ConvPlan>> create(const CudnnApi &api, cudnnHandle_t handle,
                                                    const bundle::Program &p,
                                                    const bundle::Instruction &inst, bool tf32,
                                                    ConvGraphCache *graphs = nullptr,
                                                    size_t maxWorkspace = kMaxConvWorkspace);
  ~ConvPlan();
  /// Whether cuDNN's graph API runs it.
  bool usesGraphApi() const { return graph_ != nullptr; }
  /// Workspace that any candidate algorithm fits in (tune() may pick any).
  size_t workspaceBytes() const;
  /// `in` are the instruction's present inputs in order, `out` its output.
  Status run(const std::vector<const void *> &in, void *out, void *workspace) const;
  /// Times cuDNN's heuristic candidates on the real operands (on `stream`, which
  /// it synchronizes) and keeps the fastest; the first call only. A candidate
  /// that fails to run is dropped; it fails only when none runs. Overwrites
  /// `out`, so the caller runs the convolution afterwards.
  Status tune(const std::vector<const void *> &in, void *out, void *workspace,
              cudaStream_t stream);

private:
  ConvPlan() = default;
  enum Kind { Forward, BackwardData, BackwardFilter } kind_ = Forward;
  const CudnnApi *api_ = nullptr;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t a_ = nullptr, b_ = nullptr, bias_ = nullptr; // per kind, see run()
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  struct Candidate {
    int algo;
    size_t workspace;
  };
  std::vector<Candidate> candidates_; // cuDNN's heuristic order, each within maxWorkspace
  int algo_ = 0;                      // the chosen candidate
  size_t workspace_ = 0;
  bool hasBias_ = false, tuned_ = false;
  std::shared_ptr<ConvGraphCache::Entry> graph_; // set: the graph API runs it
  std::string problem_; // the instruction's name and shapes (FORGE_CONV_TRACE)

  // ConvGraph.cpp: the graph-API form of `g`, or an error (cuDNN refuses it).
  static Expected<std::shared_ptr<ConvGraphCache::Entry>>
  buildGraph(const CudnnApi &api, cudnnHandle_t handle, const ConvGeometry &g,
             ConvGraphCache *cache);
  size_t graphWorkspaceBytes() const;
  Status graphRun(const std::vector<const void *> &in, void *out, void *workspace) const;
  Status graphTune(const std::vector<const void *> &in, void *out, void *workspace,
                   cudaStream_t stream);
  void traceChoice(const ConvGraphCache::Entry &e, const std::string &why) const;
};

} // namespace forge::rt::cuda
