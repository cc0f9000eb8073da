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

#include "forge/runtime/FileUtil.h"
#include "forge/runtime/Npy.h"

namespace forge::rt {

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
bool isPersistent(const bundle::TensorInfo &t) {
  return (t.kind() == bundle::TensorInfo::PARAMETER || t.kind() == bundle::TensorInfo::STATE) &&
         t.copy_of().empty();
}

std::vector<int32_t> checkpointed(const Executor &ex) {
  std::vector<int32_t> out;
  for (int32_t t : ex.persistentTensors())
    if (!ex.isDerivedCopy(t))
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

Status writeCheckpoint(const std::string &path, const Executor &ex,
                       const CheckpointState &state, const WholeTensors *whole) {
  const bundle::Program &p = ex.bundle().program();
  nlohmann::json meta;
  meta["format"] = kFormatName;
  meta["version"] = kCheckpointVersion;
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
  nlohmann::json tensors = nlohmann::json::array();
  std::map<std::string, TensorView> arrays;
  for (int32_t t : checkpointed(ex)) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    TensorView v = wholeView(ex, t, whole);
    if (info.has_shard() && info.shard().size() > 1 && (!whole || !whole->count(t)))
      return Status::error("{}: '{}' is split over ranks and was not gathered", path,
                           info.name());
    std::string member = memberName(info);
    if (arrays.count(member))
      return Status::error("{}: two persistent tensors are named '{}'", path, info.name());
    tensors.push_back({{"name", info.name()},
                       {"kind", kindName(info)},
                       {"dtype", dtypeName(info.dtype())},
                       {"shape", v.shape},
                       {"crc32", crc32Of(v.data, v.bytes())}});
    arrays[member] = v;
  }
  meta["tensors"] = std::move(tensors);
  std::string text = meta.dump(1);
  std::vector<uint8_t> metaBytes(text.begin(), text.end());
  arrays[kMetaMember] = TensorView{metaBytes.data(), bundle::U8,
                                   {static_cast<int64_t>(metaBytes.size())}};
  return writeNpz(path, arrays);
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
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return fail(CheckpointError::Io,
                Status::error("{}: cannot open: {}", path, std::strerror(errno)));
  auto npz = readNpz(path);
  if (!npz)
    return fail(CheckpointError::Corrupt,
                Status::error("corrupt or truncated checkpoint: {}", npz.status().message()));

  auto metaIt = npz->find(kMetaMember);
  if (metaIt == npz->end())
    return fail(kind, Status::error("{}: not a forge checkpoint (no '{}' member)", path,
                                    kMetaMember));
  const HostTensor &metaT = metaIt->second;
  nlohmann::json meta = nlohmann::json::parse(metaT.bytes.begin(), metaT.bytes.end(), nullptr,
                                               /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object())
    return fail(kind, Status::error("{}: the checkpoint metadata is not valid JSON", path));

  const bundle::Program &p = ex.bundle().program();
  CheckpointState state;
  std::string sourceHash, fingerprint;
  struct Entry {
    std::string name, kind, dtype;
    std::vector<int64_t> shape;
    uint32_t crc;
  };
  std::vector<Entry> entries;
  try {
    if (meta.value("format", "") != kFormatName)
      return fail(kind, Status::error("{}: not a forge checkpoint (format '{}')", path,
                                      meta.value("format", "")));
    int version = meta.at("version").get<int>();
    if (version > kCheckpointVersion)
      return fail(CheckpointError::Mismatch,
                  Status::error("{}: checkpoint format version {} is newer than this forge-train "
                                "supports ({})",
                                path, version, kCheckpointVersion));
    state.step = meta.at("step").get<int64_t>();
    state.epoch = meta.at("epoch").get<uint64_t>();
    state.index = meta.at("index").get<int64_t>();
    state.seed = meta.at("seed").get<uint64_t>();
    state.shuffle = meta.at("shuffle").get<bool>();
    state.trainSamples = meta.at("train_samples").get<int64_t>();
    state.samplesPerStep = meta.at("samples_per_step").get<int64_t>();
    sourceHash = meta.at("source_hash").get<std::string>();
    fingerprint = meta.at("fingerprint").get<std::string>();
    if (meta.contains("training_options")) { // checkpoints before 2026-12-01 lack them
      nlohmann::json now = trainingOptions(p);
      for (const auto &[key, value] : meta.at("training_options").items())
        if (now.contains(key) && now[key] != value)
          state.changedOptions.push_back(fmt::format("{}: checkpoint '{}', bundle '{}'", key,
                                                     value.get<std::string>(),
                                                     now[key].get<std::string>()));
    }
    for (const auto &t : meta.at("tensors"))
      entries.push_back({t.at("name").get<std::string>(), t.at("kind").get<std::string>(),
                         t.at("dtype").get<std::string>(),
                         t.at("shape").get<std::vector<int64_t>>(), t.at("crc32").get<uint32_t>()});
  } catch (const std::exception &e) {
    return fail(kind, Status::error("{}: malformed checkpoint metadata: {}", path, e.what()));
  }
  if (state.step < 0 || state.index < 0 || state.samplesPerStep < 0 || state.trainSamples < 0)
    return fail(kind, Status::error("{}: negative step or data position in the metadata", path));

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
    std::vector<int64_t> shape(info.shape().begin(), info.shape().end());
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

  // Every tensor present, the right size, and its own CRC.
  std::vector<std::pair<int32_t, const HostTensor *>> values;
  for (int32_t t : checkpointed(ex)) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
    const Entry &e = *byName.at(memberName(info));
    auto m = npz->find(memberName(info));
    if (m == npz->end())
      return fail(kind, Status::error("{}: member '{}' is missing", path, memberName(info)));
    const HostTensor &v = m->second;
    if (v.bytes.size() != wholeBytes(info) || dtypeSize(v.dtype) != dtypeSize(info.dtype()))
      return fail(kind, Status::error("{}: member '{}' holds {} {}, expected {}", path,
                                      memberName(info), dtypeName(v.dtype), shapeString(v.shape),
                                      describe(e.dtype, e.shape)));
    uint32_t crc = crc32Of(v.bytes.data(), v.bytes.size());
    if (crc != e.crc)
      return fail(kind, Status::error("{}: member '{}': CRC32 mismatch (metadata {:#010x}, data "
                                      "{:#010x}); the checkpoint is corrupted",
                                      path, memberName(info), e.crc, crc));
    values.emplace_back(t, &v);
  }
  for (const auto &[t, v] : values) {
    const bundle::TensorInfo &info = ex.tensorInfo(t);
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
  std::string name = fmt::format("ckpt-{}.forgeckpt", state.step);
  std::error_code ec;
  for (int n = 1; fs::exists(fs::path(dir_) / name, ec) || ec; ++n) {
    if (n > 1000000)
      return Status::error("{}: no free checkpoint name for step {}", dir_, state.step);
    name = fmt::format("ckpt-{}.{}.forgeckpt", state.step, n);
  }
  std::string path = (fs::path(dir_) / name).string();
  FORGE_RETURN_IF_ERROR(writeCheckpoint(path, ex, state, whole));
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
