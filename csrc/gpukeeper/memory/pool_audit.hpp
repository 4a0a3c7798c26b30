// PoolAudit: a read-only check of a CachingPool's books, behind CachingPool::validate().
//
// It walks the segments given to it (the blocks must tile each segment and link both ways,
// free neighbours must be merged unless a merge is pending, live blocks must be in the
// live map and held blocks among the recent frees, expandable pages must be counted as the
// blocks on them say), then compares what it counted with the pool's counters, free
// indexes and history. A type of its own because it changes nothing and needs only the
// parts it reads, passed in: the pool calls it under its lock, and a test can audit
// segments and blocks it made by hand. The out-of-line members are in pool_audit.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/block.hpp"
#include "gpukeeper/memory/paged_memory.hpp"
#include "gpukeeper/memory/pool_counters.hpp"
#include "gpukeeper/memory/pool_history.hpp"
#include "gpukeeper/memory/ptr_map.hpp"
#include "gpukeeper/memory/recent_frees.hpp"

namespace gpukeeper::detail {

class PoolAudit {
 public:
  // What the walk counted.
  struct Tally {
    std::size_t reserved = 0;  // bytes of fixed segments (expandable ones count pages)
    std::size_t segments = 0, allocated = 0, allocated_count = 0, requested = 0;
    std::size_t free_blocks = 0, recent_blocks = 0;
    std::size_t kept_free = 0;  // on an index, over one page, in a large expandable range
  };

  // `paged`: the pool's expandable pages, nullptr without them. `alignment`: every block
  // size must be a multiple of it.
  PoolAudit(const PtrMap<Block>& live, const RecentFrees& recent, const PagedMemory* paged,
            std::size_t alignment) noexcept
      : live_(live), recent_(recent), paged_(paged), alignment_(alignment) {}

  // Walks one segment and its blocks.
  void segment(const Segment* seg);
  // Compares the walk of every segment with the books: `indexed_free` is the number of
  // blocks on the free indexes.
  void books(std::size_t indexed_free, const PoolCounters& counters, const PoolHistory& history);
  // `in_address_order`: the blocks the large indexes keep in address order (FreeStarts),
  // which must be every free block over one page of the large expandable ranges.
  void address_order(std::size_t in_address_order);

  const Tally& tally() const noexcept { return tally_; }
  // What is inconsistent, "" when all is well.
  const std::string& problems() const noexcept { return problems_.str(); }

 private:
  void block(const Segment* seg, const Block* b, const Block* prev, std::uintptr_t expect,
             std::vector<std::uint32_t>& page_refs);

  const PtrMap<Block>& live_;
  const RecentFrees& recent_;
  const PagedMemory* paged_;
  std::size_t alignment_;
  Tally tally_;
  Text problems_;
};

}  // namespace gpukeeper::detail
