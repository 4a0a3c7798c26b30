// The caching pool's behaviour, run over every kind of upstream this machine has: plain
// host memory always; device, async and pinned memory where CUDA is usable.
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "test_support.hpp"

using namespace gktest;

namespace {

// The default options, spelled out: the tests below depend on these sizes.
// These cases are about fixed segments, with the default sizes.
PoolOptions fixed_options() {
  PoolOptions o = fixed_segments();
  REQUIRE(o.small_size == 1 * MiB);
  REQUIRE(o.small_segment == 2 * MiB);
  REQUIRE(o.large_segment == 20 * MiB);
  REQUIRE(o.large_cutoff == 10 * MiB);
  REQUIRE(o.segment_granularity == 2 * MiB);
  REQUIRE(o.max_pool_size == 0);
  return o;
}

bool inside(const void* p, const void* base, std::size_t size) {
  return addr(p) >= addr(base) && addr(p) < addr(base) + size;
}

}  // namespace

#define GK_FOR_EACH_KIND()                                                                   \
  const ResourceKind kind =                                                                  \
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned); \
  INFO("memory kind: " << gpukeeper::to_string(kind));                                      \
  GK_SKIP_UNLESS_USABLE(kind)

TEST_CASE("pool: blocks are 256-byte aligned, disjoint, and counted rounded up",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  REQUIRE(pool->kind() == kind);
  REQUIRE(pool->device() == 0);
  const std::vector<std::size_t> sizes = {1,       255,         256,         257,     1000,
                                          4096,    1 * MiB - 1, 1 * MiB,     1 * MiB + 1,
                                          3 * MiB + 5, 11 * MiB, 64 * KiB + 3};
  std::vector<void*> ptrs;
  std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
  std::size_t allocated = 0, requested = 0;
  for (std::size_t size : sizes) {
    INFO("size " << size);
    void* p = pool->allocate(size);
    REQUIRE(p != nullptr);
    REQUIRE(addr(p) % CachingPool::kAlignment == 0);
    REQUIRE(pool->owns(p));
    REQUIRE(pool->requested_size(p) == size);
    allocated += round_up(size);
    requested += size;
    ptrs.push_back(p);
    ranges.emplace_back(addr(p), round_up(size));
    PoolStats s = pool->stats();
    REQUIRE(s.allocated_bytes == allocated);
    REQUIRE(s.requested_bytes == requested);
    REQUIRE(s.allocated_count == ptrs.size());
    REQUIRE(s.reserved_bytes >= s.allocated_bytes);
    REQUIRE(s.cached_bytes == s.reserved_bytes - s.allocated_bytes);
  }
  REQUIRE(find_overlap(ranges) == "");
  REQUIRE(pool->validate() == "");

  if (pool->upstream().host_accessible()) {
    // Every byte of every block is ours: fill each with its own value, then read all back.
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
      std::memset(ptrs[i], static_cast<int>(i + 1), sizes[i]);
    }
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
      const auto* bytes = static_cast<const unsigned char*>(ptrs[i]);
      std::size_t wrong = 0;
      for (std::size_t j = 0; j < sizes[i]; ++j) wrong += bytes[j] != static_cast<unsigned char>(i + 1);
      INFO("block " << i << " of " << sizes[i] << " bytes");
      REQUIRE(wrong == 0);
    }
  }

  for (void* p : ptrs) pool->deallocate(p);
  PoolStats s = pool->stats();
  REQUIRE(s.allocated_bytes == 0);
  REQUIRE(s.allocated_count == 0);
  REQUIRE(s.requested_bytes == 0);
  REQUIRE(s.cached_bytes == s.reserved_bytes);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("pool: a same-size request after a free is a cache hit with the same pointer",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  const std::size_t size = GENERATE(std::size_t{256}, 64 * KiB, 1 * MiB, 4 * MiB, 12 * MiB);
  INFO("size " << size);
  void* p = pool->allocate(size);
  pool->deallocate(p);
  const PoolStats before = pool->stats();
  void* q = pool->allocate(size);
  const PoolStats after = pool->stats();
  REQUIRE(q == p);
  REQUIRE(after.cache_hits == before.cache_hits + 1);
  REQUIRE(after.cache_misses == before.cache_misses);
  REQUIRE(after.upstream_allocations == before.upstream_allocations);
  REQUIRE(after.reserved_bytes == before.reserved_bytes);
  REQUIRE(after.allocated_bytes == round_up(size));
  pool->deallocate(q);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("pool: blocks split from one segment merge back into one free block",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  void* a = pool->allocate(4 * KiB);
  void* b = pool->allocate(4 * KiB);
  void* c = pool->allocate(4 * KiB);
  // A fresh pool carves them one after another from one small segment.
  REQUIRE(addr(b) == addr(a) + 4 * KiB);
  REQUIRE(addr(c) == addr(b) + 4 * KiB);
  PoolStats s = pool->stats();
  REQUIRE(s.segment_count == 1);
  REQUIRE(s.reserved_bytes == 2 * MiB);
  REQUIRE(s.upstream_allocations == 1);
  REQUIRE(s.largest_free_block == 2 * MiB - 12 * KiB);

  pool->deallocate(b);  // a hole between two live blocks
  s = pool->stats();
  REQUIRE(s.cached_bytes == 2 * MiB - 8 * KiB);
  REQUIRE(s.largest_free_block == 2 * MiB - 12 * KiB);
  // 1 - largest free block / cached bytes: the 4 KiB hole is not part of the largest block.
  REQUIRE(near(s.fragmentation(), 1.0 - double(2 * MiB - 12 * KiB) / double(2 * MiB - 8 * KiB)));
  REQUIRE(pool->validate() == "");

  pool->deallocate(a);  // merges with b: an 8 KiB block at a
  REQUIRE(pool->validate() == "");
  void* ab = pool->allocate(8 * KiB);
  REQUIRE(ab == a);
  pool->deallocate(ab);

  pool->deallocate(c);  // merges a+b, c and the tail: the whole segment is one block
  s = pool->stats();
  REQUIRE(s.allocated_bytes == 0);
  REQUIRE(s.segment_count == 1);
  REQUIRE(s.cached_bytes == 2 * MiB);
  REQUIRE(s.largest_free_block == 2 * MiB);
  REQUIRE(s.fragmentation() == 0.0);
  REQUIRE(pool->validate() == "");
  // The largest small request gets the front of the merged segment.
  void* big = pool->allocate(1 * MiB);
  REQUIRE(big == a);
  pool->deallocate(big);
  REQUIRE(pool->stats().upstream_allocations == 1);
}

TEST_CASE("pool: blocks freed in any order tile their segment and come back whole",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  const unsigned seed = GENERATE(1u, 2u, 3u);
  std::mt19937 rng(seed);
  std::vector<void*> ptrs;
  for (int i = 0; i < 8; ++i) ptrs.push_back(pool->allocate(256 * KiB));  // fills 2 MiB exactly
  REQUIRE(pool->stats().segment_count == 1);
  REQUIRE(pool->stats().largest_free_block == 0);
  std::shuffle(ptrs.begin(), ptrs.end(), rng);
  for (void* p : ptrs) {
    pool->deallocate(p);
    REQUIRE(pool->validate() == "");
  }
  PoolStats s = pool->stats();
  REQUIRE(s.largest_free_block == 2 * MiB);
  REQUIRE(s.cached_bytes == 2 * MiB);
  REQUIRE(s.segment_count == 1);
}

TEST_CASE("pool: small requests never come from large segments, nor large from small",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());

  SECTION("a cached large segment does not serve small requests") {
    void* large = pool->allocate(4 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 20 * MiB);
    pool->deallocate(large);  // 20 MiB cached, one free block
    const std::size_t misses = pool->stats().cache_misses;
    std::vector<void*> small;
    for (std::size_t size : {std::size_t{256}, 4 * KiB, 100 * KiB, 1 * MiB}) {
      void* p = pool->allocate(size);
      INFO("small request of " << size);
      REQUIRE_FALSE(inside(p, large, 20 * MiB));
      small.push_back(p);
    }
    PoolStats s = pool->stats();
    REQUIRE(s.cache_misses == misses + 1);  // one new small segment for all of them
    REQUIRE(s.segment_count == 2);
    REQUIRE(s.reserved_bytes == 22 * MiB);
    for (void* p : small) pool->deallocate(p);
    // The large segment is still one 20 MiB block.
    REQUIRE(pool->stats().largest_free_block == 20 * MiB);
    REQUIRE(pool->validate() == "");
  }
  SECTION("a cached small segment does not serve large requests") {
    void* small = pool->allocate(4 * KiB);
    pool->deallocate(small);  // 2 MiB cached
    void* large = pool->allocate(1 * MiB + 256);
    REQUIRE_FALSE(inside(large, small, 2 * MiB));
    REQUIRE(pool->stats().segment_count == 2);
    pool->deallocate(large);
    REQUIRE(pool->validate() == "");
  }
}

TEST_CASE("pool: segment sizes follow the options", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  // Large requests up to large_cutoff share large_segment-sized segments...
  void* a = pool->allocate(3 * MiB);
  void* b = pool->allocate(3 * MiB);
  PoolStats s = pool->stats();
  REQUIRE(s.reserved_bytes == 20 * MiB);
  REQUIRE(s.upstream_allocations == 1);
  REQUIRE(addr(b) == addr(a) + 3 * MiB);
  // ... bigger ones get their own, rounded to segment_granularity (unless a cached block
  // fits: 11 MiB fits in the 14 MiB left of the first segment).
  void* c = pool->allocate(15 * MiB + 1);
  s = pool->stats();
  REQUIRE(s.reserved_bytes == 20 * MiB + 16 * MiB);
  REQUIRE(s.segment_count == 2);
  void* d = pool->allocate(11 * MiB);
  REQUIRE(addr(d) == addr(b) + 3 * MiB);
  REQUIRE(pool->stats().segment_count == 2);
  pool->deallocate(d);
  for (void* p : {a, b, c}) pool->deallocate(p);

  SECTION("custom options") {
    PoolOptions o = fixed_options();
    o.small_size = 64 * KiB;
    o.small_segment = 512 * KiB;
    o.large_segment = 4 * MiB;
    o.large_cutoff = 2 * MiB;
    o.segment_granularity = 1 * MiB;
    auto custom = make_pool(kind, o);
    void* x = custom->allocate(64 * KiB);        // small
    void* y = custom->allocate(64 * KiB + 1);    // large, up to the cutoff
    void* z = custom->allocate(4 * MiB + 1);     // large beyond the cutoff: 5 MiB
    PoolStats t = custom->stats();
    REQUIRE(t.segment_count == 3);
    REQUIRE(t.reserved_bytes == 512 * KiB + 4 * MiB + 5 * MiB);
    for (void* p : {x, y, z}) custom->deallocate(p);
    REQUIRE(custom->validate() == "");
  }
}

TEST_CASE("pool: emergency_cleanup returns free segments and keeps those in use",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  REQUIRE(pool->emergency_cleanup() == 0);

  void* kept = pool->allocate(4 * KiB);  // keeps its 2 MiB small segment
  void* large = pool->allocate(4 * MiB);  // 20 MiB segment
  void* huge = pool->allocate(18 * MiB);  // 18 MiB segment (the 16 MiB tail is too small)
  pool->deallocate(large);
  pool->deallocate(huge);
  REQUIRE(pool->stats().reserved_bytes == 40 * MiB);
  REQUIRE(pool->stats().segment_count == 3);

  REQUIRE(pool->emergency_cleanup() == 38 * MiB);
  PoolStats s = pool->stats();
  REQUIRE(s.reserved_bytes == 2 * MiB);
  REQUIRE(s.segment_count == 1);
  REQUIRE(s.allocated_count == 1);
  REQUIRE(s.upstream_frees == 2);
  REQUIRE(pool->owns(kept));
  REQUIRE(pool->validate() == "");
  if (pool->upstream().host_accessible()) std::memset(kept, 7, 4 * KiB);

  pool->deallocate(kept);
  REQUIRE(pool->emergency_cleanup() == 2 * MiB);
  s = pool->stats();
  REQUIRE(s.reserved_bytes == 0);
  REQUIRE(s.segment_count == 0);
  REQUIRE(s.cached_bytes == 0);
  REQUIRE(s.largest_free_block == 0);
  REQUIRE(s.upstream_frees == s.upstream_allocations);
  REQUIRE(pool->validate() == "");
  REQUIRE(pool->emergency_cleanup() == 0);

  // The pool works as before afterwards.
  void* again = pool->allocate(4 * KiB);
  REQUIRE(pool->stats().reserved_bytes == 2 * MiB);
  pool->deallocate(again);
}

TEST_CASE("pool: trim releases free segments down to the bytes to keep", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  void* p[3];
  for (auto& x : p) x = pool->allocate(12 * MiB);  // three 12 MiB segments
  REQUIRE(pool->stats().reserved_bytes == 36 * MiB);

  SECTION("all free") {
    for (auto x : p) pool->deallocate(x);
    REQUIRE(pool->trim(36 * MiB) == 0);
    REQUIRE(pool->trim(30 * MiB) == 12 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 24 * MiB);
    REQUIRE(pool->trim(24 * MiB) == 0);
    REQUIRE(pool->trim(13 * MiB) == 12 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 12 * MiB);
    REQUIRE(pool->trim(0) == 12 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 0);
    REQUIRE(pool->stats().segment_count == 0);
  }
  SECTION("live blocks stay") {
    pool->deallocate(p[0]);
    pool->deallocate(p[2]);
    REQUIRE(pool->trim(0) == 24 * MiB);
    PoolStats s = pool->stats();
    REQUIRE(s.reserved_bytes == 12 * MiB);
    REQUIRE(s.allocated_bytes == 12 * MiB);
    REQUIRE(pool->owns(p[1]));
    pool->deallocate(p[1]);
  }
  REQUIRE(pool->validate() == "");
}

TEST_CASE("pool: a limit stops growth, not reuse", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  pool->set_limit(24 * MiB);
  REQUIRE(pool->limit() == 24 * MiB);
  REQUIRE(pool->stats().limit_bytes == 24 * MiB);

  void* a = pool->allocate(12 * MiB);
  void* b = pool->allocate(12 * MiB);
  REQUIRE(pool->stats().reserved_bytes == 24 * MiB);

  Books full(pool->stats());
  REQUIRE_THROWS_AS(pool->allocate(12 * MiB), AllocationError);
  REQUIRE_THROWS_AS(pool->allocate(4 * KiB), AllocationError);  // no room for any segment
  REQUIRE_THROWS_AS(pool->allocate(32 * MiB), AllocationError);  // beyond the limit itself
  GK_REQUIRE_BALANCED(pool, full);
  REQUIRE(pool->stats().oom_events >= 3);

  pool->deallocate(a);
  void* c = pool->allocate(12 * MiB);  // the cached block
  REQUIRE(c == a);

  // A limit below what is allocated is refused and changes nothing.
  Books before(pool->stats());
  REQUIRE_THROWS_AS(pool->set_limit(12 * MiB), InvalidInputError);
  REQUIRE(pool->limit() == 24 * MiB);
  GK_REQUIRE_BALANCED(pool, before);

  // Lowering the limit releases cached segments to get under it.
  pool->deallocate(c);
  pool->set_limit(12 * MiB);
  PoolStats s = pool->stats();
  REQUIRE(s.limit_bytes == 12 * MiB);
  REQUIRE(s.reserved_bytes == 12 * MiB);  // b's segment
  REQUIRE_THROWS_AS(pool->allocate(256), AllocationError);
  pool->deallocate(b);
  void* d = pool->allocate(12 * MiB);
  REQUIRE(d == b);
  pool->deallocate(d);

  // Zero removes the limit.
  pool->set_limit(0);
  REQUIRE(pool->limit() == 0);
  std::vector<void*> many;
  for (int i = 0; i < 4; ++i) many.push_back(pool->allocate(12 * MiB));
  REQUIRE(pool->stats().reserved_bytes == 48 * MiB);
  for (void* p : many) pool->deallocate(p);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("pool: a limit in the options works as set_limit", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  PoolOptions o = fixed_options();
  o.max_pool_size = 16 * MiB;
  auto pool = make_pool(kind, o);
  REQUIRE(pool->limit() == 16 * MiB);
  void* a = pool->allocate(3 * MiB);  // the 20 MiB segment does not fit: 3 MiB exactly
  REQUIRE(pool->stats().reserved_bytes == 3 * MiB);
  void* b = pool->allocate(12 * MiB);
  REQUIRE_THROWS_AS(pool->allocate(2 * MiB), AllocationError);
  pool->deallocate(a);
  pool->deallocate(b);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("pool: peaks follow the highest usage until reset", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  void* a = pool->allocate(3 * MiB);
  void* b = pool->allocate(5 * MiB);
  PoolStats s = pool->stats();
  REQUIRE(s.peak_allocated_bytes == 8 * MiB);
  REQUIRE(s.peak_reserved_bytes == 20 * MiB);
  pool->deallocate(b);
  s = pool->stats();
  REQUIRE(s.allocated_bytes == 3 * MiB);
  REQUIRE(s.peak_allocated_bytes == 8 * MiB);
  pool->emergency_cleanup();  // a is live: nothing released
  void* c = pool->allocate(18 * MiB);  // its own segment: 17 MiB are free in the first
  pool->deallocate(c);
  pool->emergency_cleanup();
  s = pool->stats();
  REQUIRE(s.reserved_bytes == 20 * MiB);
  REQUIRE(s.peak_reserved_bytes == 38 * MiB);
  REQUIRE(s.peak_allocated_bytes == 21 * MiB);

  pool->reset_peaks();
  s = pool->stats();
  REQUIRE(s.peak_allocated_bytes == 3 * MiB);
  REQUIRE(s.peak_reserved_bytes == 20 * MiB);
  void* d = pool->allocate(1 * MiB + 256);  // same large segment
  s = pool->stats();
  REQUIRE(s.peak_allocated_bytes == 4 * MiB + 256);
  REQUIRE(s.peak_reserved_bytes == 20 * MiB);
  pool->deallocate(d);
  pool->deallocate(a);
  REQUIRE(pool->stats().peak_allocated_bytes == 4 * MiB + 256);
}

TEST_CASE("pool: memory_pressure is reserved / limit with a limit", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  double unlimited = pool->memory_pressure();
  REQUIRE(unlimited >= 0.0);
  REQUIRE(unlimited <= 1.0);

  pool->set_limit(100 * MiB);
  REQUIRE(pool->memory_pressure() == 0.0);
  void* a = pool->allocate(3 * MiB);  // 20 MiB segment
  REQUIRE(near(pool->memory_pressure(), 0.2));
  void* b = pool->allocate(30 * MiB);
  REQUIRE(near(pool->memory_pressure(), 0.5));
  pool->deallocate(b);
  REQUIRE(near(pool->memory_pressure(), 0.5));  // cached bytes still count
  pool->emergency_cleanup();
  REQUIRE(near(pool->memory_pressure(), 0.2));
  pool->set_limit(20 * MiB);
  REQUIRE(pool->memory_pressure() == 1.0);
  pool->set_limit(0);
  REQUIRE(pool->memory_pressure() >= 0.0);
  REQUIRE(pool->memory_pressure() <= 1.0);
  pool->deallocate(a);
}

TEST_CASE("pool: owns and requested_size know live blocks only", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  void* p = pool->allocate(1000);
  REQUIRE(pool->owns(p));
  REQUIRE_FALSE(pool->owns(static_cast<char*>(p) + 256));  // inside, not a block start
  REQUIRE_FALSE(pool->owns(nullptr));
  REQUIRE(pool->requested_size(p) == 1000);
  REQUIRE_THROWS_AS(pool->requested_size(static_cast<char*>(p) + 256), InvalidInputError);
  pool->deallocate(p);
  REQUIRE_FALSE(pool->owns(p));
  REQUIRE_THROWS_AS(pool->requested_size(p), InvalidInputError);
}

TEST_CASE("pool: hit, miss and upstream counters", "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind, fixed_options());
  PoolStats s = pool->stats();
  REQUIRE(s.cache_hits == 0);
  REQUIRE(s.cache_misses == 0);
  REQUIRE(s.upstream_allocations == 0);
  void* a = pool->allocate(4 * KiB);  // miss: new segment
  void* b = pool->allocate(4 * KiB);  // hit: the segment's tail
  pool->deallocate(a);
  void* c = pool->allocate(4 * KiB);  // hit
  s = pool->stats();
  REQUIRE(s.cache_misses == 1);
  REQUIRE(s.cache_hits == 2);
  REQUIRE(s.upstream_allocations == 1);
  REQUIRE(s.upstream_frees == 0);
  REQUIRE(s.oom_events == 0);
  REQUIRE(s.callback_errors == 0);
  pool->deallocate(b);
  pool->deallocate(c);
  pool->emergency_cleanup();
  REQUIRE(pool->stats().upstream_frees == 1);
}

TEST_CASE("pool: the upstream gets back exactly what it gave, also at destruction",
          "[caching_pool]") {
  GK_FOR_EACH_KIND();
  auto upstream = std::make_unique<TestUpstream>(0, gpukeeper::make_resource(kind, 0));
  std::shared_ptr<UpstreamLog> log = upstream->log();
  auto pool = std::make_shared<CachingPool>(std::move(upstream), fixed_options());
  std::vector<void*> live;
  for (std::size_t size : {std::size_t{100}, 2 * MiB, 5 * MiB, 30 * MiB, 700 * KiB}) {
    live.push_back(pool->allocate(size, /*stream=*/0));
  }
  pool->deallocate(live[1]);
  pool->deallocate(live[3]);
  REQUIRE(pool->emergency_cleanup() > 0);
  REQUIRE(log->used_now() == pool->stats().reserved_bytes);
  // Blocks 0, 2 and 4 are never returned: the pool's destructor still frees their segments.
  pool.reset();
  std::lock_guard<std::mutex> lock(log->mutex);
  INFO((log->contract_breaches.empty() ? std::string() : log->contract_breaches.front()));
  REQUIRE(log->contract_breaches.empty());
  REQUIRE(log->outstanding.empty());
  REQUIRE(log->used == 0);
  REQUIRE(log->deallocations == log->allocations);
}
