// The gate kernel: a one-thread kernel that holds its stream until the host opens it.
// Work queued behind it on the stream waits on the device, not on the host's launches,
// so that once the gate opens the queued events and kernels run back to back (nvbench's
// "blocking kernel"). StreamGate (timing/stream_gate.hpp) is the type to use; this is
// the launch alone.
//
// Plain C++ (no CUDA types), like calibration.hpp: the kernel is PTX in
// timing_kernels.ptx, and builds without CUDA get kernels_stub.cpp (which throws).
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

// What a gate kernel wrote into its `outcome` word when it finished.
enum class GateOutcome : std::uint32_t {
  pending = 0,    // not finished yet (the host writes 0 before the launch)
  opened = 1,     // the host set the open flag before the timeout
  timed_out = 2,  // the timeout passed first: the queued work ran without the gate
};

// Queues the gate kernel on `stream` (of the current device). It spins until
// `*open_flag != 0` or until `timeout_ns` of %globaltimer have passed, then writes its
// GateOutcome to `*outcome`. Both pointers are device views of host-mapped pinned
// memory. Does not synchronize. Throws DeviceError when the launch fails or without the
// kernels.
void launch_gate_kernel(const volatile std::uint32_t* open_flag, volatile std::uint32_t* outcome,
                        std::uint64_t timeout_ns, stream_t stream);

}  // namespace gpukeeper
