//===- InferenceUtils.h - helpers shared by the ops' type inference -------===//
//
// Private to compiler/lib/Dialect (ForgeOps.cpp, ForgeGradOps.cpp). Shapes are
// static after import: a dynamic dim is an inference error, never a guess.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_LIB_DIALECT_INFERENCEUTILS_H
#define FORGE_LIB_DIALECT_INFERENCEUTILS_H

#include "forge/Dialect/ForgeDialect.h"

namespace mlir::forge::detail {

inline LogicalResult failInference(std::optional<Location> loc, const Twine &msg) {
  if (loc)
    return emitError(*loc) << msg;
  return failure();
}

/// `t` as a statically shaped ranked tensor, or null.
inline RankedTensorType rankedOrNull(Type t) {
  auto ranked = dyn_cast<RankedTensorType>(t);
  return ranked && ranked.hasStaticShape() ? ranked : RankedTensorType();
}

/// A tensor of `t`'s element type with `shape`.
inline Type withShape(Type t, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, cast<RankedTensorType>(t).getElementType());
}

/// attention's operands: q [B, H, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv],
/// H % Hk == 0, one float type. Returns o's shape [B, H, Tq, Dv].
inline FailureOr<SmallVector<int64_t>> attentionShape(std::optional<Location> loc, Type qType,
                                                      Type kType, Type vType) {
  auto q = rankedOrNull(qType), k = rankedOrNull(kType), v = rankedOrNull(vType);
  if (!q || !k || !v || q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return failInference(loc, "attention: q, k and v must be static [batch, heads, seq, "
                              "head_dim] tensors");
  if (!isa<FloatType>(q.getElementType()) || k.getElementType() != q.getElementType() ||
      v.getElementType() != q.getElementType())
    return failInference(loc, "attention: q, k and v must have one float element type");
  int64_t b = q.getDimSize(0), h = q.getDimSize(1), hk = k.getDimSize(1);
  if (k.getDimSize(0) != b || v.getDimSize(0) != b || v.getDimSize(1) != hk || hk <= 0 ||
      h % hk != 0)
    return failInference(loc, "attention: k and v need q's batch and a head count dividing q's");
  if (k.getDimSize(3) != q.getDimSize(3) || v.getDimSize(2) != k.getDimSize(2))
    return failInference(loc, "attention: k needs q's head size and v k's sequence length");
  return SmallVector<int64_t>{b, h, q.getDimSize(2), v.getDimSize(3)};
}

/// FLOPs of attention's two products, [B, H, Tq, Tk] x D each, the causal
/// mask skipping about half.
inline int64_t attentionFlops(Type qType, Type kType, Type vType, bool causal) {
  auto q = cast<RankedTensorType>(qType), k = cast<RankedTensorType>(kType);
  auto v = cast<RankedTensorType>(vType);
  int64_t pairs = q.getDimSize(0) * q.getDimSize(1) * q.getDimSize(2) * k.getDimSize(2);
  if (causal)
    pairs /= 2;
  return 2 * pairs * (q.getDimSize(3) + v.getDimSize(3));
}

/// Output extent of a sliding window (conv, pools; ONNX formula).
inline int64_t windowOutput(int64_t in, int64_t kernel, int64_t stride, int64_t padBegin,
                            int64_t padEnd, int64_t dilation, bool ceilMode) {
  int64_t effective = dilation * (kernel - 1) + 1;
  int64_t span = in + padBegin + padEnd - effective;
  if (span < 0)
    return 0;
  int64_t out = (ceilMode ? (span + stride - 1) / stride : span / stride) + 1;
  // A ceil-mode window must start inside the input or its begin padding.
  if (ceilMode && (out - 1) * stride >= in + padBegin)
    --out;
  return out;
}

inline LogicalResult checkSpatialAttrs(std::optional<Location> loc, int64_t spatial,
                                       ArrayRef<int64_t> strides, ArrayRef<int64_t> pads,
                                       ArrayRef<int64_t> dilations) {
  if ((int64_t)strides.size() != spatial || (int64_t)dilations.size() != spatial ||
      (int64_t)pads.size() != 2 * spatial)
    return failInference(loc, "strides/dilations need " + Twine(spatial) + " entries and pads " +
                                  Twine(2 * spatial));
  for (int64_t s : strides)
    if (s <= 0)
      return failInference(loc, "strides must be positive");
  for (int64_t d : dilations)
    if (d <= 0)
      return failInference(loc, "dilations must be positive");
  return success();
}

/// [N, C, out...] of a pool over `input` (shape [N, C, spatial...]); failure
/// (with a diagnostic at `loc`) on inconsistent attributes.
inline FailureOr<SmallVector<int64_t>>
poolOutputShape(std::optional<Location> loc, ArrayRef<int64_t> input, ArrayRef<int64_t> kernel,
                ArrayRef<int64_t> strides, ArrayRef<int64_t> pads, ArrayRef<int64_t> dilations,
                bool ceilMode) {
  if (input.size() < 3)
    return failInference(loc, "pool input must be a static N-d tensor");
  int64_t spatial = input.size() - 2;
  if ((int64_t)kernel.size() != spatial ||
      failed(checkSpatialAttrs(loc, spatial, strides, pads, dilations)))
    return failInference(loc, "pool kernel_shape needs one entry per spatial dim");
  SmallVector<int64_t> shape = {input[0], input[1]};
  for (int64_t i = 0; i < spatial; ++i)
    shape.push_back(windowOutput(input[i + 2], kernel[i], strides[i], pads[i], pads[i + spatial],
                                 dilations[i], ceilMode));
  return shape;
}

} // namespace mlir::forge::detail

#endif // FORGE_LIB_DIALECT_INFERENCEUTILS_H
