// One caching pool per device, made on first use, for one kind of memory.
//
//   PoolRegistry pools(ResourceKind::device);
//   ManagedBuffer buf(pools.pool(0), bytes);
//   auto [allocated, peak] = pools.total_usage();
//   ManagedBuffer b(pools.pool_for(0, stream), bytes, stream);  // capture-aware
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/graph_pools.hpp"

namespace gpukeeper {

class PoolRegistry {
 public:
  explicit PoolRegistry(ResourceKind kind, PoolOptions options = {});
  // Pools that outlive the registry (blocks still out: a buffer keeps its pool alive)
  // become orphans, which orphaned_pools() lists: memory still held must stay counted.
  ~PoolRegistry();
  PoolRegistry(const PoolRegistry&) = delete;
  PoolRegistry& operator=(const PoolRegistry&) = delete;

  // The pool of `device`, made on first use. InvalidInputError for a device id the kind
  // does not have; DeviceError when the kind is unavailable on this machine.
  std::shared_ptr<CachingPool> pool(int device);

  // The pool for an allocation on `stream`: pool(device), except while `stream` captures a
  // CUDA graph (device memory only). Then it is that capture's own pool: its blocks serve
  // the capture and nothing else until the graph is destroyed, since every replay writes
  // to the addresses the capture baked in. One query of the stream's capture state per call
  // on a stream other than the legacy default.
  std::shared_ptr<CachingPool> pool_for(int device, stream_t stream);

  // The capture pools of `device` (see pool_for), and freeing those whose graph is gone
  // and whose blocks are all back; returns the bytes freed. emergency_cleanup_all() does
  // this for every device.
  std::vector<GraphPoolInfo> capture_pools(int device);
  std::size_t drop_retired_captures(int device);

  // The pool of `device` if it was made already, else nullptr (never throws).
  std::shared_ptr<CachingPool> find(int device) const;
  // The pool of `device` without a lock or a reference count, once made (nullptr before,
  // and for devices beyond the first few): the free path's lookup. The registry keeps
  // the pool alive as long as itself.
  CachingPool* made(int device) const noexcept {
    if (device < 0 || device >= kPublished || !is_published_[device].load(std::memory_order_acquire)) {
      return nullptr;
    }
    return published_[device].get();
  }

  // Pools made so far, in device order.
  std::vector<std::shared_ptr<CachingPool>> pools() const;

  // Sum over pools of (allocated bytes, peak allocated bytes).
  std::pair<std::size_t, std::size_t> total_usage() const;

  // emergency_cleanup() on every pool; returns the bytes released.
  std::size_t emergency_cleanup_all();

  ResourceKind kind() const noexcept { return kind_; }
  const PoolOptions& options() const noexcept { return options_; }
  // Options for the pools not made yet: InvalidInputError once any pool is made (a
  // pool's layout cannot change under its blocks).
  void set_options(PoolOptions options);
  // Device ids this kind accepts: [0, device_count()).
  int device_count() const noexcept { return resource_device_count(kind_); }

 private:
  std::shared_ptr<GraphPools> captures_for(int device);

  // Pools of the first device ids, each written once (under mutex_) before its flag is
  // set: pool() reads them without the mutex, as every Python allocation calls it.
  static constexpr int kPublished = 16;

  ResourceKind kind_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<CachingPool>> pools_;  // index: device id
  std::vector<std::shared_ptr<GraphPools>> captures_;  // index: device id, made on first capture
  std::shared_ptr<CachingPool> published_[kPublished];
  std::atomic<bool> is_published_[kPublished] = {};
};

// The pools whose registry is gone but which still live, because blocks of theirs are
// still out (a ManagedBuffer returned from a function whose MemoryPool went out of
// scope). The process's account reads them like any pool; expired ones are dropped here.
std::vector<std::shared_ptr<CachingPool>> orphaned_pools();

}  // namespace gpukeeper
