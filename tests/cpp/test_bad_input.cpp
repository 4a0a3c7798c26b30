// Bad input: each gets a typed error, and the pool's books are as before afterwards.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <type_traits>

#include "gpukeeper/memory/pool_registry.hpp"
#include "gpukeeper/memory/precision.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::DeviceError;
using gpukeeper::Precision;

static_assert(std::is_base_of<std::runtime_error, GpuError>::value, "GpuError is an exception");
static_assert(std::is_base_of<GpuError, InvalidInputError>::value, "typed errors share a base");
static_assert(std::is_base_of<GpuError, AllocationError>::value, "typed errors share a base");
static_assert(std::is_base_of<GpuError, DeviceError>::value, "typed errors share a base");

namespace {

// A pool that holds something: one live block and one cached segment.
struct BusyPool {
  std::shared_ptr<CachingPool> pool;
  void* live = nullptr;
  explicit BusyPool(ResourceKind kind) : pool(make_pool(kind)) {
    live = pool->allocate(1000);
    pool->deallocate(pool->allocate(12 * MiB));
    REQUIRE(pool->stats().allocated_count == 1);
    REQUIRE(pool->stats().reserved_bytes == 2 * MiB + 12 * MiB);
  }
  ~BusyPool() {
    if (pool && live) pool->deallocate(live);
  }
  // The pool still works: a fresh block comes and goes.
  void still_works() {
    void* p = pool->allocate(4096);
    REQUIRE(p != nullptr);
    pool->deallocate(p);
    REQUIRE(pool->validate() == "");
  }
};

bool host_overcommits_always() {
  std::ifstream f("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  return (f >> mode) && mode == 1;
}

}  // namespace

#define GK_FOR_EACH_KIND()                                                                   \
  const ResourceKind kind =                                                                  \
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned); \
  INFO("memory kind: " << gpukeeper::to_string(kind));                                      \
  GK_SKIP_UNLESS_USABLE(kind)

TEST_CASE("bad input: zero, negative and absurd sizes", "[bad_input]") {
  GK_FOR_EACH_KIND();
  BusyPool busy(kind);
  auto& pool = busy.pool;
  const Books before(pool->stats());

  SECTION("zero") {
    REQUIRE_THROWS_AS(pool->allocate(0), InvalidInputError);
    REQUIRE(contains(thrown_message<InvalidInputError>([&] { pool->allocate(0, 0); }), "0 bytes"));
  }
  SECTION("negative sizes seen as size_t, and anything beyond kMaxRequest") {
    for (std::size_t bad : {static_cast<std::size_t>(-1), static_cast<std::size_t>(-256),
                            static_cast<std::size_t>(std::numeric_limits<std::int64_t>::min()),
                            CachingPool::kMaxRequest + 1, CachingPool::kMaxRequest * 2}) {
      INFO("size " << bad);
      REQUIRE_THROWS_AS(pool->allocate(bad), InvalidInputError);
    }
  }
  GK_REQUIRE_BALANCED(pool, before);
  busy.still_works();
}

// Tagged [cuda_oom]: on a GPU these make cudaMalloc, cudaMallocAsync and cudaMallocHost
// fail on purpose, which compute-sanitizer reports (scripts/gpu-check.sh leaves them out).
TEST_CASE("bad input: sizes beyond any memory", "[bad_input][cuda_oom]") {
  GK_FOR_EACH_KIND();
  BusyPool busy(kind);
  auto& pool = busy.pool;
  const Books before(pool->stats());

  SECTION("below kMaxRequest but beyond any memory: AllocationError with the size") {
    const std::size_t huge = CachingPool::kMaxRequest;  // 1 PiB: beyond any address space
    const std::string message = thrown_message<AllocationError>([&] { pool->allocate(huge); });
    INFO(message);
    REQUIRE(contains(message, std::to_string(huge)));
    try {
      pool->allocate(huge - 1);
      FAIL("allocate of 1 PiB - 1 succeeded");
    } catch (const AllocationError& e) {
      REQUIRE(e.requested() == huge - 1);
    }
  }
  SECTION("twice the memory there is: AllocationError") {
    const std::size_t total = pool->upstream().memory_info().total;
    REQUIRE(total > 0);
    if (kind == ResourceKind::host && host_overcommits_always()) {
      GK_SKIP("vm.overcommit_memory=1: the host grants any size");
    }
    REQUIRE_THROWS_AS(pool->allocate(2 * total), AllocationError);
  }
  GK_REQUIRE_BALANCED(pool, before);
  busy.still_works();
}

TEST_CASE("bad input: returning a block twice, or one the pool never gave", "[bad_input]") {
  GK_FOR_EACH_KIND();
  BusyPool busy(kind);
  auto& pool = busy.pool;
  void* p = pool->allocate(4096);
  pool->deallocate(p);
  const Books before(pool->stats());

  SECTION("double return") {
    const std::string message = thrown_message<InvalidInputError>([&] { pool->deallocate(p); });
    INFO(message);
    REQUIRE(contains(message, "not a live block"));
    REQUIRE_THROWS_AS(pool->deallocate(p, 0), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate_checked(p, 4096), InvalidInputError);
    REQUIRE_FALSE(pool->try_deallocate(p));  // the asking form: no, and nothing changed
  }
  SECTION("the asking form frees what the pool gave") {
    void* q = pool->allocate(4096);
    REQUIRE(pool->try_deallocate(q));
    REQUIRE_FALSE(pool->try_deallocate(q));
  }
  SECTION("double return after the block was merged and reused by a bigger one") {
    void* q = pool->allocate(8192);  // may start where p was
    const Books with_q(pool->stats());
    if (q != p) REQUIRE_THROWS_AS(pool->deallocate(p), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate(static_cast<char*>(q) + 4096), InvalidInputError);
    GK_REQUIRE_BALANCED(pool, with_q);
    pool->deallocate(q);
  }
  SECTION("foreign pointers") {
    int on_stack = 0;
    void* from_malloc = std::malloc(4096);
    REQUIRE_THROWS_AS(pool->deallocate(&on_stack), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate(from_malloc), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate(nullptr), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate(reinterpret_cast<void*>(std::uintptr_t{0x1000})),
                      InvalidInputError);
    std::free(from_malloc);
    // Inside a live block, but not its start.
    REQUIRE_THROWS_AS(pool->deallocate(static_cast<char*>(busy.live) + 256), InvalidInputError);
    REQUIRE(pool->owns(busy.live));
  }
  SECTION("a block of another pool") {
    auto other = make_pool(kind);
    void* theirs = other->allocate(4096);
    const Books other_before(other->stats());
    REQUIRE_THROWS_AS(pool->deallocate(theirs), InvalidInputError);
    REQUIRE_THROWS_AS(pool->deallocate_checked(theirs, 4096), InvalidInputError);
    GK_REQUIRE_BALANCED(other, other_before);
    other->deallocate(theirs);
  }
  SECTION("deallocate_checked with a size other than the one requested") {
    void* q = pool->allocate(1000);
    const Books with_q(pool->stats());
    for (std::size_t wrong : {std::size_t{999}, std::size_t{1001}, std::size_t{1024},
                              std::size_t{0}}) {
      INFO("given back as " << wrong << " bytes");
      REQUIRE_THROWS_AS(pool->deallocate_checked(q, wrong), InvalidInputError);
      REQUIRE(pool->owns(q));  // not returned
    }
    GK_REQUIRE_BALANCED(pool, with_q);
    pool->deallocate_checked(q, 1000);
  }
  GK_REQUIRE_BALANCED(pool, before);
  busy.still_works();
}

TEST_CASE("bad input: a limit below what is allocated", "[bad_input]") {
  GK_FOR_EACH_KIND();
  BusyPool busy(kind);
  auto& pool = busy.pool;
  void* big = pool->allocate(12 * MiB);  // the cached segment
  const Books before(pool->stats());
  const std::string message =
      thrown_message<InvalidInputError>([&] { pool->set_limit(12 * MiB); });
  INFO(message);
  REQUIRE(contains(message, std::to_string(12 * MiB)));
  REQUIRE_THROWS_AS(pool->set_limit(1), InvalidInputError);
  REQUIRE(pool->limit() == 0);
  GK_REQUIRE_BALANCED(pool, before);
  // Exactly what is allocated is fine.
  pool->set_limit(12 * MiB + 1024);
  REQUIRE(pool->limit() == 12 * MiB + 1024);
  pool->deallocate(big);
  pool->set_limit(0);
  busy.still_works();
}

TEST_CASE("bad input: pool options and a missing upstream", "[bad_input]") {
  REQUIRE_THROWS_AS(CachingPool(nullptr), InvalidInputError);
  auto bad = [](auto change) {
    PoolOptions o;
    change(o);
    return o;
  };
  const PoolOptions wrong[] = {
      bad([](PoolOptions& o) { o.small_size = 0; }),
      bad([](PoolOptions& o) { o.small_size = 4 * MiB; }),  // above small_segment
      bad([](PoolOptions& o) { o.small_segment = 2 * MiB + 1; }),
      bad([](PoolOptions& o) { o.large_segment = 20 * MiB + 100; }),
      bad([](PoolOptions& o) { o.large_cutoff = 40 * MiB; }),  // above large_segment
      bad([](PoolOptions& o) { o.segment_granularity = 3 * MiB; }),
      bad([](PoolOptions& o) { o.segment_granularity = 128; }),
      bad([](PoolOptions& o) { o.segment_granularity = 0; }),
  };
  for (const PoolOptions& o : wrong) {
    REQUIRE_THROWS_AS(CachingPool(std::make_unique<gpukeeper::HostResource>(), o),
                      InvalidInputError);
  }
}

TEST_CASE("bad input: unknown precision names and overflowing counts", "[bad_input]") {
  for (const char* name : {"fp13", "", "float 32", "FP13", "int128", "torch.", "complex64"}) {
    INFO("name '" << name << "'");
    REQUIRE_THROWS_AS(gpukeeper::parse_precision(name), InvalidInputError);
  }
  REQUIRE(contains(thrown_message<InvalidInputError>([] { gpukeeper::parse_precision("fp13"); }),
                   "fp13"));
  // Known names, any case, with or without "torch.".
  REQUIRE(gpukeeper::parse_precision("fp32") == Precision::fp32);
  REQUIRE(gpukeeper::parse_precision("Float32") == Precision::fp32);
  REQUIRE(gpukeeper::parse_precision("torch.bfloat16") == Precision::bf16);
  REQUIRE(gpukeeper::parse_precision("half") == Precision::fp16);
  REQUIRE(gpukeeper::parse_precision("bool") == Precision::boolean);
  REQUIRE(gpukeeper::parse_precision("int64") == Precision::int64);
  for (Precision p : {Precision::fp64, Precision::fp32, Precision::fp16, Precision::bf16,
                      Precision::int64, Precision::int32, Precision::int16, Precision::int8,
                      Precision::uint8, Precision::boolean}) {
    INFO(gpukeeper::to_string(p));
    REQUIRE(gpukeeper::parse_precision(gpukeeper::to_string(p)) == p);  // names round-trip
  }
  REQUIRE(gpukeeper::element_size(Precision::fp64) == 8);
  REQUIRE(gpukeeper::element_size(Precision::bf16) == 2);
  REQUIRE(gpukeeper::element_size(Precision::boolean) == 1);
  REQUIRE(gpukeeper::bytes_for(10, Precision::fp32) == 40);
  REQUIRE(gpukeeper::bytes_for(0, Precision::fp64) == 0);
  REQUIRE_THROWS_AS(gpukeeper::bytes_for(std::numeric_limits<std::size_t>::max() / 4, Precision::fp64),
                    InvalidInputError);
  REQUIRE_THROWS_AS(gpukeeper::bytes_for(static_cast<std::size_t>(-1), Precision::int16),
                    InvalidInputError);
}

TEST_CASE("bad input: unknown memory kinds and device ids", "[bad_input]") {
  REQUIRE_THROWS_AS(gpukeeper::parse_resource_kind("gpu"), InvalidInputError);
  REQUIRE_THROWS_AS(gpukeeper::parse_resource_kind("Host"), InvalidInputError);
  for (ResourceKind k : all_kinds()) {
    REQUIRE(gpukeeper::parse_resource_kind(gpukeeper::to_string(k)) == k);
  }
  REQUIRE_THROWS_AS(gpukeeper::make_resource(ResourceKind::host, 1), InvalidInputError);
  REQUIRE_THROWS_AS(gpukeeper::make_resource(ResourceKind::host, -1), InvalidInputError);
  for (ResourceKind k : {ResourceKind::device, ResourceKind::async, ResourceKind::pinned}) {
    INFO(gpukeeper::to_string(k));
    REQUIRE_THROWS_AS(gpukeeper::make_resource(k, -1), InvalidInputError);
    std::string why;
    REQUIRE_FALSE(gpukeeper::resource_available(k, 99, &why));
    REQUIRE(why != "");
    if (gpukeeper::cuda_status().available) {
      REQUIRE_THROWS_AS(gpukeeper::make_resource(k, 99), InvalidInputError);
    } else {
      REQUIRE_THROWS_AS(gpukeeper::make_resource(k, 0), DeviceError);  // the kind is unavailable
      REQUIRE_THROWS_AS(gpukeeper::make_resource(k, 99), GpuError);
    }
  }
  REQUIRE_THROWS_AS(gpukeeper::device_memory_info(gpukeeper::kCpuDevice), InvalidInputError);
  REQUIRE_THROWS_AS(gpukeeper::device_memory_info(99), InvalidInputError);

  for (ResourceKind k : all_kinds()) {
    INFO(gpukeeper::to_string(k));
    gpukeeper::PoolRegistry registry(k);
    for (int bad : {-1, 99, registry.device_count()}) {
      INFO("device " << bad);
      if (bad == 0) {
        // No device at all (a CUDA kind on a machine without CUDA): the header promises
        // DeviceError ("kind unavailable"), the code says InvalidInputError ("no such
        // device"); both are typed errors.
        REQUIRE_THROWS_AS(registry.pool(bad), GpuError);
        continue;
      }
      const std::string message =
          thrown_message<InvalidInputError>([&] { registry.pool(bad); });
      REQUIRE(contains(message, std::to_string(bad)));
      REQUIRE(registry.find(bad) == nullptr);
    }
    REQUIRE(registry.pools().empty());
    REQUIRE(registry.total_usage() == std::make_pair(std::size_t{0}, std::size_t{0}));
  }
}
