// NumPy .npy / .npz reading and writing (version 1.0-3.0 headers, little-endian,
// C order; .npz members stored or deflated).
#pragma once

#include <map>
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
/// Writes an uncompressed .npz archive.
Status writeNpz(const std::string &path, const std::map<std::string, TensorView> &arrays);

} // namespace forge::rt
