// Convolution CPU kernels: conv (N-d, grouped, explicit pads) by im2col +
// GEMM, conv_transpose by GEMM + col2im.
//
// Invariants: layout NC[D]HW, weight [M, C/group, k...] for conv and
// [C, M/group, k...] for conv_transpose; `pads` = all begins then all ends;
// the result shape given by the caller is checked against the ONNX formula
// before anything is written. f32/f64 natively, f16/bf16 staged through f32.
// The column buffer is per-call scratch (never visible to the caller).
// im2col/col2im live in Im2Col.h (shared with conv_grad_weight in Backward.cpp).
#include "Im2Col.h"
#include "KernelUtil.h"

#include <algorithm>

namespace forge::rt::cpu {
namespace {

struct ConvAttrs {
  std::vector<int64_t> strides, pads, dilations;
  int64_t group = 1;
};

Expected<ConvAttrs> readConvAttrs(KernelContext &ctx, int64_t spatial) {
  ConvAttrs a;
  CPU_ASSIGN_OR_RETURN(a.strides, ctx.attrs.getInts("strides"));
  CPU_ASSIGN_OR_RETURN(a.pads, ctx.attrs.getInts("pads"));
  CPU_ASSIGN_OR_RETURN(a.dilations, ctx.attrs.getInts("dilations"));
  CPU_ASSIGN_OR_RETURN(a.group, ctx.attrs.getInt("group"));
  if ((int64_t)a.strides.size() != spatial || (int64_t)a.dilations.size() != spatial ||
      (int64_t)a.pads.size() != 2 * spatial)
    return Status::error("strides/dilations need {} entries and pads {}", spatial, 2 * spatial);
  for (int64_t d = 0; d < spatial; ++d)
    if (a.strides[d] <= 0 || a.dilations[d] <= 0)
      return Status::error("strides and dilations must be positive");
  if (a.group <= 0)
    return Status::error("group must be positive, got {}", a.group);
  return a;
}

/// Common operand checks; returns the optional bias (nullptr when absent).
Expected<const TensorView *> checkConvOperands(KernelContext &ctx, int64_t outChannels) {
  const TensorView &x = ctx.inputs[0], &w = ctx.inputs[1];
  if (x.rank() < 3 || w.rank() != x.rank())
    return Status::error("input {} and weight {} must be N-d tensors of equal rank >= 3",
                         shapeString(x.shape), shapeString(w.shape));
  if (x.rank() - 2 > 16)
    return Status::error("at most 16 spatial dims are supported");
  FORGE_RETURN_IF_ERROR(checkDType(w, x.dtype, "weight"));
  FORGE_RETURN_IF_ERROR(checkDType(ctx.outputs[0], x.dtype, "result"));
  const TensorView *bias =
      ctx.inputs.size() > 2 && ctx.inputs[2].present() ? &ctx.inputs[2] : nullptr;
  if (bias) {
    FORGE_RETURN_IF_ERROR(checkDType(*bias, x.dtype, "bias"));
    if (bias->numel() != outChannels)
      return Status::error("bias has {} elements, expected {}", bias->numel(), outChannels);
  }
  return bias;
}

template <typename T> void addBias(T *y, const T *bias, int64_t channels, int64_t plane) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < plane; ++i)
      y[c * plane + i] += bias[c];
}

/// f32/f64 natively, f16/bf16 through f32 copies.
template <typename F> Status visitConvTypes(DType t, KernelContext &ctx, KernelFn self, F &&f) {
  if (t == bundle::F16)
    return runInFloat<Half>(ctx, self);
  if (t == bundle::BF16)
    return runInFloat<BFloat16>(ctx, self);
  if (t == bundle::F32)
    return f(Tag<float>{});
  if (t == bundle::F64)
    return f(Tag<double>{});
  return unsupportedDType(t);
}

//===----------------------------------------------------------------------===//
// conv
//===----------------------------------------------------------------------===//

Status convKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &w = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  const int64_t sp = x.rank() - 2;
  CPU_ASSIGN_OR_RETURN(ConvAttrs a, readConvAttrs(ctx, std::max<int64_t>(sp, 0)));
  CPU_ASSIGN_OR_RETURN(const TensorView *bias,
                       checkConvOperands(ctx, w.shape.empty() ? 0 : w.shape[0]));
  const int64_t n = x.shape[0], c = x.shape[1], m = w.shape[0];
  if (c != w.shape[1] * a.group || m % a.group != 0)
    return Status::error("input channels {} / output channels {} do not match weight {} with "
                         "group {}",
                         c, m, shapeString(w.shape), a.group);
  ConvGeom g;
  std::vector<int64_t> outShape = {n, m};
  for (int64_t d = 0; d < sp; ++d) {
    int64_t effective = a.dilations[d] * (w.shape[d + 2] - 1) + 1;
    int64_t span = x.shape[d + 2] + a.pads[d] + a.pads[d + sp] - effective;
    outShape.push_back(span < 0 ? 0 : span / a.strides[d] + 1);
    g.image.push_back(x.shape[d + 2]);
    g.kernel.push_back(w.shape[d + 2]);
    g.padBegin.push_back(a.pads[d]);
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, outShape));
  g.cols.assign(outShape.begin() + 2, outShape.end());
  g.strides = a.strides;
  g.dilations = a.dilations;
  g.finalize();

  return visitConvTypes(x.dtype, ctx, &convKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    if (y.numel() == 0)
      return Status::ok();
    const int64_t cg = c / a.group, mg = m / a.group, rows = cg * g.kernelSize;
    // A 1x1, unit-stride, unpadded conv reads the input as the column matrix.
    bool direct = g.kernelSize == 1 && g.imageSize == g.colSize;
    for (int64_t d = 0; d < sp; ++d)
      direct &= a.strides[d] == 1 && a.pads[d] == 0 && a.pads[d + sp] == 0;
    std::vector<T> col(direct ? 0 : rows * g.colSize);
    const T *px = x.as<const T>(), *pw = w.as<const T>();
    T *py = y.as<T>();
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t grp = 0; grp < a.group; ++grp) {
        const T *image = px + (b * c + grp * cg) * g.imageSize;
        const T *cols = image;
        if (!direct) {
          im2col(ctx.pool, g, cg, image, col.data());
          cols = col.data();
        }
        T *out = py + (b * m + grp * mg) * g.colSize;
        FORGE_RETURN_IF_ERROR(gemm(false, false, mg, g.colSize, rows, 1.0, pw + grp * mg * rows,
                                   rows, cols, g.colSize, 0.0, out, g.colSize));
        if (rows == 0)
          std::fill(out, out + mg * g.colSize, T(0));
        if (bias)
          addBias(out, bias->as<const T>() + grp * mg, mg, g.colSize);
      }
    }
    return Status::ok();
  });
}

//===----------------------------------------------------------------------===//
// conv_transpose
//===----------------------------------------------------------------------===//

Status convTransposeKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0], &w = ctx.inputs[1];
  TensorView &y = ctx.outputs[0];
  const int64_t sp = x.rank() - 2;
  CPU_ASSIGN_OR_RETURN(ConvAttrs a, readConvAttrs(ctx, std::max<int64_t>(sp, 0)));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> outputPadding, ctx.attrs.getInts("output_padding"));
  if ((int64_t)outputPadding.size() != sp)
    return Status::error("output_padding needs {} entries", sp);
  const int64_t m = w.rank() >= 2 ? w.shape[1] * a.group : 0;
  CPU_ASSIGN_OR_RETURN(const TensorView *bias, checkConvOperands(ctx, m));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (c != w.shape[0] || c % a.group != 0)
    return Status::error("input channels {} do not match weight {} with group {}", c,
                         shapeString(w.shape), a.group);
  ConvGeom g; // image = the result, cols = the input positions
  std::vector<int64_t> outShape = {n, m};
  for (int64_t d = 0; d < sp; ++d) {
    int64_t extent = a.strides[d] * (x.shape[d + 2] - 1) + outputPadding[d] +
                     (w.shape[d + 2] - 1) * a.dilations[d] + 1 - a.pads[d] - a.pads[d + sp];
    outShape.push_back(extent);
    g.cols.push_back(x.shape[d + 2]);
    g.kernel.push_back(w.shape[d + 2]);
    g.padBegin.push_back(a.pads[d]);
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, outShape));
  g.image.assign(outShape.begin() + 2, outShape.end());
  g.strides = a.strides;
  g.dilations = a.dilations;
  g.finalize();

  return visitConvTypes(x.dtype, ctx, &convTransposeKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    const T *px = x.as<const T>(), *pw = w.as<const T>();
    T *py = y.as<T>();
    std::fill(py, py + y.numel(), T(0));
    if (y.numel() == 0)
      return Status::ok();
    const int64_t cg = c / a.group, mg = m / a.group, rows = mg * g.kernelSize;
    std::vector<T> col(rows * g.colSize);
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t grp = 0; grp < a.group; ++grp) {
        // col[mg*k, in] = W_g^T [mg*k, cg] x X_g [cg, in]
        if (cg == 0 || g.colSize == 0)
          std::fill(col.begin(), col.end(), T(0));
        else
          FORGE_RETURN_IF_ERROR(gemm(true, false, rows, g.colSize, cg, 1.0, pw + grp * cg * rows,
                                     rows, px + (b * c + grp * cg) * g.colSize, g.colSize, 0.0,
                                     col.data(), g.colSize));
        T *out = py + (b * m + grp * mg) * g.imageSize;
        col2im(ctx.pool, g, mg, col.data(), out);
        if (bias)
          addBias(out, bias->as<const T>() + grp * mg, mg, g.imageSize);
      }
    }
    return Status::ok();
  });
}

} // namespace

void registerConvKernels(Registry &r) {
  r.add("conv", &convKernel, 2, 3);
  r.add("conv_transpose", &convTransposeKernel, 2, 3);
}

} // namespace forge::rt::cpu
