// Segment events (segment_events.hpp): what a pool tells its observer when memory behind
// it changes, on host memory standing in for the device. Fixed segments report alloc and
// free; expandable ranges report each page that takes up or leaves an address, so the
// events always add up to what the pool holds.
#include <map>
#include <vector>

#include "gpukeeper/memory/graph_pools.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::GraphPoolId;
using gpukeeper::GraphPools;
using gpukeeper::SegmentEvent;
using gpukeeper::SegmentEventKind;

namespace {

// Replays the events into "bytes held at each address" and checks each makes sense.
struct Ledger {
  std::map<std::uintptr_t, std::size_t> held;
  std::vector<SegmentEvent> events;
  int nonsense = 0;

  void operator()(const SegmentEvent& e) {
    events.push_back(e);
    const bool taking = e.kind == SegmentEventKind::alloc || e.kind == SegmentEventKind::map;
    if (taking) {
      if (!held.emplace(e.address, e.size).second) ++nonsense;  // taken twice
    } else {
      auto it = held.find(e.address);
      if (it == held.end() || it->second != e.size) ++nonsense;  // never taken
      if (it != held.end()) held.erase(it);
    }
  }
  std::size_t total() const {
    std::size_t sum = 0;
    for (const auto& [address, size] : held) sum += size;
    return sum;
  }
  int count(SegmentEventKind kind) const {
    int n = 0;
    for (const SegmentEvent& e : events) n += e.kind == kind;
    return n;
  }
};

}  // namespace

TEST_CASE("segment events: fixed segments are reported as taken and given back",
          "[caching_pool]") {
  PoolOptions options;
  options.segments = SegmentLayout::fixed;
  auto pool = make_pool(ResourceKind::host, options);
  Ledger ledger;
  pool->set_segment_observer([&ledger](const SegmentEvent& e) { ledger(e); });
  void* small = pool->allocate(4096);
  void* large = pool->allocate(30 * MiB);
  CHECK(ledger.count(SegmentEventKind::alloc) == 2);
  CHECK(ledger.total() == pool->stats().reserved_bytes);
  pool->deallocate(small);
  pool->deallocate(large);
  pool->emergency_cleanup();
  CHECK(ledger.count(SegmentEventKind::free) == 2);
  CHECK(ledger.held.empty());
  CHECK(ledger.nonsense == 0);
  pool->set_segment_observer(nullptr);  // nobody listens: no call
  pool->deallocate(pool->allocate(30 * MiB));
  CHECK(ledger.events.size() == 4);
}

TEST_CASE("segment events: an expandable range reports the pages it maps, moves and releases",
          "[caching_pool]") {
  PoolOptions options;
  options.segments = SegmentLayout::hybrid;
  options.expandable_range = 256 * MiB;
  options.expandable_slack = 0.0;
  auto pool = make_pool(ResourceKind::host, options);
  Ledger ledger;
  pool->set_segment_observer([&ledger](const SegmentEvent& e) { ledger(e); });
  // Sizes that change from step to step move pages around the range.
  for (int step = 0; step < 6; ++step) {
    void* a = pool->allocate((3 + step % 3) * MiB);
    void* b = pool->allocate((8 - step % 4) * MiB);
    pool->deallocate(a);
    void* c = pool->allocate((5 + step % 2) * MiB);
    pool->deallocate(b);
    pool->deallocate(c);
  }
  CHECK(ledger.count(SegmentEventKind::map) > 0);
  CHECK(ledger.nonsense == 0);
  CHECK(ledger.total() == pool->stats().reserved_bytes);  // what the events say is held
  for (const SegmentEvent& e : ledger.events) CHECK(e.size == 2 * MiB);
  pool->emergency_cleanup();
  CHECK(ledger.count(SegmentEventKind::unmap) > 0);
  CHECK(ledger.total() == pool->stats().reserved_bytes);
  CHECK(ledger.nonsense == 0);
  CHECK(pool->validate() == "");
}

TEST_CASE("segment events: graph pools report their segments with the pool's id",
          "[graph_pools]") {
  GraphPools graphs([] { return gpukeeper::make_resource(ResourceKind::host, 0); });
  std::vector<GraphPoolId> ids;
  Ledger ledger;
  graphs.set_segment_observer([&](GraphPoolId id, const SegmentEvent& e) {
    ids.push_back(id);
    ledger(e);
  });
  const GraphPoolId graph{0, 7};
  graphs.begin_allocate(graph, [](gpukeeper::stream_t) { return true; });
  void* p = graphs.allocate(1 << 20, 3);
  graphs.end_allocate(graph);
  REQUIRE(ids.size() == 1);
  CHECK(ids[0] == graph);
  CHECK(ledger.count(SegmentEventKind::alloc) == 1);
  CHECK(graphs.deallocate(p));
  graphs.release(graph);  // no use, no live block: the pool goes, its segment with it
  CHECK(ledger.count(SegmentEventKind::free) == 1);
  CHECK(ledger.held.empty());
}
