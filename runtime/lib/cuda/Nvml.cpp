// NVML telemetry (Nvml.h).
#include "cuda/Nvml.h"

#include <dlfcn.h>
#include <map>
#include <mutex>

namespace forge::rt::cuda {

struct Nvml::Api {
  using Init = int (*)();
  using ByBusId = int (*)(const char *, void **);
  using UintOf = int (*)(void *, unsigned *);
  using UintOfKind = int (*)(void *, int, unsigned *);
  struct Utilization {
    unsigned gpu, memory;
  };
  using UtilizationOf = int (*)(void *, Utilization *);
  ByBusId byBusId = nullptr;
  UintOf powerMilliwatts = nullptr;
  UintOfKind clock = nullptr, temperature = nullptr;
  UtilizationOf utilization = nullptr;
};

namespace {

constexpr int kSuccess = 0, kClockSm = 1, kTemperatureGpu = 0;

/// The library's functions after nvmlInit_v2, once per soname; null when it cannot be
/// loaded or initialized (never unloaded: readings may come until exit).
const Nvml::Api *loadApi(const char *library) {
  static std::mutex mutex;
  static std::map<std::string, std::optional<Nvml::Api>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = loaded.try_emplace(library);
  if (fresh) {
    void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      auto init = reinterpret_cast<Nvml::Api::Init>(dlsym(h, "nvmlInit_v2"));
      Nvml::Api api;
      api.byBusId = reinterpret_cast<Nvml::Api::ByBusId>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
      api.powerMilliwatts = reinterpret_cast<Nvml::Api::UintOf>(dlsym(h, "nvmlDeviceGetPowerUsage"));
      api.clock = reinterpret_cast<Nvml::Api::UintOfKind>(dlsym(h, "nvmlDeviceGetClockInfo"));
      api.temperature = reinterpret_cast<Nvml::Api::UintOfKind>(dlsym(h, "nvmlDeviceGetTemperature"));
      api.utilization =
          reinterpret_cast<Nvml::Api::UtilizationOf>(dlsym(h, "nvmlDeviceGetUtilizationRates"));
      if (init && api.byBusId && init() == kSuccess)
        it->second = api;
    }
  }
  return it->second ? &*it->second : nullptr;
}

} // namespace

std::optional<Nvml> Nvml::open(const std::string &pciBusId, const char *library) {
  const Api *api = loadApi(library);
  if (!api)
    return std::nullopt;
  Nvml n;
  n.api_ = api;
  if (api->byBusId(pciBusId.c_str(), &n.device_) != kSuccess || !n.device_)
    return std::nullopt;
  return n;
}

Executor::Telemetry Nvml::read() const {
  Executor::Telemetry t;
  unsigned v = 0;
  if (api_->powerMilliwatts && api_->powerMilliwatts(device_, &v) == kSuccess)
    t.powerWatts = v / 1000.0;
  if (api_->clock && api_->clock(device_, kClockSm, &v) == kSuccess)
    t.smClockMHz = v;
  if (api_->temperature && api_->temperature(device_, kTemperatureGpu, &v) == kSuccess)
    t.temperatureC = v;
  Api::Utilization u{};
  if (api_->utilization && api_->utilization(device_, &u) == kSuccess)
    t.busyPercent = u.gpu;
  return t;
}

} // namespace forge::rt::cuda
