// A snapshot of a pool's books. CachingPool::stats() reads it without taking the pool's
// lock: each field is exact, fields taken together may be a few operations apart.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpukeeper {

struct PoolStats {
  std::size_t allocated_bytes = 0;   // live blocks (sizes rounded to the alignment)
  std::size_t allocated_count = 0;   // live blocks
  std::size_t requested_bytes = 0;   // live blocks, as asked for
  std::size_t reserved_bytes = 0;    // held from the upstream (segments)
  std::size_t segment_count = 0;
  std::size_t cached_bytes = 0;      // reserved but free
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t largest_free_block = 0;
  std::size_t limit_bytes = 0;       // 0: no limit
  std::uint64_t cache_hits = 0;      // requests served from cached blocks
  std::uint64_t cache_misses = 0;    // requests that needed a new segment
  std::uint64_t upstream_allocations = 0;
  std::uint64_t upstream_frees = 0;
  std::uint64_t oom_events = 0;      // upstream refusals seen (each led to cache release)
  std::uint64_t callback_errors = 0; // reclaim or watermark callbacks that threw
  std::uint64_t pages_moved = 0;     // expandable segments: pages remapped instead of made

  // 1 - largest free block / cached bytes: 0 when the cache is one piece (or empty),
  // near 1 when it is in many pieces none of which serves a large request.
  double fragmentation() const noexcept {
    return cached_bytes == 0 ? 0.0
                             : 1.0 - static_cast<double>(largest_free_block) /
                                         static_cast<double>(cached_bytes);
  }
};

}  // namespace gpukeeper
