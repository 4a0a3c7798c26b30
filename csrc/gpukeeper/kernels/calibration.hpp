// Calibration kernels: GPU work whose duration is known from the GPU's own nanosecond
// clock (%globaltimer), to check what a timer reads against the truth. The timed run
// itself is host code: calibrate() in timing/timer_calibration.hpp.
//
// Plain C++ (no CUDA types): the kernel is PTX (timing_kernels.ptx) that the driver
// compiles at first use, in every CUDA build; builds without CUDA get kernels_stub.cpp,
// whose launch functions throw DeviceError.
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

// Whether this build has the kernels (it was built with CUDA).
bool calibration_kernels_available() noexcept;

// Queues one single-thread kernel on `stream` (of the current device) that spins until
// %globaltimer has advanced by `duration_ns`. When `device_out` is given (device memory
// for two values), the kernel writes its first and last %globaltimer readings (ns) there.
// Does not synchronize. Throws DeviceError when the launch fails or without the kernels.
void launch_spin_kernel(std::uint64_t duration_ns, stream_t stream,
                        std::uint64_t* device_out = nullptr);

}  // namespace gpukeeper
