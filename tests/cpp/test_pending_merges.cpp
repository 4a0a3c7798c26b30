// PendingMerges (pending_merges.hpp): the intrusive queue of freed blocks whose merge with
// their free neighbours is to come. How the pool merges them is in test_caching_pool.cpp.
#include <vector>

#include "gpukeeper/memory/pending_merges.hpp"
#include "test_support.hpp"

using gpukeeper::detail::Block;
using gpukeeper::detail::PendingMerges;
using namespace gktest;

namespace {

std::vector<Block*> queued(const PendingMerges& pending) {
  std::vector<Block*> out;
  for (Block* b = pending.front(); b != nullptr; b = b->pending_next) out.push_back(b);
  return out;
}

}  // namespace

TEST_CASE("pending merges: blocks queue once, newest first, and leave from anywhere",
          "[caching_pool][pending]") {
  PendingMerges pending;
  CHECK(pending.empty());
  CHECK(pending.front() == nullptr);
  Block a, b, c, d;
  CHECK(pending.add(&a));
  CHECK(pending.add(&b));
  CHECK(pending.add(&c));
  CHECK_FALSE(pending.add(&b));  // queued already: nothing changes
  CHECK(pending.size() == 3);
  CHECK(queued(pending) == std::vector<Block*>{&c, &b, &a});
  CHECK(b.pending);
  CHECK_FALSE(d.pending);

  pending.remove(&b);  // the middle
  CHECK_FALSE(b.pending);
  CHECK(b.pending_prev == nullptr);
  CHECK(b.pending_next == nullptr);
  CHECK(queued(pending) == std::vector<Block*>{&c, &a});
  pending.remove(&d);  // not queued: nothing changes
  CHECK(pending.size() == 2);
  pending.remove(&c);  // the front
  CHECK(pending.front() == &a);
  CHECK(a.pending_prev == nullptr);
  pending.add(&d);
  pending.remove(&a);  // the back
  CHECK(queued(pending) == std::vector<Block*>{&d});
  pending.remove(&d);
  CHECK(pending.empty());
  CHECK(pending.size() == 0);
  for (const Block* x : {&a, &b, &c, &d}) CHECK_FALSE(x->pending);
}

TEST_CASE("pending merges: drained from the front, as merge_pending() does",
          "[caching_pool][pending]") {
  PendingMerges pending;
  std::vector<Block> blocks(100);
  for (Block& b : blocks) pending.add(&b);
  for (std::size_t i = 0; i < blocks.size(); i += 3) pending.remove(&blocks[i]);
  std::size_t drained = 0;
  while (!pending.empty()) {
    Block* b = pending.front();
    pending.remove(b);
    CHECK_FALSE(b->pending);
    ++drained;
  }
  CHECK(drained == 66);
  CHECK(pending.size() == 0);
}
