// MemoryPool (_MemoryPoolBase): its construction and the buffers it hands out.
#include "memory_pool.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::py_bindings {

namespace {

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
                                         "keyword argument '") +
                             (key ? key : "?") + "'");
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
    "get_managed_buffer",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_get_managed_buffer)),
    METH_FASTCALL | METH_KEYWORDS,
    "get_managed_buffer(device_id, size, precision=Precision.Fp32, stream=None)\n\n"
    "A buffer of `size` elements of `precision` on `device_id`, returned to the pool when "
    "released, when its `with` block ends, or when it is garbage."};

ResourceKind resolve_kind(const std::string& kind) {
  if (kind == "auto") return cuda_status().available ? ResourceKind::device : ResourceKind::host;
  return parse_resource_kind(kind);
}

// MemoryPool's construction and its legacy get_buffer/return_buffer.
void def_pool_buffers(PoolClass& pool_class) {
  pool_class
      .def(py::init([](const std::string& kind, const py::object& expandable) {
             PoolOptions options;
             set_pool_layout(options, expandable);
             ResourceKind resolved = resolve_kind(kind);
             if (layout_needs_virtual_memory(options.segments) &&
                 resolved != ResourceKind::device && resolved != ResourceKind::host) {
               throw InvalidInputError(std::string("expandable segments need 'device' or 'host' "
                                                   "memory, not '") +
                                       to_string(resolved) + "'");
             }
             return std::make_unique<PoolRegistry>(resolved, options);
           }),
           py::arg("kind") = "auto", py::arg("expandable") = "auto")
      .def_property_readonly(
          "expandable",
          [](const PoolRegistry& r) { return pool_layout_value(r.options().segments); },
          "The layout asked for: 'auto' (the default: 'hybrid' where the "
          "device has virtual memory management, else False), True (every "
          "request in expandable ranges; also asked as 'expandable'), 'hybrid' "
          "(requests over 1 MiB only; small ones in fixed segments) or False "
          "(fixed segments; also asked as 'fixed').")
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

}  // namespace

// MemoryPool(expandable=...) and use_torch_allocator(expandable=...): the words users type
// for a layout, read off the one mapping (pool_layout.hpp: "auto", "fixed", "expandable",
// "hybrid", and True and False for the two yes/no layouts).
void set_pool_layout(PoolOptions& options, const py::object& expandable) {
  std::string spelled;  // as Python writes the value, the form the mapping holds
  if (PyBool_Check(expandable.ptr())) {
    spelled = expandable.ptr() == Py_True ? "True" : "False";
  } else if (py::isinstance<py::str>(expandable)) {
    spelled = "'" + expandable.cast<std::string>() + "'";
  }
  bool former = false;
  if (!spelled.empty() && layout_from_python(spelled, options.segments, &former)) {
    if (former) {
      const std::string text = "expandable=" + spelled + " is now expandable='" +
                               std::string(to_string(options.segments)) +
                               "' (the same word as the C++ layout); the former word goes "
                               "in the next release";
      if (PyErr_WarnEx(PyExc_DeprecationWarning, text.c_str(), 2) != 0) {
        throw py::error_already_set();  // warnings turned into errors
      }
    }
    return;
  }
  throw InvalidInputError("expandable must be " + python_spellings() +
                          " (or the words 'fixed', 'expandable'), got " +
                          std::string(py::repr(expandable)));
}

py::object pool_layout_value(SegmentLayout layout) {
  const std::string spelled = python_spelling(layout);
  if (spelled == "True" || spelled == "False") return py::bool_(spelled == "True");
  return py::str(spelled.substr(1, spelled.size() - 2));  // a quoted string
}

// The class is made here and each file adds its method group (memory_pool.hpp).
void init_memory_pool(py::module_& m) {
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
