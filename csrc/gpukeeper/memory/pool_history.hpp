// What a pool has done, in the terms PyTorch's caching allocator reports
// (torch.cuda.memory_stats): each quantity has a current value, a peak, and the total
// it ever rose and fell by, in all and per size class (small requests, large requests).
//
//   PoolHistory h = pool.history();
//   h.allocated_bytes.all.peak;        // most bytes ever handed out at once
//   h.segments.small.allocated;        // small segments ever taken from the upstream
//
// CachingPool keeps one under its lock; reading it copies it (a slow path: the fast
// counters are in PoolStats). Peaks and totals restart with reset_peaks() and
// reset_accumulated(), as torch.cuda.reset_peak_memory_stats() and
// reset_accumulated_memory_stats() do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper {

struct StatCounter {
  std::size_t current = 0;
  std::size_t peak = 0;
  std::size_t allocated = 0;  // total increase since the last reset_accumulated()
  std::size_t freed = 0;      // total decrease since the last reset_accumulated()

  void increase(std::size_t n) noexcept {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(std::size_t n) noexcept {
    current -= n;
    freed += n;
  }
};

// The size classes count as they change; `all` keeps only its peak then, and totals()
// adds the classes up for the rest when the history is read. The allocation path thus
// updates one counter per quantity, not two.
struct StatFamily {
  StatCounter all, small, large;

  void increase(bool is_small, std::size_t n) noexcept {
    (is_small ? small : large).increase(n);
    const std::size_t now = small.current + large.current;
    if (now > all.peak) all.peak = now;
  }
  void decrease(bool is_small, std::size_t n) noexcept { (is_small ? small : large).decrease(n); }
  void reset_peaks() noexcept {
    small.peak = small.current;
    large.peak = large.current;
    all.peak = small.current + large.current;
  }
  void reset_accumulated() noexcept {
    for (StatCounter* c : {&all, &small, &large}) c->allocated = c->freed = 0;
  }
  // This family with `all`'s current value and totals filled in from the classes.
  StatFamily totals() const noexcept {
    StatFamily f = *this;
    f.all.current = small.current + large.current;
    f.all.allocated = small.allocated + large.allocated;
    f.all.freed = small.freed + large.freed;
    return f;
  }
};

struct PoolHistory {
  StatFamily allocated_bytes;  // live blocks, rounded sizes
  StatFamily allocations;      // live blocks, counted
  StatFamily requested_bytes;  // live blocks, sizes as asked for
  StatFamily reserved_bytes;   // held from the upstream (mapped pages for expandable ranges)
  StatFamily segments;         // upstream allocations (address ranges for expandable ones)
  // Free blocks in segments that also hold live blocks, so that they cannot go back to
  // the upstream. Current values only, found by walking the books when read: peak and
  // totals stay 0 (keeping them would cost the allocation fast path a walk).
  StatFamily inactive_split_bytes;
  StatFamily inactive_splits;
  std::uint64_t alloc_retries = 0;     // upstream refusals that led to a cache release
  std::uint64_t ooms = 0;              // allocations that failed and raised
  std::uint64_t limit_rejections = 0;  // segments or pages not taken because of the pool's limit
  std::uint64_t device_allocs = 0;     // upstream allocations (pages, for expandable ones)
  std::uint64_t device_frees = 0;
  std::uint64_t device_syncs = 0;      // device-wide waits before memory went back

  void reset_peaks() noexcept {
    for (StatFamily* f : families()) f->reset_peaks();
  }
  void reset_accumulated() noexcept {
    for (StatFamily* f : families()) f->reset_accumulated();
    alloc_retries = ooms = limit_rejections = device_allocs = device_frees = device_syncs = 0;
  }
  // As read: every family's `all` filled in (see StatFamily).
  PoolHistory totals() const {
    PoolHistory h = *this;
    for (StatFamily* f : h.families()) *f = f->totals();
    return h;
  }

 private:
  std::vector<StatFamily*> families() {
    return {&allocated_bytes, &allocations,          &requested_bytes, &reserved_bytes,
            &segments,        &inactive_split_bytes, &inactive_splits};
  }
};

// The pool's books laid out for a memory snapshot (torch.cuda.memory._snapshot()'s
// "segments"): every segment with the blocks that tile it, in address order.
struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // 0 for free blocks
  bool allocated = false;
};

struct SegmentSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;          // address range (expandable: the part in use)
  std::size_t mapped_bytes = 0;  // memory behind it (== size unless expandable)
  stream_t stream = 0;
  bool small = false;
  bool expandable = false;
  std::vector<BlockSnapshot> blocks;
};

}  // namespace gpukeeper
