// VirtualMemory on a CUDA device through the driver's virtual memory management
// (cuMemAddressReserve, cuMemCreate, cuMemMap, ...). The driver's entry points are looked
// up through the static runtime at run time, so nothing links libcuda.
#pragma once

#include <memory>
#include <string>

#include "gpukeeper/memory/virtual_memory.hpp"

namespace gpukeeper {

// Whether `device` supports virtual memory management; when not and `why` is given,
// *why says so. False in a CPU-only build.
bool cuda_virtual_memory_supported(int device, std::string* why = nullptr);

// Throws DeviceError when unsupported.
std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device);

}  // namespace gpukeeper
