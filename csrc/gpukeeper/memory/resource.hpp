// The upstream interface: where a pool gets its segments from. One implementation per
// kind of memory (host_resource.hpp, cuda_resources.hpp); adaptors may wrap any of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/virtual_memory.hpp"

namespace gpukeeper {

enum class ResourceKind {
  host,    // plain host memory (CPU mode, tests)
  device,  // cudaMalloc / cudaFree
  async,   // cudaMallocAsync / cudaFreeAsync on the device's default memory pool
  pinned,  // cudaMallocHost / cudaFreeHost: page-locked host memory
};

const char* to_string(ResourceKind kind) noexcept;

// Parses "host", "device", "async", "pinned"; throws InvalidInputError otherwise.
ResourceKind parse_resource_kind(const std::string& name);

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;

  // Returns nullptr when the upstream is out of memory, so that callers can release
  // caches and retry; throws DeviceError for any other failure.
  virtual void* allocate(std::size_t bytes, stream_t stream) = 0;

  // `bytes` and `stream` are those of the matching allocate call.
  virtual void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept = 0;

  virtual ResourceKind kind() const noexcept = 0;

  // The CUDA device the memory belongs to (0 for plain host memory).
  virtual int device() const noexcept = 0;

  // Whether kernels on streams may touch the memory, so that reuse across streams
  // must wait for the streams' work.
  virtual bool stream_ordered() const noexcept = 0;

  virtual bool device_accessible() const noexcept = 0;
  virtual bool host_accessible() const noexcept = 0;

  // Free and total bytes of the memory this upstream draws from (device or host).
  virtual MemoryInfo memory_info() const = 0;

  // The same memory as separately reserved addresses and mappable pages (for expandable
  // segments), owned by the resource and made on first use; nullptr when this kind of
  // memory has none. Throws DeviceError when the device lacks the support.
  virtual VirtualMemory* virtual_memory() { return nullptr; }
};

// Whether `kind` can be used on `device` in this build and on this machine; when it
// cannot and `why` is given, *why says so.
bool resource_available(ResourceKind kind, int device, std::string* why = nullptr);

// Makes the upstream of `kind` for `device`; throws InvalidInputError when the device
// does not exist and DeviceError when the kind is unavailable.
std::unique_ptr<MemoryResource> make_resource(ResourceKind kind, int device);

// How many device ids `kind` accepts: 1 for host memory, the CUDA device count otherwise.
int resource_device_count(ResourceKind kind) noexcept;

}  // namespace gpukeeper
