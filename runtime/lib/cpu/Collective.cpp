// Collectives of CPU ranks (the rest of this header is all_reduce's; ZeRO-1's
// reduce_scatter, all_gather and rank_slice follow it).
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
  if (*reduction != "sum" && *reduction != "mean" && *reduction != "max")
    return Status::error("reduction '{}' is not 'sum', 'mean' or 'max'", *reduction);
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
  Status s = *reduction == "max" ? comm->allReduceMax(packed.data(), packed.size())
                                 : comm->allReduceSum(packed.data(), packed.size());
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

/// ZeRO-1's collectives split dim 0 into `size` equal parts (contiguous: the
/// outermost dim), part r belonging to rank r of the group.
struct Parts {
  Communicator *comm = nullptr; // nullptr: a group of one
  int64_t size = 1;
  std::string group;
};
Expected<Parts> partsOf(KernelContext &ctx, const TensorView &whole, const TensorView &part) {
  Parts p;
  auto group = ctx.attrs.getString("group");
  FORGE_RETURN_IF_ERROR(group.status());
  auto size = ctx.attrs.getInt("size");
  FORGE_RETURN_IF_ERROR(size.status());
  if (*size < 1 || whole.numel() != part.numel() * *size || whole.dtype != part.dtype)
    return Status::error("{} is not {} parts of {}", shapeString(part.shape), *size,
                         shapeString(whole.shape));
  auto found = communicatorFor(*group, *size, "this bundle");
  if (!found)
    return found.status();
  p.comm = *found;
  p.size = *size;
  p.group = *group;
  return p;
}

/// reduce_scatter: this rank's part of the sum (or mean) over the group. Gloo's
/// all-reduce of the whole, then the part (CPU ranks: twice a true
/// reduce-scatter's traffic, one collective per tensor).
Status reduceScatterKernel(KernelContext &ctx) {
  const TensorView &in = ctx.inputs[0];
  TensorView &out = ctx.outputs[0];
  if (in.dtype != bundle::F32)
    return Status::error("CPU ranks reduce f32 tensors only, got {}", dtypeName(in.dtype));
  auto parts = partsOf(ctx, in, out);
  FORGE_RETURN_IF_ERROR(parts.status());
  auto reduction = ctx.attrs.getString("reduction");
  FORGE_RETURN_IF_ERROR(reduction.status());
  if (*reduction != "sum" && *reduction != "mean")
    return Status::error("reduction '{}' is neither 'sum' nor 'mean'", *reduction);
  const int rank = parts->comm ? parts->comm->rank() : 0;
  std::vector<float> whole(in.as<float>(), in.as<float>() + in.numel());
  if (parts->comm) {
    Status s = parts->comm->allReduceSum(whole.data(), whole.size());
    if (!s.isOk())
      return Status::error("group '{}': {}", parts->group, s.message());
  }
  const float divisor = *reduction == "mean" ? static_cast<float>(parts->size) : 1.0f;
  const float *src = whole.data() + static_cast<size_t>(rank) * static_cast<size_t>(out.numel());
  float *dst = out.as<float>();
  for (int64_t j = 0; j < out.numel(); ++j)
    dst[j] = src[j] / divisor;
  return Status::ok();
}

/// all_gather: every rank's part, in rank order along dim 0.
Status allGatherKernel(KernelContext &ctx) {
  const TensorView &in = ctx.inputs[0];
  TensorView &out = ctx.outputs[0];
  auto parts = partsOf(ctx, out, in);
  FORGE_RETURN_IF_ERROR(parts.status());
  if (!parts->comm) {
    std::memmove(out.data, in.data, in.bytes());
    return Status::ok();
  }
  Status s = parts->comm->allGather(in.data, out.data, in.bytes());
  if (!s.isOk())
    return Status::error("group '{}': {}", parts->group, s.message());
  return Status::ok();
}

/// rank_slice: this rank's part of a tensor every rank holds whole.
Status rankSliceKernel(KernelContext &ctx) {
  const TensorView &in = ctx.inputs[0];
  TensorView &out = ctx.outputs[0];
  auto parts = partsOf(ctx, in, out);
  FORGE_RETURN_IF_ERROR(parts.status());
  const size_t rank = parts->comm ? static_cast<size_t>(parts->comm->rank()) : 0;
  std::memmove(out.data, static_cast<const uint8_t *>(in.data) + rank * out.bytes(), out.bytes());
  return Status::ok();
}

/// send / recv (forgec --pp): a pipeline stage's message to or from the rank
/// at place `peer` of `group`, matched by `tag`.
Expected<Communicator *> messageGroup(KernelContext &ctx, int64_t &peer, uint64_t &tag) {
  auto group = ctx.attrs.getString("group");
  FORGE_RETURN_IF_ERROR(group.status());
  auto size = ctx.attrs.getInt("size");
  FORGE_RETURN_IF_ERROR(size.status());
  auto p = ctx.attrs.getInt("peer");
  FORGE_RETURN_IF_ERROR(p.status());
  auto t = ctx.attrs.getInt("tag");
  FORGE_RETURN_IF_ERROR(t.status());
  if (*size < 2 || *p < 0 || *p >= *size || *t < 0)
    return Status::error("peer {} and tag {} in a group of {} are not a message's", *p, *t,
                         *size);
  auto found = communicatorFor(*group, *size, "this bundle");
  if (!found)
    return found.status();
  if (!*found) // communicatorFor gives none only for a group of one
    return Status::error("group '{}' of {} ranks has no communicator", *group, *size);
  if ((*found)->rank() == *p)
    return Status::error("a message to this rank's own place {} in group '{}'", *p, *group);
  peer = *p;
  tag = static_cast<uint64_t>(*t);
  return *found;
}

Status sendKernel(KernelContext &ctx) {
  int64_t peer = 0;
  uint64_t tag = 0;
  auto comm = messageGroup(ctx, peer, tag);
  FORGE_RETURN_IF_ERROR(comm.status());
  return (*comm)->send(ctx.inputs[0].data, ctx.inputs[0].bytes(), static_cast<int>(peer), tag);
}

Status recvKernel(KernelContext &ctx) {
  int64_t peer = 0;
  uint64_t tag = 0;
  auto comm = messageGroup(ctx, peer, tag);
  FORGE_RETURN_IF_ERROR(comm.status());
  return (*comm)->recv(ctx.outputs[0].data, ctx.outputs[0].bytes(), static_cast<int>(peer), tag);
}

} // namespace

void registerCollectiveKernels(Registry &r) {
  // Operand and result counts with the order token (tensor<0xi1>, no bytes):
  // send (input[, after]) -> token, recv ([after]) -> (result, token).
  r.add("send", &sendKernel, 1, 2, 1, 1);
  r.add("recv", &recvKernel, 0, 1, 2, 2);
  r.add("all_reduce", &allReduceKernel, 1, -1, 1, -1);
  r.add("reduce_scatter", &reduceScatterKernel, 1, 1, 1, 1);
  r.add("all_gather", &allGatherKernel, 1, 1, 1, 1);
  r.add("rank_slice", &rankSliceKernel, 1, 1, 1, 1);
}

} // namespace forge::rt::cpu
