// PoolLimit: a caching pool's reserved-bytes limit (0: none) and the memory pressure it
// defines, a part every layout shares, as RMM's limiting adaptor holds its limit.
//
//   detail::PoolLimit limit(1 << 30);
//   if (limit.admits(reserved, segment)) { ... }  // growth asks before taking memory
//   limit.set(bytes, allocated);                   // InvalidInputError below `allocated`
//
// A member of the pool, not a wrapper around its upstream: growth reads it under the
// pool's lock in the middle of a placement (a new segment, the pages under a block), and
// anyone reads it without the lock (one relaxed atomic, inline). It takes no lock itself:
// the pool sets it under its own, then releases cached memory down to it. The
// out-of-line members are in pool_limit.cpp.
#pragma once

#include <atomic>
#include <cstddef>

namespace gpukeeper {
class MemoryResource;
}

namespace gpukeeper::detail {

class PoolLimit {
 public:
  explicit PoolLimit(std::size_t bytes = 0) noexcept : bytes_(bytes) {}

  // The limit in bytes; 0: none.
  std::size_t get() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  // Whether holding `more` bytes beside `reserved` stays within the limit (always without
  // one).
  bool admits(std::size_t reserved, std::size_t more) const noexcept {
    const std::size_t limit = get();
    return limit == 0 || reserved + more <= limit;
  }
  // Sets the limit (0 removes it). InvalidInputError, changing nothing, when `bytes` is
  // below the `allocated` bytes the pool has handed out.
  void set(std::size_t bytes, std::size_t allocated);
  // In [0, 1]: reserved / limit with a limit, else the upstream's used fraction (0 when it
  // does not know its total).
  double pressure(std::size_t reserved, const MemoryResource& upstream) const;

 private:
  std::atomic<std::size_t> bytes_;
};

}  // namespace gpukeeper::detail
