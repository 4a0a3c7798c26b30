#include "gpukeeper/memory/pool_registry.hpp"

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/stream_capture.hpp"

namespace gpukeeper {

namespace {

struct Orphans {
  std::mutex mutex;
  std::vector<std::weak_ptr<CachingPool>> pools;
};
// Never destroyed: buffers may die while the process exits, after static destructors.
Orphans& orphans() {
  static Orphans* o = new Orphans();
  return *o;
}

}  // namespace

PoolRegistry::PoolRegistry(ResourceKind kind, PoolOptions options)
    : kind_(kind), options_(options) {}

PoolRegistry::~PoolRegistry() {
  std::vector<std::weak_ptr<CachingPool>> left;
  for (std::size_t d = 0; d < pools_.size(); ++d) {
    const auto& p = pools_[d];
    if (!p) continue;
    // More owners than this registry (and its published copy): blocks are still out.
    const long own = 1 + (d < static_cast<std::size_t>(kPublished) && published_[d] ? 1 : 0);
    if (p.use_count() > own) left.push_back(p);
  }
  if (left.empty()) return;
  try {
    Orphans& o = orphans();
    std::lock_guard<std::mutex> lock(o.mutex);
    o.pools.insert(o.pools.end(), left.begin(), left.end());
  } catch (...) {
    // Out of host memory in a destructor: those pools go uncounted, their memory stays safe.
  }
}

std::vector<std::shared_ptr<CachingPool>> orphaned_pools() {
  Orphans& o = orphans();
  std::lock_guard<std::mutex> lock(o.mutex);
  std::vector<std::shared_ptr<CachingPool>> alive;
  std::vector<std::weak_ptr<CachingPool>> kept;
  for (const auto& w : o.pools) {
    if (auto p = w.lock()) {
      alive.push_back(p);
      kept.push_back(w);
    }
  }
  o.pools.swap(kept);
  return alive;
}

std::shared_ptr<CachingPool> PoolRegistry::pool(int device) {
  if (device >= 0 && device < kPublished &&
      is_published_[device].load(std::memory_order_acquire)) {
    return published_[device];
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (device >= 0 && static_cast<std::size_t>(device) < pools_.size() && pools_[device]) {
    return pools_[device];
  }
  int count = resource_device_count(kind_);
  std::string why;
  // Device 0 of a kind this machine lacks: the kind is unavailable (other ids are plain
  // input errors, as they would be on any machine).
  if (count == 0 && device == 0 && !resource_available(kind_, device, &why)) {
    throw DeviceError(std::string("PoolRegistry::pool(") + to_string(kind_) + ")", 0,
                      "unavailable", why);
  }
  if (device < 0 || device >= count) {
    throw InvalidInputError("device " + std::to_string(device) + " does not exist for " +
                            to_string(kind_) + " memory (valid ids: 0.." +
                            std::to_string(count - 1) + ")" +
                            (count == 0 ? std::string("; no CUDA device is usable") : ""));
  }
  auto made = std::make_shared<CachingPool>(make_resource(kind_, device), options_);
  if (pools_.size() <= static_cast<std::size_t>(device)) pools_.resize(device + 1);
  pools_[device] = made;
  if (device < kPublished) {
    published_[device] = made;
    is_published_[device].store(true, std::memory_order_release);
  }
  return made;
}

namespace {

// What a graph's destructor hook needs: the pools (weakly: the registry may be gone first)
// and the capture's id.
struct GraphGone {
  std::weak_ptr<GraphPools> pools;
  GraphPoolId id;
};

void on_graph_gone(void* context) {
  std::unique_ptr<GraphGone> gone(static_cast<GraphGone*>(context));
  if (auto pools = gone->pools.lock()) pools->retire(gone->id);
}

// Capture pools' ids, apart from PyTorch's (0, n) and (n, 0).
constexpr std::uint64_t kCaptureTag = ~std::uint64_t{0};

}  // namespace

std::shared_ptr<CachingPool> PoolRegistry::pool_for(int device, stream_t stream) {
  if (stream == 0 || (kind_ != ResourceKind::device && kind_ != ResourceKind::async)) {
    return pool(device);
  }
  const detail::StreamCapture capture = detail::capture_of(stream);
  if (!capture.active) return pool(device);
  std::shared_ptr<GraphPools> pools = captures_for(device);
  const GraphPoolId id{kCaptureTag, capture.id};
  bool made = false;
  auto chosen = pools->capture_pool(id, &made);
  if (made) {
    auto gone = std::make_unique<GraphGone>(GraphGone{pools, id});
    // Where the hook cannot be set the pool stays held for the process: never reused early.
    if (detail::on_graph_destroyed(capture.graph, on_graph_gone, gone.get())) gone.release();
  }
  return chosen;
}

std::shared_ptr<GraphPools> PoolRegistry::captures_for(int device) {
  (void)pool(device);  // the same checks of the id, and the main pool exists beside it
  std::lock_guard<std::mutex> lock(mutex_);
  if (captures_.size() <= static_cast<std::size_t>(device)) captures_.resize(device + 1);
  auto& slot = captures_[device];
  if (!slot) {
    // Plain cudaMalloc beneath, for the async kind too: a stream-ordered allocation made
    // during a capture would become a node of the graph, not memory the pool may keep.
    slot = std::make_shared<GraphPools>([device] { return make_resource(ResourceKind::device, device); },
                                        options_);
  }
  return slot;
}

std::vector<GraphPoolInfo> PoolRegistry::capture_pools(int device) {
  std::shared_ptr<GraphPools> pools;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device >= 0 && static_cast<std::size_t>(device) < captures_.size()) pools = captures_[device];
  }
  if (!pools) return {};
  pools->drop_retired(false);  // uses as of now: graphs destroyed since count as gone
  return pools->pools();
}

std::size_t PoolRegistry::drop_retired_captures(int device) {
  std::shared_ptr<GraphPools> pools;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device >= 0 && static_cast<std::size_t>(device) < captures_.size()) pools = captures_[device];
  }
  return pools ? pools->drop_retired() : 0;
}

void PoolRegistry::set_options(PoolOptions options) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& p : pools_) {
    if (p) {
      throw InvalidInputError("the pools' options can no longer change: a pool was made on device " +
                              std::to_string(p->device()));
    }
  }
  options_ = options;
}

std::shared_ptr<CachingPool> PoolRegistry::find(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < 0 || static_cast<std::size_t>(device) >= pools_.size()) return nullptr;
  return pools_[device];
}

std::vector<std::shared_ptr<CachingPool>> PoolRegistry::pools() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<CachingPool>> made;
  for (const auto& p : pools_) {
    if (p) made.push_back(p);
  }
  return made;
}

std::pair<std::size_t, std::size_t> PoolRegistry::total_usage() const {
  std::size_t allocated = 0, peak = 0;
  for (const auto& p : pools()) {
    PoolStats s = p->stats();
    allocated += s.allocated_bytes;
    peak += s.peak_allocated_bytes;
  }
  return {allocated, peak};
}

std::size_t PoolRegistry::emergency_cleanup_all() {
  std::size_t released = 0;
  for (const auto& p : pools()) released += p->emergency_cleanup();
  std::size_t devices = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    devices = captures_.size();
  }
  for (std::size_t d = 0; d < devices; ++d) released += drop_retired_captures(static_cast<int>(d));
  return released;
}

}  // namespace gpukeeper
