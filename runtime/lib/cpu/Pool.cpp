// Pooling CPU kernels: max_pool and avg_pool, N-d over NC[D]HW.
//
// Invariants: window o along dim d covers o*stride - padBegin + k*dilation
// for k < kernel; positions outside the input are skipped (max) or counted by
// the divisor only with count_include_pad, and then only up to the end
// padding (a ceil-mode window reaching past it is clipped, as in PyTorch and
// ONNX opset >= 19). The caller's result shape is checked against the ONNX
// formula. Sums accumulate in double.
#include "KernelUtil.h"

#include <algorithm>

namespace forge::rt::cpu {
namespace {

struct PoolGeom {
  std::vector<int64_t> image, out, kernel, strides, padBegin, padEnd, dilations;
  std::vector<int64_t> imageStrides, tapOffsets; // offsets of every tap of an inside window
  int64_t imageSize = 1, outSize = 1;
  bool countIncludePad = false;
};

Expected<PoolGeom> readPool(KernelContext &ctx, bool isAvg) {
  const TensorView &x = ctx.inputs[0];
  const TensorView &y = ctx.outputs[0];
  if (x.rank() < 3)
    return Status::error("pool input must have rank >= 3, got {}", shapeString(x.shape));
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  const int64_t sp = x.rank() - 2;
  PoolGeom g;
  CPU_ASSIGN_OR_RETURN(g.kernel, ctx.attrs.getInts("kernel_shape"));
  CPU_ASSIGN_OR_RETURN(g.strides, ctx.attrs.getInts("strides"));
  CPU_ASSIGN_OR_RETURN(std::vector<int64_t> pads, ctx.attrs.getInts("pads"));
  CPU_ASSIGN_OR_RETURN(g.dilations, ctx.attrs.getInts("dilations"));
  CPU_ASSIGN_OR_RETURN(int64_t ceilMode, ctx.attrs.getInt("ceil_mode"));
  if (isAvg) {
    CPU_ASSIGN_OR_RETURN(int64_t include, ctx.attrs.getInt("count_include_pad"));
    g.countIncludePad = include != 0;
  }
  if ((int64_t)g.kernel.size() != sp || (int64_t)g.strides.size() != sp ||
      (int64_t)g.dilations.size() != sp || (int64_t)pads.size() != 2 * sp)
    return Status::error("kernel_shape/strides/dilations need {} entries and pads {}", sp, 2 * sp);
  std::vector<int64_t> outShape = {x.shape[0], x.shape[1]};
  for (int64_t d = 0; d < sp; ++d) {
    if (g.kernel[d] <= 0 || g.strides[d] <= 0 || g.dilations[d] <= 0 || pads[d] < 0 ||
        pads[d + sp] < 0)
      return Status::error("kernel_shape, strides and dilations must be positive, pads >= 0");
    g.image.push_back(x.shape[d + 2]);
    g.padBegin.push_back(pads[d]);
    g.padEnd.push_back(pads[d + sp]);
    outShape.push_back(windowOutput(x.shape[d + 2], g.kernel[d], g.strides[d], pads[d],
                                    pads[d + sp], g.dilations[d], ceilMode != 0));
  }
  FORGE_RETURN_IF_ERROR(checkShape(y, outShape));
  g.out.assign(outShape.begin() + 2, outShape.end());
  g.imageSize = numElements(g.image);
  g.outSize = numElements(g.out);
  g.imageStrides = contiguousStrides(g.image);
  // Tap offsets in odometer order.
  int64_t taps = numElements(g.kernel);
  std::vector<int64_t> k(sp, 0);
  for (int64_t t = 0; t < taps; ++t) {
    int64_t off = 0;
    for (int64_t d = 0; d < sp; ++d)
      off += k[d] * g.dilations[d] * g.imageStrides[d];
    g.tapOffsets.push_back(off);
    for (int64_t d = sp; d-- > 0;) {
      if (++k[d] < g.kernel[d])
        break;
      k[d] = 0;
    }
  }
  return g;
}

/// Runs visit(acc, value) over the in-image taps of each window and
/// out = finish(acc, window start) for every output of every plane.
template <typename T, typename Acc, typename Init, typename Visit, typename Finish>
void poolLoop(ThreadPool &pool, const PoolGeom &g, int64_t planes, const T *x, T *y, Init init,
              Visit visit, Finish finish) {
  const int64_t sp = static_cast<int64_t>(g.image.size());
  const int64_t olast = g.out.back();
  const int64_t rowsPerPlane = olast == 0 ? 0 : g.outSize / olast;
  const int64_t taps = static_cast<int64_t>(g.tapOffsets.size());
  pool.parallelFor(
      planes * rowsPerPlane, std::max<int64_t>(1, kGrain / std::max<int64_t>(olast * taps, 1)),
      [&](int64_t r0, int64_t r1) {
        std::vector<int64_t> start(sp), o(sp), k(sp);
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t plane = r / rowsPerPlane;
          const T *src = x + plane * g.imageSize;
          T *dst = y + plane * g.outSize + (r % rowsPerPlane) * olast;
          for (int64_t d = sp - 1, t = r % rowsPerPlane; d-- > 0;) {
            o[d] = t % g.out[d];
            t /= g.out[d];
          }
          for (int64_t ol = 0; ol < olast; ++ol) {
            o[sp - 1] = ol;
            bool inside = true;
            int64_t base = 0;
            for (int64_t d = 0; d < sp; ++d) {
              start[d] = o[d] * g.strides[d] - g.padBegin[d];
              inside &= start[d] >= 0 && start[d] + (g.kernel[d] - 1) * g.dilations[d] < g.image[d];
              base += start[d] * g.imageStrides[d];
            }
            Acc acc = init();
            if (inside) {
              for (int64_t t = 0; t < taps; ++t)
                acc = visit(acc, load(src[base + g.tapOffsets[t]]));
            } else {
              // Border window: check every tap.
              std::fill(k.begin(), k.end(), 0);
              for (int64_t t = 0; t < taps; ++t) {
                int64_t off = 0;
                bool in = true;
                for (int64_t d = 0; d < sp; ++d) {
                  int64_t p = start[d] + k[d] * g.dilations[d];
                  in &= p >= 0 && p < g.image[d];
                  off += p * g.imageStrides[d];
                }
                if (in)
                  acc = visit(acc, load(src[off]));
                for (int64_t d = sp; d-- > 0;) {
                  if (++k[d] < g.kernel[d])
                    break;
                  k[d] = 0;
                }
              }
            }
            dst[ol] = finish(acc, start);
          }
        }
      });
}

Status maxPoolKernel(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(PoolGeom g, readPool(ctx, false));
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  return visitNumeric(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = Compute<T>;
    const C lowest = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                          : std::numeric_limits<C>::lowest();
    poolLoop<T, C>(
        ctx.pool, g, x.shape[0] * x.shape[1], x.as<const T>(), y.as<T>(), [&] { return lowest; },
        [](C acc, C v) {
          if constexpr (std::is_floating_point_v<C>)
            if (std::isnan(v) || std::isnan(acc))
              return std::isnan(acc) ? acc : v;
          return v > acc ? v : acc;
        },
        [](C acc, const std::vector<int64_t> &) { return store<T>(acc); });
    return Status::ok();
  });
}

Status avgPoolKernel(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(PoolGeom g, readPool(ctx, true));
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  auto divisor = [&](const std::vector<int64_t> &start) {
    return avgPoolDivisor(start, g.image, g.kernel, g.dilations, g.padBegin, g.padEnd,
                          g.countIncludePad);
  };
  return visitFloat(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    poolLoop<T, double>(
        ctx.pool, g, x.shape[0] * x.shape[1], x.as<const T>(), y.as<T>(), [] { return 0.0; },
        [](double acc, auto v) { return acc + double(v); },
        [&](double acc, const std::vector<int64_t> &start) {
          return store<T>(acc / divisor(start));
        });
    return Status::ok();
  });
}

} // namespace

void registerPoolKernels(Registry &r) {
  r.add("max_pool", &maxPoolKernel, 1, 1);
  r.add("avg_pool", &avgPoolKernel, 1, 1);
}

} // namespace forge::rt::cpu
