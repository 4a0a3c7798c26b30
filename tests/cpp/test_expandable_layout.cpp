// ExpandableLayout (expandable_layout.hpp): every size class in expandable ranges, over
// host virtual memory (2 MiB pages, as CUDA's granularity). The ranges themselves, shared
// with the hybrid layout, are tested in test_caching_pool_expandable.cpp.
#include "gpukeeper/memory/expandable_layout.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::ExpandableLayout;
using gpukeeper::SegmentSnapshot;
using gpukeeper::SegmentSource;

TEST_CASE("expandable layout: every size class from expandable ranges", "[caching_pool]") {
  const ExpandableLayout layout;
  CHECK(layout.id() == SegmentLayout::expandable);
  CHECK(layout.source(true) == SegmentSource::expandable);
  CHECK(layout.source(false) == SegmentSource::expandable);
  CHECK(layout.uses_expandable());

  PoolOptions options;
  options.segments = SegmentLayout::expandable;
  options.expandable_range = 256 * MiB;
  auto pool = make_pool(ResourceKind::host, options);
  CHECK(pool->options().segments == SegmentLayout::expandable);
  void* small = pool->allocate(4096);
  void* large = pool->allocate(5 * MiB);
  std::size_t ranges = 0, mapped = 0;
  for (const SegmentSnapshot& seg : pool->snapshot()) {
    ++ranges;
    CHECK(seg.expandable);  // one range per size class, small ones too
    mapped += seg.mapped_bytes;
  }
  CHECK(ranges == 2);
  CHECK(mapped == 2 * MiB + 6 * MiB);  // a page under 4 KiB, three under 5 MiB
  CHECK(pool->stats().reserved_bytes == mapped);
  pool->deallocate(small);
  pool->deallocate(large);
  pool->emergency_cleanup();
  CHECK(pool->stats().reserved_bytes == 0);
  CHECK(pool->validate() == "");
}
