// VirtualMemory on a CUDA device through the driver's virtual memory management
// (cuMemAddressReserve, cuMemCreate, cuMemMap, ...). The driver's entry points are looked
// up through the static runtime at run time, so nothing links libcuda.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gpukeeper/memory/virtual_memory.hpp"

namespace gpukeeper {

// Whether `device` supports virtual memory management; when not and `why` is given,
// *why says so. False in a CPU-only build.
bool cuda_virtual_memory_supported(int device, std::string* why = nullptr);

// Throws DeviceError when unsupported.
std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device);

// Pages that process `pid` shares (VirtualMemory::share_page gave it `fds`, its own
// descriptor numbers): each descriptor is copied into this process with pidfd_getfd, its
// page imported, and the pages mapped in order at a new range, readable and writable from
// `device` and its peers. The returned pointer is the range's base; when its last owner
// lets go the range is unmapped and the pages released. Throws GpuError naming the cause
// and the remedy where the system refuses (no pidfd, no ptrace permission, the sender
// gone), with nothing left behind.
std::shared_ptr<void> import_shared_pages(int device, int pid, const std::vector<int>& fds,
                                          std::size_t page_size);

}  // namespace gpukeeper
