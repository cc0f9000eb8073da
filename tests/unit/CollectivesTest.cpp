// CPU collective groups (Collectives.h): the rendezvous store and Gloo over TCP,
// with the ranks as threads of this process, and the all_reduce kernel against
// sums computed here.
#include "forge/runtime/Collectives.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Kernels.h"
#include "forge/runtime/Shards.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../runtime/lib/dist/TcpStore.h"

using namespace forge::rt;
namespace bundle = forge::bundle;

namespace {

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

Rendezvous rendezvous(int rank, int size, int port, int timeoutMs = 20000) {
  Rendezvous r;
  r.rank = rank;
  r.size = size;
  r.masterPort = port;
  r.timeout = std::chrono::milliseconds(timeoutMs);
  return r;
}

/// Connects `n` ranks (one thread each) into one CPU group: comms[r] is rank r's
/// communicator, or errors[r] says why it has none.
void connectRanks(int n, int port, std::vector<std::unique_ptr<Communicator>> &comms,
                  std::vector<std::string> &errors, int timeoutMs = 20000) {
  comms.resize(n);
  errors.assign(n, "");
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      auto c = connectCpuGroup(rendezvous(r, n, port, timeoutMs));
      if (c)
        comms[r] = c.take();
      else
        errors[r] = c.status().message();
    });
  for (std::thread &t : ranks)
    t.join();
}

/// Whether every rank of connectRanks got its communicator; else the ranks
/// that did not, with their errors.
::testing::AssertionResult allConnected(const std::vector<std::unique_ptr<Communicator>> &comms,
                                        const std::vector<std::string> &errors) {
  std::string missing;
  for (size_t r = 0; r < comms.size(); ++r)
    if (!comms[r])
      missing += " rank " + std::to_string(r) + ": " + errors[r] + ";";
  if (missing.empty())
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not connected:" << missing;
}

/// Runs `collective` on every rank's thread at once; a failure's message
/// goes to errors[r].
void onEveryRank(int n, std::vector<std::string> &errors,
                 const std::function<Status(int)> &collective) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      Status s = collective(r);
      if (!s.isOk())
        errors[r] = s.message();
    });
  for (std::thread &t : ranks)
    t.join();
}

} // namespace

TEST(TcpStoreTest, GetWaitsForSetAndTimesOut) {
  auto server = dist::TcpStoreServer::start(0);
  ASSERT_TRUE(server.isOk()) << server.status().message();
  const int port = (*server)->port();
  auto a = dist::TcpStoreClient::connect("127.0.0.1", port, std::chrono::milliseconds(5000));
  auto b = dist::TcpStoreClient::connect("127.0.0.1", port, std::chrono::milliseconds(300));
  ASSERT_TRUE(a.isOk() && b.isOk());
  auto waiter = std::async(std::launch::async, [&] { return (*a)->get("k"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE((*b)->set("k", {'v', '1'}).isOk());
  auto got = waiter.get();
  ASSERT_TRUE(got.isOk()) << got.status().message();
  EXPECT_EQ(*got, (std::vector<char>{'v', '1'}));
  auto missing = (*b)->get("never");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("'never' was not set within 0.3 s"),
            std::string::npos)
      << missing.status().message();
}

TEST(CollectivesTest, ThreeRanksSumOverTcp) {
  const int n = 3, port = freePort();
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::string> errors;
  connectRanks(n, port, comms, errors);
  ASSERT_TRUE(allConnected(comms, errors));
  EXPECT_EQ(comms[1]->rank(), 1);
  EXPECT_EQ(comms[2]->size(), 3);

  // Sums: rank r holds r + 0.5 * i (1000 values, an odd split across the ring).
  std::vector<std::vector<float>> data(n, std::vector<float>(1000));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < data[r].size(); ++i)
      data[r][i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
  onEveryRank(n, errors,
              [&](int r) { return comms[r]->allReduceSum(data[r].data(), data[r].size()); });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].empty()) << errors[r];
    for (size_t i = 0; i < data[r].size(); ++i)
      ASSERT_EQ(data[r][i], 3.0f + 1.5f * static_cast<float>(i)) << "rank " << r << " i " << i;
  }
}

// The element-wise maximum (fp8 delayed scaling's amaxes): the largest of the
// ranks' values at every position, whichever rank holds it, on every rank.
TEST(CollectivesTest, ThreeRanksMaxOverTcp) {
  const int n = 3, port = freePort();
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::string> errors;
  connectRanks(n, port, comms, errors);
  ASSERT_TRUE(allConnected(comms, errors));
  // Rank r holds ((i + r) % 3) * 10 + r - i: the maximum moves between ranks with i.
  std::vector<std::vector<float>> data(n, std::vector<float>(999));
  auto value = [](int r, size_t i) {
    return static_cast<float>(((i + r) % 3) * 10 + r) - static_cast<float>(i);
  };
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < data[r].size(); ++i)
      data[r][i] = value(r, i);
  onEveryRank(n, errors,
              [&](int r) { return comms[r]->allReduceMax(data[r].data(), data[r].size()); });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].empty()) << errors[r];
    for (size_t i = 0; i < data[r].size(); ++i)
      ASSERT_EQ(data[r][i], std::max({value(0, i), value(1, i), value(2, i)}))
          << "rank " << r << " i " << i;
  }
}

TEST(CollectivesTest, AllReduceKernelWithoutAGroupNamesTheLauncher) {
  bundle::Instruction inst;
  inst.set_op("all_reduce");
  (*inst.mutable_attrs())["group"].set_s("dp-test");
  (*inst.mutable_attrs())["reduction"].set_s("mean");
  (*inst.mutable_attrs())["size"].set_i(2);
  float x[2] = {1, 2}, y[2] = {0, 0};
  TensorView in{x, bundle::F32, {2}}, out{y, bundle::F32, {2}};
  ThreadPool pool(1);
  Status s = runCpuKernel(inst, std::span<const TensorView>(&in, 1), std::span<TensorView>(&out, 1),
                          pool);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("forge-train --nproc 2"), std::string::npos) << s.message();
  // A group of one is the identity.
  (*inst.mutable_attrs())["size"].set_i(1);
  s = runCpuKernel(inst, std::span<const TensorView>(&in, 1), std::span<TensorView>(&out, 1), pool);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(y[1], 2.0f);
}

// Tensor parallelism's layout on four ranks: subgroups {0,1}, {2,3} ("tp") and
// {0,2}, {1,3} ("dp") made from the world group, each summing and gathering
// within itself only.
TEST(CollectivesTest, SubgroupsOfFourRanksSumAndGatherWithinThemselves) {
  const int n = 4, port = freePort();
  std::vector<std::unique_ptr<Communicator>> world(n), tp(n), dp(n);
  std::vector<std::string> errors(n);
  std::vector<std::vector<float>> sums(n), gathered(n);
  {
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        auto c = connectCpuGroup(rendezvous(r, n, port));
        if (!c) {
          errors[r] = c.status().message();
          return;
        }
        world[r] = c.take();
        auto t = world[r]->subgroup("tp", {r / 2 * 2, r / 2 * 2 + 1});
        auto d = t ? world[r]->subgroup("dp", {r % 2, r % 2 + 2})
                   : Expected<std::unique_ptr<Communicator>>(t.status());
        if (!t || !d) {
          errors[r] = (!t ? t.status() : d.status()).message();
          return;
        }
        tp[r] = t.take();
        dp[r] = d.take();
        sums[r] = {static_cast<float>(r), 1.0f};
        float mine[2] = {static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
        gathered[r].resize(4);
        Status s = tp[r]->allReduceSum(sums[r].data(), 2);
        if (s.isOk())
          s = dp[r]->allGather(mine, gathered[r].data(), sizeof mine);
        if (!s.isOk())
          errors[r] = s.message();
      });
    for (std::thread &t : ranks)
      t.join();
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
    EXPECT_EQ(tp[r]->rank(), r % 2);
    EXPECT_EQ(dp[r]->size(), 2);
    // tp sums: ranks {0,1} -> 1, {2,3} -> 5.
    EXPECT_EQ(sums[r][0], r < 2 ? 1.0f : 5.0f) << "rank " << r;
    EXPECT_EQ(sums[r][1], 2.0f);
    // dp gathers in rank order: {0,2} -> 0,1,20,21; {1,3} -> 10,11,30,31.
    const float first = static_cast<float>(10 * (r % 2));
    EXPECT_EQ(gathered[r], (std::vector<float>{first, first + 1, first + 20, first + 21}))
        << "rank " << r;
  }
  // A list without this rank is refused.
  auto bad = world[0]->subgroup("x", {1, 2});
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("holds rank 0"), std::string::npos)
      << bad.status().message();
}

// Slicing a whole tensor into a rank's part and joining the parts back
// (Shards.h), against indices computed here: the whole [2, 6, 4] split
// along axis 1 into two [2, 3, 4] slices.
TEST(ShardsTest, SliceAndJoinAlongAnInnerAxis) {
  bundle::TensorInfo info;
  info.set_name("w");
  info.set_dtype(bundle::F32);
  for (int64_t d : {2, 3, 4})
    info.add_shape(d);
  info.mutable_shard()->set_axis(1);
  info.mutable_shard()->set_size(2);
  info.mutable_shard()->set_group("tp");
  EXPECT_EQ(wholeShape(info), (std::vector<int64_t>{2, 6, 4}));
  EXPECT_EQ(wholeBytes(info), 48 * sizeof(float));
  std::vector<float> whole(48);
  for (size_t i = 0; i < whole.size(); ++i)
    whole[i] = static_cast<float>(i);
  auto bytes = [](const std::vector<float> &v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(v.data()),
                                    v.size() * sizeof(float));
  };
  std::vector<uint8_t> parts;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<uint8_t> slice = sliceShard(info, bytes(whole), r);
    ASSERT_EQ(slice.size(), 24 * sizeof(float));
    const float *f = reinterpret_cast<const float *>(slice.data());
    for (int o = 0; o < 2; ++o)
      for (int row = 0; row < 3; ++row)
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(f[(o * 3 + row) * 4 + k],
                    static_cast<float>((o * 6 + r * 3 + row) * 4 + k))
              << "rank " << r << " at " << o << "," << row << "," << k;
    parts.insert(parts.end(), slice.begin(), slice.end());
  }
  std::vector<uint8_t> joined = joinShards(info, parts);
  ASSERT_EQ(joined.size(), whole.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(joined.data(), whole.data(), joined.size()), 0);
  // Without a group of two this process holds no slice: the error names the tensor.
  auto index = shardIndex(info);
  ASSERT_FALSE(index.isOk());
  EXPECT_NE(index.status().message().find("'w' is split over the 2 ranks of group 'tp'"),
            std::string::npos)
      << index.status().message();
}

// ZeRO-1's kernels in a process of its own: a group of one is the identity (the
// whole tensor is the one part), and a group of two that this process is not in is
// an error naming the launcher.
TEST(CollectivesTest, ZeroKernelsAloneAndWithoutTheirGroup) {
  ThreadPool pool(1);
  float x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0};
  for (const char *op : {"reduce_scatter", "all_gather", "rank_slice"}) {
    SCOPED_TRACE(op);
    bundle::Instruction inst;
    inst.set_op(op);
    (*inst.mutable_attrs())["group"].set_s("zero-test");
    (*inst.mutable_attrs())["reduction"].set_s("mean");
    (*inst.mutable_attrs())["size"].set_i(1);
    TensorView in{x, bundle::F32, {4}}, out{y, bundle::F32, {4}};
    std::fill(y, y + 4, 0.0f);
    Status s = runCpuKernel(inst, std::span<const TensorView>(&in, 1),
                            std::span<TensorView>(&out, 1), pool);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{1, 2, 3, 4}));
    (*inst.mutable_attrs())["size"].set_i(2);
    const bool gather = std::string(op) == "all_gather";
    TensorView part{y, bundle::F32, {2}};
    s = gather ? runCpuKernel(inst, std::span<const TensorView>(&part, 1),
                              std::span<TensorView>(&in, 1), pool)
               : runCpuKernel(inst, std::span<const TensorView>(&in, 1),
                              std::span<TensorView>(&part, 1), pool);
    ASSERT_FALSE(s.isOk());
    EXPECT_NE(s.message().find("forge-train --nproc 2"), std::string::npos) << s.message();
  }
}

// A fused q/k/v weight split by heads: the axis is 3 blocks, each split in two;
// rank r holds part r of every block.
TEST(ShardsTest, BlocksSplitEachBlockAlike) {
  bundle::TensorInfo info;
  info.set_name("qkv");
  info.set_dtype(bundle::F32);
  info.add_shape(2);
  info.add_shape(6); // the slice: 3 blocks x 2 columns
  info.mutable_shard()->set_axis(1);
  info.mutable_shard()->set_size(2);
  info.mutable_shard()->set_blocks(3);
  info.mutable_shard()->set_group("tp");
  EXPECT_EQ(wholeShape(info), (std::vector<int64_t>{2, 12}));
  std::vector<float> whole(24);
  for (size_t i = 0; i < whole.size(); ++i)
    whole[i] = static_cast<float>(i);
  std::span<const uint8_t> wholeBytes(reinterpret_cast<const uint8_t *>(whole.data()),
                                      whole.size() * sizeof(float));
  std::vector<uint8_t> parts;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<uint8_t> slice = sliceShard(info, wholeBytes, r);
    ASSERT_EQ(slice.size(), 12 * sizeof(float));
    const float *f = reinterpret_cast<const float *>(slice.data());
    for (int row = 0; row < 2; ++row)
      for (int k = 0; k < 3; ++k)
        for (int c = 0; c < 2; ++c)
          ASSERT_EQ(f[row * 6 + k * 2 + c], static_cast<float>(row * 12 + k * 4 + r * 2 + c))
              << "rank " << r << " row " << row << " block " << k << " column " << c;
    parts.insert(parts.end(), slice.begin(), slice.end());
  }
  std::vector<uint8_t> joined = joinShards(info, parts);
  ASSERT_EQ(joined.size(), wholeBytes.size());
  EXPECT_EQ(std::memcmp(joined.data(), whole.data(), joined.size()), 0);
}

// Pipeline messages (forge.send / forge.recv): matched by peer and tag whatever the
// order they are posted in, the sender's bytes reusable at once (the send stages a copy),
// more messages in flight than the send queue holds, and a recv nobody sends fails within
// the timeout naming the peer and the tag.
TEST(CollectivesTest, SendRecvMatchByTagAndTimeOutNamingThePeer) {
  const int n = 2, port = freePort();
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::string> errors;
  connectRanks(n, port, comms, errors, /*timeoutMs=*/2000);
  ASSERT_TRUE(allConnected(comms, errors));

  // Rank 0 sends tags 0..599 (more than the 256 in flight), overwriting its buffer after
  // each send; rank 1 receives tag 7 first, then the rest in order.
  constexpr int kMessages = 600;
  std::vector<std::vector<float>> got(kMessages, std::vector<float>(64, -1.0f));
  std::thread sender([&] {
    std::vector<float> buf(64);
    for (int t = 0; t < kMessages && errors[0].empty(); ++t) {
      for (size_t i = 0; i < buf.size(); ++i)
        buf[i] = static_cast<float>(t) + 0.25f * static_cast<float>(i);
      Status s = comms[0]->send(buf.data(), buf.size() * sizeof(float), 1, t);
      if (!s.isOk())
        errors[0] = s.message();
      std::fill(buf.begin(), buf.end(), -7.0f); // the staged copy is what travels
    }
  });
  std::thread receiver([&] {
    auto take = [&](int t) {
      Status s = comms[1]->recv(got[t].data(), got[t].size() * sizeof(float), 0, t);
      if (!s.isOk() && errors[1].empty())
        errors[1] = s.message();
    };
    take(7);
    for (int t = 0; t < kMessages; ++t)
      if (t != 7)
        take(t);
  });
  sender.join();
  receiver.join();
  ASSERT_TRUE(errors[0].empty()) << errors[0];
  ASSERT_TRUE(errors[1].empty()) << errors[1];
  for (int t = 0; t < kMessages; ++t)
    for (size_t i = 0; i < got[t].size(); ++i)
      ASSERT_EQ(got[t][i], static_cast<float>(t) + 0.25f * static_cast<float>(i))
          << "tag " << t << " element " << i;

  // Nobody sends tag 9999: the recv gives up after the group's timeout, naming both.
  float x = 0;
  const auto start = std::chrono::steady_clock::now();
  Status s = comms[1]->recv(&x, sizeof x, 0, 9999);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("tag 9999"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("from rank 0"), std::string::npos) << s.message();
  EXPECT_LT(waited, 10.0);
}
