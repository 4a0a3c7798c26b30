// The allocator PyTorch calls when use_torch_allocator() is active (through
// torch.cuda.memory.CUDAPluggableAllocator, which loads these two symbols from this
// module's file). One caching pool per device, shared by all of PyTorch's streams.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <mutex>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/pool_registry.hpp"

namespace gpukeeper::py_bindings {

namespace {

// Never destroyed: PyTorch may return tensors while the process exits, after static
// destructors ran; the driver takes the memory back with the process.
PoolRegistry& torch_pools() {
  static PoolRegistry* pools = new PoolRegistry(ResourceKind::device);
  return *pools;
}

// Called when a torch pool runs out of memory after dropping its own cache: asks the
// rest of the process (CuPy's cache, other gpukeeper pools) to let go. Set from Python.
std::mutex g_reclaim_mutex;
std::shared_ptr<py::object> g_reclaim;
std::once_flag g_reclaim_registered[64];

std::size_t run_python_reclaim(std::size_t needed) {
  std::shared_ptr<py::object> fn;
  {
    std::lock_guard<std::mutex> lock(g_reclaim_mutex);
    fn = g_reclaim;
  }
  if (!fn || !Py_IsInitialized()) return 0;
  py::gil_scoped_acquire gil;
  try {
    py::object released = (*fn)(needed);
    return released.is_none() ? 0 : released.cast<std::size_t>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("gpukeeper torch reclaim callback");
    return 0;
  }
}

std::shared_ptr<CachingPool> torch_pool(int device) {
  auto pool = torch_pools().pool(device);
  if (device >= 0 && device < 64) {
    std::call_once(g_reclaim_registered[device],
                   [&] { pool->add_reclaim_callback(run_python_reclaim); });
  }
  return pool;
}

}  // namespace

void init_torch_allocator(py::module_& m) {
  m.def("_torch_malloc_symbols",
        []() { return py::make_tuple("gpukeeper_torch_malloc", "gpukeeper_torch_free"); },
        "Names of the allocation functions this module exports for PyTorch.");
  m.def(
      "_torch_pool_stats",
      [](int device) -> py::object {
        auto pool = torch_pools().find(device);
        if (!pool) return py::none();
        return py::cast(pool->stats());
      },
      py::arg("device"), "PoolStats of the pool behind PyTorch on a device, or None.");
  m.def(
      "_torch_pool_cleanup",
      [](int device) -> std::size_t {
        py::gil_scoped_release nogil;
        if (device < 0) return torch_pools().emergency_cleanup_all();
        auto pool = torch_pools().find(device);
        return pool ? pool->emergency_cleanup() : 0;
      },
      py::arg("device"), "Releases the cached memory of the torch pools (device -1: all).");
  m.def(
      "_torch_pool_devices",
      []() {
        std::vector<int> ids;
        for (const auto& p : torch_pools().pools()) ids.push_back(p->device());
        return ids;
      },
      "Devices on which PyTorch allocated through gpukeeper.");
  m.def(
      "_torch_pool_validate",
      [](int device) -> std::string {
        auto pool = torch_pools().find(device);
        return pool ? pool->validate() : std::string();
      },
      py::arg("device"));
  m.def(
      "_set_torch_reclaim",
      [](py::object fn) {
        auto held = fn.is_none() ? nullptr
                                 : std::shared_ptr<py::object>(new py::object(std::move(fn)),
                                                               [](py::object* o) {
                                                                 if (!Py_IsInitialized()) return;
                                                                 py::gil_scoped_acquire gil;
                                                                 delete o;
                                                               });
        std::lock_guard<std::mutex> lock(g_reclaim_mutex);
        g_reclaim = std::move(held);
      },
      py::arg("callback"),
      "Sets the Python callable run (with the bytes needed) when a torch pool is out of memory.");
}

}  // namespace gpukeeper::py_bindings

// The signatures of torch.cuda.memory.CUDAPluggableAllocator: alloc(size, device, stream)
// and free(ptr, size, device, stream). Exported with default visibility from a module
// built with hidden visibility. Errors cannot cross this C boundary: a failed allocation
// returns nullptr, which PyTorch turns into its OutOfMemoryError.
extern "C" {

__attribute__((visibility("default"))) void* gpukeeper_torch_malloc(std::size_t size, int device,
                                                                     void* stream) {
  if (size == 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors
  try {
    return gpukeeper::py_bindings::torch_pool(device)->allocate(
        size, reinterpret_cast<gpukeeper::stream_t>(stream));
  } catch (...) {
    return nullptr;
  }
}

__attribute__((visibility("default"))) void gpukeeper_torch_free(void* ptr, std::size_t, int device,
                                                                  void*) {
  if (ptr == nullptr) return;
  try {
    auto pool = gpukeeper::py_bindings::torch_pool(device);
    pool->deallocate(ptr);
  } catch (...) {
    // A pointer we did not hand out: nothing safe to do but leave it.
  }
}

}  // extern "C"
