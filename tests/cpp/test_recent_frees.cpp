// RecentFrees (recent_frees.hpp): the last few freed blocks held off the free index, on
// their own. How the pool uses them (placement, merging, the books) is in
// test_caching_pool_recent_frees.cpp.
#include <type_traits>

#include "gpukeeper/memory/recent_frees.hpp"
#include "test_support.hpp"

using gpukeeper::detail::Block;
using gpukeeper::detail::RecentFrees;
using namespace gktest;

// The fast path's list: a fixed array, nothing allocated, nothing to destroy.
static_assert(std::is_trivially_destructible_v<RecentFrees>);
static_assert(std::is_trivially_copyable_v<RecentFrees>);
static_assert(RecentFrees::kCapacity == CachingPool::kRecentFrees);

namespace {

Block make_block(std::uintptr_t addr, std::size_t size, stream_t stream = 0) {
  Block b;
  b.addr = addr;
  b.size = size;
  b.stream = stream;
  b.free = true;
  return b;
}

}  // namespace

TEST_CASE("recent free list: the newest block of the size and stream is taken back",
          "[caching_pool][recent]") {
  RecentFrees recent;
  CHECK(recent.empty());
  Block a = make_block(0x1000, 512), b = make_block(0x2000, 512), c = make_block(0x3000, 1024);
  Block d = make_block(0x4000, 512, 7);
  for (Block* x : {&a, &c, &b, &d}) recent.hold(x);
  CHECK(recent.size() == 4);
  CHECK(a.recent);
  CHECK(recent.holds_as_is(&a));

  CHECK(recent.take(512, 0) == &b);  // newest of the size on stream 0
  CHECK_FALSE(b.recent);
  CHECK(recent.take(512, 7) == &d);  // the stream must match
  CHECK(recent.take(768, 0) == nullptr);
  CHECK(recent.take(512, 3) == nullptr);
  CHECK(recent.take(512, 0) == &a);
  CHECK(recent.take(512, 0) == nullptr);
  CHECK(recent.size() == 1);
  CHECK(recent.take(1024, 0) == &c);
  CHECK(recent.empty());
  CHECK_FALSE(c.recent);
}

TEST_CASE("recent free list: full at its capacity, oldest dropped first, newest settled first",
          "[caching_pool][recent]") {
  RecentFrees recent;
  Block blocks[RecentFrees::kCapacity];
  for (unsigned i = 0; i < RecentFrees::kCapacity; ++i) {
    blocks[i] = make_block(0x10000 + i * 0x1000, 256 * (i + 1));
    CHECK_FALSE(recent.full());
    recent.hold(&blocks[i]);
  }
  CHECK(recent.full());
  CHECK(recent.drop_oldest() == &blocks[0]);  // the pool settles it, then holds the new one
  CHECK_FALSE(blocks[0].recent);
  // Dropping from the front keeps the rest oldest first.
  CHECK(recent.drop_oldest() == &blocks[1]);
  CHECK(recent.take(256 * 5, 0) == &blocks[4]);
  CHECK(recent.drop_newest() == &blocks[RecentFrees::kCapacity - 1]);
  CHECK(recent.drop_oldest() == &blocks[2]);
  unsigned left = recent.size();
  CHECK(left == RecentFrees::kCapacity - 5);
  while (!recent.empty()) recent.drop_newest();
  for (const Block& b : blocks) CHECK_FALSE(b.recent);
}

TEST_CASE("recent free list: a held block whose size or stream changed is not held as it is",
          "[caching_pool][recent]") {
  RecentFrees recent;
  Block a = make_block(0x1000, 512), other = make_block(0x2000, 512);
  recent.hold(&a);
  CHECK(recent.holds_as_is(&a));
  CHECK_FALSE(recent.holds_as_is(&other));
  a.size = 1024;  // what validate() must catch: the copy no longer matches the block
  CHECK_FALSE(recent.holds_as_is(&a));
  a.size = 512;
  a.stream = 3;
  CHECK_FALSE(recent.holds_as_is(&a));
}
