// Out of memory: upstream refusal -> cached segments released -> retry -> reclaim callbacks
// -> retry -> AllocationError that says why. The upstream is TestUpstream (test_support.hpp):
// host memory that refuses anything beyond a set capacity.
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "gpukeeper/core/text.hpp"
#include "test_support.hpp"

using namespace gktest;

namespace {

// The pool's messages give sizes as "7.0 MiB" (and "N B" below 1 KiB).
std::string human(std::size_t bytes) { return gpukeeper::detail::human_bytes(bytes); }

// `label` followed by the amount, in bytes or in the human form.
bool names(const std::string& message, const std::string& label, std::size_t bytes) {
  return contains(message, label + " " + std::to_string(bytes)) ||
         contains(message, label + " " + human(bytes));
}

}  // namespace

TEST_CASE("oom: an upstream refusal releases the cache, and the retry succeeds", "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(8 * MiB, &log);
  std::atomic<int> reclaim_calls{0};
  pool->add_reclaim_callback([&](std::size_t) {
    ++reclaim_calls;
    return std::size_t{0};
  });

  void* a = pool->allocate(6 * MiB);  // the 20 MiB segment is refused; 6 MiB exactly is not
  {
    std::lock_guard<std::mutex> lock(log->mutex);
    REQUIRE(log->requests == std::vector<std::size_t>{20 * MiB, 6 * MiB});
  }
  REQUIRE(pool->stats().reserved_bytes == 6 * MiB);
  pool->deallocate(a);  // cached

  void* b = pool->allocate(7 * MiB);  // needs the cached 6 MiB back first
  PoolStats s = pool->stats();
  REQUIRE(b != nullptr);
  REQUIRE(s.reserved_bytes == 7 * MiB);
  REQUIRE(s.allocated_bytes == 7 * MiB);
  REQUIRE(s.segment_count == 1);
  REQUIRE(s.upstream_frees == 1);
  REQUIRE(s.oom_events == 1);
  REQUIRE(reclaim_calls == 0);  // releasing the cache was enough
  REQUIRE(log->used_now() == 7 * MiB);
  REQUIRE(pool->validate() == "");
  pool->deallocate(b);
}

TEST_CASE("oom: reclaim callbacks run next, and memory they free serves the retry", "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(8 * MiB, &log);
  void* held = pool->allocate(6 * MiB);  // live: releasing the cache cannot help
  std::vector<std::size_t> needed;
  pool->add_reclaim_callback([&](std::size_t n) {
    needed.push_back(n);
    if (held != nullptr) {
      REQUIRE(pool->stats().allocated_bytes == 6 * MiB);  // the pool is usable in here
      pool->deallocate(held);
      held = nullptr;
      return std::size_t{6 * MiB};
    }
    return std::size_t{0};
  });

  SECTION("a bigger request: the freed segment goes back to the upstream, then growth") {
    void* b = pool->allocate(7 * MiB - 100);
    REQUIRE(needed == std::vector<std::size_t>{7 * MiB});  // the rounded size
    PoolStats s = pool->stats();
    REQUIRE(s.allocated_bytes == 7 * MiB);
    REQUIRE(s.reserved_bytes == 7 * MiB);
    REQUIRE(s.upstream_frees == 1);
    REQUIRE(s.oom_events == 1);
    pool->deallocate(b);
  }
  SECTION("the same size: the freed block itself serves the retry") {
    void* old = held;
    void* b = pool->allocate(6 * MiB);
    REQUIRE(needed.size() == 1);
    REQUIRE(b == old);
    REQUIRE(pool->stats().upstream_frees == 0);
    pool->deallocate(b);
  }
  REQUIRE(pool->validate() == "");
  REQUIRE(pool->stats().allocated_count == 0);
}

TEST_CASE("oom: reclaim callbacks also run when the pool's limit refuses growth", "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(0, &log);  // no upstream cap
  pool->set_limit(16 * MiB);
  void* held = pool->allocate(12 * MiB);
  int calls = 0;
  pool->add_reclaim_callback([&](std::size_t) {
    ++calls;
    pool->deallocate(held);
    held = nullptr;
    return std::size_t{12 * MiB};
  });
  void* b = pool->allocate(8 * MiB);
  REQUIRE(calls == 1);
  REQUIRE(held == nullptr);
  PoolStats s = pool->stats();
  REQUIRE(s.allocated_bytes == 8 * MiB);
  REQUIRE(s.reserved_bytes <= 16 * MiB);
  pool->deallocate(b);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("oom: AllocationError says what was asked and what there is", "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(8 * MiB, &log);
  void* held = pool->allocate(7 * MiB);
  int first = 0, second = 0, third = 0;
  std::vector<int> ids;
  ids.push_back(pool->add_reclaim_callback([&](std::size_t) {
    ++first;
    return std::size_t{0};
  }));
  ids.push_back(pool->add_reclaim_callback([&](std::size_t) -> std::size_t {
    ++second;
    throw std::runtime_error("a callback that fails");
  }));
  ids.push_back(pool->add_reclaim_callback([&](std::size_t) {
    ++third;  // still runs after the one that threw
    return std::size_t{1 << 30};  // claims much, frees nothing
  }));
  REQUIRE(ids[0] != ids[1]);
  REQUIRE(ids[1] != ids[2]);
  const Books before(pool->stats());
  const PoolStats stats_before = pool->stats();

  SECTION("no limit") {
    std::string message;
    try {
      pool->allocate(4 * MiB);
      FAIL("the allocation succeeded");
    } catch (const AllocationError& e) {
      message = e.what();
      REQUIRE(e.requested() == 4 * MiB);
    }
    INFO(message);
    REQUIRE(contains(message, std::to_string(4 * MiB)));  // requested bytes
    REQUIRE(contains(message, "host"));
    REQUIRE(contains(message, "device 0"));
    REQUIRE(names(message, "allocated", 7 * MiB));
    REQUIRE(names(message, "reserved", 7 * MiB));
    REQUIRE(contains(message, "limit none"));
    REQUIRE(names(message, "largest free block", 0));
    REQUIRE(names(message, "free", 1 * MiB));  // the upstream's free ...
    REQUIRE((contains(message, "of " + human(8 * MiB)) ||
             contains(message, "of " + std::to_string(8 * MiB))));  // ... of total
    REQUIRE(first == 1);
    REQUIRE(second == 1);
    REQUIRE(third == 1);
    PoolStats s = pool->stats();
    REQUIRE(s.callback_errors == stats_before.callback_errors + 1);
    REQUIRE(s.oom_events == stats_before.oom_events + 1);
  }
  SECTION("with a limit and a cached block") {
    void* small = pool->allocate(4 * KiB);  // a 2 MiB segment fails; the exact 4 KiB fits
    pool->deallocate(small);  // now a 4 KiB free block (a whole segment)
    pool->set_limit(8 * MiB - 256);
    const Books with_limit(pool->stats());
    std::string message = thrown_message<AllocationError>([&] { pool->allocate(1 * MiB); });
    INFO(message);
    REQUIRE(contains(message, std::to_string(1 * MiB)));
    REQUIRE(names(message, "limit", 8 * MiB - 256));
    REQUIRE(pool->stats().reserved_bytes <= with_limit.reserved_bytes);  // cache may be dropped
    pool->emergency_cleanup();
  }
  SECTION("removed callbacks are not called") {
    for (int id : ids) REQUIRE(pool->remove_reclaim_callback(id));
    for (int id : ids) REQUIRE_FALSE(pool->remove_reclaim_callback(id));
    REQUIRE_THROWS_AS(pool->allocate(4 * MiB), AllocationError);
    REQUIRE(first + second + third == 0);
  }
  SECTION("callbacks are checked when added") {
    REQUIRE_THROWS_AS(pool->add_reclaim_callback(nullptr), InvalidInputError);
    REQUIRE_FALSE(pool->remove_reclaim_callback(-5));
  }
  pool->set_limit(0);
  GK_REQUIRE_BALANCED(pool, before);
  pool->deallocate(held);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("oom: a request beyond the whole memory fails and leaves the pool as it was",
          "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(8 * MiB, &log);
  void* live = pool->allocate(1 * MiB);
  pool->deallocate(pool->allocate(3 * MiB));
  const Books before(pool->stats());
  REQUIRE_THROWS_AS(pool->allocate(9 * MiB), AllocationError);
  GK_REQUIRE_BALANCED(pool, before);
  pool->deallocate(live);
}

TEST_CASE("oom: each kind's AllocationError names its memory", "[oom][cuda_oom]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  auto pool = make_pool(kind);
  const std::string message =
      thrown_message<AllocationError>([&] { pool->allocate(CachingPool::kMaxRequest); });
  INFO(message);
  REQUIRE(contains(message, std::to_string(CachingPool::kMaxRequest)));
  REQUIRE(contains(message, gpukeeper::to_string(kind)));
  REQUIRE(contains(message, "device 0"));
  const gpukeeper::MemoryInfo info = pool->upstream().memory_info();
  REQUIRE(info.total > 0);
  REQUIRE(contains(message, "of " + human(info.total)));  // device (or host) total
  REQUIRE(pool->validate() == "");
}

TEST_CASE("oom: an upstream that cannot tell its memory still gets the cache released",
          "[oom]") {
  // memory_info() == {0, 0}: the upstream does not know (memory_pressure() reads that as
  // "unknown" too). A failed growth must still drop the cache and retry.
  std::shared_ptr<UpstreamLog> log;
  auto pool = make_test_pool(8 * MiB, &log, PoolOptions{}, /*report_memory=*/false);
  REQUIRE(pool->upstream().memory_info().total == 0);
  REQUIRE(pool->memory_pressure() == 0.0);
  pool->deallocate(pool->allocate(6 * MiB));  // 6 MiB cached
  void* b = nullptr;
  REQUIRE_NOTHROW(b = pool->allocate(7 * MiB));
  REQUIRE(pool->stats().upstream_frees == 1);
  pool->deallocate(b);
}

TEST_CASE("oom: the upstream gets back what it gave, and the pool's destructor frees all",
          "[oom]") {
  std::shared_ptr<UpstreamLog> log;
  {
    auto pool = make_test_pool(64 * MiB, &log);
    std::vector<void*> live;
    for (int i = 0; i < 40; ++i) {
      try {
        live.push_back(pool->allocate((i % 7 + 1) * MiB + i * 1000));
      } catch (const AllocationError&) {
        // The cap is reached: fine, the point is what the upstream sees.
      }
      if (i % 3 == 0 && !live.empty()) {
        pool->deallocate(live.back());
        live.pop_back();
      }
    }
    REQUIRE(log->used_now() == pool->stats().reserved_bytes);
    REQUIRE(log->used_now() <= 64 * MiB);
  }
  std::lock_guard<std::mutex> lock(log->mutex);
  INFO((log->contract_breaches.empty() ? std::string() : log->contract_breaches.front()));
  REQUIRE(log->contract_breaches.empty());
  REQUIRE(log->outstanding.empty());
  REQUIRE(log->refusals > 0);
  REQUIRE(log->allocations == log->deallocations);
}
