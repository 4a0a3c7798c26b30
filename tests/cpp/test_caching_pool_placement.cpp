// Exact placement (caching_pool_placement.cpp): a pool's live blocks listed, the segment of
// an address, and a recorded layout of live blocks put back at the same addresses (what
// PyTorch's CUDA graph trees ask when they record a second path). Host memory, so that these run everywhere.
#include <algorithm>
#include <cstring>
#include <vector>

#include "test_support.hpp"

using namespace gktest;

TEST_CASE("placement: live_blocks lists every handed-out block in address order",
          "[caching_pool][placement]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* a = pool->allocate(1000);
  void* b = pool->allocate(3 * KiB);
  void* c = pool->allocate(12 * MiB);
  pool->deallocate(b);
  auto live = pool->live_blocks();
  REQUIRE(live.size() == 2);
  REQUIRE(live[0].ptr < live[1].ptr);
  std::vector<void*> ptrs{live[0].ptr, live[1].ptr};
  std::sort(ptrs.begin(), ptrs.end());
  std::vector<void*> want{a, c};
  std::sort(want.begin(), want.end());
  REQUIRE(ptrs == want);
  for (const auto& block : live) {
    REQUIRE(block.requested == (block.ptr == a ? 1000u : 12 * MiB));
    REQUIRE(block.size % CachingPool::kAlignment == 0);
    REQUIRE(block.size >= block.requested);
  }
  pool->deallocate(a);
  pool->deallocate(c);
  REQUIRE(pool->live_blocks().empty());
}

TEST_CASE("placement: segment_of finds the segment of any byte of it", "[caching_pool][placement]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* a = pool->allocate(4 * KiB);
  void* b = pool->allocate(4 * KiB);  // same small segment, after a
  CachingPool::SegmentRange ra, rb, inside;
  REQUIRE(pool->segment_of(a, ra));
  REQUIRE(pool->segment_of(b, rb));
  REQUIRE(ra.base == rb.base);
  REQUIRE(ra.size == 2 * MiB);
  REQUIRE_FALSE(ra.expandable);
  REQUIRE(pool->segment_of(static_cast<char*>(b) + 100, inside));
  REQUIRE(inside.base == ra.base);
  int outside = 0;
  CachingPool::SegmentRange none;
  REQUIRE_FALSE(pool->segment_of(&outside, none));
  pool->deallocate(a);
  pool->deallocate(b);
}

TEST_CASE("placement: a recorded layout comes back at its addresses, the rest taken back",
          "[caching_pool][placement]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  std::vector<void*> first;
  for (std::size_t n : {1000u, 5000u, 700u, 300000u, 64u}) first.push_back(pool->allocate(n));
  pool->deallocate(first[2]);
  const auto checkpoint = pool->live_blocks();  // four blocks
  REQUIRE(checkpoint.size() == 4);
  // Another path: those freed, others made in their place and beside them.
  for (void* p : {first[0], first[1], first[3], first[4]}) pool->deallocate(p);
  std::vector<void*> second;
  for (std::size_t n : {4000u, 4000u, 90000u, 256u, 1u << 20}) second.push_back(pool->allocate(n));

  auto taken = pool->restore_live_blocks(checkpoint);
  std::sort(taken.begin(), taken.end());
  std::sort(second.begin(), second.end());
  REQUIRE(taken == second);
  const auto now = pool->live_blocks();
  REQUIRE(now.size() == checkpoint.size());
  for (std::size_t i = 0; i < now.size(); ++i) {
    REQUIRE(now[i].ptr == checkpoint[i].ptr);
    REQUIRE(now[i].size == checkpoint[i].size);
    REQUIRE(now[i].requested == checkpoint[i].requested);
  }
  REQUIRE(pool->validate().empty());
  // The restored blocks are ordinary: they go back, and the books end empty.
  for (const auto& b : now) pool->deallocate(b.ptr);
  REQUIRE(pool->stats().allocated_bytes == 0);
  REQUIRE(pool->validate().empty());
}

TEST_CASE("placement: a layout that cannot be put back changes nothing",
          "[caching_pool][placement]") {
  auto pool = make_pool(ResourceKind::host, fixed_segments());
  void* a = pool->allocate(4 * KiB);
  auto layout = pool->live_blocks();
  const PoolStats before = pool->stats();
  auto misaligned = layout;
  misaligned[0].ptr = static_cast<char*>(misaligned[0].ptr) + 8;
  REQUIRE_THROWS_AS(pool->restore_live_blocks(misaligned), InvalidInputError);
  auto overlapping = layout;
  overlapping.push_back(layout[0]);
  REQUIRE_THROWS_AS(pool->restore_live_blocks(overlapping), InvalidInputError);
  alignas(256) static char elsewhere[4096];
  auto outside = layout;
  outside[0].ptr = elsewhere;
  REQUIRE_THROWS_AS(pool->restore_live_blocks(outside), InvalidInputError);
  REQUIRE(pool->stats().allocated_bytes == before.allocated_bytes);
  REQUIRE(pool->live_blocks().size() == 1);
  REQUIRE(pool->live_blocks()[0].ptr == a);
  pool->deallocate(a);
  REQUIRE(pool->validate().empty());
}
