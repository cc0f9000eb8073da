// Image sources for canvas bundles (forgec --augment pixels,canvas=HxW) and their JPEGs for
// the device's decoder (DataSource::encodeImages): which files go as their bytes, what their
// crop boxes are, and what the CPU decodes instead. The GPU half (nvJPEG) is
// tests/gpu/test_canvas_crop.py's.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include "forge/runtime/DataSource.h"

using namespace forge::rt;
namespace bundle = forge::bundle;

namespace {

/// A w x h JPEG of a colour gradient (turbojpeg; progressive when asked).
std::vector<uint8_t> jpeg(int w, int h, bool progressive = false) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * 3));
  for (int i = 0; i < w * h * 3; ++i)
    px[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 7) % 251);
  tjhandle tj = tjInitCompress();
  unsigned char *out = nullptr;
  unsigned long size = 0;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, flags), 0)
      << tjGetErrorStr2(tj);
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  tjDestroy(tj);
  return bytes;
}

constexpr int64_t kCanvasH = 32, kCanvasW = 40, kCrop = 8;

std::vector<DataField> canvasFields() {
  DataField x{"x", bundle::U8, {kCanvasH, kCanvasW, 3}};
  DataField crop{"x.crop", bundle::F32, {6}};
  DataField labels{"labels", bundle::I64, {}};
  labels.isLabel = true;
  return {x, crop, labels};
}

ImageOptions canvasOptions() {
  ImageOptions o;
  o.cropHeight = o.cropWidth = kCrop;
  return o;
}

} // namespace

TEST(ImageSource, EncodedJpegsGoAsTheirBytes) {
  const std::vector<uint8_t> small = jpeg(20, 16), big = jpeg(100, 80),
                             progressive = jpeg(20, 16, true);
  auto source = makeImageRecordSource({small, big, progressive}, false, canvasOptions());
  ASSERT_TRUE(source->bind(canvasFields()).isOk());
  auto field = source->encodeImages();
  ASSERT_TRUE(field.isOk()) << field.status().message();
  EXPECT_EQ(*field, 0);

  const size_t slot = static_cast<size_t>(kCanvasH * kCanvasW * 3);
  std::vector<uint8_t> canvas(3 * slot, 0xAB);
  std::vector<float> crop(3 * 6, -1.0f);
  std::vector<int64_t> labels(3);
  std::vector<uint32_t> lengths(3, 7);
  std::vector<void *> outs = {canvas.data(), crop.data(), labels.data(), lengths.data()};
  const std::vector<int64_t> indices = {0, 1, 2};
  Status st = source->fill(indices, outs);
  ASSERT_TRUE(st.isOk()) << st.message();

  // A baseline JPEG that fits: its bytes at the slot's start, its length, and the centre
  // crop of its full 20 x 16 pixels (scale max(8/20, 8/16) = 0.5: x from 2, 16 wide).
  EXPECT_EQ(lengths[0], small.size());
  EXPECT_EQ(std::memcmp(canvas.data(), small.data(), small.size()), 0);
  const std::vector<float> box0(crop.begin(), crop.begin() + 6);
  EXPECT_EQ(box0, (std::vector<float>{2, 0, 16, 16, 20, 16}));
  // Too large for the canvas: decoded here (the 8 x 8 crop lets the DCT take 1/8: 13 x 10),
  // pixels in the corner; a progressive JPEG too (the GPU decoders take baseline only; 1/2:
  // 10 x 8).
  EXPECT_EQ(lengths[1], 0u);
  EXPECT_EQ(crop[6 + 4], 13.0f);
  EXPECT_EQ(crop[6 + 5], 10.0f);
  EXPECT_EQ(lengths[2], 0u);
  EXPECT_EQ(crop[12 + 4], 10.0f);
  EXPECT_EQ(crop[12 + 5], 8.0f);
  EXPECT_NE(std::memcmp(canvas.data() + 2 * slot, progressive.data(), 16), 0);
  // The pixels of a decoded sample fill its image's rows; the rest of its slot is zero.
  EXPECT_EQ(canvas[2 * slot + 20 * 3], 0);
  EXPECT_EQ(canvas[2 * slot + (kCanvasH - 1) * kCanvasW * 3], 0);

  // Without encodeImages() the same fill takes the fields' buffers only, and decodes all.
  auto plain = makeImageRecordSource({small}, false, canvasOptions());
  ASSERT_TRUE(plain->bind(canvasFields()).isOk());
  std::vector<void *> three = {canvas.data(), crop.data(), labels.data()};
  const std::vector<int64_t> first = {0};
  EXPECT_TRUE(plain->fill(first, three).isOk());
  EXPECT_FALSE(plain->fill(first, outs).isOk()) << "a lengths buffer it did not ask for";
}

TEST(ImageSource, OnlyCanvasBundlesEncode) {
  auto source = makeImageRecordSource({jpeg(20, 16)}, false, ImageOptions{});
  DataField x{"x", bundle::U8, {8, 8, 3}};
  DataField labels{"labels", bundle::I64, {}};
  labels.isLabel = true;
  ASSERT_TRUE(source->bind({x, labels}).isOk());
  auto field = source->encodeImages();
  ASSERT_FALSE(field.isOk());
  EXPECT_NE(field.status().message().find("canvas"), std::string::npos) << field.status().message();
}
