// Tensors split over a group's ranks (Shards.h): slicing the whole tensor a
// bundle or checkpoint holds into this rank's part, and joining the parts back.
#include "forge/runtime/Shards.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/Collectives.h"
#include "forge/runtime/Executor.h"

namespace forge::rt {

namespace {
/// The slice as [outer x blocks, part]: `outer` the dims before the axis, each
/// holding `blocks` parts (one per block of the whole axis) of `part` bytes (the
/// part's rows of the axis times the inner dims). The whole holds `size` parts
/// per block, rank r's the r-th.
struct Layout {
  size_t outer = 1, blocks = 1, part = 1;
};
Layout layoutOf(const bundle::TensorInfo &info) {
  Layout l;
  const int64_t axis = info.shard().axis();
  l.blocks = info.shard().blocks() > 1 ? static_cast<size_t>(info.shard().blocks()) : 1;
  size_t rows = 1, inner = dtypeSize(info.dtype());
  for (int d = 0; d < info.shape_size(); ++d) {
    if (d < axis)
      l.outer *= static_cast<size_t>(info.shape(d));
    else if (d == axis)
      rows = static_cast<size_t>(info.shape(d));
    else
      inner *= static_cast<size_t>(info.shape(d));
  }
  l.part = rows / l.blocks * inner;
  return l;
}
} // namespace

std::vector<int64_t> wholeShape(const bundle::TensorInfo &info) {
  std::vector<int64_t> shape = canonicalShape(info);
  if (info.has_shard() && info.shard().axis() >= 0 &&
      info.shard().axis() < static_cast<int64_t>(shape.size()))
    shape[info.shard().axis()] *= info.shard().size();
  return shape;
}

size_t wholeBytes(const bundle::TensorInfo &info) {
  return static_cast<size_t>(numElements(wholeShape(info))) * dtypeSize(info.dtype());
}

Expected<int64_t> shardIndex(const bundle::TensorInfo &info) {
  if (!info.has_shard() || info.shard().size() == 1)
    return int64_t{0};
  const bundle::Shard &s = info.shard();
  Communicator *comm = collectiveGroup(s.group());
  if (!comm || comm->size() != s.size())
    return Status::error("'{}' is split over the {} ranks of group '{}' (forgec --tp {}), but this "
                         "process is {}: start the run with forge-train --nproc (D x {} ranks "
                         "with --dp D)",
                         info.name(), s.size(), s.group(), s.size(),
                         comm ? fmt::format("in a group of {}", comm->size())
                              : std::string("in no such group"),
                         s.size());
  return int64_t{comm->rank()};
}

std::vector<uint8_t> sliceShard(const bundle::TensorInfo &info, std::span<const uint8_t> whole,
                                int64_t index) {
  const Layout l = layoutOf(info);
  const size_t parts = static_cast<size_t>(info.shard().size());
  const size_t n = l.outer * l.blocks; // parts in the slice
  std::vector<uint8_t> out(n * l.part);
  for (size_t j = 0; j < n; ++j)
    std::memcpy(out.data() + j * l.part,
                whole.data() + (j * parts + static_cast<size_t>(index)) * l.part, l.part);
  return out;
}

std::vector<uint8_t> joinShards(const bundle::TensorInfo &info, std::span<const uint8_t> parts) {
  const Layout l = layoutOf(info);
  const size_t size = static_cast<size_t>(info.shard().size());
  const size_t n = l.outer * l.blocks, slice = n * l.part;
  std::vector<uint8_t> whole(slice * size);
  for (size_t r = 0; r < size; ++r)
    for (size_t j = 0; j < n; ++j)
      std::memcpy(whole.data() + (j * size + r) * l.part, parts.data() + r * slice + j * l.part,
                  l.part);
  return whole;
}

/// With pipeline stages: each persistent tensor's stage, the one whose
/// train_step@pp<s> writes it, or for a tensor no stage writes (a frozen
/// parameter) the first that reads it. From the bundle alone, so every rank
/// agrees, whatever it loaded.
std::map<int32_t, int> pipelineOwners(const Executor &ex) {
  std::map<int32_t, int> owner, reader;
  const bundle::Program &p = ex.bundle().program();
  for (int r = 0; r < ex.numRoutines(); ++r) {
    const std::string &name = ex.routineName(r);
    const std::string prefix = "train_step@pp";
    if (name.compare(0, prefix.size(), prefix) != 0)
      continue;
    const int stage = std::atoi(name.c_str() + prefix.size());
    auto persistent = [&](int32_t t) {
      auto kind = p.tensors(t).kind();
      return kind == bundle::TensorInfo::PARAMETER || kind == bundle::TensorInfo::STATE;
    };
    for (const bundle::Instruction &inst : p.routines(r).instructions()) {
      for (int32_t t : inst.outputs())
        if (persistent(t))
          owner.emplace(t, stage);
      for (int32_t t : inst.inputs())
        if (t >= 0 && persistent(t) && (!reader.count(t) || reader[t] > stage))
          reader[t] = stage;
    }
  }
  for (auto [t, stage] : reader)
    owner.emplace(t, stage); // no effect where a stage writes it
  return owner;
}

WholeTensors permutedWhole(const Executor &ex) {
  WholeTensors whole;
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    if (info.layout_perm_size() == 0 || info.has_shard() || !ex.isPresent(t))
      continue;
    TensorView v = ex.view(t);
    if (!v.data)
      continue;
    whole[t] = transposeBytes(std::span<const uint8_t>(static_cast<const uint8_t *>(v.data),
                                                       v.bytes()),
                              shapeOf(info), inversePerm(info), dtypeSize(info.dtype()));
  }
  return whole;
}

Expected<WholeTensors> gatherShards(const Executor &ex) {
  WholeTensors whole = permutedWhole(ex); // a permuted tensor's canonical bytes
  // Split tensors (--tp, ZeRO-1's parts) first: an all-gather over each group.
  for (int32_t t : ex.persistentTensors()) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    // An absent tensor (another stage's) comes whole from its stage below.
    if (!info.has_shard() || ex.isDerivedCopy(t) || !ex.isPresent(t))
      continue;
    TensorView v = ex.view(t);
    if (!v.data)
      return Status::error("cannot read '{}'", info.name());
    if (info.shard().size() == 1) {
      const uint8_t *p = static_cast<const uint8_t *>(v.data);
      whole[t].assign(p, p + v.bytes());
      continue;
    }
    FORGE_RETURN_IF_ERROR(shardIndex(info).status());
    Communicator *comm = collectiveGroup(info.shard().group());
    std::vector<uint8_t> parts(v.bytes() * static_cast<size_t>(comm->size()));
    FORGE_RETURN_IF_ERROR(comm->allGather(v.data, parts.data(), v.bytes())
                              .prefix(fmt::format("gathering '{}'", info.name())));
    whole[t] = joinShards(info, parts);
  }
  // Then pipeline stages (forgec --pp): each persistent tensor is current only
  // on the stage that updates it (whole, after the gather above: with --zero 1
  // that stage's data-parallel group joined its parts); every rank takes it
  // from there. Low-precision copies too (--dump-params).
  if (Communicator *pp = collectiveGroup("pp"))
    for (auto [t, stage] : pipelineOwners(ex)) {
      const bundle::TensorInfo &info = ex.tensorInfo(t);
      if (stage >= pp->size())
        return Status::error("'{}' is updated by stage {}, the group has {}", info.name(), stage,
                             pp->size());
      std::vector<uint8_t> &out = whole[t];
      if (out.empty() && !ex.isPresent(t)) { // another stage's: receive it whole
        out.assign(wholeBytes(info), 0);
      } else if (out.empty()) {
        TensorView v = ex.view(t);
        if (!v.data)
          return Status::error("cannot read '{}'", info.name());
        const uint8_t *bytes = static_cast<const uint8_t *>(v.data);
        out.assign(bytes, bytes + v.bytes());
      }
      FORGE_RETURN_IF_ERROR(pp->broadcast(out.data(), out.size(), stage)
                                .prefix(fmt::format("gathering '{}' from stage {}", info.name(),
                                                    stage)));
    }
  return whole;
}

std::vector<int32_t> checkpointPieces(const Executor &ex) {
  const std::map<int32_t, int> owners = pipelineOwners(ex);
  std::vector<int32_t> out;
  for (int32_t t : ex.persistentTensors()) {
    // Low-precision copies and accumulation loops' accumulators (overwritten by
    // each step's first micro-batch) are not checkpointed (Checkpoint.cpp).
    if (ex.isDerivedCopy(t) || !ex.isPresent(t) || isGradAccumulator(ex.tensorInfo(t)))
      continue;
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const std::string split =
        info.has_shard() && info.shard().size() > 1 ? info.shard().group() : std::string();
    bool mine = true;
    for (const char *g : {"dp", "tp", "pp"}) {
      Communicator *comm = collectiveGroup(g);
      if (!comm || comm->size() == 1 || split == g)
        continue; // the tensor's own split: every place writes its piece
      // A stage's tensors are current on that stage only (a tensor no stage
      // updates, say a frozen one, is the same everywhere: stage 0's).
      auto owner = owners.find(t);
      const int first = std::string_view(g) == "pp" && owner != owners.end() ? owner->second : 0;
      mine &= comm->rank() == first;
    }
    if (mine)
      out.push_back(t);
  }
  return out;
}

TensorView wholeView(const Executor &ex, int32_t t, const WholeTensors *whole) {
  if (whole)
    if (auto it = whole->find(t); it != whole->end()) {
      const bundle::TensorInfo &info = ex.tensorInfo(t);
      return TensorView{const_cast<uint8_t *>(it->second.data()), info.dtype(), wholeShape(info)};
    }
  // A permuted tensor has no canonical view without `whole`: an empty one
  // (callers report it) rather than the stored bytes under the wrong shape.
  if (ex.tensorInfo(t).layout_perm_size() > 0)
    return TensorView{};
  return ex.view(t);
}

} // namespace forge::rt
