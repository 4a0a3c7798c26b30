// CUDA graphs under use_torch_allocator(): PyTorch's private graph pools, kept by
// GraphPools (gpukeeper/memory/graph_pools.hpp), one per device.
//
// PyTorch tells its allocator when a capture begins and ends and when a graph goes
// (beginAllocateToPool, endAllocateToPool, releasePool). Its CUDAPluggableAllocator
// forwards these to three callbacks that only C++ can set (set_begin_allocate_to_pool,
// set_end_allocate_to_pool_fn, set_release_pool); without them a capture's blocks would
// go back to the shared cache and be handed to other tensors while the graph still
// writes to their addresses at each replay. gpukeeper is not built against PyTorch, so
// the setters and getCurrentAllocator() are found at run time in the libtorch PyTorch
// loaded, by their C++ names, as throw_torch_oom finds c10's error type.
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/graph_pools.hpp"
#include "torch_graph_pools.hpp"
#include "torch_pools.hpp"

namespace gpukeeper::py_bindings {

namespace {

constexpr int kMaxTorchDevices = 64;
std::array<std::atomic<GraphPools*>, kMaxTorchDevices> g_graph_pools{};
std::mutex g_graph_pools_mutex;

// The C++ names (Itanium mangling) of PyTorch's functions; MempoolId_t is
// std::pair<unsigned long long, unsigned long long>, cudaStream_t is CUstream_st*.
constexpr const char* kGetCurrentAllocator =
    "_ZN5torch4cuda22CUDAPluggableAllocator19getCurrentAllocatorEv";
constexpr const char* kSetBegin =
    "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator26set_begin_allocate_to_"
    "poolESt8functionIFviSt4pairIyyES3_IFbP11CUstream_stEEEE";
constexpr const char* kSetEnd =
    "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator27set_end_allocate_to_"
    "pool_fnESt8functionIFviSt4pairIyyEEE";
constexpr const char* kSetRelease =
    "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator16set_release_poolESt8"
    "functionIFviSt4pairIyyEEE";

struct CUstreamOpaque;  // PyTorch's cudaStream_t, for the filter's signature only
using TorchPoolId = std::pair<unsigned long long, unsigned long long>;
using TorchFilter = std::function<bool(CUstreamOpaque*)>;
using BeginFn = std::function<void(int, TorchPoolId, TorchFilter)>;
using PoolFn = std::function<void(int, TorchPoolId)>;
// Member functions called as functions taking `this` first; a std::function argument goes
// by value, which the Itanium ABI passes as a pointer to the caller's copy either way.
// getCurrentAllocator returns a std::shared_ptr<CUDAAllocator>, whose layout does not
// depend on the pointee.
using GetAllocator = std::shared_ptr<void> (*)();
using SetBegin = void (*)(void*, BeginFn);
using SetPool = void (*)(void*, PoolFn);

GraphPoolId to_id(TorchPoolId id) { return {id.first, id.second}; }

// A callback must not throw into PyTorch's graph teardown (releasePool runs from
// CUDAGraph's destructor): what goes wrong there is kept for graph_pool_status().
std::mutex g_errors_mutex;
std::vector<std::string> g_errors;
void keep_error(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_errors_mutex);
  if (g_errors.size() < 32) g_errors.push_back(what);
}

std::string link(const std::vector<std::string>& paths) {
  GetAllocator get = nullptr;
  SetBegin set_begin = nullptr;
  SetPool set_end = nullptr, set_release = nullptr;
  for (const auto& path : paths) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) continue;
    if (get == nullptr) get = reinterpret_cast<GetAllocator>(dlsym(lib, kGetCurrentAllocator));
    if (set_begin == nullptr) set_begin = reinterpret_cast<SetBegin>(dlsym(lib, kSetBegin));
    if (set_end == nullptr) set_end = reinterpret_cast<SetPool>(dlsym(lib, kSetEnd));
    if (set_release == nullptr) set_release = reinterpret_cast<SetPool>(dlsym(lib, kSetRelease));
    // The reference dlopen(RTLD_NOLOAD) took stays: PyTorch keeps the library loaded.
  }
  if (get == nullptr || set_begin == nullptr || set_end == nullptr || set_release == nullptr) {
    return "PyTorch's CUDAPluggableAllocator graph-pool setters were not found in its loaded "
           "libraries (" + std::to_string(paths.size()) + " searched)";
  }
  std::shared_ptr<void> allocator = get();
  if (!allocator) return "PyTorch has no pluggable allocator installed";
  void* self = allocator.get();
  set_begin(self, [](int device, TorchPoolId id, TorchFilter filter) {
    // Errors here reach PyTorch's capture_begin, which raises them in Python.
    torch_graph_pools(device).begin_allocate(
        to_id(id), [filter = std::move(filter)](stream_t s) {
          return filter(reinterpret_cast<CUstreamOpaque*>(s));
        });
  });
  set_end(self, [](int device, TorchPoolId id) {
    try {
      torch_graph_pools(device).end_allocate(to_id(id));
    } catch (const std::exception& e) {
      keep_error(std::string("end of capture: ") + e.what());
    }
  });
  set_release(self, [](int device, TorchPoolId id) {
    try {
      if (GraphPools* graphs = torch_graph_pools_if_any(device)) graphs->release(to_id(id));
    } catch (const std::exception& e) {
      keep_error(std::string("graph release: ") + e.what());
    }
  });
  return "";
}

}  // namespace

GraphPools& torch_graph_pools(int device) {
  if (device < 0 || device >= kMaxTorchDevices) {
    throw InvalidInputError("graph pools: device " + std::to_string(device) + " is out of range");
  }
  if (GraphPools* graphs = g_graph_pools[device].load(std::memory_order_acquire)) return *graphs;
  std::lock_guard<std::mutex> lock(g_graph_pools_mutex);
  GraphPools* graphs = g_graph_pools[device].load(std::memory_order_acquire);
  if (graphs == nullptr) {
    // Never destroyed, as the torch pools: PyTorch may free a graph's tensors at exit.
    graphs = new GraphPools([device] { return make_resource(ResourceKind::device, device); });
    graphs->set_segment_observer([device](GraphPoolId id, const SegmentEvent& event) {
      report_segment_event(device, id, event);
    });
    g_graph_pools[device].store(graphs, std::memory_order_release);
  }
  return *graphs;
}

GraphPools* torch_graph_pools_if_any(int device) noexcept {
  if (device < 0 || device >= kMaxTorchDevices) return nullptr;
  return g_graph_pools[device].load(std::memory_order_acquire);
}

PoolStats torch_graph_totals(int device) {
  GraphPools* graphs = torch_graph_pools_if_any(device);
  return graphs != nullptr ? graphs->totals() : PoolStats{};
}

void init_torch_graph_pools(py::module_& m) {
  m.def(
      "_link_torch_graph_pools",
      [](const std::vector<std::string>& paths) { return link(paths); },
      py::arg("library_paths"),
      "Gives PyTorch's pluggable allocator (installed already) gpukeeper's graph-pool "
      "callbacks, found in its loaded libraries at these paths. Returns '' or why not.");
  m.def(
      "_torch_graph_pools",
      [](int device) {
        py::list out;
        GraphPools* graphs = torch_graph_pools_if_any(device);
        if (graphs == nullptr) return out;
        for (const auto& info : graphs->pools()) {
          py::dict d = py::cast(info.stats).attr("to_dict")();
          d["id"] = py::make_tuple(info.id.first, info.id.second);
          d["uses"] = info.uses;
          d["capturing"] = info.routing;
          out.append(d);
        }
        return out;
      },
      py::arg("device"),
      "The private graph pools behind PyTorch on a device: id, uses, capturing and books.");
  m.def(
      "_torch_graph_pool_errors",
      []() {
        std::lock_guard<std::mutex> lock(g_errors_mutex);
        return g_errors;
      },
      "What went wrong in graph-pool callbacks PyTorch ran (they must not throw).");
  m.def(
      "_torch_graph_pools_release_unused",
      [](int device) -> std::size_t {
        py::gil_scoped_release nogil;
        GraphPools* graphs = torch_graph_pools_if_any(device);
        return graphs != nullptr ? graphs->release_unused() : 0;
      },
      py::arg("device"), "Frees the cache of graph pools no graph uses; returns the bytes.");
}

}  // namespace gpukeeper::py_bindings
