// A CachingPool's limits and pressure: the reserved-bytes limit, memory_pressure(), and
// the callbacks it forwards to detail::PressureCallbacks (pressure_callbacks.hpp), whose
// code is here too: watermark callbacks (run when pressure crosses a level) and reclaim
// callbacks (run when the upstream refuses memory), outside the pool's lock.
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

// ---------------------------------------------------------------- PressureCallbacks

namespace detail {

int PressureCallbacks::add_watermark(double level, WatermarkCallback callback) {
  if (!(level > 0.0 && level <= 1.0)) {
    throw InvalidInputError("watermark level must be in (0, 1], got " + std::to_string(level));
  }
  if (!callback) throw InvalidInputError("watermark callback is empty");
  std::lock_guard<std::mutex> lock(mutex_);
  int id = next_id_++;
  watermarks_.push_back({id, level, std::move(callback), true});
  has_watermarks_.store(true, std::memory_order_relaxed);
  return id;
}

bool PressureCallbacks::remove_watermark(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(watermarks_.begin(), watermarks_.end(),
                         [id](const Watermark& w) { return w.id == id; });
  if (it == watermarks_.end()) return false;
  watermarks_.erase(it);
  has_watermarks_.store(!watermarks_.empty(), std::memory_order_relaxed);
  return true;
}

int PressureCallbacks::add_reclaimer(ReclaimCallback callback) {
  if (!callback) throw InvalidInputError("reclaim callback is empty");
  std::lock_guard<std::mutex> lock(mutex_);
  int id = next_id_++;
  reclaimers_.push_back({id, std::move(callback)});
  return id;
}

bool PressureCallbacks::remove_reclaimer(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(reclaimers_.begin(), reclaimers_.end(),
                         [id](const Reclaimer& r) { return r.id == id; });
  if (it == reclaimers_.end()) return false;
  reclaimers_.erase(it);
  return true;
}

void PressureCallbacks::notify(double pressure) {
  std::vector<WatermarkCallback> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Watermark& w : watermarks_) {
      if (w.armed && pressure >= w.level) {
        w.armed = false;
        due.push_back(w.callback);
      } else if (!w.armed && pressure < w.level) {
        w.armed = true;
      }
    }
  }
  for (auto& cb : due) {
    try {
      cb(pressure);
    } catch (...) {
      count_error();
    }
  }
}

std::size_t PressureCallbacks::reclaim(std::size_t needed) {
  std::vector<ReclaimCallback> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& r : reclaimers_) all.push_back(r.callback);
  }
  std::size_t released = 0;
  for (auto& cb : all) {
    try {
      released += cb(needed);
    } catch (...) {
      count_error();
    }
  }
  return released;
}

}  // namespace detail
}  // namespace gpukeeper
