// The private CUDA-graph pools behind PyTorch (torch_graph_pools.cpp), for the allocation
// functions PyTorch calls (torch_allocator.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include "gpukeeper/memory/graph_pools.hpp"

namespace gpukeeper::py_bindings {

// A device's graph pools, made on first use (a capture began there).
GraphPools& torch_graph_pools(int device);
// The same if made already, else nullptr: the check on PyTorch's allocation fast path.
GraphPools* torch_graph_pools_if_any(int device) noexcept;
// Sum of a device's graph pools' books (zero when none).
PoolStats torch_graph_totals(int device);
void init_torch_graph_pools(pybind11::module_& m);

}  // namespace gpukeeper::py_bindings
