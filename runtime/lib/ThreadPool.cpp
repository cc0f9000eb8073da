// A fixed pool of worker threads (ThreadPool.h).
//
// Invariants:
//  * one job at a time: a parallelFor from another thread waits until the
//    current job is finished (job_ == nullptr) before installing its own, so
//    the pool is safe to share between concurrent callers;
//  * a job is finished when every chunk has run (pending_ == 0); chunks are
//    claimed under mutex_ by advancing next_, so they never overlap;
//  * a nested parallelFor (called from inside a chunk of this pool) runs
//    inline: waiting for the pool from inside the pool would deadlock;
//  * an exception thrown by a chunk on a worker is carried back to the caller
//    and rethrown there after the job finished (never std::terminate).
#include "forge/runtime/ThreadPool.h"

#include <algorithm>
#include <exception>

namespace forge::rt {

namespace {
// The pool whose chunk the current thread is running (nullptr outside).
thread_local const ThreadPool *tlsActivePool = nullptr;

struct ActivePoolScope {
  const ThreadPool *saved;
  explicit ActivePoolScope(const ThreadPool *pool) : saved(tlsActivePool) { tlsActivePool = pool; }
  ~ActivePoolScope() { tlsActivePool = saved; }
};

// Per-call state of one parallelFor, reached through a one-pointer lambda so
// the std::function wrapping it stays in its small buffer (no allocation).
struct JobState {
  const std::function<void(int64_t, int64_t)> *fn;
  std::mutex errorMutex;
  std::exception_ptr error;
};
} // namespace

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  // The calling thread takes part in every job, so start one worker less.
  workers_.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i)
    workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

void ThreadPool::workerLoop() {
  ActivePoolScope scope(this);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || (job_ && next_ < jobSize_); });
    if (stop_)
      return;
    ++generation_;
    // Claim and run chunks until the current job has none left.
    while (job_ && next_ < jobSize_) {
      const auto *fn = job_;
      int64_t begin = next_;
      int64_t end = std::min(jobSize_, begin + chunk_);
      next_ = end;
      lock.unlock();
      (*fn)(begin, end); // never throws: parallelFor wraps the caller's fn
      lock.lock();
      if (--pending_ == 0)
        done_.notify_all();
    }
  }
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain || tlsActivePool == this) {
    fn(0, n);
    return;
  }

  // About four chunks per thread balances uneven chunks without making the
  // per-chunk locking visible; never smaller than the caller's grain.
  int64_t threads = static_cast<int64_t>(size());
  int64_t target = threads * 4;
  int64_t chunk = std::max(grain, (n + target - 1) / target);
  int64_t chunks = (n + chunk - 1) / chunk;

  JobState state;
  state.fn = &fn;
  JobState *statePtr = &state;
  const std::function<void(int64_t, int64_t)> wrapped = [statePtr](int64_t b, int64_t e) {
    try {
      (*statePtr->fn)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(statePtr->errorMutex);
      if (!statePtr->error)
        statePtr->error = std::current_exception();
    }
  };

  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return job_ == nullptr; });
  job_ = &wrapped;
  jobSize_ = n;
  chunk_ = chunk;
  next_ = 0;
  pending_ = chunks;
  wake_.notify_all();

  {
    // The caller runs chunks too, then waits for those the workers claimed.
    ActivePoolScope scope(this);
    while (next_ < jobSize_) {
      int64_t begin = next_;
      int64_t end = std::min(jobSize_, begin + chunk_);
      next_ = end;
      lock.unlock();
      wrapped(begin, end);
      lock.lock();
      --pending_;
    }
  }
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  lock.unlock();
  // Wake callers waiting to install the next job.
  done_.notify_all();

  if (state.error)
    std::rethrow_exception(state.error);
}

} // namespace forge::rt
