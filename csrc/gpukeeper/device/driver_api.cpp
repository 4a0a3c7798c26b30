// Finding the CUDA driver API through the runtime's entry-point query (see driver_api.hpp).
#include "gpukeeper/device/driver_api.hpp"

#include <cuda_runtime_api.h>

#include "gpukeeper/core/cuda_check.hpp"

namespace gpukeeper::detail {

namespace {

// The driver function `symbol` in its ABI of CUDA `version` (1000 * major + 10 * minor),
// or nullptr. The versioned query exists from CUDA 12.5; before it, the plain one gives
// the newest ABI of the symbol, which is the one of `version` for all asked here except
// cuDeviceGetUuid (v2 from 11.4: the same answer but for MIG instances).
template <typename Fn>
bool find(const char* symbol, unsigned int version, Fn*& out) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found);
#else
  (void)version;
  cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found);
#endif
  const bool ok = err == cudaSuccess && found == cudaDriverEntryPointSuccess;
#else  // CUDA 11.3 - 11.8: no query result
  (void)version;
  cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault);
  const bool ok = err == cudaSuccess;
#endif
  if (err != cudaSuccess) clear_cuda_error();
  if (!ok || fn == nullptr) return false;
  out = reinterpret_cast<Fn*>(fn);
  return true;
}

}  // namespace

void* driver_entry_point(const char* symbol, unsigned int version) noexcept {
  void* fn = nullptr;
  return find(symbol, version, fn) ? fn : nullptr;
}

namespace {

bool load(DriverApi& api) {
  CUresult(CUDAAPI * init)(unsigned int) = nullptr;
  CUresult(CUDAAPI * device_get_count)(int*) = nullptr;
  if (!find("cuInit", 2000, init) || !find("cuDeviceGetCount", 2000, device_get_count) ||
      !find("cuDeviceGet", 2000, api.device_get) ||
      !find("cuDevicePrimaryCtxGetState", 7000, api.primary_ctx_get_state) ||
      !find("cuDevicePrimaryCtxRetain", 7000, api.primary_ctx_retain) ||
      !find("cuDevicePrimaryCtxRelease", 11000, api.primary_ctx_release) ||
      !find("cuCtxGetCurrent", 4000, api.ctx_get_current) ||
      !find("cuCtxGetDevice", 2000, api.ctx_get_device) ||
      !find("cuDeviceGetPCIBusId", 4010, api.device_get_pci_bus_id) ||
      !find("cuDeviceGetAttribute", 2000, api.device_get_attribute) ||
      !find("cuDeviceGetName", 2000, api.device_get_name) ||
      !find("cuDeviceTotalMem", 3020, api.device_total_mem) ||
      !find("cuDeviceGetUuid", 9020, api.device_get_uuid)) {
    return false;
  }
  if (init(0) != CUDA_SUCCESS) return false;
  int count = 0;
  if (device_get_count(&count) != CUDA_SUCCESS) return false;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice dev = 0;
    if (api.device_get(&dev, ordinal) != CUDA_SUCCESS) return false;
    api.handles.push_back(dev);
  }
  return true;
}

}  // namespace

const DriverApi* driver_api() noexcept {
  static const DriverApi* const api = []() -> const DriverApi* {
    static DriverApi loaded;
    try {
      if (load(loaded)) return &loaded;
    } catch (...) {
      // std::bad_alloc from the handles: the driver stays unknown.
    }
    return nullptr;
  }();
  return api;
}

}  // namespace gpukeeper::detail
