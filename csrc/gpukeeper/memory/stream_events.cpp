#include "gpukeeper/memory/stream_events.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper::detail {

#ifdef GPUKEEPER_WITH_CUDA

namespace {
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
cudaStream_t as_stream(stream_t s) { return reinterpret_cast<cudaStream_t>(s); }
}  // namespace

StreamEvents::~StreamEvents() {
  for (auto& entry : events_) (void)cudaEventDestroy(as_event(entry.second));
}

void* StreamEvents::event_for(stream_t stream) {
  for (auto& entry : events_) {
    if (entry.first == stream) return entry.second;
  }
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  GK_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  events_.emplace_back(stream, event);
  return event;
}

bool StreamEvents::done(stream_t stream) {
  if (!enabled_) return true;
  DeviceGuard guard(device_);
  // A stream capturing a CUDA graph runs nothing: an event recorded on it would become a
  // node of the graph, and querying it (or the device wait below) would break the
  // capture. Its blocks stay its own until the capture ends.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &capture) != cudaSuccess) {
    clear_cuda_error();
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;
  cudaEvent_t event = as_event(event_for(stream));
  if (cudaEventRecord(event, as_stream(stream)) != cudaSuccess) {
    clear_cuda_error();
    synchronize_device();
    return true;
  }
  cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return true;
  if (status != cudaErrorNotReady) check_cuda(status, "cudaEventQuery");
  return false;
}

void StreamEvents::synchronize_device() {
  if (!enabled_) return;
  DeviceGuard guard(device_);
  GK_CUDA_CHECK(cudaDeviceSynchronize());
}

#else

StreamEvents::~StreamEvents() = default;
void* StreamEvents::event_for(stream_t) { return nullptr; }
bool StreamEvents::done(stream_t) { return true; }
void StreamEvents::synchronize_device() {}

#endif

}  // namespace gpukeeper::detail
