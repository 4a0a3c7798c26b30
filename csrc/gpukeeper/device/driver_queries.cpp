// runtime.hpp's questions to the driver: is libcuda loaded, which primary contexts exist,
// is a foreign context current, PCI bus ids and device attributes, all without a context.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#endif

#include "gpukeeper/device/runtime.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/device/driver_api.hpp"
#endif

namespace gpukeeper {

#if defined(__linux__)
namespace {

// dl_iterate_phdr callback: stops (returns 1) at a loaded object named libcuda.so*.
int is_libcuda(struct dl_phdr_info* info, size_t, void*) {
  const char* path = info->dlpi_name;
  if (path == nullptr || *path == '\0') return 0;
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  return std::strncmp(base, "libcuda.so", 10) == 0 ? 1 : 0;
}

}  // namespace
#endif

std::optional<bool> cuda_driver_loaded() noexcept {
#if defined(__linux__)
  // Nothing unloads the driver, so a yes is kept. The loaded objects are walked in
  // memory (~1 us): dlopen(RTLD_NOLOAD) searches the library path on disk first (20 us
  // and more), and a per-test leak check asks this twice a test. libc's walker is looked
  // up at run time: the module links static archives (librt.a, with the CUDA runtime)
  // whose own copy of dl_iterate_phdr does not see the process's libraries.
  using Walker = int (*)(int (*)(struct dl_phdr_info*, size_t, void*), void*);
  static std::atomic<bool> seen{false};
  static const Walker walk = reinterpret_cast<Walker>(dlsym(RTLD_DEFAULT, "dl_iterate_phdr"));
  if (seen.load(std::memory_order_relaxed)) return true;
  bool found = false;
  if (walk != nullptr) {
    found = walk(&is_libcuda, nullptr) != 0;
  } else if (void* handle = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
    dlclose(handle);  // RTLD_NOLOAD took a reference
    found = true;
  }
  if (found) seen.store(true, std::memory_order_relaxed);
  return found;
#else
  return std::nullopt;
#endif
}

#ifdef GPUKEEPER_WITH_CUDA

namespace {

using detail::DriverApi;
using detail::driver_api;

// The driver for a question about CUDA device `device`, or nullptr (no driver, no such device).
const DriverApi* driver_for(int device) noexcept {
  const DriverApi* api = driver_api();
  if (api == nullptr || device < 0 || device >= static_cast<int>(api->handles.size())) {
    return nullptr;
  }
  return api;
}

std::optional<bool> primary_active(const DriverApi& api, int ordinal) noexcept {
  unsigned int flags = 0;
  int active = 0;
  if (api.primary_ctx_get_state(api.handles[ordinal], &flags, &active) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return active != 0;
}

std::optional<int> attribute(const DriverApi& api, CUdevice dev, int which) noexcept {
  int value = 0;
  if (api.device_get_attribute(&value, static_cast<CUdevice_attribute>(which), dev) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return value;
}

// "GPU-" and the 16 bytes in hex, grouped 8-4-4-4-12 (as nvidia-smi and NVML write it).
std::string uuid_text(const CUuuid& uuid) {
  std::string out = "GPU-";
  char digits[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    out += digits;
  }
  return out;
}

}  // namespace

std::optional<int> driver_device_count() noexcept {
  const DriverApi* api = driver_api();
  if (api == nullptr) return std::nullopt;
  return static_cast<int>(api->handles.size());
}

std::optional<bool> primary_context_active(int device) noexcept {
  const std::optional<bool> loaded = cuda_driver_loaded();
  if (loaded.has_value() && !*loaded) return false;
  const DriverApi* api = driver_for(device);
  if (api == nullptr) return std::nullopt;
  return primary_active(*api, device);
}

std::optional<int> current_context_foreign() noexcept {
  const std::optional<bool> loaded = cuda_driver_loaded();
  if (loaded.has_value() && !*loaded) return std::nullopt;
  const DriverApi* api = driver_api();
  if (api == nullptr) return std::nullopt;
  CUcontext current = nullptr;
  if (api->ctx_get_current(&current) != CUDA_SUCCESS || current == nullptr) return std::nullopt;
  CUdevice dev = 0;
  if (api->ctx_get_device(&dev) != CUDA_SUCCESS) return std::nullopt;
  auto it = std::find(api->handles.begin(), api->handles.end(), dev);
  if (it == api->handles.end()) return std::nullopt;
  const int ordinal = static_cast<int>(it - api->handles.begin());
  const std::optional<bool> active = primary_active(*api, ordinal);
  if (!active.has_value()) return std::nullopt;
  if (!*active) return ordinal;  // a context is current, and the primary one does not exist
  // Retaining an active primary context only counts a reference (it creates nothing);
  // released at once.
  CUcontext primary = nullptr;
  if (api->primary_ctx_retain(&primary, dev) != CUDA_SUCCESS) return std::nullopt;
  api->primary_ctx_release(dev);
  if (primary != current) return ordinal;
  return std::nullopt;
}

std::optional<std::string> device_pci_bus_id(int device) {
  const DriverApi* api = driver_for(device);
  if (api == nullptr) return std::nullopt;
  char text[64] = {};
  if (api->device_get_pci_bus_id(text, sizeof text, api->handles[device]) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return std::string(text);
}

std::optional<DriverDeviceInfo> driver_device_info(int device) {
  // The ordinal is checked against the handles taken at load, not by cuDeviceGet: a failed
  // driver call for a device that does not exist is a finding for compute-sanitizer.
  const DriverApi* api = driver_for(device);
  if (api == nullptr) return std::nullopt;
  const CUdevice dev = api->handles[device];
  DriverDeviceInfo info;
  auto mhz = [](std::optional<int> khz) { return khz ? std::optional<int>(*khz / 1000) : khz; };
  info.multiprocessors = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.sm_clock_max_mhz = mhz(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE));
  info.memory_clock_max_mhz = mhz(attribute(*api, dev, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE));
  info.memory_bus_width_bits = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  info.l2_cache_bytes = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info.cc_major = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attribute(*api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  char name[256] = {};
  if (api->device_get_name(name, sizeof name, dev) == CUDA_SUCCESS) info.name = std::string(name);
  size_t total = 0;
  if (api->device_total_mem(&total, dev) == CUDA_SUCCESS) info.total_memory_bytes = total;
  CUuuid uuid{};
  if (api->device_get_uuid(&uuid, dev) == CUDA_SUCCESS) info.uuid = uuid_text(uuid);
  return info;
}

#else  // CPU-only build: no driver to ask

std::optional<int> driver_device_count() noexcept { return std::nullopt; }

std::optional<bool> primary_context_active(int device) noexcept {
  (void)device;
  const std::optional<bool> loaded = cuda_driver_loaded();
  if (loaded.has_value() && !*loaded) return false;
  return std::nullopt;
}

std::optional<int> current_context_foreign() noexcept { return std::nullopt; }

std::optional<std::string> device_pci_bus_id(int device) {
  (void)device;
  return std::nullopt;
}

std::optional<DriverDeviceInfo> driver_device_info(int device) {
  (void)device;
  return std::nullopt;
}

#endif

}  // namespace gpukeeper
