// CPU collective groups (Collectives.h): the rendezvous store and Gloo over TCP,
// with the ranks as threads of this process, and the all_reduce kernel against
// sums computed here.
#include "forge/runtime/Collectives.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Kernels.h"

#include <chrono>
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
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::string> errors(n);
  {
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        auto c = connectCpuGroup(rendezvous(r, n, port));
        if (c)
          comms[r] = c.take();
        else
          errors[r] = c.status().message();
      });
    for (std::thread &t : ranks)
      t.join();
  }
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(comms[r]) << "rank " << r << ": " << errors[r];
  EXPECT_EQ(comms[1]->rank(), 1);
  EXPECT_EQ(comms[2]->size(), 3);

  // Sums: rank r holds r + 0.5 * i (1000 values, an odd split across the ring).
  std::vector<std::vector<float>> data(n, std::vector<float>(1000));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < data[r].size(); ++i)
      data[r][i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
  {
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        Status s = comms[r]->allReduceSum(data[r].data(), data[r].size());
        if (!s.isOk())
          errors[r] = s.message();
      });
    for (std::thread &t : ranks)
      t.join();
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].empty()) << errors[r];
    for (size_t i = 0; i < data[r].size(); ++i)
      ASSERT_EQ(data[r][i], 3.0f + 1.5f * static_cast<float>(i)) << "rank " << r << " i " << i;
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
