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
//  * With groups (length buckets), the order of epoch e is still a pure
//    function of (seed, e, groups): the permutation is dealt into its groups
//    in order, each group is cut into runs of samplesPerStep (a partial run
//    dropped), and the runs are shuffled by a second seeded draw. Every run
//    lies inside one group, so each step takes samples of one group, and
//    every epoch holds the same number of samples (epochSamples()).
#include <numeric>
#include <map>
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
  std::mt19937_64 rng(splitmix64(seed_) ^ splitmix64(splitmix64(epoch) + 1));
  if (shuffle_ && numSamples_ >= 2)
    for (uint64_t i = order.size() - 1; i > 0; --i)
      std::swap(order[i], order[below(rng, i + 1)]);
  if (groupOf_.empty() || samplesPerStep_ <= 0)
    return order;
  // Deal into groups (in order of group id), cut into runs, visit the runs in
  // a shuffled order (file order of their groups' first samples without shuffling).
  std::map<int32_t, std::vector<int64_t>> groups;
  for (int64_t i : order)
    groups[groupOf_[static_cast<size_t>(i)]].push_back(i);
  std::vector<std::pair<const std::vector<int64_t> *, size_t>> runs; // (group, first)
  for (const auto &[g, members] : groups)
    for (size_t at = 0; at + static_cast<size_t>(samplesPerStep_) <= members.size();
         at += static_cast<size_t>(samplesPerStep_))
      runs.emplace_back(&members, at);
  if (shuffle_ && runs.size() >= 2)
    for (uint64_t i = runs.size() - 1; i > 0; --i)
      std::swap(runs[i], runs[below(rng, i + 1)]);
  std::vector<int64_t> grouped;
  grouped.reserve(runs.size() * static_cast<size_t>(samplesPerStep_));
  for (const auto &[members, first] : runs)
    grouped.insert(grouped.end(), members->begin() + static_cast<std::ptrdiff_t>(first),
                   members->begin() + static_cast<std::ptrdiff_t>(first) + samplesPerStep_);
  return grouped;
}

void EpochSampler::setGroups(std::vector<int32_t> groupOf) {
  groupOf_ = std::move(groupOf);
  std::map<int32_t, int64_t> counts;
  for (int32_t g : groupOf_)
    ++counts[g];
  grouped_ = 0;
  for (const auto &[g, n] : counts)
    grouped_ += samplesPerStep_ > 0 ? n / samplesPerStep_ * samplesPerStep_ : 0;
  orderEpoch_ = ~0ull; // a cached order is of the groups before
}

void EpochSampler::makeOrder(uint64_t epoch) {
  if (orderEpoch_ == epoch)
    return;
  order_ = orderOf(epoch);
  orderEpoch_ = epoch;
}

void EpochSampler::seek(Position p) { pos_ = p; }

std::span<const int64_t> EpochSampler::next(int64_t count) {
  if (count <= 0 || count > epochSamples())
    return {};
  pos_ = startOf(pos_, count, epochSamples());
  makeOrder(pos_.epoch);
  std::span<const int64_t> out(order_.data() + pos_.index, static_cast<size_t>(count));
  pos_.index += count;
  return out;
}

} // namespace forge::rt
