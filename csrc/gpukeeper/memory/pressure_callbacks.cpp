// PressureCallbacks (pressure_callbacks.hpp): a pool's watermark and reclaim callbacks,
// run with no lock held.
#include "gpukeeper/memory/pressure_callbacks.hpp"

#include <algorithm>
#include <string>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::detail {

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

}  // namespace gpukeeper::detail
