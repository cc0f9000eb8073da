// Arrays as a data source (.npz archives, NAME=FILE.npy), and openDataSource
// (DataSource.h).
//
// Invariants:
//  * Arrays are held in memory, first dim = sample; bind() checks, per bound
//    field, presence, exact dtype, per-sample shape, a common sample count and
//    (for class labels) every value, and reports all missing arrays at once.
//    Every message names the file and the array.
//  * fill() is a memcpy per sample and field; it cannot fail after bind().
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/ranges.h>

#include "DataUtil.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/Npy.h"

namespace forge::rt {

namespace {

using data::batchShape;

class ArraySource final : public DataSource {
public:
  struct Array {
    std::string name;
    MappedArray tensor; // mapped from its file, or owning its bytes
    std::string origin;
  };

  explicit ArraySource(std::vector<Array> arrays) : arrays_(std::move(arrays)) {}

  Status bind(const std::vector<DataField> &fields) override {
    bound_.clear();
    numSamples_ = 0;
    std::vector<std::string> missing;
    for (const DataField &f : fields)
      if (!find(f.name))
        missing.push_back(fmt::format("'{}' ({}{})", f.name, dtypeName(f.dtype), batchShape(f)));
    if (!missing.empty()) {
      std::vector<std::string> have;
      for (const Array &a : arrays_)
        have.push_back(fmt::format("'{}'", a.name));
      return Status::error("{}: no array for the bundle input{} {} (the data has {})", describe(),
                           missing.size() > 1 ? "s" : "", fmt::join(missing, ", "),
                           have.empty() ? "no arrays" : fmt::format("{}", fmt::join(have, ", ")));
    }
    const Array *first = nullptr;
    for (const DataField &f : fields) {
      const Array &a = *find(f.name);
      const MappedArray &t = a.tensor;
      std::string where = fmt::format("{}: array '{}'", a.origin, a.name);
      if (t.shape.empty())
        return Status::error("{} is a scalar; expected {} {} (one sample per row)", where,
                             dtypeName(f.dtype), batchShape(f));
      // f32 data for a bf16/f16 input (forgec --precision stores a GEMM's data
      // input low): converted sample by sample in fill(), rounded to nearest even.
      bool narrows = t.dtype == bundle::F32 && (f.dtype == bundle::BF16 || f.dtype == bundle::F16);
      if (t.dtype != f.dtype && !narrows)
        return Status::error("{} has dtype {}, the bundle input '{}' needs {} {} (no implicit "
                             "conversion; e.g. numpy .astype)",
                             where, dtypeName(t.dtype), f.name, dtypeName(f.dtype), batchShape(f));
      if (!std::equal(t.shape.begin() + 1, t.shape.end(), f.sampleShape.begin(),
                      f.sampleShape.end()))
        return Status::error("{} has shape {}, the bundle input '{}' needs {} (per sample {})",
                             where, shapeString(t.shape), f.name, batchShape(f),
                             shapeString(f.sampleShape));
      if (!first) {
        first = &a;
        numSamples_ = t.shape[0];
      } else if (t.shape[0] != numSamples_) {
        return Status::error("arrays disagree on the number of samples: '{}' ({}) has {}, '{}' "
                             "({}) has {}",
                             first->name, first->origin, numSamples_, a.name, a.origin,
                             t.shape[0]);
      }
      if (f.numClasses > 0 && data::isIntegerType(t.dtype))
        FORGE_RETURN_IF_ERROR(checkLabels(a, f));
      size_t sampleBytes = static_cast<size_t>(numElements(f.sampleShape)) * dtypeSize(f.dtype);
      // Narrowed per sample as fill() copies it (the array stays mapped, not
      // converted whole in memory).
      bound_.push_back({&a, sampleBytes, narrows ? f.dtype : bundle::DTYPE_UNSPECIFIED});
    }
    return Status::ok();
  }

  int64_t numSamples() const override { return numSamples_; }

  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    if (outs.size() != bound_.size())
      return Status::error("{}: fill with {} buffers, {} fields bound", describe(), outs.size(),
                           bound_.size());
    for (size_t f = 0; f < bound_.size(); ++f) {
      const Bound &b = bound_[f];
      const uint8_t *src = b.array->tensor.data;
      // Bytes of one sample in the array (f32 where the input narrows it).
      const size_t srcBytes = b.narrowTo != bundle::DTYPE_UNSPECIFIED ? b.sampleBytes * 2
                                                                       : b.sampleBytes;
      uint8_t *dst = static_cast<uint8_t *>(outs[f]);
      for (size_t i = 0; i < indices.size(); ++i) {
        int64_t idx = indices[i];
        if (idx < 0 || idx >= numSamples_)
          return Status::error("{}: sample index {} out of range [0, {})", describe(), idx,
                               numSamples_);
        if (!b.sampleBytes)
          continue;
        const uint8_t *from = src + static_cast<size_t>(idx) * srcBytes;
        if (b.narrowTo != bundle::DTYPE_UNSPECIFIED)
          narrowFloatsInto(from, srcBytes, b.narrowTo, dst + i * b.sampleBytes);
        else
          std::memcpy(dst + i * b.sampleBytes, from, b.sampleBytes);
      }
    }
    return Status::ok();
  }

  // fill() only reads the arrays, which bind() left unchanged.
  bool concurrentFill() const override { return true; }

  std::string describe() const override {
    std::set<std::string> files;
    for (const Array &a : arrays_)
      files.insert(a.origin);
    return files.empty() ? "<no data>" : fmt::format("{}", fmt::join(files, ", "));
  }

  std::vector<std::string> unusedArrays() const override {
    std::vector<std::string> out;
    for (const Array &a : arrays_)
      if (std::none_of(bound_.begin(), bound_.end(), [&](const Bound &b) { return b.array == &a; }))
        out.push_back(fmt::format("'{}' ({})", a.name, a.origin));
    return out;
  }

private:
  struct Bound {
    const Array *array;
    size_t sampleBytes; // in the input's type
    DType narrowTo;     // bf16/f16 for f32 data of a low input, else DTYPE_UNSPECIFIED
  };

  const Array *find(const std::string &name) const {
    for (const Array &a : arrays_)
      if (a.name == name)
        return &a;
    return nullptr;
  }

  static Status checkLabels(const Array &a, const DataField &f) {
    const MappedArray &t = a.tensor;
    const size_t width = dtypeSize(t.dtype);
    const int64_t perSample = std::max<int64_t>(1, numElements(f.sampleShape));
    const int64_t n = numElements(t.shape);
    for (int64_t i = 0; i < n; ++i) {
      std::optional<int64_t> v = data::loadInt(t.data + static_cast<size_t>(i) * width,
                                               t.dtype);
      if (!v || !data::labelOk(f, *v)) {
        std::string value = v ? std::to_string(*v) : std::string("(over int64)");
        return Status::error("{}: array '{}': label {} at sample {}{} is outside [0, {}) (the "
                             "model has {} classes)",
                             a.origin, a.name, value, i / perSample,
                             perSample > 1 ? fmt::format(" (element {})", i % perSample) : "",
                             f.numClasses, f.numClasses);
      }
    }
    return Status::ok();
  }

  std::vector<Array> arrays_;
  std::vector<Bound> bound_;
  int64_t numSamples_ = 0;
};

bool endsWith(const std::string &s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string stem(const std::string &path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = base.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

} // namespace

// Defined in TokenSource.cpp.
Expected<std::unique_ptr<DataSource>> openTokenShards(const std::vector<std::string> &paths,
                                                      TokenDType dtype,
                                                      std::optional<int64_t> docSeparator);

/// A tensor in memory as an array that owns it.
static MappedArray own(HostTensor t) {
  auto owner = std::make_shared<HostTensor>(std::move(t));
  return {owner->dtype, owner->shape, owner->bytes.data(), owner->bytes.size(), owner};
}

std::unique_ptr<DataSource> makeArraySource(std::vector<std::pair<std::string, HostTensor>> arrays,
                                            std::vector<std::string> origins) {
  std::vector<ArraySource::Array> list;
  for (size_t i = 0; i < arrays.size(); ++i)
    list.push_back({std::move(arrays[i].first), own(std::move(arrays[i].second)),
                    i < origins.size() ? origins[i] : std::string("<memory>")});
  return std::make_unique<ArraySource>(std::move(list));
}

std::unique_ptr<DataSource> makeArrayViewSource(std::vector<std::pair<std::string, MappedArray>> arrays,
                                                const std::string &origin) {
  std::vector<ArraySource::Array> list;
  for (auto &[name, tensor] : arrays)
    list.push_back({std::move(name), std::move(tensor), origin});
  return std::make_unique<ArraySource>(std::move(list));
}

Expected<std::unique_ptr<DataSource>> openDataSource(const std::vector<std::string> &specs,
                                                     const DataSourceOptions &options) {
  if (specs.empty())
    return Status::error("no data given");
  std::vector<std::string> shards;
  std::vector<ArraySource::Array> arrays;
  std::map<std::string, std::string> seen; // array name -> file
  auto add = [&](std::string name, MappedArray t, const std::string &file) -> Status {
    auto [it, fresh] = seen.emplace(name, file);
    if (!fresh)
      return Status::error("array '{}' is given twice ({} and {})", name, it->second, file);
    arrays.push_back({std::move(name), std::move(t), file});
    return Status::ok();
  };
  std::error_code ec;
  const bool lmdbFile = endsWith(specs.front(), ".mdb");
  if (std::filesystem::is_directory(specs.front(), ec) || lmdbFile) {
    if (specs.size() != 1)
      return Status::error("an image folder or LMDB ({}) is the only data of a run; got {} specs",
                           specs.front(), specs.size());
    if (lmdbFile || std::filesystem::exists(specs.front() + "/data.mdb", ec))
      return openImageLmdb(specs.front(), options.image);
    return openImageFolder(specs.front(), options.image);
  }
  for (const std::string &spec : specs) {
    if (std::filesystem::is_directory(spec, ec))
      return Status::error("data '{}' is a folder (an image folder is the only data of a run)",
                           spec);
    size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
      if (name.empty() || file.empty() || !endsWith(file, ".npy"))
        return Status::error("data '{}': expected NAME=FILE.npy", spec);
      auto t = mapNpy(file);
      if (!t)
        return t.status();
      FORGE_RETURN_IF_ERROR(add(name, t.take(), file));
    } else if (endsWith(spec, ".npz")) {
      auto npz = mapNpz(spec);
      if (!npz)
        return npz.status();
      if (npz->empty())
        return Status::error("{}: the .npz file holds no arrays", spec);
      for (auto &[name, t] : *npz)
        FORGE_RETURN_IF_ERROR(add(name, std::move(t), spec));
    } else if (endsWith(spec, ".npy")) {
      auto t = mapNpy(spec);
      if (!t)
        return t.status();
      FORGE_RETURN_IF_ERROR(add(stem(spec), t.take(), spec));
    } else if (endsWith(spec, ".bin")) {
      shards.push_back(spec);
    } else {
      return Status::error("data '{}': expected FILE.npz, NAME=FILE.npy, FILE.bin (token "
                           "shard) or an image folder",
                           spec);
    }
  }
  if (!shards.empty() && !arrays.empty())
    return Status::error("token shards ({}) cannot be mixed with .npz/.npy arrays",
                         fmt::join(shards, ", "));
  if (!shards.empty())
    return openTokenShards(shards, options.tokenDType, options.docSeparator);
  if (options.docSeparator)
    return Status::error("--doc-separator splits token shards (FILE.bin) into documents; the "
                         "data is {}",
                         fmt::join(specs, ", "));
  return std::unique_ptr<DataSource>(std::make_unique<ArraySource>(std::move(arrays)));
}

} // namespace forge::rt
