// GPU telemetry through NVML (the driver's management library), loaded with dlopen like
// cuDNN: power, SM clock, temperature and utilization of one device. NVML's absence (no
// libnvidia-ml.so.1, a container without it, a call a GPU does not support) is not an
// error: the reading, or the one field, is empty.
//
// NVML's C ABI is declared here from its API reference (the toolkit ships no nvml.h): an
// opaque device handle, int return codes (0 = success), NVML_CLOCK_SM = 1,
// NVML_TEMPERATURE_GPU = 0 and nvmlUtilization_t = {gpu, memory} percentages.
#pragma once

#include <optional>
#include <string>

#include "forge/runtime/Executor.h"

namespace forge::rt::cuda {

class Nvml {
public:
  /// NVML for the device at `pciBusId` (cudaDeviceGetPCIBusId's form), or nullopt when
  /// the library or the device cannot be opened. `library`: the soname to dlopen.
  static std::optional<Nvml> open(const std::string &pciBusId,
                                  const char *library = "libnvidia-ml.so.1");
  /// One reading; fields NVML does not give are left empty.
  Executor::Telemetry read() const;

  struct Api; // the library's entry points (Nvml.cpp)

private:
  const Api *api_ = nullptr;
  void *device_ = nullptr; // nvmlDevice_t
};

} // namespace forge::rt::cuda
