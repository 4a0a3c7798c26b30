// The calibration kernels (see calibration.hpp). Compiled by nvcc into a small static
// library; everything else in the core is compiled by the host compiler.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"

namespace gpukeeper {

namespace {

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(std::uint64_t duration_ns, std::uint64_t* out) {
  const std::uint64_t start = global_timer_ns();
  std::uint64_t now = start;
  while (now - start < duration_ns) now = global_timer_ns();
  if (out != nullptr) {
    out[0] = start;
    out[1] = now;
  }
}

// Throws like GK_CUDA_CHECK, with only header-defined pieces (this library does not link
// back into the core).
void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  (void)cudaGetLastError();
  throw DeviceError(call, static_cast<int>(status), name ? name : "unknown",
                    text ? text : "no message");
}

}  // namespace

bool calibration_kernels_available() noexcept { return true; }

void launch_spin_kernel(std::uint64_t duration_ns, stream_t stream, std::uint64_t* device_out) {
  spin_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(duration_ns, device_out);
  check(cudaGetLastError(), "spin_kernel<<<>>>");
}

}  // namespace gpukeeper
