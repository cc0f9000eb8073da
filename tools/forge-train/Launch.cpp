// forge-train --nproc N: starts N ranks of this same command on this host
// (docs/multi-gpu.md), as torchrun does: each child gets RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT,
// and the command line without --nproc.
//
// Invariants: the launcher returns only when every child has ended; when one
// fails (non-zero status or a signal), the others get SIGTERM at once and
// SIGKILL after a grace period, and the launcher's status is the first
// failure's, named with its rank. No child outlives the launcher. Ctrl-C or
// SIGTERM to the launcher reaches every rank as SIGINT (a terminal's Ctrl-C
// also reaches them directly): the ranks agree on the step to stop after,
// write their checkpoint and exit 130, which is no failure; the launcher
// then exits 130.
#include "Launch.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace forge::train {

namespace {

/// A TCP port nobody listens on now (rank 0's store takes it moments later).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 29500;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status))
    return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "ended";
}

std::atomic<bool> gLauncherInterrupted{false};
extern "C" void onLauncherInterrupt(int) { gLauncherInterrupted = true; }

} // namespace

int launchRanks(int nproc, const std::vector<std::string> &args) {
  // Forwarded to the ranks from the wait loop below (not from the handler).
  struct sigaction sa {};
  sa.sa_handler = onLauncherInterrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; // no SA_RESTART: waitpid returns EINTR
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  bool forwarded = false;
  const int port = freePort();
  std::vector<pid_t> pids(static_cast<size_t>(nproc), -1);
  std::vector<std::string> keep; // environment of the children, minus what we set
  const std::initializer_list<const char *> ours = {"RANK=",     "WORLD_SIZE=",
                                                     "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                                                     "MASTER_ADDR=", "MASTER_PORT="};
  for (char **e = environ; *e; ++e) {
    std::string kv = *e;
    if (std::none_of(ours.begin(), ours.end(),
                     [&](const char *name) { return kv.rfind(name, 0) == 0; }))
      keep.push_back(kv);
  }
  int running = 0;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env = keep;
    env.push_back(fmt::format("RANK={}", r));
    env.push_back(fmt::format("LOCAL_RANK={}", r));
    env.push_back(fmt::format("WORLD_SIZE={}", nproc));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back(fmt::format("MASTER_PORT={}", port));
    std::vector<char *> envp, argv;
    for (std::string &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> a = args;
    for (std::string &s : a)
      argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid;
    int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      fmt::print(stderr, "forge-train: error: cannot start rank {}: {}\n", r, std::strerror(rc));
      for (pid_t p : pids)
        if (p > 0)
          ::kill(p, SIGTERM);
      break;
    }
    pids[static_cast<size_t>(r)] = pid;
    ++running;
  }
  // The rank of an ended child (its slot cleared, one fewer running), or -1.
  auto reaped = [&](pid_t pid) {
    for (size_t i = 0; i < pids.size(); ++i)
      if (pids[i] == pid) {
        pids[i] = -1;
        --running;
        return static_cast<int>(i);
      }
    return -1;
  };
  int result = running == nproc ? 0 : 1;
  bool stopping = running != nproc;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (gLauncherInterrupted && !forwarded) {
      forwarded = true;
      for (pid_t p : pids)
        if (p > 0)
          ::kill(p, SIGINT);
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    if (pid == 0) { // stopping: the others still run
      if (std::chrono::steady_clock::now() > deadline)
        for (pid_t p : pids)
          if (p > 0)
            ::kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int rank = reaped(pid);
    if (rank < 0)
      continue;
    // 130: the rank was interrupted and stopped with the others after the step they
    // agreed on. Not a failure; the rest are given a grace period to do the same.
    if (WIFEXITED(status) && WEXITSTATUS(status) == 130) {
      if (result == 0)
        result = 130;
      if (!stopping && running > 0) {
        stopping = true;
        deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      }
      continue;
    }
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && result == 0) {
      // The first failure reported may be another's consequence: with rank 1
      // killed, rank 0 exits on the closed connection, and when both have
      // ended waitpid may report rank 0 first. Of the ranks ended by now, the
      // one named is one killed from outside (a crash signal such as SIGABRT
      // or SIGPIPE may itself follow a peer's end); the others are listed.
      auto killedFromOutside = [](int st) {
        if (!WIFSIGNALED(st))
          return false;
        int sig = WTERMSIG(st);
        return sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
      };
      std::vector<std::pair<int, int>> others; // (rank, status) of other failures
      for (int other = 0;;) {
        pid_t p = ::waitpid(-1, &other, WNOHANG);
        if (p <= 0)
          break;
        int r = reaped(p);
        if (r < 0 || (WIFEXITED(other) && (WEXITSTATUS(other) == 0 || WEXITSTATUS(other) == 130)))
          continue;
        if (killedFromOutside(other) && !killedFromOutside(status)) {
          others.push_back({rank, status});
          rank = r, status = other;
        } else {
          others.push_back({r, other});
        }
      }
      std::string also;
      for (auto [r, st] : others)
        also += fmt::format("; rank {} {}", r, describeStatus(st));
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (running > 0)
        fmt::print(stderr, "forge-train: rank {} of {} {}{}; stopping the other rank{}\n", rank,
                   nproc, describeStatus(status), also, running > 1 ? "s" : "");
      else
        fmt::print(stderr, "forge-train: rank {} of {} {}{}\n", rank, nproc, describeStatus(status),
                   also);
      stopping = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (pid_t p : pids)
        if (p > 0)
          ::kill(p, SIGTERM);
    }
  }
  return result;
}

} // namespace forge::train
