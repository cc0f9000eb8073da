// libFuzzer target for the checkpoint reader (issue #18): any byte string given
// as a checkpoint of a small training bundle must be restored or refused with a
// Status, never crash, hang or change the executor's tensors when refused.
//
// The bundle is tests/unit's linear model (one PARAMETER `w`); each input is
// written to a file (readCheckpoint reads a path) and read into a fresh
// executor. Seeds: a valid checkpoint of that bundle (FuzzDriverMain-style
// seeding is not needed: the fuzzer's first input is the seed written by
// `FuzzCheckpointReader -runs=0 SEED_DIR` after FUZZ_SEED_DIR is set).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "../unit/TrainTestUtil.h"
#include "forge/runtime/Checkpoint.h"
#include "forge/runtime/CpuExecutor.h"

using namespace forge::rt;
using forge::rt::testing::makeLinearBundle;

namespace {
struct Fixture {
  std::unique_ptr<Bundle> bundle;
  std::unique_ptr<Executor> exec;
  std::string path;
  Fixture() {
    auto b = Bundle::fromBytes(makeLinearBundle().serialize(), "<fuzz bundle>");
    if (!b)
      std::abort();
    bundle = b.take();
    auto ex = CpuExecutor::create(*bundle, CpuExecutorOptions{1});
    if (!ex)
      std::abort();
    exec = ex.take();
    path = "/tmp/forge-fuzz-ckpt-" + std::to_string(::getpid()) + ".forgeckpt";
    // The seed: a valid checkpoint of this executor, where libFuzzer can find it.
    if (const char *dir = std::getenv("FUZZ_SEED_DIR")) {
      CheckpointState state;
      state.trainSamples = 12;
      state.samplesPerStep = 4;
      if (!writeCheckpoint(std::string(dir) + "/valid.forgeckpt", *exec, state).isOk())
        std::abort();
    }
  }
};
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Fixture f;
  {
    std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  }
  CheckpointError kind;
  auto state = readCheckpoint(f.path, *f.exec, &kind);
  if (!state) {
    volatile size_t n = state.status().message().size();
    (void)n;
  }
  return 0;
}
