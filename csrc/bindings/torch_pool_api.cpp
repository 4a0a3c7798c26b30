// The table of pool functions _core hands to the PyTorch allocator component
// (csrc/torch_ext/pool_api.hpp): the same pools and graph pools that the pluggable
// allocator's two functions use, so that either route sees one set of books.
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/cuda_virtual_memory.hpp"
#include "gpukeeper/memory/graph_pools.hpp"
#include "torch_ext/pool_api.hpp"
#include "torch_graph_pools.hpp"
#include "torch_pools.hpp"

namespace gpukeeper::py_bindings {

namespace {

namespace api = torch_api;

stream_t as_stream(void* s) { return reinterpret_cast<stream_t>(s); }
void* as_handle(stream_t s) { return reinterpret_cast<void*>(s); }
GraphPoolId to_id(api::PoolId id) { return {id.first, id.second}; }

void* allocate(std::size_t bytes, int device, void* stream, api::Status* status,
               std::string* error) {
  *status = api::Status::ok;
  try {
    // While a capture routes this device's allocations, the capture's streams are served
    // by its private pool; otherwise this costs one atomic load.
    if (GraphPools* graphs = torch_graph_pools_if_any(device);
        graphs != nullptr && graphs->routing()) {
      if (void* p = graphs->allocate(bytes, as_stream(stream))) return p;
    }
    return torch_pool(device)->allocate(bytes, as_stream(stream));
  } catch (const AllocationError& e) {
    *status = api::Status::out_of_memory;
    *error = e.what();
  } catch (const InvalidInputError& e) {
    // A size beyond any device: PyTorch's own allocator calls that an out-of-memory too.
    *status = bytes > CachingPool::kMaxRequest ? api::Status::out_of_memory : api::Status::invalid;
    *error = e.what();
  } catch (const std::exception& e) {
    *status = api::Status::invalid;
    *error = e.what();
  }
  return nullptr;
}

bool deallocate(void* ptr, int device) {
  try {
    // The main pool first: while graphs live, most frees are still eager tensors'.
    CachingPool* pool = torch_pools().made(device);
    std::shared_ptr<CachingPool> held;
    if (pool == nullptr && (held = existing_torch_pool(device))) pool = held.get();
    if (pool != nullptr && pool->try_deallocate(ptr)) return true;
    if (GraphPools* graphs = torch_graph_pools_if_any(device)) return graphs->deallocate(ptr);
  } catch (...) {
    // A failing CUDA call under a free: the block stays out of use, which is safe.
  }
  return false;
}

std::size_t largest_free(int device) {
  auto pool = existing_torch_pool(device);
  return pool ? pool->stats().largest_free_block : 0;
}

// The first of the device's pools (the main pool, then the graph pools) for which
// `found(pool, id)` says yes; false when none does.
template <typename Found>
bool first_pool(int device, Found&& found) {
  if (auto pool = existing_torch_pool(device); pool && found(*pool, api::PoolId{0, 0})) return true;
  if (GraphPools* graphs = torch_graph_pools_if_any(device)) {
    for (const auto& entry : graphs->all_pools()) {
      if (found(*entry.second, api::PoolId{entry.first.first, entry.first.second})) return true;
    }
  }
  return false;
}

bool segment_of(void* ptr, int device, void** base, std::size_t* size, bool* expandable) {
  CachingPool::SegmentRange range;
  if (!first_pool(device, [&](CachingPool& pool, api::PoolId) { return pool.segment_of(ptr, range); })) {
    return false;
  }
  *base = range.base;
  *size = range.size;
  *expandable = range.expandable;
  return true;
}

bool share_pages(void* ptr, int device, api::SharedPages* out) {
  CachingPool::SharedPages pages;
  if (!first_pool(device, [&](CachingPool& pool, api::PoolId) { return pool.share_pages(ptr, pages); })) {
    return false;
  }
  *out = api::SharedPages{pages.first_page, pages.page_size, std::move(pages.fds)};
  return true;
}

bool pool_of(void* ptr, int device, api::PoolId* out) {
  return first_pool(device, [&](CachingPool& pool, api::PoolId id) {
    if (!pool.owns(ptr)) return false;
    *out = id;
    return true;
  });
}

std::atomic<api::SegmentSink> g_segment_sink{nullptr};

void watch_segments(api::SegmentSink sink) { g_segment_sink.store(sink, std::memory_order_release); }

void add_history(PoolHistory& into, const PoolHistory& h) {
  auto add_counter = [](StatCounter& a, const StatCounter& b) {
    a.current += b.current;
    a.peak += b.peak;  // peaks of separate pools add up: an upper bound
    a.allocated += b.allocated;
    a.freed += b.freed;
  };
  auto add_family = [&](StatFamily& a, const StatFamily& b) {
    add_counter(a.all, b.all);
    add_counter(a.small, b.small);
    add_counter(a.large, b.large);
  };
  add_family(into.allocated_bytes, h.allocated_bytes);
  add_family(into.allocations, h.allocations);
  add_family(into.requested_bytes, h.requested_bytes);
  add_family(into.reserved_bytes, h.reserved_bytes);
  add_family(into.segments, h.segments);
  add_family(into.inactive_split_bytes, h.inactive_split_bytes);
  add_family(into.inactive_splits, h.inactive_splits);
  into.alloc_retries += h.alloc_retries;
  into.ooms += h.ooms;
  into.limit_rejections += h.limit_rejections;
  into.device_allocs += h.device_allocs;
  into.device_frees += h.device_frees;
  into.device_syncs += h.device_syncs;
}

void history(int device, PoolHistory* out) {
  *out = PoolHistory{};
  if (auto pool = existing_torch_pool(device)) add_history(*out, pool->history().totals());
  if (GraphPools* graphs = torch_graph_pools_if_any(device)) {
    for (const auto& entry : graphs->all_pools()) add_history(*out, entry.second->history().totals());
  }
}

void reset(int device, bool peaks, bool accumulated) {
  std::vector<std::shared_ptr<CachingPool>> pools;
  if (auto pool = existing_torch_pool(device)) pools.push_back(pool);
  if (GraphPools* graphs = torch_graph_pools_if_any(device)) {
    for (const auto& entry : graphs->all_pools()) pools.push_back(entry.second);
  }
  for (const auto& pool : pools) {
    if (peaks) pool->reset_peaks();
    if (accumulated) pool->reset_accumulated();
  }
}

std::size_t release_cache(int device) {
  std::size_t released = 0;
  for (auto& pool : torch_pools().pools()) {
    if (device >= 0 && pool->device() != device) continue;
    released += pool->emergency_cleanup();
    // A graph that may still replay keeps its memory; pools no graph uses let go.
    if (GraphPools* graphs = torch_graph_pools_if_any(pool->device())) {
      released += graphs->release_unused();
    }
  }
  return released;
}

std::size_t release_pool_cache(api::PoolId id) {
  std::size_t released = 0;
  for (auto& pool : torch_pools().pools()) {
    if (GraphPools* graphs = torch_graph_pools_if_any(pool->device())) {
      released += graphs->release_unused(to_id(id));
    }
  }
  return released;
}

void set_fraction(int device, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw InvalidInputError("memory fraction must be in [0, 1], got " + std::to_string(fraction));
  }
  auto pool = torch_pool(device);
  const std::size_t total = pool->upstream().memory_info().total;
  pool->set_limit(fraction >= 1.0 ? 0 : static_cast<std::size_t>(fraction * static_cast<double>(total)));
}

double fraction(int device) {
  auto pool = existing_torch_pool(device);
  if (!pool || pool->limit() == 0) return 1.0;
  const std::size_t total = pool->upstream().memory_info().total;
  return total == 0 ? 1.0 : static_cast<double>(pool->limit()) / static_cast<double>(total);
}

std::size_t total_memory(int device) { return torch_pool(device)->upstream().memory_info().total; }

void add_segments(std::vector<api::SegmentEntry>& out, const CachingPool& pool, api::PoolId id) {
  for (const SegmentSnapshot& s : pool.snapshot()) {
    api::SegmentEntry seg;
    seg.pool = id;
    seg.address = s.address;
    seg.size = s.size;
    seg.stream = as_handle(s.stream);
    seg.small = s.small;
    seg.expandable = s.expandable;
    for (const BlockSnapshot& b : s.blocks) {
      seg.blocks.push_back(api::BlockEntry{b.address, b.size, b.requested, b.allocated});
    }
    out.push_back(std::move(seg));
  }
}

std::vector<api::SegmentEntry> segments(int device) {
  std::vector<api::SegmentEntry> out;
  if (auto pool = existing_torch_pool(device)) add_segments(out, *pool, {0, 0});
  if (GraphPools* graphs = torch_graph_pools_if_any(device)) {
    for (const auto& entry : graphs->all_pools()) {
      add_segments(out, *entry.second, {entry.first.first, entry.first.second});
    }
  }
  return out;
}

void begin_pool(int device, api::PoolId id, std::function<bool(void*)> filter) {
  torch_graph_pools(device).begin_allocate(
      to_id(id), [filter = std::move(filter)](stream_t s) { return filter(as_handle(s)); });
}

void end_pool(int device, api::PoolId id) { torch_graph_pools(device).end_allocate(to_id(id)); }

void release_pool(int device, api::PoolId id) { torch_graph_pools(device).release(to_id(id)); }

int pool_uses(int device, api::PoolId id) {
  GraphPools* graphs = torch_graph_pools_if_any(device);
  return graphs == nullptr ? -1 : graphs->uses(to_id(id));
}

std::shared_ptr<CachingPool> graph_pool(int device, api::PoolId id) {
  GraphPools* graphs = torch_graph_pools_if_any(device);
  auto pool = graphs == nullptr ? nullptr : graphs->find_pool(to_id(id));
  if (!pool) {
    throw InvalidInputError("no CUDA graph pool (" + std::to_string(id.first) + ", " +
                            std::to_string(id.second) + ") on device " + std::to_string(device));
  }
  return pool;
}

std::vector<api::LiveBlock> pool_live_blocks(int device, api::PoolId id) {
  std::vector<api::LiveBlock> out;
  for (const auto& b : graph_pool(device, id)->live_blocks()) {
    out.push_back(api::LiveBlock{b.ptr, b.size, b.requested, as_handle(b.stream)});
  }
  return out;
}

std::vector<void*> restore_pool(int device, api::PoolId id, const std::vector<api::LiveBlock>& blocks) {
  std::vector<CachingPool::LiveBlock> layout;
  for (const auto& b : blocks) {
    layout.push_back(CachingPool::LiveBlock{b.ptr, b.size, b.requested, as_stream(b.stream)});
  }
  return graph_pool(device, id)->restore_live_blocks(std::move(layout));
}

}  // namespace

void report_segment_event(int device, const GraphPoolId& pool, const SegmentEvent& event) {
  const api::SegmentSink sink = g_segment_sink.load(std::memory_order_acquire);
  if (sink == nullptr) return;
  sink(device, api::PoolId{pool.first, pool.second}, static_cast<int>(event.kind), event.address,
       event.size, as_handle(event.stream));
}

const api::Api& torch_pool_api() {
  static const api::Api t = [] {
    api::Api a;
    a.allocate = allocate;
    a.deallocate = deallocate;
    a.largest_free = largest_free;
    a.segment_of = segment_of;
    a.watch_segments = watch_segments;
    a.pool_of = pool_of;
    a.share_pages = share_pages;
    a.import_pages = import_shared_pages;
    a.history = history;
    a.reset = reset;
    a.release_cache = release_cache;
    a.release_pool_cache = release_pool_cache;
    a.set_fraction = set_fraction;
    a.fraction = fraction;
    a.segments = segments;
    a.total_memory = total_memory;
    a.begin_pool = begin_pool;
    a.end_pool = end_pool;
    a.release_pool = release_pool;
    a.pool_uses = pool_uses;
    a.pool_live_blocks = pool_live_blocks;
    a.restore_pool = restore_pool;
    return a;
  }();
  return t;
}

void init_torch_pool_api(py::module_& m) {
  m.def(
      "_torch_pool_api",
      []() { return reinterpret_cast<std::uintptr_t>(&torch_pool_api()); },
      "Address of the table of pool functions handed to the PyTorch allocator component "
      "(torch_ext/pool_api.hpp), and its version.");
  m.attr("_torch_pool_api_version") = torch_api::kVersion;
  // The same functions for Python (PyTorch's memory API on the pluggable route).
  m.def("_torch_pool_set_fraction", &set_fraction, py::arg("device"), py::arg("fraction"),
        "Limits the pool behind PyTorch on a device to fraction * the device's memory.");
  m.def("_torch_pool_fraction", &fraction, py::arg("device"),
        "The limit of the pool behind PyTorch as a fraction of the device.");
  m.def(
      "_torch_pool_cleanup",
      [](int device) {
        py::gil_scoped_release nogil;
        return release_cache(device);
      },
      py::arg("device"),
      "Releases the cached memory of the torch pools, and of graph pools no graph uses "
      "(device -1: all devices).");
}

}  // namespace gpukeeper::py_bindings
