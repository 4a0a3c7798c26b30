// The calibration kernels (see calibration.hpp). Compiled by nvcc into a small static
// library; everything else in the core is compiled by the host compiler.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/kernels/device_clock.cuh"

namespace gpukeeper {

namespace {

using kernels::global_timer_ns;

__global__ void spin_kernel(std::uint64_t duration_ns, std::uint64_t* out) {
  const std::uint64_t start = global_timer_ns();
  std::uint64_t now = start;
  while (now - start < duration_ns) now = global_timer_ns();
  if (out != nullptr) {
    out[0] = start;
    out[1] = now;
  }
}

}  // namespace

bool calibration_kernels_available() noexcept { return true; }

void launch_spin_kernel(std::uint64_t duration_ns, stream_t stream, std::uint64_t* device_out) {
  spin_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(duration_ns, device_out);
  kernels::check_launch("spin_kernel<<<>>>");
}

}  // namespace gpukeeper
