// A CachingPool's exact placement: its live blocks listed, the segment of an address, and
// a recorded layout of live blocks put back at the same addresses.
//
// PyTorch's CUDA graph trees record a graph, keep its memory layout (the blocks live in
// its private pool at that point), and later return the pool to that layout before
// recording a second path of the tree: every replay of the first graph writes to those
// addresses, so the second graph must find its inputs exactly where the first left them.
// CUDA IPC shares whole cudaMalloc segments, and needs the segment behind a block.
#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

using detail::Block;
using detail::Segment;
using detail::hex;

std::vector<CachingPool::LiveBlock> CachingPool::live_blocks() const {
  std::vector<LiveBlock> out;
  std::lock_guard<SpinMutex> lock(mutex_);
  live_.for_each([&out](std::uintptr_t, Block* b) {
    out.push_back(LiveBlock{reinterpret_cast<void*>(b->addr), b->size, b->requested, b->stream});
  });
  std::sort(out.begin(), out.end(),
            [](const LiveBlock& a, const LiveBlock& b) { return a.ptr < b.ptr; });
  return out;
}

Segment* CachingPool::segment_holding(std::uintptr_t addr) const noexcept {
  for (Segment* seg = segments_; seg != nullptr; seg = seg->next) {
    if (addr >= seg->base && addr < seg->base + seg->size) return seg;
  }
  return nullptr;
}

bool CachingPool::segment_of(const void* ptr, SegmentRange& out) const {
  std::lock_guard<SpinMutex> lock(mutex_);
  const Segment* seg = segment_holding(reinterpret_cast<std::uintptr_t>(ptr));
  if (seg == nullptr) return false;
  out = SegmentRange{reinterpret_cast<void*>(seg->base), seg->size, seg->table != nullptr};
  return true;
}

bool CachingPool::share_pages(const void* ptr, SharedPages& out) {
  std::lock_guard<SpinMutex> lock(mutex_);
  const Block* block = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr || block->segment->table == nullptr || !paged_) return false;
  const std::size_t page = paged_->page_size();
  out.page_size = page;
  const detail::PageTable* table = block->segment->table;
  out.first_page = reinterpret_cast<void*>(block->addr - (block->addr - table->base) % page);
  out.fds = paged_->share(table, block->addr, block->size);
  return true;
}

std::vector<void*> CachingPool::restore_live_blocks(std::vector<LiveBlock> blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const LiveBlock& a, const LiveBlock& b) { return a.ptr < b.ptr; });
  std::lock_guard<SpinMutex> lock(mutex_);
  // Every check first: a layout that cannot be put back leaves the pool as it was.
  std::uintptr_t previous_end = 0;
  for (const LiveBlock& b : blocks) {
    const auto addr = reinterpret_cast<std::uintptr_t>(b.ptr);
    if (b.size == 0 || addr % kAlignment != 0 || b.size % kAlignment != 0 ||
        b.requested > b.size) {
      throw InvalidInputError("restore_live_blocks: block " + hex(b.ptr) + " of " +
                              std::to_string(b.size) + " bytes (" + std::to_string(b.requested) +
                              " requested) is not a block this pool could hand out");
    }
    if (addr < previous_end) {
      throw InvalidInputError("restore_live_blocks: block " + hex(b.ptr) + " overlaps the one before it");
    }
    const Segment* seg = segment_holding(addr);
    if (seg == nullptr || seg->table != nullptr || addr + b.size > seg->base + seg->size) {
      throw InvalidInputError("restore_live_blocks: block " + hex(b.ptr) + " of " +
                              std::to_string(b.size) + " bytes lies outside the pool's fixed segments");
    }
    previous_end = addr + b.size;
  }

  std::vector<void*> taken;
  std::vector<Block*> live;
  live_.for_each([&](std::uintptr_t key, Block* b) {
    taken.push_back(reinterpret_cast<void*>(key));
    live.push_back(b);
  });
  for (Block* b : live) {
    live_.erase(b->addr);
    unbook(b);
    settle(b);
  }
  settle_recent();
  merge_pending();
  for (const LiveBlock& b : blocks) place_at(b);
  return taken;
}

// Hands out `spec` exactly where it says. Its range is free (every block was taken back)
// but may span free blocks of several streams, which never merge on their own, or lie in a
// block of another stream: then the device is waited for, and the segment's free blocks
// become the block's stream and merge.
void CachingPool::place_at(const LiveBlock& spec) {
  const auto addr = reinterpret_cast<std::uintptr_t>(spec.ptr);
  Segment* seg = segment_holding(addr);
  auto holder = [&]() -> Block* {
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (addr >= b->addr && addr < b->addr + b->size) return b;
    }
    return nullptr;
  };
  Block* block = holder();
  if (block == nullptr || !block->free || addr + spec.size > block->addr + block->size ||
      block->stream != spec.stream) {
    events_.synchronize_device();
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (!b->free || b->stream == spec.stream) continue;
      index_of(b).remove(b);
      b->stream = spec.stream;
      insert_free(b);
      add_pending(b);
    }
    merge_pending();
    block = holder();
  }
  if (block == nullptr || !block->free || addr + spec.size > block->addr + block->size) {
    throw InvalidInputError("restore_live_blocks: the range of block " + hex(spec.ptr) +
                            " is not free space");  // checked above: a broken invariant
  }
  index_of(block).remove(block);
  remove_pending(block);
  if (block->addr < addr) {
    // The part before the block stays free, as a block of its own.
    Block* at = blocks_.make();
    at->addr = addr;
    at->size = block->addr + block->size - addr;
    at->segment = seg;
    at->prev = block;
    at->next = block->next;
    if (block->next != nullptr) block->next->prev = at;
    block->next = at;
    if (seg->last == block) seg->last = at;
    at->stream = block->stream;
    at->free = true;
    block->size = addr - block->addr;
    insert_free(block);
    block = at;
  }
  carve(block, spec.size, spec.requested, spec.stream);
  counters_.mark_largest_stale();
}

}  // namespace gpukeeper
