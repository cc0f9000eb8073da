// A fixed pool of worker threads for data-parallel CPU kernels.
// Invariant: parallelFor returns only after every chunk ran; chunks never overlap.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace forge::rt {

class ThreadPool {
public:
  /// `threads` == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  /// Calls fn(begin, end) over [0, n) in chunks of at least `grain` items,
  /// on the pool and the calling thread. Runs inline when n is small.
  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn);

private:
  void workerLoop();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)> *job_ = nullptr;
  int64_t jobSize_ = 0, chunk_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

} // namespace forge::rt
