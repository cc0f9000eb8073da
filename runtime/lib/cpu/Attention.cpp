// attention / attention_grad (ForgeOps.td, ForgeGradOps.td): the reference
// kernels of the fused flash attention the CUDA target runs through cuDNN.
//
// Invariants:
//  * one query row at a time: scores of a row are made, used and dropped, so
//    nothing T x T is ever stored (the backward recomputes the probabilities
//    from q, k and lse, as flash attention does);
//  * causal: key j is visible to query i iff j <= i (the top-left diagonal);
//    query head h reads key/value head h / (H / Hk); layout "bshd" stores
//    q/k/v/o as [B, T, H, D] (head vectors contiguous in both layouts);
//  * f32/f64 compute natively with double accumulation; f16/bf16 are staged
//    through f32 copies by the registry; lse is f32 (f64 beside f64 operands);
//  * results do not depend on the thread count: the forward splits rows, the
//    backward splits key/value heads, and each sums in a fixed order;
//  * an optional last input, the bias [B|1, H|1, Tq|1, Tk|1] in q's type, is
//    added to the scaled scores (before the causal mask) in both kernels;
//  * a row whose every score is -inf (all keys masked) has o = 0 and
//    lse = -inf, and no gradient (the exporters' NaN guard after softmax).
#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace forge::rt::cpu {
namespace {

struct AttentionShape {
  int64_t b, h, hk, tq, tk, d, dv;
  double scale;
  bool causal;
  bool bshd; // q/k/v/o are [B, T, H, D] (else [B, H, T, D])
  // The bias's element strides over [B, H, Tq, Tk], 0 along broadcast dims;
  // bias < 0: none.
  int bias = -1;
  int64_t biasStride[4] = {0, 0, 0, 0};
  int64_t biasAt(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    return bi * biasStride[0] + hi * biasStride[1] + i * biasStride[2] + j * biasStride[3];
  }
  /// Keys visible to query row i.
  int64_t keys(int64_t i) const { return causal ? std::min(tk, i + 1) : tk; }
  /// Element offsets of the head vectors (contiguous in both layouts).
  int64_t qRow(int64_t bi, int64_t hi, int64_t i, int64_t width) const {
    return (bshd ? (bi * tq + i) * h + hi : (bi * h + hi) * tq + i) * width;
  }
  int64_t kRow(int64_t bi, int64_t kh, int64_t j, int64_t width) const {
    return (bshd ? (bi * tk + j) * hk + kh : (bi * hk + kh) * tk + j) * width;
  }
};

Expected<AttentionShape> readShape(KernelContext &ctx) {
  const TensorView &q = ctx.inputs[0], &k = ctx.inputs[1], &v = ctx.inputs[2];
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    return Status::error("q, k and v must be rank 4, got ranks {}, {}, {}", q.rank(), k.rank(),
                         v.rank());
  std::string layout = "bhsd";
  if (ctx.attrs.has("layout")) {
    CPU_ASSIGN_OR_RETURN(layout, ctx.attrs.getString("layout"));
  }
  if (layout != "bhsd" && layout != "bshd")
    return Status::error("layout must be bhsd or bshd, got '{}'", layout);
  const bool bshd = layout == "bshd";
  const int hd = bshd ? 2 : 1, sd = bshd ? 1 : 2;
  AttentionShape s{q.shape[0], q.shape[hd], k.shape[hd], q.shape[sd], k.shape[sd],
                   q.shape[3], v.shape[3],  0.0,         false,       bshd};
  if (s.hk <= 0 || s.h % s.hk != 0 || k.shape[0] != s.b || v.shape[0] != s.b ||
      v.shape[hd] != s.hk || k.shape[3] != s.d || v.shape[sd] != s.tk)
    return Status::error("k and v do not fit q (layout {}: q [{}, {}, {}, {}], k [{}, {}, {}, "
                         "{}], v [{}, {}, {}, {}])",
                         layout, q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[0],
                         k.shape[1], k.shape[2], k.shape[3], v.shape[0], v.shape[1], v.shape[2],
                         v.shape[3]);
  FORGE_RETURN_IF_ERROR(checkDType(k, q.dtype, "k"));
  FORGE_RETURN_IF_ERROR(checkDType(v, q.dtype, "v"));
  CPU_ASSIGN_OR_RETURN(s.scale, ctx.attrs.getFloat("scale"));
  CPU_ASSIGN_OR_RETURN(int64_t causal, ctx.attrs.getInt("causal"));
  s.causal = causal != 0;
  return s;
}

/// Reads the optional bias, input `index` (absent: no bias).
Status readBias(KernelContext &ctx, size_t index, AttentionShape &s) {
  if (ctx.inputs.size() <= index)
    return Status::ok();
  const TensorView &bias = ctx.inputs[index];
  FORGE_RETURN_IF_ERROR(checkDType(bias, ctx.inputs[0].dtype, "bias"));
  if (bias.rank() != 4)
    return Status::error("bias must be rank 4 ([B, H, Tq, Tk], dims 1 broadcast), got rank {}",
                         bias.rank());
  auto strides = broadcastStrides(bias.shape, {s.b, s.h, s.tq, s.tk});
  if (!strides)
    return strides.status().prefix("bias");
  std::copy(strides->begin(), strides->end(), s.biasStride);
  s.bias = static_cast<int>(index);
  return Status::ok();
}

/// o's (and grad_output's) shape in the layout.
std::vector<int64_t> outShape(const AttentionShape &s) {
  return s.bshd ? std::vector<int64_t>{s.b, s.tq, s.h, s.dv}
                : std::vector<int64_t>{s.b, s.h, s.tq, s.dv};
}

DType lseType(DType q) { return q == bundle::F64 ? bundle::F64 : bundle::F32; }

Status attentionKernel(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(AttentionShape s, readShape(ctx));
  FORGE_RETURN_IF_ERROR(readBias(ctx, 3, s));
  const TensorView &q = ctx.inputs[0];
  TensorView &o = ctx.outputs[0], &lse = ctx.outputs[1];
  FORGE_RETURN_IF_ERROR(checkDType(o, q.dtype, "o"));
  FORGE_RETURN_IF_ERROR(checkShape(o, outShape(s), "o"));
  if (q.dtype == bundle::F32 || q.dtype == bundle::F64)
    FORGE_RETURN_IF_ERROR(checkDType(lse, lseType(q.dtype), "lse"));
  FORGE_RETURN_IF_ERROR(checkShape(lse, {s.b, s.h, s.tq}, "lse"));
  return visitGradTypes(q.dtype, ctx, &attentionKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T *pq = q.as<const T>(), *pk = ctx.inputs[1].as<const T>(),
            *pv = ctx.inputs[2].as<const T>();
    const T *pb = s.bias >= 0 ? ctx.inputs[s.bias].as<const T>() : nullptr;
    T *po = o.as<T>();
    L *pl = lse.as<L>();
    const int64_t rows = s.b * s.h * s.tq, group = s.h / s.hk;
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(s.tk * s.d, 1));
    ctx.pool.parallelFor(rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<double> p(s.tk), acc(s.dv);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % s.tq, bh = r / s.tq, bi = bh / s.h, hi = bh % s.h;
        const int64_t kh = hi / group;
        const T *qi = pq + s.qRow(bi, hi, i, s.d);
        const int64_t n = s.keys(i);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const T *kj = pk + s.kRow(bi, kh, j, s.d);
          double dot = 0;
          for (int64_t c = 0; c < s.d; ++c)
            dot += double(qi[c]) * double(kj[c]);
          p[j] = s.scale * dot + (pb ? double(pb[s.biasAt(bi, hi, i, j)]) : 0.0);
          m = std::max(m, p[j]);
        }
        T *oi = po + s.qRow(bi, hi, i, s.dv);
        if (m == -std::numeric_limits<double>::infinity()) { // every key masked
          std::fill(oi, oi + s.dv, static_cast<T>(0));
          pl[r] = static_cast<L>(m);
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += (p[j] = std::exp(p[j] - m));
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const T *vj = pv + s.kRow(bi, kh, j, s.dv);
          for (int64_t c = 0; c < s.dv; ++c)
            acc[c] += p[j] * double(vj[c]);
        }
        for (int64_t c = 0; c < s.dv; ++c)
          oi[c] = static_cast<T>(acc[c] / sum);
        pl[r] = static_cast<L>(m + std::log(sum));
      }
    });
    return Status::ok();
  });
}

/// Inputs q, k, v, o, lse, grad_output[, bias]; outputs dq, dk, dv.
Status attentionGradKernel(KernelContext &ctx) {
  CPU_ASSIGN_OR_RETURN(AttentionShape s, readShape(ctx));
  FORGE_RETURN_IF_ERROR(readBias(ctx, 6, s));
  const TensorView &q = ctx.inputs[0], &o = ctx.inputs[3], &lse = ctx.inputs[4],
                   &dout = ctx.inputs[5];
  FORGE_RETURN_IF_ERROR(checkDType(o, q.dtype, "o"));
  FORGE_RETURN_IF_ERROR(checkShape(o, outShape(s), "o"));
  FORGE_RETURN_IF_ERROR(checkDType(dout, q.dtype, "grad_output"));
  FORGE_RETURN_IF_ERROR(checkShape(dout, outShape(s), "grad_output"));
  if (q.dtype == bundle::F32 || q.dtype == bundle::F64)
    FORGE_RETURN_IF_ERROR(checkDType(lse, lseType(q.dtype), "lse"));
  FORGE_RETURN_IF_ERROR(checkShape(lse, {s.b, s.h, s.tq}, "lse"));
  for (int i = 0; i < 3; ++i) {
    FORGE_RETURN_IF_ERROR(checkDType(ctx.outputs[i], q.dtype, "result"));
    FORGE_RETURN_IF_ERROR(checkShape(ctx.outputs[i], ctx.inputs[i].shape, "result"));
  }
  return visitGradTypes(q.dtype, ctx, &attentionGradKernel, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T *pq = q.as<const T>(), *pk = ctx.inputs[1].as<const T>(),
            *pv = ctx.inputs[2].as<const T>(), *po = o.as<const T>(), *pdo = dout.as<const T>();
    const L *pl = lse.as<const L>();
    const T *pb = s.bias >= 0 ? ctx.inputs[s.bias].as<const T>() : nullptr;
    T *pdq = ctx.outputs[0].as<T>(), *pdk = ctx.outputs[1].as<T>(), *pdv = ctx.outputs[2].as<T>();
    const int64_t group = s.h / s.hk;
    // One unit per key/value head: it owns dk and dv of that head and dq of
    // the query heads reading it.
    ctx.pool.parallelFor(s.b * s.hk, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> dk(s.tk * s.d), dv(s.tk * s.dv), dq(s.d), p(s.tk);
      for (int64_t u = begin; u < end; ++u) {
        const int64_t bi = u / s.hk, kvh = u % s.hk;
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t hi = kvh * group + g;
          for (int64_t i = 0; i < s.tq; ++i) {
            const int64_t r = (bi * s.h + hi) * s.tq + i, n = s.keys(i);
            const int64_t qr = s.qRow(bi, hi, i, s.d), orow = s.qRow(bi, hi, i, s.dv);
            const T *qi = pq + qr, *doi = pdo + orow, *oi = po + orow;
            double di = 0;
            for (int64_t c = 0; c < s.dv; ++c)
              di += double(doi[c]) * double(oi[c]);
            std::fill(dq.begin(), dq.end(), 0.0);
            const bool masked = double(pl[r]) == -std::numeric_limits<double>::infinity();
            for (int64_t j = 0; j < (masked ? 0 : n); ++j) {
              const T *kj = pk + s.kRow(bi, kvh, j, s.d), *vj = pv + s.kRow(bi, kvh, j, s.dv);
              double dot = 0, dp = 0;
              for (int64_t c = 0; c < s.d; ++c)
                dot += double(qi[c]) * double(kj[c]);
              const double pij =
                  std::exp(s.scale * dot + (pb ? double(pb[s.biasAt(bi, hi, i, j)]) : 0.0) -
                           double(pl[r]));
              for (int64_t c = 0; c < s.dv; ++c) {
                dp += double(doi[c]) * double(vj[c]);
                dv[j * s.dv + c] += pij * double(doi[c]);
              }
              const double ds = pij * (dp - di) * s.scale;
              for (int64_t c = 0; c < s.d; ++c) {
                dq[c] += ds * double(kj[c]);
                dk[j * s.d + c] += ds * double(qi[c]);
              }
            }
            for (int64_t c = 0; c < s.d; ++c)
              pdq[qr + c] = static_cast<T>(dq[c]);
          }
        }
        for (int64_t j = 0; j < s.tk; ++j) {
          for (int64_t c = 0; c < s.d; ++c)
            pdk[s.kRow(bi, kvh, j, s.d) + c] = static_cast<T>(dk[j * s.d + c]);
          for (int64_t c = 0; c < s.dv; ++c)
            pdv[s.kRow(bi, kvh, j, s.dv) + c] = static_cast<T>(dv[j * s.dv + c]);
        }
      }
    });
    return Status::ok();
  });
}

} // namespace

void registerAttentionKernels(Registry &r) {
  r.add("attention", &attentionKernel, 3, 4, 2, 2);
  r.add("attention_grad", &attentionGradKernel, 6, 7, 3, 3);
}

} // namespace forge::rt::cpu
