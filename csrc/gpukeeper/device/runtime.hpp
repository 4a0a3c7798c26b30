// What was built, and what the machine offers at run time. Everything here works in a
// CPU-only build and on a machine with no driver: it reports instead of throwing.
#pragma once

#include <cstddef>
#include <optional>
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

// ---- The driver, asked without creating a context ---------------------------------------
// Through the driver API that the runtime's entry-point query hands out (driver_api.hpp):
// the core never links libcuda. Nothing here throws; what cannot be asked is nullopt. A
// CPU-only build answers nullopt everywhere, except primary_context_active without libcuda.

// Whether the CUDA driver library (libcuda.so.1) is mapped into the process: asking loads
// nothing (the loaded objects are walked with dl_iterate_phdr). Without it no CUDA context can exist. nullopt where
// this cannot be asked (not Linux).
std::optional<bool> cuda_driver_loaded() noexcept;

// How many devices the driver reports (cuInit, cuDeviceGetCount, cuDeviceGet for each);
// nullopt when the driver cannot be reached. The first call initialises the driver (no
// context); the answer, like the driver's entry points, is kept for the process.
std::optional<int> driver_device_count() noexcept;

// Whether the primary context of CUDA device `device` exists (the one the runtime, PyTorch,
// CuPy, JAX and gpukeeper share), by cuDevicePrimaryCtxGetState: creates none. false when
// libcuda is not even loaded; nullopt when the driver cannot be asked or has no such device.
std::optional<bool> primary_context_active(int device) noexcept;

// The CUDA ordinal of the context current on the calling thread when it is not its
// device's primary context (one an engine made with cuCtxCreate: OpenMM); nullopt when
// none is current, when the current one is a primary context, when libcuda is not
// loaded, or when the driver cannot tell.
std::optional<int> current_context_foreign() noexcept;

// The PCI bus id of CUDA device `device` as cuDeviceGetPCIBusId writes it
// ("0000:65:00.0", domain:bus:device.function; NVML's nvmlDeviceGetHandleByPciBusId
// takes it); nullopt when unknown.
std::optional<std::string> device_pci_bus_id(int device);

// A device described by the driver alone (no context, no framework). A field the driver
// did not answer is nullopt. Clocks are in MHz (the driver's kHz / 1000, rounded down).
struct DriverDeviceInfo {
  std::optional<int> multiprocessors;
  std::optional<int> sm_clock_max_mhz;
  std::optional<int> memory_clock_max_mhz;
  std::optional<int> memory_bus_width_bits;
  std::optional<int> l2_cache_bytes;
  std::optional<int> cc_major;
  std::optional<int> cc_minor;
  std::optional<std::string> name;
  std::optional<std::size_t> total_memory_bytes;
  std::optional<std::string> uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (cuDeviceGetUuid)
};

// nullopt when the driver cannot be reached or cuDeviceGet refuses `device`.
std::optional<DriverDeviceInfo> driver_device_info(int device);

}  // namespace gpukeeper
