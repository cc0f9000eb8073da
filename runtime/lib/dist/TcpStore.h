// A small TCP key-value store for the rendezvous of a group (Collectives.h):
// rank 0 serves it, every rank (rank 0 too) is a client. Values are opaque
// bytes; get() waits until the key is set or the timeout passes.
//
// Invariants: the server answers each connection on its own thread until the
// peer closes it; a key is set once per rendezvous (a second set replaces
// it); no call blocks past its timeout (socket timeouts on every read).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "forge/runtime/Status.h"

namespace forge::rt::dist {

class TcpStoreServer {
public:
  /// Listens on `port` of every interface (0: any free port; see port()).
  static Expected<std::unique_ptr<TcpStoreServer>> start(int port);
  ~TcpStoreServer();
  int port() const { return port_; }

private:
  TcpStoreServer() = default;
  void acceptLoop();
  void serve(int fd);

  int listenFd_ = -1, port_ = 0;
  bool stopping_ = false;
  std::thread acceptor_;
  std::vector<std::thread> workers_;
  std::vector<int> clients_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
};

class TcpStoreClient {
public:
  /// Connects to host:port, retrying until `timeout` (the server's rank may
  /// start later).
  static Expected<std::unique_ptr<TcpStoreClient>> connect(const std::string &host, int port,
                                                           std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  Status set(const std::string &key, const std::vector<char> &value);
  /// Waits until `key` is set (at most the timeout given to connect()).
  Expected<std::vector<char>> get(const std::string &key);

private:
  TcpStoreClient() = default;
  int fd_ = -1;
  std::string where_;
  std::chrono::milliseconds timeout_{0};
  std::mutex mutex_; // one request at a time
};

} // namespace forge::rt::dist
