// PoolCounters: the numbers a CachingPool's stats() reports (bytes and blocks allocated,
// bytes requested and reserved, segments, peaks, cache hits and misses, upstream calls,
// out-of-memory events, pages moved, the largest free block).
//
// A type of its own because its rule differs from the rest of the pool's books: it is
// written by one thread at a time (under the pool's lock) and read by any thread without
// that lock, so that stats() never waits for an allocation. Each field is a relaxed atomic
// and each update a plain load and store (one writer needs no read-modify-write); fields
// read together may be a few operations apart, each exact. Every member is inline: the
// allocation path compiles to the same loads and stores as counters kept in the pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>

#include "gpukeeper/memory/pool_stats.hpp"

namespace gpukeeper::detail {

class PoolCounters {
 public:
  // ---- Writers: one at a time (the pool's lock held).

  // A block of `size` bytes (`requested` asked for) handed out / taken back.
  void handed_out(std::size_t size, std::size_t requested) noexcept {
    add(allocated_, static_cast<std::ptrdiff_t>(size));
    add(allocated_count_, 1);
    add(requested_, static_cast<std::ptrdiff_t>(requested));
    raise(peak_allocated_, allocated_);
  }
  void taken_back(std::size_t size, std::size_t requested) noexcept {
    add(allocated_, -static_cast<std::ptrdiff_t>(size));
    add(allocated_count_, -1);
    add(requested_, -static_cast<std::ptrdiff_t>(requested));
  }
  void cache_hit() noexcept { add(cache_hits_, 1); }
  void cache_miss() noexcept { add(cache_misses_, 1); }
  void oom_event() noexcept { add(oom_events_, 1); }
  void segment_added() noexcept { add(segment_count_, 1); }
  void segment_removed() noexcept { add(segment_count_, -1); }
  // A segment of `bytes` made (which may be a peak) / given back.
  void reserve(std::size_t bytes) noexcept {
    add(reserved_, static_cast<std::ptrdiff_t>(bytes));
    raise(peak_reserved_, reserved_);
  }
  void unreserve(std::size_t bytes) noexcept { add(reserved_, -static_cast<std::ptrdiff_t>(bytes)); }
  // Reserved bytes are now `bytes` (expandable pages, read off the page tables).
  void set_reserved(std::size_t bytes) noexcept {
    reserved_.store(bytes, std::memory_order_relaxed);
    raise(peak_reserved_, reserved_);
  }
  void upstream_allocated(std::size_t n) noexcept { add(upstream_allocations_, static_cast<std::ptrdiff_t>(n)); }
  void upstream_freed(std::size_t n) noexcept { add(upstream_frees_, static_cast<std::ptrdiff_t>(n)); }
  void set_pages_moved(std::size_t n) noexcept { pages_moved_.store(n, std::memory_order_relaxed); }
  // Every peak back to the current value.
  void reset_peaks() noexcept {
    peak_allocated_.store(get(allocated_), std::memory_order_relaxed);
    peak_reserved_.store(get(reserved_), std::memory_order_relaxed);
  }

  // The largest free block, as last seen. The pool keeps it up to date where that is
  // cheap and marks it stale where finding the new largest would cost a scan (the
  // largest block handed out, a merge pending); a refresh (slow paths, or stats() when
  // the lock is free) then sets it again. Written with the lock held, by const readers too.
  void set_largest_free(std::size_t bytes) const noexcept {
    largest_free_.store(bytes, std::memory_order_relaxed);
    largest_stale_.store(false, std::memory_order_relaxed);
  }
  void mark_largest_stale() const noexcept { largest_stale_.store(true, std::memory_order_relaxed); }

  // ---- Readers: any thread, no lock.

  std::size_t allocated() const noexcept { return get(allocated_); }
  std::size_t requested() const noexcept { return get(requested_); }
  std::size_t reserved() const noexcept { return get(reserved_); }
  std::size_t largest_free() const noexcept { return get(largest_free_); }
  bool largest_stale() const noexcept { return largest_stale_.load(std::memory_order_relaxed); }

  // Every counter into PoolStats; `limit` is the pool's. callback_errors is not counted
  // here (PressureCallbacks counts it) and stays 0.
  PoolStats snapshot(std::size_t limit) const noexcept {
    PoolStats s;
    s.allocated_bytes = get(allocated_);
    s.allocated_count = get(allocated_count_);
    s.requested_bytes = get(requested_);
    s.reserved_bytes = get(reserved_);
    s.segment_count = get(segment_count_);
    s.cached_bytes = s.reserved_bytes >= s.allocated_bytes ? s.reserved_bytes - s.allocated_bytes : 0;
    s.peak_allocated_bytes = get(peak_allocated_);
    s.peak_reserved_bytes = get(peak_reserved_);
    s.largest_free_block = std::min(get(largest_free_), s.cached_bytes);
    s.limit_bytes = limit;
    s.cache_hits = get(cache_hits_);
    s.cache_misses = get(cache_misses_);
    s.upstream_allocations = get(upstream_allocations_);
    s.upstream_frees = get(upstream_frees_);
    s.oom_events = get(oom_events_);
    s.pages_moved = get(pages_moved_);
    return s;
  }

 private:
  using Counter = std::atomic<std::size_t>;
  static std::size_t get(const Counter& c) noexcept { return c.load(std::memory_order_relaxed); }
  // One writer: a load and a store, no locked read-modify-write.
  static void add(Counter& c, std::ptrdiff_t delta) noexcept {
    c.store(c.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
  static void raise(Counter& peak, const Counter& now) noexcept {
    const std::size_t value = get(now);
    if (value > get(peak)) peak.store(value, std::memory_order_relaxed);
  }

  Counter allocated_{0}, allocated_count_{0}, requested_{0}, reserved_{0}, segment_count_{0},
      peak_allocated_{0}, peak_reserved_{0}, cache_hits_{0}, cache_misses_{0},
      upstream_allocations_{0}, upstream_frees_{0}, oom_events_{0}, pages_moved_{0};
  mutable Counter largest_free_{0};
  mutable std::atomic<bool> largest_stale_{false};
};

}  // namespace gpukeeper::detail
