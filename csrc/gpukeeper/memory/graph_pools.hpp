// Private pools for CUDA graph capture, one device's worth, kept the way PyTorch keeps
// its graph pools.
//
//   GraphPools graphs([] { return make_resource(ResourceKind::device, 0); });
//   graphs.begin_allocate(id, is_capturing_stream);  // a capture begins
//   void* p = graphs.allocate(bytes, stream);          // nullptr: not routed, use the main pool
//   graphs.end_allocate(id);                           // the capture ended
//   graphs.deallocate(p);                              // true: it was a private block
//   graphs.release(id);                                // the graph is gone
//
// A capture bakes the addresses it used into the graph, and every replay writes to them
// again. So while a routing is open, allocations on the streams its filter accepts come
// from that id's own CachingPool, and no block of it goes to other work: blocks freed
// during the capture are reused by the capture itself (on their own stream: a capturing
// stream never lends its blocks, see StreamEvents::done), and blocks freed after it (the
// graph's outputs, dropped by their owner) stay in the private pool for the next capture
// into the same id. Several graphs may share an id (PyTorch's `pool=`): each
// begin_allocate counts a use and each release gives one back. A pool's memory returns to
// the device once it has no use left and no live block, and no routing is open (its
// segments are freed after a device-wide wait, which would break a capture in flight).
// All members are thread-safe.
//
// Captures nobody announces (CuPy's Stream.begin_capture, a raw cudaStreamBeginCapture)
// have no begin, end or release call to hang this on. For them the pool registry asks
// capture_pool(id) for the pool of a capture it sees under way (one use, held for the
// graph), and the graph gives that use back through retire(id) when CUDA destroys it;
// drop_retired() then frees the pools of graphs that are gone, at a moment the caller
// knows to be safe (an explicit cleanup), never on its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

// PyTorch's MempoolId_t: (0, n) for the ids its graphs make, (n, 0) for user pools.
using GraphPoolId = std::pair<std::uint64_t, std::uint64_t>;

struct GraphPoolInfo {
  GraphPoolId id;
  int uses;             // begin_allocate calls not yet matched by release
  bool routing;         // a routing to it is open (a capture is under way)
  PoolStats stats;
};

class GraphPools {
 public:
  using Filter = std::function<bool(stream_t)>;
  using MakeUpstream = std::function<std::unique_ptr<MemoryResource>()>;

  explicit GraphPools(MakeUpstream make_upstream, PoolOptions options = {});
  ~GraphPools();
  GraphPools(const GraphPools&) = delete;
  GraphPools& operator=(const GraphPools&) = delete;

  // Opens a routing: allocations on streams for which `filter` is true come from `id`'s
  // pool (made on first use) until end_allocate(id). Counts one use of the pool.
  void begin_allocate(GraphPoolId id, Filter filter);
  // Closes the routing to `id` (InvalidInputError when none is open).
  void end_allocate(GraphPoolId id);
  // Gives back one use of `id`'s pool (InvalidInputError for an unknown id or no use
  // left); the pool's memory goes once nothing holds it.
  void release(GraphPoolId id);

  // From the pool of the newest open routing that accepts `stream`; nullptr when none
  // does (the caller's main pool serves it). Throws as CachingPool::allocate.
  void* allocate(std::size_t bytes, stream_t stream);
  // Returns `ptr` to the private pool that handed it out; false when none did.
  bool deallocate(void* ptr);

  // The pool of capture `id`, made on first use with one use held for its graph; `made`
  // says whether this call made it. Never routes: the caller hands out its blocks.
  std::shared_ptr<CachingPool> capture_pool(GraphPoolId id, bool* made = nullptr);
  // Gives back the graph's use of capture pool `id`, later: it only queues the id, so it is
  // safe from any thread, CUDA's destructor threads included (no CUDA call, no pool lock).
  void retire(GraphPoolId id) noexcept;
  // Applies the queued retirements, then with `free` frees the capture pools with no use
  // and no live block (their segments go back after a device-wide wait: not while a
  // capture is under way). Returns the bytes those pools held.
  std::size_t drop_retired(bool free = true);

  // Cheap checks for the callers' fast paths: any routing open, any private pool alive.
  bool routing() const noexcept { return open_routes_.load(std::memory_order_acquire) > 0; }
  bool any() const noexcept { return live_pools_.load(std::memory_order_acquire) > 0; }

  // The pool of `id` (nullptr when there is none) and the uses it has (-1 when none):
  // PyTorch's CUDA graph trees check and restore a pool's live blocks between recordings.
  std::shared_ptr<CachingPool> find_pool(GraphPoolId id);
  int uses(GraphPoolId id);
  // Every private pool with its id, for snapshots.
  std::vector<std::pair<GraphPoolId, std::shared_ptr<CachingPool>>> all_pools() const;

  // Sum of the private pools' stats (peaks: the sum of each pool's peak, an upper bound).
  PoolStats totals() const;
  std::vector<GraphPoolInfo> pools() const;
  // Tells `observer` of every private pool's segment events (CachingPool's), with the
  // pool's id, for the pools alive now and those made later.
  using PoolSegmentObserver = std::function<void(GraphPoolId, const SegmentEvent&)>;
  void set_segment_observer(PoolSegmentObserver observer);

  // Frees the cached segments of every private pool with no use left (a pool in use keeps
  // its memory: its graph may replay). Returns the bytes released.
  std::size_t release_unused();
  // The same for the private pool of `id` alone (0 when it has a use left, or none).
  std::size_t release_unused(GraphPoolId id);

 private:
  void observe(const GraphPoolId& id, CachingPool& pool);  // under mutex_
  PoolSegmentObserver segment_observer_;

  struct Entry {
    GraphPoolId id;
    int uses = 0;
    std::shared_ptr<CachingPool> pool;
  };
  struct Route {
    GraphPoolId id;
    Filter filter;
    std::shared_ptr<CachingPool> pool;
  };

  // Queued retirements; its own lock, since CUDA's threads push to it.
  struct RetireQueue {
    std::mutex mutex;
    std::vector<GraphPoolId> ids;
  };

  Entry* find(GraphPoolId id);
  // Drops the pools nothing holds; their destructors run after the lock is let go.
  void collect(std::vector<std::shared_ptr<CachingPool>>& dead);

  MakeUpstream make_upstream_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<Route> routes_;  // newest last
  RetireQueue retired_;
  std::atomic<int> open_routes_{0};
  std::atomic<int> live_pools_{0};
};

}  // namespace gpukeeper
