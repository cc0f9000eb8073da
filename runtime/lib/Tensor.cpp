// Element-type tables and shape helpers (Tensor.h).
//
// Invariants: dtypeSize/dtypeName accept any integer value of DType (a
// fuzzed bundle may carry unknown enum values) and answer 0 / "invalid"
// rather than indexing out of range. numElements is overflow-safe: it returns
// -1 for a negative dimension or a product that does not fit in int64_t, so
// callers that validated shapes (the bundle loader) never see -1.
#include "forge/runtime/Tensor.h"

#include "cpu/KernelUtil.h"

#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace forge::rt {

namespace {
struct DTypeEntry {
  DType type;
  size_t size;
  std::string_view name;
};

constexpr DTypeEntry kDTypes[] = {
    {bundle::F32, 4, "f32"},       {bundle::F16, 2, "f16"},       {bundle::BF16, 2, "bf16"},
    {bundle::F64, 8, "f64"},       {bundle::I64, 8, "i64"},       {bundle::I32, 4, "i32"},
    {bundle::I8, 1, "i8"},         {bundle::U8, 1, "u8"},         {bundle::BOOL, 1, "bool"},
    {bundle::F8E4M3, 1, "f8e4m3"}, {bundle::F8E5M2, 1, "f8e5m2"}, {bundle::I16, 2, "i16"},
    {bundle::U16, 2, "u16"},       {bundle::U32, 4, "u32"},       {bundle::U64, 8, "u64"},
    {bundle::F8E4M3FNUZ, 1, "f8e4m3fnuz"}, {bundle::F8E5M2FNUZ, 1, "f8e5m2fnuz"},
};

const DTypeEntry *findEntry(DType t) {
  for (const DTypeEntry &e : kDTypes)
    if (e.type == t)
      return &e;
  return nullptr;
}
} // namespace

size_t dtypeSize(DType t) {
  const DTypeEntry *e = findEntry(t);
  return e ? e->size : 0;
}

std::string_view dtypeName(DType t) {
  if (t == bundle::DTYPE_UNSPECIFIED)
    return "unspecified";
  const DTypeEntry *e = findEntry(t);
  return e ? e->name : std::string_view("invalid");
}

bool isFloatType(DType t) {
  switch (t) {
  case bundle::F32:
  case bundle::F16:
  case bundle::BF16:
  case bundle::F64:
  case bundle::F8E4M3:
  case bundle::F8E5M2:
  case bundle::F8E4M3FNUZ:
  case bundle::F8E5M2FNUZ:
    return true;
  default:
    return false;
  }
}

int64_t numElements(const std::vector<int64_t> &shape) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0)
      return -1;
    empty |= d == 0;
  }
  // A zero dimension makes the tensor empty whatever the other dims are.
  if (empty)
    return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (n > std::numeric_limits<int64_t>::max() / d)
      return -1;
    n *= d;
  }
  return n;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

void narrowFloatsInto(const uint8_t *f32, size_t bytes, DType to, uint8_t *out) {
  if (to == bundle::F32) {
    std::memcpy(out, f32, bytes);
    return;
  }
  // Element by element through memcpy: the source may be unaligned (an .npz
  // member mapped in place), and so may the destination.
  const size_t n = bytes / sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, f32 + i * sizeof(float), sizeof(float));
    uint16_t y = to == bundle::BF16 ? cpu::floatToBf16(x) : cpu::floatToHalf(x);
    std::memcpy(out + i * 2, &y, 2);
  }
}

std::vector<uint8_t> narrowFloats(const uint8_t *f32, size_t bytes, DType to) {
  std::vector<uint8_t> out(to == bundle::F32 ? bytes : bytes / sizeof(float) * 2);
  narrowFloatsInto(f32, bytes, to, out.data());
  return out;
}

std::vector<uint8_t> transposeBytes(std::span<const uint8_t> x, const std::vector<int64_t> &shape,
                                    std::span<const int64_t> perm, size_t elemSize) {
  const size_t rank = shape.size();
  std::vector<uint8_t> out(x.size());
  if (x.empty() || rank == 0)
    return std::vector<uint8_t>(x.begin(), x.end());
  // Strides of x, taken in the output's dim order; walk the output row-major.
  std::vector<int64_t> inStride(rank, 1), outShape(rank), step(rank);
  for (size_t d = rank - 1; d > 0; --d)
    inStride[d - 1] = inStride[d] * shape[d];
  for (size_t d = 0; d < rank; ++d) {
    outShape[d] = shape[static_cast<size_t>(perm[d])];
    step[d] = inStride[static_cast<size_t>(perm[d])];
  }
  std::vector<int64_t> idx(rank, 0);
  int64_t src = 0;
  const size_t n = x.size() / elemSize;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + i * elemSize, x.data() + static_cast<size_t>(src) * elemSize,
                elemSize);
    for (size_t d = rank; d-- > 0;) { // the next output index, odometer style
      src += step[d];
      if (++idx[d] < outShape[d])
        break;
      src -= step[d] * outShape[d];
      idx[d] = 0;
    }
  }
  return out;
}

} // namespace forge::rt
