// Many intervals on one stream, recorded without any host synchronization and resolved
// later: for per-step timing of long loops (MD trajectories), where a sync per step
// would change what is measured.
//
//   EventLog log(/*device=*/0, stream);
//   log.mark("origin");                      // laps: each mark ends the interval since
//   step(); log.mark("step 1");              // the previous mark, named by the new one
//   log.begin("forces"); forces(); log.end(); // explicit intervals, nestable
//   for (auto& i : log.resolve()) ...        // {label, gpu_ms}, in the order they ended
//
// Each mark/begin/end records one pooled event (EventPool); none is created once the pool
// is warm, and resolve() hands them back. resolve() waits for the last event recorded,
// then reads the elapsed times; the last mark stays as the origin of the next lap, so a
// loop can resolve every N steps without losing a step. In CPU mode (see Timer) the
// points are steady-clock readings. One thread at a time per log.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/timing/event_pool.hpp"

namespace gpukeeper {

struct TimedInterval {
  std::string label;
  double gpu_ms = 0.0;  // device time on the GPU; steady-clock time in CPU mode
};

class EventLog {
 public:
  explicit EventLog(int device = 0, stream_t stream = 0);
  EventLog(EventLog&&) noexcept = default;
  EventLog& operator=(EventLog&&) noexcept = default;
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  ~EventLog() = default;

  // Ends the lap since the previous mark (an interval named `label`) and starts the next
  // one. The first mark (and the first after clear()) only sets the origin.
  void mark(std::string label);
  // Opens an interval named `label`; end() closes the innermost open one.
  void begin(std::string label);
  void end();  // InvalidInputError when none is open

  // The intervals completed since the last resolve(), in the order they ended, after
  // waiting for the last recorded event. InvalidInputError while a begin() is still open
  // (nothing is lost: call end() and resolve again). Hands the events back to the pool.
  std::vector<TimedInterval> resolve();
  // Whether resolve() would return without blocking.
  bool ready();
  // Drops everything recorded, the mark origin included.
  void clear() noexcept;

  std::size_t pending() const noexcept { return intervals_.size(); }  // completed, unresolved
  std::size_t open() const noexcept { return open_.size(); }
  bool is_gpu() const noexcept { return gpu_; }
  int device() const noexcept { return device_; }
  stream_t stream() const noexcept { return stream_; }

 private:
  struct Point {
    PooledEvent event;
    std::chrono::steady_clock::time_point time;
  };
  struct Pending {
    std::string label;
    std::size_t from;  // indices into points_
    std::size_t to;
  };
  std::size_t record();  // a new point; returns its index

  bool gpu_ = false;
  int device_ = kCpuDevice;
  stream_t stream_ = 0;
  EventPool* pool_ = nullptr;
  std::vector<Point> points_;
  std::vector<Pending> intervals_;
  std::vector<std::pair<std::string, std::size_t>> open_;
  static constexpr std::size_t kNoMark = static_cast<std::size_t>(-1);
  std::size_t last_mark_ = kNoMark;
};

}  // namespace gpukeeper
