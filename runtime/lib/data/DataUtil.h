// Private helpers of the data loaders: integer element access by dtype and
// the label-range check shared by array and token sources.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "forge/runtime/DataSource.h"

namespace forge::rt::data {

inline bool isIntegerType(DType t) {
  switch (t) {
  case bundle::I8:
  case bundle::U8:
  case bundle::I16:
  case bundle::U16:
  case bundle::I32:
  case bundle::U32:
  case bundle::I64:
  case bundle::U64:
  case bundle::BOOL:
    return true;
  default:
    return false;
  }
}

/// The integer at `p` (dtype `t`, an integer type); nullopt for a u64 value
/// that does not fit int64.
inline std::optional<int64_t> loadInt(const uint8_t *p, DType t) {
  switch (t) {
  case bundle::I8: {
    int8_t v;
    std::memcpy(&v, p, 1);
    return v;
  }
  case bundle::U8:
  case bundle::BOOL:
    return *p;
  case bundle::I16: {
    int16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  case bundle::U16: {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  case bundle::I32: {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  case bundle::U32: {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  case bundle::I64: {
    int64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  case bundle::U64: {
    uint64_t v;
    std::memcpy(&v, p, 8);
    if (v > static_cast<uint64_t>(INT64_MAX))
      return std::nullopt;
    return static_cast<int64_t>(v);
  }
  default:
    return std::nullopt;
  }
}

/// Stores `v` at `p` as dtype `t` (an integer type; the caller checked the range).
inline void storeInt(uint8_t *p, DType t, int64_t v) {
  switch (t) {
  case bundle::I8:
  case bundle::U8:
  case bundle::BOOL: {
    uint8_t x = static_cast<uint8_t>(v);
    std::memcpy(p, &x, 1);
    break;
  }
  case bundle::I16:
  case bundle::U16: {
    uint16_t x = static_cast<uint16_t>(v);
    std::memcpy(p, &x, 2);
    break;
  }
  case bundle::I32:
  case bundle::U32: {
    uint32_t x = static_cast<uint32_t>(v);
    std::memcpy(p, &x, 4);
    break;
  }
  default: {
    std::memcpy(p, &v, 8);
    break;
  }
  }
}

/// Largest value dtype `t` holds (integer types).
inline int64_t maxOfIntType(DType t) {
  switch (t) {
  case bundle::I8:
    return INT8_MAX;
  case bundle::U8:
  case bundle::BOOL:
    return UINT8_MAX;
  case bundle::I16:
    return INT16_MAX;
  case bundle::U16:
    return UINT16_MAX;
  case bundle::I32:
    return INT32_MAX;
  case bundle::U32:
    return UINT32_MAX;
  default:
    return INT64_MAX;
  }
}

/// "[B, 3, 4]"-style shape of a batch of `field` (B spelled out).
inline std::string batchShape(const DataField &f) {
  std::string s = "[B";
  for (int64_t d : f.sampleShape)
    s += ", " + std::to_string(d);
  return s + "]";
}

/// Whether `v` is a valid label value for `f`.
inline bool labelOk(const DataField &f, int64_t v) {
  if (f.ignoreValue && v == *f.ignoreValue)
    return true;
  return v >= 0 && v < f.numClasses;
}

} // namespace forge::rt::data
