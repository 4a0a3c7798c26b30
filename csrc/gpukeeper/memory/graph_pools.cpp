#include "gpukeeper/memory/graph_pools.hpp"

#include <algorithm>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

namespace {
std::string id_text(GraphPoolId id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}
}  // namespace

GraphPools::GraphPools(MakeUpstream make_upstream, PoolOptions options)
    : make_upstream_(std::move(make_upstream)), options_(options) {
  if (!make_upstream_) throw InvalidInputError("GraphPools needs a way to make upstreams");
  // Pages are never moved under a graph's addresses: its pools use fixed segments.
  options_.segments = SegmentLayout::fixed;
  options_.max_pool_size = 0;
}

GraphPools::~GraphPools() = default;

GraphPools::Entry* GraphPools::find(GraphPoolId id) {
  for (auto& e : entries_) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

void GraphPools::begin_allocate(GraphPoolId id, Filter filter) {
  if (!filter) throw InvalidInputError("begin_allocate: the stream filter is empty");
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : routes_) {
    if (r.id == id) {
      throw InvalidInputError("begin_allocate: a routing to graph pool " + id_text(id) +
                              " is open already (one capture at a time per pool)");
    }
  }
  Entry* e = find(id);
  if (e == nullptr) {
    // The upstream is made outside nothing: it may throw, and then nothing changed.
    auto pool = std::make_shared<CachingPool>(make_upstream_(), options_);
    observe(id, *pool);
    entries_.push_back(Entry{id, 0, std::move(pool)});
    e = &entries_.back();
    live_pools_.fetch_add(1, std::memory_order_release);
  }
  ++e->uses;
  routes_.push_back(Route{id, std::move(filter), e->pool});
  open_routes_.fetch_add(1, std::memory_order_release);
}

void GraphPools::end_allocate(GraphPoolId id) {
  std::vector<std::shared_ptr<CachingPool>> dead;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(routes_.begin(), routes_.end(), [&](const Route& r) { return r.id == id; });
    if (it == routes_.end()) {
      throw InvalidInputError("end_allocate: no routing to graph pool " + id_text(id) + " is open");
    }
    routes_.erase(it);
    open_routes_.fetch_sub(1, std::memory_order_release);
    collect(dead);
  }
}

void GraphPools::release(GraphPoolId id) {
  std::vector<std::shared_ptr<CachingPool>> dead;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = find(id);
    if (e == nullptr) throw InvalidInputError("release: no graph pool " + id_text(id));
    if (e->uses <= 0) throw InvalidInputError("release: graph pool " + id_text(id) + " has no use left");
    --e->uses;
    collect(dead);
  }
}

std::shared_ptr<CachingPool> GraphPools::capture_pool(GraphPoolId id, bool* made) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (made != nullptr) *made = false;
  if (Entry* e = find(id)) return e->pool;
  auto pool = std::make_shared<CachingPool>(make_upstream_(), options_);
  observe(id, *pool);
  entries_.push_back(Entry{id, 1, pool});
  live_pools_.fetch_add(1, std::memory_order_release);
  if (made != nullptr) *made = true;
  return pool;
}

void GraphPools::retire(GraphPoolId id) noexcept {
  try {
    std::lock_guard<std::mutex> lock(retired_.mutex);
    retired_.ids.push_back(id);
  } catch (...) {
    // Out of host memory in CUDA's thread: the pool stays held, which is safe.
  }
}

std::size_t GraphPools::drop_retired(bool free) {
  std::vector<GraphPoolId> ids;
  {
    std::lock_guard<std::mutex> lock(retired_.mutex);
    ids.swap(retired_.ids);
  }
  std::vector<std::shared_ptr<CachingPool>> dead;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& id : ids) {
      Entry* e = find(id);
      if (e != nullptr && e->uses > 0) --e->uses;
    }
    if (free) collect(dead);
  }
  std::size_t released = 0;
  for (const auto& pool : dead) released += pool->stats().reserved_bytes;
  return released;  // `dead` frees their segments here, outside the lock
}

std::shared_ptr<CachingPool> GraphPools::find_pool(GraphPoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(id);
  return e == nullptr ? nullptr : e->pool;
}

int GraphPools::uses(GraphPoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(id);
  return e == nullptr ? -1 : e->uses;
}

std::vector<std::pair<GraphPoolId, std::shared_ptr<CachingPool>>> GraphPools::all_pools() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<GraphPoolId, std::shared_ptr<CachingPool>>> out;
  for (const auto& e : entries_) out.emplace_back(e.id, e.pool);
  return out;
}

void* GraphPools::allocate(std::size_t bytes, stream_t stream) {
  // The lock is held through the allocation: a routing closed and released meanwhile
  // would otherwise see its pool empty and drop it under a block about to be handed out.
  // Routed allocations happen during captures only, off any hot path.
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->filter(stream)) return it->pool->allocate(bytes, stream);
  }
  return nullptr;
}

bool GraphPools::deallocate(void* ptr) {
  std::vector<std::shared_ptr<CachingPool>> dead;
  std::shared_ptr<CachingPool> owner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& e : entries_) {
      if (e.pool->owns(ptr)) {
        owner = e.pool;
        break;
      }
    }
  }
  if (!owner) return false;
  owner->deallocate(ptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collect(dead);
  }
  return true;
}

void GraphPools::collect(std::vector<std::shared_ptr<CachingPool>>& dead) {
  if (!routes_.empty()) return;  // freeing segments waits on the device: not mid-capture
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->uses == 0 && it->pool->stats().allocated_count == 0) {
      dead.push_back(std::move(it->pool));
      it = entries_.erase(it);
      live_pools_.fetch_sub(1, std::memory_order_release);
    } else {
      ++it;
    }
  }
}

PoolStats GraphPools::totals() const {
  PoolStats sum;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : entries_) {
    const PoolStats s = e.pool->stats();
    sum.allocated_bytes += s.allocated_bytes;
    sum.allocated_count += s.allocated_count;
    sum.requested_bytes += s.requested_bytes;
    sum.reserved_bytes += s.reserved_bytes;
    sum.cached_bytes += s.cached_bytes;
    sum.segment_count += s.segment_count;
    sum.peak_allocated_bytes += s.peak_allocated_bytes;
    sum.peak_reserved_bytes += s.peak_reserved_bytes;
    sum.cache_hits += s.cache_hits;
    sum.cache_misses += s.cache_misses;
    sum.upstream_allocations += s.upstream_allocations;
    sum.upstream_frees += s.upstream_frees;
    sum.largest_free_block = std::max(sum.largest_free_block, s.largest_free_block);
  }
  return sum;
}

std::vector<GraphPoolInfo> GraphPools::pools() const {
  std::vector<GraphPoolInfo> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : entries_) {
    const bool routing = std::any_of(routes_.begin(), routes_.end(),
                                     [&](const Route& r) { return r.id == e.id; });
    out.push_back(GraphPoolInfo{e.id, e.uses, routing, e.pool->stats()});
  }
  return out;
}

std::size_t GraphPools::release_unused() {
  std::vector<std::shared_ptr<CachingPool>> unused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!routes_.empty()) return 0;
    for (auto& e : entries_) {
      if (e.uses == 0) unused.push_back(e.pool);
    }
  }
  std::size_t released = 0;
  for (auto& pool : unused) released += pool->emergency_cleanup();
  return released;
}

void GraphPools::set_segment_observer(PoolSegmentObserver observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  segment_observer_ = std::move(observer);
  for (Entry& e : entries_) observe(e.id, *e.pool);
}

void GraphPools::observe(const GraphPoolId& id, CachingPool& pool) {
  if (!segment_observer_) {
    pool.set_segment_observer(nullptr);
    return;
  }
  pool.set_segment_observer(
      [observer = segment_observer_, id](const SegmentEvent& event) { observer(id, event); });
}

std::size_t GraphPools::release_unused(GraphPoolId id) {
  std::shared_ptr<CachingPool> pool;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!routes_.empty()) return 0;
    Entry* e = find(id);
    if (e == nullptr || e->uses != 0) return 0;
    pool = e->pool;
  }
  return pool->emergency_cleanup();
}

}  // namespace gpukeeper
