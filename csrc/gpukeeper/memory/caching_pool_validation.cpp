// Checking a CachingPool: its options (at construction), validate()'s walk of the books,
// and the text of the AllocationError raised when memory cannot be had.
#include <cstdint>
#include <vector>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

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

// What the walk over the segments found, to compare with the counters.
struct CachingPool::Tally {
  std::size_t reserved = 0, segments = 0, allocated = 0, allocated_count = 0, requested = 0;
  std::size_t free_blocks = 0, recent_blocks = 0;
};

std::string CachingPool::validate() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  detail::Text problems;
  Tally tally;
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    validate_segment(seg, tally, problems);
  }
  validate_counters(tally, problems);
  return problems.str();
}

// Blocks must tile the segment, link both ways, and (expandable) sit on mapped pages.
void CachingPool::validate_segment(const Segment* seg, Tally& tally,
                                   detail::Text& problems) const {
  ++tally.segments;
  if (seg->table == nullptr) tally.reserved += seg->size;
  std::vector<std::uint32_t> page_refs;
  if (seg->table != nullptr) page_refs.assign(seg->table->page_count(), 0);
  std::uintptr_t expect = seg->base;
  const Block* prev = nullptr;
  for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
    validate_block(seg, b, prev, expect, tally, page_refs, problems);
    expect = b->addr + b->size;
  }
  if (prev != seg->last) problems << "segment's last block is wrong; ";
  if (expect != seg->base + seg->size) problems << "blocks do not fill their segment; ";
  if (seg->table != nullptr) problems << paged_->check(seg->table, page_refs);
}

// Block `b` of segment `seg`: `expect` is where it should start, `prev` the block before it.
void CachingPool::validate_block(const Segment* seg, const Block* b, const Block* prev,
                                 std::uintptr_t expect, Tally& tally,
                                 std::vector<std::uint32_t>& page_refs,
                                 detail::Text& problems) const {
  if (b->addr != expect) problems << "block " << hex((void*)b->addr) << " leaves a gap; ";
  if (b->prev != prev) problems << "broken prev link at " << hex((void*)b->addr) << "; ";
  if (b->segment != seg) problems << "block in wrong segment; ";
  if (b->size == 0 || b->size % kAlignment) problems << "bad block size; ";
  auto waits = [](const Block* x) { return x->pending || x->recent; };  // a merge to come
  if (b->free) {
    ++tally.free_blocks;
    if (prev && prev->free && prev->stream == b->stream && !waits(prev) && !waits(b)) {
      problems << "unmerged free pair at " << hex((void*)prev->addr) << " (" << prev->size
               << " + " << b->size << " bytes), neither pending a merge; ";
    }
    if (live_.find(b->addr) != nullptr) problems << "free block in live map; ";
    if (!b->recent) return;
    ++tally.recent_blocks;
    bool held = false;
    for (unsigned i = 0; i < recent_count_; ++i) {
      const Recent& r = recent_[i];
      if (r.block == b) held = r.size == b->size && r.stream == b->stream;
    }
    if (!held) problems << "recent block " << hex((void*)b->addr) << " not held as it is; ";
    if (b->pending) problems << "recent block pending a merge; ";
  } else {
    if (b->recent) problems << "live block marked recent; ";
    ++tally.allocated_count;
    tally.allocated += b->size;
    tally.requested += b->requested;
    if (live_.find(b->addr) != b) problems << "live block missing from map; ";
  }
  // A held block keeps its pages counted in, as a live one does.
  if (seg->table != nullptr) {
    const std::size_t page = paged_->page_size();
    for (std::size_t i = (b->addr - seg->base) / page;
         i <= (b->addr + b->size - 1 - seg->base) / page && i < page_refs.size(); ++i) {
      ++page_refs[i];
    }
  }
}

// The free indexes, the live map, the counters and the history against the walk.
void CachingPool::validate_counters(const Tally& tally, detail::Text& problems) const {
  std::size_t indexed = 0;
  for (const auto& sf : streams_) indexed += sf->small.count() + sf->large.count();
  if (indexed + tally.recent_blocks != tally.free_blocks) {
    problems << "free blocks " << tally.free_blocks << " but " << indexed << " indexed and "
             << tally.recent_blocks << " held; ";
  }
  if (tally.recent_blocks != recent_count_) {
    problems << recent_count_ << " recent frees held but " << tally.recent_blocks << " found; ";
  }
  if (live_.size() != tally.allocated_count) problems << "live map size disagrees; ";
  auto get = [](const std::atomic<std::size_t>& a) { return a.load(std::memory_order_relaxed); };
  // tally.reserved sums the fixed segments; expandable ranges count their mapped pages.
  const std::size_t reserved = paged_ ? paged_->mapped_bytes() + tally.reserved : tally.reserved;
  const std::size_t allocated = tally.allocated;
  if (get(reserved_) != reserved) problems << "reserved counter " << get(reserved_) << " != " << reserved << "; ";
  if (get(segment_count_) != tally.segments) problems << "segment counter disagrees; ";
  if (get(allocated_) != allocated) problems << "allocated counter " << get(allocated_) << " != " << allocated << "; ";
  if (get(allocated_count_) != tally.allocated_count) problems << "allocated count disagrees; ";
  if (get(requested_) != tally.requested) problems << "requested counter disagrees; ";
  const PoolHistory h = history_.totals();
  if (h.allocated_bytes.all.current != allocated ||
      h.allocated_bytes.small.current + h.allocated_bytes.large.current != allocated) {
    problems << "history's allocated bytes " << h.allocated_bytes.all.current << " != " << allocated << "; ";
  }
  if (h.allocations.all.current != tally.allocated_count) problems << "history's allocation count disagrees; ";
  if (h.requested_bytes.all.current != tally.requested) problems << "history's requested bytes disagree; ";
  if (h.reserved_bytes.all.current != get(reserved_) ||
      h.reserved_bytes.small.current + h.reserved_bytes.large.current != get(reserved_)) {
    problems << "history's reserved bytes " << h.reserved_bytes.all.current << " != " << get(reserved_) << "; ";
  }
  if (h.segments.all.current != tally.segments) problems << "history's segment count disagrees; ";
}

}  // namespace gpukeeper
