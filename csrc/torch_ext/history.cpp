// MemoryHistory: the trace ring and the stacks of live blocks (see history.hpp).
#include "torch_ext/history.hpp"

#include <c10/util/ApproximateClock.h>

#include <algorithm>
#include <utility>

namespace gpukeeper::torch_ext {

// A trace entry's stream is passed as cudaStream_t: the type 2.9 and 2.10 take, which
// converts to the void* later releases take.

namespace {

// PyTorch's names for the trace actions (as in its snapshots and skip_actions).
constexpr std::pair<const char*, TraceAction> kActionNames[] = {
    {"alloc", TraceAction::ALLOC},
    {"free_requested", TraceAction::FREE_REQUESTED},
    {"free_completed", TraceAction::FREE_COMPLETED},
    {"segment_alloc", TraceAction::SEGMENT_ALLOC},
    {"segment_free", TraceAction::SEGMENT_FREE},
    {"segment_map", TraceAction::SEGMENT_MAP},
    {"segment_unmap", TraceAction::SEGMENT_UNMAP},
    {"snapshot", TraceAction::SNAPSHOT},
    {"oom", TraceAction::OOM},
};

}  // namespace

void MemoryHistory::configure(bool enabled, cca::CreateContextFn recorder, std::size_t max_entries,
                              cca::RecordContext when, bool clear,
                              const std::vector<std::string>& skip_actions) {
  std::uint32_t mask = 0;
  for (const std::string& name : skip_actions) {
    bool known = false;
    for (const auto& [text, action] : kActionNames) {
      if (name == text) {
        mask |= 1u << static_cast<unsigned>(action);
        known = true;
      }
    }
    TORCH_CHECK(known, "gpukeeper: unknown trace action to skip: '", name,
                "' (known: alloc, free_requested, free_completed, segment_alloc, segment_free, "
                "segment_map, segment_unmap, snapshot, oom)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : cca::RecordContext::NEVER;
  skip_mask_ = mask;
  if (clear || !enabled) {
    ring_.clear();
    next_ = 0;
  }
  if (!enabled) live_.clear();
  if (max_entries != max_entries_) {
    // A new capacity keeps the newest entries, oldest first.
    std::vector<TraceEntry> kept;
    const std::size_t n = ring_.size();
    for (std::size_t i = 0; i < n; ++i) kept.push_back(std::move(ring_[(next_ + i) % n]));
    if (kept.size() > max_entries) kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(max_entries));
    ring_ = std::move(kept);
    next_ = max_entries == 0 ? 0 : ring_.size() % max_entries;
    max_entries_ = max_entries;
  }
  enabled_.store(enabled, std::memory_order_relaxed);
}

void MemoryHistory::append(TraceEntry entry) {
  if (max_entries_ == 0) return;
  if (ring_.size() < max_entries_) {
    ring_.push_back(std::move(entry));
    next_ = ring_.size() % max_entries_;
  } else {
    ring_[next_] = std::move(entry);
    next_ = (next_ + 1) % max_entries_;
  }
}

TraceEntry MemoryHistory::entry(TraceAction action, int device, std::size_t addr,
                                std::size_t size, void* stream, torch_api::PoolId pool,
                                std::shared_ptr<c10::GatheredContext> context) {
  using Part = decltype(c10::MempoolId_t::first);
  const c10::MempoolId_t id{static_cast<Part>(pool.first), static_cast<Part>(pool.second)};
  return TraceEntry(action, static_cast<c10::DeviceIndex>(device), addr, size,
                    static_cast<cudaStream_t>(stream), id, c10::getApproximateTime(),
                    std::move(context));
}

void MemoryHistory::on_alloc(int device, void* ptr, std::size_t size, void* stream,
                             torch_api::PoolId pool) {
  cca::CreateContextFn recorder;
  cca::RecordContext when;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recorder = recorder_;
    when = when_;
  }
  std::shared_ptr<c10::GatheredContext> context =
      recorder != nullptr && when >= cca::RecordContext::STATE ? recorder() : nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled()) return;
  live_[ptr] = Live{context, size, device, stream, pool};
  if (!skipped(TraceAction::ALLOC)) {
    append(entry(TraceAction::ALLOC, device, reinterpret_cast<std::size_t>(ptr), size, stream,
                 pool, when >= cca::RecordContext::ALLOC ? context : nullptr));
  }
}

void MemoryHistory::on_free(void* ptr) {
  cca::CreateContextFn recorder;
  cca::RecordContext when;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recorder = recorder_;
    when = when_;
  }
  std::shared_ptr<c10::GatheredContext> context =
      recorder != nullptr && when == cca::RecordContext::ALL ? recorder() : nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // allocated before recording began
  const Live was = std::move(it->second);
  live_.erase(it);
  if (!enabled()) return;
  for (TraceAction action : {TraceAction::FREE_REQUESTED, TraceAction::FREE_COMPLETED}) {
    if (skipped(action)) continue;
    append(entry(action, was.device, reinterpret_cast<std::size_t>(ptr), was.size, was.stream,
                 was.pool, context));
  }
}

void MemoryHistory::on_event(TraceAction action, int device, std::size_t addr, std::size_t size,
                             void* stream, torch_api::PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled() || skipped(action)) return;
  append(entry(action, device, addr, size, stream, pool));
}

std::shared_ptr<c10::GatheredContext> MemoryHistory::context_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  return it == live_.end() ? nullptr : it->second.context;
}

std::vector<std::vector<TraceEntry>> MemoryHistory::traces(int device_count) const {
  std::vector<std::vector<TraceEntry>> out(static_cast<std::size_t>(std::max(device_count, 1)));
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t n = ring_.size();
  const std::size_t start = n < max_entries_ ? 0 : next_;
  for (std::size_t i = 0; i < n; ++i) {
    const TraceEntry& e = ring_[(start + i) % n];
    const auto d = static_cast<std::size_t>(e.device_);
    if (d < out.size()) out[d].push_back(e);
  }
  return out;
}

}  // namespace gpukeeper::torch_ext
