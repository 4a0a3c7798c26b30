// Checking a CachingPool: its options (at construction), validate() with the code of
// detail::PoolAudit (pool_audit.hpp), its read-only walk of the books, and the text of the
// AllocationError raised when memory cannot be had.
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
  std::size_t indexed = 0;
  for (const auto& sf : streams_) indexed += sf->small.count() + sf->large.count();
  audit.books(indexed, counters_, history_);
  return audit.problems();
}

// ---------------------------------------------------------------- PoolAudit

namespace detail {

// Blocks must tile the segment, link both ways, and (expandable) sit on mapped pages.
void PoolAudit::segment(const Segment* seg) {
  ++tally_.segments;
  if (seg->table == nullptr) tally_.reserved += seg->size;
  std::vector<std::uint32_t> page_refs;
  if (seg->table != nullptr) page_refs.assign(seg->table->page_count(), 0);
  std::uintptr_t expect = seg->base;
  const Block* prev = nullptr;
  for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
    block(seg, b, prev, expect, page_refs);
    expect = b->addr + b->size;
  }
  if (prev != seg->last) problems_ << "segment's last block is wrong; ";
  if (expect != seg->base + seg->size) problems_ << "blocks do not fill their segment; ";
  if (seg->table != nullptr) {
    if (paged_ == nullptr) {
      problems_ << "expandable segment in a pool without pages; ";
    } else {
      problems_ << paged_->check(seg->table, page_refs);
    }
  }
}

// Block `b` of segment `seg`: `expect` is where it should start, `prev` the block before it.
void PoolAudit::block(const Segment* seg, const Block* b, const Block* prev, std::uintptr_t expect,
                      std::vector<std::uint32_t>& page_refs) {
  if (b->addr != expect) problems_ << "block " << hex((void*)b->addr) << " leaves a gap; ";
  if (b->prev != prev) problems_ << "broken prev link at " << hex((void*)b->addr) << "; ";
  if (b->segment != seg) problems_ << "block in wrong segment; ";
  if (b->size == 0 || b->size % alignment_) problems_ << "bad block size; ";
  auto waits = [](const Block* x) { return x->pending || x->recent; };  // a merge to come
  if (b->free) {
    ++tally_.free_blocks;
    if (prev && prev->free && prev->stream == b->stream && !waits(prev) && !waits(b)) {
      problems_ << "unmerged free pair at " << hex((void*)prev->addr) << " (" << prev->size
                << " + " << b->size << " bytes), neither pending a merge; ";
    }
    if (live_.find(b->addr) != nullptr) problems_ << "free block in live map; ";
    if (!b->recent) return;
    ++tally_.recent_blocks;
    if (!recent_.holds_as_is(b)) {
      problems_ << "recent block " << hex((void*)b->addr) << " not held as it is; ";
    }
    if (b->pending) problems_ << "recent block pending a merge; ";
  } else {
    if (b->recent) problems_ << "live block marked recent; ";
    ++tally_.allocated_count;
    tally_.allocated += b->size;
    tally_.requested += b->requested;
    if (live_.find(b->addr) != b) problems_ << "live block missing from map; ";
  }
  // A held block keeps its pages counted in, as a live one does.
  if (seg->table != nullptr && paged_ != nullptr) {
    const std::size_t page = paged_->page_size();
    for (std::size_t i = (b->addr - seg->base) / page;
         i <= (b->addr + b->size - 1 - seg->base) / page && i < page_refs.size(); ++i) {
      ++page_refs[i];
    }
  }
}

// The free indexes, the live map, the counters and the history against the walk.
void PoolAudit::books(std::size_t indexed, const PoolCounters& counters, const PoolHistory& history) {
  const Tally& t = tally_;
  if (indexed + t.recent_blocks != t.free_blocks) {
    problems_ << "free blocks " << t.free_blocks << " but " << indexed << " indexed and "
              << t.recent_blocks << " held; ";
  }
  if (t.recent_blocks != recent_.size()) {
    problems_ << recent_.size() << " recent frees held but " << t.recent_blocks << " found; ";
  }
  if (live_.size() != t.allocated_count) problems_ << "live map size disagrees; ";
  const PoolStats c = counters.snapshot(0);
  // t.reserved sums the fixed segments; expandable ranges count their mapped pages.
  const std::size_t reserved = paged_ ? paged_->mapped_bytes() + t.reserved : t.reserved;
  const std::size_t allocated = t.allocated;
  if (c.reserved_bytes != reserved) {
    problems_ << "reserved counter " << c.reserved_bytes << " != " << reserved << "; ";
  }
  if (c.segment_count != t.segments) problems_ << "segment counter disagrees; ";
  if (c.allocated_bytes != allocated) {
    problems_ << "allocated counter " << c.allocated_bytes << " != " << allocated << "; ";
  }
  if (c.allocated_count != t.allocated_count) problems_ << "allocated count disagrees; ";
  if (c.requested_bytes != t.requested) problems_ << "requested counter disagrees; ";
  const PoolHistory h = history.totals();
  if (h.allocated_bytes.all.current != allocated ||
      h.allocated_bytes.small.current + h.allocated_bytes.large.current != allocated) {
    problems_ << "history's allocated bytes " << h.allocated_bytes.all.current << " != " << allocated << "; ";
  }
  if (h.allocations.all.current != t.allocated_count) problems_ << "history's allocation count disagrees; ";
  if (h.requested_bytes.all.current != t.requested) problems_ << "history's requested bytes disagree; ";
  if (h.reserved_bytes.all.current != c.reserved_bytes ||
      h.reserved_bytes.small.current + h.reserved_bytes.large.current != c.reserved_bytes) {
    problems_ << "history's reserved bytes " << h.reserved_bytes.all.current << " != " << c.reserved_bytes << "; ";
  }
  if (h.segments.all.current != t.segments) problems_ << "history's segment count disagrees; ";
}

}  // namespace detail
}  // namespace gpukeeper
