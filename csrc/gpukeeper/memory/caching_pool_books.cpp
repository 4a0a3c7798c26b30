// Reading a CachingPool's books, off the allocation path: stats() and its peaks, the
// history in PyTorch's terms, and a snapshot of every segment and block.
#include <algorithm>

#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::Block;
using detail::Segment;

PoolStats CachingPool::stats() const noexcept {
  if (counters_.largest_stale() && mutex_.try_lock()) {
    // Tidying, not a change of what the pool holds: merged free runs make the largest
    // free block (and fragmentation) what a request would see.
    const_cast<CachingPool*>(this)->merge_pending();
    refresh_largest();
    mutex_.unlock();
  }
  PoolStats s = counters_.snapshot(limit_.get());
  s.callback_errors = callbacks_.errors();
  return s;
}

void CachingPool::reset_peaks() noexcept {
  std::lock_guard<SpinMutex> lock(mutex_);
  counters_.reset_peaks();
  history_.reset_peaks();
}

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
  return h.totals();
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

}  // namespace gpukeeper
