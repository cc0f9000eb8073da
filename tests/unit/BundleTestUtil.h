// Pieces of hand-built bundles shared by the runtime's unit tests (no
// compiler): f32 tensors of a program and the bytes of f32 constants.
#pragma once

#include "forge/runtime/Bundle.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace forge::rt::testing {

/// Appends an f32 tensor (`shape`, at `arenaOffset`) to `p`; returns its index.
inline int32_t addTensor(bundle::Program &p, std::string name, bundle::TensorInfo::Kind kind,
                         std::vector<int64_t> shape, int64_t arenaOffset = 0) {
  bundle::TensorInfo *t = p.add_tensors();
  t->set_name(std::move(name));
  t->set_dtype(bundle::F32);
  t->set_kind(kind);
  for (int64_t d : shape)
    t->add_shape(d);
  t->set_arena_offset(arenaOffset);
  return p.tensors_size() - 1;
}

/// The bytes of `v` (a constant's section data).
inline std::vector<uint8_t> floatBytes(const std::vector<float> &v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

} // namespace forge::rt::testing
