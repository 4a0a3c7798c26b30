// GraphPools: routings send a capture's allocations to a private pool, whose blocks never
// serve other work, and whose memory goes back only once no graph uses it, none of its
// blocks is live and no capture is under way. Host memory stands in for the device here;
// the filters stand in for "this stream is capturing into that graph".
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gpukeeper/memory/graph_pools.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::GraphPoolId;
using gpukeeper::GraphPools;

namespace {

GraphPools host_graph_pools(std::atomic<int>* made = nullptr) {
  return GraphPools([made] {
    if (made != nullptr) ++*made;
    return gpukeeper::make_resource(ResourceKind::host, 0);
  });
}

const GraphPoolId kGraphA{0, 1};
const GraphPoolId kGraphB{0, 2};
const stream_t kCapturing = 7;
const stream_t kOther = 9;

GraphPools::Filter only(stream_t stream) {
  return [stream](stream_t s) { return s == stream; };
}

}  // namespace

TEST_CASE("graph pools: only the filtered stream's allocations are routed, and only while open",
          "[graph_pools]") {
  std::atomic<int> made{0};
  GraphPools graphs = host_graph_pools(&made);
  CHECK_FALSE(graphs.routing());
  CHECK_FALSE(graphs.any());
  CHECK(graphs.allocate(1024, kCapturing) == nullptr);  // no routing: the caller's main pool

  graphs.begin_allocate(kGraphA, only(kCapturing));
  CHECK(graphs.routing());
  CHECK(graphs.any());
  CHECK(made == 1);
  CHECK(graphs.allocate(1024, kOther) == nullptr);
  void* p = graphs.allocate(1024, kCapturing);
  REQUIRE(p != nullptr);
  graphs.end_allocate(kGraphA);
  CHECK_FALSE(graphs.routing());
  CHECK(graphs.allocate(1024, kCapturing) == nullptr);  // closed: nothing routed

  CHECK(graphs.totals().allocated_count == 1);
  CHECK(graphs.deallocate(p));
  int foreign = 0;
  CHECK_FALSE(graphs.deallocate(&foreign));  // not a private block: the caller's to free
  CHECK(graphs.any());  // the graph still uses its pool: its memory stays
  CHECK(graphs.totals().reserved_bytes > 0);
  graphs.release(kGraphA);
  CHECK_FALSE(graphs.any());
  CHECK(graphs.totals().reserved_bytes == 0);
}

TEST_CASE("graph pools: a block freed during the capture serves the capture again; after it, "
          "only the next capture into the same pool", "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  graphs.begin_allocate(kGraphA, only(kCapturing));
  void* a = graphs.allocate(4096, kCapturing);
  REQUIRE(graphs.deallocate(a));
  void* b = graphs.allocate(4096, kCapturing);
  CHECK(b == a);  // reused within the capture, on its own stream
  graphs.end_allocate(kGraphA);
  REQUIRE(graphs.deallocate(b));  // the graph's output, dropped after the capture

  // Another graph never sees graph A's addresses, even with A's blocks all free.
  graphs.begin_allocate(kGraphB, only(kCapturing));
  void* c = graphs.allocate(4096, kCapturing);
  CHECK(c != a);
  graphs.end_allocate(kGraphB);
  REQUIRE(graphs.deallocate(c));

  // A second capture into A (PyTorch's pool=) reuses A's cache.
  graphs.begin_allocate(kGraphA, only(kCapturing));
  void* d = graphs.allocate(4096, kCapturing);
  CHECK(d == a);
  graphs.end_allocate(kGraphA);
  REQUIRE(graphs.deallocate(d));
  auto infos = graphs.pools();
  REQUIRE(infos.size() == 2);
  for (const auto& info : infos) {
    INFO("pool (" << info.id.first << ", " << info.id.second << ")");
    CHECK(info.uses == (info.id == kGraphA ? 2 : 1));
    CHECK_FALSE(info.routing);
  }
  graphs.release(kGraphA);
  CHECK(graphs.pools().size() == 2);  // one use of A is left
  graphs.release(kGraphA);
  graphs.release(kGraphB);
  CHECK(graphs.pools().empty());
}

TEST_CASE("graph pools: a released graph's pool lives while a block of it is live",
          "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  graphs.begin_allocate(kGraphA, only(kCapturing));
  void* out = graphs.allocate(1 << 20, kCapturing);
  graphs.end_allocate(kGraphA);
  graphs.release(kGraphA);  // the graph is gone; its output tensor is not
  CHECK(graphs.any());
  CHECK(graphs.totals().allocated_count == 1);
  CHECK(graphs.deallocate(out));
  CHECK_FALSE(graphs.any());
}

TEST_CASE("graph pools: no pool is freed while a capture is under way", "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  graphs.begin_allocate(kGraphA, only(kCapturing));
  void* a = graphs.allocate(1024, kCapturing);
  graphs.end_allocate(kGraphA);
  graphs.release(kGraphA);
  graphs.begin_allocate(kGraphB, only(kOther));  // another capture starts
  CHECK(graphs.deallocate(a));
  CHECK(graphs.pools().size() == 2);  // A waits: freeing would wait on the device
  CHECK(graphs.release_unused() == 0);
  graphs.end_allocate(kGraphB);
  CHECK(graphs.pools().size() == 1);  // A went with the capture's end; B is in use
  graphs.release(kGraphB);
  CHECK(graphs.pools().empty());
}

TEST_CASE("graph pools: the newest routing that accepts the stream wins", "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  graphs.begin_allocate(kGraphA, [](stream_t) { return true; });
  graphs.begin_allocate(kGraphB, only(kCapturing));
  void* b = graphs.allocate(512, kCapturing);
  void* a = graphs.allocate(512, kOther);
  for (const auto& info : graphs.pools()) {
    CHECK(info.routing);
    CHECK(info.stats.allocated_count == 1);
  }
  CHECK(graphs.deallocate(a));
  CHECK(graphs.deallocate(b));
  graphs.end_allocate(kGraphB);
  graphs.end_allocate(kGraphA);
  graphs.release(kGraphA);
  graphs.release(kGraphB);
  CHECK_FALSE(graphs.any());
}

TEST_CASE("graph pools: bad calls are typed errors and change nothing", "[graph_pools][bad_input]") {
  GraphPools graphs = host_graph_pools();
  CHECK_THROWS_AS(GraphPools(GraphPools::MakeUpstream{}), InvalidInputError);
  CHECK_THROWS_AS(graphs.begin_allocate(kGraphA, GraphPools::Filter{}), InvalidInputError);
  CHECK_FALSE(graphs.any());
  CHECK_THROWS_AS(graphs.end_allocate(kGraphA), InvalidInputError);
  CHECK_THROWS_AS(graphs.release(kGraphA), InvalidInputError);
  graphs.begin_allocate(kGraphA, only(kCapturing));
  CHECK_THROWS_AS(graphs.begin_allocate(kGraphA, only(kOther)), InvalidInputError);
  CHECK(graphs.pools().size() == 1);
  CHECK(graphs.pools()[0].uses == 1);
  CHECK_THROWS_AS(graphs.allocate(0, kCapturing), InvalidInputError);  // routed: as a pool
  CHECK(graphs.totals().allocated_count == 0);
  graphs.end_allocate(kGraphA);
  graphs.release(kGraphA);
  CHECK_THROWS_AS(graphs.release(kGraphA), InvalidInputError);  // gone with its last use
}

TEST_CASE("graph pools: threads allocating and freeing while captures open and close",
          "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  std::atomic<bool> stop{false};
  std::atomic<int> routed{0};
  std::atomic<int> lost{0};  // private blocks the pools no longer knew (Catch asserts on this thread only)
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      std::vector<void*> mine;
      const stream_t stream = static_cast<stream_t>(100 + t);
      while (!stop) {
        if (void* p = graphs.allocate(256 * (t + 1), stream)) {
          mine.push_back(p);
          ++routed;
        }
        if (mine.size() > 8) {
          if (!graphs.deallocate(mine.front())) ++lost;
          mine.erase(mine.begin());
        }
      }
      for (void* p : mine) {
        if (!graphs.deallocate(p)) ++lost;
      }
    });
  }
  for (std::uint64_t g = 1; g <= 200; ++g) {
    const GraphPoolId id{0, g};
    graphs.begin_allocate(id, [g](stream_t s) { return s == static_cast<stream_t>(100 + g % 4); });
    // Open until the worker on that stream was routed once (bounded): on a loaded machine
    // a single yield may end the capture before any worker runs.
    const int before = routed.load();
    for (int spin = 0; spin < 100000 && routed.load() == before; ++spin) std::this_thread::yield();
    graphs.end_allocate(id);
    graphs.release(id);
  }
  stop = true;
  for (auto& w : workers) w.join();
  CHECK(routed > 0);
  CHECK(lost == 0);
  CHECK_FALSE(graphs.any());  // every block came back, every graph was released
}

// Captures nobody announces: the registry asks for the capture's pool while it sees the
// capture, and the graph's destructor hook retires it, possibly from another thread.
TEST_CASE("graph pools: a capture pool is held until its graph retires it and a cleanup drops it",
          "[graph_pools]") {
  std::atomic<int> made{0};
  GraphPools graphs = host_graph_pools(&made);
  const GraphPoolId capture{~std::uint64_t{0}, 41};
  bool first = false;
  auto pool = graphs.capture_pool(capture, &first);
  CHECK(first);
  CHECK(graphs.capture_pool(capture, &first) == pool);  // the same capture, the same pool
  CHECK_FALSE(first);
  CHECK(made == 1);
  CHECK_FALSE(graphs.routing());  // nothing is routed: the caller hands out the blocks

  void* temp = pool->allocate(4096, kCapturing);
  void* out = pool->allocate(4096, kCapturing);
  pool->deallocate(temp);  // freed inside the capture: stays the capture's
  CHECK(graphs.drop_retired() == 0);  // the graph is alive: nothing goes
  REQUIRE(graphs.pools().size() == 1);
  CHECK(graphs.pools()[0].uses == 1);

  std::thread([&] { graphs.retire(capture); }).join();  // CUDA's destructor thread
  graphs.drop_retired();
  REQUIRE(graphs.pools().size() == 1);  // its output is still held by its owner
  CHECK(graphs.pools()[0].uses == 0);
  pool->deallocate(out);
  const std::size_t held = pool->stats().reserved_bytes;
  CHECK(held > 0);
  CHECK(graphs.drop_retired() == held);
  CHECK(graphs.pools().empty());
  CHECK_FALSE(graphs.any());
  CHECK(graphs.drop_retired() == 0);
}

TEST_CASE("graph pools: retirement only counts, without freeing, when asked so", "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  const GraphPoolId capture{~std::uint64_t{0}, 5};
  auto pool = graphs.capture_pool(capture);
  pool->deallocate(pool->allocate(1 << 20, kCapturing));
  graphs.retire(capture);
  graphs.retire(GraphPoolId{~std::uint64_t{0}, 99});  // an id never seen: ignored
  CHECK(graphs.drop_retired(false) == 0);
  REQUIRE(graphs.pools().size() == 1);
  CHECK(graphs.pools()[0].uses == 0);
  CHECK(graphs.drop_retired() > 0);
  CHECK(graphs.pools().empty());
}

TEST_CASE("graph pools: one pool's cache is released alone, and only once no graph uses it",
          "[graph_pools]") {
  GraphPools graphs = host_graph_pools();
  graphs.begin_allocate(kGraphA, only(kCapturing));
  void* out = graphs.allocate(1 << 20, kCapturing);
  void* scratch = graphs.allocate(32 << 20, kCapturing);  // a segment of its own
  CHECK(graphs.deallocate(scratch));
  graphs.end_allocate(kGraphA);
  graphs.begin_allocate(kGraphB, only(kOther));
  void* b = graphs.allocate(32 << 20, kOther);
  CHECK(graphs.deallocate(b));
  graphs.end_allocate(kGraphB);
  CHECK(graphs.release_unused(kGraphA) == 0);  // A's graph may still replay
  graphs.release(kGraphA);                     // the graph is gone; its output is not
  const std::size_t b_reserved = graphs.find_pool(kGraphB)->stats().reserved_bytes;
  CHECK(graphs.release_unused(kGraphA) >= std::size_t{32} << 20);
  CHECK(graphs.find_pool(kGraphB)->stats().reserved_bytes == b_reserved);  // B untouched
  CHECK(graphs.release_unused(GraphPoolId{0, 99}) == 0);                // no such pool
  CHECK(graphs.deallocate(out));
  graphs.release(kGraphB);
}
