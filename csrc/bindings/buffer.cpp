// ManagedBuffer for Python: RAII through `with`/release(), zero-copy views through the
// buffer protocol (host-visible memory), __cuda_array_interface__ and DLPack.
#include <pybind11/pybind11.h>
#include <structmember.h>

#include <cinttypes>
#include <cstdio>
#include <new>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/buffer_io.hpp"

// `self` of the methods that are not on the round trip, which keep pybind11's argument
// handling: a caster of its own, so that wrong objects get pybind11's usual TypeError and
// signatures name the type, as they did while ManagedBuffer was a pybind11 class.
namespace gpukeeper::py_bindings {
namespace {
struct BufferSelf {
  py::handle obj;
  PyBuffer* buf = nullptr;
  PyBuffer& operator*() const { return *buf; }
  py::object object() const { return py::reinterpret_borrow<py::object>(obj); }
};
}  // namespace
}  // namespace gpukeeper::py_bindings

namespace pybind11::detail {
template <>
struct type_caster<gpukeeper::py_bindings::BufferSelf> {
  PYBIND11_TYPE_CASTER(gpukeeper::py_bindings::BufferSelf,
                       const_name("gpukeeper._core.ManagedBuffer"));
  bool load(handle src, bool) {
    value.buf = gpukeeper::py_bindings::buffer_of(src.ptr());
    value.obj = src;
    return value.buf != nullptr;
  }
  static handle cast(const gpukeeper::py_bindings::BufferSelf& self, return_value_policy,
                     handle) {
    return self.obj.inc_ref();
  }
};
}  // namespace pybind11::detail

namespace gpukeeper::py_bindings {

PyTypeObject* g_buffer_type = nullptr;

namespace {

bool host_visible(ResourceKind k) { return k == ResourceKind::host || k == ResourceKind::pinned; }
bool device_visible(ResourceKind k) { return k != ResourceKind::host; }

const char* buffer_format(Precision p) {
  switch (p) {
    case Precision::fp64: return "d";
    case Precision::fp32: return "f";
    case Precision::fp16: return "e";
    case Precision::bf16: return "H";  // no struct code for bfloat16: raw 16-bit words
    case Precision::int64: return "q";
    case Precision::int32: return "i";
    case Precision::int16: return "h";
    case Precision::int8: return "b";
    case Precision::uint8: return "B";
    case Precision::boolean: return "?";
  }
  return "B";
}

const char* array_typestr(Precision p) {
  switch (p) {
    case Precision::fp64: return "<f8";
    case Precision::fp32: return "<f4";
    case Precision::fp16: return "<f2";
    case Precision::bf16: return "<V2";  // opaque 2-byte elements; DLPack carries bfloat16
    case Precision::int64: return "<i8";
    case Precision::int32: return "<i4";
    case Precision::int16: return "<i2";
    case Precision::int8: return "|i1";
    case Precision::uint8: return "|u1";
    case Precision::boolean: return "|b1";
  }
  return "|u1";
}

struct ViewShape {
  Py_ssize_t shape[1];
  Py_ssize_t strides[1];
};

int get_buffer(PyObject* obj, Py_buffer* view, int flags) {
  PyBuffer* buf = buffer_of(obj);
  if (buf == nullptr) {
    PyErr_SetString(PyExc_BufferError, "not a gpukeeper ManagedBuffer");
    return -1;
  }
  if (buf->released || !buf->buffer) {
    PyErr_SetString(PyExc_BufferError, "the buffer was released");
    return -1;
  }
  if (!host_visible(buf->kind)) {
    PyErr_SetString(PyExc_BufferError,
                    "device memory has no buffer protocol: use __dlpack__ or "
                    "__cuda_array_interface__ (torch.from_dlpack, cupy.asarray)");
    return -1;
  }
  auto* shape = new ViewShape;
  const std::size_t itemsize = element_size(buf->precision);
  shape->shape[0] = static_cast<Py_ssize_t>(buf->count);
  shape->strides[0] = static_cast<Py_ssize_t>(itemsize);
  view->obj = obj;
  Py_INCREF(obj);
  view->buf = buf->buffer.data();
  view->len = static_cast<Py_ssize_t>(buf->nbytes());
  view->readonly = 0;
  view->itemsize = (flags & PyBUF_FORMAT) ? static_cast<Py_ssize_t>(itemsize) : 1;
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(buffer_format(buf->precision)) : nullptr;
  view->ndim = 1;
  view->shape = (flags & PyBUF_ND) == PyBUF_ND ? shape->shape : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? shape->strides : nullptr;
  view->suboffsets = nullptr;
  view->internal = shape;
  if (!(flags & PyBUF_FORMAT) && view->shape != nullptr) {
    // Without a format the consumer reads bytes, so the shape must count bytes.
    shape->shape[0] = view->len;
    shape->strides[0] = 1;
  }
  ++buf->exports;
  return 0;
}

void release_buffer(PyObject* obj, Py_buffer* view) {
  delete static_cast<ViewShape*>(view->internal);
  view->internal = nullptr;
  if (PyBuffer* buf = buffer_of(obj)) buf->end_export();
}

std::string hex(std::uintptr_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%" PRIxPTR, v);
  return text;
}

// For methods and getters of the ManagedBuffer type: their descriptors check self's type.
PyBuffer& self_buffer(PyObject* self) { return reinterpret_cast<BufferObject*>(self)->buf; }

// Through pybind11's dispatcher and its type lookups, release() and the two context
// manager calls cost more than the pool's allocation and release together, so these
// three skip it.
PyObject* fast_release(PyObject* self, PyObject*) {
  self_buffer(self).release();
  Py_RETURN_NONE;
}

PyObject* fast_enter(PyObject* self, PyObject*) {
  Py_INCREF(self);
  return self;
}

PyObject* fast_exit(PyObject* self, PyObject* const*, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "__exit__() takes 3 arguments (%zd given)", nargs);
    return nullptr;
  }
  self_buffer(self).release();
  Py_RETURN_FALSE;  // exceptions propagate
}

PyMethodDef g_methods[] = {
    {"release", fast_release, METH_NOARGS,
     "Returns the block to the pool (once no DLPack or buffer-protocol view remains). Using "
     "the buffer afterwards raises InvalidInputError."},
    {"__enter__", fast_enter, METH_NOARGS, "The buffer itself."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_exit)),
     METH_FASTCALL, "Releases the buffer (see release()); exceptions propagate."},
    {nullptr, nullptr, 0, nullptr}};

// The getters of the properties: plain CPython getset descriptors, with errors mapped as
// pybind11 maps them.
template <typename F>
PyObject* guarded(PyObject* self, F&& get) {
  try {
    return get(static_cast<const PyBuffer&>(self_buffer(self))).release().ptr();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyObject* get_released(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::bool_(b.released); });
}
PyObject* get_ptr(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) {
    b.require_live("ptr");
    return py::int_(reinterpret_cast<std::uintptr_t>(b.buffer.data()));
  });
}
PyObject* get_nbytes(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::int_(b.nbytes()); });
}
PyObject* get_size(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::int_(b.count); });
}
PyObject* get_precision(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::cast(b.precision); });
}
PyObject* get_device(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::int_(b.device); });
}
PyObject* get_kind(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::str(to_string(b.kind)); });
}
PyObject* get_stream(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::int_(b.buffer.stream()); });
}
PyObject* get_exports(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) { return py::int_(b.exports); });
}
PyObject* get_cuda_array_interface(PyObject* self, void*) {
  return guarded(self, [](const PyBuffer& b) {
    if (!device_visible(b.kind)) {
      throw py::attribute_error("host memory has no __cuda_array_interface__");
    }
    b.require_live("__cuda_array_interface__");
    py::dict cai;
    cai["shape"] = py::make_tuple(b.count);
    cai["typestr"] = array_typestr(b.precision);
    cai["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(b.buffer.data()), false);
    cai["strides"] = py::none();
    cai["version"] = 3;
    // Version 3: 1 names the legacy default stream, which our handle 0 is.
    stream_t s = b.buffer.stream();
    cai["stream"] = s == 0 ? std::uintptr_t{1} : s;
    return cai;
  });
}

PyGetSetDef g_properties[] = {
    {"released", get_released, nullptr,
     "Whether release() ran (the block may wait for views to go).", nullptr},
    {"ptr", get_ptr, nullptr, "Address of the first byte.", nullptr},
    {"nbytes", get_nbytes, nullptr, "Size in bytes (size * itemsize).", nullptr},
    {"size", get_size, nullptr, "Number of elements.", nullptr},
    {"precision", get_precision, nullptr, "Element type (Precision).", nullptr},
    {"device", get_device, nullptr,
     "The device_id the buffer was asked for: a CUDA ordinal, or the id given to a host "
     "pool.", nullptr},
    {"kind", get_kind, nullptr,
     "The pool kind it came from: 'device', 'async', 'host' or 'pinned'.", nullptr},
    {"stream", get_stream, nullptr,
     "The stream (cudaStream_t as an int) the block is ordered on.", nullptr},
    {"exports", get_exports, nullptr, "Live views (buffer protocol, DLPack) of this buffer.",
     nullptr},
    {"__cuda_array_interface__", get_cuda_array_interface, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// ManagedBuffer() itself: buffers come from MemoryPool.get_managed_buffer only (the text
// is the one pybind11 gave while the type was a pybind11 class).
PyObject* buffer_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyErr_Format(PyExc_TypeError, "%s: No constructor defined!", type->tp_name);
  return nullptr;
}

// Objects of buffers that died, kept for the next ones: allocating and freeing the
// object was a visible part of the round trip. Guarded by the GIL.
constexpr int kFreeObjects = 16;
PyObject* g_free_objects[kFreeObjects];
int g_free_count = 0;

BufferObject* g_live_head = nullptr;  // the list of live buffer objects (GIL-guarded)

void link_live(BufferObject* obj) noexcept {
  obj->live_prev = nullptr;
  obj->live_next = g_live_head;
  if (g_live_head != nullptr) g_live_head->live_prev = obj;
  g_live_head = obj;
}

void unlink_live(BufferObject* obj) noexcept {
  if (obj->live_prev != nullptr) {
    obj->live_prev->live_next = obj->live_next;
  } else if (g_live_head == obj) {
    g_live_head = obj->live_next;
  }
  if (obj->live_next != nullptr) obj->live_next->live_prev = obj->live_prev;
  obj->live_prev = obj->live_next = nullptr;
}

void buffer_dealloc(PyObject* self) {
  auto* obj = reinterpret_cast<BufferObject*>(self);
  PyTypeObject* type = Py_TYPE(self);
  unlink_live(obj);
  if (obj->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  obj->buf.~PyBuffer();  // returns the block unless release() did already
  if (type == g_buffer_type && g_free_count < kFreeObjects) {
    g_free_objects[g_free_count++] = self;
  } else {
    type->tp_free(self);
  }
  Py_DECREF(type);  // instances of heap types own a reference to their type
}

PyMemberDef g_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(BufferObject, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

template <typename F, typename... Extra>
void def_method(py::handle type, const char* name, F&& f, const Extra&... extra) {
  py::cpp_function fn(std::forward<F>(f), py::name(name), py::is_method(type),
                      py::sibling(py::getattr(type, name, py::none())), extra...);
  if (PyObject_SetAttrString(type.ptr(), name, fn.ptr()) != 0) throw py::error_already_set();
}

// Views for other libraries: DLPack, numpy.
void def_buffer_views(py::handle type) {
  def_method(type, "__len__", [](BufferSelf self) { return (*self).count; },
             "Number of elements.");
  def_method(
      type, "__dlpack__",
      [](BufferSelf self, py::object stream, py::object max_version, py::object dl_device,
         py::object copy) {
        return make_dlpack(self.object(), *self, stream, max_version, dl_device, copy);
      },
      py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
      py::arg("dl_device") = py::none(), py::arg("copy") = py::none());
  def_method(type, "__dlpack_device__",
             [](BufferSelf self) { return dlpack_device(*self); });
  def_method(
      type, "__array__",
      [](BufferSelf self, py::object dtype, py::object copy) {
        PyBuffer& b = *self;
        // numpy swallows buffer-protocol errors and would build a 0-d object array.
        b.require_live("__array__");
        if (!host_visible(b.kind)) {
          throw InvalidInputError("device memory does not become a numpy array without a "
                                  "copy: use to_bytes(), cupy.asarray or torch.from_dlpack");
        }
        py::object np = py::module_::import("numpy");
        py::object array = np.attr("asarray")(py::memoryview(self.object()));
        if (!dtype.is_none()) array = array.attr("astype")(dtype, py::arg("copy") = false);
        if (!copy.is_none() && copy.cast<bool>()) array = array.attr("copy")();
        return array;
      },
      py::arg("dtype") = py::none(), py::kw_only(), py::arg("copy") = py::none(),
      "A numpy view of host-visible memory (no copy); it keeps the memory alive.");
}

// Copies in and out, and the repr.
void def_buffer_copies(py::handle type) {
  def_method(
      type, "copy_from_host",
      [](BufferSelf self, const py::object& data) {
        PyBuffer& b = *self;
        b.require_live("copy_from_host");
        if (!PyObject_CheckBuffer(data.ptr())) {
          throw InvalidInputError("copy_from_host: data must support the buffer protocol "
                                  "(bytes, bytearray, a numpy array, ...), got " +
                                  std::string(Py_TYPE(data.ptr())->tp_name));
        }
        py::buffer_info info = py::reinterpret_borrow<py::buffer>(data).request();
        std::size_t bytes = static_cast<std::size_t>(info.size) * info.itemsize;
        if (bytes > b.nbytes()) {
          throw InvalidInputError("copy_from_host: " + std::to_string(bytes) +
                                  " bytes do not fit in a buffer of " +
                                  std::to_string(b.nbytes()));
        }
        bool contiguous = true;
        py::ssize_t expected = info.itemsize;
        for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
          if (info.shape[i] > 1 && info.strides[i] != expected) contiguous = false;
          expected *= info.shape[i];
        }
        if (!contiguous) throw InvalidInputError("copy_from_host needs contiguous data");
        py::gil_scoped_release nogil;
        copy_block(b.kind, b.device, b.buffer.stream(), b.buffer.data(), info.ptr, bytes);
      },
      py::arg("data"),
      "Copies host data (bytes, bytearray, numpy array, anything with the buffer "
      "protocol) into the start of the buffer.");
  def_method(
      type, "to_bytes",
      [](BufferSelf self) {
        PyBuffer& b = *self;
        b.require_live("to_bytes");
        std::string out(b.nbytes(), '\0');
        {
          py::gil_scoped_release nogil;
          copy_block(b.kind, b.device, b.buffer.stream(), out.data(), b.buffer.data(),
                     out.size());
        }
        return py::bytes(out);
      },
      "The buffer's contents as bytes, after the work queued on its stream.");
  def_method(type, "__repr__", [](BufferSelf self) {
    const PyBuffer& b = *self;
    if (b.released || !b.buffer) return std::string("<ManagedBuffer released>");
    return "<ManagedBuffer " + std::string(to_string(b.kind)) + ":" +
           std::to_string(b.device) + " " + std::to_string(b.count) + " x " +
           to_string(b.precision) + " (" + std::to_string(b.nbytes()) + " bytes) at " +
           hex(reinterpret_cast<std::uintptr_t>(b.buffer.data())) + ">";
  });
}

}  // namespace

void PyBuffer::require_live(const char* what) const {
  if (released || !buffer) {
    throw InvalidInputError(std::string(what) + ": the buffer was released; its memory is "
                            "back in the pool and may belong to someone else now");
  }
}

py::object new_buffer_object() {
  PyObject* self;
  if (g_free_count > 0) {
    self = g_free_objects[--g_free_count];
    PyObject_Init(self, g_buffer_type);  // a new reference, and one to the type
    reinterpret_cast<BufferObject*>(self)->weakrefs = nullptr;
  } else {
    self = PyType_GenericAlloc(g_buffer_type, 0);
    if (self == nullptr) throw py::error_already_set();
  }
  new (&reinterpret_cast<BufferObject*>(self)->buf) PyBuffer();
  link_live(reinterpret_cast<BufferObject*>(self));
  return py::reinterpret_steal<py::object>(self);
}

py::list live_buffer_objects() {
  py::list out;
  for (BufferObject* b = g_live_head; b != nullptr; b = b->live_next) {
    out.append(py::handle(reinterpret_cast<PyObject*>(b)));
  }
  return out;
}

void init_buffer(py::module_& m) {
  PyType_Slot slots[] = {
      {Py_tp_doc, const_cast<char*>(
                      "One pool block, returned to its pool by release(), at the end of a "
                      "`with` block, or when the buffer is garbage. Views taken through the "
                      "buffer protocol or DLPack keep the memory alive until they are gone.")},
      {Py_tp_new, reinterpret_cast<void*>(buffer_new)},
      {Py_tp_dealloc, reinterpret_cast<void*>(buffer_dealloc)},
      {Py_tp_methods, g_methods},
      {Py_tp_getset, g_properties},
      {Py_tp_members, g_members},
      {Py_bf_getbuffer, reinterpret_cast<void*>(get_buffer)},
      {Py_bf_releasebuffer, reinterpret_cast<void*>(release_buffer)},
      {0, nullptr}};
  PyType_Spec spec = {"gpukeeper._core.ManagedBuffer", static_cast<int>(sizeof(BufferObject)),
                      0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  g_buffer_type = reinterpret_cast<PyTypeObject*>(type);  // this reference is never dropped
  m.add_object("ManagedBuffer", py::handle(type));
  m.def("_live_buffers", &live_buffer_objects,
        "Every ManagedBuffer object alive now, released or not (for leak reports).");
  def_buffer_views(type);
  def_buffer_copies(type);
}

}  // namespace gpukeeper::py_bindings
