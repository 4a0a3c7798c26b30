// What was built, and what the machine offers at run time. Everything here works in a
// CPU-only build and on a machine with no driver: it reports instead of throwing.
#pragma once

#include <cstddef>
#include <string>

namespace gpukeeper {

struct BuildInfo {
  bool cuda = false;             // compiled against the CUDA runtime
  std::string cuda_version;      // runtime headers' version, e.g. "13.0"; empty without CUDA
  bool static_cudart = false;    // linked to libcudart_static (no libcudart needed at run time)
  std::string compiler;          // e.g. "GNU 12.2.0"
  long cxx_standard = 0;         // __cplusplus of the build
  std::string build_type;        // "Release", "Debug", ...
};

BuildInfo build_info();

struct CudaStatus {
  bool available = false;
  int device_count = 0;
  int driver_version = 0;   // as cudaDriverGetVersion reports it (e.g. 13000); 0 when unknown
  int runtime_version = 0;  // as cudaRuntimeGetVersion reports it
  std::string reason;       // why it is unavailable; empty when available
};

// Queries the driver each time; cheap after the first call in a process.
CudaStatus cuda_status();

// Number of usable CUDA devices; 0 in a CPU-only build or without a driver.
int cuda_device_count() noexcept;

struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// cudaMemGetInfo for `device`; throws DeviceError on failure, InvalidInputError for a bad id.
MemoryInfo device_memory_info(int device);

// Physical memory of the host: available (MemAvailable where the kernel reports it) and total.
MemoryInfo host_memory_info();

}  // namespace gpukeeper
