// Expandable ranges, the part of a pool that layouts with expandable size classes share
// (caching_pool_expandable.cpp), over host virtual memory (2 MiB pages, as CUDA's
// granularity): mapped-first placement (a warm pool reuses mapped pages before moving any),
// repeated steps that stop moving pages once warm (lowest-first placement of blocks over a
// page, and its fallback when that layout cycles), the spare-page budget, and giving pages
// back. Each layout's own test is beside its type
// (test_fixed_layout.cpp, test_expandable_layout.cpp, test_hybrid_layout.cpp).
#include <vector>

#include "test_support.hpp"

using namespace gktest;
using gpukeeper::SegmentSnapshot;

namespace {

PoolOptions expandable_options(bool small_too, double slack) {
  PoolOptions options;
  options.segments = small_too ? SegmentLayout::expandable : SegmentLayout::hybrid;
  options.expandable_range = 256 * MiB;
  options.expandable_slack = slack;
  return options;
}

}  // namespace

TEST_CASE("expandable: a warm pool places a block on mapped pages before moving any",
          "[caching_pool]") {
  // slack 0: every page beyond the most that live blocks touched at once is moved, never
  // made, so the set-up below strips the pages from under one free block.
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.0));
  void* a = pool->allocate(6 * MiB);    // pages 0-2
  void* sep1 = pool->allocate(2 * MiB); // page 3
  void* b = pool->allocate(10 * MiB);   // pages 4-8
  void* sep2 = pool->allocate(2 * MiB); // page 9
  pool->deallocate(a);                  // pages 0-2 stay mapped, free to move
  void* c = pool->allocate(8 * MiB);    // does not fit where a was: new address, moved pages
  REQUIRE(pool->stats().pages_moved > 0);
  pool->deallocate(b);                  // pages 4-8 stay mapped under the free block
  const gpukeeper::PoolStats before = pool->stats();

  // Best fit would take a's old place (6 MiB, its pages gone) and move pages back; the
  // block goes where pages are mapped instead, and nothing is mapped or moved.
  void* d = pool->allocate(5 * MiB);
  CHECK(d == b);
  const gpukeeper::PoolStats after = pool->stats();
  CHECK(after.pages_moved == before.pages_moved);
  CHECK(after.upstream_allocations == before.upstream_allocations);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(pool->validate() == "");
  for (void* p : {sep1, sep2, c, d}) pool->deallocate(p);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: a page that must move is taken from the top of the range",
          "[caching_pool]") {
  // slack 0: once the pages held reach the most live blocks touched, every page more is
  // moved. Pages stay packed low, where placement looks first, so the low free block
  // keeps a mapped page and a small request lands there without a move.
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.0));
  void* a = pool->allocate(4 * MiB);     // pages 0-1
  void* sep1 = pool->allocate(2 * MiB);  // page 2
  void* b = pool->allocate(4 * MiB);     // pages 3-4
  void* sep2 = pool->allocate(2 * MiB);  // page 5
  pool->deallocate(a);
  pool->deallocate(b);
  void* c = pool->allocate(6 * MiB);  // fits no hole: pages 6-8, moved from 4, 3 and 1
  CHECK(pool->stats().pages_moved == 3);
  const gpukeeper::PoolStats before = pool->stats();

  // Page 0 is still mapped (a queue of freed pages would have moved it first).
  void* d = pool->allocate(2 * MiB);
  CHECK(d == a);
  const gpukeeper::PoolStats after = pool->stats();
  CHECK(after.pages_moved == before.pages_moved);
  CHECK(after.upstream_allocations == before.upstream_allocations);
  CHECK(pool->validate() == "");
  for (void* p : {sep1, sep2, c, d}) pool->deallocate(p);
  CHECK(pool->validate() == "");
  pool->emergency_cleanup();
  CHECK(pool->stats().reserved_bytes == 0);
}

TEST_CASE("expandable: with no mapped block, the one needing the fewest pages is taken",
          "[caching_pool]") {
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.0));
  void* y = pool->allocate(8 * MiB);     // pages 0-3
  void* sep1 = pool->allocate(2 * MiB);  // page 4
  void* x = pool->allocate(6 * MiB);     // pages 5-7
  void* sep2 = pool->allocate(2 * MiB);  // page 8
  pool->deallocate(x);
  pool->deallocate(y);
  void* z = pool->allocate(12 * MiB);  // pages 9-14, moved from 7, 6, 5, 3, 2 and 1
  CHECK(pool->stats().pages_moved == 6);
  const gpukeeper::PoolStats before = pool->stats();

  // Best fit would take x's hole (6 MiB, no page mapped: three to map); y's hole has its
  // first page mapped, so only two are mapped there.
  void* w = pool->allocate(6 * MiB);
  CHECK(w == y);
  const gpukeeper::PoolStats after = pool->stats();
  CHECK((after.pages_moved - before.pages_moved) +
            (after.upstream_allocations - before.upstream_allocations) == 2);
  CHECK(pool->validate() == "");
  for (void* p : {sep1, sep2, z, w}) pool->deallocate(p);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: repeated steps of drifting sizes stop moving pages once warm",
          "[caching_pool]") {
  // Two blocks live across steps (each freed once the next step's block of its kind is
  // placed), at sizes that drift with a step's length: short, long, long, short. slack 0:
  // no spare page, so a block that lands off the mapped pages moves some. Placed by size
  // (the smallest mapped fit), the large block and its free neighbour swap places as the
  // sizes drift, and pages followed them 60 times in the 48 steps below; placed in the
  // lowest free block on mapped pages, each step finds the layout the one before left.
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.0));
  const std::size_t shorter[2] = {9 * MiB + 576 * KiB, 1 * MiB + 960 * KiB};
  const std::size_t longer[2] = {10 * MiB + 576 * KiB, 2 * MiB + 128 * KiB};
  void* held[2] = {nullptr, nullptr};
  std::uint64_t warm = 0;
  for (int step = 0; step < 64; ++step) {
    if (step == 16) warm = pool->stats().pages_moved;
    const std::size_t* sizes = step % 4 == 1 || step % 4 == 2 ? longer : shorter;
    for (int i = 0; i < 2; ++i) {
      void* p = pool->allocate(sizes[i]);
      if (held[i] != nullptr) pool->deallocate(held[i]);
      held[i] = p;
    }
  }
  CHECK(pool->stats().pages_moved == warm);
  CHECK(pool->validate() == "");
  for (void* p : held) pool->deallocate(p);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: a step pattern whose lowest-first layout cycles stops moving pages",
          "[caching_pool]") {
  // Per step, at a length that repeats every nine steps: x (about 4 MiB), y (11 MiB) and
  // z (8 MiB); z lives until the next step's z is placed. The default slack. Lowest-first
  // alone settles into a cycle one page short, which moves a page on every step for good;
  // placement by size moved 13 pages in the last 40 steps. Found cycling, a class goes
  // back to size order (PlacementGuard), and the layout then holds still.
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.045));
  const std::size_t x_size[3] = {3 * MiB + 640 * KiB, 4 * MiB + 64 * KiB, 4 * MiB + 448 * KiB};
  const std::size_t y_size[3] = {9 * MiB + 960 * KiB, 11 * MiB + 64 * KiB, 12 * MiB + 128 * KiB};
  const std::size_t z_size[3] = {7 * MiB + 256 * KiB, 8 * MiB + 64 * KiB, 8 * MiB + 832 * KiB};
  const int length[9] = {0, 1, 2, 1, 2, 0, 2, 0, 1};
  void* z_held = nullptr;
  std::uint64_t warm = 0;
  for (int step = 0; step < 80; ++step) {
    if (step == 40) warm = pool->stats().pages_moved;
    const int l = length[step % 9];
    void* x = pool->allocate(x_size[l]);
    void* y = pool->allocate(y_size[l]);
    void* z = pool->allocate(z_size[l]);
    if (z_held != nullptr) pool->deallocate(z_held);
    pool->deallocate(y);
    pool->deallocate(x);
    z_held = z;
  }
  CHECK(pool->stats().pages_moved == warm);
  CHECK(pool->validate() == "");
  pool->deallocate(z_held);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: new pages while reserved stays within the slack over the peak requested",
          "[caching_pool]") {
  // z needs three pages past the live peak while two pages lie free; the requested peak
  // becomes 12 MiB, six pages' worth. The budget, (1 + slack) x 12 MiB, decides how many
  // of the three are made and how many moved.
  struct Case {
    double slack;
    std::uint64_t moved;
  };
  for (Case c : {Case{0.0, 2}, Case{0.25, 1}, Case{1.0, 0}}) {
    CAPTURE(c.slack);
    auto pool = make_pool(ResourceKind::host, expandable_options(false, c.slack));
    void* x = pool->allocate(4 * MiB);    // pages 0-1
    void* sep = pool->allocate(2 * MiB);  // page 2
    void* y = pool->allocate(4 * MiB);    // pages 3-4
    pool->deallocate(x);                  // pages 0-1 free to move; 6 MiB requested
    void* z = pool->allocate(6 * MiB);    // fits no hole: pages 5-7
    const gpukeeper::PoolStats s = pool->stats();
    CHECK(s.pages_moved == c.moved);
    CHECK(s.reserved_bytes == (5 + 3 - c.moved) * 2 * MiB);
    CHECK(static_cast<double>(s.peak_reserved_bytes) <= (1.0 + c.slack) * 12.0 * MiB);
    CHECK(pool->validate() == "");
    for (void* p : {sep, y, z}) pool->deallocate(p);
    CHECK(pool->validate() == "");
  }
}

TEST_CASE("expandable: a refused request gives back the pages and the range it took",
          "[caching_pool]") {
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.03));
  pool->set_limit(4 * MiB);
  const Books before(pool->stats());
  // Two of its four pages fit the limit: they are made, then given back with the range.
  CHECK_THROWS_AS(pool->allocate(8 * MiB), gpukeeper::AllocationError);
  GK_REQUIRE_BALANCED(pool, before);
  const gpukeeper::PoolStats s = pool->stats();
  CHECK(s.upstream_allocations > 0);
  CHECK(s.upstream_frees == s.upstream_allocations);
  CHECK(pool->history().limit_rejections >= 1);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: pages made for a cached block are growth that watermarks see",
          "[caching_pool]") {
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.03));
  pool->set_limit(100 * MiB);
  std::vector<double> fired;
  pool->add_watermark(0.5, [&](double pressure) { fired.push_back(pressure); });
  void* a = pool->allocate(12 * MiB);
  void* b = pool->allocate(40 * MiB);  // 52 %: crosses
  REQUIRE(fired.size() == 1);
  pool->deallocate(b);
  REQUIRE(pool->emergency_cleanup() == 40 * MiB);  // b's pages go; its block stays, unmapped
  void* d = pool->allocate(40 * MiB);              // that cached block, its pages made again
  REQUIRE(fired.size() == 2);
  CHECK(near(fired[1], 0.52));
  CHECK(pool->stats().pages_moved == 0);
  pool->deallocate(d);
  pool->deallocate(a);
  CHECK(pool->validate() == "");
}

TEST_CASE("expandable: sharing a block with another process is for device pages only",
          "[caching_pool]") {
  auto pool = make_pool(ResourceKind::host, expandable_options(false, 0.03));
  void* small = pool->allocate(4096);       // a fixed segment
  void* large = pool->allocate(5 * MiB);    // an expandable range
  gpukeeper::CachingPool::SharedPages pages;
  CHECK_FALSE(pool->share_pages(small, pages));  // fixed: CUDA IPC names the segment instead
  CHECK_FALSE(pool->share_pages(static_cast<char*>(large) + 4096, pages));  // no block starts there
  // Host pages are one process's memory: refused with the reason, the books unchanged.
  CHECK_THROWS_AS(pool->share_pages(large, pages), gpukeeper::GpuError);
  CHECK(pool->validate() == "");
  pool->deallocate(large);
  pool->deallocate(small);
  CHECK(pool->validate() == "");
}
