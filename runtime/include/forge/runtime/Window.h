// The extent of a sliding window's output (convolutions, pools), ONNX's formula.
//
// Invariants: header-only, no dependencies, one definition for the compiler's
// shape inference and verifiers (compiler/lib/Dialect) and the CPU kernels
// (runtime/lib/cpu), so that a shape the compiler states is the one the
// runtime computes.
#ifndef FORGE_RUNTIME_WINDOW_H
#define FORGE_RUNTIME_WINDOW_H

#include <cstdint>

namespace forge::rt {

/// Output extent of a window sweep over `in`. A ceil-mode window must start
/// inside the input or its begin padding.
inline int64_t windowOutput(int64_t in, int64_t kernel, int64_t stride, int64_t padBegin,
                            int64_t padEnd, int64_t dilation, bool ceilMode) {
  int64_t effective = dilation * (kernel - 1) + 1;
  int64_t span = in + padBegin + padEnd - effective;
  if (span < 0)
    return 0;
  int64_t out = (ceilMode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceilMode && (out - 1) * stride >= in + padBegin)
    --out;
  return out;
}

} // namespace forge::rt

#endif // FORGE_RUNTIME_WINDOW_H
