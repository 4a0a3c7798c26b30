// Launching the calibration kernel (see calibration.hpp); its code is gk_spin_kernel in
// timing_kernels.ptx.
#include "gpukeeper/kernels/calibration.hpp"

#include "gpukeeper/kernels/kernel_module.hpp"

namespace gpukeeper {

bool calibration_kernels_available() noexcept { return true; }

void launch_spin_kernel(std::uint64_t duration_ns, stream_t stream, std::uint64_t* device_out) {
  void* args[] = {&duration_ns, &device_out};
  kernels::launch(kernels::Kernel::spin, stream, args, "launch_spin_kernel");
}

}  // namespace gpukeeper
