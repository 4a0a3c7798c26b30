// The few CUDA driver API calls the runtime does not answer (context state, PCI ids,
// device attributes without a context), found through the runtime's entry-point query
// (cudaGetDriverEntryPointByVersion): the core links the static runtime and never
// libcuda, so nothing here is needed to load the module. CUDA builds only; internal to
// device/ and kernels/ (runtime.hpp has the functions to call).
#pragma once

#include <cuda.h>

#include <vector>

namespace gpukeeper::detail {

struct DriverApi {
  CUresult(CUDAAPI* device_get)(CUdevice*, int) = nullptr;
  CUresult(CUDAAPI* primary_ctx_get_state)(CUdevice, unsigned int*, int*) = nullptr;
  CUresult(CUDAAPI* primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult(CUDAAPI* primary_ctx_release)(CUdevice) = nullptr;  // cuDevicePrimaryCtxRelease_v2
  CUresult(CUDAAPI* ctx_get_current)(CUcontext*) = nullptr;
  CUresult(CUDAAPI* ctx_get_device)(CUdevice*) = nullptr;
  CUresult(CUDAAPI* device_get_pci_bus_id)(char*, int, CUdevice) = nullptr;
  CUresult(CUDAAPI* device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult(CUDAAPI* device_get_name)(char*, int, CUdevice) = nullptr;
  CUresult(CUDAAPI* device_total_mem)(size_t*, CUdevice) = nullptr;  // cuDeviceTotalMem_v2
  CUresult(CUDAAPI* device_get_uuid)(CUuuid*, CUdevice) = nullptr;   // cuDeviceGetUuid (v1)
  // CUdevice of each CUDA ordinal (cuDeviceGet), from cuDeviceGetCount after cuInit.
  std::vector<CUdevice> handles;
};

// The driver function `symbol` in its ABI of CUDA `version` (1000 * major + 10 * minor),
// or nullptr when the driver lacks it.
void* driver_entry_point(const char* symbol, unsigned int version) noexcept;

// The driver, looked up once per process; nullptr when it cannot be reached (no driver,
// cuInit or cuDeviceGetCount failed, an entry point missing), and from then on.
const DriverApi* driver_api() noexcept;

}  // namespace gpukeeper::detail
