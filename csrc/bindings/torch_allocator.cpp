// The allocator PyTorch calls when use_torch_allocator() is active (through
// torch.cuda.memory.CUDAPluggableAllocator, which loads these two symbols from this
// module's file). One caching pool per device, shared by all of PyTorch's streams.
#include <dlfcn.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <cxxabi.h>
#include <mutex>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/pool_registry.hpp"
#include "torch_graph_pools.hpp"
#include "torch_pools.hpp"

namespace gpukeeper::py_bindings {

// Never destroyed: PyTorch may return tensors while the process exits, after static
// destructors ran; the driver takes the memory back with the process.
PoolRegistry& torch_pools() {
  static PoolRegistry* pools = new PoolRegistry(ResourceKind::device);
  return *pools;
}

namespace {

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

}  // namespace

std::shared_ptr<CachingPool> torch_pool(int device) {
  auto pool = torch_pools().pool(device);
  if (device >= 0 && device < 64) {
    std::call_once(g_reclaim_registered[device], [&] {
      pool->add_reclaim_callback(run_python_reclaim);
      pool->set_segment_observer([device](const SegmentEvent& event) {
        report_segment_event(device, GraphPoolId{0, 0}, event);
      });
    });
  }
  return pool;
}

// The pool of a device if PyTorch has allocated there, for reads (never made here).
std::shared_ptr<CachingPool> existing_torch_pool(int device) {
  return device < 0 ? nullptr : torch_pools().find(device);
}

namespace {

// ---- PyTorch's own out-of-memory error, thrown through PyTorch's C++ frames
//
// PyTorch turns a C++ c10::OutOfMemoryError into torch.cuda.OutOfMemoryError (which
// accelerate, Lightning and user code catch); any other exception becomes a plain
// RuntimeError, and a NULL return a tensor without memory. gpukeeper is not built
// against PyTorch, so the error is made at run time from libc10's exported constructor
// and type_info (found with dlsym in the libc10 PyTorch loaded; Python passes its path).

// c10::SourceLocation, as laid out in c10/util/StringUtil.h.
struct TorchSourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};
// A constructor (this, SourceLocation, std::string) of c10's error classes, called as a
// plain function: the Itanium C++ ABI passes `this` as the first argument.
using TorchErrorConstructor = void (*)(void* self, TorchSourceLocation where, std::string message);

struct TorchOom {
  TorchErrorConstructor construct = nullptr;  // OutOfMemoryError's, or Error's (base)
  void* vtable = nullptr;                     // set after Error's constructor, if used
  std::type_info* type = nullptr;
};
std::atomic<const TorchOom*> g_torch_oom{nullptr};

// Room for the exception object: c10::Error is about 130 bytes in PyTorch 2.x. Handlers
// catch it by reference, so the size is only the room its constructor may write in.
constexpr std::size_t kTorchErrorBytes = 1024;

const char* kLinkNote =
    " (a C++ std::string ABI other than libstdc++'s C++11 one cannot reach PyTorch's "
    "error types)";

// The first of `libraries` that exports `symbol`, or nullptr.
void* find_symbol(const std::vector<void*>& libraries, const char* symbol) {
  for (void* lib : libraries) {
    if (void* found = dlsym(lib, symbol)) return found;
  }
  return nullptr;
}

std::string link_torch_oom(const std::vector<std::string>& library_paths) {
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
  // PyTorch loads its libraries privately (RTLD_LOCAL): look in each. The type_info and
  // vtable of OutOfMemoryError live where it is thrown (libc10_cuda in older releases),
  // its constructors in libc10 when exported.
  std::vector<void*> libraries;
  for (const std::string& path : library_paths) {
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) libraries.push_back(lib);
  }
  if (libraries.empty()) return "none of PyTorch's libraries is loaded";
  auto* oom = new TorchOom();
  oom->type = static_cast<std::type_info*>(find_symbol(libraries, "_ZTIN3c1016OutOfMemoryErrorE"));
  oom->construct = reinterpret_cast<TorchErrorConstructor>(find_symbol(
      libraries,
      "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"));
  if (oom->construct == nullptr) {
    // Releases whose OutOfMemoryError only inherits Error's constructors: build the
    // base, then make the object an OutOfMemoryError as the inherited constructor does
    // (its vtable; the class adds no members).
    oom->construct = reinterpret_cast<TorchErrorConstructor>(find_symbol(
        libraries,
        "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"));
    auto* table = static_cast<char*>(find_symbol(libraries, "_ZTVN3c1016OutOfMemoryErrorE"));
    oom->vtable = table == nullptr ? nullptr : table + 2 * sizeof(void*);  // the address point
    if (oom->vtable == nullptr) oom->construct = nullptr;
  }
  // Each dlopen(RTLD_NOLOAD) took a reference; PyTorch keeps the libraries loaded.
  for (void* lib : libraries) dlclose(lib);
  if (oom->type == nullptr || oom->construct == nullptr) {
    const std::string why = std::string("PyTorch's libraries export no c10::OutOfMemoryError ") +
                            (oom->type == nullptr ? "type_info" : "constructor or vtable");
    delete oom;
    return why;
  }
  delete g_torch_oom.exchange(oom);
  return "";
#else
  (void)library_paths;
  return std::string("not available in this build") + kLinkNote;
#endif
}

void destroy_torch_error(void* object) {
  // c10::Error derives from std::exception alone: the virtual destructor of that base
  // subobject (at offset 0) runs the whole object's.
  static_cast<std::exception*>(object)->~exception();
}

[[noreturn]] void throw_torch_oom(const std::string& message) {
  const TorchOom* oom = g_torch_oom.load();
  if (oom == nullptr) throw std::runtime_error(message);
  void* object = abi::__cxa_allocate_exception(kTorchErrorBytes);
  try {
    oom->construct(object, TorchSourceLocation{"gpukeeper_torch_malloc", __FILE__, __LINE__},
                   message);
  } catch (...) {
    abi::__cxa_free_exception(object);
    throw std::runtime_error(message);
  }
  if (oom->vtable != nullptr) *static_cast<void**>(object) = oom->vtable;
  abi::__cxa_throw(object, oom->type, destroy_torch_error);
}

// PyTorch's wording first: code that recognises an OOM by its text (accelerate's
// should_reduce_batch_size, many training scripts) looks for "CUDA out of memory.".
std::string torch_oom_text(std::size_t size, const std::string& detail) {
  return "CUDA out of memory. Tried to allocate " + detail::human_bytes(size) +
         ". gpukeeper: " + detail;
}

// Linking PyTorch's OutOfMemoryError, and reading the books of the pools behind PyTorch.
void init_torch_books(py::module_& m) {
  m.def(
      "_link_torch_oom",
      [](const std::vector<std::string>& paths) { return link_torch_oom(paths); },
      py::arg("library_paths"),
      "Finds PyTorch's c10::OutOfMemoryError in its loaded libraries at these paths, so "
      "that a failed allocation raises torch.cuda.OutOfMemoryError. Returns '' or why not.");
  m.def(
      "_torch_pool_counter",
      [](int device, int which) -> std::size_t {
        auto pool = existing_torch_pool(device);
        if (!pool) return 0;
        // PyTorch counts its graphs' private pools in its totals; so do these.
        PoolStats s = pool->stats();
        const PoolStats g = torch_graph_totals(device);
        s.allocated_bytes += g.allocated_bytes;
        s.reserved_bytes += g.reserved_bytes;
        s.peak_allocated_bytes += g.peak_allocated_bytes;
        s.peak_reserved_bytes += g.peak_reserved_bytes;
        switch (which) {
          case 0: return s.allocated_bytes;
          case 1: return s.reserved_bytes;
          case 2: return s.peak_allocated_bytes;
          case 3: return s.peak_reserved_bytes;
          default: throw InvalidInputError("_torch_pool_counter: which must be 0..3");
        }
      },
      py::arg("device"), py::arg("which"),
      "allocated (0), reserved (1), peak allocated (2) or peak reserved (3) bytes of the "
      "pools behind PyTorch on a device, its CUDA graphs' private pools included (their "
      "peaks add up: an upper bound); 0 before its first allocation there.");
  m.def(
      "_torch_pool_history",
      [](int device) -> py::object {
        auto pool = existing_torch_pool(device);
        return py::cast(pool ? pool->history() : PoolHistory{});
      },
      py::arg("device"), "PoolHistory of the pool behind PyTorch on a device (empty if none).");
  m.def(
      "_torch_pool_snapshot",
      [](int device) -> py::object {
        auto pool = existing_torch_pool(device);
        return pool ? py::cast(pool->snapshot()) : py::list();
      },
      py::arg("device"), "Segments of the pool behind PyTorch on a device.");
  m.def(
      "_torch_pool_reset",
      [](int device, bool peaks, bool accumulated) {
        auto pool = existing_torch_pool(device);
        if (!pool) return;
        if (peaks) pool->reset_peaks();
        if (accumulated) pool->reset_accumulated();
      },
      py::arg("device"), py::arg("peaks"), py::arg("accumulated"),
      "Resets the peaks and/or the totals of the pool behind PyTorch on a device.");
}

// The memory fraction (PyTorch's set_per_process_memory_fraction) and the OOM error.
void init_torch_limits(py::module_& m) {
  m.def(
      "_torch_pool_set_layout",
      [](const py::object& expandable) {
        PoolOptions options = torch_pools().options();
        set_pool_layout(options, expandable);
        torch_pools().set_options(options);
      },
      py::arg("expandable"),
      "Where the pools behind PyTorch keep blocks, as MemoryPool's `expandable`; only before "
      "the first of them is made (InvalidInputError after).");
  m.def(
      "_torch_oom_probe",
      [](const std::string& message) -> py::tuple {
        // Throws the error a failed allocation throws and catches it here, as PyTorch's
        // handlers would: lets tests check the linked type without a GPU.
        try {
          throw_torch_oom(message);
        } catch (const std::exception& e) {
          return py::make_tuple(std::string(typeid(e).name()), std::string(e.what()));
        }
      },
      py::arg("message"));
  m.def("_torch_malloc_symbols",
        []() { return py::make_tuple("gpukeeper_torch_malloc", "gpukeeper_torch_free"); },
        "Names of the allocation functions this module exports for PyTorch.");
}

// Stats, cleanup and validation of the torch pools, and the reclaim callback.
void init_torch_pools(py::module_& m) {
  m.def(
      "_torch_pool_stats",
      [](int device) -> py::object {
        auto pool = torch_pools().find(device);
        if (!pool) return py::none();
        return py::cast(pool->stats());
      },
      py::arg("device"), "PoolStats of the pool behind PyTorch on a device, or None.");
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

}  // namespace

void init_torch_allocator(py::module_& m) {
  init_torch_books(m);
  init_torch_limits(m);
  init_torch_pools(m);
  init_torch_graph_pools(m);
  init_torch_pool_api(m);
}

}  // namespace gpukeeper::py_bindings

// The signatures of torch.cuda.memory.CUDAPluggableAllocator: alloc(size, device, stream)
// and free(ptr, size, device, stream). Exported with default visibility from a module
// built with hidden visibility. A failed allocation throws PyTorch's c10::OutOfMemoryError
// (see throw_torch_oom) through PyTorch's C++ callers, which are built with exceptions:
// a NULL return would give PyTorch a tensor without memory.
extern "C" {

__attribute__((visibility("default"))) void* gpukeeper_torch_malloc(std::size_t size, int device,
                                                                     void* stream) {
  if (size == 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors, as its own does
  namespace gk = gpukeeper;
  gk::torch_api::Status status = gk::torch_api::Status::ok;
  std::string error;
  void* ptr = gk::py_bindings::torch_pool_api().allocate(size, device, stream, &status, &error);
  if (ptr != nullptr) return ptr;
  if (status == gk::torch_api::Status::out_of_memory) {
    gk::py_bindings::throw_torch_oom(gk::py_bindings::torch_oom_text(size, error));
  }
  // Anything else (a device that does not exist) reaches PyTorch as a RuntimeError.
  throw std::runtime_error(error);
}

__attribute__((visibility("default"))) void gpukeeper_torch_free(void* ptr, std::size_t, int device,
                                                                  void*) {
  if (ptr != nullptr) gpukeeper::py_bindings::torch_pool_api().deallocate(ptr, device);
}

}  // extern "C"
