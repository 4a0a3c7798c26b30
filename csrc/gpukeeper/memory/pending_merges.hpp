// PendingMerges: the free blocks of a CachingPool whose merge with their free neighbours
// is still to come.
//
// The pool merges a little late: a freed block is reusable at its own size at once, and
// the blocks queued here are merged before any request that would split a block, once
// there are more than CachingPool::kMergeWindow of them, and before the books are read.
// A type of its own because it is an intrusive list with one rule to keep: a block is on
// it exactly when its `pending` flag is set (the links are Block::pending_prev/next, so
// queuing allocates nothing). It merges nothing itself; the pool walks it (merge_pending).
#pragma once

#include <cstddef>

#include "gpukeeper/memory/block.hpp"

namespace gpukeeper::detail {

class PendingMerges {
 public:
  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return head_ == nullptr; }
  // The most recently queued block; nullptr when none is.
  Block* front() const noexcept { return head_; }

  // Queues `block`; false, changing nothing, when it is queued already.
  bool add(Block* block) noexcept {
    if (block->pending) return false;
    block->pending = true;
    ++count_;
    block->pending_prev = nullptr;
    block->pending_next = head_;
    if (head_ != nullptr) head_->pending_prev = block;
    head_ = block;
    return true;
  }
  // Takes `block` off the queue, if it is on it.
  void remove(Block* block) noexcept {
    if (!block->pending) return;
    if (block->pending_prev != nullptr) {
      block->pending_prev->pending_next = block->pending_next;
    } else {
      head_ = block->pending_next;
    }
    if (block->pending_next != nullptr) block->pending_next->pending_prev = block->pending_prev;
    block->pending_prev = block->pending_next = nullptr;
    block->pending = false;
    --count_;
  }

 private:
  Block* head_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace gpukeeper::detail
