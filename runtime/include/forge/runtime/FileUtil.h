// Crash-safe file writing shared by bundles, .npy/.npz, checkpoints and ONNX
// export.
//
// Invariants: the data goes to a temporary file next to the target (so the
// rename stays on one file system), which is written, fchmod'ed to 0644,
// fsync'ed and renamed over `path`; then the directory is fsync'ed so the
// rename itself is durable. On any failure the temporary is removed and
// `path` is left as it was. Messages start with the target path.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "forge/runtime/Status.h"

namespace forge::rt {

/// Writes a file in pieces, then moves it into place with commit(). A writer
/// destroyed without a successful commit() removes its temporary file.
class AtomicFileWriter {
public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter &) = delete;
  AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;

  /// Creates the temporary file; call once, before write().
  Status open();
  Status write(const void *data, size_t n);
  Status write(std::span<const uint8_t> bytes) { return write(bytes.data(), bytes.size()); }
  /// Bytes written so far.
  uint64_t offset() const { return offset_; }
  /// fsync, rename over the target, fsync the directory.
  Status commit();

private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t offset_ = 0;
};

/// Writes `bytes` to `path` atomically and durably (see above).
Status writeFileAtomically(const std::string &path, std::span<const uint8_t> bytes);
inline Status writeFileAtomically(const std::string &path, std::string_view text) {
  return writeFileAtomically(path, {reinterpret_cast<const uint8_t *>(text.data()), text.size()});
}

/// A regular file mapped read-only (never copied whole: pages are read as
/// they are touched); unmapped when the last reference goes.
class MappedFile {
public:
  /// Refuses what is not a regular file (a FIFO is not waited on), naming
  /// `path`. An empty file maps to no bytes.
  static Expected<std::shared_ptr<const MappedFile>> open(const std::string &path);
  ~MappedFile();
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t *>(base_), size_};
  }

private:
  MappedFile() = default;
  void *base_ = nullptr;
  size_t size_ = 0;
};

/// fsync of the directory holding `path`, so a rename in it is durable.
/// File systems that cannot sync directories (EINVAL) are not an error.
Status syncDirectoryOf(const std::string &path);

} // namespace forge::rt
