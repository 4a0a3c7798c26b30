// Shared pieces of the pybind11 module gpukeeper._core. The module is thin: it converts
// Python values to core types, maps errors, and keeps Python-side lifetimes right.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

#include "gpukeeper/memory/managed_buffer.hpp"
#include "gpukeeper/memory/precision.hpp"

namespace gpukeeper::py_bindings {

namespace py = pybind11;

void init_errors(py::module_& m);
// Sets the Python error for the exception in flight (inside a catch block), mapping
// gpukeeper's errors as the module's translator does. For raw CPython entry points.
void set_python_error();
// Adds a METH_FASTCALL method to a pybind11 class: the few calls on hot paths skip
// pybind11's generic argument dispatch.
void add_fast_method(py::handle cls, PyMethodDef* def);
void init_pool_history(py::module_& m);
void init_precision(py::module_& m);
void init_pool_stats(py::module_& m);
void init_memory_pool(py::module_& m);
void init_buffer(py::module_& m);
void init_torch_allocator(py::module_& m);
void init_torch_pool_api(py::module_& m);
// Sets options.segments from Python's expandable='auto' | 'fixed' | 'expandable' |
// 'hybrid' | True | False (and the former 'large', with a DeprecationWarning), and
// gives a layout's value back, through the one mapping (gpukeeper/memory/pool_layout.hpp).
void set_pool_layout(PoolOptions& options, const py::object& expandable);
py::object pool_layout_value(SegmentLayout layout);
void init_timing(py::module_& m);
void init_device(py::module_& m);

// Python's view of one ManagedBuffer. Consumers that borrow its memory through the
// buffer protocol or DLPack count as exports: release() while they are alive only marks
// the buffer released, and the block goes back when the last export ends, so nothing
// ever touches freed memory. All members are used with the GIL held.
struct PyBuffer {
  ManagedBuffer buffer;
  Precision precision = Precision::uint8;
  std::size_t count = 0;  // elements
  ResourceKind kind = ResourceKind::host;
  int device = 0;
  int exports = 0;
  bool released = false;

  void release() {
    released = true;
    if (exports == 0) buffer.reset();
  }
  void end_export() {
    if (--exports == 0 && released) buffer.reset();
  }
  // Raises InvalidInputError when the buffer was released.
  void require_live(const char* what) const;
  std::size_t nbytes() const noexcept { return count * element_size(precision); }
};

// A ManagedBuffer's Python object. A plain CPython type, not a pybind11 class: pybind11's
// instance bookkeeping (type lookups on every cast, the registered-instance map on every
// creation and death) cost more than the pool's allocation and release.
struct BufferObject {
  PyObject_HEAD
  PyObject* weakrefs;
  // Every live buffer object is on one list (guarded by the GIL): ManagedBuffer is not a
  // gc-tracked type, so gc.get_objects() cannot find buffers for leak reports.
  BufferObject* live_prev;
  BufferObject* live_next;
  PyBuffer buf;
};
// The buffer objects alive now (new references), for leak reports.
py::list live_buffer_objects();
extern PyTypeObject* g_buffer_type;  // gpukeeper._core.ManagedBuffer, set by init_buffer

// The PyBuffer of a ManagedBuffer object; nullptr (no Python error set) for anything else.
inline PyBuffer* buffer_of(PyObject* obj) noexcept {
  return PyObject_TypeCheck(obj, g_buffer_type) ? &reinterpret_cast<BufferObject*>(obj)->buf
                                                : nullptr;
}

// A new ManagedBuffer object whose PyBuffer is empty, for the caller to fill.
py::object new_buffer_object();

// The name of obj's Python type, for error messages.
std::string type_name(const py::handle& obj);

// Converts None, an int, or an object with `cuda_stream` (torch) or `ptr` (CuPy) to a
// stream handle; InvalidInputError otherwise.
stream_t to_stream(const py::handle& obj);

// Converts a Precision, a name ("fp32", "float32"), or a numpy/torch dtype.
Precision to_precision(const py::handle& obj);

// A non-negative element count or device id from a Python int; InvalidInputError for
// negative values, bools, non-integers and overflow.
std::size_t to_count(const py::handle& obj, const char* what);
int to_device_id(const py::handle& obj);

// DLPack capsule for `self` (a Python ManagedBuffer); see dlpack.cpp.
py::object make_dlpack(py::object self, PyBuffer& buf, py::object stream, py::object max_version,
                       py::object dl_device, py::object copy);
py::tuple dlpack_device(const PyBuffer& buf);

}  // namespace gpukeeper::py_bindings
