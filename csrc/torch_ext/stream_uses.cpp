// StreamUses: record_stream's bookkeeping and the deferred frees (see stream_uses.hpp).
#include "torch_ext/stream_uses.hpp"

#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace gpukeeper::torch_ext {

void StreamUses::record(void* ptr, cudaStream_t own_stream, cudaStream_t stream) {
  if (stream == own_stream) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto& streams = uses_[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  active_.store(uses_.size() + deferred_.size(), std::memory_order_release);
}

bool StreamUses::record_events(Deferred& d) {
  for (auto it = d.streams.begin(); it != d.streams.end();) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(*it, &status));
    if (status != cudaStreamCaptureStatusNone) {
      ++it;  // no event can be recorded into a capture for later: wait for its end
      continue;
    }
    cudaEvent_t event = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(event, *it));
    d.events.push_back(event);
    it = d.streams.erase(it);
  }
  return d.streams.empty();
}

bool StreamUses::defer_free(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = uses_.find(ptr);
  if (it == uses_.end()) return false;
  Deferred d{ptr, std::move(it->second), {}};
  uses_.erase(it);
  record_events(d);
  deferred_.push_back(std::move(d));
  active_.store(uses_.size() + deferred_.size(), std::memory_order_release);
  return true;
}

void StreamUses::poll(const Release& release, bool wait) {
  std::vector<void*> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      bool done = record_events(*it);  // false while one of its streams still captures
      for (cudaEvent_t e : it->events) {
        if (!done) break;
        if (wait) {
          C10_CUDA_CHECK(cudaEventSynchronize(e));
        } else {
          const cudaError_t status = cudaEventQuery(e);
          if (status == cudaErrorNotReady) {
            (void)cudaGetLastError();
            done = false;
          } else {
            C10_CUDA_CHECK(status);
          }
        }
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : it->events) C10_CUDA_CHECK(cudaEventDestroy(e));
      ready.push_back(it->ptr);
      it = deferred_.erase(it);
    }
    active_.store(uses_.size() + deferred_.size(), std::memory_order_release);
  }
  for (void* ptr : ready) release(ptr);
}

}  // namespace gpukeeper::torch_ext
