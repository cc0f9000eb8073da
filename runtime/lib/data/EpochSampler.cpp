// EpochSampler (DataSource.h): the order in which training samples are visited.
//
// Invariants:
//  * The order of epoch e is a pure function of (seed, e, numSamples): a
//    std::mt19937_64 seeded from splitmix64(seed) and splitmix64(e) drives a
//    Fisher-Yates shuffle whose bounded draws use rejection sampling (not
//    std::uniform_int_distribution, whose algorithm differs between standard
//    libraries). Same inputs, same order, on every platform.
//  * Every step takes samplesPerStep consecutive entries of the order; when
//    fewer than samplesPerStep remain, the epoch ends (the remainder is
//    dropped) and the next step starts epoch e+1 at index 0. A Position
//    (epoch, index) therefore fully describes the sampler.
#include <numeric>
#include <random>

#include "forge/runtime/DataSource.h"

namespace forge::rt {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Uniform in [0, n), n > 0, without modulo bias.
uint64_t below(std::mt19937_64 &rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n; // 2^64 mod n
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold)
      return r % n;
  }
}
} // namespace

EpochSampler::EpochSampler(int64_t numSamples, int64_t samplesPerStep, uint64_t seed, bool shuffle)
    : numSamples_(std::max<int64_t>(0, numSamples)),
      samplesPerStep_(std::max<int64_t>(0, samplesPerStep)), seed_(seed), shuffle_(shuffle) {}

std::vector<int64_t> EpochSampler::orderOf(uint64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(numSamples_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle_ || numSamples_ < 2)
    return order;
  std::mt19937_64 rng(splitmix64(seed_) ^ splitmix64(splitmix64(epoch) + 1));
  for (uint64_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[below(rng, i + 1)]);
  return order;
}

void EpochSampler::makeOrder(uint64_t epoch) {
  if (orderEpoch_ == epoch)
    return;
  order_ = orderOf(epoch);
  orderEpoch_ = epoch;
}

void EpochSampler::seek(Position p) { pos_ = p; }

std::span<const int64_t> EpochSampler::next(int64_t count) {
  if (count <= 0 || count > numSamples_)
    return {};
  pos_ = startOf(pos_, count, numSamples_);
  makeOrder(pos_.epoch);
  std::span<const int64_t> out(order_.data() + pos_.index, static_cast<size_t>(count));
  pos_.index += count;
  return out;
}

} // namespace forge::rt
