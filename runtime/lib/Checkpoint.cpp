// Training checkpoints (Checkpoint.h).
//
// Invariants (see the header for the file layout):
//  * writeCheckpoint goes through writeNpz (temporary file, fsync, rename,
//    directory fsync: FileUtil.h), so after it returns the checkpoint survives a
//    crash; CheckpointDir::save never chooses an existing file name and updates
//    `latest` the same way, after the checkpoint itself is durable.
//  * readCheckpoint decodes and checks everything into private buffers first
//    and calls Executor::setPersistent only when the whole file is valid,
//    so a refused checkpoint leaves the executor as it was. It never writes,
//    renames or deletes the file.
//  * Messages start with the checkpoint's path and say what is wrong and, for
//    another bundle's checkpoint, which tensor differs.
#include "forge/runtime/Checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "forge/runtime/Collectives.h"
#include "forge/runtime/FileUtil.h"
#include "forge/runtime/Npy.h"

namespace forge::rt {

bool isGradAccumulator(const bundle::TensorInfo &t) { return t.role() == "grad_accumulator"; }

namespace {

constexpr const char *kMetaMember = "forge_checkpoint";
constexpr const char *kFormatName = "forge-checkpoint";

uint32_t crc32Of(const void *data, size_t n) {
  return static_cast<uint32_t>(
      ::crc32_z(::crc32_z(0, nullptr, 0), static_cast<const Bytef *>(data), n));
}

/// What a checkpoint holds: every PARAMETER and STATE tensor but the
/// low-precision copies, which are derived from their parameters (so fp32
/// and bf16 bundles of one model share checkpoints).
/// Nor the gradient accumulators of an accumulation loop (isGradAccumulator):
/// such a bundle and its unrolled form (or a run without micro-batches of the
/// same batch) share checkpoints too.
bool isPersistent(const bundle::TensorInfo &t) {
  return (t.kind() == bundle::TensorInfo::PARAMETER || t.kind() == bundle::TensorInfo::STATE) &&
         t.copy_of().empty() && !isGradAccumulator(t);
}

std::vector<int32_t> checkpointed(const Executor &ex) {
  std::vector<int32_t> out;
  for (int32_t t : ex.persistentTensors())
    if (!ex.isDerivedCopy(t) && !isGradAccumulator(ex.tensorInfo(t)))
      out.push_back(t);
  return out;
}

const char *kindName(const bundle::TensorInfo &t) {
  return t.kind() == bundle::TensorInfo::PARAMETER ? "param" : "state";
}

std::string memberName(const bundle::TensorInfo &t) {
  return fmt::format("{}/{}", kindName(t), t.name());
}

std::string describe(const std::string &dtype, const std::vector<int64_t> &shape) {
  return fmt::format("{}{}", dtype, shapeString(shape));
}

struct ParsedName {
  int64_t step;
  int64_t suffix; // -1 for the plain name
};

/// ckpt-<step>.forgeckpt or ckpt-<step>.<n>.forgeckpt
std::optional<ParsedName> parseCheckpointName(const std::string &name) {
  static const std::regex re(R"(ckpt-(\d{1,18})(?:\.(\d{1,9}))?\.forgeckpt)");
  std::smatch m;
  if (!std::regex_match(name, m, re))
    return std::nullopt;
  return ParsedName{std::stoll(m[1].str()), m[2].matched ? std::stoll(m[2].str()) : -1};
}

/// ckpt-<step>.forgeckpt (n = 0) or ckpt-<step>.<n>.forgeckpt
std::string checkpointName(int64_t step, int n) {
  return n == 0 ? fmt::format("ckpt-{}.forgeckpt", step) : fmt::format("ckpt-{}.{}.forgeckpt", step, n);
}

/// The first n whose checkpointName(step, n) is free in `dir` (nothing there).
Expected<int> freeCheckpointName(const std::string &dir, int64_t step) {
  std::error_code ec;
  for (int n = 0; n <= 1000000; ++n)
    if (!std::filesystem::exists(std::filesystem::path(dir) / checkpointName(step, n), ec) && !ec)
      return n;
  return Status::error("{}: no free checkpoint name for step {}", dir, step);
}

} // namespace

std::string persistentFingerprint(const bundle::Program &program) {
  // FNV-1a 64 over a canonical text of the persistent tensors.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
    h ^= 0xff; // separator
    h *= 0x100000001b3ull;
  };
  for (const bundle::TensorInfo &t : program.tensors()) {
    if (!isPersistent(t))
      continue;
    mix(t.name());
    mix(kindName(t));
    mix(dtypeName(t.dtype()));
    mix(shapeString(wholeShape(t))); // a split tensor's whole: any layout resumes
  }
  return fmt::format("{:016x}", h);
}

/// The build options that shape training but not the persistent tensors (the
/// fingerprint covers those): a resume with different ones is reported.
nlohmann::json trainingOptions(const bundle::Program &p) {
  nlohmann::json o = nlohmann::json::object();
  for (const char *key : {"optimizer", "loss", "label_input", "lr_schedule", "micro_batches",
                          "clip_grad_norm", "batch", "tf32", "precision", "loss_scale"}) {
    auto it = p.build_options().find(key);
    o[key] = it == p.build_options().end() ? "" : it->second;
  }
  return o;
}

namespace {

/// One checkpoint file's tensors and metadata: a whole checkpoint, or rank
/// `rank`'s file of a sharded one (`ranks` files).
struct Part {
  int64_t axis = 0, index = 0, parts = 1, blocks = 1;
};
struct Entry {
  std::string name, kind, dtype;
  std::vector<int64_t> shape; // the piece's (the whole tensor's without `part`)
  uint32_t crc = 0;
  std::optional<Part> part; // a slice of the whole (sharded checkpoints)
};
struct Loaded {
  CheckpointState state;
  std::string sourceHash, fingerprint;
  std::vector<Entry> entries;
  std::map<std::string, HostTensor> members;
  nlohmann::json options; // the training options it was written with (or null)
  int64_t rank = -1, ranks = 0; // a sharded checkpoint's rank file
};

/// Writes `tensors` of `ex` to `path`: each whole (from `whole` when split),
/// or, with `shard` ({rank, ranks}), each as this rank holds it, a split one
/// recorded as its piece of the whole.
Status writeFile(const std::string &path, const Executor &ex, const CheckpointState &state,
                 const std::vector<int32_t> &tensorsOf, const WholeTensors *whole,
                 std::optional<std::pair<int64_t, int64_t>> shard) {
  const bundle::Program &p = ex.bundle().program();
  // Tensors stored permuted are written canonical: from `whole` when given
  // (gatherShards adds them), else converted here.
  WholeTensors local;
  if (!whole) {
    local = permutedWhole(ex);
    whole = &local;
  }
  nlohmann::json meta;
  meta["format"] = kFormatName;
  // Whole files stay version 1 (readers before sharding take them); a rank's
  // file of a sharded checkpoint is version 2.
  meta["version"] = shard ? kCheckpointVersion : 1;
  meta["step"] = state.step;
  meta["epoch"] = state.epoch;
  meta["index"] = state.index;
  meta["seed"] = state.seed;
  meta["shuffle"] = state.shuffle;
  meta["train_samples"] = state.trainSamples;
  meta["samples_per_step"] = state.samplesPerStep;
  meta["source_hash"] = p.source_hash();
  meta["producer"] = p.producer();
  meta["fingerprint"] = persistentFingerprint(p);
  meta["training_options"] = trainingOptions(p);
  if (shard)
    meta["shard"] = {{"rank", shard->first}, {"ranks", shard->second}};
  nlohmann::json tensors = nlohmann::json::array();
  std::map<std::string, TensorView> arrays;
  for (int32_t t : tensorsOf) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const bool split = info.has_shard() && info.shard().size() > 1;
    TensorView v = shard && info.layout_perm_size() == 0 ? ex.view(t) : wholeView(ex, t, whole);
    if (!v.data)
      return Status::error("{}: cannot read '{}'", path, info.name());
    if (!shard && split && (!whole || !whole->count(t)))
      return Status::error("{}: '{}' is split over ranks and was not gathered", path,
                           info.name());
    std::string member = memberName(info);
    if (arrays.count(member))
      return Status::error("{}: two persistent tensors are named '{}'", path, info.name());
    nlohmann::json entry = {{"name", info.name()},
                            {"kind", kindName(info)},
                            {"dtype", dtypeName(info.dtype())},
                            {"shape", v.shape},
                            {"crc32", crc32Of(v.data, v.bytes())}};
    if (shard && split) {
      auto index = shardIndex(info);
      if (!index)
        return index.status().prefix(path);
      entry["part"] = {{"axis", info.shard().axis()},
                       {"index", *index},
                       {"parts", info.shard().size()},
                       {"blocks", std::max<int64_t>(1, info.shard().blocks())}};
    }
    tensors.push_back(std::move(entry));
    arrays[member] = v;
  }
  meta["tensors"] = std::move(tensors);
  std::string text = meta.dump(1);
  std::vector<uint8_t> metaBytes(text.begin(), text.end());
  arrays[kMetaMember] = TensorView{metaBytes.data(), bundle::U8,
                                   {static_cast<int64_t>(metaBytes.size())}};
  return writeNpz(path, arrays);
}

/// Reads and parses one checkpoint file (no check against a bundle yet).
Expected<Loaded> loadFile(const std::string &path, CheckpointError &kind) {
  kind = CheckpointError::Corrupt;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    kind = CheckpointError::Io;
    return Status::error("{}: cannot open: {}", path, std::strerror(errno));
  }
  auto npz = readNpz(path);
  if (!npz)
    return Status::error("corrupt or truncated checkpoint: {}", npz.status().message());
  auto metaIt = npz->find(kMetaMember);
  if (metaIt == npz->end())
    return Status::error("{}: not a forge checkpoint (no '{}' member)", path, kMetaMember);
  const HostTensor &metaT = metaIt->second;
  nlohmann::json meta = nlohmann::json::parse(metaT.bytes.begin(), metaT.bytes.end(), nullptr,
                                               /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object())
    return Status::error("{}: the checkpoint metadata is not valid JSON", path);
  Loaded l;
  CheckpointState &state = l.state;
  try {
    if (meta.value("format", "") != kFormatName)
      return Status::error("{}: not a forge checkpoint (format '{}')", path,
                           meta.value("format", ""));
    int version = meta.at("version").get<int>();
    if (version > kCheckpointVersion) {
      kind = CheckpointError::Mismatch;
      return Status::error("{}: checkpoint format version {} is newer than this forge-train "
                           "supports ({})",
                           path, version, kCheckpointVersion);
    }
    state.step = meta.at("step").get<int64_t>();
    state.epoch = meta.at("epoch").get<uint64_t>();
    state.index = meta.at("index").get<int64_t>();
    state.seed = meta.at("seed").get<uint64_t>();
    state.shuffle = meta.at("shuffle").get<bool>();
    state.trainSamples = meta.at("train_samples").get<int64_t>();
    state.samplesPerStep = meta.at("samples_per_step").get<int64_t>();
    l.sourceHash = meta.at("source_hash").get<std::string>();
    l.fingerprint = meta.at("fingerprint").get<std::string>();
    if (meta.contains("training_options")) // checkpoints before 2026-12-01 lack them
      l.options = meta.at("training_options");
    if (meta.contains("shard")) {
      l.rank = meta.at("shard").at("rank").get<int64_t>();
      l.ranks = meta.at("shard").at("ranks").get<int64_t>();
      if (l.ranks < 1 || l.rank < 0 || l.rank >= l.ranks)
        return Status::error("{}: shard rank {} of {} is out of range", path, l.rank, l.ranks);
    }
    for (const auto &t : meta.at("tensors")) {
      Entry e{t.at("name").get<std::string>(), t.at("kind").get<std::string>(),
              t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
              t.at("crc32").get<uint32_t>(), std::nullopt};
      if (t.contains("part")) {
        const auto &j = t.at("part");
        Part part{j.at("axis").get<int64_t>(), j.at("index").get<int64_t>(),
                  j.at("parts").get<int64_t>(), j.at("blocks").get<int64_t>()};
        if (part.parts < 1 || part.blocks < 1 || part.index < 0 || part.index >= part.parts ||
            part.axis < 0 || part.axis >= static_cast<int64_t>(e.shape.size()) ||
            e.shape[part.axis] % part.blocks != 0)
          return Status::error("{}: {} '{}': malformed part (axis {}, index {} of {}, {} "
                               "blocks) of {}",
                               path, e.kind, e.name, part.axis, part.index, part.parts,
                               part.blocks, shapeString(e.shape));
        e.part = part;
      }
      l.entries.push_back(std::move(e));
    }
  } catch (const std::exception &e) {
    return Status::error("{}: malformed checkpoint metadata: {}", path, e.what());
  }
  if (state.step < 0 || state.index < 0 || state.samplesPerStep < 0 || state.trainSamples < 0)
    return Status::error("{}: negative step or data position in the metadata", path);
  // Every member present, holding what its entry says, with its own CRC.
  for (const Entry &e : l.entries) {
    std::string member = e.kind + "/" + e.name;
    auto m = npz->find(member);
    if (m == npz->end())
      return Status::error("{}: member '{}' is missing", path, member);
    const HostTensor &v = m->second;
    if (numElements(v.shape) != numElements(e.shape))
      return Status::error("{}: member '{}' holds {} {}, expected {}", path, member,
                           dtypeName(v.dtype), shapeString(v.shape), describe(e.dtype, e.shape));
    uint32_t crc = crc32Of(v.bytes.data(), v.bytes.size());
    if (crc != e.crc)
      return Status::error("{}: member '{}': CRC32 mismatch (metadata {:#010x}, data "
                           "{:#010x}); the checkpoint is corrupted",
                           path, member, e.crc, crc);
  }
  npz->erase(kMetaMember);
  l.members = npz.take();
  return l;
}

/// A sharded checkpoint: the directory of every rank's file. Checks that the
/// files are one checkpoint (all ranks, one step and bundle) and joins each
/// split tensor's pieces into the whole, as a whole checkpoint holds it.
Expected<Loaded> loadSharded(const std::string &dir, CheckpointError &kind) {
  kind = CheckpointError::Corrupt;
  static const std::regex re(R"(rank-(\d{1,9})-of-(\d{1,9})\.forgeckpt)");
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto &e : std::filesystem::directory_iterator(dir, ec))
    if (std::regex_match(e.path().filename().string(), re))
      files.push_back(e.path().string());
  if (ec) {
    kind = CheckpointError::Io;
    return Status::error("{}: cannot list: {}", dir, ec.message());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    return Status::error("{}: a sharded checkpoint without rank files (rank-R-of-N.forgeckpt)",
                         dir);
  std::vector<Loaded> ranks;
  for (const std::string &f : files) {
    auto l = loadFile(f, kind);
    if (!l)
      return l.status();
    if (l->ranks < 1)
      return Status::error("{}: not a rank's file of a sharded checkpoint", f);
    ranks.push_back(l.take());
  }
  const Loaded &first = ranks.front();
  std::vector<bool> seen(static_cast<size_t>(first.ranks), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Loaded &l = ranks[i];
    if (l.ranks != first.ranks || l.state.step != first.state.step ||
        l.fingerprint != first.fingerprint || l.sourceHash != first.sourceHash)
      return Status::error("{}: {} is not of the same checkpoint as {} (ranks {} vs {}, step {} "
                           "vs {})",
                           dir, files[i], files[0], l.ranks, first.ranks, l.state.step,
                           first.state.step);
    if (seen[static_cast<size_t>(l.rank)])
      return Status::error("{}: two files of rank {}", dir, l.rank);
    seen[static_cast<size_t>(l.rank)] = true;
  }
  for (int64_t r = 0; r < first.ranks; ++r)
    if (!seen[static_cast<size_t>(r)])
      return Status::error("{}: incomplete sharded checkpoint: rank {}'s file of {} is missing "
                           "(a run stopped while writing it?)",
                           dir, r, first.ranks);
  // Pieces by member: a whole one, or the parts of a split one.
  struct Piece {
    const Entry *entry;
    HostTensor *value;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (Loaded &l : ranks)
    for (const Entry &e : l.entries)
      pieces[e.kind + "/" + e.name].push_back({&e, &l.members.at(e.kind + "/" + e.name)});
  Loaded out;
  out.state = first.state;
  out.options = first.options;
  out.sourceHash = first.sourceHash;
  out.fingerprint = first.fingerprint;
  for (auto &[member, list] : pieces) {
    const Entry &e0 = *list.front().entry;
    Entry whole{e0.name, e0.kind, e0.dtype, e0.shape, 0, std::nullopt};
    HostTensor value;
    auto wholePiece = std::find_if(list.begin(), list.end(),
                                   [](const Piece &p) { return !p.entry->part; });
    if (wholePiece != list.end()) {
      whole.shape = wholePiece->entry->shape;
      value = std::move(*wholePiece->value);
    } else {
      const Part part = *e0.part;
      std::vector<const Piece *> byIndex(static_cast<size_t>(part.parts), nullptr);
      for (const Piece &p : list) {
        const Part &q = *p.entry->part;
        if (q.axis != part.axis || q.parts != part.parts || q.blocks != part.blocks ||
            p.entry->shape != e0.shape || p.entry->dtype != e0.dtype)
          return Status::error("{}: the pieces of {} '{}' disagree on their split", dir, e0.kind,
                               e0.name);
        byIndex[static_cast<size_t>(q.index)] = &p;
      }
      for (int64_t i = 0; i < part.parts; ++i)
        if (!byIndex[static_cast<size_t>(i)])
          return Status::error("{}: piece {} of {} of {} '{}' is in no rank's file", dir, i,
                               part.parts, e0.kind, e0.name);
      // joinShards reads the split from a TensorInfo: the piece's shape and the split.
      bundle::TensorInfo info;
      info.set_dtype(list.front().value->dtype);
      for (int64_t d : e0.shape)
        info.add_shape(d);
      info.mutable_shard()->set_axis(part.axis);
      info.mutable_shard()->set_size(part.parts);
      info.mutable_shard()->set_blocks(part.blocks);
      std::vector<uint8_t> concatenated;
      for (const Piece *p : byIndex)
        concatenated.insert(concatenated.end(), p->value->bytes.begin(), p->value->bytes.end());
      whole.shape = wholeShape(info);
      value.dtype = list.front().value->dtype;
      value.shape = whole.shape;
      value.bytes = joinShards(info, concatenated);
    }
    whole.crc = crc32Of(value.bytes.data(), value.bytes.size());
    out.entries.push_back(std::move(whole));
    out.members[member] = std::move(value);
  }
  return out;
}

} // namespace

Status writeCheckpoint(const std::string &path, const Executor &ex,
                       const CheckpointState &state, const WholeTensors *whole) {
  return writeFile(path, ex, state, checkpointed(ex), whole, std::nullopt);
}

Status writeCheckpointShard(const std::string &path, const Executor &ex,
                            const CheckpointState &state, int64_t rank, int64_t ranks) {
  return writeFile(path, ex, state, checkpointPieces(ex), nullptr, std::make_pair(rank, ranks));
}

Expected<CheckpointState> readCheckpoint(const std::string &path, Executor &ex,
                                         CheckpointError *error) {
  CheckpointError kind = CheckpointError::Corrupt;
  auto fail = [&](CheckpointError k, Status s) {
    if (error)
      *error = k;
    return s;
  };
  if (error)
    *error = CheckpointError::None;
  std::error_code ec;
  auto loaded = std::filesystem::is_directory(path, ec) ? loadSharded(path, kind)
                                                        : loadFile(path, kind);
  if (!loaded)
    return fail(kind, loaded.status());
  if (loaded->ranks > 0)
    return fail(CheckpointError::Corrupt,
                Status::error("{}: one rank's file of a sharded checkpoint: resume from its "
                              "directory",
                              path));
  kind = CheckpointError::Corrupt;
  const bundle::Program &p = ex.bundle().program();
  CheckpointState state = loaded->state;
  const std::vector<Entry> &entries = loaded->entries;
  const std::string &sourceHash = loaded->sourceHash, &fingerprint = loaded->fingerprint;
  if (loaded->options.is_object()) { // the saved options against this bundle's
    nlohmann::json now = trainingOptions(p);
    try {
      for (const auto &[key, value] : loaded->options.items())
        if (now.contains(key) && now[key] != value)
          state.changedOptions.push_back(fmt::format("{}: checkpoint '{}', bundle '{}'", key,
                                                     value.get<std::string>(),
                                                     now[key].get<std::string>()));
    } catch (const std::exception &e) {
      return fail(kind, Status::error("{}: malformed checkpoint metadata: {}", path, e.what()));
    }
  }
  // Same bundle?
  if (!sourceHash.empty() && !p.source_hash().empty() && sourceHash != p.source_hash())
    return fail(CheckpointError::Mismatch,
                Status::error("{}: checkpoint of another model (source hash {}, this bundle has "
                              "{})",
                              path, sourceHash, p.source_hash()));
  std::map<std::string, const Entry *> byName;
  for (const Entry &e : entries)
    byName[e.kind + "/" + e.name] = &e;
  for (int32_t t : checkpointed(ex)) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const std::vector<int64_t> shape = wholeShape(info); // checkpoints hold whole tensors
    auto it = byName.find(memberName(info));
    if (it == byName.end())
      return fail(CheckpointError::Mismatch,
                  Status::error("{}: checkpoint of another bundle: it has no {} '{}' ({})", path,
                                kindName(info), info.name(),
                                describe(std::string(dtypeName(info.dtype())), shape)));
    const Entry &e = *it->second;
    if (e.dtype != dtypeName(info.dtype()) || e.shape != shape)
      return fail(CheckpointError::Mismatch,
                  Status::error("{}: checkpoint of another bundle: {} '{}' is {} there, {} here",
                                path, kindName(info), info.name(), describe(e.dtype, e.shape),
                                describe(std::string(dtypeName(info.dtype())), shape)));
  }
  if (entries.size() != checkpointed(ex).size() || fingerprint != persistentFingerprint(p)) {
    std::vector<std::string> extra;
    for (const Entry &e : entries) {
      bool known = false;
      for (int32_t t : checkpointed(ex))
        known |= memberName(ex.tensorInfo(t)) == e.kind + "/" + e.name;
      if (!known)
        extra.push_back(fmt::format("{} '{}'", e.kind, e.name));
    }
    return fail(CheckpointError::Mismatch,
                Status::error("{}: checkpoint of another bundle (tensor fingerprint {} vs {}{})",
                              path, fingerprint, persistentFingerprint(p),
                              extra.empty() ? ""
                                            : fmt::format("; only in the checkpoint: {}",
                                                          fmt::join(extra, ", "))));
  }

  // Every tensor present and the right size (loadFile checked each member's CRC).
  std::vector<std::pair<int32_t, const HostTensor *>> values;
  for (int32_t t : checkpointed(ex)) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const Entry &e = *byName.at(memberName(info));
    auto m = loaded->members.find(memberName(info));
    if (m == loaded->members.end())
      return fail(kind, Status::error("{}: member '{}' is missing", path, memberName(info)));
    const HostTensor &v = m->second;
    if (v.bytes.size() != wholeBytes(info) || dtypeSize(v.dtype) != dtypeSize(info.dtype()))
      return fail(kind, Status::error("{}: member '{}' holds {} {}, expected {}", path,
                                      memberName(info), dtypeName(v.dtype), shapeString(v.shape),
                                      describe(e.dtype, e.shape)));
    values.emplace_back(t, &v);
  }
  for (const auto &[t, v] : values) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    if (!ex.isPresent(t))
      continue; // another pipeline stage's (checked above, restored there)
    std::vector<uint8_t> slice;
    if (info.has_shard()) { // a whole tensor: this rank's slice
      auto index = shardIndex(info);
      if (!index)
        return fail(CheckpointError::Mismatch, index.status().prefix(path));
      slice = sliceShard(info, v->bytes, *index);
    }
    Status s = ex.setPersistent(t, info.has_shard() ? std::span<const uint8_t>(slice)
                                                    : std::span<const uint8_t>(v->bytes));
    if (!s.isOk()) // only a read-only parameter with a different value
      return fail(CheckpointError::Mismatch, s.prefix(path));
  }
  return state;
}

// --- CheckpointDir ------------------------------------------------------------------

Status CheckpointDir::create() const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    return Status::error("{}: cannot create the checkpoint directory: {}", dir_, ec.message());
  if (!std::filesystem::is_directory(dir_, ec))
    return Status::error("{}: not a directory", dir_);
  return Status::ok();
}

Status CheckpointDir::prepare(const std::function<void(const std::string &)> &warn) const {
  FORGE_RETURN_IF_ERROR(create());
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    size_t tmp = name.rfind(".tmp.");
    if (tmp == std::string::npos || !e.is_regular_file(ec))
      continue;
    std::string target = name.substr(0, tmp);
    if (target != "latest" && !parseCheckpointName(target))
      continue; // not ours
    std::error_code rm;
    fs::remove(e.path(), rm);
    warn(fmt::format("removed {}, left by a checkpoint writer that did not finish{}",
                     e.path().string(), rm ? " (failed: " + rm.message() + ")" : ""));
  }
  std::string probe = (fs::path(dir_) / ".forge-write-test.XXXXXX").string();
  int fd = ::mkstemp(probe.data());
  if (fd < 0)
    return Status::error("{}: cannot write checkpoints there: {}", dir_, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

std::vector<std::string> CheckpointDir::list() const {
  std::vector<std::pair<ParsedName, std::string>> found;
  std::error_code ec;
  for (const auto &e : std::filesystem::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (auto parsed = parseCheckpointName(name))
      found.push_back({*parsed, e.path().string()});
  }
  std::sort(found.begin(), found.end(), [](const auto &a, const auto &b) {
    return std::tie(a.first.step, a.first.suffix) > std::tie(b.first.step, b.first.suffix);
  });
  std::vector<std::string> out;
  for (auto &f : found)
    out.push_back(std::move(f.second));
  return out;
}

Expected<std::string> CheckpointDir::save(const Executor &ex, const CheckpointState &state,
                                          const WholeTensors *whole) const {
  FORGE_RETURN_IF_ERROR(create());
  namespace fs = std::filesystem;
  auto n = freeCheckpointName(dir_, state.step);
  if (!n)
    return n.status();
  const std::string name = checkpointName(state.step, *n);
  std::string path = (fs::path(dir_) / name).string();
  FORGE_RETURN_IF_ERROR(writeCheckpoint(path, ex, state, whole));
  FORGE_RETURN_IF_ERROR(writeFileAtomically((fs::path(dir_) / "latest").string(), name + "\n"));
  return path;
}

Expected<std::string> CheckpointDir::saveSharded(const Executor &ex, const CheckpointState &state,
                                                 Communicator &world) const {
  namespace fs = std::filesystem;
  const int rank = world.rank(), ranks = world.size();
  // Rank 0 picks the name (its suffix n, 0: the plain name; -1: failed) and
  // makes the directory; the others learn it from a sum over the world.
  float code = 0;
  std::string problem;
  if (rank == 0) {
    Status made = create();
    Expected<int> n = made.isOk() ? freeCheckpointName(dir_, state.step) : Expected<int>(made);
    if (!n)
      made = n.status();
    const fs::path dir = fs::path(dir_) / checkpointName(state.step, n ? *n : 0);
    std::error_code ec;
    if (made.isOk() && !fs::create_directory(dir, ec))
      made = Status::error("{}: cannot create {}: {}", dir_, dir.filename().string(),
                           ec ? ec.message() : "it exists");
    if (made.isOk()) // the new directory's entry is durable before any rank writes in it
      made = syncDirectoryOf(dir.string());
    code = made.isOk() ? static_cast<float>(*n) : -1.0f;
    if (!made.isOk())
      problem = made.message();
  }
  FORGE_RETURN_IF_ERROR(world.allReduceSum(&code, 1).prefix("agreeing on a checkpoint name"));
  if (code < 0)
    return Status::error("{}", rank == 0 ? problem : "rank 0 could not make the checkpoint "
                                                      "directory");
  const std::string name = checkpointName(state.step, static_cast<int>(code));
  const std::string path = (fs::path(dir_) / name).string();
  Status wrote = writeCheckpointShard(
      (fs::path(path) / fmt::format("rank-{:05}-of-{:05}.forgeckpt", rank, ranks)).string(), ex,
      state, rank, ranks);
  float failed = wrote.isOk() ? 0.0f : 1.0f;
  FORGE_RETURN_IF_ERROR(world.allReduceSum(&failed, 1).prefix("agreeing that a checkpoint was "
                                                              "written"));
  if (!wrote.isOk())
    return wrote;
  if (failed > 0)
    return Status::error("{}: {} rank(s) could not write their part; `latest` is unchanged",
                         path, static_cast<int>(failed));
  if (rank == 0)
    FORGE_RETURN_IF_ERROR(writeFileAtomically((fs::path(dir_) / "latest").string(), name + "\n"));
  return path;
}

Expected<std::optional<CheckpointState>>
CheckpointDir::resume(Executor &ex, const std::function<void(const std::string &)> &warn) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir_, ec))
    return std::optional<CheckpointState>();
  if (!fs::is_directory(dir_, ec))
    return Status::error("{}: not a directory", dir_);
  // Newest first. `latest` is kept for tools and people; a newer valid file
  // (written after `latest` was last updated, e.g. by a killed run) wins.
  std::vector<std::string> candidates = list();
  if (candidates.empty())
    return std::optional<CheckpointState>();
  std::vector<std::string> problems;
  for (const std::string &c : candidates) {
    CheckpointError kind;
    auto state = readCheckpoint(c, ex, &kind);
    if (state) {
      if (!state->changedOptions.empty())
        warn(fmt::format("{} was written by a bundle with other training options ({}); "
                         "continuing with this bundle's",
                         c, fmt::join(state->changedOptions, "; ")));
      return std::optional<CheckpointState>(*state);
    }
    if (kind == CheckpointError::Mismatch)
      return state.status();
    warn(fmt::format("skipping {} (left in place)", state.status().message()));
    problems.push_back(state.status().message());
  }
  return Status::error("{}: no valid checkpoint to resume from ({} refused: {})", dir_,
                       problems.size(), fmt::join(problems, "; "));
}

} // namespace forge::rt
