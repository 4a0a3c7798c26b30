// MemoryPool (one caching pool per device), Precision and PoolStats for Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstring>
#include <stdexcept>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/pool_registry.hpp"

namespace gpukeeper::py_bindings {

namespace {

std::string type_name(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__name__"));
}

// A Python callable kept alive by C++ callbacks; dropped with the GIL held.
std::shared_ptr<py::object> hold_callable(py::object fn) {
  if (!PyCallable_Check(fn.ptr())) {
    throw InvalidInputError("callback must be callable, got " + type_name(fn));
  }
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* o) {
    if (!Py_IsInitialized()) return;  // interpreter gone: leaking beats crashing
    py::gil_scoped_acquire gil;
    delete o;
  });
}

// Python exceptions in callbacks are reported as unraisable (like __del__ errors) and
// counted by the pool; they never unwind through the allocator.
[[noreturn]] void report_callback_error(py::error_already_set& e, const char* where) {
  e.discard_as_unraisable(where);
  throw std::runtime_error(where);
}

std::shared_ptr<CachingPool> device_pool(PoolRegistry& reg, const py::handle& device) {
  return reg.pool(to_device_id(device));
}

// The pool for a device id that exists, or nullptr for ids the kind does not have.
std::shared_ptr<CachingPool> pool_if_valid(PoolRegistry& reg, const py::handle& device) {
  int id = to_device_id(device);
  if (id >= reg.device_count()) return nullptr;
  return reg.pool(id);
}

// Called with each new ManagedBuffer while set (leak tracking records where buffers are
// made); a null check on the allocation path otherwise. Set and read with the GIL held.
py::object* g_buffer_hook = nullptr;

// A new Python ManagedBuffer.
py::object new_buffer(PoolRegistry& reg, const py::handle& device, const py::handle& size,
                      const py::handle& precision, const py::handle& stream) {
  auto prec = to_precision(precision);
  std::size_t count = to_count(size, "size");
  stream_t s = to_stream(stream);
  // A stream capturing a CUDA graph gets the capture's own pool (PoolRegistry::pool_for).
  auto pool = reg.pool_for(to_device_id(device), s);
  py::object obj = new_buffer_object();
  PyBuffer* buf = buffer_of(obj.ptr());
  buf->precision = prec;
  buf->count = count;
  buf->kind = pool->kind();
  buf->device = pool->device();
  buf->buffer = ManagedBuffer(std::move(pool), bytes_for(count, prec), s);
  if (g_buffer_hook != nullptr) (*g_buffer_hook)(obj);
  return obj;
}

// The PoolRegistry of a MemoryPool. pybind11's cast looks the C++ type up in its type maps
// on every call; with one bound C++ type in self's classes (its "simple layout") the
// pointer is read where pybind11 keeps it. Method descriptors of _MemoryPoolBase check
// that self is one, and no other bound C++ type derives from PoolRegistry, so that one
// type is PoolRegistry.
PoolRegistry& registry_of(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  if (inst->simple_layout && inst->simple_holder_constructed) {
    return *static_cast<PoolRegistry*>(inst->simple_value_holder[0]);
  }
  return py::handle(self).cast<PoolRegistry&>();  // raises for what is not set up
}

// get_managed_buffer(device_id, size, precision=None, stream=None), vectorcall style.
PyObject* fast_get_managed_buffer(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                  PyObject* kwnames) {
  static const char* const names[] = {"device_id", "size", "precision", "stream"};
  try {
    PyObject* a[4] = {nullptr, nullptr, Py_None, Py_None};
    if (nargs > 4) throw py::type_error("get_managed_buffer() takes at most 4 arguments");
    for (Py_ssize_t i = 0; i < nargs; ++i) a[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      const char* key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
      int slot = -1;
      for (int j = 0; j < 4; ++j) {
        if (key && std::strcmp(key, names[j]) == 0) slot = j;
      }
      if (slot < 0 || slot < nargs) {
        throw py::type_error(std::string("get_managed_buffer() got an unexpected or repeated "
                                         "keyword argument '") + (key ? key : "?") + "'");
      }
      a[slot] = args[nargs + k];
    }
    if (a[0] == nullptr || a[1] == nullptr) {
      throw py::type_error("get_managed_buffer() needs device_id and size");
    }
    return new_buffer(registry_of(self), a[0], a[1], a[2], a[3]).release().ptr();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyMethodDef g_get_managed_buffer = {
    "get_managed_buffer", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_get_managed_buffer)),
    METH_FASTCALL | METH_KEYWORDS,
    "get_managed_buffer(device_id, size, precision=Precision.Fp32, stream=None)\n\n"
    "A buffer of `size` elements of `precision` on `device_id`, returned to the pool when "
    "released, when its `with` block ends, or when it is garbage."};

ResourceKind resolve_kind(const std::string& kind) {
  if (kind == "auto") return cuda_status().available ? ResourceKind::device : ResourceKind::host;
  return parse_resource_kind(kind);
}


// A watermark level: anything with __float__ (int, float, numpy scalars), but not a bool or
// a string; the pool checks the range. pybind11's own conversion would raise a TypeError
// that names no argument.
double to_level(const py::handle& obj) {
  if (!PyBool_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr())) {
    const double level = PyFloat_AsDouble(obj.ptr());
    if (!(level == -1.0 && PyErr_Occurred())) return level;
    PyErr_Clear();
  }
  throw InvalidInputError(std::string("watermark level must be a number in (0, 1], got ") +
                          Py_TYPE(obj.ptr())->tp_name);
}

}  // namespace

// expandable="auto" (the default: "large" for device memory with virtual memory
// management, else False), False (fixed segments), True (every size class in expandable
// ranges) or "large" (large requests expandable, small ones in fixed segments: no page
// moves for the many small operations of a step).
void set_pool_layout(PoolOptions& options, const py::object& expandable) {
  if (PyBool_Check(expandable.ptr())) {
    options.segments = expandable.ptr() == Py_True ? SegmentLayout::expandable : SegmentLayout::fixed;
    return;
  }
  if (py::isinstance<py::str>(expandable)) {
    const std::string name = expandable.cast<std::string>();
    if (name == "large") {
      options.segments = SegmentLayout::hybrid;
      return;
    }
    if (name == "auto") {
      options.segments = SegmentLayout::automatic;
      return;
    }
  }
  throw InvalidInputError("expandable must be 'auto', True, False or 'large', got " +
                          std::string(py::repr(expandable)));
}


void PyBuffer::require_live(const char* what) const {
  if (released || !buffer) {
    throw InvalidInputError(std::string(what) + ": the buffer was released; its memory is "
                            "back in the pool and may belong to someone else now");
  }
}

stream_t to_stream(const py::handle& obj) {
  if (obj.is_none()) return 0;
  py::handle value = obj;
  py::object attr;
  if (!PyLong_Check(obj.ptr())) {
    if (py::hasattr(obj, "cuda_stream")) {
      attr = obj.attr("cuda_stream");
    } else if (py::hasattr(obj, "ptr")) {
      attr = obj.attr("ptr");
    } else {
      throw InvalidInputError("stream must be None, an int handle, or a torch/CuPy stream; got " +
                              type_name(obj));
    }
    value = attr;
  }
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr())) {
    throw InvalidInputError("stream handle must be an int, got " + type_name(value));
  }
  unsigned long long handle = PyLong_AsUnsignedLongLong(value.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw InvalidInputError("stream handle must be a non-negative pointer-sized int");
  }
  return static_cast<stream_t>(handle);
}

namespace {
PyObject* g_precision_type = nullptr;  // gpukeeper._core.Precision, set by init_precision
// The members (Precision.Fp32, ...), with references held for good by init_precision.
struct PrecisionMember {
  PyObject* object;
  Precision value;
};
PrecisionMember g_precision_members[10] = {};
}  // namespace

Precision to_precision(const py::handle& obj) {
  // The common spellings first, without pybind11's type lookups (hash-map probes that cost
  // more than the pool's allocation): None, then the members by identity.
  if (obj.is_none()) return Precision::fp32;
  for (const PrecisionMember& m : g_precision_members) {
    if (m.object == obj.ptr()) return m.value;
  }
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())) == g_precision_type ||
      py::isinstance<Precision>(obj)) {
    return obj.cast<Precision>();
  }
  if (py::isinstance<py::str>(obj)) return parse_precision(obj.cast<std::string>());
  // Python's own scalar types, as numpy reads them.
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return Precision::fp64;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return Precision::int64;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return Precision::boolean;
  // numpy scalar types (np.float32), numpy dtypes (.name) and torch dtypes (str()).
  py::object name;
  if (py::isinstance<py::type>(obj)) {
    name = obj.attr("__name__");
  } else if (py::hasattr(obj, "name") && py::isinstance<py::str>(obj.attr("name"))) {
    name = obj.attr("name");
  } else {
    name = py::str(obj);
  }
  return parse_precision(name.cast<std::string>());
}

std::size_t to_count(const py::handle& obj, const char* what) {
  if (PyLong_CheckExact(obj.ptr())) {  // the usual case: no __index__ call, no new reference
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0 && value >= 0) return static_cast<std::size_t>(value);
  }
  if (PyBool_Check(obj.ptr()) || !PyIndex_Check(obj.ptr())) {
    throw InvalidInputError(std::string(what) + " must be an int, got " + type_name(obj));
  }
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && value < 0)) {
    throw InvalidInputError(std::string(what) + " must not be negative, got " +
                            std::string(py::str(index)));
  }
  if (overflow > 0) {
    throw InvalidInputError(std::string(what) + " " + std::string(py::str(index)) +
                            " is beyond any machine");
  }
  return static_cast<std::size_t>(value);
}

int to_device_id(const py::handle& obj) {
  std::size_t id = to_count(obj, "device_id");
  if (id > 1u << 20) throw InvalidInputError("device_id " + std::to_string(id) + " does not exist");
  return static_cast<int>(id);
}

namespace {

using PoolClass = py::class_<PoolRegistry>;

void init_precision(py::module_& m) {
  py::enum_<Precision> precision(m, "Precision", "Element type of a buffer; sizes count these elements.");
  g_precision_type = precision.ptr();  // the module keeps the type alive
  precision
      .value("Fp64", Precision::fp64)
      .value("Fp32", Precision::fp32)
      .value("Fp16", Precision::fp16)
      .value("Bf16", Precision::bf16)
      .value("Int64", Precision::int64)
      .value("Int32", Precision::int32)
      .value("Int16", Precision::int16)
      .value("Int8", Precision::int8)
      .value("Uint8", Precision::uint8)
      .value("Bool", Precision::boolean)
      .def_property_readonly("itemsize", [](Precision p) { return element_size(p); },
                             "Bytes per element.")
      .def_property_readonly("label", [](Precision p) { return std::string(to_string(p)); },
                             "Short name: 'fp32', 'bf16', ...")
      .def_static("parse", [](const py::object& o) { return to_precision(o); }, py::arg("value"),
                  "A Precision from a name ('fp32', 'float32', 'half') or a numpy/torch dtype.");
  int i = 0;
  for (const char* name : {"Fp64", "Fp32", "Fp16", "Bf16", "Int64", "Int32", "Int16", "Int8",
                           "Uint8", "Bool"}) {
    py::object member = precision.attr(name);
    g_precision_members[i++] = {member.ptr(), member.cast<Precision>()};
    member.release();  // never dropped: the table compares against these objects
  }
}

void init_pool_stats(py::module_& m) {
  py::class_<PoolStats>(m, "PoolStats", "A snapshot of one pool's books (bytes and counts).")
      .def_readonly("allocated_bytes", &PoolStats::allocated_bytes)
      .def_readonly("allocated_count", &PoolStats::allocated_count)
      .def_readonly("requested_bytes", &PoolStats::requested_bytes)
      .def_readonly("reserved_bytes", &PoolStats::reserved_bytes)
      .def_readonly("segment_count", &PoolStats::segment_count)
      .def_readonly("cached_bytes", &PoolStats::cached_bytes)
      .def_readonly("peak_allocated_bytes", &PoolStats::peak_allocated_bytes)
      .def_readonly("peak_reserved_bytes", &PoolStats::peak_reserved_bytes)
      .def_readonly("largest_free_block", &PoolStats::largest_free_block)
      .def_readonly("limit_bytes", &PoolStats::limit_bytes)
      .def_readonly("cache_hits", &PoolStats::cache_hits)
      .def_readonly("cache_misses", &PoolStats::cache_misses)
      .def_readonly("upstream_allocations", &PoolStats::upstream_allocations)
      .def_readonly("upstream_frees", &PoolStats::upstream_frees)
      .def_readonly("oom_events", &PoolStats::oom_events)
      .def_readonly("callback_errors", &PoolStats::callback_errors)
      .def_readonly("pages_moved", &PoolStats::pages_moved)
      .def_property_readonly("fragmentation", &PoolStats::fragmentation,
                             "1 - largest free block / cached bytes.")
      .def("to_dict",
           [](const PoolStats& s) {
             py::dict d;
             d["allocated_bytes"] = s.allocated_bytes;
             d["allocated_count"] = s.allocated_count;
             d["requested_bytes"] = s.requested_bytes;
             d["reserved_bytes"] = s.reserved_bytes;
             d["segment_count"] = s.segment_count;
             d["cached_bytes"] = s.cached_bytes;
             d["peak_allocated_bytes"] = s.peak_allocated_bytes;
             d["peak_reserved_bytes"] = s.peak_reserved_bytes;
             d["largest_free_block"] = s.largest_free_block;
             d["limit_bytes"] = s.limit_bytes;
             d["cache_hits"] = s.cache_hits;
             d["cache_misses"] = s.cache_misses;
             d["upstream_allocations"] = s.upstream_allocations;
             d["upstream_frees"] = s.upstream_frees;
             d["oom_events"] = s.oom_events;
             d["callback_errors"] = s.callback_errors;
             d["pages_moved"] = s.pages_moved;
             d["fragmentation"] = s.fragmentation();
             return d;
           })
      .def("__getitem__",
           [](const PoolStats& s, const std::string& key) {
             py::object self = py::cast(s);
             if (!py::hasattr(self, key.c_str()) || key.rfind("_", 0) == 0) {
               throw py::key_error(key);
             }
             return self.attr(key.c_str());
           })
      .def("__repr__", [](const PoolStats& s) {
        return "PoolStats(allocated=" + std::to_string(s.allocated_bytes) +
               ", reserved=" + std::to_string(s.reserved_bytes) +
               ", segments=" + std::to_string(s.segment_count) +
               ", peak_allocated=" + std::to_string(s.peak_allocated_bytes) +
               ", hits=" + std::to_string(s.cache_hits) +
               ", misses=" + std::to_string(s.cache_misses) + ")";
      });
}

// MemoryPool's construction and its legacy get_buffer/return_buffer.
void def_pool_buffers(PoolClass& pool_class) {
  pool_class
      .def(py::init([](const std::string& kind, const py::object& expandable) {
             PoolOptions options;
             set_pool_layout(options, expandable);
             ResourceKind resolved = resolve_kind(kind);
             const bool asked = options.segments == SegmentLayout::expandable ||
                                options.segments == SegmentLayout::hybrid;
             if (asked && resolved != ResourceKind::device && resolved != ResourceKind::host) {
               throw InvalidInputError(std::string("expandable segments need 'device' or 'host' "
                                                   "memory, not '") + to_string(resolved) + "'");
             }
             return std::make_unique<PoolRegistry>(resolved, options);
           }),
           py::arg("kind") = "auto", py::arg("expandable") = "auto")
      .def_property_readonly("expandable",
                             [](const PoolRegistry& r) -> py::object {
                               switch (r.options().segments) {
                                 case SegmentLayout::expandable: return py::bool_(true);
                                 case SegmentLayout::hybrid: return py::str("large");
                                 case SegmentLayout::automatic: return py::str("auto");
                                 case SegmentLayout::fixed: break;
                               }
                               return py::bool_(false);
                             },
                             "The layout asked for: 'auto' (the default: 'large' where the "
                             "device has virtual memory management, else False), True (every "
                             "request in expandable ranges), 'large' (requests over 1 MiB "
                             "only; small ones in fixed segments) or False.")
      .def_property_readonly("kind",
                             [](const PoolRegistry& r) { return std::string(to_string(r.kind())); })
      .def_property_readonly("device_count", &PoolRegistry::device_count)
      .def(
          "_get_buffer",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& size,
             const py::handle& precision, const py::handle& stream) {
            auto prec = to_precision(precision);
            std::size_t count = to_count(size, "size");
            auto pool = device_pool(reg, device);
            stream_t s = to_stream(stream);
            return reinterpret_cast<std::uintptr_t>(pool->allocate(bytes_for(count, prec), s));
          },
          py::arg("device_id"), py::arg("size"), py::arg("precision") = py::none(),
          py::arg("stream") = py::none())
      .def(
          "_return_buffer",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& ptr,
             const py::handle& size, const py::handle& precision) {
            auto prec = to_precision(precision);
            std::size_t count = to_count(size, "size");
            std::size_t address = to_count(ptr, "buffer pointer");
            auto pool = reg.find(to_device_id(device));
            if (!pool) {
              throw InvalidInputError("device " + std::to_string(to_device_id(device)) +
                                      " has no pool, so it cannot own this buffer");
            }
            pool->deallocate_checked(reinterpret_cast<void*>(address), bytes_for(count, prec));
          },
          py::arg("device_id"), py::arg("buffer"), py::arg("size"),
          py::arg("precision") = py::none());
}

// Pressure and releasing memory: cleanup, trim, the limit.
void def_pool_release(PoolClass& pool_class) {
  pool_class
      .def(
          "memory_pressure",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            auto pool = pool_if_valid(reg, device);
            if (!pool) return py::none();
            return py::float_(pool->memory_pressure());
          },
          py::arg("device_id"),
          "Pressure in [0, 1] (reserved/limit with a limit, else the device's used "
          "fraction), or None for a device id that does not exist.")
      .def(
          "emergency_cleanup",
          [](PoolRegistry& reg, const py::handle& device) -> std::size_t {
            const int id = to_device_id(device);
            auto pool = reg.find(id);
            if (!pool) return 0;
            py::gil_scoped_release nogil;
            return pool->emergency_cleanup() + reg.drop_retired_captures(id);
          },
          py::arg("device_id"),
          "Returns every cached free segment of the device's pool to the driver, and the "
          "memory of CUDA-graph capture pools whose graph is gone; bytes released.")
      .def(
          "capture_pools",
          [](PoolRegistry& reg, const py::handle& device) {
            py::list out;
            for (const auto& info : reg.capture_pools(to_device_id(device))) {
              py::dict d = py::cast(info.stats).attr("to_dict")();
              d["capture_id"] = info.id.second;
              d["graph_alive"] = info.uses > 0;
              out.append(d);
            }
            return out;
          },
          py::arg("device_id"),
          "The pools of CUDA-graph captures on the device: allocations made on a stream while "
          "it captures (CuPy's Stream.begin_capture, a raw cudaStreamBeginCapture) come from "
          "a pool of the capture's own, kept from other work until its graph is destroyed. "
          "One dict each: capture_id, graph_alive and the pool's books.")
      .def(
          "emergency_cleanup_all",
          [](PoolRegistry& reg) {
            py::gil_scoped_release nogil;
            return reg.emergency_cleanup_all();
          },
          "emergency_cleanup on every device's pool; bytes released.")
      .def(
          "trim",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& keep) -> std::size_t {
            std::size_t keep_bytes = to_count(keep, "keep_bytes");
            auto pool = reg.find(to_device_id(device));
            if (!pool) return 0;
            py::gil_scoped_release nogil;
            return pool->trim(keep_bytes);
          },
          py::arg("device_id"), py::arg("keep_bytes") = 0,
          "Releases cached segments until at most keep_bytes stay reserved; bytes released.")
      .def(
          "set_max_pool_size",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& bytes) {
            std::size_t limit = to_count(bytes, "max pool size");
            device_pool(reg, device)->set_limit(limit);
          },
          py::arg("device_id"), py::arg("max_bytes"),
          "Limits the bytes the device's pool reserves (0: no limit).")
      .def(
          "max_pool_size",
          [](PoolRegistry& reg, const py::handle& device) -> std::size_t {
            auto pool = reg.find(to_device_id(device));
            return pool ? pool->limit() : 0;
          },
          py::arg("device_id"));
}

// Reading a pool: usage, stats and peaks.
void def_pool_usage(PoolClass& pool_class) {
  pool_class
      .def(
          "memory_usage",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            int id = to_device_id(device);
            if (id >= reg.device_count()) return py::none();
            auto pool = reg.find(id);
            if (!pool) return py::make_tuple(0, 0);
            PoolStats s = pool->stats();
            return py::make_tuple(s.allocated_bytes, s.peak_allocated_bytes);
          },
          py::arg("device_id"),
          "(allocated, peak allocated) bytes of the device's pool, or None for a device id "
          "that does not exist.")
      .def(
          "total_memory_usage",
          [](PoolRegistry& reg) {
            auto usage = reg.total_usage();
            return py::make_tuple(usage.first, usage.second);
          },
          "(allocated, peak allocated) bytes summed over every device's pool.")
      .def(
          "stats",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            auto pool = pool_if_valid(reg, device);
            if (!pool) return py::none();
            return py::cast(pool->stats());
          },
          py::arg("device_id"), "PoolStats of the device's pool, or None for an unknown id.")
      .def(
          "reset_peaks",
          [](PoolRegistry& reg, const py::handle& device) {
            if (auto pool = reg.find(to_device_id(device))) pool->reset_peaks();
          },
          py::arg("device_id"));
}

// Reading a pool: history, snapshot, validation.
void def_pool_history(PoolClass& pool_class) {
  pool_class
      .def(
          "history",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            int id = to_device_id(device);
            if (id >= reg.device_count()) return py::none();
            auto pool = reg.find(id);  // a pool not made yet has done nothing
            return py::cast(pool ? pool->history() : PoolHistory{});
          },
          py::arg("device_id"),
          "PoolHistory of the device's pool (PyTorch's memory_stats terms), or None for an "
          "unknown id.")
      .def(
          "reset_accumulated",
          [](PoolRegistry& reg, const py::handle& device) {
            if (auto pool = reg.find(to_device_id(device))) pool->reset_accumulated();
          },
          py::arg("device_id"), "Restarts the totals and event counts of history().")
      .def(
          "snapshot",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            auto pool = reg.find(to_device_id(device));
            if (!pool) return py::list();
            return py::cast(pool->snapshot());
          },
          py::arg("device_id"),
          "The device pool's segments (SegmentSnapshot) with their blocks, in address order.")
      .def(
          "validate",
          [](PoolRegistry& reg, const py::handle& device) -> std::string {
            auto pool = reg.find(to_device_id(device));
            return pool ? pool->validate() : std::string();
          },
          py::arg("device_id"),
          "What is inconsistent in the pool's books; '' when all is well.")
      .def(
          "owns",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& ptr) {
            auto pool = reg.find(to_device_id(device));
            return pool && pool->owns(reinterpret_cast<void*>(to_count(ptr, "pointer")));
          },
          py::arg("device_id"), py::arg("ptr"));
}

// Watermark and reclaim callbacks, and the devices with pools.
void def_pool_callbacks(PoolClass& pool_class) {
  pool_class
      .def(
          "add_watermark",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& level_obj,
             py::object callback) {
            const double level = to_level(level_obj);
            auto fn = hold_callable(std::move(callback));
            return device_pool(reg, device)->add_watermark(level, [fn](double pressure) {
              py::gil_scoped_acquire gil;
              try {
                (*fn)(pressure);
              } catch (py::error_already_set& e) {
                report_callback_error(e, "gpukeeper watermark callback");
              }
            });
          },
          py::arg("device_id"), py::arg("level"), py::arg("callback"),
          "Calls callback(pressure) when the pool's pressure rises to level; re-arms below.")
      .def(
          "remove_watermark",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& callback_id) {
            const std::size_t id = to_count(callback_id, "callback_id");
            auto pool = reg.find(to_device_id(device));
            return pool && id <= static_cast<std::size_t>(INT_MAX) && pool->remove_watermark(static_cast<int>(id));
          },
          py::arg("device_id"), py::arg("callback_id"))
      .def(
          "add_reclaim_callback",
          [](PoolRegistry& reg, const py::handle& device, py::object callback) {
            auto fn = hold_callable(std::move(callback));
            return device_pool(reg, device)->add_reclaim_callback([fn](std::size_t needed) {
              py::gil_scoped_acquire gil;
              try {
                py::object released = (*fn)(needed);
                if (released.is_none()) return std::size_t{0};
                return to_count(released, "reclaim callback result");
              } catch (py::error_already_set& e) {
                report_callback_error(e, "gpukeeper reclaim callback");
              }
            });
          },
          py::arg("device_id"), py::arg("callback"),
          "Calls callback(bytes_needed) when the device runs out of memory even after the "
          "pool dropped its cache; it may free memory and return how much (or None).")
      .def(
          "remove_reclaim_callback",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& callback_id) {
            const std::size_t id = to_count(callback_id, "callback_id");
            auto pool = reg.find(to_device_id(device));
            return pool && id <= static_cast<std::size_t>(INT_MAX) && pool->remove_reclaim_callback(static_cast<int>(id));
          },
          py::arg("device_id"), py::arg("callback_id"))
      .def("devices", [](const PoolRegistry& reg) {
        std::vector<int> ids;
        for (const auto& p : reg.pools()) ids.push_back(p->device());
        return ids;
      }, "Device ids whose pools exist.");
}

}  // namespace

// Pools that outlived their MemoryPool (pool_registry.hpp's orphaned_pools), as the
// process's account reads them: kind, device, stats, peaks, and their cache released.
void init_buffer_hook(py::module_& m) {
  m.def(
      "_set_buffer_hook",
      [](py::object hook) {
        py::object* old = g_buffer_hook;
        g_buffer_hook = hook.is_none() ? nullptr : new py::object(std::move(hook));
        delete old;
      },
      py::arg("hook"),
      "Calls hook(buffer) with each new ManagedBuffer (None: stop). For leak tracking.");
}

void init_orphaned_pools(py::module_& m) {
  py::class_<CachingPool, std::shared_ptr<CachingPool>>(m, "_OrphanPool")
      .def_property_readonly("kind", [](const CachingPool& p) { return std::string(to_string(p.kind())); })
      .def_property_readonly("device", &CachingPool::device)
      .def("stats", &CachingPool::stats)
      .def("reset_peaks", &CachingPool::reset_peaks)
      .def("emergency_cleanup", [](CachingPool& p) {
        py::gil_scoped_release nogil;
        return p.emergency_cleanup();
      });
  m.def("_orphaned_pools", [] { return orphaned_pools(); },
        "Pools whose MemoryPool is gone but whose blocks are still out (a buffer returned "
        "from a function that made its own pool).");
}

void init_memory(py::module_& m) {
  init_precision(m);
  init_pool_stats(m);
  init_orphaned_pools(m);
  init_buffer_hook(m);
  PoolClass pool_class(m, "_MemoryPoolBase", py::dynamic_attr());
  def_pool_buffers(pool_class);
  def_pool_release(pool_class);
  def_pool_usage(pool_class);
  def_pool_history(pool_class);
  def_pool_callbacks(pool_class);
  add_fast_method(pool_class, &g_get_managed_buffer);
}

}  // namespace gpukeeper::py_bindings
