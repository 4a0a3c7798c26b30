#include "gpukeeper/timing/timer.hpp"

#include <string>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

namespace detail {

#ifdef GPUKEEPER_WITH_CUDA
void record_event(void* event, int device, stream_t stream) {
  DeviceGuard guard(device);  // stream 0 means the current device's default stream
  GK_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                reinterpret_cast<cudaStream_t>(stream)));
}

void synchronize_event(void* event, int device) {
  DeviceGuard guard(device);
  GK_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

bool event_done(void* event, int device) {
  DeviceGuard guard(device);
  cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    clear_cuda_error();
    return false;
  }
  check_cuda(status, "cudaEventQuery");
  return false;
}

double event_elapsed_ms(void* start, void* stop) {
  float ms = 0.0f;
  GK_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                     static_cast<cudaEvent_t>(stop)));
  return static_cast<double>(ms);
}
#else
[[noreturn]] static void no_cuda(const char* call) {
  throw DeviceError(call, 0, "unavailable", "gpukeeper was built without CUDA");
}
void record_event(void*, int, stream_t) { no_cuda("cudaEventRecord"); }
void synchronize_event(void*, int) { no_cuda("cudaEventSynchronize"); }
bool event_done(void*, int) { no_cuda("cudaEventQuery"); }
double event_elapsed_ms(void*, void*) { no_cuda("cudaEventElapsedTime"); }
#endif

}  // namespace detail

void synchronize_device(int device) {
  if (!timing_uses_cuda(device) || device < 0) {
    throw DeviceError("cudaDeviceSynchronize", 0, "unavailable",
                      "no usable CUDA device " + std::to_string(device));
  }
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device);
  GK_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

bool timing_uses_cuda(int device) {
  if (device < kCpuDevice) {
    throw InvalidInputError("device must be " + std::to_string(kCpuDevice) +
                            " (CPU) or a CUDA device id, got " + std::to_string(device));
  }
  if (device == kCpuDevice) return false;
  int count = cuda_device_count();
  if (count == 0) return false;
  if (device >= count) {
    throw InvalidInputError("no CUDA device " + std::to_string(device) + " (this machine has " +
                            std::to_string(count) + ")");
  }
  return true;
}

Timer::Timer(int device, stream_t stream, bool hide_launch_latency, std::uint64_t gate_timeout_ns)
    : gpu_(timing_uses_cuda(device)), gate_timeout_ns_(gate_timeout_ns), stream_(stream) {
  if (gate_timeout_ns == 0) throw InvalidInputError("Timer gate timeout must be > 0 ns");
  if (gpu_) {
    if (hide_launch_latency && !stream_gates_available()) {
      throw DeviceError("Timer", 0, "unavailable",
                        "hide_launch_latency needs the gate kernel, and gpukeeper was built "
                        "without CUDA");
    }
    hide_ = hide_launch_latency;
    device_ = device;
    EventPool& pool = EventPool::for_device(device);
    start_event_ = PooledEvent(pool);
    stop_event_ = PooledEvent(pool);
  }
}

Timer::Timer(Timer&& other) noexcept
    : gpu_(other.gpu_),
      hide_(other.hide_),
      gate_timeout_ns_(other.gate_timeout_ns_),
      device_(other.device_),
      stream_(other.stream_),
      state_(other.state_),
      start_event_(std::move(other.start_event_)),
      stop_event_(std::move(other.stop_event_)),
      gate_(std::move(other.gate_)),
      start_time_(other.start_time_),
      stop_time_(other.stop_time_) {
  other.state_ = State::moved;
}

Timer& Timer::operator=(Timer&& other) noexcept {
  if (this != &other) {
    gpu_ = other.gpu_;
    hide_ = other.hide_;
    gate_timeout_ns_ = other.gate_timeout_ns_;
    device_ = other.device_;
    stream_ = other.stream_;
    state_ = other.state_;
    start_event_ = std::move(other.start_event_);
    stop_event_ = std::move(other.stop_event_);
    gate_ = std::move(other.gate_);
    start_time_ = other.start_time_;
    stop_time_ = other.stop_time_;
    other.state_ = State::moved;
  }
  return *this;
}

void Timer::require_valid(const char* what) const {
  if (state_ == State::moved) {
    throw InvalidInputError(std::string("Timer.") + what + "() on a moved-from timer");
  }
}

void Timer::start() {
  require_valid("start");
  if (gpu_) {
    if (hide_) {
      gate_ = StreamGate(device_, stream_, gate_timeout_ns_);
    } else {
      gate_.reset();
    }
    try {
      detail::record_event(start_event_.get(), device_, stream_);
    } catch (...) {
      gate_.reset();  // never leave the stream held
      throw;
    }
  } else {
    start_time_ = std::chrono::steady_clock::now();
  }
  state_ = State::started;
}

void Timer::stop() {
  require_valid("stop");
  if (gpu_) {
    if (state_ == State::idle) throw InvalidInputError("Timer.stop() before start()");
    try {
      detail::record_event(stop_event_.get(), device_, stream_);
    } catch (...) {
      gate_.open();
      throw;
    }
    gate_.open();
  } else {
    auto now = std::chrono::steady_clock::now();
    if (state_ == State::idle) throw InvalidInputError("Timer.stop() before start()");
    stop_time_ = now;
  }
  state_ = State::stopped;
}

double Timer::elapsed_ms() {
  require_valid("elapsed_ms");
  if (state_ != State::stopped) {
    throw InvalidInputError(state_ == State::idle ? "Timer.elapsed_ms() before start()"
                                                  : "Timer.elapsed_ms() before stop()");
  }
  if (gpu_) {
    detail::synchronize_event(stop_event_.get(), device_);
    return detail::event_elapsed_ms(start_event_.get(), stop_event_.get());
  }
  return std::chrono::duration<double, std::milli>(stop_time_ - start_time_).count();
}

bool Timer::launch_hidden() {
  if (!gpu_ || !hide_ || state_ != State::stopped) return false;
  detail::synchronize_event(stop_event_.get(), device_);
  return gate_.outcome() == GateOutcome::opened;
}

bool Timer::ready() {
  require_valid("ready");
  if (state_ != State::stopped) return false;
  if (gpu_) return detail::event_done(stop_event_.get(), device_);
  return true;
}

}  // namespace gpukeeper
