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

/// "input_ids i64[B, 32], labels i64[B, 32]" (messages).
std::string fieldList(const std::vector<DataField> &fields) {
  std::vector<std::string> list;
  for (const DataField &f : fields)
    list.push_back(fmt::format("{} {}{}", f.name, dtypeName(f.dtype), data::batchShape(f)));
  return fmt::format("{}", fmt::join(list, ", "));
}

/// The shards' files, comma-separated (messages).
std::string shardList(const std::vector<std::unique_ptr<Shard>> &shards) {
  std::vector<std::string> names;
  for (const auto &s : shards)
    names.push_back(s->origin);
  return fmt::format("{}", fmt::join(names, ", "));
}

/// A token of `shard` at `offset` that input `f` cannot hold (its fill's error).
Status tokenTooLarge(const Shard &shard, int64_t v, int64_t offset, const DataField &f) {
  return Status::error("{}: token {} at offset {} does not fit the input '{}' ({})", shard.origin,
                       v, offset, f.name, dtypeName(f.dtype));
}

/// A label of `shard` at `offset` outside label input `f`'s classes (or its type's
/// range, max `lmax`, without a class count).
Status labelOutOfRange(const Shard &shard, int64_t l, int64_t offset, const DataField &f,
                       int64_t lmax) {
  const int64_t classes = f.numClasses > 0 ? f.numClasses : lmax + 1;
  return Status::error("{}: token {} at offset {} (a label of '{}') is outside [0, {}) (the model "
                       "has {} classes)",
                       shard.origin, l, offset, f.name, classes, classes);
}

class TokenSource final : public DataSource {
public:
  explicit TokenSource(std::vector<std::unique_ptr<Shard>> shards) : shards_(std::move(shards)) {}

  Status bind(const std::vector<DataField> &fields) override {
    tokenField_ = labelField_ = -1;
    fields_ = fields;
    auto describeFields = [&] { return fieldList(fields); };
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
          return tokenTooLarge(shard, v, o + t, tf);
        data::storeInt(tokOut + (i * seqLen_ + t) * tw, tf.dtype, v);
        if (lf) {
          int64_t l = shard.at(o + t + 1);
          if ((lf->numClasses > 0 && !data::labelOk(*lf, l)) || l > lmax)
            return labelOutOfRange(shard, l, o + t + 1, *lf, lmax);
          data::storeInt(labOut + (i * seqLen_ + t) * lw, lf->dtype, l);
        }
      }
    }
    return Status::ok();
  }

  std::string describe() const override { return shardList(shards_); }

private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<DataField> fields_;
  std::vector<int64_t> firstSample_;
  int tokenField_ = -1, labelField_ = -1;
  int64_t seqLen_ = 0;
};

/// Token shards as documents (DataSourceOptions::docSeparator). A document
/// ends after each separator token (the last one of a shard at its end); one
/// of n tokens gives n - 1 positions with a label (n without a label input),
/// cut into samples of at most T positions: sample k of a document at token a
/// reads tokens [a + kT, a + kT + len + 1). Samples are numbered shard after
/// shard, document after document. fillAt pads a sample's tokens with the
/// separator, its labels with the label field's ignored value (bind() requires
/// one: a loss compiled with ignore=N) and a mask input (a field whose name
/// holds "mask") with 0, 1 at real positions.
class DocumentSource final : public DataSource {
public:
  DocumentSource(std::vector<std::unique_ptr<Shard>> shards, int64_t separator)
      : shards_(std::move(shards)), separator_(separator) {}

  Status bind(const std::vector<DataField> &fields) override {
    tokenField_ = labelField_ = maskField_ = -1;
    fields_ = fields;
    auto describeFields = [&] { return fieldList(fields); };
    for (size_t i = 0; i < fields.size(); ++i) {
      int &slot = fields[i].isLabel                                  ? labelField_
                  : fields[i].name.find("mask") != std::string::npos ? maskField_
                                                                     : tokenField_;
      if (slot >= 0)
        return Status::error("{}: documents feed one token input [B, T], the label input and "
                             "optionally a mask input (a name with 'mask'); the bundle's data "
                             "inputs are {}",
                             describe(), describeFields());
      slot = static_cast<int>(i);
    }
    if (tokenField_ < 0)
      return Status::error("{}: documents need an integer token input [B, T]; the bundle's data "
                           "inputs are {}",
                           describe(), describeFields());
    for (int i : {tokenField_, labelField_, maskField_}) {
      if (i < 0)
        continue;
      const DataField &f = fields[i];
      const bool ok = i == maskField_ ? data::isIntegerType(f.dtype) || f.dtype == bundle::F32
                                      : data::isIntegerType(f.dtype);
      if (!ok || f.sampleShape.size() != 1)
        return Status::error("{}: documents feed integer [B, T] inputs (a mask also f32); the "
                             "bundle input '{}' is {} {}",
                             describe(), f.name, dtypeName(f.dtype), data::batchShape(f));
    }
    seqLen_ = fields[tokenField_].sampleShape[0];
    for (int i : {labelField_, maskField_})
      if (i >= 0 && fields[i].sampleShape[0] != seqLen_)
        return Status::error("{}: the token input '{}' has T = {} but '{}' has T = {}",
                             describe(), fields[tokenField_].name, seqLen_, fields[i].name,
                             fields[i].sampleShape[0]);
    if (seqLen_ <= 0)
      return Status::error("{}: the token input '{}' has sequence length {}", describe(),
                           fields[tokenField_].name, seqLen_);
    if (separator_ < 0 || separator_ > data::maxOfIntType(fields[tokenField_].dtype))
      return Status::error("{}: the document separator {} does not fit the token input '{}' ({})",
                           describe(), separator_, fields[tokenField_].name,
                           dtypeName(fields[tokenField_].dtype));
    if (labelField_ >= 0 && !fields[labelField_].ignoreValue)
      return Status::error("{}: documents are padded to their length bucket, and padding needs "
                           "a label without a loss term: compile with forgec --loss "
                           "cross_entropy:...,{},ignore=-100",
                           describe(), fields[labelField_].name);
    // The samples: documents split at separators, long ones cut into windows.
    samples_.clear();
    const int64_t extra = labelField_ >= 0 ? 1 : 0; // a label reads one token further
    for (size_t s = 0; s < shards_.size(); ++s) {
      const Shard &shard = *shards_[s];
      int64_t start = 0;
      for (int64_t t = 0; t < shard.count; ++t) {
        if (static_cast<int64_t>(shard.at(t)) != separator_ && t + 1 != shard.count)
          continue;
        const int64_t end = t + 1; // the document is [start, end)
        for (int64_t a = start; end - a - extra >= 1; a += seqLen_)
          samples_.push_back({static_cast<int32_t>(s), a,
                              static_cast<int32_t>(std::min(seqLen_, end - a - extra))});
        start = end;
      }
    }
    return Status::ok();
  }

  int64_t numSamples() const override { return static_cast<int64_t>(samples_.size()); }
  bool concurrentFill() const override { return true; }
  bool variableLength() const override { return true; }
  int64_t sampleLength(int64_t i) const override {
    return i >= 0 && i < numSamples() ? samples_[static_cast<size_t>(i)].length : 0;
  }

  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    return fillAt(indices, outs, seqLen_);
  }

  Status fillAt(std::span<const int64_t> indices, std::span<void *const> outs,
                int64_t length) override {
    if (outs.size() != fields_.size())
      return Status::error("{}: fill with {} buffers, {} fields bound", describe(), outs.size(),
                           fields_.size());
    if (length < 1 || length > seqLen_)
      return Status::error("{}: fill at length {}, outside [1, {}]", describe(), length, seqLen_);
    const DataField &tf = fields_[tokenField_];
    const size_t tw = dtypeSize(tf.dtype);
    const int64_t tmax = data::maxOfIntType(tf.dtype);
    uint8_t *tokOut = static_cast<uint8_t *>(outs[tokenField_]);
    const DataField *lf = labelField_ >= 0 ? &fields_[labelField_] : nullptr;
    uint8_t *labOut = lf ? static_cast<uint8_t *>(outs[labelField_]) : nullptr;
    const size_t lw = lf ? dtypeSize(lf->dtype) : 0;
    const int64_t lmax = lf ? data::maxOfIntType(lf->dtype) : 0;
    const DataField *mf = maskField_ >= 0 ? &fields_[maskField_] : nullptr;
    uint8_t *maskOut = mf ? static_cast<uint8_t *>(outs[maskField_]) : nullptr;
    const size_t mw = mf ? dtypeSize(mf->dtype) : 0;
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t idx = indices[i];
      if (idx < 0 || idx >= numSamples())
        return Status::error("{}: sample index {} out of range [0, {})", describe(), idx,
                             numSamples());
      const Sample &sm = samples_[static_cast<size_t>(idx)];
      if (sm.length > length)
        return Status::error("internal: {}: sample {} has {} positions, filled at {}",
                             describe(), idx, sm.length, length);
      const Shard &shard = *shards_[static_cast<size_t>(sm.shard)];
      for (int64_t t = 0; t < length; ++t) {
        const bool real = t < sm.length;
        const size_t at = static_cast<size_t>(static_cast<int64_t>(i) * length + t);
        int64_t v = real ? shard.at(sm.start + t) : separator_;
        if (v > tmax)
          return tokenTooLarge(shard, v, sm.start + t, tf);
        data::storeInt(tokOut + at * tw, tf.dtype, v);
        if (lf) {
          int64_t l = real ? static_cast<int64_t>(shard.at(sm.start + t + 1)) : *lf->ignoreValue;
          if (real && ((lf->numClasses > 0 && !data::labelOk(*lf, l)) || l > lmax))
            return labelOutOfRange(shard, l, sm.start + t + 1, *lf, lmax);
          data::storeInt(labOut + at * lw, lf->dtype, l);
        }
        if (mf) {
          if (mf->dtype == bundle::F32) {
            float one = real ? 1.0f : 0.0f;
            std::memcpy(maskOut + at * mw, &one, sizeof(one));
          } else {
            data::storeInt(maskOut + at * mw, mf->dtype, real ? 1 : 0);
          }
        }
      }
    }
    return Status::ok();
  }

  std::string describe() const override {
    return fmt::format("{} (documents ending at token {})", shardList(shards_), separator_);
  }

private:
  struct Sample {
    int32_t shard;
    int64_t start;
    int32_t length; // positions: 1..T
  };
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t separator_;
  std::vector<DataField> fields_;
  std::vector<Sample> samples_;
  int tokenField_ = -1, labelField_ = -1, maskField_ = -1;
  int64_t seqLen_ = 0;
};

std::unique_ptr<Shard> ownedShard(std::vector<uint32_t> tokens, std::string origin) {
  auto shard = std::make_unique<Shard>();
  shard->origin = std::move(origin);
  shard->owned = std::move(tokens);
  shard->width = 4;
  shard->tokens = reinterpret_cast<const uint8_t *>(shard->owned.data());
  shard->count = static_cast<int64_t>(shard->owned.size());
  return shard;
}

} // namespace

Expected<std::unique_ptr<DataSource>> openTokenShards(const std::vector<std::string> &paths,
                                                      TokenDType dtype,
                                                      std::optional<int64_t> docSeparator) {
  std::vector<std::unique_ptr<Shard>> shards;
  for (const std::string &p : paths) {
    auto s = openShard(p, dtype);
    if (!s)
      return s.status();
    shards.push_back(s.take());
  }
  if (docSeparator)
    return std::unique_ptr<DataSource>(
        std::make_unique<DocumentSource>(std::move(shards), *docSeparator));
  return std::unique_ptr<DataSource>(std::make_unique<TokenSource>(std::move(shards)));
}

std::unique_ptr<DataSource> makeTokenSource(std::vector<uint32_t> tokens, std::string origin) {
  std::vector<std::unique_ptr<Shard>> shards;
  shards.push_back(ownedShard(std::move(tokens), std::move(origin)));
  return std::make_unique<TokenSource>(std::move(shards));
}

std::unique_ptr<DataSource> makeDocumentSource(std::vector<uint32_t> tokens, int64_t separator,
                                               std::string origin) {
  std::vector<std::unique_ptr<Shard>> shards;
  shards.push_back(ownedShard(std::move(tokens), std::move(origin)));
  return std::make_unique<DocumentSource>(std::move(shards), separator);
}

} // namespace forge::rt
