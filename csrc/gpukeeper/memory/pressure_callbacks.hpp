// PressureCallbacks: a CachingPool's watermark callbacks (run when memory pressure rises
// to a level) and reclaim callbacks (run when the upstream refuses memory even after the
// pool released its cache), as RMM's failure-callback adaptor holds its callback.
//
// A type of its own because it has its own lock and its own rule: the callbacks may use
// the pool, so they run with neither this type's lock nor the pool's held (the lists are
// copied out first), and a callback that throws is counted (errors()), never propagated
// into an allocation. It never takes the pool's lock and knows nothing of the pool: the
// pool measures the pressure and passes it in. The out-of-line members are in
// pressure_callbacks.cpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

namespace gpukeeper::detail {

class PressureCallbacks {
 public:
  // Returns the bytes it released (a guess is fine); `needed` is the failed request.
  using ReclaimCallback = std::function<std::size_t(std::size_t needed)>;
  // Receives the pressure that crossed the watermark's level.
  using WatermarkCallback = std::function<void(double pressure)>;

  // `callback` runs when pressure rises to `level` in (0, 1]; it re-arms once pressure
  // falls below. Returns an id for remove_watermark. InvalidInputError for a level out of
  // range or an empty callback.
  int add_watermark(double level, WatermarkCallback callback);
  bool remove_watermark(int id);
  int add_reclaimer(ReclaimCallback callback);
  bool remove_reclaimer(int id);

  // Whether any watermark is set: the pool measures pressure only then.
  bool has_watermarks() const noexcept { return has_watermarks_.load(std::memory_order_relaxed); }
  // Runs the armed watermarks whose level `pressure` reached, and re-arms those it fell
  // below. Call with no lock held.
  void notify(double pressure);
  // Runs every reclaim callback; returns the sum of the bytes they say they released.
  // Call with no lock held.
  std::size_t reclaim(std::size_t needed);

  // Callbacks that threw, and failures to measure the pressure (count_error()).
  std::size_t errors() const noexcept { return errors_.load(std::memory_order_relaxed); }
  void count_error() noexcept { errors_.fetch_add(1, std::memory_order_relaxed); }

 private:
  struct Watermark {
    int id;
    double level;
    WatermarkCallback callback;
    bool armed;
  };
  struct Reclaimer {
    int id;
    ReclaimCallback callback;
  };

  std::mutex mutex_;  // guards the lists and the next id; never held while a callback runs
  std::vector<Watermark> watermarks_;
  std::vector<Reclaimer> reclaimers_;
  int next_id_ = 1;
  std::atomic<bool> has_watermarks_{false};
  std::atomic<std::size_t> errors_{0};
};

}  // namespace gpukeeper::detail
