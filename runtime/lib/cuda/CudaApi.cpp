// Run-time resolution of the driver API and cuBLASLt (CudaApi.h).
#include "cuda/CudaApi.h"

#include <dlfcn.h>

#include <mutex>

namespace forge::rt::cuda {

std::string errorString(cudaError_t e) {
  return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
}

std::string errorString(const DriverApi &api, CUresult r) {
  const char *text = nullptr;
  if (api.cuGetErrorString && api.cuGetErrorString(r, &text) == CUDA_SUCCESS && text)
    return fmt::format("CUresult {}: {}", static_cast<int>(r), text);
  return fmt::format("CUresult {}", static_cast<int>(r));
}

Expected<const DriverApi *> driverApi() {
  static DriverApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found;
    void *fn = nullptr;
#define FORGE_RESOLVE(f)                                                                        \
  if (error.empty()) {                                                                          \
    cudaError_t e = cudaGetDriverEntryPointByVersion(#f, &fn, 12000, cudaEnableDefault, &found); \
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn)                       \
      error = fmt::format("the CUDA driver has no entry point {} ({})", #f,                     \
                          e != cudaSuccess ? errorString(e) : "symbol not found");              \
    else                                                                                        \
      api.f = reinterpret_cast<decltype(api.f)>(fn);                                            \
  }
    FORGE_CUDA_DRIVER_FUNCTIONS(FORGE_RESOLVE)
#undef FORGE_RESOLVE
  });
  if (!error.empty())
    return Status::error("{}", error);
  return &api;
}

Expected<const CublasLtApi *> cublasLtApi() {
  static CublasLtApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void *lib = nullptr;
    std::string tried;
    for (const char *name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib)
        break;
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
    }
    if (!lib) {
      error = fmt::format("cannot load cuBLASLt ({}); add the CUDA library directory to "
                          "LD_LIBRARY_PATH",
                          tried);
      return;
    }
#define FORGE_RESOLVE(f)                                                                        \
  if (error.empty()) {                                                                          \
    api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));                                  \
    if (!api.f)                                                                                 \
      error = fmt::format("cuBLASLt has no symbol {}", #f);                                     \
  }
    FORGE_CUBLASLT_FUNCTIONS(FORGE_RESOLVE)
#undef FORGE_RESOLVE
  });
  if (!error.empty())
    return Status::error("{}", error);
  return &api;
}

} // namespace forge::rt::cuda
