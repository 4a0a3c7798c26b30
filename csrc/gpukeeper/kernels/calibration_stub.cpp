// Builds without nvcc: no calibration kernels (see calibration.hpp).
#include <cstdint>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"

namespace gpukeeper {

bool calibration_kernels_available() noexcept { return false; }

void launch_spin_kernel(std::uint64_t, stream_t, std::uint64_t*) {
  throw DeviceError("launch_spin_kernel", 0, "unavailable",
                    "gpukeeper was built without nvcc: there are no calibration kernels");
}

}  // namespace gpukeeper
