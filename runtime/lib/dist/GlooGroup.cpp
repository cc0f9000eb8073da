// CPU collective groups over Gloo's TCP transport (Collectives.h), with the
// rendezvous through TcpStore.h: the CPU ranks that CI trains data-parallel
// bundles on, and the same bootstrap NCCL's unique id will take.
#include "forge/runtime/Collectives.h"

#include <algorithm>
#include <deque>
#include <cstdlib>
#include <cstring>

#include "TcpStore.h"

#include <fmt/ranges.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

namespace forge::rt {

namespace {

/// Gloo's rendezvous store over the TCP store client (Gloo reports failures by
/// throwing; connectCpuGroup catches them).
class StoreAdapter final : public gloo::rendezvous::Store {
public:
  explicit StoreAdapter(dist::TcpStoreClient &client) : client_(client) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    Status s = client_.set(key, data);
    if (!s.isOk())
      throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string &key) override {
    auto v = client_.get(key);
    if (!v)
      throw std::runtime_error(v.status().message());
    return v.take();
  }
  void wait(const std::vector<std::string> &keys) override {
    for (const std::string &k : keys)
      (void)get(k);
  }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
    wait(keys); // the client's socket timeout bounds each get
  }

private:
  dist::TcpStoreClient &client_;
};

class GlooGroup final : public Communicator {
public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return label_.empty() ? fmt::format("gloo/tcp, rank {} of {}", rank_, size_)
                          : fmt::format("gloo/tcp, {}, rank {} of {}", label_, rank_, size_);
  }

  Status allReduceSum(float *data, size_t count) override {
    return allReduce(data, count, static_cast<ReduceFn>(&gloo::sum<float>));
  }

  Status allReduceMax(float *data, size_t count) override {
    return allReduce(data, count, static_cast<ReduceFn>(&gloo::max<float>));
  }

  using ReduceFn = void (*)(void *, const void *, const void *, size_t);
  Status allReduce(float *data, size_t count, ReduceFn reduce) {
    if (count == 0)
      return Status::ok();
    try {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(reduce);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    } catch (const std::exception &e) {
      return Status::error("all_reduce of {} values (rank {} of {}) failed: {} (another rank "
                           "stopped, or did not arrive within {} s)",
                           count, rank_, size_, e.what(), timeout_.count() / 1000.0);
    }
    return Status::ok();
  }

  Status broadcast(void *data, size_t bytes, int root) override {
    try {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t *>(data), bytes);
      opts.setRoot(root);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    } catch (const std::exception &e) {
      return Status::error("broadcast of {} bytes from rank {} (rank {} of {}) failed: {}", bytes,
                           root, rank_, size_, e.what());
    }
    return Status::ok();
  }

  Status allGather(const void *in, void *out, size_t bytes) override {
    if (bytes == 0)
      return Status::ok();
    try {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)), bytes);
      opts.setOutput(static_cast<uint8_t *>(out), bytes * static_cast<size_t>(size_));
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    } catch (const std::exception &e) {
      return Status::error("all_gather of {} bytes (rank {} of {}) failed: {} (another rank "
                           "stopped, or did not arrive within {} s)",
                           bytes, rank_, size_, e.what(), timeout_.count() / 1000.0);
    }
    return Status::ok();
  }

  ~GlooGroup() override {
    // Messages still in flight (the last step's) go before the context does.
    while (!pending_.empty()) {
      try {
        pending_.front().buffer->waitSend(nullptr, timeout_);
      } catch (const std::exception &) {
      }
      pending_.pop_front();
    }
  }

  Status send(const void *data, size_t bytes, int peer, uint64_t tag) override {
    if (bytes == 0)
      return Status::ok(); // the receiver expects none either (same shape)
    try {
      // A bounded number in flight: waiting for the oldest cannot deadlock,
      // as its receiver takes this rank's messages in the order they are sent.
      while (pending_.size() >= kMaxPendingSends) {
        pending_.front().buffer->waitSend(nullptr, timeout_);
        pending_.pop_front();
      }
      PendingSend p;
      p.bytes.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + bytes);
      p.buffer = context_->createUnboundBuffer(p.bytes.data(), bytes);
      p.buffer->send(peer, messageSlot(tag));
      pending_.push_back(std::move(p));
    } catch (const std::exception &e) {
      return Status::error("send of {} bytes (tag {}) to rank {} (rank {} of {}) failed: {}",
                           bytes, tag, peer, rank_, size_, e.what());
    }
    return Status::ok();
  }

  Status recv(void *data, size_t bytes, int peer, uint64_t tag) override {
    if (bytes == 0)
      return Status::ok();
    try {
      auto buffer = context_->createUnboundBuffer(data, bytes);
      buffer->recv(peer, messageSlot(tag));
      buffer->waitRecv(nullptr, timeout_);
    } catch (const std::exception &e) {
      return Status::error("recv of {} bytes (tag {}) from rank {} (rank {} of {}) failed: {} "
                           "(rank {} stopped, or did not send within {} s)",
                           bytes, tag, peer, rank_, size_, e.what(), peer,
                           timeout_.count() / 1000.0);
    }
    return Status::ok();
  }

  Expected<std::unique_ptr<Communicator>> subgroup(const std::string &name,
                                                   const std::vector<int> &ranks) override {
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    if (me == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end()) ||
        ranks.front() < 0 || ranks.back() >= size_)
      return Status::error("subgroup '{}' of ranks [{}] is not an ascending list of ranks of "
                           "this group of {} that holds rank {}",
                           name, fmt::join(ranks, ", "), size_, rank_);
    auto g = std::make_unique<GlooGroup>();
    g->rank_ = static_cast<int>(me - ranks.begin());
    g->size_ = static_cast<int>(ranks.size());
    g->timeout_ = timeout_;
    g->device_ = device_;
    g->label_ = fmt::format("{} ranks [{}]", name, fmt::join(ranks, ", "));
    try {
      g->context_ = std::make_shared<gloo::rendezvous::Context>(g->rank_, g->size_);
      g->context_->setTimeout(timeout_);
      StoreAdapter store(*root().client_);
      // The subgroup's own keys: its name and first rank tell the groups apart.
      gloo::rendezvous::PrefixStore prefixed(fmt::format("{}/{}", name, ranks.front()), store);
      g->context_->connectFullMesh(prefixed, device_);
    } catch (const std::exception &e) {
      return Status::error("connecting subgroup {} (rank {} of {}): {}", g->label_, rank_,
                           size_, e.what());
    }
    g->parent_ = &root();
    return std::unique_ptr<Communicator>(std::move(g));
  }

  Status barrier() override {
    try {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    } catch (const std::exception &e) {
      return Status::error("barrier (rank {} of {}) failed: {}", rank_, size_, e.what());
    }
    return Status::ok();
  }

  /// The group whose store this one's subgroups meet through.
  GlooGroup &root() { return parent_ ? *parent_ : *this; }

  /// Point-to-point slots apart from the collectives' (Gloo's prefixes 1-8).
  static uint64_t messageSlot(uint64_t tag) { return gloo::Slot::build(0x70, static_cast<uint32_t>(tag)); }
  static constexpr size_t kMaxPendingSends = 256;
  struct PendingSend {
    std::vector<uint8_t> bytes; // the staged copy the transport reads
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  std::deque<PendingSend> pending_;

  int rank_ = 0, size_ = 1;
  uint32_t tag_ = 1;
  std::string label_;             // a subgroup's name and ranks
  GlooGroup *parent_ = nullptr;   // a subgroup's world group
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<dist::TcpStoreServer> server_; // rank 0
  std::unique_ptr<dist::TcpStoreClient> client_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

Expected<int> envInt(const char *name, bool required, int fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      return Status::error("{} is not set (with WORLD_SIZE, a launcher sets RANK, "
                           "MASTER_ADDR and MASTER_PORT too)",
                           name);
    return fallback;
  }
  char *end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (errno || end == v || *end || n < 0 || n > 1 << 24)
    return Status::error("{}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(n);
}

bool isLoopback(const std::string &host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

} // namespace

Expected<std::optional<Rendezvous>> rendezvousFromEnvironment() {
  // torchrun (and forge-train --nproc) set WORLD_SIZE/RANK/LOCAL_RANK; mpirun (Open MPI)
  // and srun (Slurm) set their own names, taken when WORLD_SIZE is absent.
  struct Names {
    const char *size, *rank, *local;
  };
  const Names launchers[] = {{"WORLD_SIZE", "RANK", "LOCAL_RANK"},
                             {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_LOCAL_RANK"},
                             {"SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"}};
  const Names *names = nullptr;
  for (const Names &n : launchers)
    if (const char *v = std::getenv(n.size); v && *v) {
      names = &n;
      break;
    }
  if (!names)
    return std::optional<Rendezvous>();
  Rendezvous r;
  auto size = envInt(names->size, true, 1);
  if (!size)
    return size.status();
  if (*size < 1)
    return Status::error("{}={} must be at least 1", names->size, *size);
  r.size = *size;
  auto rank = envInt(names->rank, r.size > 1, 0);
  if (!rank)
    return rank.status();
  if (*rank >= r.size)
    return Status::error("{}={} is not below {}={}", names->rank, *rank, names->size, r.size);
  r.rank = *rank;
  auto local = envInt(names->local, false, r.rank);
  if (!local)
    return local.status();
  r.localRank = *local;
  if (const char *addr = std::getenv("MASTER_ADDR"); addr && *addr)
    r.masterAddr = addr;
  else if (r.size > 1)
    return Status::error("MASTER_ADDR is not set (the host of rank 0)");
  auto port = envInt("MASTER_PORT", r.size > 1, 29500);
  if (!port)
    return port.status();
  if (*port < 1 || *port > 65535)
    return Status::error("MASTER_PORT={} is not a TCP port", *port);
  r.masterPort = *port;
  // Under torchrun, its agent's own store listens on MASTER_PORT: ours takes the next port.
  if (const char *run = std::getenv("TORCHELASTIC_RUN_ID"); run && *run)
    r.masterPort = *port < 65535 ? *port + 1 : *port - 1;
  return std::optional<Rendezvous>(r);
}

Expected<std::unique_ptr<Communicator>> connectCpuGroup(const Rendezvous &r) {
  auto g = std::make_unique<GlooGroup>();
  g->rank_ = r.rank;
  g->size_ = r.size;
  g->timeout_ = r.timeout;
  if (r.rank == 0) {
    auto server = dist::TcpStoreServer::start(r.masterPort);
    if (!server)
      return server.status();
    g->server_ = server.take();
  }
  auto client = dist::TcpStoreClient::connect(r.masterAddr, r.masterPort, r.timeout);
  if (!client)
    return client.status();
  g->client_ = client.take();
  try {
    gloo::transport::tcp::attr attr;
    // One host: the loopback interface. Several: this host's name, or the
    // interface named by GLOO_SOCKET_IFNAME (as PyTorch's Gloo backend).
    if (const char *iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface)
      attr.iface = iface;
    else if (isLoopback(r.masterAddr))
      attr.hostname = "127.0.0.1";
    g->device_ = gloo::transport::tcp::CreateDevice(attr);
    g->context_ = std::make_shared<gloo::rendezvous::Context>(r.rank, r.size);
    g->context_->setTimeout(r.timeout);
    StoreAdapter store(*g->client_);
    g->context_->connectFullMesh(store, g->device_);
  } catch (const std::exception &e) {
    return Status::error("connecting rank {} of {} through {}:{}: {}", r.rank, r.size,
                         r.masterAddr, r.masterPort, e.what());
  }
  return std::unique_ptr<Communicator>(std::move(g));
}

} // namespace forge::rt
