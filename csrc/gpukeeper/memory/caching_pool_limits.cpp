// A CachingPool's limits and pressure: the reserved-bytes limit and memory_pressure(),
// over detail::PoolLimit (pool_limit.hpp), and the callbacks it forwards to
// detail::PressureCallbacks (pressure_callbacks.hpp): watermark callbacks (run when
// pressure crosses a level) and reclaim callbacks (run when the upstream refuses memory),
// outside the pool's lock.
#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

// ---------------------------------------------------------------- the limit

void CachingPool::set_limit(std::size_t bytes) {
  {
    std::lock_guard<SpinMutex> lock(mutex_);
    limit_.set(bytes, counters_.allocated());
    if (bytes != 0) release_free_segments(bytes);
  }
  notify_watermarks();
}

double CachingPool::memory_pressure() const {
  return limit_.pressure(counters_.reserved(), *upstream_);
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
