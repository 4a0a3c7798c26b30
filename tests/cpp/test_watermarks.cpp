// Watermarks: callbacks that fire when memory pressure crosses a level, once per crossing.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "test_support.hpp"

using namespace gktest;

TEST_CASE("watermarks fire once when crossed and re-arm below", "[watermarks]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  auto pool = make_pool(kind);
  pool->set_limit(100 * MiB);
  std::vector<double> fired;
  pool->add_watermark(0.5, [&](double pressure) { fired.push_back(pressure); });

  void* a = pool->allocate(12 * MiB);  // 12%
  REQUIRE(fired.empty());
  void* b = pool->allocate(40 * MiB);  // 52%: crosses
  REQUIRE(fired.size() == 1);
  REQUIRE(near(fired[0], 0.52));
  void* c = pool->allocate(20 * MiB);  // 72%: still above, no second call
  REQUIRE(fired.size() == 1);
  pool->deallocate(b);
  pool->deallocate(c);
  REQUIRE(fired.size() == 1);
  REQUIRE(pool->emergency_cleanup() == 60 * MiB);  // 12%: below, re-armed
  REQUIRE(near(pool->memory_pressure(), 0.12));
  REQUIRE(fired.size() == 1);
  void* d = pool->allocate(40 * MiB);  // 52% again: fires again
  REQUIRE(fired.size() == 2);
  REQUIRE(near(fired[1], 0.52));
  pool->deallocate(d);
  pool->deallocate(a);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("watermarks: several levels crossed in one step all fire", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(100 * MiB);
  int warn = 0, clean = 0, full = 0;
  double seen = 0.0;
  pool->add_watermark(0.8, [&](double p) {
    ++warn;
    seen = p;
  });
  pool->add_watermark(0.9, [&](double) { ++clean; });
  pool->add_watermark(1.0, [&](double) { ++full; });
  void* p = pool->allocate(94 * MiB);
  REQUIRE(warn == 1);
  REQUIRE(clean == 1);
  REQUIRE(full == 0);
  REQUIRE(seen >= 0.8);
  REQUIRE(near(seen, 0.94));
  void* q = pool->allocate(6 * MiB);  // exactly at the limit: pressure 1.0
  REQUIRE(full == 1);
  REQUIRE(warn == 1);
  pool->deallocate(p);
  pool->deallocate(q);
}

TEST_CASE("watermarks: lowering the limit can cross one", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(100 * MiB);
  void* p = pool->allocate(3 * MiB);  // 20 MiB reserved
  std::vector<double> fired;
  pool->add_watermark(0.9, [&](double pressure) { fired.push_back(pressure); });
  pool->set_limit(40 * MiB);  // 50%
  REQUIRE(fired.empty());
  pool->set_limit(21 * MiB);  // 95%
  REQUIRE(fired.size() == 1);
  REQUIRE(near(fired[0], 20.0 / 21.0));
  pool->deallocate(p);
}

TEST_CASE("watermarks: removed ones stay quiet", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(100 * MiB);
  int calls = 0;
  int id = pool->add_watermark(0.5, [&](double) { ++calls; });
  int other = pool->add_watermark(0.5, [&](double) {});
  REQUIRE(id != other);
  REQUIRE(pool->remove_watermark(id));
  REQUIRE_FALSE(pool->remove_watermark(id));
  REQUIRE_FALSE(pool->remove_watermark(12345));
  void* p = pool->allocate(60 * MiB);
  REQUIRE(calls == 0);
  pool->deallocate(p);
  REQUIRE(pool->remove_watermark(other));
}

TEST_CASE("watermarks: levels outside (0, 1] and empty callbacks are refused", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  auto noop = [](double) {};
  for (double bad : {0.0, -0.1, 1.0000001, 1.5, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    INFO("level " << bad);
    REQUIRE_THROWS_AS(pool->add_watermark(bad, noop), InvalidInputError);
  }
  REQUIRE_THROWS_AS(pool->add_watermark(0.5, nullptr), InvalidInputError);
  REQUIRE(pool->add_watermark(1.0, noop) > 0);
  REQUIRE(pool->add_watermark(1e-9, noop) > 0);
}

TEST_CASE("watermarks: a callback that throws is counted, not propagated", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(100 * MiB);
  pool->add_watermark(0.1, [](double) { throw std::runtime_error("watermark callback failed"); });
  void* p = nullptr;
  REQUIRE_NOTHROW(p = pool->allocate(3 * MiB));  // 20%
  REQUIRE(p != nullptr);
  REQUIRE(pool->stats().callback_errors == 1);
  REQUIRE(pool->stats().allocated_bytes == 3 * MiB);
  pool->deallocate(p);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("watermarks: a callback may clean the pool that called it", "[watermarks]") {
  auto pool = make_pool(ResourceKind::host);
  pool->set_limit(100 * MiB);
  pool->deallocate(pool->allocate(40 * MiB));  // 40 MiB cached
  std::size_t released = 0;
  int calls = 0;
  pool->add_watermark(0.41, [&](double) {
    ++calls;
    released += pool->emergency_cleanup();
  });
  void* p = pool->allocate(4 * KiB);  // a new 2 MiB small segment: 42%
  REQUIRE(calls == 1);
  REQUIRE(released == 40 * MiB);
  PoolStats s = pool->stats();
  REQUIRE(s.reserved_bytes == 2 * MiB);
  REQUIRE(s.allocated_bytes == 4 * KiB);
  pool->deallocate(p);
  REQUIRE(pool->validate() == "");
}
