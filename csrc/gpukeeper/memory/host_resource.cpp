#include "gpukeeper/memory/host_resource.hpp"

#include <cstdlib>

namespace gpukeeper {

namespace {
constexpr std::size_t kHostAlignment = 256;  // the pool's alignment, so offsets stay aligned
}

void* HostResource::allocate(std::size_t bytes, stream_t) {
  std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (rounded < bytes) return nullptr;  // overflow: treat as out of memory
  return std::aligned_alloc(kHostAlignment, rounded);
}

void HostResource::deallocate(void* ptr, std::size_t, stream_t) noexcept { std::free(ptr); }

VirtualMemory* HostResource::virtual_memory() {
  std::call_once(vm_once_, [this] { vm_ = std::make_unique<HostVirtualMemory>(); });
  return vm_.get();
}

}  // namespace gpukeeper
