// NumPy .npy / .npz reading and writing (Npy.h).
//
// Invariants:
//  * Every read of a file byte is bounds-checked against the buffer; sizes
//    and offsets from the file are untrusted and combined with overflow-safe
//    arithmetic. A truncated or garbage file gives a Status naming the file
//    (and archive member) and the byte offset, never a crash.
//  * Only what NumPy itself writes is accepted: little-endian (or one-byte)
//    plain dtypes, C order, header versions 1.0-3.0. Everything else is a
//    clear error rather than a silent misread.
//  * .npz archives are parsed from the central directory (not by scanning
//    local headers), members stored or deflated, with zip64 extra fields;
//    each member's CRC32 is checked. writeNpz writes stored members (zip64
//    only when sizes or offsets need it), readable by numpy.load.
//  * Files are written through AtomicFileWriter (FileUtil.h: temporary file,
//    fsync, rename, directory fsync), so a reader never sees a half-written
//    archive.
//  * bfloat16 and float8 have no NumPy dtype: encodeNpy writes their raw bits
//    as '<u2' / '|u1' (read back as U16 / U8).
#include "forge/runtime/Npy.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <string_view>


#include <fmt/ranges.h>
#include <zlib.h>

#include "forge/runtime/FileUtil.h"

static_assert(std::endian::native == std::endian::little,
              ".npy/.npz handling assumes a little-endian host");

namespace forge::rt {

namespace {

using Bytes = std::span<const uint8_t>;

constexpr uint8_t kNpyMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

uint16_t rd16(const uint8_t *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t rd64(const uint8_t *p) {
  return static_cast<uint64_t>(rd32(p)) | (static_cast<uint64_t>(rd32(p + 4)) << 32);
}

bool rangeInside(uint64_t offset, uint64_t size, uint64_t limit) {
  uint64_t end;
  return !__builtin_add_overflow(offset, size, &end) && end <= limit;
}

uint32_t crc32Update(uint32_t crc, const void *data, size_t n) {
  if (n == 0) // zlib returns the initial value 0 for a null buffer
    return crc;
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef *>(data), n));
}

// --- dtype descriptors -------------------------------------------------------

struct Descr {
  std::string_view code; // kind + size, without the byte-order character
  DType dtype;
};
constexpr Descr kDescrs[] = {
    {"f4", bundle::F32}, {"f8", bundle::F64}, {"f2", bundle::F16}, {"i8", bundle::I64},
    {"i4", bundle::I32}, {"i2", bundle::I16}, {"i1", bundle::I8},  {"u1", bundle::U8},
    {"u2", bundle::U16}, {"u4", bundle::U32}, {"u8", bundle::U64}, {"b1", bundle::BOOL},
};

Expected<DType> dtypeFromDescr(std::string_view descr) {
  if (descr.size() < 2)
    return Status::error("unsupported dtype descr '{}'", descr);
  char order = descr[0];
  std::string_view code = descr.substr(1);
  for (const Descr &d : kDescrs) {
    if (d.code != code)
      continue;
    bool oneByte = dtypeSize(d.dtype) == 1;
    if (order == '>' && !oneByte)
      return Status::error("dtype '{}' is big-endian; only little-endian arrays are supported "
                           "(convert with arr.astype(arr.dtype.newbyteorder('<')))",
                           descr);
    if (order == '<' || order == '=' || (oneByte && (order == '|' || order == '>')))
      return d.dtype;
    return Status::error("unsupported byte order in dtype descr '{}'", descr);
  }
  return Status::error("unsupported dtype descr '{}' (supported: f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 "
                       "u8 b1)",
                       descr);
}

std::string_view descrFor(DType t) {
  switch (t) {
  case bundle::F32:
    return "<f4";
  case bundle::F64:
    return "<f8";
  case bundle::F16:
    return "<f2";
  case bundle::I64:
    return "<i8";
  case bundle::I32:
    return "<i4";
  case bundle::I16:
    return "<i2";
  case bundle::I8:
    return "|i1";
  case bundle::U8:
    return "|u1";
  case bundle::U16:
    return "<u2";
  case bundle::U32:
    return "<u4";
  case bundle::U64:
    return "<u8";
  case bundle::BOOL:
    return "|b1";
  case bundle::BF16:
    return "<u2"; // raw bits: NumPy has no bfloat16
  case bundle::F8E4M3:
  case bundle::F8E5M2:
  case bundle::F8E4M3FNUZ:
  case bundle::F8E5M2FNUZ:
    return "|u1"; // raw bits
  default:
    return "";
  }
}

// --- .npy header dictionary (a Python literal) -------------------------------

class HeaderParser {
public:
  HeaderParser(std::string_view text, size_t baseOffset) : s_(text), base_(baseOffset) {}

  struct Result {
    std::string descr;
    bool fortranOrder = false;
    std::vector<int64_t> shape;
  };

  Expected<Result> parse() {
    Result r;
    bool haveDescr = false, haveOrder = false, haveShape = false;
    skipWs();
    if (!eat('{'))
      return err("expected '{' opening the header dictionary");
    for (;;) {
      skipWs();
      if (eat('}'))
        break;
      auto key = parseString();
      if (!key)
        return key.status();
      skipWs();
      if (!eat(':'))
        return err("expected ':' after key");
      skipWs();
      if (*key == "descr") {
        if (peek() == '[')
          return err("structured dtypes (a descr list) are not supported");
        auto v = parseString();
        if (!v)
          return v.status();
        r.descr = *v;
        haveDescr = true;
      } else if (*key == "fortran_order") {
        if (s_.substr(pos_, 4) == "True") {
          r.fortranOrder = true;
          pos_ += 4;
        } else if (s_.substr(pos_, 5) == "False") {
          r.fortranOrder = false;
          pos_ += 5;
        } else {
          return err("expected True or False for 'fortran_order'");
        }
        haveOrder = true;
      } else if (*key == "shape") {
        auto v = parseShape();
        if (!v)
          return v.status();
        r.shape = v.take();
        haveShape = true;
      } else {
        return err(fmt::format("unexpected key '{}'", *key));
      }
      skipWs();
      if (eat(','))
        continue;
      skipWs();
      if (eat('}'))
        break;
      return err("expected ',' or '}' in the header dictionary");
    }
    if (!haveDescr || !haveOrder || !haveShape)
      return err("header dictionary lacks one of 'descr', 'fortran_order', 'shape'");
    return r;
  }

private:
  Status err(const std::string &what) const {
    return Status::error("bad .npy header at offset {}: {}", base_ + pos_, what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eat(char c) {
    if (peek() != c || pos_ >= s_.size())
      return false;
    ++pos_;
    return true;
  }
  void skipWs() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  Expected<std::string> parseString() {
    char q = peek();
    if (q != '\'' && q != '"')
      return err("expected a quoted string");
    size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q)
      ++pos_;
    if (pos_ >= s_.size())
      return err("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }
  Expected<std::vector<int64_t>> parseShape() {
    std::vector<int64_t> shape;
    if (!eat('('))
      return err("expected '(' opening the shape tuple");
    for (;;) {
      skipWs();
      if (eat(')'))
        return shape;
      if (peek() < '0' || peek() > '9')
        return err("expected a non-negative integer in the shape");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
          return err("shape dimension overflows int64");
        ++pos_;
      }
      eat('L'); // Python 2 long suffix
      shape.push_back(v);
      if (shape.size() > 64)
        return err("more than 64 dimensions");
      skipWs();
      if (eat(','))
        continue;
      skipWs();
      if (eat(')'))
        return shape;
      return err("expected ',' or ')' in the shape tuple");
    }
  }

  std::string_view s_;
  size_t base_;
  size_t pos_ = 0;
};

/// A .npy image's header: its array's type and shape, and where its data lie.
struct NpyHeader {
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  uint64_t dataOffset = 0, dataBytes = 0;
};

/// Parses and checks a .npy image's header (the data must fill the rest of
/// the image exactly); errors are not yet prefixed with the origin.
Expected<NpyHeader> parseNpyHeader(Bytes b) {
  if (b.size() < 10)
    return Status::error("truncated: {} bytes, a .npy file needs at least 10", b.size());
  if (std::memcmp(b.data(), kNpyMagic, sizeof(kNpyMagic)) != 0)
    return Status::error("not a .npy file (bad magic at offset 0)");
  uint8_t major = b[6], minor = b[7];
  size_t prefix;
  uint64_t headerLen;
  if (major == 1) {
    prefix = 10;
    headerLen = rd16(b.data() + 8);
  } else if (major == 2 || major == 3) {
    if (b.size() < 12)
      return Status::error("truncated: {} bytes, a version {}.{} .npy header needs 12", b.size(),
                           major, minor);
    prefix = 12;
    headerLen = rd32(b.data() + 8);
  } else {
    return Status::error("unsupported .npy format version {}.{} (offset 6)", major, minor);
  }
  if (!rangeInside(prefix, headerLen, b.size()))
    return Status::error("truncated: the header claims {} bytes at offset {}, the file has {}",
                         headerLen, prefix, b.size());
  std::string_view text(reinterpret_cast<const char *>(b.data() + prefix), headerLen);
  auto header = HeaderParser(text, prefix).parse();
  if (!header)
    return header.status();
  auto dtype = dtypeFromDescr(header->descr);
  if (!dtype)
    return dtype.status();
  if (header->fortranOrder)
    return Status::error("fortran_order arrays are not supported; save a C-contiguous array "
                         "(np.ascontiguousarray)");
  NpyHeader h;
  h.dtype = *dtype;
  h.shape = header->shape;
  int64_t numel = numElements(h.shape);
  uint64_t bytes;
  if (numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), dtypeSize(h.dtype), &bytes))
    return Status::error("shape {} overflows the element count", shapeString(h.shape));
  uint64_t dataOffset = prefix + headerLen;
  uint64_t available = b.size() - dataOffset;
  if (available < bytes)
    return Status::error("truncated: shape {} of {} needs {} data bytes at offset {}, the file "
                         "has {}",
                         shapeString(h.shape), dtypeName(h.dtype), bytes, dataOffset, available);
  if (available > bytes)
    return Status::error("{} unexpected trailing bytes after the array data (offset {})",
                         available - bytes, dataOffset + bytes);
  h.dataOffset = dataOffset;
  h.dataBytes = bytes;
  return h;
}

/// Parses a .npy image into a tensor of its own; errors are not yet prefixed
/// with the origin.
Expected<HostTensor> parseNpyBytes(Bytes b) {
  auto h = parseNpyHeader(b);
  if (!h)
    return h.status();
  HostTensor t;
  t.dtype = h->dtype;
  t.shape = std::move(h->shape);
  t.bytes.assign(b.begin() + static_cast<std::ptrdiff_t>(h->dataOffset), b.end());
  return t;
}

/// The .npy header (magic through padding), so that header + data is a file.
std::vector<uint8_t> encodeNpyHeader(const TensorView &tensor) {
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': (", descrFor(tensor.dtype));
  for (size_t i = 0; i < tensor.shape.size(); ++i)
    dict += fmt::format("{}{}", tensor.shape[i],
                        tensor.shape.size() == 1 ? "," : (i + 1 < tensor.shape.size() ? ", " : ""));
  dict += "), }";
  // NumPy pads with spaces and a final newline so the data is 64-aligned.
  size_t prefix = 10;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  if (total - prefix > 0xFFFF) {
    prefix = 12;
    total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  }
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::vector<uint8_t> out(kNpyMagic, kNpyMagic + sizeof(kNpyMagic));
  out.push_back(prefix == 10 ? 1 : 2);
  out.push_back(0);
  uint32_t len = static_cast<uint32_t>(dict.size());
  out.push_back(static_cast<uint8_t>(len));
  out.push_back(static_cast<uint8_t>(len >> 8));
  if (prefix == 12) {
    out.push_back(static_cast<uint8_t>(len >> 16));
    out.push_back(static_cast<uint8_t>(len >> 24));
  }
  out.insert(out.end(), dict.begin(), dict.end());
  return out;
}

Status checkEncodable(const TensorView &t) {
  if (descrFor(t.dtype).empty())
    return Status::error("cannot store dtype {} in .npy", dtypeName(t.dtype));
  if (numElements(t.shape) < 0)
    return Status::error("invalid shape {}", shapeString(t.shape));
  if (t.bytes() > 0 && t.data == nullptr)
    return Status::error("tensor of shape {} has no data", shapeString(t.shape));
  return Status::ok();
}

// --- files ---------------------------------------------------------------------

Expected<std::vector<uint8_t>> readWholeFile(const std::string &path) {
  auto map = MappedFile::open(path);
  if (!map)
    return map.status();
  std::span<const uint8_t> bytes = (*map)->bytes();
  try {
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  } catch (const std::exception &) {
    return Status::error("{}: cannot allocate {} bytes to read it", path, bytes.size());
  }
}

// --- zip -----------------------------------------------------------------------

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEocdSig = 0x06054b50,
                   kEocd64Sig = 0x06064b50, kEocd64LocSig = 0x07064b50;
constexpr uint32_t kMax32 = 0xFFFFFFFF;
constexpr uint16_t kMax16 = 0xFFFF;

struct ZipMember {
  std::string name;
  uint16_t flags, method;
  uint32_t crc;
  uint64_t compressedSize, size, localOffset;
  uint64_t centralOffset; // for messages
};

Expected<std::vector<ZipMember>> readCentralDirectory(Bytes z) {
  // The end-of-central-directory record is the last 22 bytes plus a comment
  // of at most 64 KiB: search backwards for its signature.
  if (z.size() < 22)
    return Status::error("not a zip archive: {} bytes, too small for the end record", z.size());
  size_t lowest = z.size() >= 22 + 0xFFFF ? z.size() - 22 - 0xFFFF : 0;
  size_t eocd = SIZE_MAX;
  for (size_t pos = z.size() - 22 + 1; pos-- > lowest;) {
    if (rd32(z.data() + pos) == kEocdSig && pos + 22 + rd16(z.data() + pos + 20) <= z.size()) {
      eocd = pos;
      break;
    }
  }
  if (eocd == SIZE_MAX)
    return Status::error("not a zip archive (no end-of-central-directory record)");
  const uint8_t *e = z.data() + eocd;
  if (rd16(e + 4) != 0 || rd16(e + 6) != 0)
    return Status::error("multi-disk zip archives are not supported");
  uint64_t entries = rd16(e + 10), cdSize = rd32(e + 12), cdOffset = rd32(e + 16);
  // Zip64: a locator just before the end record points at the zip64 end record.
  if (eocd >= 20 && rd32(z.data() + eocd - 20) == kEocd64LocSig) {
    uint64_t rec = rd64(z.data() + eocd - 20 + 8);
    if (!rangeInside(rec, 56, z.size()) || rd32(z.data() + rec) != kEocd64Sig)
      return Status::error("bad zip64 end record offset {}", rec);
    const uint8_t *r = z.data() + rec;
    entries = rd64(r + 32);
    cdSize = rd64(r + 40);
    cdOffset = rd64(r + 48);
  } else if (entries == kMax16 || cdSize == kMax32 || cdOffset == kMax32) {
    return Status::error("zip64 archive without a zip64 end-record locator");
  }
  if (!rangeInside(cdOffset, cdSize, z.size()))
    return Status::error("central directory [{}, +{}) lies outside the {}-byte file", cdOffset,
                         cdSize, z.size());
  if (entries > cdSize / 46)
    return Status::error("{} entries cannot fit in a {}-byte central directory", entries, cdSize);

  std::vector<ZipMember> members;
  members.reserve(entries);
  uint64_t pos = cdOffset, end = cdOffset + cdSize;
  for (uint64_t i = 0; i < entries; ++i) {
    if (!rangeInside(pos, 46, end) || rd32(z.data() + pos) != kCentralSig)
      return Status::error("bad central directory entry {} at offset {}", i, pos);
    const uint8_t *c = z.data() + pos;
    ZipMember m;
    m.centralOffset = pos;
    m.flags = rd16(c + 8);
    m.method = rd16(c + 10);
    m.crc = rd32(c + 16);
    m.compressedSize = rd32(c + 20);
    m.size = rd32(c + 24);
    uint16_t nameLen = rd16(c + 28), extraLen = rd16(c + 30), commentLen = rd16(c + 32);
    m.localOffset = rd32(c + 42);
    uint64_t varLen = uint64_t(nameLen) + extraLen + commentLen;
    if (!rangeInside(pos + 46, varLen, end))
      return Status::error("central directory entry {} at offset {} is truncated", i, pos);
    m.name.assign(reinterpret_cast<const char *>(c + 46), nameLen);
    // Zip64 extra field: 64-bit values for exactly the fields saturated above.
    const uint8_t *x = c + 46 + nameLen;
    for (size_t xp = 0; xp + 4 <= extraLen;) {
      uint16_t id = rd16(x + xp), len = rd16(x + xp + 2);
      if (xp + 4 + len > extraLen)
        return Status::error("member '{}': extra field overruns its entry (offset {})", m.name,
                             pos + 46 + nameLen + xp);
      if (id == 0x0001) {
        const uint8_t *f = x + xp + 4;
        size_t left = len;
        auto take = [&](uint64_t &field) -> bool {
          if (field != kMax32)
            return true;
          if (left < 8)
            return false;
          field = rd64(f);
          f += 8;
          left -= 8;
          return true;
        };
        if (!take(m.size) || !take(m.compressedSize) || !take(m.localOffset))
          return Status::error("member '{}': zip64 extra field too short (offset {})", m.name,
                               pos + 46 + nameLen + xp);
      }
      xp += 4 + len;
    }
    members.push_back(std::move(m));
    pos += 46 + varLen;
  }
  return members;
}

uint32_t crc32Of(Bytes b) { return crc32Update(crc32Update(0, nullptr, 0), b.data(), b.size()); }

/// A member's data as stored in the archive (compressed or not), after its
/// local header; a stored member's size and CRC checked.
Expected<Bytes> memberData(Bytes z, const ZipMember &m) {
  if (m.flags & 0x1)
    return Status::error("member is encrypted");
  if (!rangeInside(m.localOffset, 30, z.size()) || rd32(z.data() + m.localOffset) != kLocalSig)
    return Status::error("bad local header at offset {}", m.localOffset);
  const uint8_t *l = z.data() + m.localOffset;
  uint64_t dataStart = m.localOffset + 30 + rd16(l + 26) + rd16(l + 28);
  if (!rangeInside(dataStart, m.compressedSize, z.size()))
    return Status::error("data [{}, +{}) lies outside the {}-byte archive", dataStart,
                         m.compressedSize, z.size());
  Bytes in = z.subspan(dataStart, m.compressedSize);
  if (m.method == 0) {
    if (m.compressedSize != m.size)
      return Status::error("stored member has compressed size {} != size {}", m.compressedSize,
                           m.size);
    if (uint32_t crc = crc32Of(in); crc != m.crc)
      return Status::error("CRC32 mismatch (stored {:#010x}, computed {:#010x})", m.crc, crc);
  }
  return in;
}

Expected<std::vector<uint8_t>> extractMember(Bytes z, const ZipMember &m) {
  auto data = memberData(z, m);
  if (!data)
    return data.status();
  Bytes in = *data;
  std::vector<uint8_t> out;
  if (m.method == 0) {
    out.assign(in.begin(), in.end());
    return out; // its CRC checked by memberData
  } else if (m.method == 8) {
    // Deflate expands at most ~1032:1; a larger claim is corruption, and
    // must not turn into a huge allocation.
    if (m.size / 1032 > m.compressedSize + 1)
      return Status::error("implausible uncompressed size {} for {} compressed bytes", m.size,
                           m.compressedSize);
    out.resize(m.size);
    z_stream zs{};
    if (inflateInit2(&zs, -15) != Z_OK)
      return Status::error("zlib inflateInit2 failed");
    size_t inPos = 0, outPos = 0;
    int ret;
    for (;;) {
      // avail_in/avail_out are 32-bit: feed multi-GiB members in pieces.
      size_t inChunk = std::min<size_t>(in.size() - inPos, UINT_MAX);
      size_t outChunk = std::min<size_t>(out.size() - outPos, UINT_MAX);
      zs.next_in = const_cast<Bytef *>(in.data() + inPos);
      zs.avail_in = static_cast<uInt>(inChunk);
      zs.next_out = out.data() + outPos;
      zs.avail_out = static_cast<uInt>(outChunk);
      ret = inflate(&zs, Z_NO_FLUSH);
      inPos += inChunk - zs.avail_in;
      outPos += outChunk - zs.avail_out;
      if (ret == Z_STREAM_END)
        break;
      // Z_OK means progress (bounded by the sizes); anything else is an
      // error, including Z_BUF_ERROR when input or output ran out early.
      if (ret != Z_OK) {
        Status st = Status::error(
            "corrupt deflate data ({}; at input byte {} of {}, output byte {} of {})",
            ret == Z_BUF_ERROR ? "sizes do not match the directory" : (zs.msg ? zs.msg : "error"),
            inPos, in.size(), outPos, out.size());
        inflateEnd(&zs);
        return st;
      }
    }
    inflateEnd(&zs);
    if (outPos != out.size())
      return Status::error("inflated to {} bytes, the directory says {}", outPos, out.size());
  } else {
    return Status::error("unsupported compression method {} (only stored and deflate)", m.method);
  }
  if (uint32_t crc = crc32Of(out); crc != m.crc)
    return Status::error("CRC32 mismatch (stored {:#010x}, computed {:#010x})", m.crc, crc);
  return out;
}

/// An array over `image` (a .npy image inside `owner`'s bytes).
Expected<MappedArray> mappedArray(Bytes image, std::shared_ptr<const void> owner) {
  auto h = parseNpyHeader(image);
  if (!h)
    return h.status();
  MappedArray a;
  a.dtype = h->dtype;
  a.shape = std::move(h->shape);
  a.data = image.data() + h->dataOffset;
  a.size = h->dataBytes;
  a.owner = std::move(owner);
  return a;
}

void put16(std::vector<uint8_t> &v, uint16_t x) {
  v.push_back(static_cast<uint8_t>(x));
  v.push_back(static_cast<uint8_t>(x >> 8));
}
void put32(std::vector<uint8_t> &v, uint32_t x) {
  put16(v, static_cast<uint16_t>(x));
  put16(v, static_cast<uint16_t>(x >> 16));
}
void put64(std::vector<uint8_t> &v, uint64_t x) {
  put32(v, static_cast<uint32_t>(x));
  put32(v, static_cast<uint32_t>(x >> 32));
}

/// The "*.npy" members of archive `z` (numpy.load exposes only those as
/// arrays), each made by `make` and keyed by its name without the suffix;
/// errors name `path` and the member. readNpz and mapNpz share it.
template <typename T, typename Make>
Expected<std::map<std::string, T>> npyMembers(Bytes z, const std::string &path, Make make) {
  try {
    auto members = readCentralDirectory(z);
    if (!members)
      return members.status().prefix(path);
    std::map<std::string, T> out;
    for (const ZipMember &m : *members) {
      if (m.name.size() < 4 || m.name.compare(m.name.size() - 4, 4, ".npy") != 0)
        continue;
      std::string key = m.name.substr(0, m.name.size() - 4);
      std::string where = fmt::format("{}: member '{}'", path, m.name);
      if (out.count(key))
        return Status::error("{}: duplicate member", where);
      Expected<T> a = make(m);
      if (!a)
        return a.status().prefix(where);
      out.emplace(std::move(key), a.take());
    }
    return out;
  } catch (const std::bad_alloc &) {
    return Status::error("{}: out of memory", path);
  }
}

} // namespace

// --- public API --------------------------------------------------------------------

Expected<HostTensor> parseNpy(const std::vector<uint8_t> &bytes, const std::string &origin) {
  try {
    auto t = parseNpyBytes(bytes);
    if (!t)
      return t.status().prefix(origin);
    return t;
  } catch (const std::bad_alloc &) {
    return Status::error("{}: out of memory", origin);
  }
}

Expected<HostTensor> readNpy(const std::string &path) {
  auto bytes = readWholeFile(path);
  if (!bytes)
    return bytes.status();
  return parseNpy(*bytes, path);
}

std::vector<uint8_t> encodeNpy(const TensorView &tensor) {
  std::vector<uint8_t> out = encodeNpyHeader(tensor);
  if (checkEncodable(tensor).isOk() && tensor.bytes() > 0) {
    const uint8_t *p = static_cast<const uint8_t *>(tensor.data);
    out.insert(out.end(), p, p + tensor.bytes());
  }
  return out;
}

Status writeNpy(const std::string &path, const TensorView &tensor) {
  if (Status s = checkEncodable(tensor); !s.isOk())
    return s.prefix(path);
  AtomicFileWriter f(path);
  FORGE_RETURN_IF_ERROR(f.open());
  FORGE_RETURN_IF_ERROR(f.write(encodeNpyHeader(tensor)));
  FORGE_RETURN_IF_ERROR(f.write(tensor.data, tensor.bytes()));
  return f.commit();
}

Expected<std::map<std::string, HostTensor>> readNpz(const std::string &path) {
  auto file = readWholeFile(path);
  if (!file)
    return file.status();
  return parseNpz(*file, path);
}

Expected<std::map<std::string, HostTensor>> parseNpz(const std::vector<uint8_t> &file,
                                                     const std::string &path) {
  return npyMembers<HostTensor>(file, path, [&](const ZipMember &m) -> Expected<HostTensor> {
    auto bytes = extractMember(file, m);
    if (!bytes)
      return bytes.status();
    return parseNpyBytes(*bytes);
  });
}

Expected<MappedArray> mapNpy(const std::string &path) {
  auto map = MappedFile::open(path);
  if (!map)
    return map.status();
  auto a = mappedArray((*map)->bytes(), *map);
  if (!a)
    return a.status().prefix(path);
  return a;
}

Expected<std::map<std::string, MappedArray>> mapNpz(const std::string &path) {
  auto mapped = MappedFile::open(path);
  if (!mapped)
    return mapped.status();
  std::shared_ptr<const MappedFile> map = *mapped;
  return npyMembers<MappedArray>(map->bytes(), path, [&](const ZipMember &m)
                                                         -> Expected<MappedArray> {
    if (m.method == 0) { // stored: the array's bytes are the file's
      auto data = memberData(map->bytes(), m);
      if (!data)
        return data.status();
      return mappedArray(*data, map);
    }
    auto bytes = extractMember(map->bytes(), m); // compressed: inflated
    if (!bytes)
      return bytes.status();
    auto owned = std::make_shared<std::vector<uint8_t>>(bytes.take());
    return mappedArray(Bytes(*owned), owned);
  });
}

Status writeNpz(const std::string &path, const std::map<std::string, TensorView> &arrays) {
  for (const auto &[name, t] : arrays) {
    if (name.empty() || name.size() > 0xFFFF - 4)
      return Status::error("{}: invalid array name '{}'", path, name);
    if (Status s = checkEncodable(t); !s.isOk())
      return s.prefix(fmt::format("{}: array '{}'", path, name));
  }
  AtomicFileWriter f(path);
  FORGE_RETURN_IF_ERROR(f.open());
  std::vector<uint8_t> central;
  constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1; // 1980-01-01: reproducible output
  for (const auto &[name, t] : arrays) {
    std::string member = name + ".npy";
    std::vector<uint8_t> header = encodeNpyHeader(t);
    uint64_t size = header.size() + t.bytes();
    uint32_t crc = crc32Update(crc32Update(0, nullptr, 0), header.data(), header.size());
    crc = crc32Update(crc, t.data, t.bytes());
    uint64_t offset = f.offset();
    bool bigSize = size >= kMax32, bigOffset = offset >= kMax32;
    uint16_t version = bigSize || bigOffset ? 45 : 20;

    std::vector<uint8_t> local;
    put32(local, kLocalSig);
    put16(local, version);
    put16(local, 0); // flags
    put16(local, 0); // stored
    put16(local, 0); // time
    put16(local, kDosDate);
    put32(local, crc);
    put32(local, bigSize ? kMax32 : static_cast<uint32_t>(size));
    put32(local, bigSize ? kMax32 : static_cast<uint32_t>(size));
    put16(local, static_cast<uint16_t>(member.size()));
    put16(local, bigSize ? 20 : 0);
    local.insert(local.end(), member.begin(), member.end());
    if (bigSize) {
      put16(local, 0x0001);
      put16(local, 16);
      put64(local, size);
      put64(local, size);
    }
    FORGE_RETURN_IF_ERROR(f.write(local));
    FORGE_RETURN_IF_ERROR(f.write(header));
    FORGE_RETURN_IF_ERROR(f.write(t.data, t.bytes()));

    std::vector<uint8_t> extra;
    if (bigSize) {
      put64(extra, size);
      put64(extra, size);
    }
    if (bigOffset)
      put64(extra, offset);
    put32(central, kCentralSig);
    put16(central, (3 << 8) | version); // made by: Unix
    put16(central, version);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, kDosDate);
    put32(central, crc);
    put32(central, bigSize ? kMax32 : static_cast<uint32_t>(size));
    put32(central, bigSize ? kMax32 : static_cast<uint32_t>(size));
    put16(central, static_cast<uint16_t>(member.size()));
    put16(central, static_cast<uint16_t>(extra.empty() ? 0 : extra.size() + 4));
    put16(central, 0);           // comment
    put16(central, 0);           // disk
    put16(central, 0);           // internal attributes
    put32(central, 0644u << 16); // external attributes: Unix mode
    put32(central, bigOffset ? kMax32 : static_cast<uint32_t>(offset));
    central.insert(central.end(), member.begin(), member.end());
    if (!extra.empty()) {
      put16(central, 0x0001);
      put16(central, static_cast<uint16_t>(extra.size()));
      central.insert(central.end(), extra.begin(), extra.end());
    }
  }
  uint64_t cdOffset = f.offset(), cdSize = central.size(), entries = arrays.size();
  std::vector<uint8_t> tail;
  bool zip64 = entries >= kMax16 || cdSize >= kMax32 || cdOffset >= kMax32;
  if (zip64) {
    uint64_t recOffset = cdOffset + cdSize;
    put32(tail, kEocd64Sig);
    put64(tail, 44); // size of the rest of this record
    put16(tail, (3 << 8) | 45);
    put16(tail, 45);
    put32(tail, 0);
    put32(tail, 0);
    put64(tail, entries);
    put64(tail, entries);
    put64(tail, cdSize);
    put64(tail, cdOffset);
    put32(tail, kEocd64LocSig);
    put32(tail, 0);
    put64(tail, recOffset);
    put32(tail, 1);
  }
  put32(tail, kEocdSig);
  put16(tail, 0);
  put16(tail, 0);
  put16(tail, zip64 ? kMax16 : static_cast<uint16_t>(entries));
  put16(tail, zip64 ? kMax16 : static_cast<uint16_t>(entries));
  put32(tail, zip64 ? kMax32 : static_cast<uint32_t>(cdSize));
  put32(tail, zip64 ? kMax32 : static_cast<uint32_t>(cdOffset));
  put16(tail, 0);
  FORGE_RETURN_IF_ERROR(f.write(central));
  FORGE_RETURN_IF_ERROR(f.write(tail));
  return f.commit();
}

} // namespace forge::rt
