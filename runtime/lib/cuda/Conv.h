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
// heuristic choice whose workspace fits kMaxWorkspace.
#pragma once

#include <memory>
#include <vector>

#include "cuda/CudaApi.h"
#include "forge/runtime/Tensor.h"
#include "program.pb.h"

namespace forge::rt::cuda {

inline constexpr size_t kMaxConvWorkspace = size_t(1) << 30;

class ConvPlan {
public:
  static Expected<std::unique_ptr<ConvPlan>> create(const CudnnApi &api, cudnnHandle_t handle,
                                                    const bundle::Program &p,
                                                    const bundle::Instruction &inst, bool tf32);
  ~ConvPlan();
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
  std::vector<Candidate> candidates_; // cuDNN's heuristic order, each within kMaxConvWorkspace
  int algo_ = 0;                      // the chosen candidate
  size_t workspace_ = 0;
  bool hasBias_ = false, tuned_ = false;
};

} // namespace forge::rt::cuda
