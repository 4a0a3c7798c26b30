// A gate on a CUDA stream, to take the launch latency out of a measurement.
//
//   StreamGate gate(device, stream);   // queues the gate kernel: the stream now waits
//   record start event; launch work; record stop event   // all queue up behind the gate
//   gate.open();                        // the device runs them back to back
//
// Why: on an idle stream a start event is passed as soon as it is recorded, while the
// kernel after it reaches the device only a launch latency later (a few microseconds),
// so an event pair around a 10 us kernel reads ~14 us. Behind a closed gate the host's
// launches only fill the queue; the interval then holds the device's work alone. This is
// nvbench's blocking kernel; the caveats are the same:
//   - work between close and open that makes the *host* wait for the stream (a
//     synchronize, a copy from pageable memory, a full launch queue) cannot finish until
//     the gate opens. The gate therefore opens by itself after `timeout_ns` and reports
//     GateOutcome::timed_out; the measurement then includes what the host waited for.
//   - it measures the device time *as if launches were free*: for launch-bound work that
//     is not the time the work takes in a loop. That is why CUDATimer keeps gates off by
//     default and benchmark_function reports host time next to GPU time.
//
// Each gate owns a slot (an open flag and an outcome word) in host-mapped pinned memory,
// from a per-device slot pool; a slot is reused only after its kernel has finished, which
// is read from the outcome word without any synchronization. The pinned memory goes back
// at process exit (release_idle_gate_slots). Move-only; one thread at a time per gate;
// the pools are thread-safe.
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/kernels/gate_kernel.hpp"

namespace gpukeeper {

// Whether gates can be closed here: a CUDA build with the kernels and a usable device.
bool stream_gates_available() noexcept;

// Throws (naming `what`) unless gates can be closed on `device`: InvalidInputError for an
// id the machine does not have, DeviceError without CUDA, a device or the kernels.
void require_stream_gates(int device, const char* what);

class StreamGate {
 public:
  // Long enough for any launch sequence a caller would time, short enough that a region
  // that synchronizes inside is a visible stall rather than a hang.
  static constexpr std::uint64_t kDefaultTimeoutNs = 1'000'000'000ull;  // 1 s

  StreamGate() noexcept = default;  // holds nothing; open() and outcome() are no-ops
  // Closes `stream` of CUDA device `device`. Throws InvalidInputError for a bad device, a
  // zero timeout or a stream that is capturing a CUDA graph (a gate inside a graph would
  // never be opened by the host); DeviceError without CUDA or without the kernels.
  StreamGate(int device, stream_t stream, std::uint64_t timeout_ns = kDefaultTimeoutNs);
  ~StreamGate() { reset(); }
  StreamGate(StreamGate&& other) noexcept;
  StreamGate& operator=(StreamGate&& other) noexcept;
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Queues the zero-length calibration kernel behind the closed gate. With one mark
  // before it and the measurement's start mark after it, that event pair reads the
  // device's own cost of a bracket (the launch floor) on this stream, behind this gate,
  // just before the measured work: the floor taken where and when the work is measured,
  // so that the floor's drift over seconds and its difference between streams leave the
  // reading alone. InvalidInputError once the gate is open or empty (the kernel would
  // not be behind it); DeviceError when the launch fails.
  void queue_floor_kernel();
  // Lets the queued work through. Idempotent; never blocks.
  void open() noexcept;
  // pending until the gate kernel has finished (it finishes before anything queued after
  // it starts), then opened or timed_out. pending for an empty gate.
  GateOutcome outcome() const noexcept;
  // Opens (when still closed) and gives the slot back; the gate becomes empty.
  void reset() noexcept;

  bool holds_slot() const noexcept { return slot_ != nullptr; }
  bool is_open() const noexcept { return slot_ == nullptr || opened_; }
  int device() const noexcept { return device_; }
  stream_t stream() const noexcept { return stream_; }
  std::uint64_t timeout_ns() const noexcept { return timeout_ns_; }

  struct Slot;  // defined in stream_gate.cpp

 private:
  Slot* slot_ = nullptr;
  int device_ = kCpuDevice;
  stream_t stream_ = 0;
  std::uint64_t timeout_ns_ = 0;
  bool opened_ = false;
};

// Slots of a device's gate pool: ever made, and idle now (for tests and statistics).
struct GateSlotStats {
  std::size_t created = 0;
  std::size_t idle = 0;
  std::size_t retiring = 0;  // handed back, their kernel not yet seen finished
};
GateSlotStats gate_slot_stats(int device);

// Frees the pinned memory of `device`'s slot chunks whose slots are all idle (no gate holds
// one, every kernel that used one has finished); returns the slots freed. The same runs
// for every device at process exit, so a leak check finds no gate memory then; chunks
// still in use are kept. Throws like gate_slot_stats. Gates made afterwards allocate anew.
std::size_t release_idle_gate_slots(int device);

}  // namespace gpukeeper
