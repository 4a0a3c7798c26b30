// A CachingPool's limits and pressure: the reserved-bytes limit, memory_pressure(), and
// the callbacks it forwards to detail::PressureCallbacks (pressure_callbacks.hpp):
// watermark callbacks (run when pressure crosses a level) and reclaim callbacks (run when
// the upstream refuses memory), outside the pool's lock.
#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::human_bytes;

// ---------------------------------------------------------------- the limit

void CachingPool::set_limit(std::size_t bytes) {
  {
    std::lock_guard<SpinMutex> lock(mutex_);
    std::size_t allocated = counters_.allocated();
    if (bytes != 0 && bytes < allocated) {
      throw InvalidInputError("limit of " + std::to_string(bytes) + " bytes (" +
                              human_bytes(bytes) + ") is below the " + std::to_string(allocated) +
                              " bytes (" + human_bytes(allocated) +
                              ") now allocated; return buffers first");
    }
    limit_.store(bytes, std::memory_order_relaxed);
    if (bytes != 0) release_free_segments(bytes);
  }
  notify_watermarks();
}

double CachingPool::memory_pressure() const {
  const std::size_t limit = limit_.load(std::memory_order_relaxed);
  if (limit != 0) {
    double p = static_cast<double>(counters_.reserved()) / limit;
    return std::min(1.0, p);
  }
  MemoryInfo info = upstream_->memory_info();
  if (info.total == 0) return 0.0;
  double used = static_cast<double>(info.total - std::min(info.free, info.total));
  return std::min(1.0, used / static_cast<double>(info.total));
}

// ---------------------------------------------------------------- callbacks

int CachingPool::add_watermark(double level, WatermarkCallback callback) {
  return callbacks_.add_watermark(level, std::move(callback));
}

bool CachingPool::remove_watermark(int id) { return callbacks_.remove_watermark(id); }

int CachingPool::add_reclaim_callback(ReclaimCallback callback) {
  return callbacks_.add_reclaimer(std::move(callback));
}

bool CachingPool::remove_reclaim_callback(int id) { return callbacks_.remove_reclaimer(id); }

// Called without mutex_ held, so that the callbacks may use the pool.
void CachingPool::notify_watermarks() {
  if (!callbacks_.has_watermarks()) return;
  double pressure = 0.0;
  try {
    pressure = memory_pressure();
  } catch (const std::exception&) {
    callbacks_.count_error();
    return;
  }
  callbacks_.notify(pressure);
}

}  // namespace gpukeeper
