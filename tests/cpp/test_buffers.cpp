// ManagedBuffer: the RAII owner of a pool block.
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpukeeper/memory/managed_buffer.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::ManagedBuffer;

static_assert(!std::is_copy_constructible<ManagedBuffer>::value, "ManagedBuffer is move-only");
static_assert(!std::is_copy_assignable<ManagedBuffer>::value, "ManagedBuffer is move-only");
static_assert(std::is_nothrow_move_constructible<ManagedBuffer>::value, "moves cannot fail");
static_assert(std::is_nothrow_move_assignable<ManagedBuffer>::value, "moves cannot fail");

#define GK_FOR_EACH_KIND()                                                                   \
  const ResourceKind kind =                                                                  \
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned); \
  INFO("memory kind: " << gpukeeper::to_string(kind));                                      \
  GK_SKIP_UNLESS_USABLE(kind)

TEST_CASE("ManagedBuffer returns its block when it dies", "[buffers]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind);
  void* where = nullptr;
  {
    ManagedBuffer buf(pool, 1000, /*stream=*/0);
    REQUIRE(buf);
    REQUIRE(buf.data() != nullptr);
    REQUIRE(buf.size() == 1000);
    REQUIRE(buf.stream() == 0);
    REQUIRE(buf.pool() == pool);
    REQUIRE(pool->owns(buf.data()));
    REQUIRE(pool->requested_size(buf.data()) == 1000);
    REQUIRE(pool->stats().allocated_count == 1);
    REQUIRE(pool->stats().allocated_bytes == 1024);
    if (pool->upstream().host_accessible()) std::memset(buf.data(), 0x5a, buf.size());
    where = buf.data();
  }
  PoolStats s = pool->stats();
  REQUIRE(s.allocated_count == 0);
  REQUIRE(s.allocated_bytes == 0);
  REQUIRE_FALSE(pool->owns(where));
  // The block is cached: the next buffer of that size gets it.
  ManagedBuffer again(pool, 1000);
  REQUIRE(again.data() == where);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("ManagedBuffer: empty, reset, and errors leave nothing behind", "[buffers]") {
  auto pool = make_pool(ResourceKind::host);
  SECTION("a default buffer owns nothing") {
    ManagedBuffer empty;
    REQUIRE_FALSE(empty);
    REQUIRE(empty.data() == nullptr);
    REQUIRE(empty.size() == 0);
    REQUIRE(empty.pool() == nullptr);
    empty.reset();  // harmless
    REQUIRE_FALSE(empty);
  }
  SECTION("reset returns the block now; use after release sees nothing") {
    ManagedBuffer buf(pool, 4096);
    void* p = buf.data();
    buf.reset();
    REQUIRE_FALSE(buf);
    REQUIRE(buf.data() == nullptr);
    REQUIRE(buf.size() == 0);
    REQUIRE(buf.pool() == nullptr);
    REQUIRE(pool->stats().allocated_count == 0);
    buf.reset();  // twice is harmless
    // The old pointer is no longer the buffer's: returning it again is an error.
    const Books before(pool->stats());
    REQUIRE_THROWS_AS(pool->deallocate(p), InvalidInputError);
    GK_REQUIRE_BALANCED(pool, before);
  }
  SECTION("a failed allocation throws and holds nothing") {
    const Books before(pool->stats());
    REQUIRE_THROWS_AS(ManagedBuffer(pool, 0), InvalidInputError);
    REQUIRE_THROWS_AS(ManagedBuffer(pool, CachingPool::kMaxRequest + 1), InvalidInputError);
    REQUIRE_THROWS_AS(ManagedBuffer(nullptr, 1024), InvalidInputError);
    pool->set_limit(4 * MiB);
    REQUIRE_THROWS_AS(ManagedBuffer(pool, 8 * MiB), AllocationError);
    pool->set_limit(0);
    GK_REQUIRE_BALANCED(pool, before);
    REQUIRE(pool.use_count() == 1);  // no buffer kept a reference
  }
}

TEST_CASE("ManagedBuffer moves hand over the block", "[buffers]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind);
  ManagedBuffer a(pool, 2048, /*stream=*/0);
  void* pa = a.data();

  SECTION("move construction") {
    ManagedBuffer b(std::move(a));
    REQUIRE(b.data() == pa);
    REQUIRE(b.size() == 2048);
    REQUIRE(b.pool() == pool);
    REQUIRE_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    REQUIRE(a.data() == nullptr);
    REQUIRE(a.size() == 0);
    REQUIRE(pool->stats().allocated_count == 1);
    a.reset();  // does not touch b's block
    REQUIRE(pool->owns(pa));
  }
  SECTION("move assignment returns the target's old block") {
    ManagedBuffer b(pool, 4096);
    void* pb = b.data();
    REQUIRE(pool->stats().allocated_count == 2);
    b = std::move(a);
    REQUIRE(b.data() == pa);
    REQUIRE(b.size() == 2048);
    REQUIRE(a.data() == nullptr);
    REQUIRE(pool->stats().allocated_count == 1);
    REQUIRE(pool->owns(pa));
    REQUIRE_FALSE(pool->owns(pb));
  }
  SECTION("self move assignment keeps the block") {
    ManagedBuffer& same = a;
    a = std::move(same);
    REQUIRE(a.data() == pa);
    REQUIRE(pool->owns(pa));
    REQUIRE(pool->stats().allocated_count == 1);
  }
  SECTION("buffers in a vector survive its growth") {
    std::vector<ManagedBuffer> v;
    v.push_back(std::move(a));
    for (int i = 0; i < 100; ++i) v.emplace_back(pool, 256 + i);
    REQUIRE(v.front().data() == pa);
    REQUIRE(pool->stats().allocated_count == 101);
    v.clear();
    REQUIRE(pool->stats().allocated_count == 0);
  }
  REQUIRE(pool->validate() == "");
}

TEST_CASE("ManagedBuffer keeps its pool alive", "[buffers]") {
  std::weak_ptr<CachingPool> watch;
  ManagedBuffer buf;
  {
    auto pool = make_pool(ResourceKind::host);
    watch = pool;
    buf = ManagedBuffer(pool, 1 * MiB);
  }
  REQUIRE_FALSE(watch.expired());
  REQUIRE(buf.pool()->owns(buf.data()));
  buf.reset();
  REQUIRE(watch.expired());
}

TEST_CASE("ManagedBuffers made in one thread and dropped in others", "[buffers]") {
  auto pool = make_pool(ResourceKind::host);
  std::vector<ManagedBuffer> made;
  for (int i = 0; i < 400; ++i) made.emplace_back(pool, 256 * (1 + i % 37));
  std::vector<std::vector<ManagedBuffer>> parts(4);
  for (std::size_t i = 0; i < made.size(); ++i) parts[i % 4].push_back(std::move(made[i]));
  std::vector<std::thread> threads;
  for (auto& part : parts) {
    threads.emplace_back([&part] { part.clear(); });
  }
  for (auto& t : threads) t.join();
  REQUIRE(pool->stats().allocated_count == 0);
  REQUIRE(pool->stats().allocated_bytes == 0);
  REQUIRE(pool->validate() == "");
}
