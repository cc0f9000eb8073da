// The process-wide table of collective groups (Collectives.h), and the CPU
// all_reduce kernel that uses it (registered with the CPU kernels).
#include "forge/runtime/Collectives.h"

#include <map>
#include <mutex>

namespace forge::rt {

namespace {
std::mutex &groupsMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Communicator *> &groups() {
  static std::map<std::string, Communicator *> g;
  return g;
}
} // namespace

void setCollectiveGroup(const std::string &group, Communicator *comm) {
  std::lock_guard<std::mutex> lock(groupsMutex());
  if (comm)
    groups()[group] = comm;
  else
    groups().erase(group);
}

Communicator *collectiveGroup(const std::string &group) {
  std::lock_guard<std::mutex> lock(groupsMutex());
  auto it = groups().find(group);
  return it == groups().end() ? nullptr : it->second;
}

Expected<Communicator *> communicatorFor(const std::string &group, int64_t size,
                                         const std::string &what) {
  Communicator *comm = collectiveGroup(group);
  const bool tp = group == "tp", pp = group == "pp";
  const char *kind = tp ? "tensor-parallel" : pp ? "pipeline-parallel" : "data-parallel";
  const char *flag = tp ? "--tp" : pp ? "--pp" : "--dp";
  if (!comm && size != 1)
    return Status::error("{} was compiled for {} {} ranks (forgec {} {}), but this process is not "
                         "one of a group '{}': start it with forge-train --nproc {} (or RANK/"
                         "WORLD_SIZE from a launcher)",
                         what, size, kind, flag, size, group,
                         tp ? fmt::format("D x {} with --dp D", size) : std::to_string(size));
  if (comm && comm->size() != size)
    return Status::error("group '{}' has {} ranks, {} was compiled for {} (forgec {})", group,
                         comm->size(), what, size, flag);
  return comm;
}

} // namespace forge::rt
