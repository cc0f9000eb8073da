// Fuzz target for the image decoders of the data pipeline (issue #18): JPEG (libjpeg-turbo,
// with the DCT shrink), PNG (libpng) and Caffe Datum messages (the hand-written parser of
// LMDB records), each then cropped, normalized and narrowed as forge-train does. Invariant:
// any bytes give an image or an error Status; never a crash, hang, sanitizer report or an
// allocation beyond what the bytes justify (decoded sizes are capped).
//
// The first input byte picks the path: bit 0 Datum or encoded image, bit 1 random-resized
// crop, bit 2 a u8 channels-last input instead of f32 channels-first, bit 3 bf16.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "forge/runtime/DataSource.h"

using namespace forge::rt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const uint8_t mode = data[0];
  ImageOptions options;
  options.randomResizedCrop = mode & 2;
  options.resize = 40;
  std::vector<std::vector<uint8_t>> records = {std::vector<uint8_t>(data + 1, data + size)};
  auto source = makeImageRecordSource(std::move(records), mode & 1, options);
  DataField image, label;
  image.name = "x";
  if (mode & 4) {
    image.dtype = forge::bundle::U8;
    image.sampleShape = {24, 32, 3};
  } else {
    image.dtype = mode & 8 ? forge::bundle::BF16 : forge::bundle::F32;
    image.sampleShape = {3, 24, 32};
  }
  label.name = "labels";
  label.dtype = forge::bundle::I64;
  label.isLabel = true;
  if (!source->bind({image, label}).isOk())
    return 0;
  std::vector<uint8_t> pixels(24 * 32 * 3 * 4), labels(8);
  std::vector<void *> outs = {pixels.data(), labels.data()};
  const int64_t index = 0;
  Status st = source->fill({&index, 1}, outs);
  volatile size_t n = st.isOk() ? pixels[0] : st.message().size();
  (void)n;
  return 0;
}
