// .npy / .npz: round trips of every dtype, hand-built NumPy byte fixtures,
// and damaged files (truncated, corrupted, unsupported) as clear errors.
// Zip fixtures are built here (stored, deflated with zlib, zip64) so the tests
// need no Python.
#include "forge/runtime/Npy.h"

#include <cstring>
#include <fstream>

#include <gtest/gtest.h>
#include <zlib.h>

using namespace forge::rt;
namespace fb = forge::bundle;

namespace {

std::string tempPath(const std::string &name) { return ::testing::TempDir() + name; }

void writeBytes(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(b.data()), b.size());
}

std::vector<uint8_t> readBytes(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// A v1/v2/v3 .npy image with `dict` padded NumPy-style, followed by `data`.
std::vector<uint8_t> npyFixture(const std::string &dict, const std::vector<uint8_t> &data,
                                int major = 1) {
  size_t prefix = major == 1 ? 10 : 12;
  std::string h = dict;
  while ((prefix + h.size() + 1) % 64 != 0)
    h.push_back(' ');
  h.push_back('\n');
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  uint32_t len = static_cast<uint32_t>(h.size());
  for (size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<uint8_t>(len >> (8 * i)));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <typename T> std::vector<uint8_t> bytesOf(std::vector<T> v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// --- a minimal zip writer for fixtures -----------------------------------------

struct ZipEntry {
  std::string name;
  std::vector<uint8_t> data;
  bool deflate = false;
};

void put(std::vector<uint8_t> &v, uint64_t x, int bytes) {
  for (int i = 0; i < bytes; ++i)
    v.push_back(static_cast<uint8_t>(x >> (8 * i)));
}

std::vector<uint8_t> rawDeflate(const std::vector<uint8_t> &in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, in.size()));
  zs.next_in = const_cast<Bytef *>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

/// Builds a zip; with `zip64`, sizes and offsets go into zip64 extra fields
/// and a zip64 end record, as Python's zipfile does for large archives.
std::vector<uint8_t> buildZip(const std::vector<ZipEntry> &entries, bool zip64 = false,
                              const std::string &comment = "") {
  std::vector<uint8_t> out, central;
  for (const ZipEntry &e : entries) {
    std::vector<uint8_t> payload = e.deflate ? rawDeflate(e.data) : e.data;
    uint32_t crc = static_cast<uint32_t>(
        crc32(crc32(0, nullptr, 0), e.data.data(), static_cast<uInt>(e.data.size())));
    uint64_t offset = out.size();
    uint16_t method = e.deflate ? 8 : 0;
    put(out, 0x04034b50, 4);
    put(out, zip64 ? 45 : 20, 2);
    put(out, 0, 2);
    put(out, method, 2);
    put(out, 0, 4);
    put(out, crc, 4);
    put(out, zip64 ? 0xFFFFFFFF : payload.size(), 4);
    put(out, zip64 ? 0xFFFFFFFF : e.data.size(), 4);
    put(out, e.name.size(), 2);
    put(out, zip64 ? 20 : 0, 2);
    out.insert(out.end(), e.name.begin(), e.name.end());
    if (zip64) {
      put(out, 1, 2);
      put(out, 16, 2);
      put(out, e.data.size(), 8);
      put(out, payload.size(), 8);
    }
    out.insert(out.end(), payload.begin(), payload.end());

    put(central, 0x02014b50, 4);
    put(central, 45, 2);
    put(central, zip64 ? 45 : 20, 2);
    put(central, 0, 2);
    put(central, method, 2);
    put(central, 0, 4);
    put(central, crc, 4);
    put(central, zip64 ? 0xFFFFFFFF : payload.size(), 4);
    put(central, zip64 ? 0xFFFFFFFF : e.data.size(), 4);
    put(central, e.name.size(), 2);
    put(central, zip64 ? 28 : 0, 2);
    put(central, 0, 2);
    put(central, 0, 2);
    put(central, 0, 2);
    put(central, 0, 4);
    put(central, zip64 ? 0xFFFFFFFF : offset, 4);
    central.insert(central.end(), e.name.begin(), e.name.end());
    if (zip64) {
      put(central, 1, 2);
      put(central, 24, 2);
      put(central, e.data.size(), 8);
      put(central, payload.size(), 8);
      put(central, offset, 8);
    }
  }
  uint64_t cdOffset = out.size();
  out.insert(out.end(), central.begin(), central.end());
  if (zip64) {
    uint64_t rec = out.size();
    put(out, 0x06064b50, 4);
    put(out, 44, 8);
    put(out, 45, 2);
    put(out, 45, 2);
    put(out, 0, 4);
    put(out, 0, 4);
    put(out, entries.size(), 8);
    put(out, entries.size(), 8);
    put(out, central.size(), 8);
    put(out, cdOffset, 8);
    put(out, 0x07064b50, 4);
    put(out, 0, 4);
    put(out, rec, 8);
    put(out, 1, 4);
  }
  put(out, 0x06054b50, 4);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, zip64 ? 0xFFFF : entries.size(), 2);
  put(out, zip64 ? 0xFFFF : entries.size(), 2);
  put(out, zip64 ? 0xFFFFFFFF : central.size(), 4);
  put(out, zip64 ? 0xFFFFFFFF : cdOffset, 4);
  put(out, comment.size(), 2);
  out.insert(out.end(), comment.begin(), comment.end());
  return out;
}

void expectNpyError(const std::vector<uint8_t> &bytes, const std::string &needle) {
  auto t = parseNpy(bytes, "a.npy");
  ASSERT_FALSE(t.isOk()) << "expected error: " << needle;
  std::string msg = t.status().message();
  EXPECT_EQ(msg.rfind("a.npy: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
}

HostTensor makeTensor(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<size_t>(numElements(t.shape)) * dtypeSize(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i)
    t.bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  if (dtype == fb::BOOL)
    for (uint8_t &b : t.bytes)
      b &= 1;
  return t;
}

} // namespace

TEST(NpyTest, RoundTripAllDTypes) {
  const DType types[] = {fb::F32, fb::F64, fb::F16, fb::I64, fb::I32, fb::I16,
                         fb::I8,  fb::U8,  fb::U16, fb::U32, fb::U64, fb::BOOL};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {5}, {2, 3}, {2, 1, 4}, {3, 0, 2}};
  for (DType dt : types) {
    for (const auto &shape : shapes) {
      HostTensor in = makeTensor(dt, shape);
      std::vector<uint8_t> enc = encodeNpy(in.view());
      // NumPy aligns the data to 64 bytes.
      EXPECT_EQ((enc.size() - in.bytes.size()) % 64, 0u);
      auto out = parseNpy(enc, "mem");
      ASSERT_TRUE(out.isOk()) << dtypeName(dt) << shapeString(shape) << ": "
                              << out.status().message();
      EXPECT_EQ(out->dtype, dt);
      EXPECT_EQ(out->shape, shape);
      EXPECT_EQ(out->bytes, in.bytes);
    }
  }
}

TEST(NpyTest, RawBitsTypesWriteAsUnsigned) {
  HostTensor bf = makeTensor(fb::BF16, {4});
  auto out = parseNpy(encodeNpy(bf.view()), "mem");
  ASSERT_TRUE(out.isOk());
  EXPECT_EQ(out->dtype, fb::U16);
  EXPECT_EQ(out->bytes, bf.bytes);
}

TEST(NpyTest, EncodedHeaderMatchesNumPy) {
  HostTensor t = makeTensor(fb::F32, {3});
  std::vector<uint8_t> enc = encodeNpy(t.view());
  std::string header(enc.begin() + 10, enc.begin() + 10 + (enc[8] | enc[9] << 8));
  // Exactly what numpy.save writes for np.zeros(3, np.float32).
  EXPECT_EQ(header.substr(0, 60), "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }   ");
  EXPECT_EQ(enc.size(), 128u + 12u);
  EXPECT_EQ(header.back(), '\n');
}

TEST(NpyTest, WriteAndReadFile) {
  std::string path = tempPath("rt.npy");
  HostTensor t = makeTensor(fb::I64, {2, 2});
  ASSERT_TRUE(writeNpy(path, t.view()).isOk());
  auto back = readNpy(path);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->bytes, t.bytes);
  EXPECT_FALSE(readNpy(tempPath("missing.npy")).isOk());
  // Mapped: the same array in place; every truncation of the file (an empty one too) is
  // an error naming the file, as readNpy's.
  auto mapped = mapNpy(path);
  ASSERT_TRUE(mapped.isOk()) << mapped.status().message();
  EXPECT_EQ(mapped->dtype, t.dtype);
  EXPECT_EQ(mapped->shape, t.shape);
  ASSERT_EQ(mapped->size, t.bytes.size());
  EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), mapped->data));
  std::vector<uint8_t> full = encodeNpy(t.view());
  std::string cut = tempPath("cut.npy");
  for (size_t n = 0; n < full.size(); ++n) {
    writeBytes(cut, {full.begin(), full.begin() + n});
    auto m = mapNpy(cut);
    ASSERT_FALSE(m.isOk()) << "prefix " << n;
    EXPECT_NE(m.status().message().find(cut), std::string::npos) << m.status().message();
  }
  auto missing = mapNpy(tempPath("missing.npy"));
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(NpyTest, HandBuiltV1Fixtures) {
  // np.array([1.5, -2.0], dtype='<f4')
  auto a = parseNpy(npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                               bytesOf<float>({1.5f, -2.0f})),
                    "a.npy");
  ASSERT_TRUE(a.isOk()) << a.status().message();
  EXPECT_EQ(a->dtype, fb::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2}));
  float f[2];
  std::memcpy(f, a->bytes.data(), 8);
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -2.0f);

  // A 0-d array (np.int64(7)), double quotes, keys in another order.
  auto s = parseNpy(npyFixture("{\"shape\": (), \"fortran_order\": False, \"descr\": \"<i8\"}",
                               bytesOf<int64_t>({7})),
                    "s.npy");
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->dtype, fb::I64);

  // Python 2 era 'L' suffixes and a bool array.
  auto b = parseNpy(
      npyFixture("{'descr': '|b1', 'fortran_order': False, 'shape': (1L, 3L), }", {1, 0, 1}),
      "b.npy");
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(b->dtype, fb::BOOL);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{1, 3}));

  // Byte order '|' and '<' for one-byte types, '=' (native) for wider ones.
  EXPECT_TRUE(parseNpy(npyFixture("{'descr': '<u1', 'fortran_order': False, 'shape': (1,), }", {9}),
                       "u.npy")
                  .isOk());
  EXPECT_TRUE(parseNpy(npyFixture("{'descr': '=i4', 'fortran_order': False, 'shape': (1,), }",
                                  bytesOf<int32_t>({3})),
                       "i.npy")
                  .isOk());
  // fortran_order True on a 1-element array is still refused (NumPy never writes it).
}

TEST(NpyTest, V2AndV3Headers) {
  for (int major : {2, 3}) {
    auto t = parseNpy(npyFixture("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 1), }",
                                 bytesOf<int16_t>({-1, 5}), major),
                      "v.npy");
    ASSERT_TRUE(t.isOk()) << t.status().message();
    EXPECT_EQ(t->dtype, fb::I16);
  }
}

TEST(NpyTest, UnsupportedContentIsAClearError) {
  std::vector<uint8_t> data = bytesOf<float>({1, 2});
  expectNpyError(npyFixture("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data),
                 "big-endian");
  expectNpyError(npyFixture("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", data),
                 "fortran_order");
  expectNpyError(npyFixture("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", data),
                 "unsupported dtype descr '<c8'");
  expectNpyError(
      npyFixture("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", data),
      "structured");
  expectNpyError(npyFixture("{'descr': '<f4', 'shape': (2,), }", data), "lacks");
  expectNpyError(npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", data),
                 "offset");
  expectNpyError(
      npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data),
      "unexpected key 'x'");
  expectNpyError(npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': "
                            "(99999999999999999999,), }",
                            data),
                 "overflows");
  expectNpyError(
      npyFixture("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
                 data),
      "overflows");
  expectNpyError(npyFixture("garbage", data), "bad .npy header at offset 10");
  expectNpyError(npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                            bytesOf<float>({1, 2, 3})),
                 "trailing");
  std::vector<uint8_t> v9 =
      npyFixture("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data);
  v9[6] = 9;
  expectNpyError(v9, "unsupported .npy format version 9.0");
  expectNpyError({'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0, 0}, "not a .npy file");
}

TEST(NpyTest, EveryTruncationIsAnError) {
  std::vector<uint8_t> full = npyFixture(
      "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", bytesOf<double>({1, 2, 3, 4}));
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + n);
    auto t = parseNpy(prefix, "t.npy");
    ASSERT_FALSE(t.isOk()) << "prefix " << n;
    if (n >= 10)
      EXPECT_NE(t.status().message().find("truncated"), std::string::npos) << t.status().message();
  }
  auto data = parseNpy({full.begin(), full.end() - 1}, "t.npy");
  EXPECT_NE(data.status().message().find("needs 32 data bytes at offset 128"), std::string::npos)
      << data.status().message();
}

TEST(NpyTest, NpzRoundTrip) {
  std::string path = tempPath("rt.npz");
  HostTensor a = makeTensor(fb::F32, {2, 3}), b = makeTensor(fb::I32, {}),
             c = makeTensor(fb::U8, {0});
  ASSERT_TRUE(writeNpz(path, {{"a", a.view()}, {"b", b.view()}, {"dir/c", c.view()}}).isOk());
  auto z = readNpz(path);
  ASSERT_TRUE(z.isOk()) << z.status().message();
  ASSERT_EQ(z->size(), 3u);
  EXPECT_EQ(z->at("a").bytes, a.bytes);
  EXPECT_EQ(z->at("a").shape, a.shape);
  EXPECT_EQ(z->at("b").dtype, fb::I32);
  EXPECT_EQ(z->at("dir/c").shape, (std::vector<int64_t>{0}));

  // Member names carry the .npy suffix, as numpy.savez writes them.
  std::vector<uint8_t> raw = readBytes(path);
  std::string s(raw.begin(), raw.end());
  EXPECT_NE(s.find("a.npy"), std::string::npos);

  // An empty archive is valid.
  ASSERT_TRUE(writeNpz(path, {}).isOk());
  auto e = readNpz(path);
  ASSERT_TRUE(e.isOk()) << e.status().message();
  EXPECT_TRUE(e->empty());
}

TEST(NpyTest, NpzWriterRejectsBadArrays) {
  HostTensor a = makeTensor(fb::F32, {2});
  EXPECT_FALSE(writeNpz(tempPath("bad.npz"), {{"", a.view()}}).isOk());
  TensorView noData{nullptr, fb::F32, {4}};
  EXPECT_FALSE(writeNpz(tempPath("bad.npz"), {{"x", noData}}).isOk());
  EXPECT_FALSE(writeNpz("/nonexistent-dir/x.npz", {{"x", a.view()}}).isOk());
}

TEST(NpyTest, NpzStoredDeflatedAndZip64Members) {
  HostTensor x = makeTensor(fb::F32, {64, 16});
  std::vector<uint8_t> xNpy = encodeNpy(x.view());
  std::vector<uint8_t> zeros = npyFixture(
      "{'descr': '<f8', 'fortran_order': False, 'shape': (1000,), }", std::vector<uint8_t>(8000));
  for (bool zip64 : {false, true}) {
    std::string path = tempPath(zip64 ? "z64.npz" : "mixed.npz");
    writeBytes(path, buildZip({{"x.npy", xNpy, false},
                               {"zeros.npy", zeros, true},
                               {"notes.txt", {'h', 'i'}, true}},
                              zip64, "archive comment"));
    auto z = readNpz(path);
    ASSERT_TRUE(z.isOk()) << z.status().message();
    EXPECT_EQ(z->size(), 2u); // non-.npy members are not arrays
    EXPECT_EQ(z->at("x").bytes, x.bytes);
    EXPECT_EQ(z->at("zeros").shape, (std::vector<int64_t>{1000}));
    EXPECT_EQ(z->at("zeros").bytes, std::vector<uint8_t>(8000));
    // Mapped (the data loader's reader): the stored member points into the file's mapping,
    // the deflated one into memory of its own; the same arrays, alive without the map.
    auto m = mapNpz(path);
    ASSERT_TRUE(m.isOk()) << m.status().message();
    ASSERT_EQ(m->size(), 2u);
    const MappedArray &mx = m->at("x"), &mz = m->at("zeros");
    EXPECT_EQ(mx.dtype, x.dtype);
    EXPECT_EQ(mx.shape, x.shape);
    ASSERT_EQ(mx.size, x.bytes.size());
    EXPECT_TRUE(std::equal(x.bytes.begin(), x.bytes.end(), mx.data));
    EXPECT_EQ(mz.shape, (std::vector<int64_t>{1000}));
    ASSERT_EQ(mz.size, 8000u);
    EXPECT_TRUE(std::all_of(mz.data, mz.data + mz.size, [](uint8_t b) { return b == 0; }));
    MappedArray kept = mx;
    m->clear(); // the last other reference to the mapping
    EXPECT_TRUE(std::equal(x.bytes.begin(), x.bytes.end(), kept.data));
  }
}

TEST(NpyTest, DamagedNpzIsAClearError) {
  HostTensor x = makeTensor(fb::I16, {10});
  std::vector<uint8_t> xNpy = encodeNpy(x.view());
  std::vector<uint8_t> good = buildZip({{"x.npy", xNpy, true}, {"y.npy", xNpy, false}});
  std::string path = tempPath("damaged.npz");
  // readNpz and the mapped reader (mapNpz) refuse the same files with the same words.
  auto expectZipError = [&](const std::vector<uint8_t> &bytes, const std::string &needle) {
    writeBytes(path, bytes);
    auto z = readNpz(path);
    auto m = mapNpz(path);
    ASSERT_FALSE(z.isOk()) << needle;
    ASSERT_FALSE(m.isOk()) << needle;
    for (const std::string &msg : {z.status().message(), m.status().message()}) {
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    }
  };
  // Every truncation: the end record goes first, so all fail cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    writeBytes(path, {good.begin(), good.begin() + n});
    EXPECT_FALSE(readNpz(path).isOk()) << "prefix " << n;
    EXPECT_FALSE(mapNpz(path).isOk()) << "prefix " << n;
  }
  expectZipError({'n', 'o', 't', ' ', 'a', ' ', 'z', 'i', 'p'}, "not a zip archive");
  expectZipError(std::vector<uint8_t>(100, 0), "not a zip archive");

  // Corrupt the stored member's data: CRC mismatch, naming the member.
  std::vector<uint8_t> bad = good;
  size_t yData = std::string(bad.begin(), bad.end()).find("\x93NUMPY", 40);
  ASSERT_NE(yData, std::string::npos);
  bad[yData + 100] ^= 1;
  expectZipError(bad, "member 'y.npy': CRC32 mismatch");

  // Corrupt the deflate stream.
  bad = good;
  for (size_t i = 40; i < 60; ++i)
    bad[i] ^= 0x5A;
  expectZipError(bad, "member 'x.npy'");

  // Duplicate names.
  expectZipError(buildZip({{"x.npy", xNpy}, {"x.npy", xNpy}}), "duplicate");
  // Unsupported method.
  bad = buildZip({{"x.npy", xNpy}});
  bad[8] = 12; // bzip2 in the local header; the central directory decides
  size_t cd = std::string(bad.begin(), bad.end()).find("PK\x01\x02");
  bad[cd + 10] = 12;
  expectZipError(bad, "compression method 12");
  // Encrypted member.
  bad = buildZip({{"x.npy", xNpy}});
  bad[cd + 8] = 1;
  expectZipError(bad, "encrypted");
  // A member that is not a valid .npy.
  expectZipError(buildZip({{"x.npy", {1, 2, 3}}}), "member 'x.npy': truncated");
  // A central directory claiming a huge entry count.
  bad = buildZip({{"x.npy", xNpy}});
  bad[bad.size() - 22 + 10] = 0xFE;
  bad[bad.size() - 22 + 11] = 0xFF;
  expectZipError(bad, "entries cannot fit");
  // A local header offset outside the file.
  bad = buildZip({{"x.npy", xNpy}});
  bad[cd + 45] = 0x7F;
  expectZipError(bad, "bad local header");
}
