// A lock for critical sections of tens of nanoseconds (the pool's hot path).
//
// Uncontended it costs one atomic exchange to lock and one release store to unlock,
// about half of a pthread mutex. Under contention it spins briefly, then yields, so a
// holder that was preempted (more threads than cores) is not starved by its waiters.
// Satisfies Lockable: use it with std::lock_guard / std::unique_lock.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace gpukeeper {

class SpinMutex {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lock_slow();
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  void lock_slow() noexcept {
    for (int spins = 0;; ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins++ < 64) {
          pause();
        } else {
          std::this_thread::yield();
        }
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace gpukeeper
