// Raw token shards as a data source (DataSource.h): GPT-style next-token
// batches.
//
// A shard is a file of little-endian uint16 or uint32 token ids (optionally
// with llm.c's 1024-byte header: int32 magic 20240520, version 1, token count).
// With sequence length T (the token input's [B, T]), sample i of a shard is
// the window at token o = i*T: the token input gets tokens[o, o+T) and the
// label input tokens[o+1, o+T+1); a shard of n tokens has (n-1)/T windows
// ((n)/T without a label input). Samples of several shards are numbered
// shard after shard; no window crosses a shard boundary.
//
// Invariants: shards are mmap'd read-only and never copied whole; bind()
// checks the bundle has exactly one integer token input [B, T] and optionally
// a label input [B, T]; fill() checks every label against the class count and
// names file and token offset on failure.
#include <algorithm>
#include <cerrno>
#include <cstring>


#include <fmt/ranges.h>

#include "DataUtil.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/FileUtil.h"

namespace forge::rt {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * 4;

struct Shard {
  std::string origin;
  const uint8_t *tokens = nullptr;
  int64_t count = 0;
  size_t width = 2;
  std::shared_ptr<const MappedFile> file; // the shard's mapping
  std::vector<uint32_t> owned;             // in-memory shards (tests)

  Shard() = default;
  Shard(const Shard &) = delete;
  Shard &operator=(const Shard &) = delete;
  uint32_t at(int64_t i) const {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, tokens + static_cast<size_t>(i) * 2, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, tokens + static_cast<size_t>(i) * 4, 4);
    return v;
  }
};

Expected<std::unique_ptr<Shard>> openShard(const std::string &path, TokenDType dtype) {
  auto shard = std::make_unique<Shard>();
  shard->origin = path;
  shard->width = dtype == TokenDType::U16 ? 2 : 4;
  const char *typeName = dtype == TokenDType::U16 ? "uint16" : "uint32";
  auto file = MappedFile::open(path);
  if (!file)
    return file.status();
  shard->file = *file;
  const size_t size = shard->file->bytes().size();
  const uint8_t *bytes = shard->file->bytes().data();
  size_t offset = 0;
  if (size >= kLlmcHeaderBytes) {
    int32_t header[3];
    std::memcpy(header, bytes, sizeof(header));
    if (header[0] == kLlmcMagic && header[1] == 1 && header[2] >= 0 &&
        size == kLlmcHeaderBytes + static_cast<size_t>(header[2]) * 2) {
      if (dtype != TokenDType::U16)
        return Status::error("{}: an llm.c shard (magic {}) holds uint16 tokens; use "
                             "--token-dtype uint16",
                             path, kLlmcMagic);
      offset = kLlmcHeaderBytes;
    }
  }
  if ((size - offset) % shard->width != 0)
    return Status::error("{}: {} bytes is not a whole number of {} tokens ({} bytes each); "
                         "check --token-dtype",
                         path, size - offset, typeName, shard->width);
  shard->tokens = bytes ? bytes + offset : nullptr;
  shard->count = static_cast<int64_t>((size - offset) / shard->width);
  return shard;
}

class TokenSource final : public DataSource {
public:
  explicit TokenSource(std::vector<std::unique_ptr<Shard>> shards) : shards_(std::move(shards)) {}

  Status bind(const std::vector<DataField> &fields) override {
    tokenField_ = labelField_ = -1;
    fields_ = fields;
    auto describeFields = [&] {
      std::vector<std::string> list;
      for (const DataField &f : fields)
        list.push_back(fmt::format("{} {}{}", f.name, dtypeName(f.dtype), data::batchShape(f)));
      return fmt::format("{}", fmt::join(list, ", "));
    };
    for (size_t i = 0; i < fields.size(); ++i) {
      int &slot = fields[i].isLabel ? labelField_ : tokenField_;
      if (slot >= 0)
        return Status::error("{}: token shards feed one token input [B, T] (and the label input); "
                             "the bundle's data inputs are {}",
                             describe(), describeFields());
      slot = static_cast<int>(i);
    }
    if (tokenField_ < 0)
      return Status::error("{}: token shards need an integer token input [B, T]; the bundle's data "
                           "inputs are {}",
                           describe(), describeFields());
    for (int i : {tokenField_, labelField_}) {
      if (i < 0)
        continue;
      const DataField &f = fields[i];
      if (!data::isIntegerType(f.dtype) || f.sampleShape.size() != 1)
        return Status::error("{}: token shards feed integer [B, T] inputs; the bundle input '{}' is "
                             "{} {}",
                             describe(), f.name, dtypeName(f.dtype), data::batchShape(f));
    }
    seqLen_ = fields[tokenField_].sampleShape[0];
    if (labelField_ >= 0 && fields[labelField_].sampleShape[0] != seqLen_)
      return Status::error("{}: the token input '{}' has T = {} but the label input '{}' has T = {}",
                           describe(), fields[tokenField_].name, seqLen_, fields[labelField_].name,
                           fields[labelField_].sampleShape[0]);
    if (seqLen_ <= 0)
      return Status::error("{}: the token input '{}' has sequence length {}", describe(),
                           fields[tokenField_].name, seqLen_);
    firstSample_.assign(1, 0);
    for (const auto &s : shards_) {
      int64_t usable = labelField_ >= 0 ? std::max<int64_t>(0, s->count - 1) : s->count;
      firstSample_.push_back(firstSample_.back() + usable / seqLen_);
    }
    return Status::ok();
  }

  int64_t numSamples() const override { return firstSample_.empty() ? 0 : firstSample_.back(); }
  /// fill() only reads the mapped shards: data workers may split a batch.
  bool concurrentFill() const override { return true; }

  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    if (outs.size() != fields_.size())
      return Status::error("{}: fill with {} buffers, {} fields bound", describe(), outs.size(),
                           fields_.size());
    const DataField &tf = fields_[tokenField_];
    const size_t tw = dtypeSize(tf.dtype);
    const int64_t tmax = data::maxOfIntType(tf.dtype);
    uint8_t *tokOut = static_cast<uint8_t *>(outs[tokenField_]);
    uint8_t *labOut = labelField_ >= 0 ? static_cast<uint8_t *>(outs[labelField_]) : nullptr;
    const DataField *lf = labelField_ >= 0 ? &fields_[labelField_] : nullptr;
    const size_t lw = lf ? dtypeSize(lf->dtype) : 0;
    const int64_t lmax = lf ? data::maxOfIntType(lf->dtype) : 0;
    for (size_t i = 0; i < indices.size(); ++i) {
      int64_t idx = indices[i];
      if (idx < 0 || idx >= numSamples())
        return Status::error("{}: sample index {} out of range [0, {})", describe(), idx,
                             numSamples());
      size_t s = static_cast<size_t>(
          std::upper_bound(firstSample_.begin(), firstSample_.end(), idx) - firstSample_.begin() -
          1);
      const Shard &shard = *shards_[s];
      const int64_t o = (idx - firstSample_[s]) * seqLen_;
      for (int64_t t = 0; t < seqLen_; ++t) {
        int64_t v = shard.at(o + t);
        if (v > tmax)
          return Status::error("{}: token {} at offset {} does not fit the input '{}' ({})",
                               shard.origin, v, o + t, tf.name, dtypeName(tf.dtype));
        data::storeInt(tokOut + (i * seqLen_ + t) * tw, tf.dtype, v);
        if (lf) {
          int64_t l = shard.at(o + t + 1);
          if ((lf->numClasses > 0 && !data::labelOk(*lf, l)) || l > lmax)
            return Status::error("{}: token {} at offset {} (a label of '{}') is outside [0, {}) "
                                 "(the model has {} classes)",
                                 shard.origin, l, o + t + 1, lf->name,
                                 lf->numClasses > 0 ? lf->numClasses : lmax + 1,
                                 lf->numClasses > 0 ? lf->numClasses : lmax + 1);
          data::storeInt(labOut + (i * seqLen_ + t) * lw, lf->dtype, l);
        }
      }
    }
    return Status::ok();
  }

  std::string describe() const override {
    std::vector<std::string> names;
    for (const auto &s : shards_)
      names.push_back(s->origin);
    return fmt::format("{}", fmt::join(names, ", "));
  }

private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<DataField> fields_;
  std::vector<int64_t> firstSample_;
  int tokenField_ = -1, labelField_ = -1;
  int64_t seqLen_ = 0;
};

} // namespace

Expected<std::unique_ptr<DataSource>> openTokenShards(const std::vector<std::string> &paths,
                                                      TokenDType dtype) {
  std::vector<std::unique_ptr<Shard>> shards;
  for (const std::string &p : paths) {
    auto s = openShard(p, dtype);
    if (!s)
      return s.status();
    shards.push_back(s.take());
  }
  return std::unique_ptr<DataSource>(std::make_unique<TokenSource>(std::move(shards)));
}

std::unique_ptr<DataSource> makeTokenSource(std::vector<uint32_t> tokens, std::string origin) {
  auto shard = std::make_unique<Shard>();
  shard->origin = std::move(origin);
  shard->owned = std::move(tokens);
  shard->width = 4;
  shard->tokens = reinterpret_cast<const uint8_t *>(shard->owned.data());
  shard->count = static_cast<int64_t>(shard->owned.size());
  std::vector<std::unique_ptr<Shard>> shards;
  shards.push_back(std::move(shard));
  return std::make_unique<TokenSource>(std::move(shards));
}

} // namespace forge::rt
