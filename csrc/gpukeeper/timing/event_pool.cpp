#include "gpukeeper/timing/event_pool.hpp"

#include <memory>
#include <string>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

EventPool& EventPool::for_device(int device) {
  // Wrong in every build: an input error before whether CUDA is there.
  if (device < 0) {
    throw InvalidInputError("device " + std::to_string(device) +
                            " is not a CUDA device id (ids start at 0)");
  }
#ifdef GPUKEEPER_WITH_CUDA
  static std::mutex mutex;
  static std::vector<EventPool*> pools;  // by device id; never freed (see the header)
  int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw InvalidInputError("no CUDA device " + std::to_string(device) + " (this machine has " +
                            std::to_string(count) + ")");
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(device + 1, nullptr);
  if (pools[device] == nullptr) pools[device] = new EventPool(device);
  return *pools[device];
#else
  (void)device;
  throw DeviceError("EventPool", 0, "unavailable",
                    "gpukeeper was built without CUDA: there are no CUDA events");
#endif
}

void* EventPool::create() {
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  GK_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));
  created_.fetch_add(1, std::memory_order_relaxed);
  return event;
#else
  return nullptr;
#endif
}

void* EventPool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      void* event = idle_.back();
      idle_.pop_back();
      return event;
    }
  }
  return create();  // outside the lock: creating may take a while
}

void EventPool::release(void* event) noexcept {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    idle_.push_back(event);
  } catch (...) {
    // Out of memory for the list: the event leaks rather than be destroyed while a
    // record on it may still be pending.
  }
}

void EventPool::reserve(std::size_t count) {
  std::vector<void*> made;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() >= count) return;
    count -= idle_.size();
  }
  made.reserve(count);
  try {
    for (std::size_t i = 0; i < count; ++i) made.push_back(create());
  } catch (...) {
    for (void* e : made) release(e);
    throw;
  }
  for (void* e : made) release(e);
}

std::size_t EventPool::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_.size();
}

}  // namespace gpukeeper
