// PoolCounters (pool_counters.hpp): the numbers stats() reports, written by one thread at a
// time and read by any thread without the pool's lock.
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "gpukeeper/memory/pool_counters.hpp"
#include "test_support.hpp"

using gpukeeper::detail::PoolCounters;
using namespace gktest;

TEST_CASE("pool counters: blocks handed out and taken back, with their peaks",
          "[caching_pool][counters]") {
  PoolCounters c;
  CHECK(c.snapshot(0).allocated_bytes == 0);
  c.reserve(2 * MiB);
  c.segment_added();
  c.upstream_allocated(1);
  c.handed_out(4 * KiB, 4000);
  c.handed_out(8 * KiB, 8 * KiB);
  c.cache_miss();
  c.cache_hit();
  PoolStats s = c.snapshot(64 * MiB);
  CHECK(s.allocated_bytes == 12 * KiB);
  CHECK(s.allocated_count == 2);
  CHECK(s.requested_bytes == 4000 + 8 * KiB);
  CHECK(s.reserved_bytes == 2 * MiB);
  CHECK(s.cached_bytes == 2 * MiB - 12 * KiB);
  CHECK(s.segment_count == 1);
  CHECK(s.peak_allocated_bytes == 12 * KiB);
  CHECK(s.peak_reserved_bytes == 2 * MiB);
  CHECK(s.limit_bytes == 64 * MiB);
  CHECK(s.cache_hits == 1);
  CHECK(s.cache_misses == 1);
  CHECK(s.upstream_allocations == 1);
  CHECK(s.callback_errors == 0);  // PressureCallbacks' to count

  c.taken_back(8 * KiB, 8 * KiB);
  s = c.snapshot(0);
  CHECK(s.allocated_bytes == 4 * KiB);
  CHECK(s.allocated_count == 1);
  CHECK(s.requested_bytes == 4000);
  CHECK(s.peak_allocated_bytes == 12 * KiB);  // a peak stays until reset
  CHECK(c.allocated() == 4 * KiB);
  CHECK(c.requested() == 4000);

  c.reset_peaks();
  CHECK(c.snapshot(0).peak_allocated_bytes == 4 * KiB);
  CHECK(c.snapshot(0).peak_reserved_bytes == 2 * MiB);
}

TEST_CASE("pool counters: reserved bytes, set and given back, keep their peak",
          "[caching_pool][counters]") {
  PoolCounters c;
  c.reserve(20 * MiB);
  c.unreserve(20 * MiB);
  c.upstream_freed(1);
  CHECK(c.reserved() == 0);
  CHECK(c.snapshot(0).peak_reserved_bytes == 20 * MiB);
  c.set_reserved(24 * MiB);  // expandable pages, read off the page tables
  CHECK(c.snapshot(0).peak_reserved_bytes == 24 * MiB);
  c.set_reserved(6 * MiB);
  c.set_pages_moved(3);
  c.oom_event();
  c.segment_added();
  c.segment_removed();
  const PoolStats s = c.snapshot(0);
  CHECK(s.reserved_bytes == 6 * MiB);
  CHECK(s.peak_reserved_bytes == 24 * MiB);
  CHECK(s.pages_moved == 3);
  CHECK(s.oom_events == 1);
  CHECK(s.upstream_frees == 1);
  CHECK(s.segment_count == 0);
}

TEST_CASE("pool counters: the largest free block is at most the cached bytes, and may be stale",
          "[caching_pool][counters]") {
  PoolCounters c;
  c.reserve(2 * MiB);
  c.set_largest_free(2 * MiB);
  CHECK_FALSE(c.largest_stale());
  c.handed_out(1 * MiB, 1 * MiB);
  // Handing out part of the largest block leaves the stored value behind: the pool marks
  // it stale, and the snapshot never reports more than what is cached.
  c.mark_largest_stale();
  CHECK(c.largest_stale());
  CHECK(c.largest_free() == 2 * MiB);
  CHECK(c.snapshot(0).largest_free_block == 1 * MiB);
  c.set_largest_free(512 * KiB);  // a refresh
  CHECK_FALSE(c.largest_stale());
  CHECK(c.snapshot(0).largest_free_block == 512 * KiB);
  CHECK(c.snapshot(0).fragmentation() == 0.5);
}

TEST_CASE("pool counters: one writer under a lock, readers without it", "[stress][counters]") {
  PoolCounters c;
  std::mutex writer_lock;  // the pool's lock, as the writers hold it
  std::atomic<bool> done{false};
  constexpr int kOps = 20000;
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < kOps; ++i) {
        std::lock_guard<std::mutex> lock(writer_lock);
        c.handed_out(256, 200);
        c.cache_hit();
        c.taken_back(256, 200);
      }
    });
  }
  std::size_t reads = 0;
  bool consistent = true;
  std::thread reader([&] {
    do {
      const PoolStats s = c.snapshot(0);
      // Each field exact; taken together a few operations apart.
      consistent = consistent && s.allocated_bytes <= 2 * 256 && s.peak_allocated_bytes <= 2 * 256 &&
                   s.requested_bytes <= 2 * 200 && s.cache_hits <= 2 * kOps;
      ++reads;
    } while (!done.load());
  });
  for (auto& w : writers) w.join();
  done = true;
  reader.join();
  CHECK(consistent);
  CHECK(reads > 0);
  const PoolStats s = c.snapshot(0);
  CHECK(s.allocated_bytes == 0);
  CHECK(s.allocated_count == 0);
  CHECK(s.cache_hits == 2 * kOps);
  CHECK(s.peak_allocated_bytes == 256);
}
