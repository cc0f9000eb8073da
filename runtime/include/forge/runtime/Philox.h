// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the counter-based generator cuRAND's Philox4x32-10 implements.
//
// Invariants: a pure function of (key, counter); header-only, no dependencies,
// so the CUDA code generator (compiler/lib/Codegen/Pointwise.cpp,
// dropoutMaskKernel) builds the same rounds from these constants and the same
// threshold: a dropout mask is bit-identical on the CPU and the GPU.
#ifndef FORGE_RUNTIME_PHILOX_H
#define FORGE_RUNTIME_PHILOX_H

#include <array>
#include <cstdint>

namespace forge::rt {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

/// Ten rounds of Philox4x32 on `c` with key `k`; the key is bumped by the Weyl
/// constants between rounds.
inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    uint64_t p0 = uint64_t(kPhiloxM0) * c[0], p1 = uint64_t(kPhiloxM1) * c[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

/// Dropout's threshold: an element is kept when its word is >= this
/// (P(drop) = threshold / 2^32, ratio rounded to the 2^-32 grid).
inline uint64_t dropoutThreshold(double ratio) {
  double t = ratio * 4294967296.0 + 0.5;
  return t <= 0 ? 0 : t >= 4294967296.0 ? 4294967296ull : static_cast<uint64_t>(t);
}

/// Element i's keep bit: word i % 4 of philox(counter = (i / 4 low, i / 4 high,
/// step, 0), key = seed).
inline bool dropoutKeep(uint64_t seed, uint32_t step, uint64_t i, uint64_t threshold) {
  uint64_t block = i / 4;
  auto r = philox4x32({uint32_t(block), uint32_t(block >> 32), step, 0u},
                      {uint32_t(seed), uint32_t(seed >> 32)});
  return r[i % 4] >= threshold;
}

} // namespace forge::rt

#endif // FORGE_RUNTIME_PHILOX_H
