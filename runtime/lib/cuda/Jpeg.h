// nvJPEG batched decoding into image canvases (issue #13: JPEGs decoded on the GPU).
//
// The library is dlopen'd (libnvjpeg.so.13, from the nvidia-nvjpeg wheel or the CUDA
// toolkit), as cuDNN is, so forge-train starts without it; the header comes from the same
// wheel at build time (runtime/CMakeLists.txt), and without it create() says so.
//
// Invariants:
//  * decode() writes each image as interleaved 8-bit RGB into its own device rectangle
//    (rows `pitch` bytes apart, the image's own width and height: the caller made sure it
//    fits) and nothing else; the work is on the caller's stream, the host bytes are read
//    until the stream passes it (the caller keeps them).
//  * Images the hardware decoder takes (nvjpegDecodeBatchedSupported on the parsed header)
//    go to it (NVJPEG_BACKEND_HARDWARE, where the GPU has the engines); the rest, and a
//    batch it refuses after all, to the default backend (Huffman on the CPU, the rest on
//    the GPU). A backend's state is not used again before its previous batch is done (an
//    event). A failure names the batch position of the first image nvJPEG refused.
//  * Every image's size (nvjpegGetImageInfo) is checked against its rectangle first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cuda/CudaApi.h"
#include "forge/runtime/Status.h"

namespace forge::rt::cuda {

struct JpegImage {
  const uint8_t *data = nullptr; // host bytes of one JPEG file
  size_t bytes = 0;
  uint8_t *device = nullptr;           // where its top-left pixel goes
  size_t pitch = 0;                    // bytes between its rows on the device
  int64_t sample = -1;                 // its batch position, for messages
  int64_t maxWidth = 0, maxHeight = 0; // its rectangle: a larger image is refused
};

class JpegDecoder {
public:
  /// A decoder for the current device, or why there is none.
  static Expected<std::unique_ptr<JpegDecoder>> create();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder &) = delete;
  JpegDecoder &operator=(const JpegDecoder &) = delete;

  Status decode(std::span<const JpegImage> images, cudaStream_t stream);
  /// "hardware" or "default" (what create() found), for messages.
  const std::string &backend() const;

private:
  struct Impl;
  explicit JpegDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace forge::rt::cuda
