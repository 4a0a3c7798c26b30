#include "gpukeeper/memory/pool_registry.hpp"

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

PoolRegistry::PoolRegistry(ResourceKind kind, PoolOptions options)
    : kind_(kind), options_(options) {}

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
  return released;
}

}  // namespace gpukeeper
