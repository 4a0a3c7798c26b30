// Calibration kernels: GPU work whose duration is known from the GPU's own nanosecond
// clock (%globaltimer), to check what a timer reads against the truth. Used by the tests
// and by `gpukeeper check`.
//
// Plain C++ (no CUDA types): the kernels live in calibration.cu, built only where nvcc
// exists; other builds get kernels_stub.cpp, whose launch functions throw DeviceError.
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

// Whether this build has the kernels (nvcc was found at build time).
bool calibration_kernels_available() noexcept;

// Queues one single-thread kernel on `stream` (of the current device) that spins until
// %globaltimer has advanced by `duration_ns`. When `device_out` is given (device memory
// for two values), the kernel writes its first and last %globaltimer readings (ns) there.
// Does not synchronize. Throws DeviceError when the launch fails or without the kernels.
void launch_spin_kernel(std::uint64_t duration_ns, stream_t stream,
                        std::uint64_t* device_out = nullptr);

struct Calibration {
  std::uint64_t requested_ns = 0;
  std::uint64_t kernel_ns = 0;  // the kernel's own %globaltimer reading: end - start
  double event_ms = 0.0;        // what a Timer (event pair) on the stream read around it
  bool launch_hidden = false;   // the Timer's gate opened in time (hide_launch_latency)
};

// Runs one spin kernel of `duration_ns` on `stream` of `device` between the two events of
// a Timer, after a warm-up launch (module loading is not measured), and waits for it.
// With hide_launch_latency the Timer closes a StreamGate first (timer.hpp).
// Throws DeviceError without the kernels or without CUDA, InvalidInputError for a bad id.
Calibration calibrate(std::uint64_t duration_ns, int device = 0, stream_t stream = 0,
                      bool hide_launch_latency = false);

}  // namespace gpukeeper
