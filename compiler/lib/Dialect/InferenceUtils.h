//===- InferenceUtils.h - helpers shared by the ops' type inference -------===//
//
// Private to compiler/lib/Dialect (ForgeOps.cpp, ForgeGradOps.cpp). Shapes are
// static after import: a dynamic dim is an inference error, never a guess.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_LIB_DIALECT_INFERENCEUTILS_H
#define FORGE_LIB_DIALECT_INFERENCEUTILS_H

#include "forge/Dialect/ForgeDialect.h"
#include "forge/runtime/Window.h"

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

/// Channels-last shapes ([N, spatial..., C], set by forge-layout) and their
/// channels-first form [N, C, spatial...]: the last dim moved to position 1,
/// and back. Convolutions infer and verify in the channels-first form.
inline SmallVector<int64_t> channelsFirstShape(ArrayRef<int64_t> s) {
  SmallVector<int64_t> r(s.begin(), s.end());
  if (r.size() >= 3)
    std::rotate(r.begin() + 1, r.end() - 1, r.end());
  return r;
}
inline SmallVector<int64_t> channelsLastShape(ArrayRef<int64_t> s) {
  SmallVector<int64_t> r(s.begin(), s.end());
  if (r.size() >= 3)
    std::rotate(r.begin() + 1, r.begin() + 2, r.end());
  return r;
}
/// `t` in the channels-first form when `channelsLast`, else `t`.
inline RankedTensorType channelsFirst(RankedTensorType t, bool channelsLast) {
  if (!t || !channelsLast)
    return t;
  return RankedTensorType::get(channelsFirstShape(t.getShape()), t.getElementType());
}

/// attention's operands in `layout` "bhsd": q [B, H, Tq, D], k [B, Hk, Tk, D],
/// v [B, Hk, Tk, Dv]; "bshd": q [B, Tq, H, D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv].
/// H % Hk == 0, one float type. Returns o's shape (in the layout).
inline FailureOr<SmallVector<int64_t>> attentionShape(std::optional<Location> loc, Type qType,
                                                      Type kType, Type vType,
                                                      StringRef layout) {
  auto q = rankedOrNull(qType), k = rankedOrNull(kType), v = rankedOrNull(vType);
  if (layout != "bhsd" && layout != "bshd")
    return failInference(loc, "attention: layout must be bhsd or bshd, got '" + layout + "'");
  if (!q || !k || !v || q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return failInference(loc, "attention: q, k and v must be static [batch, heads, seq, "
                              "head_dim] tensors (bshd: [batch, seq, heads, head_dim])");
  if (!isa<FloatType>(q.getElementType()) || k.getElementType() != q.getElementType() ||
      v.getElementType() != q.getElementType())
    return failInference(loc, "attention: q, k and v must have one float element type");
  const int hd = layout == "bshd" ? 2 : 1, sd = layout == "bshd" ? 1 : 2;
  int64_t b = q.getDimSize(0), h = q.getDimSize(hd), hk = k.getDimSize(hd);
  if (k.getDimSize(0) != b || v.getDimSize(0) != b || v.getDimSize(hd) != hk || hk <= 0 ||
      h % hk != 0)
    return failInference(loc, "attention: k and v need q's batch and a head count dividing q's");
  if (k.getDimSize(3) != q.getDimSize(3) || v.getDimSize(sd) != k.getDimSize(sd))
    return failInference(loc, "attention: k needs q's head size and v k's sequence length");
  SmallVector<int64_t> o = {b, 0, 0, v.getDimSize(3)};
  o[hd] = h;
  o[sd] = q.getDimSize(sd);
  return o;
}

/// attention's optional bias: q's element type, rank 4, each dim 1 or the
/// scores' [B, H, Tq, Tk] (in both layouts), `o` o's shape in `layout`.
inline LogicalResult checkAttentionBias(std::optional<Location> loc, Type biasType, Type qType,
                                        Type kType, ArrayRef<int64_t> o, StringRef layout) {
  if (!biasType)
    return success();
  auto bias = rankedOrNull(biasType);
  auto q = cast<RankedTensorType>(qType), k = cast<RankedTensorType>(kType);
  const int hd = layout == "bshd" ? 2 : 1, sd = layout == "bshd" ? 1 : 2;
  const int64_t scores[] = {o[0], o[hd], o[sd], k.getDimSize(sd)};
  if (!bias || bias.getRank() != 4 || bias.getElementType() != q.getElementType())
    return failInference(loc, "attention: bias must be a static rank-4 tensor of q's type");
  for (int d = 0; d < 4; ++d)
    if (bias.getDimSize(d) != 1 && bias.getDimSize(d) != scores[d])
      return failInference(loc, "attention: bias must broadcast to the scores [batch, heads, "
                                "queries, keys]");
  return success();
}

/// lse's shape [B, H, Tq] from o's shape in `layout`.
inline SmallVector<int64_t> attentionLseShape(ArrayRef<int64_t> o, StringRef layout) {
  return layout == "bshd" ? SmallVector<int64_t>{o[0], o[2], o[1]}
                          : SmallVector<int64_t>{o[0], o[1], o[2]};
}

/// FLOPs of attention's two products, [B, H, Tq, Tk] x D each, the causal
/// mask skipping about half.
inline int64_t attentionFlops(Type qType, Type kType, Type vType, bool causal, StringRef layout) {
  auto q = cast<RankedTensorType>(qType), k = cast<RankedTensorType>(kType);
  auto v = cast<RankedTensorType>(vType);
  const int sd = layout == "bshd" ? 1 : 2, hd = 3 - sd;
  int64_t pairs = q.getDimSize(0) * q.getDimSize(hd) * q.getDimSize(sd) * k.getDimSize(sd);
  if (causal)
    pairs /= 2;
  return 2 * pairs * (q.getDimSize(3) + v.getDimSize(3));
}

using ::forge::rt::windowOutput; // forge/runtime/Window.h, shared with the CPU kernels

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
