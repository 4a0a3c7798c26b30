// Reading a CachingPool's books, off the allocation path: its history in PyTorch's terms,
// a snapshot of every segment and block, the out-of-memory message, and validation.
#include <algorithm>

#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::Block;
using detail::hex;
using detail::human_bytes;
using detail::Segment;

PoolHistory CachingPool::history() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  // Tidying, not a change of what the pool holds: a freed block still waiting for its
  // merge would otherwise count as one more split (as for stats()).
  const_cast<CachingPool*>(this)->merge_pending();
  PoolHistory h = history_;
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    if (seg->whole_free()) continue;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (!b->free) continue;
      h.inactive_split_bytes.increase(seg->small, b->size);
      h.inactive_splits.increase(seg->small, 1);
    }
  }
  // Current values only (see PoolHistory): the walk is not a history of increases.
  for (StatFamily* f : {&h.inactive_split_bytes, &h.inactive_splits}) {
    for (StatCounter* c : {&f->all, &f->small, &f->large}) c->peak = c->allocated = 0;
  }
  return h;
}

void CachingPool::reset_accumulated() noexcept {
  std::lock_guard<SpinMutex> lock(mutex_);
  history_.reset_accumulated();
}

std::vector<SegmentSnapshot> CachingPool::snapshot() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  const_cast<CachingPool*>(this)->merge_pending();  // blocks as a request would see them
  std::vector<SegmentSnapshot> out;
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    SegmentSnapshot snap;
    snap.address = seg->base;
    snap.size = seg->size;
    snap.mapped_bytes = seg->table != nullptr ? seg->table->mapped * paged_->page_size() : seg->size;
    snap.stream = seg->alloc_stream;
    snap.small = seg->small;
    snap.expandable = seg->table != nullptr;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      snap.blocks.push_back({b->addr, b->size, b->free ? 0 : b->requested, !b->free});
    }
    out.push_back(std::move(snap));
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  return out;
}

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

std::string CachingPool::validate() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  detail::Text problems;
  std::size_t reserved = 0, segments = 0, allocated = 0, allocated_count = 0, requested = 0;
  std::size_t free_blocks = 0;
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    ++segments;
    if (seg->table == nullptr) reserved += seg->size;
    std::vector<std::uint32_t> page_refs;
    if (seg->table != nullptr) page_refs.assign(seg->table->pages.size(), 0);
    std::uintptr_t expect = seg->base;
    const Block* prev = nullptr;
    for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
      if (b->addr != expect) problems << "block " << hex((void*)b->addr) << " leaves a gap; ";
      if (b->prev != prev) problems << "broken prev link at " << hex((void*)b->addr) << "; ";
      if (b->segment != seg) problems << "block in wrong segment; ";
      if (b->size == 0 || b->size % kAlignment) problems << "bad block size; ";
      expect = b->addr + b->size;
      if (b->free) {
        ++free_blocks;
        if (prev && prev->free && prev->stream == b->stream && !prev->pending && !b->pending) {
          problems << "unmerged free pair at " << hex((void*)prev->addr) << " (" << prev->size
                   << " + " << b->size << " bytes), neither pending a merge; ";
        }
        if (live_.find(b->addr) != nullptr) problems << "free block in live map; ";
      } else {
        ++allocated_count;
        allocated += b->size;
        requested += b->requested;
        if (live_.find(b->addr) != b) problems << "live block missing from map; ";
        if (seg->table != nullptr) {
          const std::size_t page = paged_->page_size();
          for (std::size_t i = (b->addr - seg->base) / page;
               i <= (b->addr + b->size - 1 - seg->base) / page && i < page_refs.size(); ++i) {
            ++page_refs[i];
          }
        }
      }
    }
    if (prev != seg->last) problems << "segment's last block is wrong; ";
    if (expect != seg->base + seg->size) problems << "blocks do not fill their segment; ";
    if (seg->table != nullptr) problems << paged_->check(seg->table, page_refs);
  }
  std::size_t indexed = 0;
  for (const auto& sf : streams_) indexed += sf->small.count() + sf->large.count();
  if (indexed != free_blocks) {
    problems << "free blocks " << free_blocks << " but " << indexed << " indexed; ";
  }
  if (live_.size() != allocated_count) problems << "live map size disagrees; ";
  auto get = [](const std::atomic<std::size_t>& a) { return a.load(std::memory_order_relaxed); };
  if (paged_) reserved = paged_->mapped_bytes();
  if (get(reserved_) != reserved) problems << "reserved counter " << get(reserved_) << " != " << reserved << "; ";
  if (get(segment_count_) != segments) problems << "segment counter disagrees; ";
  if (get(allocated_) != allocated) problems << "allocated counter " << get(allocated_) << " != " << allocated << "; ";
  if (get(allocated_count_) != allocated_count) problems << "allocated count disagrees; ";
  if (get(requested_) != requested) problems << "requested counter disagrees; ";
  const PoolHistory& h = history_;
  if (h.allocated_bytes.all.current != allocated ||
      h.allocated_bytes.small.current + h.allocated_bytes.large.current != allocated) {
    problems << "history's allocated bytes " << h.allocated_bytes.all.current << " != " << allocated << "; ";
  }
  if (h.allocations.all.current != allocated_count) problems << "history's allocation count disagrees; ";
  if (h.requested_bytes.all.current != requested) problems << "history's requested bytes disagree; ";
  if (h.reserved_bytes.all.current != get(reserved_) ||
      h.reserved_bytes.small.current + h.reserved_bytes.large.current != get(reserved_)) {
    problems << "history's reserved bytes " << h.reserved_bytes.all.current << " != " << get(reserved_) << "; ";
  }
  if (h.segments.all.current != segments) problems << "history's segment count disagrees; ";
  return problems.str();
}

}  // namespace gpukeeper
