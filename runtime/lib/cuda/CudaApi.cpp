// Run-time resolution of the driver API, cuBLASLt and cuDNN (CudaApi.h).
#include "cuda/CudaApi.h"

#include <dlfcn.h>
#include <initializer_list>

#include <mutex>
#include <type_traits>

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

namespace {
/// dlopen's the first of `names` that loads; "" or why none did.
void *openLibrary(std::initializer_list<const char *> names, const char *what,
                  std::string &error) {
  std::string tried;
  for (const char *name : names) {
    if (void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))
      return lib;
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
  }
  error = fmt::format("cannot load {} ({}); add its directory to LD_LIBRARY_PATH", what, tried);
  return nullptr;
}

/// Loads `Api` once per process (a function-local static per instantiation):
/// dlopen's the first of `names`, then `resolveAll(api, lib, resolve)` resolves
/// each entry point with resolve(api.f, "f"); the first failure is the error
/// every later call returns.
template <typename Api, typename ResolveAll>
Expected<const Api *> loadOnce(std::initializer_list<const char *> names, const char *what,
                               ResolveAll resolveAll) {
  static Api api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [&] {
    void *lib = openLibrary(names, what, error);
    if (!lib)
      return;
    auto resolve = [&](auto &fn, const char *name) {
      if (!error.empty())
        return;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn)
        error = fmt::format("{} has no symbol {}", what, name);
    };
    resolveAll(api, lib, resolve);
  });
  if (!error.empty())
    return Status::error("{}", error);
  return &api;
}
} // namespace

#define FORGE_RESOLVE(f) resolve(api.f, #f);

Expected<const CublasLtApi *> cublasLtApi() {
  return loadOnce<CublasLtApi>({"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
                               "cuBLASLt", [](CublasLtApi &api, void *, auto &resolve) {
                                 FORGE_CUBLASLT_FUNCTIONS(FORGE_RESOLVE)
                               });
}

Expected<const CudnnApi *> cudnnApi() {
  return loadOnce<CudnnApi>({"libcudnn.so.9", "libcudnn.so"}, "cuDNN",
                            [](CudnnApi &api, void *lib, auto &resolve) {
                              api.library = lib;
                              FORGE_CUDNN_FUNCTIONS(FORGE_RESOLVE)
                            });
}

Expected<const NcclApi *> ncclApi() {
  return loadOnce<NcclApi>({"libnccl.so.2", "libnccl.so"}, "NCCL",
                           [](NcclApi &api, void *, auto &resolve) {
                             FORGE_NCCL_FUNCTIONS(FORGE_RESOLVE)
                           });
}

#undef FORGE_RESOLVE

} // namespace forge::rt::cuda
