// The device-side floor of a gated measurement: what an event pair behind a StreamGate
// reads around an empty kernel.
//
// A gate takes the host's launch latency out of an interval, but the device still spends
// time on the bracket itself: the start event, dispatching the first kernel, draining the
// last one before the stop event can be written. On an H200 that is ~2.8 us, the same for
// a 10 us and a 1 ms kernel. Subtracting this floor leaves the time the work itself kept
// the device busy, which is what a profiler reports as a kernel's duration.
//
// Measured once per device on a private non-blocking stream (median of 21 gated brackets
// around the calibration kernel with a zero duration) and cached; refresh re-measures.
// That figure drifts by up to 0.3 us over seconds and differs between streams, so the
// Python timer uses it only as a prior: it takes the floor in place, behind each
// measurement's own gate (StreamGate::queue_floor_kernel).
#pragma once

namespace gpukeeper {

// Milliseconds; throws DeviceError without CUDA, the kernels or a usable device, and
// InvalidInputError for a bad id.
double launch_floor_ms(int device, bool refresh = false);

}  // namespace gpukeeper
