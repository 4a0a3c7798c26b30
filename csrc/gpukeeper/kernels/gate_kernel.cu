// The gate kernel (see gate_kernel.hpp).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/gate_kernel.hpp"

namespace gpukeeper {

namespace {

__device__ __forceinline__ std::uint64_t gate_clock_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void gate_kernel(const volatile std::uint32_t* open_flag,
                            volatile std::uint32_t* outcome, std::uint64_t timeout_ns) {
  const std::uint64_t start = gate_clock_ns();
  std::uint32_t result = static_cast<std::uint32_t>(GateOutcome::opened);
  // The flag lives in host memory: every read crosses the bus (~1 us), which also keeps
  // this loop from hammering anything on the device.
  while (*open_flag == 0) {
    if (gate_clock_ns() - start >= timeout_ns) {
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
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    const char* name = cudaGetErrorName(status);
    const char* text = cudaGetErrorString(status);
    throw DeviceError("gate_kernel<<<>>>", static_cast<int>(status), name ? name : "unknown",
                      text ? text : "no message");
  }
}

}  // namespace gpukeeper
