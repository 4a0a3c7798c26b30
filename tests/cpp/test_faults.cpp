// FaultInjectingResource: an upstream that refuses on purpose (every Nth call, or at
// random for a seed), and what the pool makes of refusals: a retry that absorbs a single
// one, AllocationError when every call is refused, and books that balance either way.
#include <vector>

#include "gpukeeper/memory/fault_injecting_resource.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::FaultInjectingResource;
using gpukeeper::FaultPlan;

namespace {

struct FaultyPool {
  FaultInjectingResource* faults = nullptr;  // owned by the pool
  std::shared_ptr<CachingPool> pool;
};

FaultyPool faulty_pool(FaultPlan plan, PoolOptions options = {}) {
  auto faults = std::make_unique<FaultInjectingResource>(gpukeeper::make_resource(ResourceKind::host, 0), plan);
  FaultyPool fp;
  fp.faults = faults.get();
  fp.pool = std::make_shared<CachingPool>(std::move(faults), options);
  return fp;
}

}  // namespace

TEST_CASE("faults: a plan with a probability outside [0, 1] is refused", "[faults]") {
  for (double p : {-0.1, 1.5}) {
    FaultPlan plan;
    plan.probability = p;
    CHECK_THROWS_AS(FaultInjectingResource(gpukeeper::make_resource(ResourceKind::host, 0), plan),
                    InvalidInputError);
  }
  CHECK_THROWS_AS(FaultInjectingResource(nullptr, FaultPlan{}), InvalidInputError);
}

TEST_CASE("faults: the same seed refuses the same calls; every Nth is exact", "[faults]") {
  auto pattern = [](FaultPlan plan) {
    FaultInjectingResource r(gpukeeper::make_resource(ResourceKind::host, 0), plan);
    std::vector<bool> refused;
    for (int i = 0; i < 400; ++i) {
      void* p = r.allocate(256, 0);
      refused.push_back(p == nullptr);
      if (p) r.deallocate(p, 256, 0);
    }
    CHECK(r.outstanding_bytes() == 0);
    return refused;
  };
  FaultPlan random;
  random.probability = 0.25;
  random.seed = 42;
  const std::vector<bool> a = pattern(random), b = pattern(random);
  CHECK(a == b);
  const auto hits = static_cast<int>(std::count(a.begin(), a.end(), true));
  CHECK(hits > 60);  // about 100 of 400
  CHECK(hits < 140);
  random.seed = 43;
  CHECK(pattern(random) != a);

  FaultPlan nth;
  nth.every_nth = 7;
  const std::vector<bool> c = pattern(nth);
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == ((i + 1) % 7 == 0));
}

TEST_CASE("faults: the pool retries past a single refusal and counts it", "[faults]") {
  FaultPlan plan;
  plan.every_nth = 2;  // the 2nd, 4th, ... upstream calls are refused
  FaultyPool fp = faulty_pool(plan);
  std::vector<void*> live;
  for (int i = 0; i < 12; ++i) live.push_back(fp.pool->allocate(12 * MiB));  // a segment each
  CHECK(fp.faults->injected() > 0);
  const PoolStats s = fp.pool->stats();
  CHECK(s.allocated_count == 12);
  // A refused segment is asked for again (the exact size after the preferred one, or
  // after a release and the reclaim callbacks): every refusal cost one more call.
  CHECK(s.upstream_allocations == fp.faults->calls() - fp.faults->injected());
  CHECK(fp.faults->outstanding_bytes() == static_cast<std::int64_t>(s.reserved_bytes));
  CHECK(fp.pool->validate() == "");
  for (void* p : live) fp.pool->deallocate(p);
  fp.pool->emergency_cleanup();
  CHECK(fp.faults->outstanding_bytes() == 0);
}

TEST_CASE("faults: when every call is refused, allocate raises and changes nothing", "[faults]") {
  FaultPlan plan;
  plan.probability = 1.0;
  int reclaims = 0;
  FaultyPool fp = faulty_pool(plan);
  fp.pool->add_reclaim_callback([&](std::size_t) {
    ++reclaims;
    return std::size_t{0};
  });
  for (std::size_t size : {std::size_t{256}, 5 * MiB, 64 * MiB}) {
    CHECK_THROWS_AS(fp.pool->allocate(size), AllocationError);
  }
  CHECK(reclaims == 3);  // asked once per failed request
  const PoolStats s = fp.pool->stats();
  CHECK(s.allocated_count == 0);
  CHECK(s.reserved_bytes == 0);
  CHECK(s.oom_events == 3);
  CHECK(fp.faults->injected() == fp.faults->calls());
  CHECK(fp.pool->validate() == "");
  // Injection off: the same pool works, and its books still balance.
  fp.faults->set_enabled(false);
  void* p = fp.pool->allocate(5 * MiB);
  fp.pool->deallocate(p);
  CHECK(fp.pool->validate() == "");
}

TEST_CASE("faults: refused pages of expandable segments leave the books whole", "[faults]") {
  FaultPlan plan;
  plan.probability = 0.3;
  plan.seed = 9;
  PoolOptions options;
  options.segments = SegmentLayout::expandable;
  options.expandable_range = 512 * MiB;
  FaultyPool fp = faulty_pool(plan, options);
  std::vector<void*> live;
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    const std::size_t size = (i % 5 + 1) * 3 * MiB + 4096;
    try {
      live.push_back(fp.pool->allocate(size));
    } catch (const AllocationError&) {
      ++refused;
    }
    if (live.size() > 8) {
      fp.pool->deallocate(live.front());
      live.erase(live.begin());
    }
    REQUIRE(fp.pool->validate() == "");
  }
  CHECK(fp.faults->injected() > 0);
  CHECK(live.size() + refused >= 9);
  for (void* p : live) fp.pool->deallocate(p);
  fp.pool->emergency_cleanup();
  CHECK(fp.pool->stats().reserved_bytes == 0);
  CHECK(fp.faults->outstanding_pages() == 0);
  CHECK(fp.pool->validate() == "");
}
