// PoolAudit (pool_audit.hpp): validate()'s read-only walk, over segments and blocks made by
// hand, so that each inconsistency it must find can be made on purpose. The pools' own
// books are audited by every test that calls validate().
#include <string>
#include <vector>

#include "gpukeeper/memory/pool_audit.hpp"
#include "test_support.hpp"

using gpukeeper::PoolHistory;
using gpukeeper::detail::Block;
using gpukeeper::detail::PoolAudit;
using gpukeeper::detail::PoolCounters;
using gpukeeper::detail::PtrMap;
using gpukeeper::detail::RecentFrees;
using gpukeeper::detail::Segment;
using namespace gktest;

namespace {

constexpr std::size_t kAlign = CachingPool::kAlignment;

// A fixed segment of 4 KiB at 0x100000: a live block of 1 KiB (1000 bytes asked for), a
// free one of 1 KiB, a live one of 2 KiB; the live ones in the live map.
struct HandMadeBooks {
  Segment seg;
  Block live1, free1, live2;
  PtrMap<Block> live;
  RecentFrees recent;
  PoolCounters counters;
  PoolHistory history;

  HandMadeBooks() {
    seg.base = 0x100000;
    seg.size = 4 * KiB;
    seg.small = true;
    Block* chain[] = {&live1, &free1, &live2};
    std::size_t sizes[] = {1 * KiB, 1 * KiB, 2 * KiB};
    std::uintptr_t at = seg.base;
    Block* prev = nullptr;
    for (int i = 0; i < 3; ++i) {
      Block* b = chain[i];
      b->addr = at;
      b->size = sizes[i];
      b->segment = &seg;
      b->prev = prev;
      if (prev != nullptr) prev->next = b;
      at += sizes[i];
      prev = b;
    }
    seg.first = &live1;
    seg.last = &live2;
    free1.free = true;
    live1.requested = 1000;
    live2.requested = 2 * KiB;
    live.insert(live1.addr, &live1);
    live.insert(live2.addr, &live2);
    counters.reserve(seg.size);
    counters.segment_added();
    counters.handed_out(live1.size, live1.requested);
    counters.handed_out(live2.size, live2.requested);
    history.reserved_bytes.increase(true, seg.size);
    history.segments.increase(true, 1);
    for (const Block* b : {&live1, &live2}) {
      history.allocated_bytes.increase(true, b->size);
      history.allocations.increase(true, 1);
      history.requested_bytes.increase(true, b->requested);
    }
  }

  // The audit's findings; `indexed`: the free blocks on a free index.
  std::string audit(std::size_t indexed = 1) {
    PoolAudit a(live, recent, nullptr, kAlign);
    a.segment(&seg);
    a.books(indexed, counters, history);
    return a.problems();
  }
};

bool has(const std::string& problems, const char* what) {
  return problems.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("pool audit: consistent books pass, and the walk counts them", "[caching_pool][audit]") {
  HandMadeBooks books;
  CHECK(books.audit() == "");
  PoolAudit a(books.live, books.recent, nullptr, kAlign);
  a.segment(&books.seg);
  CHECK(a.tally().segments == 1);
  CHECK(a.tally().reserved == 4 * KiB);
  CHECK(a.tally().allocated == 3 * KiB);
  CHECK(a.tally().allocated_count == 2);
  CHECK(a.tally().requested == 1000 + 2 * KiB);
  CHECK(a.tally().free_blocks == 1);
  CHECK(a.tally().recent_blocks == 0);
}

TEST_CASE("pool audit: blocks that do not tile their segment", "[caching_pool][audit]") {
  HandMadeBooks books;
  SECTION("a gap") {
    books.free1.addr += kAlign;
    CHECK(has(books.audit(), "leaves a gap"));
  }
  SECTION("a broken prev link") {
    books.live2.prev = &books.live1;
    CHECK(has(books.audit(), "broken prev link"));
  }
  SECTION("a wrong last block") {
    books.seg.last = &books.free1;
    CHECK(has(books.audit(), "segment's last block is wrong"));
  }
  SECTION("blocks short of the segment's end") {
    books.seg.size += kAlign;
    CHECK(has(books.audit(), "blocks do not fill their segment"));
  }
  SECTION("a misaligned size") {
    books.live1.size -= 1;
    books.free1.addr -= 1;
    books.free1.size += 1;
    CHECK(has(books.audit(), "bad block size"));
  }
  SECTION("a block of another segment") {
    Segment other;
    books.free1.segment = &other;
    CHECK(has(books.audit(), "block in wrong segment"));
  }
}

TEST_CASE("pool audit: free neighbours must be merged unless a merge is to come",
          "[caching_pool][audit]") {
  HandMadeBooks books;
  books.live2.free = true;  // free1 + live2: a free pair on stream 0
  books.live.erase(books.live2.addr);
  books.counters.taken_back(books.live2.size, books.live2.requested);
  books.history.allocated_bytes.decrease(true, books.live2.size);
  books.history.allocations.decrease(true, 1);
  books.history.requested_bytes.decrease(true, books.live2.requested);
  books.live2.requested = 0;
  CHECK(has(books.audit(2), "unmerged free pair"));
  books.live2.pending = true;  // queued for a merge: fine
  CHECK(books.audit(2) == "");
  books.live2.pending = false;
  books.live2.stream = 5;  // different streams never merge
  CHECK(books.audit(2) == "");
  books.live2.stream = 0;
  books.recent.hold(&books.live2);  // held off the index: fine, and counted as held
  CHECK(books.audit(1) == "");
  CHECK(has(books.audit(2), "free blocks 2 but 2 indexed and 1 held"));
}

TEST_CASE("pool audit: the live map and the recent frees must agree with the blocks",
          "[caching_pool][audit]") {
  HandMadeBooks books;
  SECTION("a live block missing from the map") {
    books.live.erase(books.live1.addr);
    const std::string problems = books.audit();
    CHECK(has(problems, "live block missing from map"));
    CHECK(has(problems, "live map size disagrees"));
  }
  SECTION("a free block in the map") {
    books.live.insert(books.free1.addr, &books.free1);
    CHECK(has(books.audit(), "free block in live map"));
  }
  SECTION("a block marked recent that is not held") {
    books.free1.recent = true;
    CHECK(has(books.audit(0), "not held as it is"));
  }
  SECTION("a held block that changed size") {
    books.recent.hold(&books.free1);
    CHECK(books.audit(0) == "");
    books.free1.stream = 9;
    CHECK(has(books.audit(0), "not held as it is"));
  }
  SECTION("a live block marked recent") {
    books.live1.recent = true;
    CHECK(has(books.audit(), "live block marked recent"));
  }
}

TEST_CASE("pool audit: counters and history against the walk", "[caching_pool][audit]") {
  HandMadeBooks books;
  SECTION("allocated bytes") {
    books.counters.handed_out(kAlign, kAlign);
    const std::string problems = books.audit();
    CHECK(has(problems, "allocated counter"));
    CHECK(has(problems, "allocated count disagrees"));
    CHECK(has(problems, "requested counter disagrees"));
  }
  SECTION("reserved bytes") {
    books.counters.reserve(2 * MiB);
    CHECK(has(books.audit(), "reserved counter"));
  }
  SECTION("segments") {
    books.counters.segment_added();
    CHECK(has(books.audit(), "segment counter disagrees"));
  }
  SECTION("history") {
    books.history.allocations.increase(false, 1);
    books.history.segments.increase(false, 1);
    const std::string problems = books.audit();
    CHECK(has(problems, "history's allocation count disagrees"));
    CHECK(has(problems, "history's segment count disagrees"));
  }
}
