// ThreadPool: every index covered exactly once, inline small jobs, safe
// concurrent and nested use, exceptions carried to the caller.
#include "forge/runtime/ThreadPool.h"

#include <atomic>
#include <set>
#include <stdexcept>

#include <gtest/gtest.h>

using forge::rt::ThreadPool;

namespace {
/// Runs parallelFor and checks that [0, n) is covered exactly once by
/// non-empty, in-range chunks.
void checkCoverage(ThreadPool &pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::atomic<bool> badChunk{false};
  pool.parallelFor(n, grain, [&](int64_t b, int64_t e) {
    if (b < 0 || e > n || b >= e)
      badChunk = true;
    for (int64_t i = b; i < e; ++i)
      hits[i].fetch_add(1);
  });
  EXPECT_FALSE(badChunk) << "n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
}
} // namespace

TEST(ThreadPoolTest, Size) {
  EXPECT_EQ(ThreadPool(1).size(), 1u);
  EXPECT_EQ(ThreadPool(4).size(), 4u);
  EXPECT_GE(ThreadPool(0).size(), 1u);
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 12345})
      for (int64_t grain : {-5, 0, 1, 3, 100, 5000})
        checkCoverage(pool, n, grain);
  }
}

TEST(ThreadPoolTest, ChunksRespectGrain) {
  ThreadPool pool(4);
  std::atomic<int64_t> smallest{INT64_MAX};
  std::atomic<int> lastChunks{0};
  pool.parallelFor(1000, 100, [&](int64_t b, int64_t e) {
    if (e != 1000) // only the final chunk may be shorter
      for (int64_t cur = smallest; e - b < cur && !smallest.compare_exchange_weak(cur, e - b);)
        ;
    else
      ++lastChunks;
  });
  EXPECT_GE(smallest.load(), 100);
  EXPECT_EQ(lastChunks.load(), 1);
}

TEST(ThreadPoolTest, SmallJobsRunInlineOnTheCaller) {
  ThreadPool pool(4);
  std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  pool.parallelFor(10, 10, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
  });
  EXPECT_EQ(calls, 1);

  ThreadPool single(1);
  calls = 0;
  single.parallelFor(1 << 20, 1, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(e - b, 1 << 20);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPoolTest, UsesSeveralThreads) {
  ThreadPool pool(4);
  std::mutex m;
  std::set<std::thread::id> ids;
  for (int rep = 0; rep < 50 && ids.size() < 2; ++rep)
    pool.parallelFor(64, 1, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
  EXPECT_GE(ids.size(), 2u);
}

TEST(ThreadPoolTest, ConcurrentCallersShareThePool) {
  ThreadPool pool(4);
  constexpr int kCallers = 6, kReps = 200;
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < kReps; ++r) {
        int64_t n = 100 + (c * 37 + r * 11) % 900;
        std::vector<std::atomic<int>> hits(n);
        pool.parallelFor(n, 7, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          if (hits[i].load() != 1)
            ++failures;
      }
    });
  for (std::thread &t : callers)
    t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPoolTest, NestedParallelForRunsInline) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  pool.parallelFor(16, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallelFor(100, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 1600);
}

TEST(ThreadPoolTest, ExceptionReachesTheCallerAndPoolStaysUsable) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallelFor(1000, 1,
                                [&](int64_t b, int64_t) {
                                  if (b >= 500)
                                    throw std::runtime_error("chunk failed");
                                }),
               std::runtime_error);
  checkCoverage(pool, 5000, 3);
}

TEST(ThreadPoolTest, ManySmallJobsInARow) {
  ThreadPool pool(3);
  int64_t sum = 0;
  for (int r = 0; r < 2000; ++r) {
    std::atomic<int64_t> s{0};
    pool.parallelFor(50, 2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        s += i;
    });
    sum += s;
  }
  EXPECT_EQ(sum, 2000 * (49 * 50 / 2));
}
