#include "gpukeeper/timing/event_log.hpp"

#include <utility>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/timing/timer.hpp"

namespace gpukeeper {

EventLog::EventLog(int device, stream_t stream) : gpu_(timing_uses_cuda(device)), stream_(stream) {
  if (gpu_) {
    device_ = device;
    pool_ = &EventPool::for_device(device);
  }
}

std::size_t EventLog::record() {
  Point p;
  if (gpu_) {
    p.event = PooledEvent(*pool_);
    detail::record_event(p.event.get(), device_, stream_);
  } else {
    p.time = std::chrono::steady_clock::now();
  }
  points_.push_back(std::move(p));
  return points_.size() - 1;
}

void EventLog::mark(std::string label) {
  std::size_t now = record();
  if (last_mark_ != kNoMark) intervals_.push_back({std::move(label), last_mark_, now});
  last_mark_ = now;
}

void EventLog::begin(std::string label) {
  open_.reserve(open_.size() + 1);  // so that recording cannot leave a point unlisted
  std::size_t now = record();
  open_.emplace_back(std::move(label), now);
}

void EventLog::end() {
  if (open_.empty()) throw InvalidInputError("EventLog.end() without an open begin()");
  intervals_.reserve(intervals_.size() + 1);
  std::size_t now = record();
  intervals_.push_back({std::move(open_.back().first), open_.back().second, now});
  open_.pop_back();
}

bool EventLog::ready() {
  if (!gpu_ || points_.empty()) return true;
  return detail::event_done(points_.back().event.get(), device_);
}

std::vector<TimedInterval> EventLog::resolve() {
  if (!open_.empty()) {
    throw InvalidInputError("EventLog.resolve() while interval '" + open_.back().first +
                            "' is still open (call end() first)");
  }
  std::vector<TimedInterval> out;
  out.reserve(intervals_.size());
  if (gpu_ && !points_.empty()) {
    // Events on one stream complete in order: the last one done means all are.
    detail::synchronize_event(points_.back().event.get(), device_);
  }
  for (const Pending& i : intervals_) {
    const Point& a = points_[i.from];
    const Point& b = points_[i.to];
    double ms = gpu_ ? detail::event_elapsed_ms(a.event.get(), b.event.get())
                     : std::chrono::duration<double, std::milli>(b.time - a.time).count();
    out.push_back({i.label, ms});
  }
  // Keep the last mark as the origin of the next lap; hand every other event back.
  Point origin;
  bool keep = last_mark_ != kNoMark;
  if (keep) origin = std::move(points_[last_mark_]);
  points_.clear();
  intervals_.clear();
  last_mark_ = kNoMark;
  if (keep) {
    points_.push_back(std::move(origin));
    last_mark_ = 0;
  }
  return out;
}

void EventLog::clear() noexcept {
  points_.clear();
  intervals_.clear();
  open_.clear();
  last_mark_ = kNoMark;
}

}  // namespace gpukeeper
