// libFuzzer target for the bundle loader (../shared/DESIGN.md §8): any byte string must
// give either a valid Bundle or an error Status, never a crash, hang or leak.
//
// The program CRC would stop almost every mutation at the checksum, so each
// input is tried twice: as is, and with the header's program CRC recomputed,
// which lets mutated Program messages reach the protobuf parser and the
// semantic validation (tensors, sections, routines, instructions). When a bundle loads,
// CpuExecutor::create runs too (arena allocation, view table, kernel lookup).
// Also linked with a plain main() (FuzzDriverMain.cpp) for a ctest smoke run.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <zlib.h>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/CpuExecutor.h"

using namespace forge::rt;

namespace {
// Larger arenas are valid but only cost time (zero-filling) in a fuzz loop.
constexpr uint64_t kMaxFuzzArena = 1 << 20;

void tryLoad(std::vector<uint8_t> bytes) {
  auto bundle = Bundle::fromBytes(std::move(bytes), "<fuzz>");
  if (!bundle) {
    // The message must be well-formed; touching it catches dangling data.
    volatile size_t n = bundle.status().message().size();
    (void)n;
    return;
  }
  if ((*bundle)->program().arena_size() > kMaxFuzzArena)
    return;
  // Zero-initialized STATE tensors are not bounded by the file size either.
  uint64_t persistent = 0;
  for (const auto &t : (*bundle)->program().tensors()) {
    if (t.kind() != forge::bundle::TensorInfo::STATE &&
        t.kind() != forge::bundle::TensorInfo::PARAMETER)
      continue;
    // The loader checked that each tensor's byte count fits 64 bits.
    uint64_t bytes = static_cast<uint64_t>(numElements({t.shape().begin(), t.shape().end()})) *
                     dtypeSize(t.dtype());
    if (bytes > kMaxFuzzArena || (persistent += bytes) > kMaxFuzzArena)
      return;
  }
  auto ex = CpuExecutor::create(**bundle, CpuExecutorOptions{1});
  (void)ex.isOk();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  tryLoad(bytes);

  if (size < sizeof(BundleHeader) || std::memcmp(data, kBundleMagic, sizeof(kBundleMagic)) != 0)
    return 0;
  BundleHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.programOffset > size || h.programSize > size - h.programOffset)
    return 0;
  uint32_t crc =
      static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), data + h.programOffset, h.programSize));
  if (crc == h.programCrc32)
    return 0;
  h.programCrc32 = crc;
  std::memcpy(bytes.data(), &h, sizeof(h));
  tryLoad(std::move(bytes));
  return 0;
}
