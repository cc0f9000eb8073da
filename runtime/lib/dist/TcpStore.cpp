// TcpStore.h. Wire format, per request: one byte ('S' set, 'G' get), a u32
// key length and the key; a set then a u32 value length and the value, and
// the server answers one byte; a get is answered, once the key exists, with
// a u32 length and the value. Integers are little-endian.
#include "TcpStore.h"

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace forge::rt::dist {

namespace {

constexpr uint32_t kMaxBytes = 64u << 20; // a key or value (addresses are ~100 bytes)

bool writeAll(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool readAll(int fd, void *data, size_t n) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool writeU32(int fd, uint32_t v) {
  unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                        static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
  return writeAll(fd, b, 4);
}

bool readU32(int fd, uint32_t &v) {
  unsigned char b[4];
  if (!readAll(fd, b, 4))
    return false;
  v = b[0] | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
  return true;
}

bool readBytes(int fd, std::vector<char> &out) {
  uint32_t n;
  if (!readU32(fd, n) || n > kMaxBytes)
    return false;
  out.resize(n);
  return n == 0 || readAll(fd, out.data(), n);
}

} // namespace

Expected<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(int port) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->listenFd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  bool v6 = s->listenFd_ >= 0;
  if (!v6)
    s->listenFd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s->listenFd_ < 0)
    return Status::error("rendezvous store: socket(): {}", std::strerror(errno));
  int one = 1, zero = 0;
  ::setsockopt(s->listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s->listenFd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); // IPv4 too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s->listenFd_, reinterpret_cast<sockaddr *>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s->listenFd_, reinterpret_cast<sockaddr *>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(s->listenFd_, 128) != 0)
    return Status::error("rendezvous store: cannot listen on port {} (MASTER_PORT): {}", port,
                         std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(s->listenFd_, reinterpret_cast<sockaddr *>(&bound), &len);
  s->port_ = ntohs(bound.ss_family == AF_INET6
                       ? reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port
                       : reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
  s->acceptor_ = std::thread(&TcpStoreServer::acceptLoop, s.get());
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (int fd : clients_)
      ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  ::shutdown(listenFd_, SHUT_RDWR);
  ::close(listenFd_);
  if (acceptor_.joinable())
    acceptor_.join();
  for (std::thread &t : workers_)
    t.join();
  for (int fd : clients_)
    ::close(fd);
}

void TcpStoreServer::acceptLoop() {
  for (;;) {
    int fd = ::accept(listenFd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR)
        continue;
      return; // shut down
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    workers_.emplace_back(&TcpStoreServer::serve, this, fd);
  }
}

void TcpStoreServer::serve(int fd) {
  for (;;) {
    char op;
    std::vector<char> key, value;
    if (!readAll(fd, &op, 1) || !readBytes(fd, key))
      return;
    std::string k(key.begin(), key.end());
    if (op == 'S') {
      if (!readBytes(fd, value))
        return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        data_[k] = std::move(value);
      }
      changed_.notify_all();
      char ack = 1;
      if (!writeAll(fd, &ack, 1))
        return;
    } else if (op == 'G') {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || data_.count(k); });
      if (stopping_)
        return;
      value = data_[k];
      lock.unlock();
      if (!writeU32(fd, static_cast<uint32_t>(value.size())) ||
          (!value.empty() && !writeAll(fd, value.data(), value.size())))
        return;
    } else {
      return; // not a store client
    }
  }
}

Expected<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(
    const std::string &host, int port, std::chrono::milliseconds timeout) {
  std::unique_ptr<TcpStoreClient> c(new TcpStoreClient());
  c->where_ = host + ":" + std::to_string(port);
  c->timeout_ = timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no attempt";
  while (true) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (gai != 0) {
      last = ::gai_strerror(gai);
    } else {
      for (addrinfo *a = found; a && c->fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0)
          continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          c->fd_ = fd;
        } else {
          last = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(found);
    }
    if (c->fd_ >= 0)
      break;
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::error("rendezvous: cannot reach the store of rank 0 at {} (MASTER_ADDR:"
                           "MASTER_PORT) within {} s: {}",
                           c->where_, timeout.count() / 1000.0, last);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(c->fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(c->fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(c->fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return c;
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0)
    ::close(fd_);
}

Status TcpStoreClient::set(const std::string &key, const std::vector<char> &value) {
  std::lock_guard<std::mutex> lock(mutex_);
  char op = 'S', ack = 0;
  if (!writeAll(fd_, &op, 1) || !writeU32(fd_, static_cast<uint32_t>(key.size())) ||
      !writeAll(fd_, key.data(), key.size()) ||
      !writeU32(fd_, static_cast<uint32_t>(value.size())) ||
      (!value.empty() && !writeAll(fd_, value.data(), value.size())) || !readAll(fd_, &ack, 1))
    return Status::error("rendezvous store at {}: setting '{}' failed: {}", where_, key,
                         errno ? std::strerror(errno) : "connection closed");
  return Status::ok();
}

Expected<std::vector<char>> TcpStoreClient::get(const std::string &key) {
  std::lock_guard<std::mutex> lock(mutex_);
  char op = 'G';
  std::vector<char> value;
  errno = 0;
  if (!writeAll(fd_, &op, 1) || !writeU32(fd_, static_cast<uint32_t>(key.size())) ||
      !writeAll(fd_, key.data(), key.size()) || !readBytes(fd_, value)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return Status::error("rendezvous store at {}: '{}' was not set within {} s (a rank did "
                           "not arrive?)",
                           where_, key, timeout_.count() / 1000.0);
    return Status::error("rendezvous store at {}: getting '{}' failed: {}", where_, key,
                         errno ? std::strerror(errno) : "connection closed");
  }
  return value;
}

} // namespace forge::rt::dist
