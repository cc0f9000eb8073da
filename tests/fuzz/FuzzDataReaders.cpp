// libFuzzer target for the data readers (issue #18): any byte string given as a
// .npy or an .npz file must give arrays or an error Status, never a crash, hang,
// leak or an allocation beyond what the bytes can justify.
//
// Both parsers run on every input (an .npz is a zip of .npy members; a mutated
// member header reaches parseNpy through the zip reader too). With
// FUZZ_WRITE_SEEDS the seeds are small valid files of every dtype family.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "forge/runtime/Npy.h"

using namespace forge::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  auto npy = parseNpy(bytes, "<fuzz.npy>");
  if (!npy) {
    volatile size_t n = npy.status().message().size(); // a well-formed message
    (void)n;
  } else {
    volatile size_t n = npy->bytes.size();
    (void)n;
  }
  auto npz = parseNpz(bytes, "<fuzz.npz>");
  if (!npz) {
    volatile size_t n = npz.status().message().size();
    (void)n;
  } else {
    for (const auto &[name, t] : *npz) {
      volatile size_t n = name.size() + t.bytes.size();
      (void)n;
    }
  }
  return 0;
}
