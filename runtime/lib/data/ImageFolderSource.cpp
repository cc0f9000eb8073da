// Image folders as a data source (DataSource.h): ImageNet's layout, one
// subfolder per class holding JPEG/PNG files, decoded on the CPU.
//
// Layout: classes are the subfolders of the root in byte order of their names
// (class i = the i-th name, as torchvision's ImageFolder numbers them); samples
// are the .jpg/.jpeg/.png files (any case) of each class folder, class after
// class, each folder's files in byte order of their names. Hidden entries and
// other files are ignored (and counted); a class folder without an image is an
// error, so a label is never silently renumbered.
//
// Decoding: libjpeg-turbo (with its DCT scaling, the smallest 1/8..1 factor that
// still covers the crop) and libpng's simplified API, to 8-bit RGB; then one
// bilinear pass (half-pixel centres) that scales the shorter side to `resize`
// (0: the smallest scale that covers the crop) and takes the centre crop the
// bundle's input asks for. With randomResizedCrop (training) the crop is instead a
// random box (area share and log-uniform aspect ratio, as torchvision's
// RandomResizedCrop) scaled to the input's size, drawn from Philox keyed by
// (seed, epoch, sample index): independent of workers, repeated on resume.
// Float inputs get (pixel / 255 - mean[c]) / std[c]; uint8 inputs the pixels
// themselves.
//
// Invariants:
//  * bind() needs exactly an image input ([3, H, W] or [H, W, 3] of f32, bf16,
//    f16 or u8) and an integer label input ([] or [1] per sample) whose class
//    count, when known, covers the folder's classes.
//  * fill() reads files with plain read()s (no mapping: a truncated file is a
//    bad record, never a SIGBUS) and may run on several threads.
//  * A file that fails to read or decode, or decodes with a libjpeg warning
//    (truncated data), is a bad record, named with its path and sample index:
//    an error, or with skipBadRecords a warning (once per file) and the next
//    good sample in folder order in its place. No record is silently wrong.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmdb.h>
#include <png.h>
#include <turbojpeg.h>

#include <fmt/ranges.h>

#include "DataUtil.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/Philox.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxFileBytes = int64_t(1) << 28;   // 256 MiB per image file
constexpr int64_t kMaxDecodedPixels = int64_t(1) << 27; // after DCT scaling

struct Rgb {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels; // height * width * 3
};

bool hasImageExtension(const std::string &name) {
  std::string ext = fs::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

Status readWhole(const std::string &path, std::vector<uint8_t> &out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return Status::error("cannot open: {}", std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error("not a regular file");
  }
  if (st.st_size > kMaxFileBytes) {
    ::close(fd);
    return Status::error("{} bytes is more than an image file may have ({})", st.st_size,
                         kMaxFileBytes);
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ::close(fd);
      return Status::error("read failed at byte {}: {}", done,
                           n < 0 ? std::strerror(errno) : "the file got shorter");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::ok();
}

/// One decompressor per thread (tjInitDecompress allocates).
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h)
      tjDestroy(h);
  }
};

/// Decodes a JPEG, shrunk by its DCT by the largest of 8, 4 and 2 that leaves at
/// least the size the crop's scaling makes of the image (so the bilinear pass never
/// enlarges what the DCT shrank): Pillow's draft() rule, so that a reference can
/// reproduce it. `scaleOf(w, h)` is the crop's scaling of a w x h image.
template <typename ScaleOf>
Status decodeJpeg(std::span<const uint8_t> bytes, ScaleOf scaleOf, Rgb &out) {
  thread_local TjHandle tj;
  if (!tj.h)
    return Status::error("libjpeg-turbo: {}", tjGetErrorStr2(nullptr));
  unsigned char *src = const_cast<unsigned char *>(bytes.data());
  const unsigned long size = static_cast<unsigned long>(bytes.size());
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.h, src, size, &w, &h, &subsamp, &colorspace) != 0)
    return Status::error("not a readable JPEG: {}", tjGetErrorStr2(tj.h));
  if (w <= 0 || h <= 0)
    return Status::error("not a readable JPEG (its header gives {}x{} pixels)", w, h);
  const double s = scaleOf(w, h);
  const int64_t needW = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(w * s - 1e-9)));
  const int64_t needH = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(h * s - 1e-9)));
  const int64_t room = std::min(w / needW, h / needH);
  const int shrink = room >= 8 ? 8 : room >= 4 ? 4 : room >= 2 ? 2 : 1;
  const tjscalingfactor factor{1, shrink};
  const int bestW = TJSCALED(w, factor), bestH = TJSCALED(h, factor);
  if (static_cast<int64_t>(bestW) * bestH > kMaxDecodedPixels)
    return Status::error("JPEG of {}x{} pixels is too large to decode ({}x{} after scaling)", w,
                         h, bestW, bestH);
  out.width = bestW, out.height = bestH;
  out.pixels.resize(static_cast<size_t>(bestW) * bestH * 3);
  // Warnings (truncated or corrupt data that libjpeg pads with grey) are errors here.
  if (tjDecompress2(tj.h, src, size, out.pixels.data(), bestW, 0, bestH, TJPF_RGB,
                    TJFLAG_STOPONWARNING) != 0)
    return Status::error("corrupt JPEG data: {}", tjGetErrorStr2(tj.h));
  return Status::ok();
}

Status decodePng(std::span<const uint8_t> bytes, Rgb &out) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    return Status::error("not a readable PNG: {}", image.message);
  if (static_cast<int64_t>(image.width) * image.height > kMaxDecodedPixels) {
    png_image_free(&image);
    return Status::error("PNG of {}x{} pixels is too large to decode", image.width,
                         image.height);
  }
  image.format = PNG_FORMAT_RGB; // alpha composited over black, 16-bit reduced, grey expanded
  out.width = static_cast<int>(image.width), out.height = static_cast<int>(image.height);
  out.pixels.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr))
    return Status::error("corrupt PNG data: {}", image.message);
  return Status::ok();
}

/// A baseline (or extended sequential) 8-bit JPEG of 1 or 3 components -- what the GPU
/// decoders take -- and its size from its frame header; false for anything else
/// (progressive, lossless, arithmetic coding, CMYK, a truncated header).
bool baselineJpegSize(std::span<const uint8_t> b, int &width, int &height) {
  if (b.size() < 4 || b[0] != 0xFF || b[1] != 0xD8)
    return false;
  for (size_t at = 2; at + 4 <= b.size();) {
    if (b[at] != 0xFF)
      return false;
    const uint8_t marker = b[at + 1];
    if (marker == 0xFF) { // fill byte
      ++at;
      continue;
    }
    const size_t length = size_t(b[at + 2]) << 8 | b[at + 3];
    if (length < 2 || at + 2 + length > b.size())
      return false;
    if (marker == 0xC0 || marker == 0xC1) { // SOF0 / SOF1: sequential, Huffman
      if (length < 8)
        return false;
      const uint8_t *f = b.data() + at + 4;
      const int components = f[5];
      height = f[1] << 8 | f[2], width = f[3] << 8 | f[4];
      return f[0] == 8 && (components == 1 || components == 3) && width > 0 && height > 0;
    }
    if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) ||
        marker == 0xDA || marker == 0xD9) // another frame kind, or the scan before a frame
      return false;
    at += 2 + length;
  }
  return false;
}

/// A bilinear mix of u8 values (within [0, 255]) back to u8, rounded half up; in double,
/// so that v + 0.5 is exact (std::lround's call per value tripled the fill time).
inline uint8_t toPixel(float v) {
  return static_cast<uint8_t>(std::min(255.0, std::max(0.0, static_cast<double>(v) + 0.5)));
}

bool isPng(std::span<const uint8_t> b) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), sig, 8) == 0;
}

struct Sample {
  std::string path;
  int64_t label;
};

/// One record of an image source: encoded bytes (JPEG/PNG), or raw 8-bit pixels in
/// `rgb` (channels-last RGB) when `raw`; its label; its name for messages.
struct Record {
  std::vector<uint8_t> bytes;
  bool raw = false;
  Rgb rgb;
  int64_t label = 0;
  std::string name;
};

/// Decoding, crops, normalization and bad-record handling of images from a source of
/// records (an image folder, an LMDB); subclasses say how many records there are, how
/// many classes, and read one.
class ImageSource : public DataSource {
public:
  explicit ImageSource(ImageOptions options) : options_(std::move(options)) {}
  virtual int64_t numRecords() const = 0;
  virtual int64_t numClasses() const = 0;
  virtual const char *classesNoun() const = 0; // "class folders", "classes"
  /// Reads record `index` (thread-safe).
  virtual Status readRecord(int64_t index, Record &out) = 0;

  Status bind(const std::vector<DataField> &fields) override {
    fields_ = fields;
    imageField_ = labelField_ = -1;
    auto describeFields = [&] {
      std::vector<std::string> list;
      for (const DataField &f : fields)
        list.push_back(fmt::format("{} {}{}", f.name, dtypeName(f.dtype), data::batchShape(f)));
      return fmt::format("{}", fmt::join(list, ", "));
    };
    // The label: the loss's label input, else the one integer input of rank <= 1.
    for (size_t i = 0; i < fields.size(); ++i)
      if (fields[i].isLabel)
        labelField_ = static_cast<int>(i);
    for (size_t i = 0; i < fields.size() && labelField_ < 0; ++i)
      if (data::isIntegerType(fields[i].dtype) && fields[i].sampleShape.size() <= 1)
        labelField_ = static_cast<int>(i);
    // A canvas bundle's crop boxes: the input IMAGE.crop.
    cropField_ = -1;
    const bool canvas = options_.cropHeight > 0;
    for (size_t i = 0; i < fields.size() && canvas; ++i)
      if (fields[i].name.size() > 5 && fields[i].name.ends_with(".crop") &&
          static_cast<int>(i) != labelField_)
        cropField_ = static_cast<int>(i);
    if (fields.size() != (canvas ? 3u : 2u) || (canvas && cropField_ < 0))
      return Status::error("{}: an image folder feeds one image input{} and one label input; the "
                           "bundle's data inputs are {}",
                           describe(), canvas ? ", its crop boxes (IMAGE.crop)" : "",
                           describeFields());
    imageField_ = -1;
    for (size_t i = 0; i < fields.size() && imageField_ < 0; ++i)
      if (static_cast<int>(i) != labelField_ && static_cast<int>(i) != cropField_)
        imageField_ = static_cast<int>(i);
    if (imageField_ < 0 || labelField_ < 0)
      return Status::error("{}: an image folder feeds an image input [B, 3, H, W] or [B, H, W, 3] "
                           "and an integer label input [B]; the bundle's data inputs are {}",
                           describe(), describeFields());
    const DataField &img = fields[imageField_], &lab = fields[labelField_];
    const auto &s = img.sampleShape;
    const bool floatType =
        img.dtype == bundle::F32 || img.dtype == bundle::BF16 || img.dtype == bundle::F16;
    if (!(floatType || img.dtype == bundle::U8) || s.size() != 3 || (s[0] != 3 && s[2] != 3))
      return Status::error("{}: the image input '{}' is {} {}; an image folder feeds [B, 3, H, W] "
                           "or [B, H, W, 3] of f32, bf16, f16 or u8",
                           describe(), img.name, dtypeName(img.dtype), data::batchShape(img));
    channelsFirst_ = s[0] == 3;
    height_ = channelsFirst_ ? s[1] : s[0];
    width_ = channelsFirst_ ? s[2] : s[1];
    if (height_ <= 0 || width_ <= 0)
      return Status::error("{}: the image input '{}' has {}x{} pixels", describe(), img.name,
                           height_, width_);
    if (canvas) {
      const DataField &crop = fields[cropField_];
      if (img.dtype != bundle::U8 || channelsFirst_ || crop.name != img.name + ".crop" ||
          crop.dtype != bundle::F32 || crop.sampleShape != std::vector<int64_t>{6})
        return Status::error("{}: a canvas bundle (build option image_crop) takes a u8 canvas "
                             "[B, H, W, 3] and its crop boxes IMAGE.crop [B, 6] f32; the bundle's "
                             "data inputs are {}",
                             describe(), describeFields());
      canvasHeight_ = height_, canvasWidth_ = width_; // the canvas; the crop is smaller
      height_ = options_.cropHeight, width_ = options_.cropWidth;
    }
    if (!data::isIntegerType(lab.dtype) || lab.dtype == bundle::BOOL ||
        !(lab.sampleShape.empty() || (lab.sampleShape.size() == 1 && lab.sampleShape[0] == 1)))
      return Status::error("{}: the label input '{}' is {} {}; an image folder feeds class "
                           "indices [B] of an integer type",
                           describe(), lab.name, dtypeName(lab.dtype), data::batchShape(lab));
    const int64_t classes = numClasses(); // < 0: not known before reading (checked per record)
    if (classes >= 0 && ((lab.numClasses > 0 && classes > lab.numClasses) ||
                         classes - 1 > data::maxOfIntType(lab.dtype)))
      return Status::error("{}: {} {}, but the label input '{}' takes {}", describe(), classes,
                           classesNoun(), lab.name,
                           lab.numClasses > 0
                               ? fmt::format("{} classes", lab.numClasses)
                               : fmt::format("labels up to {}", data::maxOfIntType(lab.dtype)));
    if (img.dtype == bundle::U8 && (!options_.mean.empty() || !options_.std.empty()))
      return Status::error("{}: the image input '{}' is u8 (raw pixels); --image-mean/--image-std "
                           "apply to float inputs only",
                           describe(), img.name);
    mean_ = options_.mean.empty() ? std::vector<float>(3, 0.0f) : options_.mean;
    invStd_.assign(3, 1.0f);
    for (size_t c = 0; c < 3 && !options_.std.empty(); ++c)
      invStd_[c] = 1.0f / options_.std[c];
    return Status::ok();
  }

  int64_t numSamples() const override { return numRecords(); }
  bool concurrentFill() const override { return true; }
  Expected<int> encodeImages() override {
    if (cropField_ < 0)
      return Status::error("{}: only a canvas bundle (forgec --augment pixels,canvas=HxW) takes "
                           "images decoded on the device",
                           describe());
    encoded_ = true;
    return imageField_;
  }
  void setEpoch(uint64_t epoch) override { epoch_ = epoch; }

  Status fill(std::span<const int64_t> indices, std::span<void *const> outs) override {
    if (outs.size() != fields_.size() + (encoded_ ? 1 : 0) || imageField_ < 0)
      return Status::error("{}: fill with {} buffers, {} fields bound", describe(), outs.size(),
                           fields_.size());
    // encodeImages(): each sample's JPEG length, 0 where this fill decoded it.
    uint32_t *lengths = encoded_ ? static_cast<uint32_t *>(outs[fields_.size()]) : nullptr;
    const DataField &img = fields_[imageField_], &lab = fields_[labelField_];
    const size_t pixels = static_cast<size_t>(height_ * width_);
    const size_t imageBytes =
        (cropField_ >= 0 ? static_cast<size_t>(canvasHeight_ * canvasWidth_) : pixels) * 3 *
        dtypeSize(img.dtype);
    uint8_t *imgOut = static_cast<uint8_t *>(outs[imageField_]);
    uint8_t *labOut = static_cast<uint8_t *>(outs[labelField_]);
    Record record;
    Rgb rgb;
    std::vector<float> f32;
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t idx = indices[i];
      if (idx < 0 || idx >= numSamples())
        return Status::error("{}: sample index {} out of range [0, {})", describe(), idx,
                             numSamples());
      // A bad record: an error, or the next good sample in folder order.
      int64_t used = idx;
      Box box{};
      int origW = 0, origH = 0;
      // The crop's scaling of a w x h image (JPEGs: before decoding, for the DCT shrink).
      auto scaling = [&](int w, int h) {
        origW = w, origH = h;
        double s = scaleOf(w, h);
        if (options_.randomResizedCrop) {
          box = randomBox(w, h, idx);
          s = std::max(width_ / box.w, height_ / box.h);
        }
        // A canvas takes the image whole: the DCT may shrink it to fit (then the crop
        // scales it up a little less than it could have: the canvas is the limit).
        if (cropField_ >= 0)
          s = std::min({s, double(canvasWidth_) / w, double(canvasHeight_) / h});
        return s;
      };
      size_t encodedBytes = 0; // a JPEG the device decodes: its bytes go as they are
      for (int64_t tries = 0;; ++tries) {
        Status st = readRecord(used, record);
        int jw = 0, jh = 0;
        encodedBytes = 0;
        if (st.isOk() && lengths && !record.raw && baselineJpegSize(record.bytes, jw, jh) &&
            jw <= canvasWidth_ && jh <= canvasHeight_ && record.bytes.size() <= imageBytes) {
          encodedBytes = record.bytes.size();
          scaling(jw, jh); // the box (origW/origH = the full size it decodes to)
          rgb.width = jw, rgb.height = jh;
        } else if (st.isOk() && record.raw) {
          std::swap(rgb, record.rgb);
          scaling(rgb.width, rgb.height);
        } else if (st.isOk()) {
          const std::vector<uint8_t> &file = record.bytes;
          st = isPng(file) ? decodePng(file, rgb) : decodeJpeg(file, scaling, rgb);
          if (st.isOk() && isPng(file))
            scaling(rgb.width, rgb.height);
        }
        if (st.isOk())
          break;
        Status bad = Status::error("{} (sample {} of {}): {}", record.name, used, origin(),
                                   st.message());
        if (!options_.skipBadRecords)
          return bad;
        warnOnce(record.name, bad.message());
        if (tries + 1 >= numSamples())
          return Status::error("{}: no image decodes (the last: {})", describe(), bad.message());
        used = (used + 1) % numSamples();
      }
      uint8_t *dst = imgOut + i * imageBytes;
      if (lengths)
        lengths[i] = static_cast<uint32_t>(encodedBytes);
      const std::optional<Box> canvasCrop =
          options_.randomResizedCrop ? std::optional<Box>(box) : std::nullopt;
      if (encodedBytes > 0) { // the file for the device to decode, the box of its full size
        std::memcpy(dst, record.bytes.data(), encodedBytes);
        canvasBox(rgb.width, rgb.height, canvasCrop, origW, origH,
                  static_cast<float *>(outs[cropField_]) + i * 6);
      } else if (cropField_ >= 0) { // the image into the canvas, its box beside it
        fillCanvas(rgb, canvasCrop, origW, origH, dst,
                   static_cast<float *>(outs[cropField_]) + i * 6);
      } else if (const Geometry geometry =
                     options_.randomResizedCrop
                         ? boxGeometry(box, double(rgb.width) / origW, double(rgb.height) / origH)
                         : centre(rgb.width, rgb.height);
                 img.dtype == bundle::U8) {
        cropInto(rgb, geometry, [&](size_t o, int c, float v) {
          dst[o * 3 + static_cast<size_t>(c)] = toPixel(v);
        });
        if (channelsFirst_)
          toChannelsFirst(dst, pixels);
      } else {
        f32.resize(pixels * 3);
        cropInto(rgb, geometry, [&](size_t o, int c, float v) {
          const size_t at = channelsFirst_ ? static_cast<size_t>(c) * pixels + o : o * 3 + c;
          f32[at] = (v * (1.0f / 255.0f) - mean_[c]) * invStd_[c];
        });
        if (img.dtype == bundle::F32)
          std::memcpy(dst, f32.data(), imageBytes);
        else
          narrowFloatsInto(reinterpret_cast<const uint8_t *>(f32.data()), f32.size() * 4,
                           img.dtype, dst);
      }
      if ((lab.numClasses > 0 && !data::labelOk(lab, record.label)) || record.label < 0 ||
          record.label > data::maxOfIntType(lab.dtype))
        return Status::error("{} (sample {} of {}): label {} is outside {}", record.name, used,
                             origin(), record.label,
                             lab.numClasses > 0
                                 ? fmt::format("[0, {})", lab.numClasses)
                                 : fmt::format("[0, {}]", data::maxOfIntType(lab.dtype)));
      data::storeInt(labOut + i * dtypeSize(lab.dtype), lab.dtype, record.label);
    }
    return Status::ok();
  }

protected:
  /// The file or folder behind the source (messages).
  virtual std::string origin() const = 0;

private:
  /// Scales `rgb` so that the shorter side is options_.resize (or just covers the
  /// crop) and calls put(pixel offset, channel, value in [0, 255]) for the centre
  /// crop, bilinear with half-pixel centres.
  /// Output pixel (x, y) samples source (x + offX + 0.5) / scaleX - 0.5 (and so for y).
  struct Geometry {
    double scaleX, scaleY, offX, offY;
  };
  /// The centre crop of a w x h image (the shorter side to options_.resize first).
  Geometry centre(int w, int h) const {
    const double s = scaleOf(w, h);
    return {s, s, (w * s - width_) / 2, (h * s - height_) / 2};
  }
  /// A random-resized crop's box in a w x h image, as torchvision draws it: up to 10
  /// tries of an area share and a log-uniform aspect ratio whose box fits, then the
  /// centre crop at the ratio clamped to the range. Philox keyed by (seed, epoch, sample).
  struct Box {
    double x0, y0, w, h;
  };
  Box randomBox(int w, int h, int64_t sample) const {
    const uint64_t seed = options_.seed;
    auto uniforms = [&](uint32_t attempt) {
      auto r = philox4x32({uint32_t(sample), uint32_t(uint64_t(sample) >> 32),
                           uint32_t(epoch_), attempt},
                          {uint32_t(seed) ^ 0x52524331u, uint32_t(seed >> 32)});
      std::array<double, 4> u;
      for (int i = 0; i < 4; ++i)
        u[i] = (r[i] >> 8) * (1.0 / 16777216.0); // [0, 1) on a 2^-24 grid
      return u;
    };
    const double area = double(w) * h;
    const double logLo = std::log(options_.ratioMin), logHi = std::log(options_.ratioMax);
    for (uint32_t attempt = 0; attempt < 10; ++attempt) {
      auto u = uniforms(attempt);
      const double target = area * (options_.scaleMin + (options_.scaleMax - options_.scaleMin) * u[0]);
      const double ratio = std::exp(logLo + (logHi - logLo) * u[1]);
      const double bw = std::round(std::sqrt(target * ratio)), bh = std::round(std::sqrt(target / ratio));
      if (bw > 0 && bw <= w && bh > 0 && bh <= h)
        return {std::floor(u[2] * (w - bw + 1)), std::floor(u[3] * (h - bh + 1)), bw, bh};
    }
    const double ratio = double(w) / h;
    double bw = w, bh = h;
    if (ratio < options_.ratioMin)
      bh = std::round(w / options_.ratioMin);
    else if (ratio > options_.ratioMax)
      bw = std::round(h * options_.ratioMax);
    return {std::floor((w - bw) / 2), std::floor((h - bh) / 2), bw, bh};
  }
  /// The box's geometry on the decoded image (`fx`, `fy`: decoded over original size).
  Geometry boxGeometry(const Box &b, double fx, double fy) const {
    const double sx = width_ / (b.w * fx), sy = height_ / (b.h * fy);
    return {sx, sy, b.x0 * fx * sx, b.y0 * fy * sy};
  }

  double scaleOf(int w, int h) const {
    const double cover =
        std::max(static_cast<double>(width_) / w, static_cast<double>(height_) / h);
    const double scale =
        options_.resize > 0 ? static_cast<double>(options_.resize) / std::min(w, h) : cover;
    return std::max(scale, cover); // the crop never leaves the image
  }

  template <typename Put> void cropInto(const Rgb &rgb, const Geometry &g, Put put) const {
    resample(rgb, g, width_, height_, put);
  }

  /// A canvas bundle's sample: `rgb` (decoded from an origW x origH image) into the
  /// canvas at `dst` (top-left; shrunk bilinearly to fit when the DCT could not; the
  /// rest zero), and its crop box in the canvas's pixels into `crop`: the random box
  /// `box` (original pixels) or the centre crop, what cropInto would take.
  void fillCanvas(Rgb &rgb, std::optional<Box> box, int origW, int origH, uint8_t *dst,
                  float *crop) const {
    if (rgb.width > canvasWidth_ || rgb.height > canvasHeight_) {
      const double s =
          std::min(double(canvasWidth_) / rgb.width, double(canvasHeight_) / rgb.height);
      const int64_t w = std::clamp<int64_t>(static_cast<int64_t>(rgb.width * s), 1, canvasWidth_);
      const int64_t h = std::clamp<int64_t>(static_cast<int64_t>(rgb.height * s), 1, canvasHeight_);
      thread_local Rgb fitted;
      fitted.width = static_cast<int>(w), fitted.height = static_cast<int>(h);
      fitted.pixels.resize(static_cast<size_t>(w * h * 3));
      resample(rgb, {double(w) / rgb.width, double(h) / rgb.height, 0, 0}, w, h,
               [&](size_t o, int c, float v) {
                 fitted.pixels[o * 3 + static_cast<size_t>(c)] = toPixel(v);
               });
      std::swap(rgb, fitted);
    }
    const size_t row = static_cast<size_t>(rgb.width) * 3,
                 pitch = static_cast<size_t>(canvasWidth_) * 3;
    for (int64_t y = 0; y < canvasHeight_; ++y) {
      uint8_t *to = dst + static_cast<size_t>(y) * pitch;
      if (y < rgb.height) {
        std::memcpy(to, rgb.pixels.data() + static_cast<size_t>(y) * row, row);
        std::memset(to + row, 0, pitch - row);
      } else {
        std::memset(to, 0, pitch);
      }
    }
    canvasBox(rgb.width, rgb.height, box, origW, origH, crop);
  }

  /// The crop box in a w x h image's pixels (decoded from origW x origH): the random box
  /// `box` (original pixels) scaled, or the centre crop.
  void canvasBox(int w, int h, std::optional<Box> box, int origW, int origH, float *crop) const {
    double x0, y0, bw, bh;
    if (box) {
      const double fx = double(w) / origW, fy = double(h) / origH;
      x0 = box->x0 * fx, y0 = box->y0 * fy, bw = box->w * fx, bh = box->h * fy;
    } else {
      // centre(): output x samples (x + offX + 0.5) / scale - 0.5.
      const Geometry g = centre(w, h);
      x0 = g.offX / g.scaleX, y0 = g.offY / g.scaleY, bw = width_ / g.scaleX,
      bh = height_ / g.scaleY;
    }
    const double values[6] = {x0, y0, bw, bh, double(w), double(h)};
    for (int k = 0; k < 6; ++k)
      crop[k] = static_cast<float>(values[k]);
  }

  /// Bilinear resampling with half-pixel centres: put(pixel offset, channel, value in
  /// [0, 255]) for each pixel of an outW x outH image (geometry `g` on `rgb`).
  template <typename Put>
  static void resample(const Rgb &rgb, const Geometry &g, int64_t outW, int64_t outH, Put put) {
    const double scaleX = g.scaleX, scaleY = g.scaleY, offX = g.offX, offY = g.offY;
    // Each output column's two source columns (byte offsets) and weight, once per image.
    thread_local std::vector<int> left, right;
    thread_local std::vector<float> wx;
    left.resize(static_cast<size_t>(outW)), right.resize(left.size()), wx.resize(left.size());
    for (int64_t x = 0; x < outW; ++x) {
      const double sx = std::clamp((x + offX + 0.5) / scaleX - 0.5, 0.0, rgb.width - 1.0);
      const int x0 = static_cast<int>(sx);
      left[static_cast<size_t>(x)] = x0 * 3;
      right[static_cast<size_t>(x)] = std::min(x0 + 1, rgb.width - 1) * 3;
      wx[static_cast<size_t>(x)] = static_cast<float>(sx - x0);
    }
    const size_t stride = static_cast<size_t>(rgb.width) * 3;
    for (int64_t y = 0; y < outH; ++y) {
      const double sy = std::clamp((y + offY + 0.5) / scaleY - 0.5, 0.0, rgb.height - 1.0);
      const int y0 = static_cast<int>(sy), y1 = std::min(y0 + 1, rgb.height - 1);
      const float fy = static_cast<float>(sy - y0);
      const uint8_t *row0 = rgb.pixels.data() + static_cast<size_t>(y0) * stride;
      const uint8_t *row1 = rgb.pixels.data() + static_cast<size_t>(y1) * stride;
      const size_t base = static_cast<size_t>(y * outW);
      for (size_t x = 0; x < static_cast<size_t>(outW); ++x) {
        const uint8_t *p00 = row0 + left[x], *p01 = row0 + right[x];
        const uint8_t *p10 = row1 + left[x], *p11 = row1 + right[x];
        const float fx = wx[x];
        for (int c = 0; c < 3; ++c) {
          const float top = p00[c] + (p01[c] - p00[c]) * fx;
          const float bottom = p10[c] + (p11[c] - p10[c]) * fx;
          put(base + x, c, top + (bottom - top) * fy);
        }
      }
    }
  }

  static void toChannelsFirst(uint8_t *hwc, size_t pixels) {
    std::vector<uint8_t> tmp(hwc, hwc + pixels * 3);
    for (size_t o = 0; o < pixels; ++o)
      for (size_t c = 0; c < 3; ++c)
        hwc[c * pixels + o] = tmp[o * 3 + c];
  }

  void warnOnce(const std::string &path, const std::string &message) {
    std::lock_guard<std::mutex> lock(warnMutex_);
    if (warned_.insert(path).second)
      fmt::print(stderr, "warning: skipping a bad record: {}\n", message);
  }

  ImageOptions options_;
  std::vector<DataField> fields_;
  int imageField_ = -1, labelField_ = -1, cropField_ = -1; // cropField_: canvas bundles
  bool encoded_ = false; // encodeImages(): JPEGs the device decodes go as their bytes
  bool channelsFirst_ = true;
  int64_t height_ = 0, width_ = 0;             // the crop's
  int64_t canvasHeight_ = 0, canvasWidth_ = 0; // canvas bundles

  std::vector<float> mean_, invStd_;
  uint64_t epoch_ = 0;
  std::mutex warnMutex_;
  std::set<std::string> warned_;
};

class ImageFolderSource final : public ImageSource {
public:
  ImageFolderSource(std::string root, std::vector<std::string> classes, std::vector<Sample> samples,
                    int64_t ignored, ImageOptions options)
      : ImageSource(std::move(options)), root_(std::move(root)), classes_(std::move(classes)),
        samples_(std::move(samples)), ignored_(ignored) {}

  int64_t numRecords() const override { return static_cast<int64_t>(samples_.size()); }
  int64_t numClasses() const override { return static_cast<int64_t>(classes_.size()); }
  const char *classesNoun() const override { return "class folders"; }
  Status readRecord(int64_t index, Record &out) override {
    const Sample &s = samples_[static_cast<size_t>(index)];
    out.raw = false;
    out.label = s.label;
    out.name = s.path;
    return readWhole(s.path, out.bytes);
  }
  std::string describe() const override {
    return fmt::format("image folder {} ({} classes, {} images{})", root_, classes_.size(),
                       samples_.size(),
                       ignored_ ? fmt::format(", {} other files ignored", ignored_) : "");
  }

protected:
  std::string origin() const override { return root_; }

private:
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<Sample> samples_;
  int64_t ignored_ = 0;
};

/// Records held in memory: encoded images, or Caffe Datum messages (tests, fuzzing).
class MemoryImageSource final : public ImageSource {
public:
  MemoryImageSource(std::vector<std::vector<uint8_t>> records, bool datums, ImageOptions options)
      : ImageSource(std::move(options)), records_(std::move(records)), datums_(datums) {}
  int64_t numRecords() const override { return static_cast<int64_t>(records_.size()); }
  int64_t numClasses() const override { return -1; }
  const char *classesNoun() const override { return "classes"; }
  Status readRecord(int64_t index, Record &out) override;
  std::string describe() const override {
    return fmt::format("{} in-memory image records", records_.size());
  }

protected:
  std::string origin() const override { return "<memory>"; }

private:
  std::vector<std::vector<uint8_t>> records_;
  bool datums_;
};

/// Caffe's Datum (caffe.proto: channels 1, height 2, width 3, data 4, label 5,
/// float_data 6, encoded 7), parsed by hand: the one message an image LMDB holds.
Status parseDatum(std::span<const uint8_t> b, Record &out) {
  int64_t channels = 0, height = 0, width = 0;
  bool encoded = false, floats = false;
  std::span<const uint8_t> data;
  size_t at = 0;
  auto varint = [&](uint64_t &v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= b.size())
        return false;
      const uint8_t byte = b[at++];
      v |= uint64_t(byte & 0x7f) << shift;
      if (!(byte & 0x80))
        return true;
    }
    return false;
  };
  out.label = 0;
  while (at < b.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key))
      return Status::error("not a Caffe Datum: a truncated field key at byte {}", at);
    const uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      if (!varint(v))
        return Status::error("not a Caffe Datum: a truncated number at byte {}", at);
      if (field == 1)
        channels = static_cast<int64_t>(v);
      else if (field == 2)
        height = static_cast<int64_t>(v);
      else if (field == 3)
        width = static_cast<int64_t>(v);
      else if (field == 5)
        out.label = static_cast<int32_t>(v); // int32 (negative as 10-byte varints)
      else if (field == 7)
        encoded = v != 0;
    } else if (wire == 2) {
      if (!varint(v) || v > b.size() - at)
        return Status::error("not a Caffe Datum: field {} runs past the record's {} bytes", field,
                             b.size());
      if (field == 4)
        data = b.subspan(at, static_cast<size_t>(v));
      floats |= field == 6;
      at += static_cast<size_t>(v);
    } else if (wire == 5 || wire == 1) {
      const size_t n = wire == 5 ? 4 : 8;
      if (b.size() - at < n)
        return Status::error("not a Caffe Datum: a truncated field {}", field);
      floats |= field == 6;
      at += n;
    } else {
      return Status::error("not a Caffe Datum: wire type {} of field {}", wire, field);
    }
  }
  if (encoded) {
    out.raw = false;
    out.bytes.assign(data.begin(), data.end());
    return Status::ok();
  }
  if (data.empty() && floats)
    return Status::error("a Datum of float_data (not 8-bit pixels) is not an image record");
  // Each side first: their product must not overflow (FuzzImageRecords found that).
  if ((channels != 1 && channels != 3) || height <= 0 || width <= 0 ||
      height > kMaxDecodedPixels || width > kMaxDecodedPixels ||
      height * width > kMaxDecodedPixels ||
      static_cast<int64_t>(data.size()) != channels * height * width)
    return Status::error("a raw Datum of {} bytes for {} x {} x {} pixels", data.size(), channels,
                         height, width);
  // Caffe stores raw pixels channels-first in OpenCV's BGR order.
  out.raw = true;
  out.rgb.width = static_cast<int>(width), out.rgb.height = static_cast<int>(height);
  out.rgb.pixels.resize(static_cast<size_t>(height * width * 3));
  const size_t plane = static_cast<size_t>(height * width);
  for (size_t o = 0; o < plane; ++o)
    for (size_t c = 0; c < 3; ++c)
      out.rgb.pixels[o * 3 + c] = channels == 1 ? data[o] : data[(2 - c) * plane + o];
  return Status::ok();
}

Status MemoryImageSource::readRecord(int64_t index, Record &out) {
  const std::vector<uint8_t> &r = records_[static_cast<size_t>(index)];
  out.name = fmt::format("record {}", index);
  if (datums_)
    return parseDatum(r, out);
  out.raw = false;
  out.label = 0;
  out.bytes = r;
  return Status::ok();
}

/// An LMDB of Caffe Datum records (convert_imageset's output; encoded JPEG/PNG or raw
/// pixels), samples in key order. Opened read-only without the lock file: nothing may
/// write the database while training reads it.
class LmdbImageSource final : public ImageSource {
public:
  LmdbImageSource(std::string path, MDB_env *env, MDB_dbi dbi, std::vector<std::string> keys,
                  ImageOptions options)
      : ImageSource(std::move(options)), path_(std::move(path)), env_(env), dbi_(dbi),
        keys_(std::move(keys)) {}
  ~LmdbImageSource() override { mdb_env_close(env_); }

  int64_t numRecords() const override { return static_cast<int64_t>(keys_.size()); }
  int64_t numClasses() const override { return -1; }
  const char *classesNoun() const override { return "classes"; }
  Status readRecord(int64_t index, Record &out) override {
    const std::string &key = keys_[static_cast<size_t>(index)];
    out.name = fmt::format("{} record '{}'", path_, key);
    MDB_txn *txn = nullptr;
    if (int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn); rc != 0)
      return Status::error("LMDB: {}", mdb_strerror(rc));
    MDB_val k{key.size(), const_cast<char *>(key.data())}, v{};
    int rc = mdb_get(txn, dbi_, &k, &v);
    Status st = rc != 0 ? Status::error("LMDB: {}", mdb_strerror(rc))
                        : parseDatum({static_cast<const uint8_t *>(v.mv_data), v.mv_size}, out);
    mdb_txn_abort(txn);
    return st;
  }
  std::string describe() const override {
    return fmt::format("LMDB {} ({} records)", path_, keys_.size());
  }

protected:
  std::string origin() const override { return path_; }

private:
  std::string path_;
  MDB_env *env_;
  MDB_dbi dbi_;
  std::vector<std::string> keys_;
};

} // namespace

std::unique_ptr<DataSource> makeImageRecordSource(std::vector<std::vector<uint8_t>> records,
                                                  bool datums, const ImageOptions &options) {
  return std::make_unique<MemoryImageSource>(std::move(records), datums, options);
}

Expected<std::unique_ptr<DataSource>> openImageLmdb(const std::string &path,
                                                    const ImageOptions &options) {
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  MDB_env *env = nullptr;
  if (int rc = mdb_env_create(&env); rc != 0)
    return Status::error("{}: LMDB: {}", path, mdb_strerror(rc));
  const unsigned flags = MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK | (dir ? 0 : MDB_NOSUBDIR);
  if (int rc = mdb_env_open(env, path.c_str(), flags, 0); rc != 0) {
    mdb_env_close(env);
    return Status::error("{}: not a readable LMDB: {}", path, mdb_strerror(rc));
  }
  MDB_txn *txn = nullptr;
  MDB_dbi dbi = 0;
  MDB_cursor *cursor = nullptr;
  std::vector<std::string> keys;
  int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  if (rc == 0)
    rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  if (rc == 0)
    rc = mdb_cursor_open(txn, dbi, &cursor);
  if (rc == 0) {
    MDB_val k{}, v{};
    while ((rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT)) == 0)
      keys.emplace_back(static_cast<const char *>(k.mv_data), k.mv_size);
    if (rc == MDB_NOTFOUND)
      rc = 0;
    mdb_cursor_close(cursor);
  }
  if (txn)
    mdb_txn_abort(txn);
  if (rc != 0) {
    mdb_env_close(env);
    return Status::error("{}: LMDB: {}", path, mdb_strerror(rc));
  }
  if (keys.empty()) {
    mdb_env_close(env);
    return Status::error("{}: the LMDB holds no records", path);
  }
  return std::unique_ptr<DataSource>(
      std::make_unique<LmdbImageSource>(path, env, dbi, std::move(keys), options));
}

Status applyImageCropOption(const std::string &value, ImageOptions &image) {
  if (value.empty())
    return Status::ok();
  const size_t eq = value.rfind('=');
  int64_t h = 0, w = 0;
  char tail = 0;
  if (eq == std::string::npos ||
      std::sscanf(value.c_str() + eq + 1, "%" SCNd64 "x%" SCNd64 "%c", &h, &w, &tail) != 2 ||
      h < 1 || w < 1)
    return Status::error("build option image_crop '{}' is not INPUT=HxW", value);
  image.cropHeight = h, image.cropWidth = w;
  return Status::ok();
}

Status applyImageSettings(const ImageSettings &s, SettingSpelling spelling, DataSourceOptions &eval,
                          DataSourceOptions &train) {
  auto name = [&](std::string key) {
    if (spelling == SettingSpelling::Keywords)
      return key;
    std::replace(key.begin(), key.end(), '_', '-');
    return "--" + key;
  };
  if (s.resize < 0)
    return Status::error("{} must be 0 or more, not {}", name("image_resize"), s.resize);
  for (const auto &[key, v] : {std::pair{"image_mean", &s.mean}, std::pair{"image_std", &s.std}})
    if (!v->empty() && v->size() != 3)
      return Status::error("{} takes 3 values (R, G, B), not {}", name(key), v->size());
  if (!s.cropScale.empty()) {
    if (!s.randomResizedCrop)
      return Status::error("{} applies to {}, which is not given", name("crop_scale"),
                           name("random_resized_crop"));
    if (s.cropScale.size() != 2 || !(s.cropScale[0] > 0) || !(s.cropScale[0] <= s.cropScale[1]) ||
        !(s.cropScale[1] <= 1))
      return Status::error("{} takes MIN, MAX with 0 < MIN <= MAX <= 1", name("crop_scale"));
  }
  eval.image.resize = s.resize;
  eval.image.mean = s.mean;
  eval.image.std = s.std;
  eval.image.skipBadRecords = s.skipBadRecords;
  train = eval;
  train.image.randomResizedCrop = s.randomResizedCrop;
  train.image.seed = s.seed;
  if (!s.cropScale.empty())
    train.image.scaleMin = s.cropScale[0], train.image.scaleMax = s.cropScale[1];
  return Status::ok();
}

Expected<std::unique_ptr<DataSource>> openImageFolder(const std::string &root,
                                                      const ImageOptions &options) {
  for (const auto *v : {&options.mean, &options.std})
    if (!v->empty() && v->size() != 3)
      return Status::error("--image-mean/--image-std take 3 values (R, G, B), not {}", v->size());
  for (float s : options.std)
    if (!(s > 0) || !std::isfinite(s))
      return Status::error("--image-std values must be positive, not {}", s);
  if (options.randomResizedCrop &&
      !(options.scaleMin > 0 && options.scaleMin <= options.scaleMax && options.scaleMax <= 1 &&
        options.ratioMin > 0 && options.ratioMin <= options.ratioMax))
    return Status::error("--random-resized-crop needs 0 < scale min <= max <= 1 and 0 < ratio "
                         "min <= max (got scale {}..{}, ratio {}..{})",
                         options.scaleMin, options.scaleMax, options.ratioMin, options.ratioMax);
  if (options.resize < 0)
    return Status::error("--image-resize must not be negative, not {}", options.resize);
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return Status::error("{}: not a directory", root);
  std::vector<std::string> classes;
  for (const auto &e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.empty() && name[0] != '.' && e.is_directory(ec))
      classes.push_back(name);
  }
  if (ec)
    return Status::error("{}: cannot list: {}", root, ec.message());
  if (classes.empty())
    return Status::error("{}: an image folder holds one subfolder per class; found none", root);
  std::sort(classes.begin(), classes.end());
  std::vector<Sample> samples;
  int64_t ignored = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path dir = fs::path(root) / classes[c];
    std::vector<std::string> files;
    for (const auto &e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.')
        continue;
      if (e.is_regular_file(ec) && hasImageExtension(name))
        files.push_back(name);
      else
        ++ignored;
    }
    if (ec)
      return Status::error("{}: cannot list: {}", dir.string(), ec.message());
    if (files.empty())
      return Status::error("{}: class folder '{}' (class {}) holds no .jpg/.jpeg/.png file", root,
                           classes[c], c);
    std::sort(files.begin(), files.end());
    for (const std::string &f : files)
      samples.push_back({(dir / f).string(), static_cast<int64_t>(c)});
  }
  return std::unique_ptr<DataSource>(std::make_unique<ImageFolderSource>(
      root, std::move(classes), std::move(samples), ignored, options));
}

} // namespace forge::rt
