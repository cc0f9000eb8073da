// Normalization CPU kernels: batch_norm (inference), batch_norm_training,
// layer_norm and group_norm.
//
// Invariants: statistics are computed in double with two passes (mean, then
// squared deviations) and the biased (population) variance, as in the ONNX
// reference implementation; parameter tensors (scale, bias, mean, var) may
// have any float dtype, independently of the input's; channel dim is 1.
// batch_norm_training follows ONNX BatchNormalization training_mode:
// running = running * momentum + batch_stat * (1 - momentum), with the
// biased batch variance, or the unbiased one with `unbiased_var` (PyTorch).
#include "KernelUtil.h"

#include <algorithm>

namespace forge::rt::cpu {
namespace {

/// y[n, c, :] = x[n, c, :] * a[c] + b[c] over all planes, in parallel.
template <typename T>
void affinePerChannel(ThreadPool &pool, const T *x, T *y, int64_t n, int64_t c, int64_t plane,
                      const std::vector<double> &a, const std::vector<double> &b) {
  pool.parallelFor(n * c, std::max<int64_t>(1, kGrain / std::max<int64_t>(plane, 1)),
                   [&](int64_t p0, int64_t p1) {
                     for (int64_t p = p0; p < p1; ++p) {
                       using C = Compute<T>;
                       const C ca = static_cast<C>(a[p % c]), cb = static_cast<C>(b[p % c]);
                       const T *src = x + p * plane;
                       T *dst = y + p * plane;
                       for (int64_t i = 0; i < plane; ++i)
                         dst[i] = store<T>(load(src[i]) * ca + cb);
                     }
                   });
}

//===----------------------------------------------------------------------===//
// batch_norm / batch_norm_training
//===----------------------------------------------------------------------===//

Status batchNormKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  CPU_ASSIGN_OR_RETURN(ChannelLayout l, channelLayout(x));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, loadParam(ctx.inputs[1], l.c, "scale"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> bias, loadParam(ctx.inputs[2], l.c, "bias"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> mean, loadParam(ctx.inputs[3], l.c, "mean"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> var, loadParam(ctx.inputs[4], l.c, "var"));
  std::vector<double> a(l.c), b(l.c);
  for (int64_t c = 0; c < l.c; ++c) {
    a[c] = scale[c] / std::sqrt(var[c] + eps);
    b[c] = bias[c] - mean[c] * a[c];
  }
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    affinePerChannel(ctx.pool, x.as<const T>(), y.as<T>(), l.n, l.c, l.plane, a, b);
    return Status::ok();
  });
}

Status batchNormTrainingKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  CPU_ASSIGN_OR_RETURN(double momentum, ctx.attrs.getFloat("momentum"));
  bool unbiased = ctx.attrs.has("unbiased_var") && *ctx.attrs.getInt("unbiased_var") != 0;
  CPU_ASSIGN_OR_RETURN(ChannelLayout l, channelLayout(x));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, loadParam(ctx.inputs[1], l.c, "scale"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> bias, loadParam(ctx.inputs[2], l.c, "bias"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> runMean, loadParam(ctx.inputs[3], l.c, "running_mean"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> runVar, loadParam(ctx.inputs[4], l.c, "running_var"));
  std::vector<double> mean(l.c), var(l.c);
  FORGE_RETURN_IF_ERROR(visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>();
    // Channel c: N groups of `plane` contiguous elements, C * plane apart.
    ctx.pool.parallelFor(l.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(l.n * l.plane, 1)),
                         [&](int64_t c0, int64_t c1) {
                           for (int64_t c = c0; c < c1; ++c)
                             std::tie(mean[c], var[c]) =
                                 moments(px + c * l.plane, l.n, l.plane, l.c * l.plane);
                         });
    return Status::ok();
  }));
  std::vector<double> a(l.c), b(l.c), newMean(l.c), newVar(l.c);
  // PyTorch's running variance takes the unbiased batch variance (M values per channel).
  const int64_t count = l.n * l.plane;
  const double correction =
      unbiased && count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  for (int64_t c = 0; c < l.c; ++c) {
    a[c] = scale[c] / std::sqrt(var[c] + eps);
    b[c] = bias[c] - mean[c] * a[c];
    newMean[c] = runMean[c] * momentum + mean[c] * (1.0 - momentum);
    newVar[c] = runVar[c] * momentum + var[c] * correction * (1.0 - momentum);
  }
  FORGE_RETURN_IF_ERROR(storeParam(ctx.outputs[1], newMean, "new_running_mean"));
  FORGE_RETURN_IF_ERROR(storeParam(ctx.outputs[2], newVar, "new_running_var"));
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    affinePerChannel(ctx.pool, x.as<const T>(), y.as<T>(), l.n, l.c, l.plane, a, b);
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// layer_norm
//===----------------------------------------------------------------------===//

Status layerNormKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  if (axis < 0 || axis >= std::max<int64_t>(x.rank(), 1))
    return Status::error("axis {} out of range for rank {}", axis, x.rank());
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  std::vector<int64_t> trailing(x.shape.begin() + std::min<int64_t>(axis, x.rank()), x.shape.end());
  const int64_t d = numElements(trailing), rows = d == 0 ? 0 : x.numel() / d;
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, expandParam(ctx.inputs[1], trailing, "scale"));
  std::vector<double> bias(d, 0.0);
  if (ctx.inputs.size() > 2 && ctx.inputs[2].present()) {
    CPU_ASSIGN_OR_RETURN(bias, expandParam(ctx.inputs[2], trailing, "bias"));
  }
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>();
    T *py = y.as<T>();
    ctx.pool.parallelFor(
        rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const T *src = px + r * d;
            T *dst = py + r * d;
            auto [mean, var] = moments(src, 1, d, d);
            double inv = 1.0 / std::sqrt(var + eps);
            for (int64_t i = 0; i < d; ++i)
              dst[i] = store<T>((double(load(src[i])) - mean) * inv * scale[i] + bias[i]);
          }
        });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// group_norm
//===----------------------------------------------------------------------===//

Status groupNormKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t groups, ctx.attrs.getInt("num_groups"));
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  CPU_ASSIGN_OR_RETURN(ChannelLayout l, channelLayout(x));
  if (groups <= 0 || l.c % groups != 0)
    return Status::error("channels {} are not divisible by num_groups {}", l.c, groups);
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape));
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, loadParam(ctx.inputs[1], l.c, "scale"));
  CPU_ASSIGN_OR_RETURN(std::vector<double> bias, loadParam(ctx.inputs[2], l.c, "bias"));
  const int64_t cg = l.c / groups, len = cg * l.plane;
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>();
    T *py = y.as<T>();
    ctx.pool.parallelFor(l.n * groups, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)),
                         [&](int64_t t0, int64_t t1) {
                           for (int64_t t = t0; t < t1; ++t) {
                             const T *src = px + t * len;
                             T *dst = py + t * len;
                             auto [mean, var] = moments(src, 1, len, len);
                             double inv = 1.0 / std::sqrt(var + eps);
                             for (int64_t k = 0; k < cg; ++k) {
                               int64_t c = (t % groups) * cg + k;
                               double a = inv * scale[c], b = bias[c] - mean * a;
                               for (int64_t i = 0; i < l.plane; ++i)
                                 dst[k * l.plane + i] =
                                     store<T>(double(load(src[k * l.plane + i])) * a + b);
                             }
                           }
                         });
    return Status::ok();
  });
}

} // namespace

void registerNormKernels(Registry &r) {
  r.add("batch_norm", &batchNormKernel, 5, 5);
  r.add("batch_norm_training", &batchNormTrainingKernel, 5, 5, 3, 3);
  r.add("layer_norm", &layerNormKernel, 2, 3);
  r.add("group_norm", &groupNormKernel, 3, 3);
}

} // namespace forge::rt::cpu
