// A CachingPool's layout (pool_layout.hpp, asked once here) and its expandable segments:
// growing a reserved address range instead of making new segments, mapping pages under the
// blocks handed out, keeping reserved bytes equal to the mapped pages, and giving back
// ranges with no page left.
#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::Block;
using detail::Segment;

// Settles PoolOptions::segments (automatic becomes the layout it stands for), asks the
// layout where each size class lives (pool_layout.hpp), and sets up the expandable ranges
// when any class needs them. Called by the constructor; nothing asks the layout after it.
void CachingPool::init_layout() {
  options_.segments = resolve_layout(options_.segments, *upstream_);
  const std::unique_ptr<PoolLayout> layout = make_layout(options_.segments);
  for (const bool small : {false, true}) {
    expandable_class_[small] = layout->source(small) == SegmentSource::expandable;
  }
  if (layout->uses_expandable()) init_expandable();
}

// Layouts with expandable size classes: pages of the upstream's virtual memory in one reserved
// range per size class.
void CachingPool::init_expandable() {
  VirtualMemory* vm = upstream_->virtual_memory();
  if (vm == nullptr) {
    throw InvalidInputError(std::string("expandable segments need virtual memory, which ") +
                            to_string(upstream_->kind()) + " memory does not offer");
  }
  total_memory_ = upstream_->memory_info().total;
  std::size_t range = options_.expandable_range;
  if (range == 0) range = 2 * std::max<std::size_t>(total_memory_, 1u << 30);
  paged_ = std::make_unique<detail::PagedMemory>(*vm, range);
  guard_ = std::make_unique<detail::PlacementGuard>();
  observe_pages();
  streams_done_fn_ = [this](std::uint64_t bits) { return streams_done(bits); };
  may_create_page_fn_ = [this] {
    return limit_.admits(paged_->mapped_bytes() + fixed_reserved_, paged_->page_size());
  };
}

void CachingPool::set_segment_observer(SegmentObserver observer) {
  std::lock_guard<SpinMutex> lock(mutex_);
  segment_observer_ = std::move(observer);
  observe_pages();
}

void CachingPool::observe_pages() {
  if (!paged_) return;
  if (!segment_observer_) {
    paged_->set_observer(nullptr);
    return;
  }
  paged_->set_observer([this](bool mapped, std::uintptr_t address, std::size_t bytes) {
    const Segment* seg = segment_holding(address);
    segment_observer_(SegmentEvent{mapped ? SegmentEventKind::map : SegmentEventKind::unmap,
                                   address, bytes, seg != nullptr ? seg->alloc_stream : 0});
  });
}

// More address space for `size`: the tail of the growing range of this size class (its
// last block, if free on this stream, grows in place), else a new range. The pages are
// mapped later, by carve(), under the part that is handed out.
Block* CachingPool::grow_expandable(std::size_t size, bool small, stream_t stream) {
  // More than the whole memory: refused here, not after making pages for all of it.
  if (total_memory_ != 0 && size > total_memory_) return nullptr;
  Segment*& current = expandable_[small ? 0 : 1];
  const std::size_t page = paged_->page_size();
  if (current != nullptr) {
    Block* last = current->last;
    const bool extend_last = last->free && last->stream == stream;
    const std::size_t need = extend_last && last->size < size ? size - last->size : size;
    const std::size_t grow_by = round_up(need, page);
    if (current->size + grow_by <= current->table->capacity) {
      paged_->extend(current->table, current->size + grow_by);
      current->size += grow_by;
      if (extend_last) {
        index_of(last).remove(last);
        remove_pending(last);
        last->size += grow_by;
        return last;
      }
      Block* block = blocks_.make();
      block->addr = last->addr + last->size;
      block->size = grow_by;
      block->segment = current;
      block->prev = last;
      last->next = block;
      current->last = block;
      block->stream = stream;
      block->free = true;
      return block;
    }
  }
  const std::size_t first_size = round_up(size, page);
  if (first_size > paged_->range_bytes()) return nullptr;
  detail::PageTable* table = paged_->reserve();
  if (table == nullptr) return nullptr;
  paged_->extend(table, first_size);
  current = add_segment(table->base, first_size, stream, small, table);
  return current->first;
}

// Where a request goes when no block with its pages mapped was found among the first few
// candidates: of all free blocks of `stream` in this class's ranges that fit, the one
// whose front has the fewest unmapped pages under the request, the lowest on ties. Pages
// then move for the part that is missing only, and low blocks are filled first, while
// PagedMemory takes the pages it moves from the top of the range: the mapped pages stay
// packed low, where the next step's blocks land. Best fit instead points at whichever
// block is closest in size, however few of its pages are mapped; on the recorded traces
// it moved 3.7x (forcefield) and 8x (transformer) more pages once warm
// (docs/performance.md). A walk of the ranges' blocks: the path maps pages, which costs
// far more.
Block* CachingPool::fewest_pages_fit(std::size_t size, bool small, stream_t stream) const {
  Block* best = nullptr;
  std::size_t best_missing = ~std::size_t{0};
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    if (seg->table == nullptr || seg->small != small) continue;
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (!b->free || b->stream != stream || b->size < size) continue;
      const std::size_t missing = paged_->unmapped_pages(seg->table, b->addr, size);
      if (missing < best_missing || (missing == best_missing && b->addr < best->addr)) {
        best = b;
        best_missing = missing;
        if (missing == 0) break;  // the lowest fully mapped block of this range
      }
    }
  }
  return best;
}

// fewest_pages_fit for a request of over one page, which only the free blocks of over one
// page can take: those the index keeps in address order, with no walk of allocated blocks.
Block* CachingPool::fewest_pages_fit(const detail::FreeIndex& index, std::size_t size) const {
  Block* best = nullptr;
  std::size_t best_missing = ~std::size_t{0};
  index.lowest_where([&](Block* b) {
    if (b->size < size) return false;
    const std::size_t missing = paged_->unmapped_pages(b->segment->table, b->addr, size);
    if (missing < best_missing) {
      best = b;
      best_missing = missing;
    }
    return missing == 0;
  });
  return best;
}

// Maps the pages under the first `size` bytes of `block` (not on any index).
bool CachingPool::map_pages(Block* block, std::size_t size, std::size_t requested) {
  detail::PageTable* table = block->segment->table;
  if (paged_->all_mapped(table, block->addr, size)) {  // the warm case: nothing to map
    paged_->count_in(table, block->addr, size);
    return true;
  }
  const std::uint64_t mapped_before = paged_->mapped_bytes(), moved_before = paged_->pages_moved(),
                      created_before = paged_->pages_created(),
                      released_before = paged_->pages_released();
  // The spare budget (PoolOptions::expandable_slack): reserved bytes within (1 + slack)
  // times the most bytes requested at once, this request included; what the fixed
  // segments hold comes off what the pages may take.
  const double peak = static_cast<double>(
      std::max(budget_peak_requested_, counters_.requested() + requested));
  const double budget = peak * (1.0 + options_.expandable_slack);
  const double pages_budget = budget - static_cast<double>(fixed_reserved_);
  const std::size_t spare_limit = pages_budget > 0 ? static_cast<std::size_t>(pages_budget) : 0;
  bool ok = paged_->acquire(table, block->addr, size, streams_done_fn_,
                            may_create_page_fn_, spare_limit);
  if (!ok) {
    // The call made `made` pages (given back now) before the next one was refused.
    const std::uint64_t made = paged_->pages_created() - created_before;
    if (!limit_.admits(paged_->mapped_bytes() + fixed_reserved_, (made + 1) * paged_->page_size())) {
      ++history_.limit_rejections;
    }
  }
  // Pages a failed call made are given back (and a failed map drops its page).
  if (const std::uint64_t released = paged_->pages_released() - released_before) {
    counters_.upstream_freed(released);
    history_.device_frees += released;
  }
  if (paged_->pages_moved() != moved_before && size > paged_->page_size()) guard_->moved(size);
  if (paged_->mapped_bytes() != mapped_before || paged_->pages_moved() != moved_before ||
      paged_->pages_created() != created_before) {
    sync_reserved();
  }
  return ok;
}

bool CachingPool::streams_done(std::uint64_t bits) {
  for (auto& sf : streams_) {
    if ((sf->bit & bits) != 0 && !events_.done(sf->stream)) return false;
  }
  return true;
}

void CachingPool::sync_reserved() noexcept {
  if (!paged_) return;
  const std::size_t now = paged_->mapped_bytes() + fixed_reserved_;
  counters_.set_reserved(now);
  // Pages move between ranges, so the split by size class is read off the ranges (a
  // handful: one growing range per class, plus any not yet given back).
  std::size_t mapped[2] = {0, 0};
  for (const Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    if (seg->table != nullptr) mapped[seg->small ? 0 : 1] += seg->table->mapped * paged_->page_size();
  }
  for (int cls = 0; cls < 2; ++cls) {
    if (mapped[cls] > history_mapped_[cls]) {
      history_.reserved_bytes.increase(cls == 0, mapped[cls] - history_mapped_[cls]);
    } else {
      history_.reserved_bytes.decrease(cls == 0, history_mapped_[cls] - mapped[cls]);
    }
    history_mapped_[cls] = mapped[cls];
  }
  // Pages made since the last look count as upstream allocations, beside the fixed
  // segments that grow() counts (hybrid has both).
  const std::uint64_t made = paged_->pages_created() - pages_counted_;
  pages_counted_ += made;
  counters_.upstream_allocated(made);
  history_.device_allocs += made;
  counters_.set_pages_moved(paged_->pages_moved());
}

void CachingPool::release_expandable_segment(Segment* seg) {
  unlink_free_segment(seg);
  if (!seg->small) {
    for (auto& sf : streams_) sf->large.forget_range(seg->base);
  }
  for (Segment*& current : expandable_) {
    if (current == seg) current = nullptr;
  }
  paged_->unreserve(seg->table);
  counters_.segment_removed();
  history_.segments.decrease(seg->small, 1);
  segment_records_.recycle(seg);
}

}  // namespace gpukeeper
