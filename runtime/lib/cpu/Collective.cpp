// all_reduce (forge.all_reduce, forgec --dp): each operand summed or averaged
// over the ranks of its group through the process's communicator
// (Collectives.h). The operands of one op (a bucket) are packed into one f32
// buffer, reduced in one collective, and unpacked into the results, so a bucket
// costs one round of messages whatever its tensor count.
#include "KernelUtil.h"

#include <cstring>

#include "forge/runtime/Collectives.h"

namespace forge::rt::cpu {
namespace {

Status allReduceKernel(KernelContext &ctx) {
  auto group = ctx.attrs.getString("group");
  FORGE_RETURN_IF_ERROR(group.status());
  auto reduction = ctx.attrs.getString("reduction");
  FORGE_RETURN_IF_ERROR(reduction.status());
  auto size = ctx.attrs.getInt("size");
  FORGE_RETURN_IF_ERROR(size.status());
  if (*reduction != "sum" && *reduction != "mean")
    return Status::error("reduction '{}' is neither 'sum' nor 'mean'", *reduction);
  if (ctx.inputs.size() != ctx.outputs.size())
    return Status::error("{} operands but {} results", ctx.inputs.size(), ctx.outputs.size());
  size_t total = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (ctx.inputs[i].dtype != bundle::F32 || ctx.outputs[i].dtype != bundle::F32)
      return Status::error("operand {} is {}: CPU ranks reduce f32 tensors only", i,
                           dtypeName(ctx.inputs[i].dtype));
    if (ctx.inputs[i].numel() != ctx.outputs[i].numel())
      return Status::error("operand {} has {} elements, result {} has {}", i,
                           ctx.inputs[i].numel(), i, ctx.outputs[i].numel());
    total += static_cast<size_t>(ctx.inputs[i].numel());
  }
  auto found = communicatorFor(*group, *size, "this bundle");
  if (!found)
    return found.status();
  Communicator *comm = *found;
  if (!comm) { // a group of one: the identity
    for (size_t i = 0; i < ctx.inputs.size(); ++i)
      if (ctx.outputs[i].data != ctx.inputs[i].data)
        std::memmove(ctx.outputs[i].data, ctx.inputs[i].data, ctx.inputs[i].bytes());
    return Status::ok();
  }
  // One packed buffer per call (a bucket): a collective's messages cost more than the copies.
  std::vector<float> packed(total);
  size_t at = 0;
  for (const TensorView &in : ctx.inputs) {
    std::memcpy(packed.data() + at, in.data, in.bytes());
    at += static_cast<size_t>(in.numel());
  }
  Status s = comm->allReduceSum(packed.data(), packed.size());
  if (!s.isOk())
    return Status::error("group '{}': {}", *group, s.message());
  // The mean divides, as PyTorch DDP does (a sum times 1/3 rounds differently).
  const float divisor = *reduction == "mean" ? static_cast<float>(*size) : 1.0f;
  at = 0;
  for (TensorView &out : ctx.outputs) {
    float *dst = out.as<float>();
    for (int64_t j = 0; j < out.numel(); ++j)
      dst[j] = packed[at + static_cast<size_t>(j)] / divisor;
    at += static_cast<size_t>(out.numel());
  }
  return Status::ok();
}

} // namespace

void registerCollectiveKernels(Registry &r) { r.add("all_reduce", &allReduceKernel, 1, -1, 1, -1); }

} // namespace forge::rt::cpu
