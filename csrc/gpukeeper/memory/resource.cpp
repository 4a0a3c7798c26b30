#include "gpukeeper/memory/resource.hpp"

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/cuda_resources.hpp"
#include "gpukeeper/memory/host_resource.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

const char* to_string(ResourceKind kind) noexcept {
  switch (kind) {
    case ResourceKind::host: return "host";
    case ResourceKind::device: return "device";
    case ResourceKind::async: return "async";
    case ResourceKind::pinned: return "pinned";
  }
  return "unknown";
}

ResourceKind parse_resource_kind(const std::string& name) {
  if (name == "host") return ResourceKind::host;
  if (name == "device") return ResourceKind::device;
  if (name == "async") return ResourceKind::async;
  if (name == "pinned") return ResourceKind::pinned;
  throw InvalidInputError("unknown memory kind '" + name +
                          "': expected one of 'host', 'device', 'async', 'pinned'");
}

int resource_device_count(ResourceKind kind) noexcept {
  return kind == ResourceKind::host ? 1 : cuda_device_count();
}

bool resource_available(ResourceKind kind, int device, std::string* why) {
  auto fail = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (kind == ResourceKind::host) {
    if (device != 0) return fail("host memory has one device id, 0; got " + std::to_string(device));
    return true;
  }
  // A negative id is wrong on every machine: say so before whether CUDA is there.
  if (device < 0) {
    return fail(std::string(to_string(kind)) + " memory: device " + std::to_string(device) +
                " is not a device id (ids start at 0)");
  }
  CudaStatus status = cuda_status();
  if (!status.available) {
    return fail(std::string(to_string(kind)) + " memory needs CUDA, which is unavailable: " +
                status.reason);
  }
  if (device < 0 || device >= status.device_count) {
    return fail("device " + std::to_string(device) + " does not exist (" +
                std::to_string(status.device_count) + " CUDA device(s) visible)");
  }
#ifdef GPUKEEPER_WITH_CUDA
  if (kind == ResourceKind::async) {
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) !=
            cudaSuccess ||
        !supported) {
      detail::clear_cuda_error();
      return fail("device " + std::to_string(device) +
                  " does not support stream-ordered allocation (cudaMallocAsync)");
    }
  }
#endif
  return true;
}

std::unique_ptr<MemoryResource> make_resource(ResourceKind kind, int device) {
  switch (kind) {
    case ResourceKind::host:
      if (device != 0) {
        throw InvalidInputError("host memory has one device id, 0; got " +
                                std::to_string(device));
      }
      return std::make_unique<HostResource>();
    case ResourceKind::device: return std::make_unique<CudaDeviceResource>(device);
    case ResourceKind::async: return std::make_unique<CudaAsyncResource>(device);
    case ResourceKind::pinned: return std::make_unique<CudaPinnedResource>(device);
  }
  throw InvalidInputError("unknown memory kind");
}

}  // namespace gpukeeper
