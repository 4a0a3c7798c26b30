// Plain host memory from the C allocator: the upstream of CPU mode and of the CPU tests.
#pragma once

#include <memory>
#include <mutex>

#include "gpukeeper/memory/host_virtual_memory.hpp"
#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper {

class HostResource final : public MemoryResource {
 public:
  void* allocate(std::size_t bytes, stream_t stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  ResourceKind kind() const noexcept override { return ResourceKind::host; }
  int device() const noexcept override { return 0; }
  bool stream_ordered() const noexcept override { return false; }
  bool device_accessible() const noexcept override { return false; }
  bool host_accessible() const noexcept override { return true; }
  MemoryInfo memory_info() const override { return host_memory_info(); }
  VirtualMemory* virtual_memory() override;

 private:
  std::once_flag vm_once_;
  std::unique_ptr<HostVirtualMemory> vm_;
};

}  // namespace gpukeeper
