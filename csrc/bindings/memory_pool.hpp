// What the files that bind MemoryPool share: the class type, pool lookups, method groups.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "bindings.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/pool_registry.hpp"

namespace gpukeeper::py_bindings {

using PoolClass = py::class_<PoolRegistry>;

// The device's pool, made on first use (PoolRegistry::pool says what it throws).
inline std::shared_ptr<CachingPool> device_pool(PoolRegistry& reg, const py::handle& device) {
  return reg.pool(to_device_id(device));
}

// The pool for a device id that exists, or nullptr for ids the kind does not have.
inline std::shared_ptr<CachingPool> pool_if_valid(PoolRegistry& reg, const py::handle& device) {
  int id = to_device_id(device);
  if (id >= reg.device_count()) return nullptr;
  return reg.pool(id);
}

// pool_pressure.cpp
void def_pool_release(PoolClass& pool_class);
void def_pool_callbacks(PoolClass& pool_class);
// pool_stats.cpp
void def_pool_usage(PoolClass& pool_class);
void def_pool_history(PoolClass& pool_class);

}  // namespace gpukeeper::py_bindings
