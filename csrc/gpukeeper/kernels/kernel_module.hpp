// The module that holds the core's device code (timing_kernels.ptx), loaded once per
// process through the driver API and launched from host code. CUDA builds only; the
// launch functions of calibration.hpp and gate_kernel.hpp are the ones to call.
#pragma once

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper::kernels {

// The entry points of timing_kernels.ptx.
enum class Kernel { spin, gate };

// Queues `kernel` as one block of one thread on `stream` of the current device, with
// `args` as cuLaunchKernel takes them (one pointer per parameter). The first call loads
// the module: the driver compiles the PTX for each GPU it meets (once per driver, kept in
// its compute cache). Throws DeviceError naming `what` when the module cannot be loaded
// or the launch fails.
void launch(Kernel kernel, stream_t stream, void** args, const char* what);

}  // namespace gpukeeper::kernels
