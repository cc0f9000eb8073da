// Writes the hand-built training bundles of TrainTestUtil.h to a directory,
// for the forge-train CLI test (forge_train_cli_test.py):
//   linear.forge        makeLinearBundle() (x [4,3], y [4,1], eval batch 5)
//   linear_other.forge  the same model under another source hash
//   linear_k2.forge     2 micro-batches of 2
//   linear_grads.forge  linear.forge plus the output forge.grad.w
#include <cstdio>
#include <string>

#include "TrainTestUtil.h"

using namespace forge::rt;
using namespace forge::rt::testing;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  LinearSpec other;
  other.sourceHash = "another-model";
  LinearSpec k2;
  k2.batch = 2;
  k2.micro = 2;
  LinearSpec grads;
  grads.exposeGradient = true;
  for (auto [name, spec] : {std::pair<const char *, LinearSpec>{"linear", LinearSpec{}},
                            {"linear_other", other},
                            {"linear_k2", k2},
                            {"linear_grads", grads}}) {
    BundleWriter w = makeLinearBundle(spec);
    Status s = w.writeFile(dir + "/" + name + ".forge");
    if (!s.isOk()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
  }
  return 0;
}
