// A move-only interval timer on a CUDA stream, with a CPU fallback of the same interface.
//
//   Timer t(/*device=*/0, stream);
//   t.start();  launch work on stream;  t.stop();
//   double ms = t.elapsed_ms();   // waits for the stop event only
//
// On the GPU, start() and stop() record two pooled events (EventPool) on the stream and
// never synchronize; elapsed_ms() waits for the stop event, then reads
// cudaEventElapsedTime. The interval is the device's: it includes any gap on the stream
// between the two records (the launch latency of the first kernel when the stream was
// idle). In CPU mode (device kCpuDevice, a build without CUDA, or a machine without a usable
// device) start/stop read std::chrono::steady_clock and the stream is ignored.
//
// With hide_launch_latency, start() first closes a StreamGate on the stream and stop()
// opens it after recording the stop event: the interval then holds the device's work
// without the launch latency in front of it (see stream_gate.hpp for what that means and
// when the gate times out). Ignored in CPU mode.
//
// start() may be called again to restart; elapsed_ms() may be called any number of times.
// One thread at a time per Timer.
#pragma once

#include <chrono>

#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/timing/event_pool.hpp"
#include "gpukeeper/timing/stream_gate.hpp"

namespace gpukeeper {

// Whether a timer/log for `device` runs on CUDA events (true) or the steady clock (false).
// kCpuDevice (-1) means CPU; with no usable CUDA device every id means CPU. Throws
// InvalidInputError for ids below kCpuDevice and for ids the machine does not have when it has devices.
bool timing_uses_cuda(int device);

class Timer {
 public:
  // Throws DeviceError when hide_launch_latency is asked for on a GPU without the gate
  // kernel, InvalidInputError for a zero gate timeout.
  explicit Timer(int device = 0, stream_t stream = 0, bool hide_launch_latency = false,
                 std::uint64_t gate_timeout_ns = StreamGate::kDefaultTimeoutNs);
  Timer(Timer&& other) noexcept;
  Timer& operator=(Timer&& other) noexcept;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() = default;

  void start();
  void stop();  // InvalidInputError unless started
  // Milliseconds between start() and stop(); InvalidInputError unless stopped after the
  // last start(). On the GPU, blocks until the stop event has completed.
  double elapsed_ms();
  // Whether elapsed_ms() would return without blocking (true in CPU mode once stopped).
  bool ready();

  // Whether the last stopped measurement had its launch latency hidden: a gate was used
  // and opened before its timeout. Blocks like elapsed_ms() (the answer is known once
  // the stop event has passed).
  bool launch_hidden();
  // The last measurement's gate outcome (pending without a gate or before it finished).
  GateOutcome gate_outcome() const noexcept { return gate_.outcome(); }

  bool hides_launch_latency() const noexcept { return hide_; }
  bool is_gpu() const noexcept { return gpu_; }
  int device() const noexcept { return device_; }  // kCpuDevice in CPU mode
  stream_t stream() const noexcept { return stream_; }
  bool valid() const noexcept { return state_ != State::moved; }

 private:
  enum class State { idle, started, stopped, moved };
  void require_valid(const char* what) const;

  bool gpu_ = false;
  bool hide_ = false;
  std::uint64_t gate_timeout_ns_ = StreamGate::kDefaultTimeoutNs;
  int device_ = kCpuDevice;
  stream_t stream_ = 0;
  State state_ = State::idle;
  PooledEvent start_event_;
  PooledEvent stop_event_;
  StreamGate gate_;
  std::chrono::steady_clock::time_point start_time_{};
  std::chrono::steady_clock::time_point stop_time_{};
};

namespace detail {
// Shared by Timer and EventLog (CUDA builds; no-ops that throw otherwise).
void record_event(void* event, int device, stream_t stream);
void synchronize_event(void* event, int device);
bool event_done(void* event, int device);
double event_elapsed_ms(void* start, void* stop);
}  // namespace detail

// Waits for all work on CUDA device `device` (cudaDeviceSynchronize). InvalidInputError
// for an id the machine does not have; DeviceError without CUDA.
void synchronize_device(int device);

}  // namespace gpukeeper
