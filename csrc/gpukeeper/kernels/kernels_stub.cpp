// Builds without CUDA: no device code (see calibration.hpp and gate_kernel.hpp).
#include <cstdint>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/kernels/gate_kernel.hpp"

namespace gpukeeper {

bool calibration_kernels_available() noexcept { return false; }

void launch_spin_kernel(std::uint64_t, stream_t, std::uint64_t*) {
  throw DeviceError("launch_spin_kernel", 0, "unavailable",
                    "gpukeeper was built without CUDA: there are no calibration kernels");
}

void launch_gate_kernel(const volatile std::uint32_t*, volatile std::uint32_t*, std::uint64_t,
                        stream_t) {
  throw DeviceError("launch_gate_kernel", 0, "unavailable",
                    "gpukeeper was built without CUDA: there is no gate kernel");
}

}  // namespace gpukeeper
