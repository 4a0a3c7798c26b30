// RecentFrees: the last few blocks a CachingPool freed, held back from its free index.
//
// A request of the same rounded size on the same stream takes the newest such block back
// whole, so that a repeated size (most of a training step's or a benchmark's requests)
// costs no index update, split or merge. A type of its own because it is the allocation
// fast path's first and last step, with one rule to keep: a block is on this list exactly
// when its `recent` flag is set. A fixed array and inline members, no allocation: the
// scan reads one small array of (size, stream) copies rather than the blocks themselves.
// It knows nothing of the indexes; the pool settles what it drops (CachingPool::settle).
#pragma once

#include <cstddef>

#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/memory/block.hpp"

namespace gpukeeper::detail {

class RecentFrees {
 public:
  static constexpr unsigned kCapacity = 8;

  unsigned size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  bool full() const noexcept { return count_ == kCapacity; }

  // The newest held block of `size` bytes on `stream`, no longer held; nullptr if none.
  Block* take(std::size_t size, stream_t stream) noexcept {
    for (unsigned i = count_; i-- > 0;) {
      if (entries_[i].size == size && entries_[i].stream == stream) return drop(i);
    }
    return nullptr;
  }
  // Holds a freed block as the newest; there must be room (!full()).
  void hold(Block* block) noexcept {
    block->recent = true;
    entries_[count_++] = Entry{block->size, block->stream, block};
  }
  // The oldest / newest held block, no longer held; the list must not be empty.
  Block* drop_oldest() noexcept { return drop(0); }
  Block* drop_newest() noexcept {
    Block* block = entries_[--count_].block;
    block->recent = false;
    return block;
  }
  // Whether `block` is held, with the size and stream it has now (validate()).
  bool holds_as_is(const Block* block) const noexcept {
    bool held = false;
    for (unsigned i = 0; i < count_; ++i) {
      const Entry& e = entries_[i];
      if (e.block == block) held = e.size == block->size && e.stream == block->stream;
    }
    return held;
  }

 private:
  // What a request must match, copied from the block.
  struct Entry {
    std::size_t size;
    stream_t stream;
    Block* block;
  };
  // Takes entry `i` out, keeping the rest oldest first.
  Block* drop(unsigned i) noexcept {
    Block* block = entries_[i].block;
    for (unsigned j = i + 1; j < count_; ++j) entries_[j - 1] = entries_[j];
    --count_;
    block->recent = false;
    return block;
  }

  Entry entries_[kCapacity];  // oldest first
  unsigned count_ = 0;
};

}  // namespace gpukeeper::detail
