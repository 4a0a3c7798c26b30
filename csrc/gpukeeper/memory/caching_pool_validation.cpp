// Checking a CachingPool: its options (at construction), validate() (over detail::PoolAudit,
// pool_audit.hpp: its read-only walk of the books), and the text of the AllocationError
// raised when memory cannot be had.
#include <cstdint>
#include <vector>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/pool_audit.hpp"

namespace gpukeeper {

using detail::Block;
using detail::hex;
using detail::human_bytes;
using detail::Segment;

void CachingPool::check_options(const PoolOptions& o) {
  auto pow2 = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  auto n = [](std::size_t v) { return std::to_string(v); };
  // Each message names the field, so that a wrong option is found without the source.
  auto fail = [](const std::string& why) { throw InvalidInputError("PoolOptions." + why); };
  if (o.small_size == 0) fail("small_size must be > 0");
  if (o.small_size > o.small_segment) {
    fail("small_size (" + n(o.small_size) + ") must be at most small_segment (" +
         n(o.small_segment) + ")");
  }
  if (o.small_segment % kAlignment != 0) {
    fail("small_segment (" + n(o.small_segment) + ") must be a multiple of 256");
  }
  if (o.large_segment % kAlignment != 0) {
    fail("large_segment (" + n(o.large_segment) + ") must be a multiple of 256");
  }
  if (o.large_cutoff > o.large_segment) {
    fail("large_cutoff (" + n(o.large_cutoff) + ") must be at most large_segment (" +
         n(o.large_segment) + ")");
  }
  if (!pow2(o.segment_granularity) || o.segment_granularity < kAlignment) {
    fail("segment_granularity (" + n(o.segment_granularity) + ") must be a power of two >= 256");
  }
  // Checked whether or not `expandable` is set: a wrong value is wrong either way. NaN
  // fails the comparison too.
  if (!(o.expandable_slack >= 0.0 && o.expandable_slack <= 1.0)) {
    fail("expandable_slack must be in [0, 1], got " + std::to_string(o.expandable_slack));
  }
  if (o.expandable_range > kMaxExpandableRange) {
    fail("expandable_range (" + n(o.expandable_range) + " bytes) is beyond any address space (at most " +
         n(kMaxExpandableRange) + "; 0 picks twice the memory)");
  }
}

// ---------------------------------------------------------------- the out-of-memory message

std::string CachingPool::oom_message(std::size_t bytes) const {
  PoolStats s = stats();
  detail::Text out;
  out << "out of memory: could not allocate " << bytes << " bytes (" << human_bytes(bytes)
      << ") from the " << to_string(upstream_->kind()) << " pool on device "
      << upstream_->device() << "; pool allocated " << human_bytes(s.allocated_bytes)
      << ", reserved " << human_bytes(s.reserved_bytes) << ", limit "
      << (s.limit_bytes ? human_bytes(s.limit_bytes) : std::string("none"))
      << ", largest free block " << human_bytes(s.largest_free_block);
  try {
    MemoryInfo info = upstream_->memory_info();
    out << "; " << (upstream_->kind() == ResourceKind::host ? "host" : "device") << " free "
        << human_bytes(info.free) << " of " << human_bytes(info.total);
  } catch (const std::exception& e) {
    out << "; memory info unavailable (" << e.what() << ")";
  }
  return out.str();
}

// ---------------------------------------------------------------- validate()

std::string CachingPool::validate() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  detail::PoolAudit audit(live_, recent_, paged_.get(), kAlignment);
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) audit.segment(seg);
  std::size_t indexed = 0, kept = 0;
  for (const auto& sf : streams_) {
    indexed += sf->small.count() + sf->large.count();
    kept += sf->large.kept();
  }
  audit.books(indexed, counters_, history_);
  audit.address_order(kept);
  return audit.problems();
}

}  // namespace gpukeeper
