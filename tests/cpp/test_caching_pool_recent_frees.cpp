// The pool's recent frees (caching_pool.cpp over RecentFrees, whose own test is
// test_recent_frees.cpp): the last few freed blocks wait off the free index, and a request
// of the same rounded size on the same stream takes the newest back whole. Everything else
// must see them as if they had been put on the index at their free: placement, merging,
// the books, trim and validate(). Host memory (fixed and hybrid over host virtual memory), so
// that these run everywhere; the stream cases run over device memory in test_streams.cpp.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "test_support.hpp"

using namespace gktest;

namespace {

constexpr unsigned kHeld = CachingPool::kRecentFrees;

PoolOptions hybrid_options() {
  PoolOptions options;
  options.segments = SegmentLayout::hybrid;
  options.expandable_range = 256 * MiB;
  options.expandable_slack = 0.0;
  return options;
}

}  // namespace

TEST_CASE("recent frees: a repeated size takes the newest freed block of that size back",
          "[caching_pool][recent]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* a = pool->allocate(4 * KiB);
  void* b = pool->allocate(4 * KiB);
  void* other = pool->allocate(8 * KiB);
  const PoolStats before = pool->stats();
  pool->deallocate(a);
  pool->deallocate(other);
  pool->deallocate(b);
  // Three held: free, off the index, the books still right. (Reading stats() here would
  // settle them, as any request of another size does.)
  REQUIRE(pool->validate() == "");

  CHECK(pool->allocate(4 * KiB) == b);      // newest of the size first
  CHECK(pool->allocate(4 * KiB) == a);      // then the older one
  CHECK(pool->allocate(8 * KiB) == other);  // 8 KiB skips the 4 KiB blocks
  const PoolStats after = pool->stats();
  CHECK(after.cache_hits == before.cache_hits + 3);
  CHECK(after.cache_misses == before.cache_misses);
  CHECK(after.allocated_bytes == 16 * KiB);
  CHECK(after.requested_bytes == 16 * KiB);
  CHECK(pool->validate() == "");
  for (void* p : {a, b, other}) pool->deallocate(p);
  CHECK(pool->emergency_cleanup() == 2 * MiB);
  CHECK(pool->validate() == "");
}

TEST_CASE("recent frees: the rounded size must match, not the bytes asked for",
          "[caching_pool][recent]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* p = pool->allocate(1000);  // 1024 bytes rounded
  pool->deallocate(p);
  void* q = pool->allocate(900);  // also 1024
  CHECK(q == p);
  CHECK(pool->requested_size(q) == 900);
  CHECK(pool->stats().requested_bytes == 900);
  pool->deallocate(q);
  void* smaller = pool->allocate(512);  // another size: the held block is settled, then split
  CHECK(smaller == p);
  CHECK(pool->stats().allocated_bytes == 512);
  CHECK(pool->validate() == "");
  pool->deallocate(smaller);
}

TEST_CASE("recent frees: more frees than are held settle the oldest, and nothing is lost",
          "[caching_pool][recent]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  const unsigned n = 3 * kHeld + 1;
  std::vector<void*> blocks;
  for (unsigned i = 0; i < n; ++i) blocks.push_back(pool->allocate(4 * KiB));
  std::mt19937 rng(7);
  std::vector<void*> order = blocks;
  std::shuffle(order.begin(), order.end(), rng);
  for (void* p : order) {
    pool->deallocate(p);
    REQUIRE(pool->validate() == "");
  }
  // The same size again gets every block back, and makes no segment.
  std::set<void*> again;
  for (unsigned i = 0; i < n; ++i) again.insert(pool->allocate(4 * KiB));
  CHECK(again == std::set<void*>(blocks.begin(), blocks.end()));
  CHECK(pool->stats().upstream_allocations == 1);
  for (void* p : again) pool->deallocate(p);
  // All free again: one merged segment, however the frees were held and settled.
  const PoolStats s = pool->stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.largest_free_block == 2 * MiB);
  CHECK(s.fragmentation() == 0.0);
  CHECK(pool->validate() == "");
  CHECK(pool->emergency_cleanup() == 2 * MiB);
  CHECK(pool->stats().reserved_bytes == 0);
}

TEST_CASE("recent frees: the books read held blocks as merged free memory",
          "[caching_pool][recent]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* a = pool->allocate(4 * KiB);
  void* b = pool->allocate(4 * KiB);
  void* guard = pool->allocate(4 * KiB);
  pool->deallocate(a);
  pool->deallocate(b);  // a and b are held, each next to a free block
  // A request would see one 8 KiB block at a: stats, snapshot and history say so too.
  const PoolStats s = pool->stats();
  CHECK(s.cached_bytes == 2 * MiB - 4 * KiB);
  CHECK(s.largest_free_block == 2 * MiB - 12 * KiB);  // the tail after the guard
  bool found = false;
  for (const auto& seg : pool->snapshot()) {
    for (const auto& block : seg.blocks) {
      if (block.address == addr(a)) {
        found = true;
        CHECK_FALSE(block.allocated);
        CHECK(block.size == 8 * KiB);
      }
    }
  }
  CHECK(found);
  CHECK(pool->validate() == "");
  // The guard freed last joins everything into one free segment.
  pool->deallocate(guard);
  const PoolStats whole = pool->stats();
  CHECK(whole.largest_free_block == 2 * MiB);
  CHECK(whole.fragmentation() == 0.0);
  CHECK(pool->validate() == "");
}

TEST_CASE("recent frees: a held block that is the largest free block is reported",
          "[caching_pool][recent]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* whole = pool->allocate(20 * MiB);  // one large segment, nothing left over
  REQUIRE(pool->stats().largest_free_block == 0);
  pool->deallocate(whole);
  const PoolStats s = pool->stats();
  CHECK(s.cached_bytes == 20 * MiB);
  CHECK(s.largest_free_block == 20 * MiB);
  CHECK(pool->validate() == "");
}

TEST_CASE("recent frees: trim, a limit and cleanup release held blocks' memory",
          "[caching_pool][recent]") {
  const bool hybrid = GENERATE(false, true);
  INFO("hybrid layout: " << hybrid);
  auto pool = make_pool(ResourceKind::host, hybrid ? hybrid_options() : fixed_segments());
  void* small = pool->allocate(4 * KiB);
  void* large = pool->allocate(12 * MiB);
  pool->deallocate(small);
  pool->deallocate(large);  // both held
  CHECK(pool->validate() == "");
  CHECK(pool->trim(0) > 0);
  CHECK(pool->stats().reserved_bytes == 0);
  CHECK(pool->validate() == "");

  // A limit below what is cached gives back the held block's memory as well, down to
  // the limit (pages) or to nothing (the block's whole 20 MiB segment).
  large = pool->allocate(12 * MiB);
  pool->deallocate(large);
  pool->set_limit(4 * MiB);
  CHECK(pool->stats().reserved_bytes <= 4 * MiB);
  CHECK(pool->validate() == "");
  pool->set_limit(0);

  large = pool->allocate(12 * MiB);
  pool->deallocate(large);
  CHECK(pool->emergency_cleanup() > 0);
  CHECK(pool->stats().reserved_bytes == 0);
  CHECK(pool->validate() == "");
}

TEST_CASE("recent frees: in an expandable range a held block keeps its pages, and another "
          "size reuses them without new pages",
          "[caching_pool][recent][expandable]") {
  auto pool = make_pool(ResourceKind::host, hybrid_options());
  void* p = pool->allocate(8 * MiB);
  const PoolStats warm = pool->stats();
  pool->deallocate(p);
  CHECK(pool->validate() == "");  // pages counted in for the held block

  void* q = pool->allocate(8 * MiB);  // the same block: no page made or moved
  CHECK(q == p);
  pool->deallocate(q);
  // Another size settles the held block; its mapped pages serve the request.
  void* r = pool->allocate(6 * MiB);
  CHECK(r == p);
  const PoolStats after = pool->stats();
  CHECK(after.upstream_allocations == warm.upstream_allocations);
  CHECK(after.pages_moved == warm.pages_moved);
  CHECK(after.reserved_bytes == warm.reserved_bytes);
  CHECK(pool->validate() == "");
  pool->deallocate(r);
  CHECK(pool->trim(0) == 8 * MiB);
  CHECK(pool->stats().reserved_bytes == 0);
  CHECK(pool->validate() == "");
}

TEST_CASE("recent frees: a merge set off by a free settles the block being freed too",
          "[caching_pool][recent]") {
  // Neighbours freed in address order: each settled block queues a merge, and the free
  // that queues one more than kMergeWindow merges them all. The block freed then sits
  // next to the run being merged; it must join it, not be taken in while still held.
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  const unsigned n = kHeld + CachingPool::kMergeWindow + 2;
  std::vector<void*> blocks;
  for (unsigned i = 0; i < n + 1; ++i) blocks.push_back(pool->allocate(4 * KiB));
  for (unsigned i = 0; i < n; ++i) {
    pool->deallocate(blocks[i]);
    REQUIRE(pool->validate() == "");
  }
  // The freed run is one block: a request for all of it gets its front.
  void* run = pool->allocate(n * 4 * KiB);
  CHECK(run == blocks[0]);
  CHECK(pool->stats().upstream_allocations == 1);
  CHECK(pool->validate() == "");
  pool->deallocate(run);
  pool->deallocate(blocks[n]);
  CHECK(pool->emergency_cleanup() == 2 * MiB);
}
