// Training on the CPU with hand-built bundles (TrainTestUtil.h): data loading
// and its errors, shuffling determinism, micro-batches, evaluation,
// bit-identical losses for the same seed, checkpoints (round trip, resume ==
// uninterrupted, corrupt / truncated / foreign checkpoints refused and left
// untouched).
#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/Npy.h"
#include "forge/runtime/CpuExecutor.h"
#include "forge/runtime/Trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "TrainTestUtil.h"

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fs = std::filesystem;

namespace {

HostTensor floats(std::vector<int64_t> shape, const std::vector<float> &v) {
  HostTensor t;
  t.dtype = fb::F32;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

HostTensor int64s(std::vector<int64_t> shape, const std::vector<int64_t> &v) {
  HostTensor t;
  t.dtype = fb::I64;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * 8);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

/// n samples of a noisy linear target y = x . (1, -2, 0.5) (deterministic).
std::vector<std::pair<std::string, HostTensor>> linearData(int64_t n, int64_t d = 3) {
  std::vector<float> x(static_cast<size_t>(n * d)), y(static_cast<size_t>(n));
  const float coef[3] = {1.0f, -2.0f, 0.5f};
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0;
    for (int64_t j = 0; j < d; ++j) {
      float v = std::sin(static_cast<float>(i * d + j) * 0.7f + 0.3f);
      x[i * d + j] = v;
      acc += v * coef[j % 3];
    }
    y[i] = acc + 0.01f * std::cos(static_cast<float>(i));
  }
  return {{"x", floats({n, d}, x)}, {"y", floats({n, 1}, y)}};
}

std::unique_ptr<DataSource> linearSource(int64_t n) {
  return makeArraySource(linearData(n), {"train.npz", "train.npz"});
}

std::unique_ptr<Bundle> load(BundleWriter w, const std::string &origin = "linear.forge") {
  auto b = Bundle::fromBytes(w.serialize(), origin);
  EXPECT_TRUE(b.isOk()) << b.status().message();
  return b.isOk() ? b.take() : nullptr;
}

std::unique_ptr<Trainer> makeTrainer(const Bundle &bundle, int64_t n, uint64_t seed,
                                     int64_t evalN = 0, bool shuffle = true,
                                     TrainerOptions o = {},
                                     std::unique_ptr<DataSource> train = nullptr) {
  o.threads = 2;
  o.seed = seed;
  o.shuffle = shuffle;
  auto tr = Trainer::create(bundle, train ? std::move(train) : linearSource(n),
                            evalN ? makeArraySource(linearData(evalN), {"val.npz", "val.npz"})
                                  : nullptr,
                            o);
  EXPECT_TRUE(tr.isOk()) << tr.status().message();
  return tr.isOk() ? tr.take() : nullptr;
}

/// `epochs`, if given: Trainer::epochsDone() after each step.
std::vector<float> run(Trainer &tr, int steps, std::vector<double> *epochs = nullptr) {
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    auto r = tr.step();
    EXPECT_TRUE(r.isOk()) << r.status().message();
    if (!r)
      break;
    losses.push_back(r->loss);
    if (epochs)
      epochs->push_back(tr.epochsDone());
  }
  return losses;
}

std::vector<uint8_t> bytesOf(const Executor &ex, const std::string &name) {
  for (int32_t t : ex.persistentTensors())
    if (ex.tensorInfo(t).name() == name) {
      TensorView v = ex.view(t);
      const uint8_t *p = static_cast<const uint8_t *>(v.data);
      return {p, p + v.bytes()};
    }
  return {};
}

std::vector<uint8_t> readFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void writeFile(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(b.data()), b.size());
}

std::string freshDir(const std::string &name) {
  std::string d = ::testing::TempDir() + "forge_trainer_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

#define EXPECT_HAS(status, needle)                                                          \
  do {                                                                                      \
    std::string _m = (status).message();                                                    \
    EXPECT_NE(_m.find(needle), std::string::npos) << "message: " << _m;                     \
  } while (0)

} // namespace

// --- EpochSampler ------------------------------------------------------------------------

TEST(EpochSamplerTest, SeededPermutationsAreDeterministic) {
  EpochSampler a(10, 3, 42), b(10, 3, 42), c(10, 3, 43);
  EXPECT_EQ(a.stepsPerEpoch(), 3);
  for (uint64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> order = a.orderOf(e);
    EXPECT_EQ(order, b.orderOf(e));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 10; ++i)
      EXPECT_EQ(sorted[i], i);
  }
  EXPECT_NE(a.orderOf(0), a.orderOf(1));
  EXPECT_NE(a.orderOf(0), c.orderOf(0));
  // A fixed expectation guards against platform-dependent shuffling.
  EpochSampler fixed(8, 8, 7);
  std::vector<int64_t> o = fixed.orderOf(0);
  EXPECT_EQ(o, fixed.orderOf(0));
}

TEST(EpochSamplerTest, StepsDropThePartialBatchAndSeekResumes) {
  EpochSampler s(10, 3, 5);
  std::vector<int64_t> e0 = s.orderOf(0), e1 = s.orderOf(1);
  std::vector<std::vector<int64_t>> got;
  for (int i = 0; i < 5; ++i) {
    auto span = s.next();
    got.emplace_back(span.begin(), span.end());
  }
  EXPECT_EQ(got[0], std::vector<int64_t>(e0.begin(), e0.begin() + 3));
  EXPECT_EQ(got[2], std::vector<int64_t>(e0.begin() + 6, e0.begin() + 9));
  EXPECT_EQ(got[3], std::vector<int64_t>(e1.begin(), e1.begin() + 3)); // e0[9] dropped
  EXPECT_EQ(s.position().epoch, 1u);
  EXPECT_EQ(s.position().index, 6);

  EpochSampler r(10, 3, 5);
  r.seek({1, 3});
  auto span = r.next();
  EXPECT_EQ(std::vector<int64_t>(span.begin(), span.end()), got[4]);

  EpochSampler plain(5, 2, 9, /*shuffle=*/false);
  EXPECT_EQ(plain.orderOf(3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// --- data sources --------------------------------------------------------------------------

// Length buckets: each step's samples come from one group; an epoch visits each full run
// of a group once; the order is a pure function of (seed, epoch).
TEST(EpochSamplerTest, GroupsKeepEachStepInOneGroup) {
  const int64_t n = 103, perStep = 4;
  std::vector<int32_t> group(n);
  for (int64_t i = 0; i < n; ++i)
    group[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 3);
  std::map<int32_t, int64_t> counts;
  for (int32_t g : group)
    ++counts[g];
  int64_t full = 0;
  for (auto [g, c] : counts)
    full += c / perStep * perStep;
  EpochSampler s(n, perStep, 11);
  s.setGroups(group);
  EXPECT_EQ(s.epochSamples(), full);
  EXPECT_EQ(s.stepsPerEpoch(), full / perStep);
  std::set<int64_t> seen;
  std::set<int32_t> groupsSeen;
  std::vector<int64_t> firstEpoch;
  for (int64_t k = 0; k < s.stepsPerEpoch(); ++k) {
    std::span<const int64_t> step = s.next();
    ASSERT_EQ(step.size(), static_cast<size_t>(perStep));
    for (int64_t i : step) {
      EXPECT_EQ(s.groupOf(i), s.groupOf(step.front())) << "step " << k << " mixes groups";
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice in one epoch";
      firstEpoch.push_back(i);
    }
    groupsSeen.insert(s.groupOf(step.front()));
  }
  EXPECT_EQ(groupsSeen.size(), 3u);
  EXPECT_EQ(s.position().epoch, 0u);
  s.next(); // the next epoch
  EXPECT_EQ(s.position().epoch, 1u);
  // Groups interleave (runs are shuffled), and the same seed repeats the order.
  std::vector<int32_t> runGroups;
  for (size_t k = 0; k < firstEpoch.size(); k += perStep)
    runGroups.push_back(group[static_cast<size_t>(firstEpoch[k])]);
  EXPECT_FALSE(std::is_sorted(runGroups.begin(), runGroups.end()));
  EpochSampler again(n, perStep, 11);
  again.setGroups(group);
  EXPECT_EQ(again.orderOf(0), firstEpoch);
  EXPECT_NE(again.orderOf(1), firstEpoch);
  // Resuming at a position continues the same order.
  EpochSampler resumed(n, perStep, 11);
  resumed.setGroups(group);
  resumed.seek({0, 8});
  std::span<const int64_t> third = resumed.next();
  EXPECT_EQ(std::vector<int64_t>(third.begin(), third.end()),
            std::vector<int64_t>(firstEpoch.begin() + 8, firstEpoch.begin() + 12));
}

// Documents end after the separator; a document of n tokens has n - 1 labelled positions,
// cut into samples of at most T; fillAt pads tokens with the separator, labels with the
// ignored label and a mask with 0.
TEST(DataSourceTest, DocumentsSplitAtTheSeparatorAndPadToTheirBucket) {
  // Separator 0: documents [5 6 7 0] [8 0] [1 2 3 4 5 6 7 8 9 0] [0] [4 4].
  std::vector<uint32_t> tokens = {5, 6, 7, 0, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 4, 4};
  auto src = makeDocumentSource(tokens, 0, "docs.bin");
  EXPECT_TRUE(src->concurrentFill());
  DataField in{"input_ids", fb::I64, {4}}, lab{"labels", fb::I64, {4}},
      mask{"attention_mask", fb::I32, {4}};
  lab.isLabel = true;
  lab.numClasses = 10;
  EXPECT_HAS(src->bind({in, lab}), "compile with forgec --loss cross_entropy:...,labels,ignore=-100");
  lab.ignoreValue = -100;
  ASSERT_TRUE(src->bind({in, lab, mask}).isOk());
  EXPECT_TRUE(src->variableLength());
  // [5 6 7 0]: 3; [8 0]: 1; the 10-token document: 9 = 4 + 4 + 1; [0]: none; [4 4]: 1.
  ASSERT_EQ(src->numSamples(), 6);
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < src->numSamples(); ++i)
    lengths.push_back(src->sampleLength(i));
  EXPECT_EQ(lengths, (std::vector<int64_t>{3, 1, 4, 4, 1, 1}));
  std::vector<int64_t> a(6), l(6);
  std::vector<int32_t> m(6);
  void *outs[] = {a.data(), l.data(), m.data()};
  std::vector<int64_t> idx = {0, 4};
  ASSERT_TRUE(src->fillAt(idx, outs, 3).isOk());
  EXPECT_EQ(a, (std::vector<int64_t>{5, 6, 7, 9, 0, 0}));
  EXPECT_EQ(l, (std::vector<int64_t>{6, 7, 0, 0, -100, -100}));
  EXPECT_EQ(m, (std::vector<int32_t>{1, 1, 1, 1, 0, 0}));
  std::vector<int64_t> window = {3};
  ASSERT_TRUE(src->fillAt(window, outs, 2).isOk() == false); // 4 positions do not fit in 2
  std::vector<int64_t> full(4), fullLabels(4);
  std::vector<int32_t> fullMask(4);
  void *fullOuts[] = {full.data(), fullLabels.data(), fullMask.data()};
  ASSERT_TRUE(src->fill(window, fullOuts).isOk()); // fill() is fillAt(T)
  EXPECT_EQ(full, (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(fullLabels, (std::vector<int64_t>{6, 7, 8, 9}));
  // Errors name the file: a label beyond the classes, a separator the input cannot hold.
  auto bad = makeDocumentSource({1, 2, 12, 0}, 0, "bad.bin");
  ASSERT_TRUE(bad->bind({in, lab}).isOk());
  std::vector<int64_t> first = {0};
  void *two[] = {a.data(), l.data()};
  EXPECT_HAS(bad->fill(first, two), "bad.bin: token 12 at offset 2 (a label of 'labels')");
  auto wide = makeDocumentSource({1, 300, 2}, 300, "wide.bin");
  DataField small{"input_ids", fb::U8, {4}};
  EXPECT_HAS(wide->bind({small, lab}), "the document separator 300 does not fit");
}

TEST(DataSourceTest, ArraySourceChecksArraysAgainstTheBundle) {
  DataField x{"x", fb::F32, {3}};
  DataField y{"y", fb::F32, {1}};
  y.isLabel = true;
  {
    auto src = makeArraySource(linearData(6), {"a.npz", "a.npz"});
    ASSERT_TRUE(src->bind({x, y}).isOk());
    EXPECT_EQ(src->numSamples(), 6);
    std::vector<float> xb(6), yb(2);
    void *outs[] = {xb.data(), yb.data()};
    std::vector<int64_t> idx = {4, 1};
    ASSERT_TRUE(src->fill(idx, outs).isOk());
    auto data = linearData(6);
    const float *xs = reinterpret_cast<const float *>(data[0].second.bytes.data());
    EXPECT_EQ(xb[0], xs[12]);
    EXPECT_EQ(xb[3], xs[3]);
  }
  {
    auto src = makeArraySource(linearData(6), {"a.npz", "a.npz"});
    DataField z{"z", fb::F32, {2}};
    Status s = src->bind({x, z});
    EXPECT_HAS(s, "a.npz: no array for the bundle input 'z' (f32[B, 2])");
    EXPECT_HAS(s, "the data has 'x', 'y'");
  }
  {
    auto src = makeArraySource(linearData(6), {"a.npz", "a.npz"});
    DataField xd{"x", fb::F64, {3}};
    EXPECT_HAS(src->bind({xd}), "a.npz: array 'x' has dtype f32, the bundle input 'x' needs f64");
    DataField xs{"x", fb::F32, {4}};
    EXPECT_HAS(src->bind({xs}), "a.npz: array 'x' has shape [6, 3], the bundle input 'x' needs "
                                "[B, 4] (per sample [4])");
  }
  {
    auto arrays = linearData(6);
    arrays[1].second = floats({5, 1}, {1, 2, 3, 4, 5});
    auto src = makeArraySource(std::move(arrays), {"a.npz", "b.npy"});
    EXPECT_HAS(src->bind({x, y}),
               "arrays disagree on the number of samples: 'x' (a.npz) has 6, 'y' (b.npy) has 5");
  }
}

TEST(DataSourceTest, OpensNpzNpyAndRejectsBadSpecs) {
  std::string dir = freshDir("specs");
  auto data = linearData(4);
  ASSERT_TRUE(writeNpz(dir + "/d.npz", {{"x", data[0].second.view()}}).isOk());
  ASSERT_TRUE(writeNpy(dir + "/labels.npy", data[1].second.view()).isOk());
  auto src = openDataSource({dir + "/d.npz", "y=" + dir + "/labels.npy"});
  ASSERT_TRUE(src.isOk()) << src.status().message();
  DataField x{"x", fb::F32, {3}}, y{"y", fb::F32, {1}};
  EXPECT_TRUE((*src)->bind({x, y}).isOk());
  auto byStem = openDataSource({dir + "/d.npz", dir + "/labels.npy"});
  ASSERT_TRUE(byStem.isOk());
  EXPECT_HAS((*byStem)->bind({x, y}), "no array for the bundle input 'y'");

  EXPECT_HAS(openDataSource({dir + "/d.txt"}).status(), "expected FILE.npz, NAME=FILE.npy");
  EXPECT_HAS(openDataSource({dir + "/missing.npz"}).status(), "missing.npz");
  EXPECT_HAS(openDataSource({dir + "/d.npz", dir + "/d.npz"}).status(), "array 'x' is given twice");
  EXPECT_HAS(openDataSource({dir + "/d.npz", dir + "/t.bin"}).status(), "cannot be mixed");
}

TEST(DataSourceTest, TokenShardsGiveNextTokenWindows) {
  std::vector<uint32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto src = makeTokenSource(tokens, "tok.bin");
  DataField in{"input_ids", fb::I64, {4}}, lab{"labels", fb::I64, {4}};
  lab.isLabel = true;
  lab.numClasses = 10;
  ASSERT_TRUE(src->bind({in, lab}).isOk());
  EXPECT_EQ(src->numSamples(), 2); // (11 - 1) / 4
  std::vector<int64_t> a(8), l(8);
  void *outs[] = {a.data(), l.data()};
  std::vector<int64_t> idx = {1, 0};
  ASSERT_TRUE(src->fill(idx, outs).isOk());
  EXPECT_EQ(a, (std::vector<int64_t>{4, 5, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(l, (std::vector<int64_t>{5, 6, 7, 8, 1, 2, 3, 4}));

  auto big = makeTokenSource({0, 1, 2, 3, 4, 5, 6, 12, 8, 9, 3}, "tok.bin");
  ASSERT_TRUE(big->bind({in, lab}).isOk());
  std::vector<int64_t> second = {1};
  Status s = big->fill(second, outs);
  EXPECT_HAS(s, "tok.bin: token 12 at offset 7 (a label of 'labels') is outside [0, 10)");

  auto two = makeTokenSource(tokens, "tok.bin");
  DataField f{"x", fb::F32, {4}};
  EXPECT_HAS(two->bind({f}), "token shards feed integer [B, T] inputs");
}

// Data workers split a batch into ranges of samples, each filled by its own fill() call into
// its place in the buffers: the bytes equal one fill() of the whole batch.
TEST(DataSourceTest, TokenShardsFillConcurrently) {
  std::vector<uint32_t> tokens(4001);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint32_t>((i * 7919) % 50);
  auto src = makeTokenSource(tokens, "tok.bin");
  EXPECT_TRUE(src->concurrentFill());
  const int64_t T = 16;
  DataField in{"input_ids", fb::I32, {T}}, lab{"labels", fb::I64, {T}};
  lab.isLabel = true;
  lab.numClasses = 50;
  ASSERT_TRUE(src->bind({in, lab}).isOk());
  EpochSampler sampler(src->numSamples(), 64, 3);
  std::span<const int64_t> idx = sampler.next();
  std::vector<int32_t> a(64 * T), a4(64 * T);
  std::vector<int64_t> l(64 * T), l4(64 * T);
  void *outs[] = {a.data(), l.data()};
  ASSERT_TRUE(src->fill(idx, outs).isOk());
  std::vector<std::thread> threads;
  std::vector<Status> status(4);
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      void *part[] = {a4.data() + w * 16 * T, l4.data() + w * 16 * T};
      status[w] = src->fill(idx.subspan(static_cast<size_t>(w) * 16, 16), part);
    });
  for (std::thread &t : threads)
    t.join();
  for (const Status &st : status)
    ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(a, a4);
  EXPECT_EQ(l, l4);
  EXPECT_NE(a, std::vector<int32_t>(64 * T, 0));
}

TEST(DataSourceTest, TokenShardFilesAndLlmcHeader) {
  std::string dir = freshDir("tokens");
  std::vector<uint16_t> raw = {5, 6, 7, 8, 9};
  {
    std::ofstream f(dir + "/a.bin", std::ios::binary);
    f.write(reinterpret_cast<const char *>(raw.data()), raw.size() * 2);
  }
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(raw.size());
    std::ofstream f(dir + "/b.bin", std::ios::binary);
    f.write(reinterpret_cast<const char *>(header.data()), 1024);
    f.write(reinterpret_cast<const char *>(raw.data()), raw.size() * 2);
  }
  DataField in{"ids", fb::I32, {2}}, lab{"labels", fb::I64, {2}};
  lab.isLabel = true;
  auto src = openDataSource({dir + "/a.bin", dir + "/b.bin"});
  ASSERT_TRUE(src.isOk()) << src.status().message();
  ASSERT_TRUE((*src)->bind({in, lab}).isOk());
  EXPECT_EQ((*src)->numSamples(), 4); // 2 windows per shard
  std::vector<int32_t> ids(2);
  std::vector<int64_t> labels(2);
  void *outs[] = {ids.data(), labels.data()};
  std::vector<int64_t> idx = {3};
  ASSERT_TRUE((*src)->fill(idx, outs).isOk());
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(labels, (std::vector<int64_t>{8, 9}));

  auto odd = openDataSource({dir + "/a.bin"}, {TokenDType::U32});
  EXPECT_HAS(odd.status(), "a.bin: 10 bytes is not a whole number of uint32 tokens");
}

// --- Trainer ---------------------------------------------------------------------------------

TEST(TrainerTest, SameSeedGivesBitIdenticalLosses) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  auto a = makeTrainer(*bundle, 22, 7), b = makeTrainer(*bundle, 22, 7),
       c = makeTrainer(*bundle, 22, 8);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->stepsPerEpoch(), 5); // 22 / 4, two samples dropped per epoch
  std::vector<float> la = run(*a, 12), lb = run(*b, 12), lc = run(*c, 12);
  ASSERT_EQ(la.size(), 12u);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
  EXPECT_NE(la, lc);
  EXPECT_EQ(bytesOf(a->executor(), "w"), bytesOf(b->executor(), "w"));
  EXPECT_LT(la.back(), la.front()); // it learns
  EXPECT_EQ(a->stepsDone(), 12);
  EXPECT_NEAR(a->epochsDone(), 12.0 / 5.0, 1e-12);
}

TEST(TrainerTest, StepFeedsForgeStepAndReportsLrAndGradNorm) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  auto tr = makeTrainer(*bundle, 8, 1);
  ASSERT_TRUE(tr);
  for (int s = 1; s <= 3; ++s) {
    auto r = tr->step();
    ASSERT_TRUE(r.isOk()) << r.status().message();
    EXPECT_EQ(r->step, s);
    ASSERT_TRUE(r->lr && r->gradNorm);
    EXPECT_FLOAT_EQ(*r->lr, 0.1f / static_cast<float>(s));
    EXPECT_GT(*r->gradNorm, 0.0f);
  }
}

TEST(TrainerTest, MicroBatchesEqualOneLargerBatch) {
  LinearSpec one;
  one.batch = 4;
  LinearSpec two = one;
  two.batch = 2;
  two.micro = 2;
  auto b1 = load(makeLinearBundle(one)), b2 = load(makeLinearBundle(two));
  ASSERT_TRUE(b1 && b2);
  auto t1 = makeTrainer(*b1, 12, 3, 0, /*shuffle=*/false);
  auto t2 = makeTrainer(*b2, 12, 3, 0, /*shuffle=*/false);
  ASSERT_TRUE(t1 && t2);
  EXPECT_EQ(t2->samplesPerStep(), 4);
  EXPECT_EQ(t2->microBatches(), 2);
  std::vector<float> l1 = run(*t1, 6), l2 = run(*t2, 6);
  ASSERT_EQ(l1.size(), l2.size());
  for (size_t i = 0; i < l1.size(); ++i)
    EXPECT_NEAR(l1[i], l2[i], 1e-5f * std::max(1.0f, std::abs(l1[i]))) << "step " << i + 1;
}

/// The linear data, except that filling sample `bad` fails (a corrupt record).
class FailingSource final : public DataSource {
public:
  FailingSource(int64_t n, int64_t bad) : inner_(linearSource(n)), bad_(bad) {}
  Status bind(const std::vector<DataField> &fields) override { return inner_->bind(fields); }
  int64_t numSamples() const override { return inner_->numSamples(); }
  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    for (int64_t i : indices)
      if (i == bad_)
        return Status::error("sample {} is corrupt", i);
    return inner_->fill(indices, outs);
  }
  bool concurrentFill() const override { return true; }
  std::string describe() const override { return "failing.npz"; }

private:
  std::unique_ptr<DataSource> inner_;
  int64_t bad_;
};

TEST(TrainerTest, PrefetchRingKeepsTheBatchesAndTheLosses) {
  // Two micro-batches of 2 over 22 samples: 5 steps an epoch, 13 steps cross two
  // epoch boundaries (each a fresh permutation) while the ring runs ahead.
  LinearSpec spec;
  spec.batch = 2;
  spec.micro = 2;
  auto bundle = load(makeLinearBundle(spec));
  ASSERT_TRUE(bundle);
  std::vector<float> reference;
  std::vector<uint8_t> referenceW;
  for (unsigned prefetch : {0u, 1u, 4u})
    for (unsigned workers : {1u, 3u}) {
      TrainerOptions o;
      o.prefetch = prefetch;
      o.workers = workers;
      auto tr = makeTrainer(*bundle, 22, 5, 0, true, o);
      ASSERT_TRUE(tr);
      std::vector<float> losses = run(*tr, 13);
      ASSERT_EQ(losses.size(), 13u);
      if (reference.empty()) {
        reference = losses;
        referenceW = bytesOf(tr->executor(), "w");
        continue;
      }
      EXPECT_EQ(std::memcmp(losses.data(), reference.data(), reference.size() * 4), 0)
          << "prefetch " << prefetch << ", workers " << workers;
      EXPECT_EQ(bytesOf(tr->executor(), "w"), referenceW)
          << "prefetch " << prefetch << ", workers " << workers;
    }
}

TEST(TrainerTest, PrefetchRingRestartsAtARestoredPosition) {
  // The ring has run ahead of step 4 when the trainer goes back to it: the
  // batches it made for steps 5.. of the first pass are dropped, and the
  // replayed steps equal the first pass bit for bit.
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  std::string dir = freshDir("prefetch_restore");
  TrainerOptions o;
  o.prefetch = 3;
  auto tr = makeTrainer(*bundle, 22, 17, 0, true, o);
  ASSERT_TRUE(tr);
  ASSERT_EQ(run(*tr, 4).size(), 4u);
  CheckpointDir ckpt(dir);
  ASSERT_TRUE(ckpt.save(tr->executor(), tr->state()).isOk());
  std::vector<float> first = run(*tr, 5);
  ASSERT_EQ(first.size(), 5u);
  auto state = ckpt.resume(tr->executor(), [](const std::string &w) { ADD_FAILURE() << w; });
  ASSERT_TRUE(state.isOk() && state->has_value()) << state.status().message();
  ASSERT_TRUE(tr->restore(**state).isOk());
  EXPECT_EQ(tr->stepsDone(), 4);
  std::vector<float> again = run(*tr, 5);
  ASSERT_EQ(again.size(), 5u);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0);
}

TEST(TrainerTest, APrefetchedBadBatchFailsAtItsOwnStep) {
  // Sample 9 (unshuffled, batch 4: step 3) cannot be read. The ring reads it
  // while steps 1 and 2 run; they still succeed, and step 3 reports it.
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  for (unsigned prefetch : {0u, 4u}) {
    TrainerOptions o;
    o.prefetch = prefetch;
    auto tr = makeTrainer(*bundle, 22, 1, 0, /*shuffle=*/false, o,
                          std::make_unique<FailingSource>(22, 9));
    ASSERT_TRUE(tr);
    for (int s = 1; s <= 2; ++s) {
      auto r = tr->step();
      EXPECT_TRUE(r.isOk()) << "prefetch " << prefetch << ", step " << s << ": "
                            << r.status().message();
    }
    auto r = tr->step();
    ASSERT_FALSE(r.isOk()) << "prefetch " << prefetch;
    EXPECT_HAS(r.status(), "sample 9 is corrupt");
    EXPECT_EQ(tr->stepsDone(), 2);
    if (prefetch > 0) { // a step after it: an error, not a wait for a batch nobody makes
      auto again = tr->step();
      ASSERT_FALSE(again.isOk());
      EXPECT_HAS(again.status(), "prefetch thread stopped");
    }
  }
}

/// Mean squared error and accuracy (|error| < 0.5) of the linear bundle's
/// initial w over the first n samples of linearData(12).
static std::pair<double, double> linearEvalReference(int n) {
  auto data = linearData(12);
  const float *x = reinterpret_cast<const float *>(data[0].second.bytes.data());
  const float *y = reinterpret_cast<const float *>(data[1].second.bytes.data());
  const float w[3] = {0.5f, -0.25f, 0.125f};
  double sum = 0;
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    double d = x[i * 3] * w[0] + x[i * 3 + 1] * w[1] + x[i * 3 + 2] * w[2] - y[i];
    sum += d * d;
    hits += std::abs(d) < 0.5;
  }
  return {sum / n, static_cast<double>(hits) / n};
}

TEST(TrainerTest, EvaluateCoversAPartialLastBatch) {
  // With forge.sample_weight the last, partial batch counts too: 12 samples in
  // batches of 5 are 3 runs, the last padded with weight-0 repeats.
  LinearSpec spec;
  spec.sampleWeights = true;
  auto bundle = load(makeLinearBundle(spec));
  ASSERT_TRUE(bundle);
  auto tr = makeTrainer(*bundle, 8, 1, /*evalN=*/12);
  ASSERT_TRUE(tr);
  auto e = tr->evaluate();
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(e->batches, 3);
  EXPECT_EQ(e->samples, 12);
  auto [mse, accuracy] = linearEvalReference(12);
  EXPECT_NEAR(e->loss, mse, 1e-5);
  ASSERT_TRUE(e->accuracy);
  EXPECT_NEAR(*e->accuracy, accuracy, 1e-12);
}

TEST(TrainerTest, StepOnTakesTheCallersBatchesWithoutASource) {
  // A trainer without a training source (the Python API) trains on batches the
  // caller passes: the rows of an unshuffled source, step by step, give its losses
  // and parameters bit for bit; the batch is checked as data files are.
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  auto ref = makeTrainer(*bundle, 16, 0, 0, /*shuffle=*/false);
  TrainerOptions o;
  o.threads = 2;
  auto made = Trainer::create(*bundle, nullptr, nullptr, o);
  ASSERT_TRUE(made.isOk()) << made.status().message();
  auto tr = made.take();
  ASSERT_TRUE(ref);
  EXPECT_FALSE(tr->hasTrainData());
  EXPECT_EQ(tr->trainSamples(), 0);
  EXPECT_EQ(tr->stepsPerEpoch(), 0);
  auto data = linearData(16);
  for (int s = 0; s < 4; ++s) {
    std::vector<std::pair<std::string, MappedArray>> views;
    for (auto &[name, t] : data) {
      const size_t row = t.bytes.size() / 16;
      MappedArray m;
      m.dtype = t.dtype;
      m.shape = t.shape;
      m.shape[0] = 4;
      m.data = t.bytes.data() + static_cast<size_t>(s) * 4 * row;
      m.size = 4 * row;
      views.emplace_back(name, m);
    }
    auto batch = makeArrayViewSource(std::move(views), "batch");
    auto a = ref->step();
    auto b = tr->stepOn(*batch);
    ASSERT_TRUE(a.isOk() && b.isOk()) << b.status().message();
    EXPECT_EQ(b->step, s + 1);
    EXPECT_EQ(std::memcmp(&a->loss, &b->loss, 4), 0) << "step " << s + 1;
  }
  EXPECT_EQ(bytesOf(ref->executor(), "w"), bytesOf(tr->executor(), "w"));
  // step() has nothing to draw from; a batch of the wrong size or dtype is refused.
  auto none = tr->step();
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("no training data"), std::string::npos);
  auto three = makeArraySource(linearData(3), {"b.npz", "b.npz"});
  auto r3 = tr->stepOn(*three);
  ASSERT_FALSE(r3.isOk());
  EXPECT_NE(r3.status().message().find("the batch has 3 samples, a step takes 4"),
            std::string::npos) << r3.status().message();
  std::vector<std::pair<std::string, HostTensor>> wrong = linearData(4);
  wrong[0].second.dtype = forge::bundle::I32;
  auto bad = makeArraySource(std::move(wrong), {"b.npz", "b.npz"});
  auto rb = tr->stepOn(*bad);
  ASSERT_FALSE(rb.isOk());
  EXPECT_NE(rb.status().message().find("array 'x' has dtype i32"), std::string::npos)
      << rb.status().message();
  // Device arrays need a device with its own memory.
  const void *fake[2] = {nullptr, nullptr};
  auto rd = tr->stepOnDevice(fake);
  ASSERT_FALSE(rd.isOk());
  EXPECT_NE(rd.status().message().find("reads inputs from host memory only"), std::string::npos)
      << rd.status().message();
  EXPECT_EQ(tr->stepsDone(), 4);
  // The checkpoint state without a source: the step only; restore() continues it.
  CheckpointState st = tr->state();
  EXPECT_EQ(st.step, 4);
  EXPECT_EQ(st.trainSamples, 0);
  st.step = 9;
  ASSERT_TRUE(tr->restore(st).isOk());
  EXPECT_EQ(tr->stepsDone(), 9);
}

TEST(TrainerTest, SetEvalDataBindsAndReplacesTheEvalSource) {
  LinearSpec spec;
  spec.sampleWeights = true;
  auto bundle = load(makeLinearBundle(spec));
  ASSERT_TRUE(bundle);
  auto tr = makeTrainer(*bundle, 8, 1);
  ASSERT_TRUE(tr);
  EXPECT_FALSE(tr->hasEval());
  ASSERT_TRUE(tr->setEvalData(makeArraySource(linearData(12), {"v.npz", "v.npz"})).isOk());
  auto e = tr->evaluate();
  ASSERT_TRUE(e.isOk()) << e.status().message();
  auto [mse, accuracy] = linearEvalReference(12);
  EXPECT_EQ(e->samples, 12);
  EXPECT_NEAR(e->loss, mse, 1e-5);
  // A replacement of another size; a bad one is refused and leaves no eval data.
  ASSERT_TRUE(tr->setEvalData(makeArraySource(linearData(7), {"w.npz", "w.npz"})).isOk());
  auto e7 = tr->evaluate();
  ASSERT_TRUE(e7.isOk()) << e7.status().message();
  EXPECT_EQ(e7->samples, 7);
  auto bad = linearData(7);
  bad.pop_back(); // no 'y'
  Status st = tr->setEvalData(makeArraySource(std::move(bad), {"u.npz"}));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("no array for the bundle input 'y'"), std::string::npos)
      << st.message();
  EXPECT_FALSE(tr->hasEval());
}

TEST(TrainerTest, EvaluateAveragesFullBatches) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  auto tr = makeTrainer(*bundle, 8, 1, /*evalN=*/12); // eval batch 5: two full batches
  ASSERT_TRUE(tr);
  ASSERT_TRUE(tr->hasEval());
  auto e = tr->evaluate();
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_EQ(e->batches, 2);
  EXPECT_EQ(e->samples, 10);
  auto [mse, accuracy] = linearEvalReference(10); // the first 10 of linearData(12)
  EXPECT_NEAR(e->loss, mse, 1e-5);
  ASSERT_TRUE(e->accuracy);
  EXPECT_DOUBLE_EQ(*e->accuracy, accuracy);
  // Evaluation leaves training untouched.
  std::vector<uint8_t> w0 = bytesOf(tr->executor(), "w");
  ASSERT_TRUE(tr->evaluate().isOk());
  EXPECT_EQ(bytesOf(tr->executor(), "w"), w0);
  EXPECT_EQ(tr->stepsDone(), 0);
}

TEST(TrainerTest, CreateErrorsNameTheProblem) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  auto tooFew = Trainer::create(*bundle, linearSource(3), nullptr, {});
  EXPECT_HAS(tooFew.status(), "3 training samples, fewer than one step needs");

  auto wrong = Trainer::create(
      *bundle, makeArraySource({{"x", floats({4, 2}, std::vector<float>(8))}}, {"t.npz"}), nullptr,
      {});
  EXPECT_HAS(wrong.status(), "t.npz: no array for the bundle input 'y'");

  // An inference bundle is not trainable.
  BundleWriter w;
  ProgramBuilder b(w);
  b.routine("forward");
  int32_t x = b.input("x", {2});
  int32_t y = b.output("y", {2});
  b.inst("relu", {x}, {y});
  auto inference = load(std::move(w));
  ASSERT_TRUE(inference);
  auto notTrain = Trainer::create(*inference, linearSource(8), nullptr, {});
  EXPECT_HAS(notTrain.status(), "not a training bundle (no routine 'train_step'; routines: "
                                "forward)");
}

TEST(TrainerTest, LabelsOutOfRangeAreRefusedWithFileAndArray) {
  auto bundle = load(makeClassifierBundle(2, 3, 4));
  ASSERT_TRUE(bundle);
  auto data = [](std::vector<int64_t> labels) {
    int64_t n = static_cast<int64_t>(labels.size());
    return makeArraySource({{"x", floats({n, 3}, std::vector<float>(n * 3, 0.5f))},
                            {"labels", int64s({n}, labels)}},
                           {"cls.npz", "cls.npz"});
  };
  auto bad = Trainer::create(*bundle, data({0, 1, 4, 2}), nullptr, {});
  EXPECT_HAS(bad.status(), "cls.npz: array 'labels': label 4 at sample 2 is outside [0, 4) (the "
                           "model has 4 classes)");
  auto negative = Trainer::create(*bundle, data({0, -1}), nullptr, {});
  EXPECT_HAS(negative.status(), "label -1 at sample 1");
  auto good = Trainer::create(*bundle, data({0, 1, 3, 2}), data({3, 3}), {});
  ASSERT_TRUE(good.isOk()) << good.status().message();
  auto r = (*good)->step();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_NEAR(r->loss, std::log(4.0f), 0.1f);
  auto e = (*good)->evaluate();
  ASSERT_TRUE(e.isOk()) << e.status().message();
  ASSERT_TRUE(e->accuracy);
  EXPECT_GE(*e->accuracy, 0.0);
  EXPECT_LE(*e->accuracy, 1.0);
}

// --- checkpoints -------------------------------------------------------------------------------

TEST(CheckpointTest, RoundTripAndResumeEqualsUninterrupted) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  std::string dir = freshDir("resume");

  auto straight = makeTrainer(*bundle, 22, 11);
  ASSERT_TRUE(straight);
  std::vector<float> expected = run(*straight, 13);

  auto first = makeTrainer(*bundle, 22, 11);
  ASSERT_TRUE(first);
  std::vector<float> part1 = run(*first, 7);
  CheckpointDir ckpt(dir);
  auto saved = ckpt.save(first->executor(), first->state());
  ASSERT_TRUE(saved.isOk()) << saved.status().message();
  EXPECT_EQ(*saved, dir + "/ckpt-7.forgeckpt");
  EXPECT_EQ(readFile(dir + "/latest"), std::vector<uint8_t>({'c', 'k', 'p', 't', '-', '7', '.',
                                                             'f', 'o', 'r', 'g', 'e', 'c', 'k',
                                                             'p', 't', '\n'}));
  // numpy can read it: members are plain arrays.
  auto npz = readNpz(*saved);
  ASSERT_TRUE(npz.isOk());
  EXPECT_TRUE(npz->count("param/w") && npz->count("state/opt.m.w") && npz->count("forge_checkpoint"));

  // A fresh process (other seed on the command line): resume from the directory.
  auto second = makeTrainer(*bundle, 22, 999);
  ASSERT_TRUE(second);
  EXPECT_NE(bytesOf(second->executor(), "w"), bytesOf(first->executor(), "w"));
  auto state = ckpt.resume(second->executor(), [](const std::string &w) { ADD_FAILURE() << w; });
  ASSERT_TRUE(state.isOk()) << state.status().message();
  ASSERT_TRUE(state->has_value());
  EXPECT_EQ((*state)->step, 7);
  EXPECT_EQ((*state)->seed, 11u);
  ASSERT_TRUE(second->restore(**state).isOk());
  EXPECT_EQ(bytesOf(second->executor(), "w"), bytesOf(first->executor(), "w"));
  EXPECT_EQ(bytesOf(second->executor(), "opt.m.w"), bytesOf(first->executor(), "opt.m.w"));
  std::vector<float> part2 = run(*second, 6);
  part1.insert(part1.end(), part2.begin(), part2.end());
  ASSERT_EQ(part1.size(), expected.size());
  EXPECT_EQ(std::memcmp(part1.data(), expected.data(), expected.size() * 4), 0);
  EXPECT_EQ(bytesOf(second->executor(), "w"), bytesOf(straight->executor(), "w"));

  // Other data: refused.
  auto otherData = makeTrainer(*bundle, 30, 11);
  ASSERT_TRUE(otherData);
  EXPECT_HAS(otherData->restore(**state), "taken with 22 training samples");
}

TEST(CheckpointTest, CorruptTruncatedAndForeignCheckpointsAreRefusedAndKept) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  std::string dir = freshDir("corrupt");
  auto tr = makeTrainer(*bundle, 12, 1);
  ASSERT_TRUE(tr);
  run(*tr, 2);
  std::string path = dir + "/c.forgeckpt";
  ASSERT_TRUE(writeCheckpoint(path, tr->executor(), tr->state()).isOk());
  const std::vector<uint8_t> good = readFile(path);

  auto target = makeTrainer(*bundle, 12, 1);
  ASSERT_TRUE(target);
  const std::vector<uint8_t> w0 = bytesOf(target->executor(), "w");

  // Flip one byte in every stored tensor position: each must be refused.
  auto npz = readNpz(path);
  ASSERT_TRUE(npz.isOk());
  int flipped = 0;
  for (size_t pos = 0; pos < good.size(); pos += 37) {
    std::vector<uint8_t> bad = good;
    bad[pos] ^= 0x5a;
    writeFile(path, bad);
    CheckpointError kind;
    auto r = readCheckpoint(path, target->executor(), &kind);
    if (r.isOk()) {
      // Only bytes the zip format does not interpret (timestamps, version,
      // extra fields) may be flipped without changing the content.
      EXPECT_EQ(bytesOf(target->executor(), "w"), bytesOf(tr->executor(), "w"));
      ASSERT_TRUE(target->executor().setPersistent(0, w0).isOk());
      continue;
    }
    ++flipped;
    EXPECT_NE(kind, CheckpointError::None);
    EXPECT_EQ(bytesOf(target->executor(), "w"), w0) << "byte " << pos;
    EXPECT_EQ(readFile(path), bad) << "the checkpoint was modified";
  }
  EXPECT_GT(flipped, 0);

  // A flipped tensor data byte is a CRC error.
  {
    std::vector<uint8_t> bad = good;
    const HostTensor &w = npz->at("param/w");
    auto it = std::search(bad.begin(), bad.end(), w.bytes.begin(), w.bytes.end());
    ASSERT_NE(it, bad.end());
    *it ^= 1;
    writeFile(path, bad);
    CheckpointError kind;
    auto r = readCheckpoint(path, target->executor(), &kind);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(kind, CheckpointError::Corrupt);
    EXPECT_HAS(r.status(), "c.forgeckpt");
    EXPECT_HAS(r.status(), "CRC32 mismatch");
  }
  // Truncated.
  for (size_t keep : {size_t{0}, good.size() / 2, good.size() - 1}) {
    std::vector<uint8_t> bad(good.begin(), good.begin() + static_cast<long>(keep));
    writeFile(path, bad);
    CheckpointError kind;
    auto r = readCheckpoint(path, target->executor(), &kind);
    ASSERT_FALSE(r.isOk()) << keep;
    EXPECT_EQ(kind, CheckpointError::Corrupt);
    EXPECT_EQ(readFile(path), bad);
  }
  EXPECT_EQ(bytesOf(target->executor(), "w"), w0);

  // Another bundle: other shapes, or another source model.
  writeFile(path, good);
  LinearSpec wide;
  wide.dim = 4;
  wide.w0 = {1, 2, 3, 4};
  auto other = load(makeLinearBundle(wide));
  auto otherEx = CpuExecutor::create(*other, {1});
  ASSERT_TRUE(otherEx.isOk());
  CheckpointError kind;
  auto r = readCheckpoint(path, **otherEx, &kind);
  EXPECT_EQ(kind, CheckpointError::Mismatch);
  EXPECT_HAS(r.status(), "checkpoint of another bundle: param 'w' is f32[3, 1] there, f32[4, 1] "
                         "here");
  LinearSpec renamed;
  renamed.sourceHash = "another-model";
  auto other2 = load(makeLinearBundle(renamed));
  auto other2Ex = CpuExecutor::create(*other2, {1});
  ASSERT_TRUE(other2Ex.isOk());
  r = readCheckpoint(path, **other2Ex, &kind);
  EXPECT_EQ(kind, CheckpointError::Mismatch);
  EXPECT_HAS(r.status(), "checkpoint of another model (source hash linear-test, this bundle has "
                         "another-model)");
  EXPECT_EQ(readFile(path), good);
}

// A sharded checkpoint (one file per rank, forge-train with several ranks) as its
// ranks write it: here `w` [3, 1] split in 3 pieces along dim 0, one per rank file,
// the state `m` whole in rank 0's. Reading the directory joins the pieces; a
// missing rank's file, a missing piece or one rank's file alone is refused with
// the executor unchanged.
TEST(CheckpointTest, ShardedDirectoryJoinsPiecesAndRefusesIncompleteOnes) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  std::string dir = freshDir("sharded");
  auto tr = makeTrainer(*bundle, 12, 1);
  ASSERT_TRUE(tr);
  run(*tr, 2);
  ASSERT_TRUE(writeCheckpoint(dir + "/whole.forgeckpt", tr->executor(), tr->state()).isOk());
  auto whole = readNpz(dir + "/whole.forgeckpt");
  ASSERT_TRUE(whole.isOk());
  const HostTensor &metaT = whole->at("forge_checkpoint");
  const nlohmann::json meta = nlohmann::json::parse(metaT.bytes.begin(), metaT.bytes.end());
  const HostTensor &w = whole->at("param/w");
  ASSERT_EQ(w.shape, (std::vector<int64_t>{3, 1}));
  const std::string ck = dir + "/ckpt-2.forgeckpt";
  std::filesystem::create_directory(ck);
  auto rankFile = [&](int r) { return ck + "/rank-0000" + std::to_string(r) + "-of-00003.forgeckpt"; };
  // Rank r's file: w's piece r (and on rank 0 everything else, whole).
  auto writeRank = [&](int r, bool withPiece) {
    nlohmann::json m = meta;
    m["version"] = 2;
    m["shard"] = {{"rank", r}, {"ranks", 3}};
    nlohmann::json tensors = nlohmann::json::array();
    std::map<std::string, TensorView> arrays;
    std::vector<uint8_t> piece(w.bytes.begin() + 4 * r, w.bytes.begin() + 4 * (r + 1));
    for (const auto &t : meta["tensors"]) {
      if (t["name"] == "w") {
        if (!withPiece)
          continue;
        nlohmann::json e = t;
        e["shape"] = {1, 1};
        e["crc32"] = ::crc32_z(::crc32_z(0, nullptr, 0), piece.data(), piece.size());
        e["part"] = {{"axis", 0}, {"index", r}, {"parts", 3}, {"blocks", 1}};
        tensors.push_back(e);
        arrays["param/w"] = TensorView{piece.data(), forge::bundle::F32, {1, 1}};
      } else if (r == 0) {
        tensors.push_back(t);
        std::string member = t["kind"].get<std::string>() + "/" + t["name"].get<std::string>();
        arrays[member] = whole->at(member).view();
      }
    }
    m["tensors"] = tensors;
    std::string text = m.dump();
    std::vector<uint8_t> bytes(text.begin(), text.end());
    arrays["forge_checkpoint"] = TensorView{bytes.data(), forge::bundle::U8,
                                            {static_cast<int64_t>(bytes.size())}};
    ASSERT_TRUE(writeNpz(rankFile(r), arrays).isOk());
  };
  for (int r = 0; r < 3; ++r)
    writeRank(r, true);

  auto target = makeTrainer(*bundle, 12, 1);
  ASSERT_TRUE(target);
  const std::vector<uint8_t> w0 = bytesOf(target->executor(), "w");
  ASSERT_NE(w0, bytesOf(tr->executor(), "w"));
  CheckpointError kind;
  auto state = readCheckpoint(ck, target->executor(), &kind);
  ASSERT_TRUE(state.isOk()) << state.status().message();
  EXPECT_EQ(state->step, 2);
  EXPECT_EQ(bytesOf(target->executor(), "w"), bytesOf(tr->executor(), "w"));
  EXPECT_EQ(bytesOf(target->executor(), "m"), bytesOf(tr->executor(), "m"));
  ASSERT_TRUE(target->executor().setPersistent(0, w0).isOk());

  // One rank's file alone is not a checkpoint.
  auto alone = readCheckpoint(rankFile(1), target->executor(), &kind);
  EXPECT_HAS(alone.status(), "one rank's file of a sharded checkpoint");
  // A piece in no rank's file.
  writeRank(2, false);
  auto noPiece = readCheckpoint(ck, target->executor(), &kind);
  EXPECT_EQ(kind, CheckpointError::Corrupt);
  EXPECT_HAS(noPiece.status(), "piece 2 of 3 of param 'w' is in no rank's file");
  // A rank's file missing (a run killed while writing): refused, and skipped by resume.
  std::filesystem::remove(rankFile(2));
  auto missing = readCheckpoint(ck, target->executor(), &kind);
  EXPECT_EQ(kind, CheckpointError::Corrupt);
  EXPECT_HAS(missing.status(), "rank 2's file of 3 is missing");
  EXPECT_EQ(bytesOf(target->executor(), "w"), w0);
}

// ExecutorOptions::routines (a pipeline stage's executor): only the named
// routines run, and persistent tensors none of them touches get no storage.
TEST(ExecutorRoutinesTest, LoadsOnlyTheNamedRoutinesAndTheirTensors) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  ExecutorOptions options;
  options.routines = {"eval"};
  auto ex = createExecutor(*bundle, options);
  ASSERT_TRUE(ex.isOk()) << ex.status().message();
  Executor &e = **ex;
  auto train = e.findRoutine("train_step"), eval = e.findRoutine("eval");
  ASSERT_TRUE(train.isOk() && eval.isOk());
  EXPECT_TRUE(e.isLoaded(*eval));
  EXPECT_FALSE(e.isLoaded(*train));
  EXPECT_HAS(e.run(*train), "routine 'train_step' was not loaded by this executor (it runs "
                            "'eval')");
  int32_t w = -1, m = -1;
  for (int32_t t : e.persistentTensors())
    (e.tensorInfo(t).name() == "w" ? w : m) = t;
  ASSERT_GE(w, 0);
  ASSERT_GE(m, 0);
  EXPECT_TRUE(e.isPresent(w)); // eval reads the weight
  EXPECT_FALSE(e.isPresent(m)); // only train_step's momentum update touches it
  EXPECT_EQ(e.view(m).data, nullptr);
  std::vector<uint8_t> zeros(byteSize(e.tensorInfo(m)), 0);
  EXPECT_HAS(e.setPersistent(m, zeros), "'opt.m.w' is not held here");
  auto [held, all] = e.persistentBytes();
  EXPECT_EQ(held, byteSize(e.tensorInfo(w)));
  EXPECT_EQ(all, byteSize(e.tensorInfo(w)) + byteSize(e.tensorInfo(m)));
  options.routines = {"no_such"};
  EXPECT_HAS(createExecutor(*bundle, options).status(), "has no routine 'no_such' to load");
}

TEST(CheckpointTest, DirectoryNeverOverwritesAndResumeSkipsCorruptOnes) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  std::string dir = freshDir("dir");
  CheckpointDir ckpt(dir);
  auto tr = makeTrainer(*bundle, 12, 1);
  ASSERT_TRUE(tr);

  auto empty = ckpt.resume(tr->executor(), [](const std::string &) {});
  ASSERT_TRUE(empty.isOk());
  EXPECT_FALSE(empty->has_value());

  run(*tr, 2);
  auto a = ckpt.save(tr->executor(), tr->state());
  run(*tr, 2);
  auto b = ckpt.save(tr->executor(), tr->state());
  ASSERT_TRUE(a.isOk() && b.isOk());
  const std::vector<uint8_t> wAt4 = bytesOf(tr->executor(), "w");
  // Same step again: a new name, the old file untouched.
  std::vector<uint8_t> bBytes = readFile(*b);
  auto b2 = ckpt.save(tr->executor(), tr->state());
  ASSERT_TRUE(b2.isOk());
  EXPECT_EQ(*b2, dir + "/ckpt-4.1.forgeckpt");
  EXPECT_EQ(readFile(*b), bBytes);
  EXPECT_EQ(ckpt.list(), (std::vector<std::string>{*b2, *b, *a}));

  // Corrupt the newest two: resume warns, keeps them, and loads step 2.
  std::vector<uint8_t> corrupt = bBytes;
  corrupt.resize(corrupt.size() - 10);
  writeFile(*b, corrupt);
  writeFile(*b2, corrupt);
  auto fresh = makeTrainer(*bundle, 12, 1);
  std::vector<std::string> warnings;
  auto state = ckpt.resume(fresh->executor(), [&](const std::string &w) { warnings.push_back(w); });
  ASSERT_TRUE(state.isOk()) << state.status().message();
  ASSERT_TRUE(state->has_value());
  EXPECT_EQ((*state)->step, 2);
  EXPECT_EQ(warnings.size(), 2u);
  EXPECT_EQ(readFile(*b), corrupt);
  EXPECT_EQ(readFile(*b2), corrupt);
  EXPECT_NE(bytesOf(fresh->executor(), "w"), wAt4);

  // The next save at step 4 does not replace the corrupt files.
  ASSERT_TRUE(fresh->restore(**state).isOk());
  run(*fresh, 2);
  auto b3 = ckpt.save(fresh->executor(), fresh->state());
  ASSERT_TRUE(b3.isOk());
  EXPECT_EQ(*b3, dir + "/ckpt-4.2.forgeckpt");
  EXPECT_EQ(readFile(*b), corrupt);
  EXPECT_EQ(bytesOf(fresh->executor(), "w"), wAt4);

  // All corrupt: an error, not a silent restart.
  writeFile(*a, corrupt);
  writeFile(*b3, corrupt);
  auto none = ckpt.resume(fresh->executor(), [](const std::string &) {});
  EXPECT_HAS(none.status(), "no valid checkpoint to resume from");

  // Another bundle's directory: an error.
  std::string otherDir = freshDir("dir_other");
  LinearSpec wide;
  wide.dim = 4;
  wide.w0 = {1, 2, 3, 4};
  auto other = load(makeLinearBundle(wide));
  auto otherEx = CpuExecutor::create(*other, {1});
  ASSERT_TRUE(otherEx.isOk());
  ASSERT_TRUE(CheckpointDir(otherDir).save(**otherEx, CheckpointState{}).isOk());
  auto foreign = CheckpointDir(otherDir).resume(tr->executor(), [](const std::string &) {});
  EXPECT_HAS(foreign.status(), "checkpoint of another bundle");
}

// --- device-decoded inputs (DataSource::encodeImages, Executor::bindEncodedInput) ---------
// The Trainer's half of forge-train --decode gpu, on the CPU: a source that "encodes" field
// x's samples (each sample's bytes reversed; every third sample left as it is, length 0)
// and an executor wrapping the CPU one that "decodes" the bound samples at run() (reverses
// them back). Whatever the ring, the micro-batches or an evaluation between steps, the
// losses must be the plain run's bit for bit; an executor that ignores the lengths trains
// on the reversed samples and must not match.

namespace {

class ReversingSource final : public DataSource {
public:
  explicit ReversingSource(int64_t n) : inner_(linearSource(n)) {}
  Status bind(const std::vector<DataField> &fields) override {
    fields_ = fields;
    return inner_->bind(fields);
  }
  int64_t numSamples() const override { return inner_->numSamples(); }
  bool concurrentFill() const override { return true; }
  std::string describe() const override { return "reversing " + inner_->describe(); }
  Expected<int> encodeImages() override {
    for (size_t f = 0; f < fields_.size(); ++f)
      if (fields_[f].name == "x") {
        encoded_ = true;
        return static_cast<int>(f);
      }
    return Status::error("no input x");
  }
  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    if (outs.size() != fields_.size() + (encoded_ ? 1 : 0))
      return Status::error("fill with {} buffers, {} fields", outs.size(), fields_.size());
    FORGE_RETURN_IF_ERROR(inner_->fill(indices, outs.first(fields_.size())));
    if (!encoded_)
      return Status::ok();
    size_t x = 0;
    while (fields_[x].name != "x")
      ++x;
    const size_t bytes =
        static_cast<size_t>(numElements(fields_[x].sampleShape)) * dtypeSize(fields_[x].dtype);
    auto *lengths = static_cast<uint32_t *>(outs[fields_.size()]);
    for (size_t i = 0; i < indices.size(); ++i) {
      uint8_t *at = static_cast<uint8_t *>(outs[x]) + i * bytes;
      lengths[i] = indices[i] % 3 == 0 ? 0 : static_cast<uint32_t>(bytes);
      if (lengths[i])
        std::reverse(at, at + bytes);
    }
    return Status::ok();
  }

private:
  std::unique_ptr<DataSource> inner_;
  std::vector<DataField> fields_;
  bool encoded_ = false;
};

class ReversingExecutor final : public Executor {
public:
  ReversingExecutor(const Bundle &bundle, std::unique_ptr<Executor> inner, bool decode)
      : Executor(bundle), inner_(std::move(inner)), decode_(decode) {}
  std::string describe() const override { return "reversing " + inner_->describe(); }
  void *inputBuffer(int32_t index) override { return inner_->inputBuffer(index); }
  Status bindEncodedInput(int32_t index, const uint32_t *lengths) override {
    lengths_[index] = lengths;
    ++binds_;
    return Status::ok();
  }
  Expected<std::string> imageDecoder() override { return std::string("reversing (test)"); }
  Status run(int routine) override {
    for (auto [index, lengths] : lengths_) {
      const auto &ins = inputs(routine);
      if (!lengths || !decode_ || std::find(ins.begin(), ins.end(), index) == ins.end())
        continue;
      const std::vector<int64_t> shape = shapeOf(tensorInfo(index));
      const size_t bytes = byteSize(tensorInfo(index)) / static_cast<size_t>(shape[0]);
      auto *at = static_cast<uint8_t *>(inner_->inputBuffer(index));
      for (int64_t b = 0; b < shape[0]; ++b) {
        if (lengths[b] != 0 && lengths[b] != bytes)
          return Status::error("sample {}: length {} of a {}-byte sample", b, lengths[b], bytes);
        if (lengths[b])
          std::reverse(at + b * bytes, at + (b + 1) * bytes);
      }
    }
    return inner_->run(routine);
  }
  TensorView view(int32_t index) const override { return inner_->view(index); }
  DeviceInfo deviceInfo() const override { return inner_->deviceInfo(); }
  Expected<std::vector<Span>> runProfiled(int routine) override {
    return inner_->runProfiled(routine);
  }
  Status writePersistent(int32_t index, std::span<const uint8_t> bytes) override {
    return inner_->setPersistent(index, bytes); // its checks again, then its writePersistent
  }
  int binds() const { return binds_; }

private:
  std::unique_ptr<Executor> inner_;
  bool decode_;
  std::map<int32_t, const uint32_t *> lengths_;
  int binds_ = 0;
};

TrainerOptions reversingOptions(bool decode, unsigned prefetch) {
  TrainerOptions o;
  o.prefetch = prefetch;
  o.imageDecode = "gpu";
  o.makeExecutor = [decode](const Bundle &b,
                            const ExecutorOptions &eo) -> Expected<std::unique_ptr<Executor>> {
    auto inner = createExecutor(b, eo);
    if (!inner)
      return inner.status();
    return std::unique_ptr<Executor>(new ReversingExecutor(b, inner.take(), decode));
  };
  return o;
}

} // namespace

TEST(Trainer, DeviceDecodedInputsTrainAsPlainOnes) {
  for (int64_t micro : {1, 2})
    for (unsigned prefetch : {0u, 2u}) {
      SCOPED_TRACE(fmt::format("micro-batches {}, prefetch {}", micro, prefetch));
      LinearSpec spec;
      spec.micro = micro;
      auto bundle = load(makeLinearBundle(spec));
      ASSERT_TRUE(bundle);
      TrainerOptions plainOptions;
      plainOptions.prefetch = prefetch;
      auto plain = makeTrainer(*bundle, 40, 3, 10, true, plainOptions);
      auto decoded = makeTrainer(*bundle, 40, 3, 10, true, reversingOptions(true, prefetch),
                                 std::make_unique<ReversingSource>(40));
      ASSERT_TRUE(plain && decoded);
      EXPECT_EQ(decoded->imageDecoder(), "reversing (test)");
      // Steps, an evaluation (its own data: the bound lengths must not apply), more steps.
      std::vector<float> want = run(*plain, 5), got = run(*decoded, 5);
      auto evalWant = plain->evaluate(), evalGot = decoded->evaluate();
      ASSERT_TRUE(evalWant.isOk() && evalGot.isOk()) << evalGot.status().message();
      EXPECT_EQ(evalGot->loss, evalWant->loss);
      for (float l : run(*plain, 5))
        want.push_back(l);
      for (float l : run(*decoded, 5))
        got.push_back(l);
      EXPECT_EQ(got, want);
      // The same source through an executor that ignores the lengths trains on the
      // reversed samples: the check above can fail.
      auto ignoring = makeTrainer(*bundle, 40, 3, 0, true, reversingOptions(false, prefetch),
                                  std::make_unique<ReversingSource>(40));
      ASSERT_TRUE(ignoring);
      EXPECT_NE(run(*ignoring, 5), std::vector<float>(want.begin(), want.begin() + 5));
    }
}

namespace {

/// A CPU executor that says it pipelines: it keeps each routine's outputs of its last two runs
/// (as the CUDA executor's two read-back sets do) for routineOutput(); `honest` false answers
/// every routineOutput() with the last run's value, as a wrong read-back would.
class PipeliningExecutor final : public Executor {
public:
  PipeliningExecutor(const Bundle &bundle, std::unique_ptr<Executor> inner, bool honest)
      : Executor(bundle), inner_(std::move(inner)), honest_(honest) {}
  std::string describe() const override { return "pipelining " + inner_->describe(); }
  void *inputBuffer(int32_t index) override { return inner_->inputBuffer(index); }
  bool canPipeline() const override { return true; }
  uint64_t runsIssued() const override { return runs_; }
  Status run(int routine) override {
    FORGE_RETURN_IF_ERROR(inner_->run(routine));
    ++runs_;
    std::deque<std::map<int32_t, std::vector<uint8_t>>> &h = history_[routine];
    h.emplace_front();
    for (int32_t t : outputs(routine)) {
      TensorView v = inner_->view(t);
      const auto *p = static_cast<const uint8_t *>(v.data);
      h.front()[t].assign(p, p + v.bytes());
    }
    if (h.size() > 2)
      h.pop_back();
    return Status::ok();
  }
  Expected<TensorView> routineOutput(int32_t index, int runsAgo) override {
    ++reads_;
    for (auto &[routine, h] : history_)
      if (h.front().count(index)) {
        const size_t at = honest_ ? static_cast<size_t>(runsAgo) : 0;
        if (at >= h.size())
          return Status::error("tensor #{}: no run {} runs ago", index, runsAgo);
        TensorView v = inner_->view(index);
        v.data = h[at][index].data();
        return v;
      }
    return Status::error("tensor #{} is no routine's output", index);
  }
  TensorView view(int32_t index) const override { return inner_->view(index); }
  DeviceInfo deviceInfo() const override { return inner_->deviceInfo(); }
  Expected<std::vector<Span>> runProfiled(int routine) override {
    return inner_->runProfiled(routine);
  }
  Status writePersistent(int32_t index, std::span<const uint8_t> bytes) override {
    return inner_->setPersistent(index, bytes);
  }
  int reads() const { return reads_; }

private:
  std::unique_ptr<Executor> inner_;
  bool honest_;
  uint64_t runs_ = 0;
  int reads_ = 0;
  std::map<int, std::deque<std::map<int32_t, std::vector<uint8_t>>>> history_;
};

/// `steps` steps as forge-train pipelines them: step s+1 launched before s is collected.
/// `epochs`: Trainer::epochsDone() after each collected step.
std::vector<float> runPipelined(Trainer &tr, int steps, std::vector<double> *epochs) {
  std::vector<float> losses;
  for (int launched = 0; static_cast<int>(losses.size()) < steps;) {
    while (tr.inFlight() < 2 && launched < steps) {
      Status st = tr.launch();
      EXPECT_TRUE(st.isOk()) << st.message();
      if (!st.isOk())
        return losses;
      ++launched;
    }
    auto r = tr.collect();
    EXPECT_TRUE(r.isOk()) << r.status().message();
    if (!r)
      return losses;
    losses.push_back(r->loss);
    epochs->push_back(tr.epochsDone());
  }
  return losses;
}

} // namespace

// The Trainer's half of pipelining (the CUDA executor's is the GPU suites'): with two steps
// in flight, the older one's loss is its routine's run before the last (one micro-batch, and
// two unrolled). Length buckets (the older step's routine's last run when the newer step ran
// another bucket) need a compiled bucketed bundle: gpu_length_buckets checks them.
TEST(Trainer, PipelinedStepsReadTheOlderStepsOutputs) {
  for (int64_t micro : {1, 2}) {
    SCOPED_TRACE(fmt::format("micro-batches {}", micro));
    LinearSpec spec;
    spec.micro = micro;
    auto bundle = load(makeLinearBundle(spec));
    ASSERT_TRUE(bundle);
    auto plain = makeTrainer(*bundle, 40, 3);
    ASSERT_TRUE(plain);
    ASSERT_FALSE(plain->canPipeline());
    std::vector<double> wantEpochs; // 7 steps of 4 or 8 samples: into the second epoch
    const std::vector<float> want = run(*plain, 7, &wantEpochs);
    ASSERT_EQ(want.size(), 7u);
    for (bool honest : {true, false}) {
      TrainerOptions o;
      PipeliningExecutor *exec = nullptr;
      o.makeExecutor = [&](const Bundle &b,
                           const ExecutorOptions &eo) -> Expected<std::unique_ptr<Executor>> {
        auto inner = createExecutor(b, eo);
        if (!inner)
          return inner.status();
        exec = new PipeliningExecutor(b, inner.take(), honest);
        return std::unique_ptr<Executor>(exec);
      };
      auto piped = makeTrainer(*bundle, 40, 3, 0, true, o);
      ASSERT_TRUE(piped && exec);
      ASSERT_TRUE(piped->canPipeline());
      std::vector<double> epochs;
      const std::vector<float> got = runPipelined(*piped, 7, &epochs);
      EXPECT_GT(exec->reads(), 0); // the older of two was read while the newer was in flight
      if (honest) {
        EXPECT_EQ(got, want);
        ASSERT_EQ(epochs.size(), wantEpochs.size());
        for (size_t i = 0; i < epochs.size(); ++i) // the metrics' "epoch" of a collected step
          EXPECT_NEAR(epochs[i], wantEpochs[i], 1e-12) << "step " << i + 1;
      } else // the newer step's loss read for the older one: the check above can fail
        EXPECT_NE(got, want);
    }
  }
}

TEST(Trainer, DeviceDecodeRefusals) {
  auto bundle = load(makeLinearBundle());
  ASSERT_TRUE(bundle);
  TrainerOptions o;
  o.imageDecode = "gpu";
  auto cpu = Trainer::create(*bundle, linearSource(8), nullptr, o);
  ASSERT_FALSE(cpu.isOk());
  EXPECT_NE(cpu.status().message().find("decodes no images"), std::string::npos)
      << cpu.status().message();
  o.imageDecode = "auto"; // where it cannot: the plain run
  auto autoTr = Trainer::create(*bundle, linearSource(8), nullptr, o);
  ASSERT_TRUE(autoTr.isOk()) << autoTr.status().message();
  EXPECT_EQ((*autoTr)->imageDecoder(), "");
  // A source that cannot encode under a decoding executor: refused with gpu.
  TrainerOptions r = reversingOptions(true, 0);
  auto noEncode = Trainer::create(*bundle, linearSource(8), nullptr, r);
  ASSERT_FALSE(noEncode.isOk());
  EXPECT_NE(noEncode.status().message().find("canvas"), std::string::npos)
      << noEncode.status().message();
  o.imageDecode = "jpeg";
  EXPECT_FALSE(Trainer::create(*bundle, linearSource(8), nullptr, o).isOk());
}
