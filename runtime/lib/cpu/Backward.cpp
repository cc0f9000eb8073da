// Backward-only CPU kernels (compiler/include/forge/Dialect/ForgeGradOps.td):
// conv_grad_weight, max_pool_grad, avg_pool_grad, batch_norm_training_grad,
// layer_norm_grad, group_norm_grad, gelu_grad, relu_bitmask, relu_grad_bitmask,
// softmax_grad, log_softmax_grad,
// nll_loss_grad, gather_grad, gather_elements_grad, slice_grad and pad_grad.
//
// Invariants:
//  * each kernel is the exact adjoint of its forward kernel: windows, pads,
//    divisors, max selection and index normalization follow Pool.cpp,
//    Conv.cpp, Norm.cpp, Loss.cpp and Movement.cpp;
//  * f32/f64 compute natively, f16/bf16 are staged through f32 copies;
//    statistics and sums accumulate in double;
//  * results are fully written (scatters start from zeros); every shape,
//    attribute and index is checked before the first write;
//  * results do not depend on the thread count: parallel loops write
//    disjoint outputs, reductions across rows run in a fixed order.
#include "Im2Col.h"
#include "KernelUtil.h"
#include "forge/runtime/Bundle.h"

#include <algorithm>

namespace forge::rt::cpu {
namespace {

/// Reads the window attributes shared by conv and the pools; `sp` spatial dims.
struct WindowAttrs {
  std::vector<int64_t> kernel, strides, pads, dilations;
};

Expected<WindowAttrs> readWindowAttrs(KernelContext &ctx, int64_t sp) {
  WindowAttrs a;
  CPU_ASSIGN_OR_RETURN(a.kernel, ctx.attrs.getInts("kernel_shape"));
  CPU_ASSIGN_OR_RETURN(a.strides, ctx.attrs.getInts("strides"));
  CPU_ASSIGN_OR_RETURN(a.pads, ctx.attrs.getInts("pads"));
  CPU_ASSIGN_OR_RETURN(a.dilations, ctx.attrs.getInts("dilations"));
  if ((int64_t)a.kernel.size() != sp || (int64_t)a.strides.size() != sp ||
      (int64_t)a.dilations.size() != sp || (int64_t)a.pads.size() != 2 * sp)
    return Status::error("kernel_shape/strides/dilations need {} entries and pads {}", sp, 2 * sp);
  for (int64_t d = 0; d < sp; ++d)
    if (a.kernel[d] <= 0 || a.strides[d] <= 0 || a.dilations[d] <= 0 || a.pads[d] < 0 ||
        a.pads[d + sp] < 0)
      return Status::error("kernel_shape, strides and dilations must be positive, pads >= 0");
  return a;
}

template <typename T> void fillZero(TensorView &t) {
  std::fill(t.as<T>(), t.as<T>() + t.numel(), T(0));
}

//===----------------------------------------------------------------------===//
// conv_grad_weight: dW_g += dY_g · im2col(X_g)^T per batch element and group
//===----------------------------------------------------------------------===//

Status convGradWeightKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[1];
  TensorView &dw = ctx.outputs[0];
  if (x.rank() < 3 || dy.rank() != x.rank())
    return Status::error("input {} and grad_output {} must be N-d tensors of equal rank >= 3",
                         shapeString(x.shape), shapeString(dy.shape));
  const int64_t sp = x.rank() - 2;
  if (sp > 16)
    return Status::error("at most 16 spatial dims are supported");
  CPU_ASSIGN_OR_RETURN(WindowAttrs a, readWindowAttrs(ctx, sp));
  CPU_ASSIGN_OR_RETURN(int64_t group, ctx.attrs.getInt("group"));
  FORGE_RETURN_IF_ERROR(checkDType(dy, x.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkDType(dw, x.dtype, "result"));
  const int64_t n = x.shape[0], c = x.shape[1], m = dy.shape[1];
  if (group <= 0 || c % group != 0 || m % group != 0)
    return Status::error("channels {} and {} are not divisible by group {}", c, m, group);
  ConvGeom g;
  std::vector<int64_t> dyShape = {n, m}, dwShape = {m, c / group};
  for (int64_t d = 0; d < sp; ++d) {
    dyShape.push_back(windowOutput(x.shape[d + 2], a.kernel[d], a.strides[d], a.pads[d],
                                   a.pads[d + sp], a.dilations[d], false));
    dwShape.push_back(a.kernel[d]);
    g.image.push_back(x.shape[d + 2]);
    g.kernel.push_back(a.kernel[d]);
    g.padBegin.push_back(a.pads[d]);
  }
  FORGE_RETURN_IF_ERROR(checkShape(dy, dyShape, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkShape(dw, dwShape));
  g.cols.assign(dyShape.begin() + 2, dyShape.end());
  g.strides = a.strides;
  g.dilations = a.dilations;
  g.finalize();

  return visitGradTypes(x.dtype, ctx, &convGradWeightKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    fillZero<T>(dw);
    const int64_t cg = c / group, mg = m / group, rows = cg * g.kernelSize;
    if (rows == 0 || mg == 0 || g.colSize == 0)
      return Status::ok();
    std::vector<T> col(rows * g.colSize);
    const T *px = x.as<const T>(), *pdy = dy.as<const T>();
    T *pdw = dw.as<T>();
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t grp = 0; grp < group; ++grp) {
        im2col(ctx.pool, g, cg, px + (b * c + grp * cg) * g.imageSize, col.data());
        FORGE_RETURN_IF_ERROR(gemm(false, true, mg, rows, g.colSize, 1.0,
                                   pdy + (b * m + grp * mg) * g.colSize, g.colSize, col.data(),
                                   g.colSize, 1.0, pdw + grp * mg * rows, rows));
      }
    }
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// max_pool_grad / avg_pool_grad
//===----------------------------------------------------------------------===//

struct PoolGeom {
  std::vector<int64_t> image, out, kernel, strides, padBegin, padEnd, dilations, imageStrides;
  int64_t imageSize = 1, outSize = 1, taps = 1;
  bool countIncludePad = false;
};

/// Geometry of a pool over `inShape` whose result must be `dyShape`.
Expected<PoolGeom> readPoolGeom(KernelContext &ctx, const std::vector<int64_t> &inShape,
                                const TensorView &dy, bool isAvg) {
  if (inShape.size() < 3)
    return Status::error("pool input must have rank >= 3, got {}", shapeString(inShape));
  const int64_t sp = static_cast<int64_t>(inShape.size()) - 2;
  CPU_ASSIGN_OR_RETURN(WindowAttrs a, readWindowAttrs(ctx, sp));
  CPU_ASSIGN_OR_RETURN(int64_t ceilMode, ctx.attrs.getInt("ceil_mode"));
  PoolGeom g;
  if (isAvg) {
    CPU_ASSIGN_OR_RETURN(int64_t include, ctx.attrs.getInt("count_include_pad"));
    g.countIncludePad = include != 0;
  }
  std::vector<int64_t> outShape = {inShape[0], inShape[1]};
  for (int64_t d = 0; d < sp; ++d) {
    g.image.push_back(inShape[d + 2]);
    g.kernel.push_back(a.kernel[d]);
    g.strides.push_back(a.strides[d]);
    g.dilations.push_back(a.dilations[d]);
    g.padBegin.push_back(a.pads[d]);
    g.padEnd.push_back(a.pads[d + sp]);
    outShape.push_back(windowOutput(inShape[d + 2], a.kernel[d], a.strides[d], a.pads[d],
                                    a.pads[d + sp], a.dilations[d], ceilMode != 0));
  }
  FORGE_RETURN_IF_ERROR(checkShape(dy, outShape, "grad_output"));
  g.out.assign(outShape.begin() + 2, outShape.end());
  g.imageSize = numElements(g.image);
  g.outSize = numElements(g.out);
  g.taps = numElements(g.kernel);
  g.imageStrides = contiguousStrides(g.image);
  return g;
}

/// Calls visit(outIndex, start, tapOffsets) for every window of one plane,
/// where tapOffsets lists the image offsets of the window's in-image taps in
/// row-major tap order (the forward kernel's visiting order).
template <typename Visit> void forEachWindow(const PoolGeom &g, Visit &&visit) {
  const int64_t sp = static_cast<int64_t>(g.image.size());
  std::vector<int64_t> o(sp, 0), start(sp), k(sp);
  std::vector<int64_t> offsets;
  offsets.reserve(g.taps);
  for (int64_t oi = 0; oi < g.outSize; ++oi) {
    for (int64_t d = sp, t = oi; d-- > 0;) {
      o[d] = t % g.out[d];
      t /= g.out[d];
    }
    for (int64_t d = 0; d < sp; ++d)
      start[d] = o[d] * g.strides[d] - g.padBegin[d];
    offsets.clear();
    std::fill(k.begin(), k.end(), 0);
    for (int64_t t = 0; t < g.taps; ++t) {
      int64_t off = 0;
      bool in = true;
      for (int64_t d = 0; d < sp; ++d) {
        int64_t p = start[d] + k[d] * g.dilations[d];
        in &= p >= 0 && p < g.image[d];
        off += p * g.imageStrides[d];
      }
      if (in)
        offsets.push_back(off);
      for (int64_t d = sp; d-- > 0;) {
        if (++k[d] < g.kernel[d])
          break;
        k[d] = 0;
      }
    }
    visit(oi, start, offsets);
  }
}

Status maxPoolGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  // A bf16/f16 image or gradient beside an f32 result (a low-precision step keeps
  // the result f32): the low operands are read as f32, as the GPU kernel does.
  auto halfType = [](DType t) { return t == bundle::BF16 || t == bundle::F16; };
  if (dx.dtype == bundle::F32 && (halfType(x.dtype) || halfType(dy.dtype))) {
    const DType low = halfType(x.dtype) ? x.dtype : dy.dtype;
    for (const TensorView *t : {&x, &dy})
      if (t->dtype != low && t->dtype != bundle::F32)
        return Status::error("max_pool_grad: input {} and grad_output {} beside an f32 result",
                             dtypeName(x.dtype), dtypeName(dy.dtype));
    return low == bundle::BF16 ? runInFloat<BFloat16>(ctx, &maxPoolGradKernel)
                               : runInFloat<Half>(ctx, &maxPoolGradKernel);
  }
  FORGE_RETURN_IF_ERROR(checkDType(dy, x.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, x.shape));
  CPU_ASSIGN_OR_RETURN(PoolGeom g, readPoolGeom(ctx, x.shape, dy, false));
  const int64_t planes = x.shape[0] * x.shape[1];
  return visitGradTypes(x.dtype, ctx, &maxPoolGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pdy = dy.as<const T>();
    T *pdx = dx.as<T>();
    ctx.pool.parallelFor(planes,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(g.outSize * g.taps, 1)),
                         [&](int64_t p0, int64_t p1) {
                           for (int64_t p = p0; p < p1; ++p) {
                             const T *src = px + p * g.imageSize;
                             const T *grad = pdy + p * g.outSize;
                             T *dst = pdx + p * g.imageSize;
                             std::fill(dst, dst + g.imageSize, T(0));
                             forEachWindow(g, [&](int64_t oi, const std::vector<int64_t> &,
                                                  const std::vector<int64_t> &taps) {
                               // The forward kernel's selection: the first strictly greater
                               // value, a nan wins once seen.
                               T best = -std::numeric_limits<T>::infinity();
                               int64_t at = -1;
                               for (int64_t off : taps) {
                                 T v = src[off];
                                 if (std::isnan(best))
                                   break;
                                 if (std::isnan(v) || v > best) {
                                   best = v;
                                   at = off;
                                 }
                               }
                               if (at >= 0)
                                 dst[at] += grad[oi];
                             });
                           }
                         });
    return Status::ok();
  });
}

Status avgPoolGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> inShape, ctx.attrs.getInts("input_shape"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, inShape));
  CPU_ASSIGN_OR_RETURN(PoolGeom g, readPoolGeom(ctx, inShape, dy, true));
  const int64_t planes = inShape[0] * inShape[1];
  // Divisor of the window starting at `start`, exactly as the forward kernel.
  auto divisor = [&](const std::vector<int64_t> &start) {
    return avgPoolDivisor(start, g.image, g.kernel, g.dilations, g.padBegin, g.padEnd,
                          g.countIncludePad);
  };
  return visitGradTypes(dy.dtype, ctx, &avgPoolGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *pdy = dy.as<const T>();
    T *pdx = dx.as<T>();
    ctx.pool.parallelFor(planes,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(g.outSize * g.taps, 1)),
                         [&](int64_t p0, int64_t p1) {
                           std::vector<double> acc(g.imageSize);
                           for (int64_t p = p0; p < p1; ++p) {
                             std::fill(acc.begin(), acc.end(), 0.0);
                             const T *grad = pdy + p * g.outSize;
                             forEachWindow(g, [&](int64_t oi, const std::vector<int64_t> &start,
                                                  const std::vector<int64_t> &taps) {
                               if (taps.empty())
                                 return;
                               double share = double(grad[oi]) / divisor(start);
                               for (int64_t off : taps)
                                 acc[off] += share;
                             });
                             T *dst = pdx + p * g.imageSize;
                             for (int64_t i = 0; i < g.imageSize; ++i)
                               dst[i] = static_cast<T>(acc[i]);
                           }
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// Normalization backward
//===----------------------------------------------------------------------===//

/// The results a norm-grad op computes, by its *_grad flags (absent: null).
struct NormGradOutputs {
  TensorView *dx = nullptr, *dscale = nullptr, *dbias = nullptr;
};

Expected<NormGradOutputs> normGradOutputs(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(int64_t wantInput, ctx.attrs.getInt("input_grad"));
  CPU_ASSIGN_OR_RETURN(int64_t wantScale, ctx.attrs.getInt("scale_grad"));
  CPU_ASSIGN_OR_RETURN(int64_t wantBias, ctx.attrs.getInt("bias_grad"));
  size_t expected = (wantInput != 0) + (wantScale != 0) + (wantBias != 0);
  if (ctx.outputs.size() != expected)
    return Status::error("{} results for {} requested gradients", ctx.outputs.size(), expected);
  NormGradOutputs out;
  size_t next = 0;
  if (wantInput)
    out.dx = &ctx.outputs[next++];
  if (wantScale)
    out.dscale = &ctx.outputs[next++];
  if (wantBias)
    out.dbias = &ctx.outputs[next++];
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[2];
  FORGE_RETURN_IF_ERROR(checkDType(dy, x.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkShape(dy, x.shape, "grad_output"));
  if (out.dx) {
    FORGE_RETURN_IF_ERROR(checkDType(*out.dx, x.dtype, "input gradient"));
    FORGE_RETURN_IF_ERROR(checkShape(*out.dx, x.shape, "input gradient"));
  }
  return out;
}

/// Mean and 1/sqrt(biased variance + eps) of `groups` runs of `len`
/// contiguous elements, `stride` apart, starting at x.
template <typename T>
std::pair<double, double> meanRstd(const T *x, int64_t groups, int64_t len, int64_t stride,
                                   double eps) {
  auto [mean, var] = moments(x, groups, len, stride);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

Status batchNormTrainingGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[2];
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  CPU_ASSIGN_OR_RETURN(ChannelLayout l, channelLayout(x));
  CPU_ASSIGN_OR_RETURN(NormGradOutputs out, normGradOutputs(ctx));
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, loadParam(ctx.inputs[1], l.c, "scale"));
  return visitGradTypes(x.dtype, ctx, &batchNormTrainingGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pdy = dy.as<const T>();
    const double count = static_cast<double>(l.n * l.plane);
    std::vector<double> mean(l.c), rstd(l.c), sumDy(l.c), sumDyXhat(l.c);
    // Channel c: N runs of `plane` contiguous elements, C * plane apart.
    ctx.pool.parallelFor(l.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(l.n * l.plane, 1)),
                         [&](int64_t c0, int64_t c1) {
                           for (int64_t c = c0; c < c1; ++c) {
                             std::tie(mean[c], rstd[c]) =
                                 meanRstd(px + c * l.plane, l.n, l.plane, l.c * l.plane, eps);
                             double s = 0, sx = 0;
                             for (int64_t b = 0; b < l.n; ++b)
                               for (int64_t i = 0; i < l.plane; ++i) {
                                 int64_t at = (b * l.c + c) * l.plane + i;
                                 double g = static_cast<double>(pdy[at]);
                                 s += g;
                                 sx += g * (static_cast<double>(px[at]) - mean[c]) * rstd[c];
                               }
                             sumDy[c] = s;
                             sumDyXhat[c] = sx;
                           }
                         });
    if (out.dscale)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dscale, sumDyXhat, "scale gradient"));
    if (out.dbias)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dbias, sumDy, "bias gradient"));
    if (out.dx) {
      T *pdx = out.dx->as<T>();
      ctx.pool.parallelFor(l.n * l.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(l.plane, 1)),
                           [&](int64_t p0, int64_t p1) {
                             for (int64_t p = p0; p < p1; ++p) {
                               const int64_t c = p % l.c;
                               const double a = scale[c] * rstd[c];
                               const double mdy = sumDy[c] / count, mdyx = sumDyXhat[c] / count;
                               for (int64_t i = 0; i < l.plane; ++i) {
                                 int64_t at = p * l.plane + i;
                                 double xhat = (static_cast<double>(px[at]) - mean[c]) * rstd[c];
                                 pdx[at] = static_cast<T>(
                                     a * (static_cast<double>(pdy[at]) - mdy - xhat * mdyx));
                               }
                             }
                           });
    }
    return Status::ok();
  });
}

Status layerNormGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[2];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  if (axis < 0 || axis >= std::max<int64_t>(x.rank(), 1))
    return Status::error("axis {} out of range for rank {}", axis, x.rank());
  CPU_ASSIGN_OR_RETURN(NormGradOutputs out, normGradOutputs(ctx));
  std::vector<int64_t> trailing(x.shape.begin() + std::min<int64_t>(axis, x.rank()), x.shape.end());
  const int64_t d = numElements(trailing), rows = d == 0 ? 0 : x.numel() / d;
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, expandParam(ctx.inputs[1], trailing, "scale"));
  if (out.dscale)
    FORGE_RETURN_IF_ERROR(checkShape(*out.dscale, trailing, "scale gradient"));
  if (out.dbias)
    FORGE_RETURN_IF_ERROR(checkShape(*out.dbias, trailing, "bias gradient"));
  return visitGradTypes(x.dtype, ctx, &layerNormGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pdy = dy.as<const T>();
    T *pdx = out.dx ? out.dx->as<T>() : nullptr;
    std::vector<double> mean(rows), rstd(rows);
    const int64_t rowGrain = std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1));
    ctx.pool.parallelFor(rows, rowGrain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T *src = px + r * d, *g = pdy + r * d;
        std::tie(mean[r], rstd[r]) = meanRstd(src, 1, d, d, eps);
        if (!pdx)
          continue;
        double m1 = 0, m2 = 0; // means of scale*dy and scale*dy*xhat
        for (int64_t i = 0; i < d; ++i) {
          double wg = static_cast<double>(g[i]) * scale[i];
          m1 += wg;
          m2 += wg * (static_cast<double>(src[i]) - mean[r]) * rstd[r];
        }
        m1 /= double(d);
        m2 /= double(d);
        T *dst = pdx + r * d;
        for (int64_t i = 0; i < d; ++i) {
          double xhat = (static_cast<double>(src[i]) - mean[r]) * rstd[r];
          dst[i] =
              static_cast<T>(rstd[r] * (static_cast<double>(g[i]) * scale[i] - m1 - xhat * m2));
        }
      }
    });
    if (!out.dscale && !out.dbias)
      return Status::ok();
    // Column sums over rows, each column in row order (thread-count independent).
    std::vector<double> dscale(d), dbias(d);
    ctx.pool.parallelFor(d, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)),
                         [&](int64_t i0, int64_t i1) {
                           for (int64_t i = i0; i < i1; ++i) {
                             double s = 0, sb = 0;
                             for (int64_t r = 0; r < rows; ++r) {
                               double g = static_cast<double>(pdy[r * d + i]);
                               s += g * (static_cast<double>(px[r * d + i]) - mean[r]) * rstd[r];
                               sb += g;
                             }
                             dscale[i] = s;
                             dbias[i] = sb;
                           }
                         });
    if (out.dscale)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dscale, dscale, "scale gradient"));
    if (out.dbias)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dbias, dbias, "bias gradient"));
    return Status::ok();
  });
}

Status groupNormGradKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &dy = ctx.inputs[2];
  CPU_ASSIGN_OR_RETURN(int64_t groups, ctx.attrs.getInt("num_groups"));
  CPU_ASSIGN_OR_RETURN(double eps, ctx.attrs.getFloat("epsilon"));
  CPU_ASSIGN_OR_RETURN(ChannelLayout l, channelLayout(x));
  if (groups <= 0 || l.c % groups != 0)
    return Status::error("channels {} are not divisible by num_groups {}", l.c, groups);
  CPU_ASSIGN_OR_RETURN(NormGradOutputs out, normGradOutputs(ctx));
  CPU_ASSIGN_OR_RETURN(std::vector<double> scale, loadParam(ctx.inputs[1], l.c, "scale"));
  const int64_t cg = l.c / groups, len = cg * l.plane;
  return visitGradTypes(x.dtype, ctx, &groupNormGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pdy = dy.as<const T>();
    T *pdx = out.dx ? out.dx->as<T>() : nullptr;
    std::vector<double> mean(l.n * groups), rstd(l.n * groups);
    ctx.pool.parallelFor(l.n * groups, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)),
                         [&](int64_t t0, int64_t t1) {
                           for (int64_t t = t0; t < t1; ++t) {
                             const T *src = px + t * len, *g = pdy + t * len;
                             std::tie(mean[t], rstd[t]) = meanRstd(src, 1, len, len, eps);
                             if (!pdx)
                               continue;
                             double m1 = 0, m2 = 0;
                             for (int64_t k = 0; k < cg; ++k) {
                               const double s = scale[(t % groups) * cg + k];
                               for (int64_t i = 0; i < l.plane; ++i) {
                                 int64_t at = k * l.plane + i;
                                 double wg = static_cast<double>(g[at]) * s;
                                 m1 += wg;
                                 m2 += wg * (static_cast<double>(src[at]) - mean[t]) * rstd[t];
                               }
                             }
                             m1 /= double(len);
                             m2 /= double(len);
                             T *dst = pdx + t * len;
                             for (int64_t k = 0; k < cg; ++k) {
                               const double s = scale[(t % groups) * cg + k];
                               for (int64_t i = 0; i < l.plane; ++i) {
                                 int64_t at = k * l.plane + i;
                                 double xhat = (static_cast<double>(src[at]) - mean[t]) * rstd[t];
                                 dst[at] = static_cast<T>(
                                     rstd[t] * (static_cast<double>(g[at]) * s - m1 - xhat * m2));
                               }
                             }
                           }
                         });
    if (!out.dscale && !out.dbias)
      return Status::ok();
    std::vector<double> dscale(l.c), dbias(l.c);
    ctx.pool.parallelFor(l.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(l.n * l.plane, 1)),
                         [&](int64_t c0, int64_t c1) {
                           for (int64_t c = c0; c < c1; ++c) {
                             double s = 0, sb = 0;
                             for (int64_t b = 0; b < l.n; ++b) {
                               const int64_t t = b * groups + c / cg;
                               for (int64_t i = 0; i < l.plane; ++i) {
                                 int64_t at = (b * l.c + c) * l.plane + i;
                                 double g = static_cast<double>(pdy[at]);
                                 s += g * (static_cast<double>(px[at]) - mean[t]) * rstd[t];
                                 sb += g;
                               }
                             }
                             dscale[c] = s;
                             dbias[c] = sb;
                           }
                         });
    if (out.dscale)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dscale, dscale, "scale gradient"));
    if (out.dbias)
      FORGE_RETURN_IF_ERROR(storeParam(*out.dbias, dbias, "bias gradient"));
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// gelu_grad (operands: grad_output, the forward input x; attribute approximate)
//===----------------------------------------------------------------------===//

/// gelu'(x) in double: the tanh form's (1 + t)/2 + x (1 - t^2) k (1 + 3 c x^2)/2
/// with t = tanh(k (x + c x^3)), or the exact Phi(x) + x phi(x).
double geluDerivative(double x, bool tanhApprox) {
  if (tanhApprox) {
    const double k = 0.7978845608028654, c = 0.044715; // sqrt(2 / pi)
    double t = std::tanh(k * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
  }
  return 0.5 * (1 + std::erf(x * 0.7071067811865476)) +
         x * std::exp(-0.5 * x * x) * 0.3989422804014327; // 1 / sqrt(2 pi)
}

Status geluGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0], &x = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::string approx, ctx.attrs.getString("approximate"));
  if (approx != "none" && approx != "tanh")
    return Status::error("gelu_grad approximate must be 'none' or 'tanh', got '{}'", approx);
  FORGE_RETURN_IF_ERROR(checkDType(x, dy.dtype, "input"));
  FORGE_RETURN_IF_ERROR(checkShape(x, dy.shape, "input"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, dy.shape));
  const bool tanhApprox = approx == "tanh";
  return visitGradTypes(dy.dtype, ctx, &geluGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *pdy = dy.as<const T>(), *px = x.as<const T>();
    T *pdx = dx.as<T>();
    ctx.pool.parallelFor(dy.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        pdx[i] = static_cast<T>(double(pdy[i]) * geluDerivative(double(px[i]), tanhApprox));
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// relu_bitmask / relu_grad_bitmask: cuBLASLt's RELU_AUX mask (rows of
// ceil(N / 128) * 16 bytes, bit j % 8 of byte j / 8 set when x[i, j] > 0)
//===----------------------------------------------------------------------===//

Status reluBitmaskKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &mask = ctx.outputs[0];
  if (x.rank() != 2)
    return Status::error("relu_bitmask takes a 2-D input, got rank {}", x.rank());
  const int64_t m = x.shape[0], n = x.shape[1], bytes = reluBitmaskRowBytes(n);
  FORGE_RETURN_IF_ERROR(checkDType(mask, bundle::I8, "mask"));
  FORGE_RETURN_IF_ERROR(checkShape(mask, {m, bytes}, "mask"));
  return visitGradTypes(x.dtype, ctx, &reluBitmaskKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>();
    uint8_t *pm = mask.as<uint8_t>();
    ctx.pool.parallelFor(m, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                         [&](int64_t b, int64_t e) {
                           for (int64_t i = b; i < e; ++i) {
                             uint8_t *row = pm + i * bytes;
                             std::fill(row, row + bytes, uint8_t(0));
                             for (int64_t j = 0; j < n; ++j)
                               if (px[i * n + j] > T(0))
                                 row[j / 8] |= uint8_t(1u << (j % 8));
                           }
                         });
    return Status::ok();
  });
}

Status reluGradBitmaskKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0], &mask = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  if (dy.rank() != 2)
    return Status::error("relu_grad_bitmask takes a 2-D grad_output, got rank {}", dy.rank());
  const int64_t m = dy.shape[0], n = dy.shape[1], bytes = reluBitmaskRowBytes(n);
  FORGE_RETURN_IF_ERROR(checkDType(mask, bundle::I8, "mask"));
  FORGE_RETURN_IF_ERROR(checkShape(mask, {m, bytes}, "mask"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, dy.shape));
  return visitGradTypes(dy.dtype, ctx, &reluGradBitmaskKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *pdy = dy.as<const T>();
    const uint8_t *pm = mask.as<const uint8_t>();
    T *pdx = dx.as<T>();
    ctx.pool.parallelFor(m, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                         [&](int64_t b, int64_t e) {
                           for (int64_t i = b; i < e; ++i)
                             for (int64_t j = 0; j < n; ++j)
                               pdx[i * n + j] = (pm[i * bytes + j / 8] >> (j % 8)) & 1u
                                                    ? pdy[i * n + j]
                                                    : T(0);
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// softmax_grad / log_softmax_grad (operands: forward result y, grad_output)
//===----------------------------------------------------------------------===//

template <bool Log> Status softmaxGradKernel(KernelContext &ctx) {
  const TensorView &y = ctx.inputs[0], &dy = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  if (axis < 0 || axis >= std::max<int64_t>(y.rank(), 1))
    return Status::error("axis {} out of range for rank {}", axis, y.rank());
  FORGE_RETURN_IF_ERROR(checkDType(dy, y.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkShape(dy, y.shape, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, y.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, y.shape));
  AxisSplit s = splitAtAxis(y.shape, axis);
  return visitGradTypes(y.dtype, ctx, &softmaxGradKernel<Log>, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *py = y.as<const T>(), *pdy = dy.as<const T>();
    T *pdx = dx.as<T>();
    ctx.pool.parallelFor(s.outer * s.inner,
                         std::max<int64_t>(1, kGrain / std::max<int64_t>(s.extent, 1)),
                         [&](int64_t b, int64_t e) {
                           for (int64_t t = b; t < e; ++t) {
                             const int64_t base = (t / s.inner) * s.extent * s.inner + t % s.inner;
                             double sum = 0;
                             for (int64_t i = 0; i < s.extent; ++i) {
                               int64_t at = base + i * s.inner;
                               sum += Log ? double(pdy[at]) : double(pdy[at]) * double(py[at]);
                             }
                             for (int64_t i = 0; i < s.extent; ++i) {
                               int64_t at = base + i * s.inner;
                               double v = Log ? double(pdy[at]) - std::exp(double(py[at])) * sum
                                              : double(py[at]) * (double(pdy[at]) - sum);
                               pdx[at] = static_cast<T>(v);
                             }
                           }
                         });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// nll_loss_grad
//===----------------------------------------------------------------------===//

Status nllLossGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0], &target = ctx.inputs[1];
  const TensorView *weight =
      ctx.inputs.size() > 2 && ctx.inputs[2].present() ? &ctx.inputs[2] : nullptr;
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::string reduction, ctx.attrs.getString("reduction"));
  CPU_ASSIGN_OR_RETURN(int64_t c, ctx.attrs.getInt("num_classes"));
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return Status::error("reduction must be none, sum or mean, got '{}'", reduction);
  const bool hasIgnore = ctx.attrs.has("ignore_index");
  int64_t ignoreIndex = 0;
  if (hasIgnore) {
    CPU_ASSIGN_OR_RETURN(ignoreIndex, ctx.attrs.getInt("ignore_index"));
  }
  if (target.rank() < 1 || c <= 0)
    return Status::error("nll_loss_grad needs target [N, ...] and num_classes > 0");
  std::vector<int64_t> shape = {target.shape[0], c};
  shape.insert(shape.end(), target.shape.begin() + 1, target.shape.end());
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, shape));
  FORGE_RETURN_IF_ERROR(
      checkShape(dy, reduction == "none" ? target.shape : std::vector<int64_t>{}, "grad_output"));
  if (weight) {
    FORGE_RETURN_IF_ERROR(checkDType(*weight, dy.dtype, "weight"));
    if (weight->rank() != 1 || weight->shape[0] != c)
      return Status::error("weight has shape {}, expected [{}]", shapeString(weight->shape), c);
  }
  const int64_t n = target.shape[0], inner = n == 0 ? 0 : target.numel() / n;
  return visitGradTypes(dy.dtype, ctx, &nllLossGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *pdy = dy.as<const T>();
    const T *pw = weight ? weight->as<const T>() : nullptr;
    T *pdx = dx.as<T>();
    return visitIndex(target.dtype, [&](auto itag) -> Status {
      using I = typename decltype(itag)::type;
      const I *pt = target.as<const I>();
      double weightSum = 0;
      for (int64_t i = 0; i < n * inner; ++i) {
        const int64_t t = static_cast<int64_t>(pt[i]);
        if (hasIgnore && t == ignoreIndex)
          continue;
        if (t < 0 || t >= c)
          return Status::error("target {} at position {} is outside [0, {})", t, i, c);
        weightSum += pw ? double(pw[t]) : 1.0;
      }
      fillZero<T>(dx);
      const double scale = reduction == "mean" ? 1.0 / weightSum : 1.0;
      for (int64_t i = 0; i < n * inner; ++i) {
        const int64_t t = static_cast<int64_t>(pt[i]);
        if (hasIgnore && t == ignoreIndex)
          continue;
        double g = double(reduction == "none" ? pdy[i] : pdy[0]) * scale;
        double w = pw ? double(pw[t]) : 1.0;
        pdx[((i / inner) * c + t) * inner + i % inner] = static_cast<T>(-w * g);
      }
      return Status::ok();
    });
  });
}

//===----------------------------------------------------------------------===//
// gather_grad / gather_elements_grad (scatter-add into zeros)
//===----------------------------------------------------------------------===//

Status gatherGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0], &idx = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> inShape, ctx.attrs.getInts("input_shape"));
  if (axis < 0 || axis >= static_cast<int64_t>(inShape.size()))
    return Status::error("axis {} out of range for rank {}", axis, inShape.size());
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, inShape));
  std::vector<int64_t> dyShape(inShape.begin(), inShape.begin() + axis);
  dyShape.insert(dyShape.end(), idx.shape.begin(), idx.shape.end());
  dyShape.insert(dyShape.end(), inShape.begin() + axis + 1, inShape.end());
  FORGE_RETURN_IF_ERROR(checkShape(dy, dyShape, "grad_output"));
  AxisSplit s = splitAtAxis(inShape, axis);
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> indices, readIndices(idx, s.extent));
  const int64_t k = static_cast<int64_t>(indices.size());
  return visitGradTypes(dy.dtype, ctx, &gatherGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *src = dy.as<const T>();
    T *dst = dx.as<T>();
    // Each outer slice of dx is written by one task, rows in index order.
    ctx.pool.parallelFor(s.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(k * s.inner, 1)),
                         [&](int64_t o0, int64_t o1) {
                           for (int64_t o = o0; o < o1; ++o) {
                             T *out = dst + o * s.extent * s.inner;
                             std::fill(out, out + s.extent * s.inner, T(0));
                             for (int64_t j = 0; j < k; ++j) {
                               const T *row = src + (o * k + j) * s.inner;
                               T *to = out + indices[j] * s.inner;
                               for (int64_t i = 0; i < s.inner; ++i)
                                 to[i] += row[i];
                             }
                           }
                         });
    return Status::ok();
  });
}

Status gatherElementsGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0], &idx = ctx.inputs[1];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(int64_t axis, ctx.attrs.getInt("axis"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> inShape, ctx.attrs.getInts("input_shape"));
  const int64_t rank = static_cast<int64_t>(inShape.size());
  if (axis < 0 || axis >= rank || idx.rank() != rank)
    return Status::error("gather_elements_grad needs indices of the input's rank and an axis in "
                         "range, got {} and axis {}",
                         shapeString(idx.shape), axis);
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx.shape[d] > inShape[d])
      return Status::error("indices {} exceed the input {} in dim {}", shapeString(idx.shape),
                           shapeString(inShape), d);
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, inShape));
  FORGE_RETURN_IF_ERROR(checkShape(dy, idx.shape, "grad_output"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> indices, readIndices(idx, inShape[axis]));
  std::vector<int64_t> inStrides = contiguousStrides(inShape), strides = inStrides;
  strides[axis] = 0;
  StridedLoop<1> loop(idx.shape, {strides});
  const int64_t axisStride = inStrides[axis];
  return visitGradTypes(dy.dtype, ctx, &gatherElementsGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *src = dy.as<const T>();
    T *dst = dx.as<T>();
    fillZero<T>(dx);
    // Sequential: different positions may add into one element.
    loop.forEachRun(0, idx.numel(), [&](int64_t o, int64_t n, auto off, auto st) {
      for (int64_t i = 0; i < n; ++i)
        dst[off[0] + i * st[0] + indices[o + i] * axisStride] += src[o + i];
    });
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// slice_grad (strided insert), pad_grad (scatter-add of every copy)
//===----------------------------------------------------------------------===//

Status sliceGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> inShape, ctx.attrs.getInts("input_shape"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> starts, ctx.attrs.getInts("starts"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> ends, ctx.attrs.getInts("ends"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ctx.attrs.getInts("steps"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(dx, inShape));
  CPU_ASSIGN_OR_RETURN(SliceGeom g, sliceGeometry(inShape, starts, ends, steps, "writes"));
  FORGE_RETURN_IF_ERROR(checkShape(dy, g.shape, "grad_output"));
  if (dx.numel() > 0)
    std::memset(dx.data, 0, dx.bytes()); // zero bytes are zero in every dtype
  if (dy.numel() == 0)
    return Status::ok();
  StridedLoop<1> loop(dy.shape, {g.strides});
  return visitBySize(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *src = dy.as<const T>();
    T *dst = dx.as<T>() + g.base;
    // Slice positions are distinct: a parallel scatter writes disjoint elements.
    loop.parallelRuns(ctx.pool, kGrain, [&](int64_t o, int64_t n, auto off, auto st) {
      for (int64_t i = 0; i < n; ++i)
        dst[off[0] + i * st[0]] = src[o + i];
    });
    return Status::ok();
  });
}

Status padGradKernel(KernelContext &ctx) {
  const TensorView &dy = ctx.inputs[0];
  TensorView &dx = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> pads, ctx.attrs.getInts("pads"));
  CPU_ASSIGN_OR_RETURN(std::string mode, ctx.attrs.getString("mode"));
  FORGE_RETURN_IF_ERROR(checkDType(dx, dy.dtype, "result"));
  const int64_t rank = dy.rank();
  if ((int64_t)pads.size() != 2 * rank)
    return Status::error("pads need {} entries, got {}", 2 * rank, pads.size());
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return Status::error("pad mode must be constant, reflect, edge or wrap, got '{}'", mode);
  std::vector<int64_t> inShape(rank);
  std::vector<std::vector<int64_t>> maps(rank);
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t before = pads[d];
    const int64_t n = dy.shape[d] - before - pads[d + rank];
    if (n < 0)
      return Status::error("pads exceed the extent of dim {}", d);
    inShape[d] = n;
    if (n == 0 && dy.shape[d] > 0 && mode != "constant")
      return Status::error("{} padding of an empty dim {}", mode, d);
    // The forward kernel's map: output position -> input index (-1: fill).
    maps[d].resize(dy.shape[d]);
    for (int64_t o = 0; o < dy.shape[d]; ++o)
      maps[d][o] = padSourceIndex(o - before, n, mode);
  }
  FORGE_RETURN_IF_ERROR(checkShape(dx, inShape));
  const std::vector<int64_t> inStrides = contiguousStrides(inShape);
  return visitGradTypes(dy.dtype, ctx, &padGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *src = dy.as<const T>();
    T *dst = dx.as<T>();
    fillZero<T>(dx);
    std::vector<int64_t> o(rank, 0);
    // Sequential: reflect/edge copies of one element accumulate.
    for (int64_t p = 0; p < dy.numel(); ++p) {
      int64_t off = 0;
      bool inside = true;
      for (int64_t d = 0; d < rank && inside; ++d) {
        int64_t i = maps[d][o[d]];
        inside = i >= 0;
        off += i * inStrides[d];
      }
      if (inside)
        dst[off] += src[p];
      for (int64_t d = rank; d-- > 0;) {
        if (++o[d] < dy.shape[d])
          break;
        o[d] = 0;
      }
    }
    return Status::ok();
  });
}

} // namespace

void registerBackwardKernels(Registry &r) {
  r.add("conv_grad_weight", &convGradWeightKernel, 2, 2);
  r.add("max_pool_grad", &maxPoolGradKernel, 2, 2);
  r.add("avg_pool_grad", &avgPoolGradKernel, 1, 1);
  r.add("batch_norm_training_grad", &batchNormTrainingGradKernel, 3, 3, 1, 3);
  r.add("layer_norm_grad", &layerNormGradKernel, 3, 3, 1, 3);
  r.add("group_norm_grad", &groupNormGradKernel, 3, 3, 1, 3);
  r.add("gelu_grad", &geluGradKernel, 2, 2);
  r.add("relu_bitmask", &reluBitmaskKernel, 1, 1);
  r.add("relu_grad_bitmask", &reluGradBitmaskKernel, 2, 2);
  r.add("softmax_grad", &softmaxGradKernel<false>, 2, 2);
  r.add("log_softmax_grad", &softmaxGradKernel<true>, 2, 2);
  r.add("nll_loss_grad", &nllLossGradKernel, 2, 3);
  r.add("gather_grad", &gatherGradKernel, 2, 2);
  r.add("gather_elements_grad", &gatherElementsGradKernel, 2, 2);
  r.add("slice_grad", &sliceGradKernel, 1, 1);
  r.add("pad_grad", &padGradKernel, 1, 1);
}

} // namespace forge::rt::cpu
