// PoolRegistry: one pool per device, made on first use.
#include <set>
#include <thread>
#include <vector>

#include "gpukeeper/memory/managed_buffer.hpp"
#include "gpukeeper/memory/pool_registry.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::ManagedBuffer;
using gpukeeper::PoolRegistry;

TEST_CASE("registry: one pool per device, made on first use", "[registry]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  PoolOptions options;
  options.small_segment = 4 * MiB;
  PoolRegistry registry(kind, options);
  REQUIRE(registry.kind() == kind);
  REQUIRE(registry.device_count() >= 1);
  if (kind == ResourceKind::host) REQUIRE(registry.device_count() == 1);
  REQUIRE(registry.find(0) == nullptr);
  REQUIRE(registry.pools().empty());

  auto pool = registry.pool(0);
  REQUIRE(pool != nullptr);
  REQUIRE(pool->kind() == kind);
  REQUIRE(pool->device() == 0);
  REQUIRE(pool->options().small_segment == 4 * MiB);  // the registry's options
  REQUIRE(registry.pool(0) == pool);
  REQUIRE(registry.find(0) == pool);
  REQUIRE(registry.pools().size() == 1);

  // Every device the kind has gets its own pool.
  for (int d = 1; d < registry.device_count(); ++d) {
    auto other = registry.pool(d);
    REQUIRE(other != pool);
    REQUIRE(other->device() == d);
  }
  REQUIRE(registry.pools().size() == static_cast<std::size_t>(registry.device_count()));
}

TEST_CASE("registry: total usage and cleanup over all pools", "[registry]") {
  PoolRegistry registry(ResourceKind::host);
  REQUIRE(registry.total_usage() == std::make_pair(std::size_t{0}, std::size_t{0}));
  REQUIRE(registry.emergency_cleanup_all() == 0);
  auto pool = registry.pool(0);
  {
    ManagedBuffer a(pool, 3 * MiB);
    ManagedBuffer b(pool, 1000);
    auto usage = registry.total_usage();
    REQUIRE(usage.first == 3 * MiB + 1024);
    REQUIRE(usage.second == 3 * MiB + 1024);
    REQUIRE(registry.emergency_cleanup_all() == 0);  // both segments hold live blocks
  }
  auto usage = registry.total_usage();
  REQUIRE(usage.first == 0);
  REQUIRE(usage.second == 3 * MiB + 1024);  // the peak stays
  REQUIRE(pool->stats().reserved_bytes == 20 * MiB + 2 * MiB);
  REQUIRE(registry.emergency_cleanup_all() == 22 * MiB);
  REQUIRE(pool->stats().reserved_bytes == 0);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("registry: pools outlive the registry while in use", "[registry]") {
  std::shared_ptr<CachingPool> pool;
  ManagedBuffer buf;
  {
    PoolRegistry registry(ResourceKind::host);
    pool = registry.pool(0);
    buf = ManagedBuffer(registry.pool(0), 4096);
  }
  REQUIRE(pool->owns(buf.data()));
  buf.reset();
  REQUIRE(pool->stats().allocated_count == 0);
}

TEST_CASE("registry: threads asking for a pool at once get the same one", "[registry]") {
  for (int attempt = 0; attempt < 20; ++attempt) {
    PoolRegistry registry(ResourceKind::host);
    std::vector<std::shared_ptr<CachingPool>> got(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        got[t] = registry.pool(0);
        void* p = got[t]->allocate(256);
        got[t]->deallocate(p);
      });
    }
    for (auto& th : threads) th.join();
    std::set<CachingPool*> distinct;
    for (auto& p : got) distinct.insert(p.get());
    REQUIRE(distinct.size() == 1);
    REQUIRE(registry.pools().size() == 1);
    REQUIRE(got[0]->validate() == "");
  }
}
