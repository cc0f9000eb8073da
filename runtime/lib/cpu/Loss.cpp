// Loss CPU kernels: nll_loss (ONNX NegativeLogLikelihoodLoss).
//
// Invariants: input [N, C, d1...], target [N, d1...] (i32/i64), optional
// weight [C]; loss = -input[n, target, d] * weight[target], 0 where target ==
// ignore_index; "mean" divides the sum by the total weight of the targets not
// ignored (0/0 = nan when all are ignored, as in the ONNX reference). A target
// outside [0, C) that is not ignored is an error. Sums run in double.
#include "KernelUtil.h"

namespace forge::rt::cpu {
namespace {

Status nllLossKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &target = ctx.inputs[1];
  const TensorView *weight =
      ctx.inputs.size() > 2 && ctx.inputs[2].present() ? &ctx.inputs[2] : nullptr;
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::string reduction, ctx.attrs.getString("reduction"));
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return Status::error("reduction must be none, sum or mean, got '{}'", reduction);
  const bool hasIgnore = ctx.attrs.has("ignore_index");
  int64_t ignoreIndex = 0;
  if (hasIgnore) {
    CPU_ASSIGN_OR_RETURN(ignoreIndex, ctx.attrs.getInt("ignore_index"));
  }
  if (x.rank() < 2 || target.rank() != x.rank() - 1 || target.shape[0] != x.shape[0] ||
      !std::equal(target.shape.begin() + 1, target.shape.end(), x.shape.begin() + 2))
    return Status::error("nll_loss needs input [N, C, ...] and target [N, ...], got {} and {}",
                         shapeString(x.shape), shapeString(target.shape));
  const int64_t n = x.shape[0], c = x.shape[1], inner = n == 0 ? 0 : target.numel() / n;
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, reduction == "none" ? target.shape : std::vector<int64_t>{}));
  if (weight) {
    FORGE_RETURN_IF_ERROR(checkDType(*weight, x.dtype, "weight"));
    if (weight->rank() != 1 || weight->shape[0] != c)
      return Status::error("weight has shape {}, expected [{}]", shapeString(weight->shape), c);
  }

  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>();
    const T *pw = weight ? weight->as<const T>() : nullptr;
    T *py = y.as<T>();
    return visitIndex(target.dtype, [&](auto itag) -> Status {
      using I = typename decltype(itag)::type;
      const I *pt = target.as<const I>();
      double sum = 0, weightSum = 0;
      for (int64_t i = 0; i < n * inner; ++i) {
        const int64_t t = static_cast<int64_t>(pt[i]);
        double loss = 0, w = 0;
        if (!(hasIgnore && t == ignoreIndex)) {
          if (t < 0 || t >= c)
            return Status::error("target {} at position {} is outside [0, {})", t, i, c);
          w = pw ? double(load(pw[t])) : 1.0;
          loss = -double(load(px[((i / inner) * c + t) * inner + i % inner])) * w;
        }
        if (reduction == "none")
          py[i] = store<T>(loss);
        sum += loss;
        weightSum += w;
      }
      if (reduction == "sum")
        py[0] = store<T>(sum);
      else if (reduction == "mean")
        py[0] = store<T>(sum / weightSum);
      return Status::ok();
    });
  });
}

} // namespace

void registerLossKernels(Registry &r) { r.add("nll_loss", &nllLossKernel, 2, 3); }

} // namespace forge::rt::cpu
