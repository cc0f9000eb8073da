// A GPT-style LM head's cross entropy fused with its GEMM: loss and the gradient of the logits
// from x and w without ever storing the f32 logits x w^T. Three launches (LinearCrossEntropy.cu):
//   1. a CUTLASS sm90 GEMM whose epilogue writes, per row and 128-column group, f16
//      e = exp(logit - group max) into `result` and the group's (max, sum of e) pairs into the
//      workspace;
//   2. x_t[row] = x[row] . w[target[row]] in f32 (and the targets' range check);
//   3. per row: lse from the pairs, loss = lse - x_t, and the bf16 gradient
//      g (softmax - onehot) written in place over e.
//
// This header is plain C++ (no CUTLASS): LinearCrossEntropy.cu, compiled by nvcc for sm_90a
// alone, holds the kernels. Invariants: x and w bf16, K-major ([rows, k] and [columns, k],
// row-major); result bf16 [rows, columns] row-major; columns and k multiples of 8 (16-byte
// rows for TMA and the vector loads); 1 <= classes <= columns (columns from `classes` on are
// padding: masked out of the softmax, their gradient exactly 0). Runs only on a device of
// compute capability 9.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace forge::rt::cuda {

struct LinearCrossEntropy {
  int64_t rows = 0;       // tokens: x's rows, loss's and result's rows
  int64_t columns = 0;    // w's rows = result's columns (multiple of 8)
  int64_t classes = 0;    // valid classes, <= columns: columns from here on are padding
  int64_t k = 0;          // hidden size (multiple of 8)
  bool targetI32 = false; // target int32, else int64
  enum class Reduction { None, Sum, Mean } reduction = Reduction::Mean;
};

/// Scratch bytes runLinearCrossEntropy needs (ms pairs and x_t, each 256-byte aligned, and the
/// GEMM's own workspace if CUTLASS asks for one); 0 for no rows. Meaningful only for a
/// problem runLinearCrossEntropy accepts.
size_t linearCrossEntropyWorkspaceBytes(const LinearCrossEntropy &p);

/// Enqueues the three launches on `stream`. x bf16 [rows, k], w bf16 [columns, k],
/// target [rows], gradOutput f32 (a scalar, or [rows] for Reduction::None), loss f32 [rows],
/// result bf16 [rows, columns]. A target outside [0, classes) stores faultCode into *fault (a
/// device word; none when fault is null) and is clamped into range, so the run stays in
/// bounds; its row's loss and gradient are then meaningless. The workspace must be 16-byte
/// aligned. cudaErrorNotSupported when the problem cannot run here (sizes not multiples of 8,
/// classes outside [1, columns], a pointer not 16-byte aligned, dims > INT32_MAX, more than
/// 12272 column groups, too small a workspace, CUTLASS's can_implement refusing); otherwise
/// the first launch error. rows == 0: cudaSuccess, nothing enqueued.
cudaError_t runLinearCrossEntropy(const LinearCrossEntropy &p, const void *x, const void *w,
                                  const void *target, const float *gradOutput, float *loss,
                                  void *result, int32_t *fault, int32_t faultCode, void *workspace,
                                  size_t workspaceBytes, cudaStream_t stream);

} // namespace forge::rt::cuda

#ifndef __CUDACC__ // the bundle's side (protobuf, fmt) stays out of nvcc's translation unit
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Status.h"

namespace forge::rt::cuda {

/// A linear_cross_entropy_with_grad instruction's problem, checked against its tensors: x bf16
/// [N, K], w bf16 [C, K], target i32/i64 [N], grad_output f32 ([N] for reduction none, else a
/// scalar), loss f32 [N], result bf16 [N, C]; K and C multiples of 8, classes in 1..C. The
/// executor's load and checkLibraryCalls (no GPU needed) both ask it (CudaExecutor.cpp).
Expected<LinearCrossEntropy> linearCrossEntropyProblem(const bundle::Program &p,
                                                       const bundle::Instruction &inst);

} // namespace forge::rt::cuda
#endif
