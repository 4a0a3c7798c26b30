// ManagedBuffer and BufferBatch: RAII owners of pool blocks.
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpukeeper/memory/buffer_batch.hpp"
#include "gpukeeper/memory/managed_buffer.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::BufferBatch;
using gpukeeper::ManagedBuffer;

static_assert(!std::is_copy_constructible<ManagedBuffer>::value, "ManagedBuffer is move-only");
static_assert(!std::is_copy_assignable<ManagedBuffer>::value, "ManagedBuffer is move-only");
static_assert(std::is_nothrow_move_constructible<ManagedBuffer>::value, "moves cannot fail");
static_assert(std::is_nothrow_move_assignable<ManagedBuffer>::value, "moves cannot fail");
static_assert(!std::is_copy_constructible<BufferBatch>::value, "BufferBatch is move-only");
static_assert(std::is_nothrow_move_constructible<BufferBatch>::value, "moves cannot fail");

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

TEST_CASE("BufferBatch owns many buffers and returns them together", "[buffers]") {
  GK_FOR_EACH_KIND();
  auto pool = make_pool(kind);
  {
    BufferBatch batch(pool, /*stream=*/0);
    REQUIRE(batch.size() == 0);
    REQUIRE(batch.total_bytes() == 0);
    REQUIRE(batch.pool() == pool);
    std::vector<std::size_t> sizes = {100, 4096, 1 * MiB, 3 * MiB, 12 * MiB, 256};
    std::size_t total = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      REQUIRE(batch.add(sizes[i]) == i);
      total += sizes[i];
    }
    REQUIRE(batch.size() == sizes.size());
    REQUIRE(batch.total_bytes() == total);
    std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      REQUIRE(batch[i].size() == sizes[i]);
      REQUIRE(pool->owns(batch[i].data()));
      ranges.emplace_back(addr(batch[i].data()), round_up(sizes[i]));
    }
    REQUIRE(find_overlap(ranges) == "");
    REQUIRE_THROWS_AS(batch[sizes.size()], std::out_of_range);
    const BufferBatch& view = batch;
    REQUIRE(view[0].data() == batch[0].data());
    REQUIRE(pool->stats().allocated_count == sizes.size());
    REQUIRE(pool->stats().requested_bytes == total);

    // A failed add leaves the batch as it was.
    REQUIRE_THROWS_AS(batch.add(0), InvalidInputError);
    pool->set_limit(pool->stats().reserved_bytes);
    REQUIRE_THROWS_AS(batch.add(64 * MiB), AllocationError);
    pool->set_limit(0);
    REQUIRE(batch.size() == sizes.size());
    REQUIRE(batch.total_bytes() == total);
    REQUIRE(pool->stats().allocated_count == sizes.size());

    batch.clear();
    REQUIRE(batch.size() == 0);
    REQUIRE(batch.total_bytes() == 0);
    REQUIRE(pool->stats().allocated_count == 0);
    // Returned newest first, neighbours merge: the cache is back in one piece per segment.
    REQUIRE(pool->validate() == "");

    batch.add(512);  // usable after clear
    REQUIRE(pool->stats().allocated_count == 1);
  }
  REQUIRE(pool->stats().allocated_count == 0);  // the destructor returned the last one
  REQUIRE(pool->validate() == "");
}

TEST_CASE("BufferBatch moves hand over every buffer", "[buffers]") {
  auto pool = make_pool(ResourceKind::host);
  BufferBatch a(pool);
  a.add(1000);
  a.add(2000);
  void* first = a[0].data();

  SECTION("move construction") {
    BufferBatch b(std::move(a));
    REQUIRE(b.size() == 2);
    REQUIRE(b.total_bytes() == 3000);
    REQUIRE(b[0].data() == first);
    REQUIRE(a.size() == 0);  // NOLINT(bugprone-use-after-move)
    REQUIRE(pool->stats().allocated_count == 2);
  }
  SECTION("move assignment returns the target's old buffers") {
    BufferBatch b(pool);
    b.add(4096);
    REQUIRE(pool->stats().allocated_count == 3);
    b = std::move(a);
    REQUIRE(b.size() == 2);
    REQUIRE(b[0].data() == first);
    REQUIRE(pool->stats().allocated_count == 2);
  }
  SECTION("many buffers") {
    BufferBatch big(pool);
    for (int i = 0; i < 5000; ++i) big.add(256);
    REQUIRE(big.size() == 5000);
    REQUIRE(big.total_bytes() == 5000 * 256);
    REQUIRE(pool->stats().allocated_count == 5002);
  }
  a.clear();
  REQUIRE(pool->stats().allocated_count == 0);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("BufferBatch: adding n buffers takes time linear in n", "[buffers]") {
  // 50,000 adds are ~50 ms of pool work. A batch that regrows its storage by one slot
  // per add moves every buffer each time: n^2 / 2 moves, seconds for this n.
  auto pool = make_pool(ResourceKind::host);
  BufferBatch batch(pool);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50000; ++i) batch.add(256);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("50000 adds took " << seconds << " s");
  REQUIRE(batch.size() == 50000);
  REQUIRE(seconds < 2.0);
  batch.clear();
  REQUIRE(pool->stats().allocated_count == 0);
}

TEST_CASE("BufferBatch needs a pool", "[buffers]") {
  REQUIRE_THROWS_AS(BufferBatch(nullptr), InvalidInputError);
}
