// Launching the gate kernel (see gate_kernel.hpp); its code is gk_gate_kernel in
// timing_kernels.ptx.
#include "gpukeeper/kernels/gate_kernel.hpp"

#include "gpukeeper/kernels/kernel_module.hpp"

namespace gpukeeper {

void launch_gate_kernel(const volatile std::uint32_t* open_flag, volatile std::uint32_t* outcome,
                        std::uint64_t timeout_ns, stream_t stream) {
  void* args[] = {&open_flag, &outcome, &timeout_ns};
  kernels::launch(kernels::Kernel::gate, stream, args, "launch_gate_kernel");
}

}  // namespace gpukeeper
