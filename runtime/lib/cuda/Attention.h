// attention and attention_grad instructions as cuDNN's fused flash attention (SDPA through
// the cuDNN graph API, built with the header-only cuDNN frontend).
//
//   attention       inputs [q, k, v(, bias)]             outputs [o, lse]
//   attention_grad  inputs [q, k, v, o, lse, do(, bias)] outputs [dq, dk, dv]
//   attrs: "scale" (f), "causal" (i, 0 or 1)
//
// bias (optional, q's type): added to the scaled scores before the softmax (an additive or
// padding mask), [B, H, Tq, Tk] with dims of 1 broadcast (stride 0 to cuDNN), in both
// layouts; no gradient; not beside causal (cuDNN's causal fill is finite, so a row whose
// visible keys the bias all masks would average the hidden ones instead of being 0).
//
// q, o, do, dq [B, H, Tq, D]; k, v, dk, dv [B, Hk, Tk, D] with H % Hk == 0 (GQA/MQA: query
// head h reads kv head h / (H / Hk)); lse [B, H, Tq] f32, the natural-log log-sum-exp over
// the visible keys of scale * q.k (cuDNN's softmax Stats, [B, H, Tq, 1] in its view). q, k,
// v, o, do, dq, dk, dv are all bf16 or all f16; dense row-major. causal: key j is visible to
// query i iff j <= i (top-left diagonal). D is a multiple of 8, at most 128. Attribute
// "layout" "bshd" (optional; default "bhsd"): the 4-d tensors are [B, T, H, D] instead, which
// cuDNN reads through strides (the compiler folds the exporters' head transposes into it).
//
// This header is light on purpose: only Attention.cpp includes the frontend's headers.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/CudaApi.h"
#include "forge/runtime/Tensor.h"
#include "program.pb.h"

namespace forge::rt::cuda {

/// An attention instruction's problem, as its tensors and attributes state it.
struct AttentionProblem {
  bool grad = false; // attention_grad
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  int64_t batch = 0, heads = 0, kvHeads = 0, queries = 0, keys = 0, headDim = 0;
  double scale = 1.0;
  bool causal = false;
  bool bshd = false; // layout "bshd": q/k/v/o (and their gradients) are [B, T, H, D]
  bool bias = false;
  std::vector<int64_t> biasStrides; // over [B, H, Tq, Tk], 0 along broadcast dims
  // bshd only: elements between consecutive tokens of q, k and v (attribute
  // row_strides: views into a fused qkv projection); empty: packed.
  std::vector<int64_t> rowStrides;
  // attention_grad, bshd only: elements between consecutive tokens of dq, dk
  // and dv (attribute out_row_strides: pieces of a concat); empty: packed.
  std::vector<int64_t> outRowStrides;
};

/// Checks an attention/attention_grad instruction (op, operand counts, ranks, shapes,
/// dtypes, head dim, H % Hk, attributes) without a GPU. The error says what is wrong;
/// callers prefix the instruction.
Expected<AttentionProblem> attentionProblem(const bundle::Program &p,
                                            const bundle::Instruction &inst);
inline Status checkAttention(const bundle::Program &p, const bundle::Instruction &inst) {
  return attentionProblem(p, inst).status();
}
inline bool isAttentionOp(const std::string &op) {
  return op == "attention" || op == "attention_grad";
}

/// Built cuDNN graphs by problem, shared by an executor's plans: a model's layers repeat one
/// attention problem, and cuDNN compiles its fused-attention engines when a plan is built
/// (about a second each on an H200).
struct AttentionCache {
  struct Entry; // the built graph (Attention.cpp)
  std::map<std::string, std::shared_ptr<Entry>> built;
};

class AttentionPlan {
public:
  /// Builds the cuDNN graph for `inst` (checked by attentionProblem first) and its
  /// execution plan (heuristics mode A, the first plan that builds). A configuration cuDNN
  /// does not support is an error carrying cuDNN's message. A problem already in `cache`
  /// (optional) reuses its graph. `deterministic`: the backward asks for cuDNN's
  /// deterministic algorithm (else, by default, its faster one, whose dq adds atomically).
  static Expected<std::unique_ptr<AttentionPlan>> create(const CudnnApi &api, cudnnHandle_t handle,
                                                         const bundle::Program &p,
                                                         const bundle::Instruction &inst,
                                                         AttentionCache *cache = nullptr,
                                                         bool deterministic = false);
  ~AttentionPlan();
  size_t workspaceBytes() const;
  /// Enqueues the attention on the handle's stream. `inputs`/`outputs` are the
  /// instruction's operands in order (device pointers).
  Status run(const std::vector<void *> &inputs, const std::vector<void *> &outputs,
             void *workspace) const;
  const AttentionProblem &problem() const { return problem_; }
  /// False when cuDNN refused the deterministic backward and the default one is used.
  bool deterministic() const;

private:
  AttentionPlan() = default;
  struct Impl; // the graph and its operand map (Attention.cpp)
  std::unique_ptr<Impl> impl_;
  cudnnHandle_t handle_ = nullptr;
  AttentionProblem problem_;
};

} // namespace forge::rt::cuda
