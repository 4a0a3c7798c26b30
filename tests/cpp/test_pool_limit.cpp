// PoolLimit (pool_limit.hpp): the reserved-bytes limit and the pressure it defines, on its
// own. How the pool holds to it (growth refused, cache released on a lower limit) is in
// test_caching_pool.cpp and test_oom.cpp.
#include <string>

#include "gpukeeper/memory/pool_limit.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::detail::PoolLimit;

TEST_CASE("pool limit: no limit admits anything, a limit what stays within it",
          "[caching_pool]") {
  PoolLimit none;
  CHECK(none.get() == 0);
  CHECK(none.admits(GiB, GiB));
  PoolLimit limit(8 * MiB);
  CHECK(limit.get() == 8 * MiB);
  CHECK(limit.admits(6 * MiB, 2 * MiB));
  CHECK_FALSE(limit.admits(6 * MiB, 2 * MiB + 1));
  CHECK_FALSE(limit.admits(0, 9 * MiB));
}

TEST_CASE("pool limit: set refuses a limit below what is allocated, changing nothing",
          "[caching_pool]") {
  PoolLimit limit(8 * MiB);
  try {
    limit.set(MiB, 2 * MiB);
    FAIL("a limit below the allocated bytes was taken");
  } catch (const InvalidInputError& e) {
    CHECK(std::string(e.what()) ==
          "limit of 1048576 bytes (1.0 MiB) is below the 2097152 bytes (2.0 MiB) now "
          "allocated; return buffers first");
  }
  CHECK(limit.get() == 8 * MiB);
  limit.set(2 * MiB, 2 * MiB);  // exactly what is allocated: taken
  CHECK(limit.get() == 2 * MiB);
  limit.set(0, 2 * MiB);  // 0 removes it, whatever is allocated
  CHECK(limit.get() == 0);
}

TEST_CASE("pool limit: pressure is reserved over the limit, else the upstream's use",
          "[caching_pool]") {
  auto upstream = gpukeeper::make_resource(ResourceKind::host, 0);
  PoolLimit limit(8 * MiB);
  CHECK(limit.pressure(2 * MiB, *upstream) == 0.25);
  CHECK(limit.pressure(16 * MiB, *upstream) == 1.0);  // capped
  limit.set(0, 0);
  const gpukeeper::MemoryInfo info = upstream->memory_info();
  const double pressure = limit.pressure(2 * MiB, *upstream);
  CHECK(pressure >= 0.0);
  CHECK(pressure <= 1.0);
  if (info.total == 0) CHECK(pressure == 0.0);
}
