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

} // namespace forge::rt
