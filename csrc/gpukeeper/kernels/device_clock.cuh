// Shared by the .cu files of kernels/: the GPU's nanosecond clock, and the check after a
// launch. Device code and nvcc only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::kernels {

// %globaltimer: nanoseconds, the same clock on every SM (unlike clock64, which counts
// cycles of one SM and changes rate with the clock).
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Throws DeviceError naming `launch` when the last launch failed. Header-only pieces:
// the kernels library does not link back into the core.
inline void check_launch(const char* launch) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  throw DeviceError(launch, static_cast<int>(status), name ? name : "unknown",
                    text ? text : "no message");
}

}  // namespace gpukeeper::kernels
