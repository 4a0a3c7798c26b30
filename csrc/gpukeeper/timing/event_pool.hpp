// Reusable CUDA events, one pool per device. A measurement takes its events from the
// pool and gives them back when done, so that once warm no event is ever created on the
// measurement path (cudaEventCreate costs microseconds and may synchronize).
//
// The events are created with default flags: they record timestamps, so that
// cudaEventElapsedTime works on them. Re-recording an event that was handed back while
// its previous record is still pending is allowed by CUDA (the newest record counts).
//
// Thread-safe. The pools live until the process ends (never destroyed, so no CUDA call
// runs during static destruction, after the runtime may have gone).
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

namespace gpukeeper {

class EventPool {
 public:
  // The pool of CUDA device `device`, made on first use. Throws InvalidInputError for a
  // device id this machine does not have, DeviceError in a build without CUDA.
  static EventPool& for_device(int device);

  // A cudaEvent_t (as void*) with timing enabled: an idle one, or a new one when none is
  // idle. Throws DeviceError when the event cannot be created.
  void* acquire();
  // Hands `event` (from acquire) back for reuse. nullptr is ignored.
  void release(void* event) noexcept;
  // Creates events until `count` are idle (warm-up before a measurement loop).
  void reserve(std::size_t count);

  int device() const noexcept { return device_; }
  // Events this pool has ever created; stops growing once the pool is warm.
  std::size_t created() const noexcept { return created_.load(std::memory_order_relaxed); }
  // Events idle in the pool now.
  std::size_t idle() const;

  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

 private:
  explicit EventPool(int device) : device_(device) {}
  void* create();

  int device_;
  mutable std::mutex mutex_;
  std::vector<void*> idle_;
  std::atomic<std::size_t> created_{0};
};

// One event taken from a pool, handed back when this goes away. Move-only.
class PooledEvent {
 public:
  PooledEvent() noexcept = default;
  explicit PooledEvent(EventPool& pool) : pool_(&pool), event_(pool.acquire()) {}
  ~PooledEvent() { reset(); }
  PooledEvent(PooledEvent&& other) noexcept : pool_(other.pool_), event_(other.event_) {
    other.pool_ = nullptr;
    other.event_ = nullptr;
  }
  PooledEvent& operator=(PooledEvent&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      event_ = other.event_;
      other.pool_ = nullptr;
      other.event_ = nullptr;
    }
    return *this;
  }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;

  void* get() const noexcept { return event_; }  // cudaEvent_t
  explicit operator bool() const noexcept { return event_ != nullptr; }
  void reset() noexcept {
    if (pool_ != nullptr) pool_->release(event_);
    pool_ = nullptr;
    event_ = nullptr;
  }

 private:
  EventPool* pool_ = nullptr;
  void* event_ = nullptr;
};

}  // namespace gpukeeper
