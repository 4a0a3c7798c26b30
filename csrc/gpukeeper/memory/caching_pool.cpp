// The caching pool's core: construction, allocation (cached blocks, new segments,
// carving), deallocation, merging free neighbours, and releasing free segments. Limits and
// callbacks: caching_pool_limits.cpp; the layout (asked once) and expandable segments:
// caching_pool_expandable.cpp; stats, history and snapshots: caching_pool_books.cpp;
// validate() and the out-of-memory message: caching_pool_validation.cpp.
#include "gpukeeper/memory/caching_pool.hpp"

#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"

namespace gpukeeper {

using detail::Block;
using detail::FreeIndex;
using detail::Segment;
using detail::hex;
using detail::human_bytes;

CachingPool::CachingPool(std::unique_ptr<MemoryResource> upstream, PoolOptions options)
    : upstream_(std::move(upstream)),
      stream_ordered_(upstream_ && upstream_->stream_ordered()),
      options_(options),
      events_(upstream_ ? upstream_->device() : 0, stream_ordered_),
      limit_(options.max_pool_size) {
  if (!upstream_) throw InvalidInputError("CachingPool needs an upstream resource");
  check_options(options_);
  init_layout();
}

CachingPool::~CachingPool() {
  // Memory comes back even if raw blocks were never returned: their owners broke the
  // contract, and keeping the device memory would only hide that.
  if (!streams_.empty()) {
    try {
      events_.synchronize_device();
    } catch (...) {
      // A failing device cannot be waited for; its memory is returned all the same.
    }
  }
  while (segments_ != nullptr) {
    Segment* seg = segments_;
    segments_ = seg->next;
    // Expandable ranges and their pages go with paged_, unreported: the pools that die
    // (CUDA graphs' private pools) use fixed segments.
    if (seg->table == nullptr) {
      // Stream 0, not the segment's: the device is idle now, and the stream that made
      // the segment may be gone.
      upstream_->deallocate(reinterpret_cast<void*>(seg->base), seg->size, 0);
      if (segment_observer_) {
        segment_observer_(SegmentEvent{SegmentEventKind::free, seg->base, seg->size, seg->alloc_stream});
      }
    }
  }
}

// ---------------------------------------------------------------- allocation

void* CachingPool::allocate(std::size_t bytes, stream_t stream) {
  if (bytes == 0) throw InvalidInputError("cannot allocate 0 bytes: ask for at least 1");
  if (bytes > kMaxRequest) {
    throw InvalidInputError("request of " + std::to_string(bytes) + " bytes (" +
                            human_bytes(bytes) + ") is beyond any device; is the size negative "
                            "or in the wrong unit?");
  }
  const std::size_t size = round_up(bytes, kAlignment);
  const bool small = size <= options_.small_size;
  // Host memory knows no streams: one free list, so that all neighbours can merge.
  if (!stream_ordered_) stream = 0;

  Block* block = nullptr;
  bool grew = false;
  bool hopeless = false;
  {
    std::lock_guard<SpinMutex> lock(mutex_);
    if (Block* recent = recent_.take(size, stream)) {
      counters_.cache_hit();
      hand_out(recent, bytes, stream);
      return reinterpret_cast<void*>(recent->addr);
    }
    block = try_allocate(size, bytes, small, stream, grew);
    if (block == nullptr) {
      counters_.oom_event();
      ++history_.alloc_retries;
      // Bigger than the limit or than the whole memory: dropping the cache cannot help.
      const std::size_t limit = limit_.get();
      const std::size_t total = upstream_->memory_info().total;  // 0: unknown
      hopeless = (limit != 0 && size > limit) || (total != 0 && size > total);
      if (!hopeless && release_free_segments(0) > 0) {
        block = try_allocate(size, bytes, small, stream, grew);
      }
    }
  }
  if (block == nullptr && !hopeless) {
    // Ask the rest of the process (other frameworks' caches, user callbacks), then retry.
    callbacks_.reclaim(size);
    std::lock_guard<SpinMutex> lock(mutex_);
    block = try_allocate(size, bytes, small, stream, grew);
    if (block == nullptr && release_free_segments(0) > 0) {
      block = try_allocate(size, bytes, small, stream, grew);
    }
  }
  void* result = block ? reinterpret_cast<void*>(block->addr) : nullptr;
  if (result == nullptr) {
    // The failed attempt may have released cache: let watermarks see the lower pressure
    // (and re-arm) before the error leaves.
    {
      std::lock_guard<SpinMutex> lock(mutex_);
      ++history_.ooms;
    }
    notify_watermarks();
    throw AllocationError(oom_message(bytes), bytes);
  }
  if (grew) notify_watermarks();
  return result;
}

// One attempt under the lock: a cached block, else a new segment (or more of an
// expandable one). nullptr when the limit, the upstream or the pages refuse.
Block* CachingPool::try_allocate(std::size_t size, std::size_t requested, bool small,
                                 stream_t stream, bool& grew) {
  // Placement sees every free block: none may stay held back from the index.
  if (!recent_.empty()) {
    settle_recent();
    if (pending_.size() > kMergeWindow) merge_pending();
  }
  Block* block = take_cached(size, small, stream);
  if (block == nullptr && streams_.size() > 1 && adopt_idle_streams(stream, small)) {
    block = take_cached(size, small, stream);
  }
  if (block != nullptr) {
    // A cached block of an expandable range may need pages made: growth, as a segment is.
    const std::size_t reserved_before = counters_.reserved();
    Block* taken = carve(block, size, requested, stream);
    if (taken != nullptr) counters_.cache_hit();
    if (counters_.reserved() > reserved_before) grew = true;
    return taken;
  }
  counters_.cache_miss();
  block = grow(size, small, stream);
  if (block == nullptr) return nullptr;
  grew = true;
  Block* taken = carve(block, size, requested, stream);
  // A range reserved for this request whose pages could not be had holds only
  // addresses; it goes back, so that a failed request leaves the books as they were.
  Segment* seg = block->segment;
  if (taken == nullptr && seg->table != nullptr && seg->whole_free() &&
      seg->table->mapped == 0 && seg->table->aliases == 0) {
    release_expandable_segment(seg);
  }
  return taken;
}

CachingPool::StreamFree& CachingPool::stream_free(stream_t stream) {
  if (last_stream_ != nullptr && last_stream_->stream == stream) return *last_stream_;
  for (auto& sf : streams_) {
    if (sf->stream == stream) {
      last_stream_ = sf.get();
      return *sf;
    }
  }
  streams_.push_back(std::make_unique<StreamFree>());
  streams_.back()->stream = stream;
  // Only large requests are placed lowest-first (own_fit), and only in expandable ranges.
  if (paged_ && expandable_class(false)) streams_.back()->large.keep_addresses(paged_->page_size());
  const std::size_t slot = streams_.size() - 1;
  streams_.back()->bit = slot < 64 ? std::uint64_t{1} << slot : ~std::uint64_t{0};
  last_stream_ = streams_.back().get();
  return *last_stream_;
}

FreeIndex& CachingPool::index_of(const Block* block) {
  return stream_free(block->stream).index(block->segment->small);
}

// Removes and returns a cached free block of at least `size` usable on `stream`.
Block* CachingPool::take_cached(std::size_t size, bool small, stream_t stream) {
  FreeIndex& own = stream_free(stream).index(small);
  Block* block = own_fit(own, size, small, stream);
  // Unmerged blocks serve only their own size: a request that would split a block is
  // placed as if every free run were merged, which keeps large runs whole.
  if (!pending_.empty() && (block == nullptr || block->size != size)) {
    merge_pending();
    block = own_fit(own, size, small, stream);
  }
  if (block != nullptr) {
    own.remove(block);
    remove_pending(block);
    return block;
  }
  // Another stream's block is usable once that stream's queued work is done.
  for (auto& sf : streams_) {
    if (sf->stream == stream) continue;
    FreeIndex& other = sf->index(small);
    block = other.best_fit(size);
    if (block == nullptr || !events_.done(sf->stream)) continue;
    other.remove(block);
    remove_pending(block);
    block->stream = stream;
    return block;
  }
  return nullptr;
}

// The free block of this stream to place `size` in. In an expandable class, the smallest
// of the first few that fit whose pages under the request are all mapped, so that a warm
// pool places blocks where pages already are instead of moving pages to where best fit
// points (each move is an unmap, a map and an access change); failing that, the block
// that needs the fewest pages mapped (fewest_pages_fit). Fixed segments: best fit.
//
// A block of over one page goes to the lowest free block whose pages under it are all
// mapped instead. Size order sends a step's large blocks wherever a slightly larger block
// is free, which drifts from step to step as their sizes do, and pages follow them; lowest
// first fills the mapped pages from the bottom in the same order each step. On the
// recorded transformer trace, at the default slack, it moved 0.07 pages per 1 000
// operations where size order moved 6.0. Where that layout cycles instead, PlacementGuard
// sends the class back to size order.
Block* CachingPool::own_fit(FreeIndex& index, std::size_t size, bool small, stream_t stream) {
  if (expandable_class(small)) {
    if (size > paged_->page_size() && guard_->lowest_first(size)) {
      Block* low = index.lowest_where([this, size](const Block* b) {
        return b->size >= size && paged_->all_mapped(b->segment->table, b->addr, size);
      });
      if (low != nullptr) return low;
      return fewest_pages_fit(index, size);
    }
    Block* mapped = index.first_fit_where(size, kMappedCandidates, [this, size](const Block* b) {
      return b->segment->table == nullptr || paged_->all_mapped(b->segment->table, b->addr, size);
    });
    if (mapped != nullptr) return mapped;
    return fewest_pages_fit(size, small, stream);
  }
  return index.best_fit(size);
}

std::size_t CachingPool::segment_size_for(std::size_t size, bool small) const noexcept {
  if (small) return options_.small_segment;
  if (size <= options_.large_cutoff) return options_.large_segment;
  return round_up(size, options_.segment_granularity);
}

// A new segment holding at least `size`, as one free block (not on any index), or
// nullptr when the limit or the upstream refuses even the smallest segment that fits.
Block* CachingPool::grow(std::size_t size, bool small, stream_t stream) {
  if (expandable_class(small)) return grow_expandable(size, small, stream);
  const std::size_t reserved = counters_.reserved();
  // Preferred segment first, then the least that holds the request.
  std::size_t candidates[2] = {segment_size_for(size, small), size};
  bool limited = false;
  for (std::size_t seg_size : candidates) {
    if (seg_size < size) continue;
    if (!limit_.admits(reserved, seg_size)) {
      limited = true;
      continue;
    }
    void* raw = upstream_->allocate(seg_size, stream);
    if (raw == nullptr) continue;
    if (reinterpret_cast<std::uintptr_t>(raw) % kAlignment != 0) {
      upstream_->deallocate(raw, seg_size, stream);
      throw DeviceError(std::string(to_string(upstream_->kind())) + " upstream allocate", 0,
                        "misaligned", "returned " + hex(raw) + ", not 256-byte aligned");
    }
    Segment* seg = add_segment(reinterpret_cast<std::uintptr_t>(raw), seg_size, stream, small,
                               nullptr);
    if (segment_observer_) {
      segment_observer_(SegmentEvent{SegmentEventKind::alloc, seg->base, seg_size, stream});
    }
    counters_.reserve(seg_size);
    fixed_reserved_ += seg_size;
    counters_.upstream_allocated(1);
    history_.reserved_bytes.increase(small, seg_size);
    ++history_.device_allocs;
    return seg->first;
  }
  if (limited) ++history_.limit_rejections;
  return nullptr;
}

// Links a new segment of `size` bytes at `base`, holding one free block (on no index).
Segment* CachingPool::add_segment(std::uintptr_t base, std::size_t size, stream_t stream,
                                  bool small, detail::PageTable* table) {
  Segment* seg = segment_records_.make();
  seg->base = base;
  seg->size = size;
  seg->alloc_stream = stream;
  seg->small = small;
  seg->table = table;
  seg->next = segments_;
  if (segments_ != nullptr) segments_->prev = seg;
  segments_ = seg;
  Block* block = blocks_.make();
  block->addr = base;
  block->size = size;
  block->segment = seg;
  block->stream = stream;
  block->free = true;
  seg->first = seg->last = block;
  counters_.segment_added();
  history_.segments.increase(small, 1);
  return seg;
}

// Hands out the front of a free block (not on any index), putting the rest back.
Block* CachingPool::carve(Block* block, std::size_t size, std::size_t requested,
                          stream_t stream) {
  if (block->segment->table != nullptr && !map_pages(block, size, requested)) {
    insert_free(block);  // unchanged; it may sit next to unmerged free blocks
    add_pending(block);
    return nullptr;
  }
  const bool was_largest = block->size >= counters_.largest_free();
  if (block->size > size) {
    Block* rest = blocks_.make();
    rest->addr = block->addr + size;
    rest->size = block->size - size;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    if (block->segment->last == block) block->segment->last = rest;
    rest->stream = stream;
    rest->free = true;
    block->size = size;
    insert_free(rest);
    if (rest->next != nullptr && rest->next->free) add_pending(rest);
  }
  hand_out(block, requested, stream);
  if (was_largest) counters_.mark_largest_stale();
  return block;
}

// Marks a free block (on no index, its pages counted in) allocated, and counts it.
void CachingPool::hand_out(Block* block, std::size_t requested, stream_t stream) {
  const std::size_t size = block->size;
  block->free = false;
  block->stream = stream;
  block->requested = requested;
  live_.insert(block->addr, block);

  counters_.handed_out(size, requested);
  if (paged_) budget_peak_requested_ = std::max(budget_peak_requested_, counters_.requested());
  const bool small = block->segment->small;
  history_.allocated_bytes.increase(small, size);
  history_.allocations.increase(small, 1);
  history_.requested_bytes.increase(small, requested);
}

// Recent frees (recent_frees.hpp). A freed block first waits, off the free index and with
// its pages still counted in, among the last kRecentFrees freed: a request of the same
// rounded size on the same stream takes the newest such block back whole (allocate).
// Repeated sizes, most of a training step's or a benchmark's requests, then cost neither
// the index nor the merge queue, nor counting an expandable block's pages out and in
// again. Every other request settles the held blocks first (try_allocate), as do merging,
// releasing and reading the books, so that placement and reports see every free block as
// if it had been settled at its free.
void CachingPool::hold_recent(Block* block) {
  bool evicted = false;
  if (recent_.full()) {
    settle(recent_.drop_oldest());
    evicted = true;
  }
  recent_.hold(block);
  // The largest free block reported must count held blocks, merged with their free
  // neighbours as settling would (stats() settles them when this is stale).
  if (block->size > counters_.largest_free() || block->next_to_free()) {
    counters_.mark_largest_stale();
  }
  // Only now, with `block` held: a merge settles it first. Free on no list, a merging
  // neighbour would take it in while it is still to be handed out.
  if (evicted && pending_.size() > kMergeWindow) merge_pending();
}

// Every held block onto its index (newest first); merges nothing.
void CachingPool::settle_recent() {
  while (!recent_.empty()) settle(recent_.drop_newest());
}

void CachingPool::settle(Block* block) {
  if (block->segment->table != nullptr) {
    paged_->release(block->segment->table, block->addr, block->size,
                    stream_free(block->stream).bit);
  }
  insert_free(block);
  // A block with no free neighbour needs no merge now; a neighbour freed later will
  // queue itself and merge with this one.
  if (block->next_to_free()) add_pending(block);
}

void CachingPool::insert_free(Block* block) {
  index_of(block).insert(block);
  if (block->size >= counters_.largest_free()) counters_.set_largest_free(block->size);
}

void CachingPool::refresh_largest() const noexcept {
  std::size_t largest = 0;
  for (auto& sf : streams_) {
    for (FreeIndex* index : {&sf->small, &sf->large}) {
      if (Block* b = index->largest()) largest = std::max(largest, b->size);
    }
  }
  counters_.set_largest_free(largest);
}

// ---------------------------------------------------------------- deallocation

void CachingPool::deallocate(void* ptr) { free_block(ptr, false, 0, 0); }

void CachingPool::deallocate(void* ptr, stream_t stream) { free_block(ptr, true, stream, 0); }

void CachingPool::deallocate_checked(void* ptr, std::size_t bytes) {
  if (bytes == 0) throw InvalidInputError("deallocate_checked: size 0 cannot match a block");
  free_block(ptr, false, 0, bytes);
}

bool CachingPool::try_deallocate(void* ptr) { return free_block(ptr, false, 0, 0, false); }

bool CachingPool::free_block(void* ptr, bool has_stream, stream_t stream, std::size_t expected,
                             bool must_own) {
  std::lock_guard<SpinMutex> lock(mutex_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // One probe on the common path; a size check must look before it removes.
  Block* block = expected == 0 ? live_.erase(addr) : live_.find(addr);
  if (block == nullptr) {
    if (!must_own) return false;
    throw InvalidInputError("pointer " + hex(ptr) + " is not a live block of this " +
                            to_string(upstream_->kind()) + " pool on device " +
                            std::to_string(upstream_->device()) +
                            ": it was returned already, or this pool never handed it out");
  }
  if (expected != 0 && expected != block->requested) {
    throw InvalidInputError("pointer " + hex(ptr) + " holds " + std::to_string(block->requested) +
                            " bytes, but " + std::to_string(expected) +
                            " were given back; the block was not returned");
  }
  if (expected != 0) live_.erase(addr);
  unbook(block);
  if (has_stream && stream_ordered_) block->stream = stream;
  hold_recent(block);
  return true;
}

void CachingPool::unbook(Block* block) {
  counters_.taken_back(block->size, block->requested);
  const bool small = block->segment->small;
  history_.allocated_bytes.decrease(small, block->size);
  history_.allocations.decrease(small, 1);
  history_.requested_bytes.decrease(small, block->requested);
  block->free = true;
  block->requested = 0;
}

// Merges a free block (on its index) with every free neighbour run ordered on the same
// stream, both ways: an absorbed neighbour may have been the pending one for the pair
// beyond it, so stopping after one step could strand that pair. Returns the merged block,
// on its index.
Block* CachingPool::merge_neighbours(Block* block) {
  auto mergeable = [&block](const Block* other) {
    return other != nullptr && other->free && other->stream == block->stream;
  };
  if (!mergeable(block->prev) && !mergeable(block->next)) return block;
  index_of(block).remove(block);
  while (mergeable(block->prev)) {
    Block* prev = block->prev;
    index_of(prev).remove(prev);
    remove_pending(block);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    if (block->segment->last == block) block->segment->last = prev;
    blocks_.recycle(block);
    block = prev;
  }
  while (mergeable(block->next)) {
    Block* next = block->next;
    index_of(next).remove(next);
    remove_pending(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    if (block->segment->last == next) block->segment->last = block;
    blocks_.recycle(next);
  }
  insert_free(block);
  return block;
}

void CachingPool::merge_pending() {
  settle_recent();  // a held block's neighbours would see it free but find it on no index
  while (!pending_.empty()) {
    Block* block = pending_.front();
    remove_pending(block);
    merge_neighbours(block);
  }
}

bool CachingPool::owns(const void* ptr) const {
  std::lock_guard<SpinMutex> lock(mutex_);
  return live_.find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

std::size_t CachingPool::requested_size(const void* ptr) const {
  std::lock_guard<SpinMutex> lock(mutex_);
  const Block* block = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) {
    throw InvalidInputError("pointer " + hex(ptr) + " is not a live block of this pool");
  }
  return block->requested;
}

// ---------------------------------------------------------------- releasing memory

// Merges every run of free blocks (all streams synchronized first, so any stream may
// reuse them) and returns whole free segments until reserved <= keep_reserved.
std::size_t CachingPool::release_free_segments(std::size_t keep_reserved) {
  if (counters_.reserved() <= keep_reserved) return 0;
  settle_recent();  // held blocks onto their indexes, so that the wait below covers them
  for (auto& sf : streams_) {
    // Pages remember every stream that freed a block on them: wait for all streams (one
    // device-wide wait, see StreamEvents::synchronize_device).
    if (paged_ || !sf->small.empty() || !sf->large.empty()) {
      events_.synchronize_device();
      ++history_.device_syncs;
      break;
    }
  }
  merge_pending();
  std::size_t released = 0;
  if (paged_) {
    // A released cache starts the spare budget over from what is live now: spare pages
    // sized for an earlier, larger phase would otherwise be made again.
    budget_peak_requested_ = counters_.requested();
    // Pages first, down to what the fixed segments leave of keep_reserved.
    const std::size_t keep_pages = keep_reserved > fixed_reserved_ ? keep_reserved - fixed_reserved_ : 0;
    released = paged_->unmap_movable(keep_pages);
    counters_.upstream_freed(released / paged_->page_size());
    history_.device_frees += released / paged_->page_size();
    sync_reserved();
  }
  for (Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (!b->free) continue;
      if (b->stream != seg->alloc_stream) {
        index_of(b).remove(b);
        b->stream = seg->alloc_stream;
        index_of(b).insert(b);
      }
      while (b->next != nullptr && b->next->free) {
        Block* next = b->next;
        index_of(next).remove(next);
        index_of(b).remove(b);
        b->size += next->size;
        b->next = next->next;
        if (next->next != nullptr) next->next->prev = b;
        if (seg->last == next) seg->last = b;
        blocks_.recycle(next);
        index_of(b).insert(b);
      }
    }
  }
  for (Segment* seg = segments_; seg != nullptr;) {
    Segment* next = seg->next;
    if (seg->table != nullptr) {
      // Addresses cost nothing while reserved; give back only ranges with no page left.
      if (seg->whole_free() && seg->table->mapped == 0 && seg->table->aliases == 0) {
        release_expandable_segment(seg);
      }
    } else if (counters_.reserved() > keep_reserved && seg->whole_free()) {
      released += seg->size;
      release_segment(seg);
    }
    seg = next;
  }
  refresh_largest();
  return released;
}

void CachingPool::unlink_free_segment(Segment* seg) {
  Block* block = seg->first;
  index_of(block).remove(block);
  remove_pending(block);
  blocks_.recycle(block);
  if (seg->prev != nullptr) seg->prev->next = seg->next;
  if (seg->next != nullptr) seg->next->prev = seg->prev;
  if (segments_ == seg) segments_ = seg->next;
}

void CachingPool::release_segment(Segment* seg) {
  unlink_free_segment(seg);
  // Only after release_free_segments waited for the device: the memory is idle, so it
  // goes back in stream 0's order; the stream that made the segment may be gone.
  upstream_->deallocate(reinterpret_cast<void*>(seg->base), seg->size, 0);
  if (segment_observer_) {
    segment_observer_(SegmentEvent{SegmentEventKind::free, seg->base, seg->size, seg->alloc_stream});
  }
  counters_.unreserve(seg->size);
  fixed_reserved_ -= seg->size;
  counters_.segment_removed();
  counters_.upstream_freed(1);
  history_.reserved_bytes.decrease(seg->small, seg->size);
  history_.segments.decrease(seg->small, 1);
  ++history_.device_frees;
  segment_records_.recycle(seg);
}

std::size_t CachingPool::emergency_cleanup() { return trim(0); }

std::size_t CachingPool::trim(std::size_t keep_bytes) {
  std::size_t released;
  {
    std::lock_guard<SpinMutex> lock(mutex_);
    released = release_free_segments(keep_bytes);
  }
  if (released > 0) notify_watermarks();
  return released;
}

}  // namespace gpukeeper
