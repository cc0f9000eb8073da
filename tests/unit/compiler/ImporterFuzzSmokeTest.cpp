//===- ImporterFuzzSmokeTest.cpp - the importer fuzz entry point in ctest ---===//
//
// Runs tests/fuzz/FuzzOnnxImporter.cpp's entry point over deterministic
// mutations (bit flips, truncations, byte splices, varint corruption) of real
// ONNX models, so CI exercises the importer's error paths without libFuzzer.
// The entry point aborts on a silent failure; a crash fails the test.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int forgeFuzzOnnxImporter(const uint8_t *data, size_t size);

namespace {

std::vector<uint8_t> readModel(const std::string &name) {
  std::ifstream in(std::string(FORGE_MODELS_DIR) + "/" + name, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void mutateAndImport(const std::vector<uint8_t> &seed, int iterations, uint32_t rngSeed) {
  ASSERT_FALSE(seed.empty());
  std::mt19937 rng(rngSeed);
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> bytes = seed;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
      case 0: bytes[pos] ^= uint8_t(1u << (rng() % 8)); break;            // bit flip
      case 1: bytes.resize(pos); break;                                    // truncate
      case 2: bytes[pos] = uint8_t(rng()); break;                          // random byte
      case 3: bytes.insert(bytes.begin() + pos, 0xff); break;              // varint poison
      }
    }
    forgeFuzzOnnxImporter(bytes.data(), bytes.size());
  }
}

TEST(ImporterFuzzSmoke, MutatedCnnNeverCrashes) { mutateAndImport(readModel("cnn.onnx"), 1000, 1); }
TEST(ImporterFuzzSmoke, MutatedGptNeverCrashes) { mutateAndImport(readModel("gpt.onnx"), 500, 2); }

TEST(ImporterFuzzSmoke, GarbageNeverCrashes) {
  std::mt19937 rng(3);
  for (int it = 0; it < 300; ++it) {
    std::vector<uint8_t> bytes(rng() % 256);
    for (auto &b : bytes)
      b = uint8_t(rng());
    forgeFuzzOnnxImporter(bytes.data(), bytes.size());
  }
}

} // namespace
