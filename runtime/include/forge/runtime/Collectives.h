// Collectives across ranks (../shared/DESIGN.md §7 "Multi-GPU"; forgec --dp): the
// communicator interface the all_reduce kernels call, the process-wide table
// of groups they find it in, and the rendezvous that connects a group.
//
// Invariants:
//  * Every rank of a group issues the same collectives in the same order (each
//    runs the same program): a Communicator never matches calls by name.
//  * A failed or timed-out collective returns an error naming the group, this
//    rank and what failed (a peer that closed its connection: the rank that
//    died); it never hangs past the group's timeout.
//  * The group table only holds pointers: forge-train owns the communicators
//    and clears the table before they go.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sums `count` f32 values at `data` over the group, in place: every rank
  /// gets the same sum.
  virtual Status allReduceSum(float *data, size_t count) = 0;
  /// The element-wise maximum over the group, in place (fp8 delayed
  /// scaling's amaxes: every rank scales by the same amax).
  virtual Status allReduceMax(float *data, size_t count) = 0;
  virtual Status barrier() = 0;
  /// Copies `bytes` bytes at `data` of rank `root` to every rank's `data`.
  virtual Status broadcast(void *data, size_t bytes, int root) = 0;
  /// Every rank's `bytes` bytes at `in`, in rank order, into each rank's `out`
  /// (size() * bytes).
  virtual Status allGather(const void *in, void *out, size_t bytes) = 0;
  /// Pipeline messages (forge.send / forge.recv): sends `bytes` bytes at
  /// `data` to rank `peer` of this group, where the recv of the same `tag`
  /// takes them. The bytes are copied before it returns (the caller may reuse
  /// them at once), and it does not wait for the receiver.
  virtual Status send(const void *data, size_t bytes, int peer, uint64_t tag) {
    (void)data, (void)bytes, (void)peer, (void)tag;
    return Status::error("{} has no point-to-point messages", describe());
  }
  /// Receives into `data` the `bytes` bytes of rank `peer`'s send of `tag`,
  /// waiting up to the group's timeout.
  virtual Status recv(void *data, size_t bytes, int peer, uint64_t tag) {
    (void)data, (void)bytes, (void)peer, (void)tag;
    return Status::error("{} has no point-to-point messages", describe());
  }
  /// A group of the ranks `ranks` of this one (ascending; this rank among them),
  /// named `name`: every rank of this group calls it at the same point, each with
  /// the list of its own subgroup (tensor parallelism's "tp" and "dp" groups of a
  /// D x T layout). The subgroup uses this group's connections to meet, so it must
  /// not outlive it.
  virtual Expected<std::unique_ptr<Communicator>> subgroup(const std::string &name,
                                                           const std::vector<int> &ranks) = 0;
  /// "gloo/tcp, rank 1 of 4".
  virtual std::string describe() const = 0;
};

/// The communicator of collective group `group` ("dp") in this process, set by
/// whoever connected it (nullptr clears it).
void setCollectiveGroup(const std::string &group, Communicator *comm);
/// nullptr when this process has none for `group`.
Communicator *collectiveGroup(const std::string &group);
/// The communicator a collective of `group` compiled for `size` ranks runs on
/// (the CPU kernels and the CUDA executor): nullptr for a group of one that
/// this process has none for (the identity); an error saying how to start the
/// ranks when this process is in no group of that size. `what` names the
/// bundle in messages.
Expected<Communicator *> communicatorFor(const std::string &group, int64_t size,
                                         const std::string &what);

/// Where the ranks of a group meet: the usual launcher environment
/// (torchrun, Slurm, mpirun set these; forge-train --nproc does too).
struct Rendezvous {
  int rank = 0, size = 1, localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

/// Rendezvous from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
/// (torchrun's names; without WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_* or
/// Slurm's SLURM_NTASKS/PROCID/LOCALID); nullopt when none is set (a single
/// process); an error when a value is malformed or missing. Under torchrun
/// (TORCHELASTIC_RUN_ID) the store takes MASTER_PORT + 1: torchrun's agent
/// already listens on MASTER_PORT.
Expected<std::optional<Rendezvous>> rendezvousFromEnvironment();

/// Connects the ranks of `r` into one CPU group (Gloo over TCP): rank 0 serves
/// a small TCP key-value store at MASTER_ADDR:MASTER_PORT, every rank publishes
/// its address there and connects to every other. Errors when this build has
/// no Gloo, or a rank does not arrive within r.timeout.
Expected<std::unique_ptr<Communicator>> connectCpuGroup(const Rendezvous &r);

} // namespace forge::rt
