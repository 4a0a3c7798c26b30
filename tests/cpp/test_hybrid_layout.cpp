// HybridLayout (hybrid_layout.hpp): requests over small_size in expandable ranges, small
// ones in fixed segments, over host virtual memory (2 MiB pages, as CUDA's granularity).
#include <vector>

#include "gpukeeper/memory/hybrid_layout.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::HybridLayout;
using gpukeeper::SegmentSnapshot;
using gpukeeper::SegmentSource;

namespace {

PoolOptions hybrid_options() {
  PoolOptions options;
  options.segments = SegmentLayout::hybrid;
  options.expandable_range = 256 * MiB;
  options.expandable_slack = 0.03;
  return options;
}

}  // namespace

TEST_CASE("hybrid layout: small requests from fixed segments, the rest from expandable ranges",
          "[caching_pool]") {
  const HybridLayout layout;
  CHECK(layout.id() == SegmentLayout::hybrid);
  CHECK(layout.source(true) == SegmentSource::fixed);
  CHECK(layout.source(false) == SegmentSource::expandable);
  CHECK(layout.uses_expandable());
  auto pool = make_pool(ResourceKind::host, hybrid_options());
  CHECK(pool->options().segments == SegmentLayout::hybrid);
}

TEST_CASE("hybrid layout: small requests in fixed segments, large ones in a range",
          "[caching_pool]") {
  auto pool = make_pool(ResourceKind::host, hybrid_options());
  void* small = pool->allocate(4096);
  void* large = pool->allocate(5 * MiB);
  std::vector<SegmentSnapshot> segments = pool->snapshot();
  REQUIRE(segments.size() == 2);
  std::size_t fixed = 0, expandable = 0;
  for (const SegmentSnapshot& seg : segments) {
    if (seg.expandable) {
      CHECK_FALSE(seg.small);
      expandable += seg.mapped_bytes;
    } else {
      CHECK(seg.small);
      CHECK(seg.size == PoolOptions{}.small_segment);
      fixed += seg.size;
    }
  }
  CHECK(fixed == 2 * MiB);
  CHECK(expandable == 6 * MiB);  // three 2 MiB pages under 5 MiB
  gpukeeper::PoolStats s = pool->stats();
  CHECK(s.reserved_bytes == fixed + expandable);
  CHECK(s.peak_reserved_bytes == fixed + expandable);
  CHECK(s.upstream_allocations == 1 + 3);  // the small segment and three pages
  CHECK(pool->history().device_allocs == 1 + 3);
  gpukeeper::PoolHistory h = pool->history();
  CHECK(h.reserved_bytes.small.current == fixed);
  CHECK(h.reserved_bytes.large.current == expandable);
  CHECK(pool->validate() == "");

  // A limit counts both kinds of memory: with 8 MiB reserved and a 9 MiB limit, the page
  // more that 3 MiB needs is refused.
  pool->set_limit(9 * MiB);
  CHECK_THROWS_AS(pool->allocate(3 * MiB), gpukeeper::AllocationError);
  CHECK(pool->validate() == "");
  pool->set_limit(0);

  pool->deallocate(small);
  pool->deallocate(large);
  CHECK(pool->trim(2 * MiB) > 0);  // pages first, down to what the fixed segment leaves
  CHECK(pool->stats().reserved_bytes <= 2 * MiB);
  pool->emergency_cleanup();
  CHECK(pool->stats().reserved_bytes == 0);
  CHECK(pool->validate() == "");
}
