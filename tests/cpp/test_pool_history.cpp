// The pool's history in PyTorch's terms (current, peak, total up and down, per size
// class) and its snapshot of segments and blocks, over every usable kind of memory.
#include <vector>

#include "test_support.hpp"

using namespace gktest;
using gpukeeper::BlockSnapshot;
using gpukeeper::PoolHistory;
using gpukeeper::SegmentSnapshot;

#define GK_FOR_EACH_KIND()                                                                   \
  const ResourceKind kind =                                                                  \
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned); \
  INFO("memory kind: " << gpukeeper::to_string(kind));                                      \
  GK_SKIP_UNLESS_USABLE(kind)

TEST_CASE("history: allocations counted per size class, with peaks and totals",
          "[pool_history]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_segments());
  void* small = pool->allocate(1000);          // 1024 bytes, small class
  void* large = pool->allocate(3 * MiB + 1);   // rounded to 256 bytes, large class
  const std::size_t large_size = round_up(3 * MiB + 1);
  PoolHistory h = pool->history();
  CHECK(h.allocated_bytes.small.current == 1024);
  CHECK(h.allocated_bytes.large.current == large_size);
  CHECK(h.allocated_bytes.all.current == 1024 + large_size);
  CHECK(h.requested_bytes.all.current == 1000 + 3 * MiB + 1);
  CHECK(h.allocations.all.current == 2);
  CHECK(h.segments.small.current == 1);
  CHECK(h.segments.large.current == 1);
  CHECK(h.reserved_bytes.small.current == 2 * MiB);
  CHECK(h.reserved_bytes.large.current == 20 * MiB);
  CHECK(h.reserved_bytes.all.current == pool->stats().reserved_bytes);
  CHECK(h.device_allocs == 2);
  // Both segments hold a live block and free space: two inactive splits.
  CHECK(h.inactive_splits.all.current == 2);
  CHECK(h.inactive_split_bytes.all.current == 22 * MiB - 1024 - large_size);

  pool->deallocate(large);
  h = pool->history();
  CHECK(h.allocated_bytes.large.current == 0);
  CHECK(h.allocated_bytes.large.peak == large_size);
  CHECK(h.allocated_bytes.large.allocated == large_size);
  CHECK(h.allocated_bytes.large.freed == large_size);
  CHECK(h.allocated_bytes.all.peak == 1024 + large_size);
  CHECK(h.inactive_splits.all.current == 1);  // the large segment is whole again

  pool->reset_peaks();
  h = pool->history();
  CHECK(h.allocated_bytes.all.peak == 1024);
  CHECK(h.allocated_bytes.all.allocated == 1024 + large_size);  // totals survive a peak reset
  pool->reset_accumulated();
  h = pool->history();
  CHECK(h.allocated_bytes.all.allocated == 0);
  CHECK(h.allocated_bytes.all.freed == 0);
  CHECK(h.allocated_bytes.all.current == 1024);
  CHECK(h.device_allocs == 0);

  REQUIRE(pool->emergency_cleanup() == 20 * MiB);
  h = pool->history();
  CHECK(h.reserved_bytes.large.current == 0);
  CHECK(h.reserved_bytes.large.freed == 20 * MiB);
  CHECK(h.segments.large.current == 0);
  CHECK(h.device_frees == 1);
  pool->deallocate(small);
  CHECK(pool->validate() == "");
}

TEST_CASE("history: failed allocations and limit refusals are counted", "[pool_history]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(4 * MiB);
  void* a = pool->allocate(MiB);
  REQUIRE_THROWS_AS(pool->allocate(3 * MiB), AllocationError);  // needs a 20 MiB segment
  PoolHistory h = pool->history();
  CHECK(h.ooms == 1);
  CHECK(h.limit_rejections >= 1);
  CHECK(h.alloc_retries >= 1);
  pool->deallocate(a);
  CHECK(pool->validate() == "");
}

TEST_CASE("snapshot: segments in address order, blocks tiling each one", "[pool_history]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_segments());
  std::vector<void*> ptrs;
  for (std::size_t size : {std::size_t{100}, std::size_t{5000}, 2 * MiB + 3, std::size_t{300}}) {
    ptrs.push_back(pool->allocate(size));
  }
  pool->deallocate(ptrs[1]);
  std::vector<SegmentSnapshot> segments = pool->snapshot();
  REQUIRE(segments.size() == 2);
  std::size_t live = 0, requested = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const SegmentSnapshot& seg = segments[i];
    if (i > 0) CHECK(seg.address > segments[i - 1].address);
    CHECK(seg.mapped_bytes == seg.size);
    CHECK_FALSE(seg.expandable);
    std::uintptr_t expect = seg.address;
    for (const BlockSnapshot& b : seg.blocks) {
      CHECK(b.address == expect);
      expect += b.size;
      if (b.allocated) {
        ++live;
        requested += b.requested;
      } else {
        CHECK(b.requested == 0);
      }
    }
    CHECK(expect == seg.address + seg.size);
  }
  CHECK(live == 3);
  CHECK(requested == 100 + 2 * MiB + 3 + 300);
  for (std::size_t i : {0, 2, 3}) pool->deallocate(ptrs[i]);
}

TEST_CASE("history: expandable ranges split reserved bytes by class", "[pool_history]") {
  PoolOptions options;
  options.segments = SegmentLayout::expandable;
  options.expandable_range = 256 * MiB;
  auto pool = make_pool(ResourceKind::host, options);
  void* small = pool->allocate(4096);
  void* large = pool->allocate(5 * MiB);
  PoolHistory h = pool->history();
  CHECK(h.reserved_bytes.all.current == pool->stats().reserved_bytes);
  CHECK(h.reserved_bytes.small.current > 0);
  CHECK(h.reserved_bytes.large.current >= 5 * MiB);
  CHECK(h.reserved_bytes.small.current + h.reserved_bytes.large.current ==
        h.reserved_bytes.all.current);
  CHECK(h.segments.all.current == 2);
  std::vector<SegmentSnapshot> segments = pool->snapshot();
  REQUIRE(segments.size() == 2);
  for (const SegmentSnapshot& seg : segments) CHECK(seg.expandable);
  pool->deallocate(small);
  pool->deallocate(large);
  pool->emergency_cleanup();
  h = pool->history();
  CHECK(h.reserved_bytes.all.current == pool->stats().reserved_bytes);
  CHECK(pool->validate() == "");
}
