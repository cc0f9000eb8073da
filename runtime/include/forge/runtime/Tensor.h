// Element types and non-owning dense tensor views (row-major, contiguous).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "program.pb.h"

namespace forge::rt {

using DType = bundle::DType;

/// Bytes per element; 0 for DTYPE_UNSPECIFIED.
size_t dtypeSize(DType t);
/// Short name: "f32", "i64", "bool", ...
std::string_view dtypeName(DType t);
bool isFloatType(DType t);

/// f32 bytes (a whole number of floats) in `to`: bf16 or f16 rounded to
/// nearest even, or f32 unchanged. Parameters' low-precision copies and
/// data narrowed for a bf16/f16 input.
std::vector<uint8_t> narrowFloats(const uint8_t *f32, size_t bytes, DType to);
/// The same into `out` (bytes / 4 * 2 bytes, or `bytes` for f32); neither
/// pointer needs any alignment.
void narrowFloatsInto(const uint8_t *f32, size_t bytes, DType to, uint8_t *out);

int64_t numElements(const std::vector<int64_t> &shape);
std::string shapeString(const std::vector<int64_t> &shape);

/// transpose(x, perm) of a row-major tensor x of `shape` with `elemSize`-byte
/// elements: out has shape [shape[perm[0]], ...] and out[i] = x[i permuted back].
std::vector<uint8_t> transposeBytes(std::span<const uint8_t> x, const std::vector<int64_t> &shape,
                                    std::span<const int64_t> perm, size_t elemSize);

struct TensorView {
  void *data = nullptr;
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;

  int64_t numel() const { return numElements(shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool present() const { return dtype != bundle::DTYPE_UNSPECIFIED; }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

} // namespace forge::rt
