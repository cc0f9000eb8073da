// im2col / col2im over NC[D]HW images: the sliding-window gathers shared by
// conv, conv_transpose (Conv.cpp) and conv_grad_weight (Backward.cpp).
// Private to runtime/lib/cpu.
//
// Invariants: window o along dim d, kernel tap k, reads image position
// o*stride - padBegin + k*dilation; positions outside the image read as 0
// (im2col) or are dropped (col2im); at most 16 spatial dims.
#pragma once

#include "KernelUtil.h"

#include <algorithm>

namespace forge::rt::cpu {

/// Geometry shared by im2col and col2im: an "image" of spatial dims `image`
/// and the sliding-window positions `cols` (image position of window `o`,
/// kernel tap `k` along dim d: o*stride - padBegin + k*dilation).
struct ConvGeom {
  std::vector<int64_t> image, cols, kernel, strides, padBegin, dilations;
  int64_t imageSize = 1, colSize = 1, kernelSize = 1;

  void finalize() {
    imageSize = numElements(image);
    colSize = numElements(cols);
    kernelSize = numElements(kernel);
  }
  int64_t spatial() const { return static_cast<int64_t>(image.size()); }
};

/// Visits, for column-buffer row r = (channel, tap), each run of `cols`'
/// innermost dim: fn(colOffset, inside, imageOffset, lo, hi, stride): window
/// positions i in [lo, hi) read image[imageOffset + i * stride] (`inside` is
/// false when the outer dims already fall outside the image).
template <typename Fn> void forEachColumnRun(const ConvGeom &g, int64_t tap, Fn &&fn) {
  const int64_t sp = g.spatial();
  int64_t kpos[16], opos[16];
  for (int64_t d = sp, t = tap; d-- > 0;) {
    kpos[d] = t % g.kernel[d];
    t /= g.kernel[d];
  }
  const int64_t last = sp - 1, olast = g.cols[last];
  const int64_t s = g.strides[last], base0 = kpos[last] * g.dilations[last] - g.padBegin[last];
  const int64_t extent = g.image[last];
  // Window positions o with 0 <= o*s + base0 < extent.
  int64_t lo = base0 >= 0 ? 0 : (-base0 + s - 1) / s;
  int64_t hi = extent - 1 - base0 < 0 ? 0 : std::min(olast, (extent - 1 - base0) / s + 1);
  lo = std::min(lo, olast);
  hi = std::max(hi, lo);
  const int64_t outer = g.colSize / std::max<int64_t>(olast, 1);
  for (int64_t q = 0; q < outer; ++q) {
    for (int64_t d = last, t = q; d-- > 0;) {
      opos[d] = t % g.cols[d];
      t /= g.cols[d];
    }
    int64_t off = 0;
    bool inside = true;
    for (int64_t d = 0; d < last; ++d) {
      int64_t ip = opos[d] * g.strides[d] - g.padBegin[d] + kpos[d] * g.dilations[d];
      inside &= ip >= 0 && ip < g.image[d];
      off = off * g.image[d] + ip;
    }
    fn(q * olast, inside, off * extent + base0, lo, hi, s);
  }
}

/// col[r, o] = image[c, position(o, tap)] or 0 outside, r = c * kernelSize + tap.
template <typename T>
void im2col(ThreadPool &pool, const ConvGeom &g, int64_t channels, const T *image, T *col) {
  const int64_t rows = channels * g.kernelSize;
  pool.parallelFor(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(g.colSize, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       const T *src = image + (r / g.kernelSize) * g.imageSize;
                       T *dst = col + r * g.colSize;
                       forEachColumnRun(g, r % g.kernelSize,
                                        [&](int64_t o, bool inside, int64_t in, int64_t lo,
                                            int64_t hi, int64_t s) {
                                          const int64_t n = g.cols.back();
                                          T *row = dst + o;
                                          if (!inside) {
                                            std::fill(row, row + n, T(0));
                                            return;
                                          }
                                          std::fill(row, row + lo, T(0));
                                          for (int64_t i = lo; i < hi; ++i)
                                            row[i] = src[in + i * s];
                                          std::fill(row + hi, row + n, T(0));
                                        });
                     }
                   });
}

/// image[c, position(o, tap)] += col[r, o] (inverse of im2col); channels run
/// in parallel since they write disjoint planes.
template <typename T>
void col2im(ThreadPool &pool, const ConvGeom &g, int64_t channels, const T *col, T *image) {
  pool.parallelFor(
      channels, std::max<int64_t>(1, kGrain / std::max<int64_t>(g.colSize * g.kernelSize, 1)),
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          T *dst = image + c * g.imageSize;
          for (int64_t tap = 0; tap < g.kernelSize; ++tap) {
            const T *src = col + (c * g.kernelSize + tap) * g.colSize;
            forEachColumnRun(
                g, tap, [&](int64_t o, bool inside, int64_t in, int64_t lo, int64_t hi, int64_t s) {
                  if (!inside)
                    return;
                  for (int64_t i = lo; i < hi; ++i)
                    dst[in + i * s] += src[o + i];
                });
          }
        }
      });
}

} // namespace forge::rt::cpu
