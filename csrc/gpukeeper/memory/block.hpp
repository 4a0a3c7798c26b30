// The pool's bookkeeping records: a Segment is one upstream allocation; it is cut into
// Blocks that tile it exactly, linked in address order so that freed neighbours can be
// merged in O(1). Free blocks are also on an intrusive list of their size bin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper::detail {

struct Segment;
struct PageTable;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // bytes, a multiple of the pool's alignment
  std::size_t requested = 0;  // bytes asked for (allocated blocks only)
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address-order neighbours within the segment
  Block* next = nullptr;
  Block* free_prev = nullptr;  // bin list links (free blocks only)
  Block* free_next = nullptr;
  Block* pending_prev = nullptr;  // list of free blocks not yet merged with neighbours
  Block* pending_next = nullptr;
  stream_t stream = 0;  // the stream whose work last touched the block
  std::uint32_t bin = 0;
  bool free = false;
  bool pending = false;
  bool recent = false;  // free, held back from the free index (CachingPool's recent frees)

  // Whether a neighbour in the segment is free: a merge may be due.
  bool next_to_free() const noexcept {
    return (prev != nullptr && prev->free) || (next != nullptr && next->free);
  }
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  stream_t alloc_stream = 0;  // the stream passed to the upstream (its free uses it too)
  bool small = false;         // serves the small-request index
  Block* first = nullptr;
  Block* last = nullptr;
  PageTable* table = nullptr;  // expandable segments: the pages behind the range
  Segment* prev = nullptr;  // all segments of a pool, in creation order
  Segment* next = nullptr;

  bool whole_free() const noexcept { return first->free && first->size == size; }
};

// Hands out Block and Segment records without touching the C allocator on the hot path:
// records are recycled through a free list and allocated in chunks.
template <typename T>
class RecordArena {
 public:
  T* make() {
    if (free_ == nullptr) grow();
    Node* node = free_;
    free_ = node->next_free;
    return new (&node->value) T();
  }
  void recycle(T* value) noexcept {
    value->~T();
    Node* node = reinterpret_cast<Node*>(value);
    node->next_free = free_;
    free_ = node;
  }

 private:
  union Node {
    Node() {}
    ~Node() {}
    T value;
    Node* next_free;
  };
  void grow() {
    constexpr std::size_t kChunk = 256;
    chunks_.emplace_back(new Node[kChunk]);
    Node* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) {
      chunk[i].next_free = free_;
      free_ = &chunk[i];
    }
  }
  std::vector<std::unique_ptr<Node[]>> chunks_;
  Node* free_ = nullptr;
};

}  // namespace gpukeeper::detail
