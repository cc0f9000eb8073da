// Dropout CPU kernels: dropout_mask (Philox4x32-10 keep mask, Philox.h) and
// dropout as it runs outside train_step (the identity, every element kept).
//
// Invariants: the mask depends on (seed, step, the element's index in the step's
// global batch) only, never on the thread count or the order of work, and equals
// the CUDA kernel's bit for bit (tests/e2e/test_dropout.py).
#include "KernelUtil.h"
#include "forge/runtime/Philox.h"

#include <cmath>
#include <cstring>

namespace forge::rt::cpu {

namespace {

Status dropoutMaskKernel(KernelContext &ctx) {
  const TensorView &step = ctx.inputs[0], &rank = ctx.inputs[1];
  TensorView &mask = ctx.outputs[0];
  CPU_ASSIGN_OR_RETURN(double ratio, ctx.attrs.getFloat("ratio"));
  CPU_ASSIGN_OR_RETURN(int64_t seed, ctx.attrs.getInt("seed"));
  CPU_ASSIGN_OR_RETURN(int64_t first, ctx.attrs.getInt("first_sample"));
  CPU_ASSIGN_OR_RETURN(int64_t rankSamples, ctx.attrs.getInt("rank_samples"));
  CPU_ASSIGN_OR_RETURN(int64_t batch, ctx.attrs.getInt("batch"));
  FORGE_RETURN_IF_ERROR(checkDType(mask, bundle::BOOL, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(step, {}, "step"));
  FORGE_RETURN_IF_ERROR(checkShape(rank, {}, "rank"));
  FORGE_RETURN_IF_ERROR(checkDType(rank, bundle::I64, "rank"));
  const int64_t r = rank.as<const int64_t>()[0];
  if (batch < 1 || mask.numel() % batch != 0 || r < 0 || first < 0 || rankSamples < 0)
    return Status::error("dropout_mask: rank {}, first sample {}, {} samples per rank and batch "
                         "{} do not place {} elements",
                         r, first, rankSamples, batch, mask.numel());
  // The element index in the step's global batch (DropoutMaskOp).
  const uint64_t base = static_cast<uint64_t>(r * rankSamples + first) *
                        static_cast<uint64_t>(mask.numel() / batch);
  if (!(ratio >= 0 && ratio <= 1))
    return Status::error("dropout ratio {} is outside [0, 1]", ratio);
  double s = 0;
  FORGE_RETURN_IF_ERROR(visitFloat(step.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    s = static_cast<double>(load(step.as<const T>()[0]));
    return Status::ok();
  }));
  if (!(s >= 0 && s < 4294967296.0))
    return Status::error("dropout step counter {} is outside [0, 2^32)", s);
  const uint32_t stepWord = static_cast<uint32_t>(s);
  const uint64_t threshold = dropoutThreshold(ratio), key = static_cast<uint64_t>(seed);
  uint8_t *out = mask.as<uint8_t>();
  ctx.pool.parallelFor(mask.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      out[i] = dropoutKeep(key, stepWord, base + static_cast<uint64_t>(i), threshold);
  });
  return Status::ok();
}

Status dropoutKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  FORGE_RETURN_IF_ERROR(checkShape(ctx.outputs[0], x.shape));
  FORGE_RETURN_IF_ERROR(checkDType(ctx.outputs[0], x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkDType(ctx.outputs[1], bundle::BOOL, "mask"));
  FORGE_RETURN_IF_ERROR(checkShape(ctx.outputs[1], x.shape, "mask"));
  if (ctx.outputs[0].data != x.data)
    std::memcpy(ctx.outputs[0].data, x.data, x.bytes());
  std::memset(ctx.outputs[1].data, 1, ctx.outputs[1].bytes());
  return Status::ok();
}

} // namespace

void registerRandomKernels(Registry &r) {
  r.add("dropout_mask", &dropoutMaskKernel, 2, 2);
  r.add("dropout", &dropoutKernel, 1, 1, 2, 2);
}

} // namespace forge::rt::cpu
