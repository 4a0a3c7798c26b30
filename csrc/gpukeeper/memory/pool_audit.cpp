// PoolAudit (pool_audit.hpp): the read-only walk of a CachingPool's books behind validate().
#include "gpukeeper/memory/pool_audit.hpp"

#include <cstdint>
#include <vector>

namespace gpukeeper::detail {

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
    if (!b->recent && seg->table != nullptr && !seg->small && paged_ != nullptr &&
        b->size > paged_->page_size()) {
      ++tally_.kept_free;
    }
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

void PoolAudit::address_order(std::size_t in_address_order) {
  if (in_address_order != tally_.kept_free) {
    problems_ << in_address_order << " free blocks in address order but " << tally_.kept_free
              << " over one page in large expandable ranges; ";
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

}  // namespace gpukeeper::detail
