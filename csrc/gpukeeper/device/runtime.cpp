#include "gpukeeper/device/runtime.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpukeeper/core/errors.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

#ifndef GPUKEEPER_BUILD_TYPE
#define GPUKEEPER_BUILD_TYPE "unknown"
#endif

namespace gpukeeper {

BuildInfo build_info() {
  BuildInfo info;
#ifdef GPUKEEPER_WITH_CUDA
  info.cuda = true;
  info.cuda_version = std::to_string(CUDART_VERSION / 1000) + "." +
                      std::to_string((CUDART_VERSION % 1000) / 10);
#ifdef GPUKEEPER_STATIC_CUDART
  info.static_cudart = true;
#endif
#endif
#if defined(__clang__)
  info.compiler = std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "GNU " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) +
                  "." + std::to_string(__GNUC_PATCHLEVEL__);
#elif defined(_MSC_VER)
  info.compiler = "MSVC " + std::to_string(_MSC_VER);
#else
  info.compiler = "unknown";
#endif
  info.cxx_standard = __cplusplus;
  info.build_type = GPUKEEPER_BUILD_TYPE;
  return info;
}

#ifdef GPUKEEPER_WITH_CUDA
namespace {

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

// The runtime says "CUDA driver version is insufficient for CUDA runtime version" both when
// there is no driver at all and when it is too old; the fixes differ (install one, or
// upgrade it), so the two are told apart by the driver version (0 without a driver).
std::string unavailable_reason(cudaError_t err, int driver_version, int runtime_version) {
  if (err == cudaErrorInsufficientDriver && driver_version == 0) {
    return "No NVIDIA driver found (libcuda.so.1 is not installed or cannot be loaded)";
  }
  if (err == cudaErrorInsufficientDriver) {
    return "NVIDIA driver older than the CUDA runtime (driver " + cuda_version_text(driver_version) +
           ", runtime " + cuda_version_text(runtime_version) + "): upgrade the driver";
  }
  if (err == cudaErrorNoDevice) return "the driver reports no CUDA device";
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace
#endif

CudaStatus cuda_status() {
  CudaStatus status;
#ifdef GPUKEEPER_WITH_CUDA
  (void)cudaRuntimeGetVersion(&status.runtime_version);
  (void)cudaDriverGetVersion(&status.driver_version);  // 0 when no driver is installed
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    status.reason = unavailable_reason(err, status.driver_version, status.runtime_version);
    detail::clear_cuda_error();
    return status;
  }
  if (count == 0) {
    status.reason = "the driver reports no CUDA device";
    return status;
  }
  status.available = true;
  status.device_count = count;
#else
  status.reason = "gpukeeper was built without CUDA (no CUDA toolkit at build time)";
#endif
  return status;
}

int cuda_device_count() noexcept {
#ifdef GPUKEEPER_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    detail::clear_cuda_error();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

MemoryInfo device_memory_info(int device) {
#ifdef GPUKEEPER_WITH_CUDA
  int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw InvalidInputError("device " + std::to_string(device) + " does not exist (" +
                            std::to_string(count) + " CUDA device(s) visible)");
  }
  detail::DeviceGuard guard(device);
  MemoryInfo info;
  GK_CUDA_CHECK(cudaMemGetInfo(&info.free, &info.total));
  return info;
#else
  throw InvalidInputError("device " + std::to_string(device) +
                          " does not exist: gpukeeper was built without CUDA");
#endif
}

MemoryInfo host_memory_info() {
  MemoryInfo info;
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) info.total = static_cast<std::size_t>(pages) * page_size;
  // MemAvailable counts reclaimable page cache, which is what "free" means to a user.
  // (C stdio, not iostreams: see core/text.hpp.)
  if (std::FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, meminfo) != nullptr) {
      if (std::strncmp(line, "MemAvailable:", 13) == 0) {
        info.free = static_cast<std::size_t>(std::strtoull(line + 13, nullptr, 10)) * 1024;
        std::fclose(meminfo);
        return info;
      }
    }
    std::fclose(meminfo);
  }
  long avail = sysconf(_SC_AVPHYS_PAGES);
  if (avail > 0 && page_size > 0) info.free = static_cast<std::size_t>(avail) * page_size;
  return info;
}

}  // namespace gpukeeper
