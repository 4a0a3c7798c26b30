// What a pool tells an observer when memory behind it changes: a segment taken from or
// given back to the upstream, a page mapped at or unmapped from an address of an
// expandable range. PyTorch's memory history records these beside allocations, and its
// trace trackers (NCCL's buffer registration) act on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

enum class SegmentEventKind : int { alloc = 0, free = 1, map = 2, unmap = 3 };

struct SegmentEvent {
  SegmentEventKind kind = SegmentEventKind::alloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  stream_t stream = 0;  // the stream the segment was made for
};

// Called while the pool holds its lock, as PyTorch calls its own trackers: it must not call
// back into the pool, nor wait for anything a thread inside the pool may hold. It must not
// throw.
using SegmentObserver = std::function<void(const SegmentEvent&)>;

}  // namespace gpukeeper
