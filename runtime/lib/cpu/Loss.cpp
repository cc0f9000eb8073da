// Loss CPU kernels: nll_loss (ONNX NegativeLogLikelihoodLoss).
//
// Invariants: input [N, C, d1...], target [N, d1...] (i32/i64), optional
// weight [C]; loss = -input[n, target, d] * weight[target], 0 where target ==
// ignore_index; "mean" divides the sum by the total weight of the targets not
// ignored (0/0 = nan when all are ignored, as in the ONNX reference). A target
// outside [0, C) that is not ignored is an error. Sums run in double.
//
// cross_entropy / cross_entropy_grad (forge-fuse's fused log_softmax +
// nll_loss): logits [N, C], target [N]; lse[n] = max + log(sum exp(x - max))
// in double; the loss of row n is lse[n] - x[n, t] (a reduce op after it
// takes the mean or sum); the gradient is
// g[n] * (exp(x - lse[n]) - [c == t]). A target outside [0, C) is an error.
#include "KernelUtil.h"

#include <cmath>

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

/// Checks reduction, shapes and the targets of cross_entropy(_grad); n, the
/// classes c and the row stride out (c < stride: the rows are padded, the
/// optional `classes` attribute).
Status crossEntropyShapes(KernelContext &ctx, const TensorView &x, const TensorView &target,
                          const std::string &reduction, int64_t &n, int64_t &c,
                          int64_t &stride) {
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return Status::error("reduction must be none, sum or mean, got '{}'", reduction);
  if (x.rank() != 2 || target.rank() != 1 || target.shape[0] != x.shape[0])
    return Status::error("cross_entropy needs logits [N, C] and target [N], got {} and {}",
                         shapeString(x.shape), shapeString(target.shape));
  n = x.shape[0];
  c = stride = x.shape[1];
  if (ctx.attrs.has("classes")) {
    CPU_ASSIGN_OR_RETURN(c, ctx.attrs.getInt("classes"));
    if (c < 1 || c > stride)
      return Status::error("classes {} is outside [1, {}]", c, stride);
  }
  return Status::ok();
}

/// log(sum_j exp(row[j])) over the first c values, in double.
template <typename T> double rowLogSumExp(const T *row, int64_t c) {
  double m = -INFINITY;
  for (int64_t j = 0; j < c; ++j)
    m = std::max(m, double(load(row[j])));
  double e = 0;
  for (int64_t j = 0; j < c; ++j)
    e += std::exp(double(load(row[j])) - m);
  return m + std::log(e);
}

/// g of row i: dy[i] (none), dy / n (mean) or dy (sum).
template <typename T>
double upstreamOf(const std::string &reduction, const T *dy, int64_t i, int64_t n) {
  return reduction == "none"   ? double(load(dy[i]))
         : reduction == "mean" ? double(load(dy[0])) / double(n)
                               : double(load(dy[0]));
}

/// A row's gradient g (exp(x - lse) - [j == t]) over its c logits, zero over
/// the padding up to `stride`; d may be the row itself (each value is read
/// before it is written).
template <typename T>
void rowGradient(const T *row, double lse, double g, int64_t t, int64_t c, int64_t stride,
                 T *d) {
  for (int64_t j = 0; j < c; ++j)
    d[j] = store<T>(g * (std::exp(double(load(row[j])) - lse) - (j == t ? 1.0 : 0.0)));
  for (int64_t j = c; j < stride; ++j)
    d[j] = store<T>(0.0);
}

/// cross_entropy (loss, lse) and cross_entropy_with_grad (loss and the
/// gradient from dy, one row at a time: the row's statistics, its loss, then
/// its gradient, which may be written over the logits since every value is
/// read before it is written).
Status crossEntropyRowsKernel(KernelContext &ctx, bool withGrad) {
  const TensorView &x = ctx.inputs[0], &target = ctx.inputs[1];
  TensorView &loss = ctx.outputs[0], &second = ctx.outputs[1]; // lse, or the gradient
  std::string reduction = "none";
  if (withGrad) {
    CPU_ASSIGN_OR_RETURN(reduction, ctx.attrs.getString("reduction"));
  }
  int64_t n = 0, c = 0, stride = 0;
  FORGE_RETURN_IF_ERROR(crossEntropyShapes(ctx, x, target, reduction, n, c, stride));
  FORGE_RETURN_IF_ERROR(checkDType(loss, x.dtype, "loss"));
  FORGE_RETURN_IF_ERROR(checkShape(loss, {n}));
  FORGE_RETURN_IF_ERROR(checkDType(second, x.dtype, withGrad ? "result" : "lse"));
  FORGE_RETURN_IF_ERROR(checkShape(second, withGrad ? x.shape : std::vector<int64_t>{n}));
  const TensorView *dy = withGrad ? &ctx.inputs[2] : nullptr;
  if (dy) {
    FORGE_RETURN_IF_ERROR(checkDType(*dy, x.dtype, "grad_output"));
    FORGE_RETURN_IF_ERROR(checkShape(*dy, reduction == "none" ? std::vector<int64_t>{n}
                                                              : std::vector<int64_t>{}));
  }
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pg = dy ? dy->as<const T>() : nullptr;
    T *pl = loss.as<T>(), *p2 = second.as<T>();
    return visitIndex(target.dtype, [&](auto itag) -> Status {
      using I = typename decltype(itag)::type;
      const I *pt = target.as<const I>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = static_cast<int64_t>(pt[i]);
        if (t < 0 || t >= c)
          return Status::error("target {} at position {} is outside [0, {})", t, i, c);
        const T *row = px + i * stride;
        const double l = rowLogSumExp(row, c);
        pl[i] = store<T>(l - double(load(row[t])));
        if (withGrad)
          rowGradient(row, l, upstreamOf(reduction, pg, i, n), t, c, stride, p2 + i * stride);
        else
          p2[i] = store<T>(l);
      }
      return Status::ok();
    });
  });
}

Status crossEntropyKernel(KernelContext &ctx) { return crossEntropyRowsKernel(ctx, false); }
Status crossEntropyWithGradKernel(KernelContext &ctx) { return crossEntropyRowsKernel(ctx, true); }

Status crossEntropyGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &lse = ctx.inputs[1], &target = ctx.inputs[2],
                   &dy = ctx.inputs[3];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::string reduction, ctx.attrs.getString("reduction"));
  int64_t n = 0, c = 0, stride = 0;
  FORGE_RETURN_IF_ERROR(crossEntropyShapes(ctx, x, target, reduction, n, c, stride));
  FORGE_RETURN_IF_ERROR(checkDType(lse, x.dtype, "lse"));
  FORGE_RETURN_IF_ERROR(checkDType(dy, x.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(lse, {n}));
  FORGE_RETURN_IF_ERROR(checkShape(dy, reduction == "none" ? std::vector<int64_t>{n}
                                                           : std::vector<int64_t>{}));
  FORGE_RETURN_IF_ERROR(checkShape(dx, x.shape));
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pe = lse.as<const T>(), *pg = dy.as<const T>();
    T *pd = dx.as<T>();
    return visitIndex(target.dtype, [&](auto itag) -> Status {
      using I = typename decltype(itag)::type;
      const I *pt = target.as<const I>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = static_cast<int64_t>(pt[i]);
        if (t < 0 || t >= c)
          return Status::error("target {} at position {} is outside [0, {})", t, i, c);
        rowGradient(px + i * stride, double(load(pe[i])), upstreamOf(reduction, pg, i, n), t, c,
                    stride, pd + i * stride);
      }
      return Status::ok();
    });
  });
}

/// linear_cross_entropy_with_grad: cross_entropy_with_grad of x w^T, the
/// logits of a row made in double from x's and w's values (the reference for
/// the GPU's CUTLASS form, which never stores them). The loss and grad_output
/// are x's compute type (f32, or f64 for f64 operands); the gradient may be
/// stored narrower (bf16).
Status linearCrossEntropyWithGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &w = ctx.inputs[1], &target = ctx.inputs[2],
                   &dy = ctx.inputs[3];
  TensorView &loss = ctx.outputs[0], &result = ctx.outputs[1];
  CPU_ASSIGN_OR_RETURN(std::string reduction, ctx.attrs.getString("reduction"));
  if (x.rank() != 2 || w.rank() != 2 || w.shape[1] != x.shape[1])
    return Status::error("linear_cross_entropy_with_grad needs x [N, K] and w [C, K], got {} "
                         "and {}",
                         shapeString(x.shape), shapeString(w.shape));
  FORGE_RETURN_IF_ERROR(checkDType(w, x.dtype, "w"));
  FORGE_RETURN_IF_ERROR(checkShape(result, {x.shape[0], w.shape[0]}));
  int64_t n = 0, c = 0, stride = 0;
  FORGE_RETURN_IF_ERROR(crossEntropyShapes(ctx, result, target, reduction, n, c, stride));
  const DType compute = x.dtype == DType::F64 ? DType::F64 : DType::F32;
  FORGE_RETURN_IF_ERROR(checkDType(loss, compute, "loss"));
  FORGE_RETURN_IF_ERROR(checkShape(loss, {n}));
  FORGE_RETURN_IF_ERROR(checkDType(dy, compute, "grad_output"));
  FORGE_RETURN_IF_ERROR(
      checkShape(dy, reduction == "none" ? std::vector<int64_t>{n} : std::vector<int64_t>{}));
  const int64_t k = x.shape[1];
  // The targets first, widened once: an error leaves no output half-made.
  std::vector<int64_t> targets(static_cast<size_t>(n));
  FORGE_RETURN_IF_ERROR(visitIndex(
      target.dtype,
      [&](auto itag) -> Status {
        using I = typename decltype(itag)::type;
        const I *pt = target.as<const I>();
        for (int64_t i = 0; i < n; ++i) {
          targets[i] = static_cast<int64_t>(pt[i]);
          if (targets[i] < 0 || targets[i] >= c)
            return Status::error("target {} at position {} is outside [0, {})", targets[i], i, c);
        }
        return Status::ok();
      },
      "target"));
  return visitFloat(x.dtype, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pw = w.as<const T>();
    return visitFloat(compute, [&](auto ctag) -> Status {
      using F = typename decltype(ctag)::type;
      const F *pg = dy.as<const F>();
      F *pl = loss.as<F>();
      return visitFloat(result.dtype, [&](auto rtag) -> Status {
        using R = typename decltype(rtag)::type;
        R *pr = result.as<R>();
        ctx.pool.parallelFor(n, std::max<int64_t>(1, kGrain / std::max<int64_t>(stride * k, 1)),
                             [&](int64_t lo, int64_t hi) {
                               std::vector<double> row(static_cast<size_t>(c));
                               for (int64_t i = lo; i < hi; ++i) {
                                 const int64_t t = targets[i];
                                 for (int64_t j = 0; j < c; ++j) {
                                   double sum = 0;
                                   for (int64_t q = 0; q < k; ++q)
                                     sum +=
                                         double(load(px[i * k + q])) * double(load(pw[j * k + q]));
                                   row[j] = sum;
                                 }
                                 const double lse = rowLogSumExp(row.data(), c);
                                 pl[i] = store<F>(lse - row[t]);
                                 const double g = upstreamOf(reduction, pg, i, n);
                                 for (int64_t j = 0; j < c; ++j)
                                   pr[i * stride + j] = store<R>(
                                       g * (std::exp(row[j] - lse) - (j == t ? 1.0 : 0.0)));
                                 for (int64_t j = c; j < stride; ++j)
                                   pr[i * stride + j] = store<R>(0.0);
                               }
                             });
        return Status::ok();
      });
    });
  });
}

} // namespace

void registerLossKernels(Registry &r) {
  r.add("nll_loss", &nllLossKernel, 2, 3);
  r.add("cross_entropy", &crossEntropyKernel, 2, 2, 2, 2);
  r.add("cross_entropy_grad", &crossEntropyGradKernel, 4, 4);
  r.add("cross_entropy_with_grad", &crossEntropyWithGradKernel, 3, 3, 2, 2);
  r.add("linear_cross_entropy_with_grad", &linearCrossEntropyWithGradKernel, 4, 4, 2, 2);
}

} // namespace forge::rt::cpu
