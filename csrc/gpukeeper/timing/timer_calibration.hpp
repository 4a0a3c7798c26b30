// Checks what a Timer reads against the truth: one spin kernel (kernels/calibration.hpp)
// whose duration the GPU's own nanosecond clock reports, timed by a Timer around it. Used
// by the tests and by `gpukeeper check`.
//
// Host code; in a build without CUDA there are no kernels, and calibrate() throws.
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

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
