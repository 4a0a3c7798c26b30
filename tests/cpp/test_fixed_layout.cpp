// FixedLayout (fixed_layout.hpp): every size class in fixed segments, even over an
// upstream that offers virtual memory (host memory here).
#include "gpukeeper/memory/fixed_layout.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::FixedLayout;
using gpukeeper::SegmentSnapshot;
using gpukeeper::SegmentSource;

TEST_CASE("fixed layout: every size class from fixed segments", "[caching_pool]") {
  const FixedLayout layout;
  CHECK(layout.id() == SegmentLayout::fixed);
  CHECK(layout.source(true) == SegmentSource::fixed);
  CHECK(layout.source(false) == SegmentSource::fixed);
  CHECK_FALSE(layout.uses_expandable());

  auto pool = make_pool(ResourceKind::host, fixed_segments());
  CHECK(pool->options().segments == SegmentLayout::fixed);
  void* small = pool->allocate(4096);
  void* large = pool->allocate(5 * MiB);
  std::size_t segments = 0;
  for (const SegmentSnapshot& seg : pool->snapshot()) {
    ++segments;
    CHECK_FALSE(seg.expandable);
    CHECK(seg.mapped_bytes == seg.size);  // a fixed segment is all memory
    CHECK(seg.size == (seg.small ? PoolOptions{}.small_segment : PoolOptions{}.large_segment));
  }
  CHECK(segments == 2);
  CHECK(pool->stats().reserved_bytes == PoolOptions{}.small_segment + PoolOptions{}.large_segment);
  CHECK(pool->stats().pages_moved == 0);
  pool->deallocate(small);
  pool->deallocate(large);
  CHECK(pool->emergency_cleanup() == PoolOptions{}.small_segment + PoolOptions{}.large_segment);
  CHECK(pool->validate() == "");
}
