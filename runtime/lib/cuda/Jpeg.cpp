// nvJPEG batched decoding (Jpeg.h).
#include "cuda/Jpeg.h"

#include <dlfcn.h>
#include <mutex>
#include <vector>

#ifdef FORGE_HAVE_NVJPEG
#include <nvjpeg.h>
#endif

namespace forge::rt::cuda {

#ifdef FORGE_HAVE_NVJPEG

namespace {

#define FORGE_NVJPEG_FUNCTIONS(X)                                                                  \
  X(nvjpegCreateEx)                                                                                \
  X(nvjpegDestroy)                                                                                 \
  X(nvjpegJpegStateCreate)                                                                         \
  X(nvjpegJpegStateDestroy)                                                                        \
  X(nvjpegGetImageInfo)                                                                            \
  X(nvjpegJpegStreamCreate)                                                                        \
  X(nvjpegJpegStreamDestroy)                                                                       \
  X(nvjpegJpegStreamParseHeader)                                                                   \
  X(nvjpegDecodeBatchedSupported)                                                                  \
  X(nvjpegDecodeBatchedInitialize)                                                                 \
  X(nvjpegDecodeBatched)

struct NvjpegApi {
#define FORGE_DECLARE(f) decltype(&::f) f = nullptr;
  FORGE_NVJPEG_FUNCTIONS(FORGE_DECLARE)
#undef FORGE_DECLARE
};

/// The library's entry points, loaded once per process; or why not.
Expected<const NvjpegApi *> nvjpegApi() {
  static NvjpegApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void *lib = nullptr;
    std::string tried;
    for (const char *name : {"libnvjpeg.so.13", "libnvjpeg.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
        break;
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
    }
    if (!lib) {
      error = fmt::format("cannot load nvJPEG ({}); add its directory (the nvidia-nvjpeg "
                          "wheel's nvidia/cu13/lib) to LD_LIBRARY_PATH",
                          tried);
      return;
    }
#define FORGE_RESOLVE(f)                                                                           \
  if (error.empty() && !(api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f))))               \
    error = fmt::format("nvJPEG has no symbol {}", #f);
    FORGE_NVJPEG_FUNCTIONS(FORGE_RESOLVE)
#undef FORGE_RESOLVE
  });
  if (!error.empty())
    return Status::error("{}", error);
  return &api;
}

const char *statusName(nvjpegStatus_t s) {
  switch (s) {
  case NVJPEG_STATUS_SUCCESS:
    return "success";
  case NVJPEG_STATUS_NOT_INITIALIZED:
    return "not initialized";
  case NVJPEG_STATUS_INVALID_PARAMETER:
    return "invalid parameter";
  case NVJPEG_STATUS_BAD_JPEG:
    return "bad JPEG";
  case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
    return "JPEG not supported";
  case NVJPEG_STATUS_ALLOCATOR_FAILURE:
    return "allocator failure";
  case NVJPEG_STATUS_EXECUTION_FAILED:
    return "execution failed";
  case NVJPEG_STATUS_ARCH_MISMATCH:
    return "not supported on this GPU";
  case NVJPEG_STATUS_INTERNAL_ERROR:
    return "internal error";
  case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
    return "implementation not supported";
  case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
    return "incomplete bitstream";
  }
  return "unknown status";
}

/// One backend's handle and batched state, initialized for `batch` images at a time;
/// `done` follows its last decode (the state is not reused before the stream passes it:
/// nvJPEG does not promise that a state may be re-initialized or decode again while its
/// previous batch runs).
struct Backend {
  const NvjpegApi *api = nullptr;
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  nvjpegJpegStream_t stream = nullptr; // header parsing for decodeBatchedSupported
  cudaEvent_t done = nullptr;
  bool pending = false;
  int batch = -1;
  ~Backend() {
    if (done) {
      cudaEventSynchronize(done);
      cudaEventDestroy(done);
    }
    if (stream)
      api->nvjpegJpegStreamDestroy(stream);
    if (state)
      api->nvjpegJpegStateDestroy(state);
    if (handle)
      api->nvjpegDestroy(handle);
  }
};

Status open(const NvjpegApi *api, nvjpegBackend_t kind, Backend &b) {
  b.api = api;
  // libjpeg-turbo's "fancy" chroma upsampling is an interpolation: ask nvJPEG for one too
  // where it takes the flag.
  nvjpegStatus_t s = api->nvjpegCreateEx(kind, nullptr, nullptr,
                                         NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, &b.handle);
  if (s != NVJPEG_STATUS_SUCCESS)
    s = api->nvjpegCreateEx(kind, nullptr, nullptr, 0, &b.handle);
  if (s == NVJPEG_STATUS_SUCCESS)
    s = api->nvjpegJpegStateCreate(b.handle, &b.state);
  if (s == NVJPEG_STATUS_SUCCESS)
    s = api->nvjpegJpegStreamCreate(b.handle, &b.stream);
  if (s != NVJPEG_STATUS_SUCCESS)
    return Status::error("nvJPEG: {}", statusName(s));
  if (cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess)
    return Status::error("nvJPEG: cannot create an event");
  return Status::ok();
}

/// Decodes `images` with backend `b` on `stream` after its previous batch.
nvjpegStatus_t decodeWith(Backend &b, std::span<const JpegImage *const> images,
                          cudaStream_t stream) {
  const NvjpegApi &api = *b.api;
  if (b.pending && cudaEventSynchronize(b.done) != cudaSuccess)
    return NVJPEG_STATUS_EXECUTION_FAILED;
  b.pending = false;
  const int n = static_cast<int>(images.size());
  std::vector<const unsigned char *> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> out(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    data.push_back(images[i]->data);
    lengths.push_back(images[i]->bytes);
    out[i].channel[0] = images[i]->device;
    out[i].pitch[0] = images[i]->pitch;
  }
  nvjpegStatus_t s = NVJPEG_STATUS_SUCCESS;
  if (b.batch != n) { // a batch of another size re-initializes the state
    s = api.nvjpegDecodeBatchedInitialize(b.handle, b.state, n, 1, NVJPEG_OUTPUT_RGBI);
    b.batch = s == NVJPEG_STATUS_SUCCESS ? n : -1;
  }
  if (s == NVJPEG_STATUS_SUCCESS)
    s = api.nvjpegDecodeBatched(b.handle, b.state, data.data(), lengths.data(), out.data(), stream);
  if (s != NVJPEG_STATUS_SUCCESS) {
    b.batch = -1; // initialize again before the next batch
    return s;
  }
  b.pending = cudaEventRecord(b.done, stream) == cudaSuccess;
  return s;
}

} // namespace

struct JpegDecoder::Impl {
  const NvjpegApi *api = nullptr;
  std::unique_ptr<Backend> hardware; // null where the GPU has no JPEG engines
  Backend fallback;                  // NVJPEG_BACKEND_DEFAULT
  std::string backend;
};

Expected<std::unique_ptr<JpegDecoder>> JpegDecoder::create() {
  auto api = nvjpegApi();
  if (!api)
    return api.status();
  auto impl = std::make_unique<Impl>();
  impl->api = *api;
  impl->hardware = std::make_unique<Backend>();
  if (!open(*api, NVJPEG_BACKEND_HARDWARE, *impl->hardware).isOk())
    impl->hardware.reset(); // no engines (or no support): the default backend does it all
  FORGE_RETURN_IF_ERROR(open(*api, NVJPEG_BACKEND_DEFAULT, impl->fallback));
  impl->backend = impl->hardware ? "hardware" : "default";
  return std::unique_ptr<JpegDecoder>(new JpegDecoder(std::move(impl)));
}

JpegDecoder::JpegDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JpegDecoder::~JpegDecoder() = default;
const std::string &JpegDecoder::backend() const { return impl_->backend; }

Status JpegDecoder::decode(std::span<const JpegImage> images, cudaStream_t stream) {
  const NvjpegApi &api = *impl_->api;
  // Each image to the hardware decoder when nvJPEG says it takes it
  // (nvjpegDecodeBatchedSupported on the parsed header), the rest to the default backend.
  std::vector<const JpegImage *> parts[2];
  for (const JpegImage &im : images) {
    int components = 0, widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
    nvjpegChromaSubsampling_t css = NVJPEG_CSS_UNKNOWN;
    nvjpegStatus_t s = api.nvjpegGetImageInfo(impl_->fallback.handle, im.data, im.bytes,
                                              &components, &css, widths, heights);
    if (s != NVJPEG_STATUS_SUCCESS)
      return Status::error("nvJPEG cannot read the header of the JPEG at batch position {}: {}",
                           im.sample, statusName(s));
    if (widths[0] < 1 || heights[0] < 1 || widths[0] > im.maxWidth || heights[0] > im.maxHeight)
      return Status::error("the JPEG at batch position {} is {}x{} pixels, its canvas {}x{}",
                           im.sample, widths[0], heights[0], im.maxWidth, im.maxHeight);
    (void)components, (void)css;
    int supported = 1; // 0: the hardware decoder takes it
    if (impl_->hardware &&
        api.nvjpegJpegStreamParseHeader(impl_->hardware->handle, im.data, im.bytes,
                                        impl_->hardware->stream) == NVJPEG_STATUS_SUCCESS &&
        api.nvjpegDecodeBatchedSupported(impl_->hardware->handle, impl_->hardware->stream,
                                         &supported) != NVJPEG_STATUS_SUCCESS)
      supported = 1;
    parts[supported == 0 ? 0 : 1].push_back(&im);
  }
  // A batch the hardware decoder refuses after all goes to the default backend whole.
  if (!parts[0].empty() && decodeWith(*impl_->hardware, parts[0], stream) != NVJPEG_STATUS_SUCCESS)
    parts[1].insert(parts[1].end(), parts[0].begin(), parts[0].end());
  if (parts[1].empty())
    return Status::ok();
  if (nvjpegStatus_t s = decodeWith(impl_->fallback, parts[1], stream); s != NVJPEG_STATUS_SUCCESS)
    return Status::error("nvJPEG could not decode a batch of {} JPEG(s), the first at batch "
                         "position {}: {} (forge-train --decode cpu decodes them on the CPU)",
                         parts[1].size(), parts[1].front()->sample, statusName(s));
  return Status::ok();
}

#else // !FORGE_HAVE_NVJPEG

struct JpegDecoder::Impl {
  std::string backend;
};

Expected<std::unique_ptr<JpegDecoder>> JpegDecoder::create() {
  return Status::error("this forge-train was built without nvJPEG's header (the nvidia-nvjpeg "
                       "wheel: tools/setup.sh installs it where CUDA is)");
}
JpegDecoder::JpegDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JpegDecoder::~JpegDecoder() = default;
const std::string &JpegDecoder::backend() const { return impl_->backend; }
Status JpegDecoder::decode(std::span<const JpegImage>, cudaStream_t) {
  return Status::error("nvJPEG is not available");
}

#endif

} // namespace forge::rt::cuda
