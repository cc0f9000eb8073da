// Crash-safe file writing (FileUtil.h).
#include "forge/runtime/FileUtil.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace forge::rt {

Expected<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string &path) {
  // O_NONBLOCK: opening a FIFO (or other special file) must not wait for a
  // writer; it is refused as not a regular file below. No effect on regular files.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error("{}: not a regular file", path);
  }
  std::shared_ptr<MappedFile> map(new MappedFile());
  if (st.st_size > 0) {
    void *p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Status::error("{}: cannot map {} bytes: {}", path, st.st_size, std::strerror(e));
    }
    map->base_ = p;
    map->size_ = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(map));
}

MappedFile::~MappedFile() {
  if (base_)
    ::munmap(base_, size_);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp.XXXXXX") {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status AtomicFileWriter::open() {
  fd_ = ::mkstemp(tmp_.data());
  if (fd_ < 0)
    return Status::error("{}: cannot create temporary file: {}", path_, std::strerror(errno));
  return Status::ok();
}

Status AtomicFileWriter::write(const void *data, size_t n) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return Status::error("{}: write failed: {}", path_, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
    offset_ += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0)
    return Status::error("{}: sync failed: {}", path_, std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    Status s = Status::error("{}: close failed: {}", path_, std::strerror(errno));
    ::unlink(tmp_.c_str());
    return s;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    Status s = Status::error("{}: rename from {} failed: {}", path_, tmp_, std::strerror(errno));
    ::unlink(tmp_.c_str());
    return s;
  }
  return syncDirectoryOf(path_);
}

Status writeFileAtomically(const std::string &path, std::span<const uint8_t> bytes) {
  AtomicFileWriter f(path);
  FORGE_RETURN_IF_ERROR(f.open());
  FORGE_RETURN_IF_ERROR(f.write(bytes));
  return f.commit();
}

Status syncDirectoryOf(const std::string &path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty())
    dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::error("{}: cannot open directory to sync it: {}", dir.string(),
                         std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) // some file systems cannot sync directories
    return Status::error("{}: directory fsync failed: {}", dir.string(), std::strerror(err));
  return Status::ok();
}

} // namespace forge::rt
