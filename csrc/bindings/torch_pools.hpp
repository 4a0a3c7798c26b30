// The caching pools behind PyTorch, one per device (torch_allocator.cpp), for the other
// files that serve PyTorch: its graph pools and the table handed to the allocator component.
#pragma once

#include <memory>

#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/graph_pools.hpp"
#include "gpukeeper/memory/pool_registry.hpp"
#include "torch_ext/pool_api.hpp"

namespace gpukeeper::py_bindings {

PoolRegistry& torch_pools();
// The device's pool, made on first use (with the reclaim callback that asks the rest of
// the process for memory).
std::shared_ptr<CachingPool> torch_pool(int device);
// The device's pool if PyTorch allocated there, else nullptr; never makes one.
std::shared_ptr<CachingPool> existing_torch_pool(int device);
// The pool functions both routes into PyTorch use (torch_pool_api.cpp): the allocator
// component through its table, the pluggable route's two exported functions directly.
const torch_api::Api& torch_pool_api();
// Hands a segment event of a pool behind PyTorch to the component's sink, if it set one
// (torch_pool_api.cpp): every torch pool and graph pool reports through it.
void report_segment_event(int device, const GraphPoolId& pool, const SegmentEvent& event);

}  // namespace gpukeeper::py_bindings
