// NumPy .npy / .npz reading and writing (version 1.0-3.0 headers, little-endian,
// C order; .npz members stored or deflated).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

/// An owning host tensor.
struct HostTensor {
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  TensorView view() { return TensorView{bytes.data(), dtype, shape}; }
};

Expected<HostTensor> readNpy(const std::string &path);
Expected<HostTensor> parseNpy(const std::vector<uint8_t> &bytes, const std::string &origin);
Status writeNpy(const std::string &path, const TensorView &tensor);
std::vector<uint8_t> encodeNpy(const TensorView &tensor);

/// All arrays of an .npz archive, by name (without the ".npy" suffix).
Expected<std::map<std::string, HostTensor>> readNpz(const std::string &path);
/// The same on a file's bytes (`origin` names it in messages; the fuzzer).
Expected<std::map<std::string, HostTensor>> parseNpz(const std::vector<uint8_t> &file,
                                                     const std::string &origin);
/// An array read in place: a .npy file, or an .npz member stored without
/// compression, mapped read-only from its file (pages are read as samples
/// are first touched, and the kernel may drop them again: datasets larger
/// than memory); a compressed member inflated into memory. `data` stays
/// valid while `owner` lives. The same checks as readNpy/readNpz (header,
/// sizes, the member's CRC32: a stored member is read once for it).
struct MappedArray {
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  const uint8_t *data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<const void> owner;
};
Expected<MappedArray> mapNpy(const std::string &path);
Expected<std::map<std::string, MappedArray>> mapNpz(const std::string &path);

/// Writes an uncompressed .npz archive.
Status writeNpz(const std::string &path, const std::map<std::string, TensorView> &arrays);

} // namespace forge::rt
