// What the driver answers without a context (device/runtime.hpp): whether libcuda is
// loaded, primary contexts, a foreign current context, PCI bus ids and device attributes.
// Without a driver every answer is "unknown"; on a GPU the answers agree with the runtime,
// and asking creates no context.
#include <cstdio>
#include <optional>
#include <string>

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#endif

#include "catch.hpp"
#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/device/runtime.hpp"

using gpukeeper::cuda_driver_loaded;
using gpukeeper::current_context_foreign;
using gpukeeper::device_pci_bus_id;
using gpukeeper::driver_device_count;
using gpukeeper::driver_device_info;
using gpukeeper::primary_context_active;

static_assert(gpukeeper::kCpuDevice == -1, "the CPU's device id is -1 everywhere");

// In a test case: skips it unless CUDA is usable here.
#define GK_SKIP_UNLESS_CUDA_DEVICE()                                                     \
  do {                                                                                   \
    if (gpukeeper::cuda_device_count() == 0) {                                           \
      GK_SKIP("no usable CUDA device: " << gpukeeper::cuda_status().reason);             \
    }                                                                                    \
  } while (0)

#ifdef GPUKEEPER_WITH_CUDA

// First in the file: in its own process (ctest's cpp.device.gpu) nothing has made a
// context before it.
TEST_CASE("device: asking the driver creates no context", "[device][gpu]") {
  GK_SKIP_UNLESS_CUDA_DEVICE();
  const std::optional<int> count = driver_device_count();
  REQUIRE(count.has_value());
  REQUIRE(*count == gpukeeper::cuda_device_count());
  int inactive = 0;
  for (int d = 0; d < *count; ++d) {
    const std::optional<bool> before = primary_context_active(d);
    REQUIRE(before.has_value());
    if (*before) continue;
    ++inactive;
    INFO("device " << d);
    CHECK(device_pci_bus_id(d).has_value());
    CHECK(driver_device_info(d).has_value());
    CHECK_FALSE(current_context_foreign().has_value());
    CHECK(primary_context_active(d) == std::optional<bool>(false));
  }
  if (inactive == 0) GK_SKIP("every device's primary context existed already");
  // The runtime's first real call makes device 0's primary context and makes it current.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaFree(nullptr) == cudaSuccess);
  CHECK(primary_context_active(0) == std::optional<bool>(true));
  CHECK_FALSE(current_context_foreign().has_value());  // the primary one is current
}

TEST_CASE("device: the driver's names, memory and PCI ids agree with the runtime",
          "[device][gpu]") {
  GK_SKIP_UNLESS_CUDA_DEVICE();
  REQUIRE(driver_device_count() == std::optional<int>(gpukeeper::cuda_device_count()));
  REQUIRE(cuda_driver_loaded() == std::optional<bool>(true));
  for (int d = 0; d < gpukeeper::cuda_device_count(); ++d) {
    INFO("device " << d);
    cudaDeviceProp p{};
    REQUIRE(cudaGetDeviceProperties(&p, d) == cudaSuccess);
    const auto info = driver_device_info(d);
    REQUIRE(info.has_value());
    CHECK(info->name == std::optional<std::string>(p.name));
    CHECK(info->total_memory_bytes == std::optional<std::size_t>(p.totalGlobalMem));
    CHECK(info->cc_major == std::optional<int>(p.major));
    CHECK(info->cc_minor == std::optional<int>(p.minor));
    CHECK(info->multiprocessors == std::optional<int>(p.multiProcessorCount));
    CHECK(info->l2_cache_bytes == std::optional<int>(p.l2CacheSize));
    REQUIRE(info->uuid.has_value());
    CHECK(info->uuid->size() == 40);  // "GPU-" + 32 hex digits + 4 dashes
    CHECK(info->uuid->rfind("GPU-", 0) == 0);
    char expected_pci[64] = {};
    REQUIRE(cudaDeviceGetPCIBusId(expected_pci, sizeof expected_pci, d) == cudaSuccess);
    CHECK(device_pci_bus_id(d) == std::optional<std::string>(expected_pci));
  }
  const int past = gpukeeper::cuda_device_count();
  CHECK_FALSE(device_pci_bus_id(past).has_value());
  CHECK_FALSE(primary_context_active(past).has_value());
  CHECK_FALSE(driver_device_info(past).has_value());
}

TEST_CASE("device: a context made with cuCtxCreate is seen as foreign", "[device][gpu]") {
  GK_SKIP_UNLESS_CUDA_DEVICE();
#if CUDART_VERSION >= 12050
  // cuCtxCreate as CUDA 12.5 and later define it (_v4, with a parameter block that may be
  // null): CUDA 13's driver no longer hands out the older ABI. OpenMM makes its contexts so.
  PFN_cuCtxCreate_v12050 create = nullptr;
  PFN_cuCtxDestroy_v4000 destroy = nullptr;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  REQUIRE(cudaGetDriverEntryPointByVersion("cuCtxCreate", &fn, 12050, cudaEnableDefault, &found) ==
          cudaSuccess);
  REQUIRE(found == cudaDriverEntryPointSuccess);
  create = reinterpret_cast<PFN_cuCtxCreate_v12050>(fn);
  REQUIRE(cudaGetDriverEntryPointByVersion("cuCtxDestroy", &fn, 12050, cudaEnableDefault, &found) ==
          cudaSuccess);
  REQUIRE(found == cudaDriverEntryPointSuccess);
  destroy = reinterpret_cast<PFN_cuCtxDestroy_v4000>(fn);

  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaFree(nullptr) == cudaSuccess);  // the primary context exists and is current
  REQUIRE_FALSE(current_context_foreign().has_value());
  CUcontext ctx = nullptr;
  REQUIRE(create(&ctx, nullptr, 0, 0) == CUDA_SUCCESS);  // made current on this thread
  CHECK(current_context_foreign() == std::optional<int>(0));
  CHECK(primary_context_active(0) == std::optional<bool>(true));
  REQUIRE(destroy(ctx) == CUDA_SUCCESS);  // popped: the primary one is current again
  CHECK_FALSE(current_context_foreign().has_value());
#else
  GK_SKIP("needs cudaGetDriverEntryPointByVersion (CUDA 12.5) to make a context");
#endif
}

#else

TEST_CASE("device: driver queries need a CUDA build", "[device][gpu]") {
  GK_SKIP("gpukeeper was built without CUDA");
}

#endif  // GPUKEEPER_WITH_CUDA

TEST_CASE("device: without a reachable driver every answer is unknown", "[device]") {
  if (driver_device_count().has_value()) GK_SKIP("the CUDA driver is reachable here");
  REQUIRE_FALSE(device_pci_bus_id(0).has_value());
  REQUIRE_FALSE(driver_device_info(0).has_value());
  REQUIRE_FALSE(current_context_foreign().has_value());
  // No libcuda in the process: no context can exist. Otherwise the driver cannot be asked.
  const std::optional<bool> loaded = cuda_driver_loaded();
  if (loaded == std::optional<bool>(false)) {
    REQUIRE(primary_context_active(0) == std::optional<bool>(false));
  } else {
    REQUIRE_FALSE(primary_context_active(0).has_value());
  }
}

TEST_CASE("device: ids that are no device are unknown", "[device]") {
  for (int id : {gpukeeper::kCpuDevice, -7, 1 << 20}) {
    INFO("id " << id);
    CHECK_FALSE(device_pci_bus_id(id).has_value());
    CHECK_FALSE(driver_device_info(id).has_value());
    const std::optional<bool> active = primary_context_active(id);
    // false only as "libcuda is not loaded", which holds for every id.
    CHECK((!active.has_value() || cuda_driver_loaded() == std::optional<bool>(false)));
    CHECK((!active.has_value() || !*active));
  }
#if defined(__linux__)
  REQUIRE(cuda_driver_loaded().has_value());
  // The runtime loads libcuda to find a device.
  if (gpukeeper::cuda_device_count() > 0) REQUIRE(*cuda_driver_loaded());
#endif
}
