// What every VirtualMemory has unless it says otherwise: pages that stay in this process.
#include "gpukeeper/memory/virtual_memory.hpp"

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

int VirtualMemory::share_page(page_t) {
  throw GpuError("these pages cannot be shared with another process: only device memory "
                 "mapped through CUDA's virtual memory management can be");
}

}  // namespace gpukeeper
