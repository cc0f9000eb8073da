// Bundle writer/loader: round trip, and that every kind of damage (truncation,
// header fields, checksums, bad references) is an error naming the problem,
// never a crash.
#include "forge/runtime/Bundle.h"
#include "BundleTestUtil.h"

#include <cstring>
#include <fstream>

#include <gtest/gtest.h>
#include <zlib.h>

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fb = forge::bundle;

namespace {

/// x[2,3] (input) @ w[3,2] (constant) -> y[2,2] (output), plus a second section.
BundleWriter makeWriter() {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cpu");
  p.set_producer("BundleTest");
  (*p.mutable_build_options())["batch"] = "2";
  uint32_t weights = w.addSection("weights", floatBytes({1, 2, 3, 4, 5, 6}));
  std::vector<uint8_t> aux(100);
  for (size_t i = 0; i < aux.size(); ++i)
    aux[i] = static_cast<uint8_t>(i * 7);
  w.addSection("aux", aux);
  addTensor(p, "x", fb::TensorInfo::INPUT, {2, 3}, 0);
  fb::TensorInfo *wt = p.mutable_tensors(addTensor(p, "w", fb::TensorInfo::CONSTANT, {3, 2}));
  wt->set_section(weights);
  wt->set_data_offset(0);
  wt->set_data_size(24);
  addTensor(p, "y", fb::TensorInfo::OUTPUT, {2, 2}, 64);
  p.set_arena_size(128);
  fb::Routine *r = p.add_routines();
  r->set_name("forward");
  fb::Instruction *inst = r->add_instructions();
  inst->set_op("matmul");
  inst->set_name("node0");
  inst->add_inputs(0);
  inst->add_inputs(1);
  inst->add_outputs(2);
  (*inst->mutable_attrs())["alpha"].set_f(1.0);
  r->add_inputs(0);
  r->add_outputs(2);
  return w;
}

std::vector<uint8_t> validBytes() { return makeWriter().serialize(); }

BundleHeader headerOf(const std::vector<uint8_t> &b) {
  BundleHeader h;
  std::memcpy(&h, b.data(), sizeof(h));
  return h;
}

void setHeader(std::vector<uint8_t> &b, const BundleHeader &h) {
  std::memcpy(b.data(), &h, sizeof(h));
}

uint32_t crcOf(const uint8_t *p, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), p, static_cast<uInt>(n)));
}

/// fromBytes must fail and its message must contain `needle`.
void expectError(std::vector<uint8_t> bytes, const std::string &needle) {
  auto b = Bundle::fromBytes(std::move(bytes), "test.forge");
  ASSERT_FALSE(b.isOk()) << "expected an error containing: " << needle;
  std::string msg = b.status().message();
  EXPECT_EQ(msg.rfind("test.forge: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
}

/// Applies `mutate` to the program of a fresh writer and expects an error.
template <typename F> void expectProgramError(F mutate, const std::string &needle) {
  BundleWriter w = makeWriter();
  mutate(w.program());
  expectError(w.serialize(), needle);
}

std::string tempPath(const std::string &name) { return ::testing::TempDir() + name; }

} // namespace

TEST(BundleTest, RoundTripInMemory) {
  BundleWriter w = makeWriter();
  std::vector<uint8_t> bytes = w.serialize();
  BundleHeader h = headerOf(bytes);
  EXPECT_EQ(h.formatVersion, kBundleFormatVersion);
  EXPECT_EQ(h.dataOffset % kSectionAlignment, 0u);
  EXPECT_EQ(h.fileSize, bytes.size());

  auto b = Bundle::fromBytes(bytes, "mem");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ((*b)->origin(), "mem");
  EXPECT_EQ((*b)->program().SerializeAsString(), w.program().SerializeAsString());
  ASSERT_EQ((*b)->program().sections_size(), 2);
  std::span<const uint8_t> s0 = (*b)->section(0);
  EXPECT_EQ(std::vector<uint8_t>(s0.begin(), s0.end()), floatBytes({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ((*b)->section(1).size(), 100u);
  EXPECT_EQ((*b)->section(1)[99], static_cast<uint8_t>(99 * 7));
  EXPECT_EQ((*b)->program().sections(1).offset() % kSectionAlignment, 0u);
  EXPECT_TRUE((*b)->section(2).empty());
  std::span<const uint8_t> wd = (*b)->tensorData((*b)->program().tensors(1));
  ASSERT_EQ(wd.size(), 24u);
  float f[6];
  std::memcpy(f, wd.data(), 24);
  EXPECT_EQ(f[5], 6.0f);
  // Arena tensors have no data in the file.
  EXPECT_TRUE((*b)->tensorData((*b)->program().tensors(0)).empty());
}

TEST(BundleTest, SerializationIsDeterministic) { EXPECT_EQ(validBytes(), validBytes()); }

TEST(BundleTest, EmptyProgramRoundTrips) {
  BundleWriter w;
  auto b = Bundle::fromBytes(w.serialize());
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ((*b)->program().tensors_size(), 0);
}

TEST(BundleTest, WriteFileAndOpenMapped) {
  std::string path = tempPath("bundle_roundtrip.forge");
  BundleWriter w = makeWriter();
  ASSERT_TRUE(w.writeFile(path).isOk());
  auto b = Bundle::open(path);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ((*b)->origin(), path);
  EXPECT_EQ((*b)->program().target(), "cpu");
  EXPECT_EQ((*b)->section(0).size(), 24u);
  // Overwriting goes through a temporary + rename; the result is complete.
  ASSERT_TRUE(w.writeFile(path).isOk());
  EXPECT_TRUE(Bundle::open(path).isOk());
}

TEST(BundleTest, WriteFileToMissingDirectoryFails) {
  BundleWriter w = makeWriter();
  Status s = w.writeFile("/nonexistent-dir/x.forge");
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("/nonexistent-dir/x.forge"), std::string::npos);
}

TEST(BundleTest, OpenErrors) {
  auto missing = Bundle::open(tempPath("does_not_exist.forge"));
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);

  auto dir = Bundle::open(::testing::TempDir());
  ASSERT_FALSE(dir.isOk());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos);

  std::string empty = tempPath("empty.forge");
  std::ofstream(empty).close();
  auto e = Bundle::open(empty);
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("bad magic"), std::string::npos);

  std::string foreign = tempPath("foreign.forge");
  std::ofstream(foreign) << "PK\x03\x04 this is a zip file, not a bundle";
  auto f = Bundle::open(foreign);
  ASSERT_FALSE(f.isOk());
  EXPECT_NE(f.status().message().find("not a forge bundle"), std::string::npos);

  // A bundle truncated on disk (open maps it; the size check catches it).
  std::string trunc = tempPath("trunc.forge");
  std::vector<uint8_t> bytes = validBytes();
  std::ofstream(trunc, std::ios::binary)
      .write(reinterpret_cast<const char *>(bytes.data()), bytes.size() - 10);
  auto t = Bundle::open(trunc);
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("truncated"), std::string::npos);
}

TEST(BundleTest, EveryTruncationIsAnError) {
  std::vector<uint8_t> bytes = validBytes();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    auto b = Bundle::fromBytes(std::move(prefix), "test.forge");
    ASSERT_FALSE(b.isOk()) << "prefix of " << n << " bytes was accepted";
    EXPECT_FALSE(b.status().message().empty());
  }
  // Trailing garbage is refused as well.
  bytes.push_back(0);
  expectError(bytes, "size mismatch");
}

TEST(BundleTest, HeaderFieldsAreChecked) {
  const std::vector<uint8_t> good = validBytes();
  const BundleHeader h0 = headerOf(good);
  auto withHeader = [&](auto mutate) {
    std::vector<uint8_t> b = good;
    BundleHeader h = h0;
    mutate(h);
    setHeader(b, h);
    return b;
  };
  {
    std::vector<uint8_t> b = good;
    b[3] ^= 0x20;
    expectError(b, "bad magic");
  }
  expectError(withHeader([](BundleHeader &h) { h.formatVersion = 0; }), "formatVersion");
  const std::string supported = "supports (" + std::to_string(kOldestBundleFormatVersion) + ".." +
                                std::to_string(kBundleFormatVersion) + ")";
  expectError(withHeader([](BundleHeader &h) { h.formatVersion = kBundleFormatVersion + 1; }),
              "bundle format version " + std::to_string(kBundleFormatVersion + 1) +
                  " is newer than this forge-train " + supported);
  expectError(withHeader([](BundleHeader &h) { h.formatVersion = 1; }),
              "bundle format version 1 is older than this forge-train " + supported +
                  "; recompile the model with this forgec");
  expectError(withHeader([](BundleHeader &h) { h.headerSize = 32; }), "headerSize");
  expectError(withHeader([](BundleHeader &h) { h.headerSize = 0xFFFFFFFF; }), "headerSize");
  expectError(withHeader([](BundleHeader &h) { h.fileSize += 1; }), "fileSize");
  expectError(withHeader([](BundleHeader &h) { h.fileSize = ~0ull; }), "fileSize");
  expectError(withHeader([](BundleHeader &h) { h.reserved = 1; }), "reserved");
  expectError(withHeader([](BundleHeader &h) { h.programOffset = 0; }), "programOffset");
  expectError(withHeader([](BundleHeader &h) { h.programOffset = ~0ull - 3; }), "program bytes");
  expectError(withHeader([](BundleHeader &h) { h.programSize = ~0ull; }), "program bytes");
  expectError(withHeader([](BundleHeader &h) { h.programSize += 1; }), "program CRC32");
  expectError(withHeader([](BundleHeader &h) { h.dataOffset += 1; }), "not 64-byte aligned");
  expectError(withHeader([](BundleHeader &h) { h.dataOffset = 64; }), "overlapping the program");
  expectError(withHeader([](BundleHeader &h) { h.dataOffset = ~0ull & ~63ull; }), "data bytes");
  expectError(withHeader([](BundleHeader &h) { h.dataSize = ~0ull; }), "data bytes");
  expectError(withHeader([](BundleHeader &h) { h.dataSize += 64; }), "data bytes");
  expectError(withHeader([](BundleHeader &h) { h.programCrc32 ^= 1; }), "program CRC32");
  // A shorter data region cuts the last section off.
  expectError(withHeader([](BundleHeader &h) { h.dataSize -= 1; }), "section #1 'aux'");
}

TEST(BundleTest, EveryHeaderByteFlipIsHandled) {
  const std::vector<uint8_t> good = validBytes();
  for (size_t i = 0; i < sizeof(BundleHeader); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xFF}) {
      std::vector<uint8_t> b = good;
      b[i] ^= mask;
      auto r = Bundle::fromBytes(b, "test.forge");
      EXPECT_FALSE(r.isOk()) << "flip at header byte " << i << " was accepted";
    }
  }
}

TEST(BundleTest, FlippedProgramByteIsCrcError) {
  std::vector<uint8_t> b = validBytes();
  BundleHeader h = headerOf(b);
  for (uint64_t i = 0; i < h.programSize; i += 7) {
    std::vector<uint8_t> c = b;
    c[h.programOffset + i] ^= 0x10;
    expectError(c, "program CRC32 mismatch");
  }
}

TEST(BundleTest, FlippedSectionByteIsCrcError) {
  std::vector<uint8_t> b = validBytes();
  BundleHeader h = headerOf(b);
  b[h.dataOffset + 5] ^= 0x01;
  expectError(b, "section #0 'weights': CRC32 mismatch");

  b = validBytes();
  auto ok = Bundle::fromBytes(b);
  ASSERT_TRUE(ok.isOk());
  uint64_t auxOffset = (*ok)->program().sections(1).offset();
  b[h.dataOffset + auxOffset + 99] ^= 0x80;
  expectError(b, "section #1 'aux': CRC32 mismatch");
}

TEST(BundleTest, GarbageProgramWithValidCrcIsParseError) {
  std::vector<uint8_t> b = validBytes();
  BundleHeader h = headerOf(b);
  for (uint64_t i = 0; i < h.programSize; ++i)
    b[h.programOffset + i] = 0xFF;
  h.programCrc32 = crcOf(b.data() + h.programOffset, h.programSize);
  setHeader(b, h);
  expectError(b, "not a valid forge.bundle.Program");
}

TEST(BundleTest, SectionChecks) {
  expectProgramError([](fb::Program &p) { p.mutable_sections(1)->set_offset(65); },
                     "section #1 'aux': offset 65 is not 64-byte aligned");
  expectProgramError([](fb::Program &p) { p.mutable_sections(1)->set_size(1000); }, "lie outside");
  expectProgramError([](fb::Program &p) { p.mutable_sections(1)->set_offset(~0ull & ~63ull); },
                     "lie outside");
  expectProgramError([](fb::Program &p) { p.mutable_sections(1)->set_offset(0); }, "overlap");
  expectProgramError([](fb::Program &p) { p.mutable_sections(0)->set_crc32(12345); },
                     "section #0 'weights': CRC32 mismatch");
}

TEST(BundleTest, TensorChecks) {
  expectProgramError([](fb::Program &p) { p.mutable_tensors(0)->set_dtype(fb::DTYPE_UNSPECIFIED); },
                     "tensor #0 'x': invalid dtype");
  expectProgramError(
      [](fb::Program &p) { p.mutable_tensors(0)->set_dtype(static_cast<fb::DType>(99)); },
      "tensor #0 'x': invalid dtype 99");
  expectProgramError(
      [](fb::Program &p) { p.mutable_tensors(0)->set_kind(static_cast<fb::TensorInfo::Kind>(42)); },
      "invalid kind 42");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(0)->set_shape(1, -3); },
                     "tensor #0 'x': dimension 1 is negative");
  expectProgramError(
      [](fb::Program &p) {
        p.mutable_tensors(0)->set_shape(0, int64_t(1) << 40);
        p.mutable_tensors(0)->set_shape(1, int64_t(1) << 40);
      },
      "overflow");
  // Arena tensors.
  expectProgramError([](fb::Program &p) { p.mutable_tensors(2)->set_arena_offset(128); },
                     "tensor #2 'y': arena bytes [128, +16) exceed arena_size 128");
  expectProgramError([](fb::Program &p) { p.set_arena_size(70); }, "exceed arena_size 70");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(2)->set_arena_offset(8); },
                     "tensor #2 'y': arena_offset 8 is not 64-byte aligned");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(2)->set_arena_offset(-64); },
                     "negative arena_offset");
  expectProgramError(
      [](fb::Program &p) { p.mutable_tensors(2)->set_arena_offset(int64_t(1) << 62); },
      "exceed arena_size");
  // Section-backed tensors.
  expectProgramError([](fb::Program &p) { p.mutable_tensors(1)->set_section(5); },
                     "tensor #1 'w': section index 5 out of range (2 sections)");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(1)->set_data_offset(4); },
                     "tensor #1 'w': data bytes [4, +24) lie outside section #0 'weights'");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(1)->set_data_offset(~0ull - 8); },
                     "lie outside section");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(1)->set_data_size(20); },
                     "tensor #1 'w': data_size 20 does not match shape [3, 2] x f32 (24 bytes)");
  expectProgramError([](fb::Program &p) { p.mutable_tensors(1)->set_dtype(fb::F64); },
                     "does not match shape");
}

TEST(BundleTest, InstructionChecks) {
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->set_inputs(1, 3); },
                     "instruction #0 (matmul 'node0'): input 1 refers to tensor 3");
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->set_inputs(0, -2); },
                     "input 0 refers to tensor -2");
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->set_outputs(0, -1); },
                     "output 0 refers to tensor -1");
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->set_outputs(0, 1000); },
                     "output 0 refers to tensor 1000");
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->set_outputs(0, 1); },
                     "writes tensor #1 'w', which is a constant");
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->clear_op(); }, "empty op");
  // -1 marks an absent optional operand and is accepted.
  BundleWriter w = makeWriter();
  w.program().mutable_routines(0)->mutable_instructions(0)->add_inputs(-1);
  EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk());
}

TEST(BundleTest, OutRowStrideChecks) {
  // Outputs written a token stride apart (a concat's pieces): one stride per
  // output, rank >= 3 arena tensors, every row inside the arena.
  auto inst = [](fb::Program &p) { return p.mutable_routines(0)->mutable_instructions(0); };
  auto strides = [&](fb::Program &p, std::vector<int64_t> v) {
    auto *ints = (*inst(p)->mutable_attrs())["out_row_strides"].mutable_ints();
    for (int64_t x : v)
      ints->add_values(x);
  };
  auto rank3 = [](fb::Program &p) { // y as [1, 2, 2] at offset 64 of 128
    fb::TensorInfo *y = p.mutable_tensors(2);
    y->clear_shape();
    for (int64_t d : {1, 2, 2})
      y->add_shape(d);
  };
  expectProgramError(
      [&](fb::Program &p) {
        strides(p, {4, 4});
      },
      "instruction #0 (matmul 'node0'): attribute 'out_row_strides' must be one "
      "integer per output (1)");
  expectProgramError([&](fb::Program &p) { strides(p, {4}); },
                     "needs an arena tensor of rank >= 3");
  // Rows of 2 floats 15 apart: the second row ends at byte 64 + (15 + 2) * 4 > 128.
  expectProgramError(
      [&](fb::Program &p) {
        rank3(p);
        strides(p, {15});
      },
      "out_row_strides[0] = 15 does not place tensor #2 'y''s rows of 2 elements inside "
      "arena_size 128");
  expectProgramError(
      [&](fb::Program &p) {
        rank3(p);
        strides(p, {1});
      },
      "out_row_strides[0] = 1");
  for (int64_t ok : {0, 2, 14}) {
    BundleWriter w = makeWriter();
    rank3(w.program());
    strides(w.program(), {ok});
    EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk()) << ok;
  }
}

TEST(BundleTest, WorkspaceChecks) {
  auto inst = [](fb::Program &p) { return p.mutable_routines(0)->mutable_instructions(0); };
  // Arena workspace belongs to library calls, inside the arena, aligned.
  expectProgramError([&](fb::Program &p) { inst(p)->set_workspace_bytes(64); },
                     "only a library call has arena workspace");
  expectProgramError(
      [&](fb::Program &p) {
        inst(p)->set_placement(fb::LIBRARY);
        inst(p)->set_workspace_offset(64);
        inst(p)->set_workspace_bytes(128);
      },
      "workspace bytes [64, +128) are not 64-byte aligned inside arena_size 128");
  expectProgramError(
      [&](fb::Program &p) {
        inst(p)->set_placement(fb::LIBRARY);
        inst(p)->set_workspace_offset(32);
        inst(p)->set_workspace_bytes(32);
      },
      "workspace bytes [32, +32)");
  BundleWriter w = makeWriter();
  inst(w.program())->set_placement(fb::LIBRARY);
  inst(w.program())->set_workspace_offset(64);
  inst(w.program())->set_workspace_bytes(64);
  EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk());
}

TEST(BundleTest, KernelLaunchChecks) {
  // A kernel instruction names a kernel of the module, a launch shape, and at most an sm_90
  // block's dynamic shared memory.
  auto kernel = [](fb::Program &p, uint32_t grid, uint32_t block, uint32_t shared) {
    p.mutable_kernel_module()->add_kernels("k0");
    fb::Instruction *inst = p.mutable_routines(0)->mutable_instructions(0);
    inst->set_placement(fb::KERNEL);
    inst->mutable_launch()->set_kernel("k0");
    inst->mutable_launch()->set_grid(grid);
    inst->mutable_launch()->set_block(block);
    inst->mutable_launch()->set_shared_bytes(shared);
  };
  expectProgramError([&](fb::Program &p) { kernel(p, 1, 2048, 0); }, "launch grid 1 block 2048");
  expectProgramError([&](fb::Program &p) { kernel(p, 264, 512, kMaxDynamicSharedBytes + 1); },
                     "kernel 'k0' asks for " + std::to_string(kMaxDynamicSharedBytes + 1) +
                         " bytes of shared memory a block (at most " +
                         std::to_string(kMaxDynamicSharedBytes));
  for (uint32_t ok : {0u, 100608u, kMaxDynamicSharedBytes}) {
    BundleWriter w = makeWriter();
    kernel(w.program(), 264, 512, ok);
    EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk()) << ok;
  }
}

TEST(BundleTest, ScheduleChecks) {
  // forward: relu (compute, event 1) then the matmul on the collective stream, waiting for it.
  auto schedule = [](fb::Program &p) {
    fb::Routine *r = p.mutable_routines(0);
    r->add_streams("compute");
    r->add_streams("collective");
    r->set_events(2);
    fb::Instruction first = r->instructions(0);
    first.set_op("relu");
    first.clear_inputs();
    first.add_inputs(0);
    first.set_outputs(0, 3);
    first.set_event(1);
    addTensor(p, "t", fb::TensorInfo::INTERMEDIATE, {2, 3}, 0);
    *r->mutable_instructions()->Add() = r->instructions(0);
    r->mutable_instructions()->SwapElements(0, 1);
    *r->mutable_instructions(0) = first;
    fb::Instruction *second = r->mutable_instructions(1);
    second->set_stream(1);
    second->add_waits(1);
    second->set_event(2);
    r->add_joins(2);
    return r;
  };
  BundleWriter w = makeWriter();
  schedule(w.program());
  ASSERT_TRUE(Bundle::fromBytes(w.serialize()).isOk()) << Bundle::fromBytes(w.serialize()).status().message();
  expectProgramError([&](fb::Program &p) { schedule(p)->set_streams(1, "dma"); },
                     "stream 1 is 'dma'");
  expectProgramError([&](fb::Program &p) { schedule(p)->set_streams(0, "collective"); },
                     "stream 0 is 'collective'");
  expectProgramError([&](fb::Program &p) { schedule(p)->mutable_instructions(1)->set_stream(2); },
                     "instruction #1 (matmul 'node0'): stream 2 of 2");
  // A wait for an event recorded later, by nobody, or on its own stream.
  expectProgramError(
      [&](fb::Program &p) {
        fb::Routine *r = schedule(p);
        r->mutable_instructions(0)->add_waits(2);
      },
      "instruction #0 (relu 'node0'): waits for event 2, which no earlier instruction records");
  expectProgramError([&](fb::Program &p) { schedule(p)->mutable_instructions(1)->set_waits(0, 3); },
                     "waits for event 3");
  expectProgramError([&](fb::Program &p) { schedule(p)->mutable_instructions(1)->set_stream(0); },
                     "waits for event 1 of its own stream");
  expectProgramError([&](fb::Program &p) { schedule(p)->mutable_instructions(1)->set_event(1); },
                     "event 1 is out of range or recorded twice");
  expectProgramError([&](fb::Program &p) { schedule(p)->set_joins(0, 3); },
                     "the end waits for event 3, which no instruction records");
}

TEST(BundleTest, ScheduleRaces) {
  // relu x -> t on the compute stream, then the matmul on compute.1 writing y; y and t
  // share bytes [64, 128) unless t moves. Without a wait the two may run at once.
  auto program = [](bool wait, int64_t tOffset) {
    BundleWriter w = makeWriter();
    fb::Program &p = w.program();
    p.set_arena_size(256);
    addTensor(p, "t", fb::TensorInfo::INTERMEDIATE, {2, 3}, tOffset);
    fb::Routine *r = p.mutable_routines(0);
    r->add_streams("compute");
    r->add_streams("compute.1");
    r->set_events(1);
    fb::Instruction relu;
    relu.set_op("relu");
    relu.set_name("first");
    relu.add_inputs(0);
    relu.add_outputs(3);
    relu.set_event(1);
    *r->mutable_instructions()->Add() = r->instructions(0);
    *r->mutable_instructions(0) = relu;
    fb::Instruction *mm = r->mutable_instructions(1);
    mm->set_stream(1);
    if (wait)
      mm->add_waits(1);
    return p;
  };
  Status race = checkScheduleRaces(program(false, 64));
  ASSERT_FALSE(race.isOk());
  EXPECT_NE(race.message().find("routine 'forward': instruction #0 (relu 'first') (stream 0) and "
                                "instruction #1 (matmul 'node0') (stream 1) may run at once"),
            std::string::npos)
      << race.message();
  EXPECT_NE(race.message().find("tensor #3 't' bytes [64, 88), one writing them"),
            std::string::npos)
      << race.message();
  EXPECT_TRUE(checkScheduleRaces(program(true, 64)).isOk());   // ordered by the event
  // Apart in memory: both still read x, and reads never race.
  EXPECT_TRUE(checkScheduleRaces(program(false, 128)).isOk());
}

TEST(BundleTest, RoutineInputOutputChecks) {
  auto in = [](fb::Program &p) { return p.mutable_routines(0)->mutable_inputs(); };
  auto out = [](fb::Program &p) { return p.mutable_routines(0)->mutable_outputs(); };
  expectProgramError([&](fb::Program &p) { in(p)->Set(0, 3); },
                     "routine #0 'forward': input 0 refers to tensor 3");
  expectProgramError([&](fb::Program &p) { in(p)->Set(0, -1); }, "input 0 refers to tensor -1");
  expectProgramError([&](fb::Program &p) { in(p)->Set(0, 1); }, "is not of kind INPUT");
  expectProgramError([&](fb::Program &p) { out(p)->Add(7); }, "output 1 refers to tensor 7");
}

TEST(BundleTest, RoutineChecks) {
  expectProgramError([](fb::Program &p) { p.mutable_routines(0)->clear_name(); },
                     "routine #0 has an empty name");
  expectProgramError([](fb::Program &p) { p.add_routines()->set_name("forward"); },
                     "routine #1: the name 'forward' is used twice");
  // An arena tensor belongs to one routine.
  expectProgramError(
      [](fb::Program &p) {
        fb::Routine *r = p.add_routines();
        r->set_name("other");
        r->add_outputs(2);
      },
      "tensor #2 'y' is used by routines 'forward' and 'other'");
  expectProgramError(
      [](fb::Program &p) {
        fb::Routine *r = p.add_routines();
        r->set_name("other");
        fb::Instruction *i = r->add_instructions();
        i->set_op("relu");
        i->add_inputs(0);
        i->add_outputs(3);
        addTensor(p, "z", fb::TensorInfo::INTERMEDIATE, {2, 3}, 0);
      },
      "tensor #0 'x' is used by routines 'forward' and 'other'");
  // Constants and parameters are shared, and zero routines is a valid (empty) program.
  BundleWriter w = makeWriter();
  fb::Routine *r = w.program().add_routines();
  r->set_name("other");
  fb::Instruction *i = r->add_instructions();
  i->set_op("relu");
  i->add_inputs(1);
  i->add_outputs(3);
  addTensor(w.program(), "z", fb::TensorInfo::OUTPUT, {3, 2}, 0);
  r->add_outputs(3);
  EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk());
  w.program().clear_routines();
  EXPECT_TRUE(Bundle::fromBytes(w.serialize()).isOk());
}

TEST(BundleTest, StateTensors) {
  // Zero-initialized state needs no section bytes.
  BundleWriter w = makeWriter();
  fb::TensorInfo *s = w.program().mutable_tensors(addTensor(w.program(), "m", fb::TensorInfo::STATE, {3, 2}));
  s->set_section(99); // ignored without data
  auto ok = Bundle::fromBytes(w.serialize());
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_TRUE((*ok)->tensorData((*ok)->program().tensors(3)).empty());
  // With bytes it is checked like a parameter.
  s->set_section(0);
  s->set_data_size(20);
  expectError(w.serialize(), "tensor #3 'm': data_size 20 does not match shape [3, 2] x f32");
  s->set_data_size(24);
  auto withData = Bundle::fromBytes(w.serialize());
  ASSERT_TRUE(withData.isOk()) << withData.status().message();
  EXPECT_EQ((*withData)->tensorData((*withData)->program().tensors(3)).size(), 24u);
  s->set_section(7);
  expectError(w.serialize(), "tensor #3 'm': section index 7 out of range");
}

TEST(BundleTest, LowPrecisionCopies) {
  // A bf16 copy of parameter 'p' (TensorInfo.copy_of): zero-initialized STATE of its shape.
  auto build = [](auto mutate) {
    BundleWriter w = makeWriter();
    fb::Program &p = w.program();
    fb::TensorInfo *param = p.mutable_tensors(addTensor(p, "p", fb::TensorInfo::PARAMETER, {3, 2}));
    param->set_section(0);
    param->set_data_size(24);
    fb::TensorInfo *copy = p.mutable_tensors(addTensor(p, "p.bf16", fb::TensorInfo::STATE, {3, 2}));
    copy->set_dtype(fb::BF16);
    copy->set_copy_of("p");
    mutate(p, *copy);
    return w.serialize();
  };
  auto ok = Bundle::fromBytes(build([](fb::Program &, fb::TensorInfo &) {}));
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_EQ((*ok)->program().tensors(4).copy_of(), "p");
  expectError(build([](fb::Program &, fb::TensorInfo &c) { c.set_copy_of("q"); }),
              "tensor #4 'p.bf16': copy_of names no parameter 'q'");
  expectError(build([](fb::Program &, fb::TensorInfo &c) { c.set_copy_of("w"); }),
              "copy_of names no parameter 'w'"); // 'w' is a CONSTANT
  expectError(build([](fb::Program &, fb::TensorInfo &c) {
                c.clear_shape();
                c.add_shape(6);
              }),
              "copy of parameter 'p' (f32 [3, 2]) must have its shape");
  expectError(build([](fb::Program &, fb::TensorInfo &c) { c.set_dtype(fb::I32); }),
              "must be a STATE tensor of bf16, f16 or f32 without initial bytes");
  expectError(build([](fb::Program &, fb::TensorInfo &c) { // initial bytes: not derived
                c.set_section(0);
                c.set_data_size(12);
              }),
              "must be a STATE tensor of bf16, f16 or f32 without initial bytes");
  expectError(build([](fb::Program &p, fb::TensorInfo &) {
                p.mutable_tensors(3)->set_dtype(fb::F16);
                p.mutable_tensors(3)->set_data_size(12);
              }),
              "copy of parameter 'p' (f16 [3, 2]) must have its shape and stored layout, and it must be f32");
  // Stored permutations (forge-permute-parameters): a copy stored as its parameter is; a
  // permutation of the tensor's dims, on persistent tensors only.
  expectError(build([](fb::Program &, fb::TensorInfo &c) {
                c.add_layout_perm(1);
                c.add_layout_perm(0);
              }),
              "copy of parameter 'p' (f32 [3, 2]) must have its shape and stored layout");
  expectError(build([](fb::Program &p, fb::TensorInfo &) {
                p.mutable_tensors(3)->add_layout_perm(0);
                p.mutable_tensors(3)->add_layout_perm(0);
              }),
              "layout_perm [0, 0] is not a permutation of its 2 dims");
  expectError(build([](fb::Program &p, fb::TensorInfo &) {
                p.mutable_tensors(3)->add_layout_perm(1);
              }),
              "layout_perm [1] is not a permutation of its 2 dims");
  expectError(build([](fb::Program &p, fb::TensorInfo &) {
                for (fb::TensorInfo &t : *p.mutable_tensors())
                  if (t.kind() == fb::TensorInfo::CONSTANT) {
                    t.add_layout_perm(0);
                    break;
                  }
              }),
              "on an unsplit parameter or state tensor");
}
