// Tensors split over the ranks of a collective group (forgec --tp: TensorInfo.shard).
// Rank r of the group holds slice r of the whole tensor along the shard's axis;
// what leaves the process (checkpoints, --dump-params) and what enters it (the
// bundle's initial values, external weights, checkpoints) is always the whole
// tensor, so a run resumes with another layout.
//
// Invariants: sliceShard(joinShards(parts)) gives back each rank's part; every rank
// of a group calls gatherShards at the same point (it is a collective).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

class Executor;

/// Split tensors made whole: tensor index -> the whole tensor's bytes.
using WholeTensors = std::map<int32_t, std::vector<uint8_t>>;

/// The whole tensor's shape (the slice's with the shard axis times its size).
std::vector<int64_t> wholeShape(const bundle::TensorInfo &info);
/// Bytes of the whole tensor.
size_t wholeBytes(const bundle::TensorInfo &info);
/// This process's slice index for `info`: its rank in the shard's group (0 for an
/// unsplit tensor); an error naming the tensor when this process is in no group of
/// that size.
Expected<int64_t> shardIndex(const bundle::TensorInfo &info);
/// Slice `index` of `whole` (wholeBytes(info) bytes).
std::vector<uint8_t> sliceShard(const bundle::TensorInfo &info, std::span<const uint8_t> whole,
                                int64_t index);
/// The whole tensor from every rank's slice, `parts` holding them in rank order.
std::vector<uint8_t> joinShards(const bundle::TensorInfo &info, std::span<const uint8_t> parts);
/// Every split persistent tensor of `ex`, whole (an all-gather over each group, so
/// every rank calls it, in the same order); with pipeline stages (group "pp"),
/// also every state tensor a stage updates, as that stage holds it (a broadcast
/// from it); tensor index -> bytes.
Expected<WholeTensors> gatherShards(const Executor &ex);
/// The canonical bytes of the tensors stored permuted (TensorInfo.layout_perm),
/// without communication: what gatherShards adds for them (a single process).
WholeTensors permutedWhole(const Executor &ex);
/// The persistent tensors (not derived low copies) whose piece this rank writes
/// in a sharded checkpoint (one file per rank): each piece exactly once over the
/// world. A tensor split over a group (--tp, ZeRO-1's parts) is written by every
/// rank of that group, of the replicas that the other groups make the first one
/// (place 0 in "dp" and "tp", the stage that updates it in "pp"); a tensor held
/// whole by the first replica alone. No communication.
std::vector<int32_t> checkpointPieces(const Executor &ex);
/// A view of persistent tensor `t`: its whole value from `whole` when split, else
/// the executor's.
TensorView wholeView(const Executor &ex, int32_t t, const WholeTensors *whole);

} // namespace forge::rt
