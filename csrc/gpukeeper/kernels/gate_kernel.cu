// The gate kernel (see gate_kernel.hpp).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpukeeper/kernels/device_clock.cuh"
#include "gpukeeper/kernels/gate_kernel.hpp"

namespace gpukeeper {

namespace {

using kernels::global_timer_ns;

__global__ void gate_kernel(const volatile std::uint32_t* open_flag,
                            volatile std::uint32_t* outcome, std::uint64_t timeout_ns) {
  const std::uint64_t start = global_timer_ns();
  std::uint32_t result = static_cast<std::uint32_t>(GateOutcome::opened);
  // The flag lives in host memory: every read crosses the bus (~1 us), which also keeps
  // this loop from hammering anything on the device.
  while (*open_flag == 0) {
    if (global_timer_ns() - start >= timeout_ns) {
      result = static_cast<std::uint32_t>(GateOutcome::timed_out);
      break;
    }
  }
  *outcome = result;
  // The host reads `outcome` without synchronizing (to reuse the slot): make the write
  // visible to it.
  __threadfence_system();
}

}  // namespace

void launch_gate_kernel(const volatile std::uint32_t* open_flag, volatile std::uint32_t* outcome,
                        std::uint64_t timeout_ns, stream_t stream) {
  gate_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(open_flag, outcome,
                                                                    timeout_ns);
  kernels::check_launch("gate_kernel<<<>>>");
}

}  // namespace gpukeeper
