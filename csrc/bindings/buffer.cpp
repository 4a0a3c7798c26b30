// ManagedBuffer for Python: RAII through `with`/release(), zero-copy views through the
// buffer protocol (host-visible memory), __cuda_array_interface__ and DLPack.
#include <pybind11/pybind11.h>

#include <cinttypes>
#include <cstdio>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/buffer_io.hpp"

namespace gpukeeper::py_bindings {

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

PyBuffer* buffer_of(PyObject* obj) { return py::handle(obj).cast<PyBuffer*>(); }

struct ViewShape {
  Py_ssize_t shape[1];
  Py_ssize_t strides[1];
};

int get_buffer(PyObject* obj, Py_buffer* view, int flags) {
  PyBuffer* buf = nullptr;
  try {
    buf = buffer_of(obj);
  } catch (...) {
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
  try {
    buffer_of(obj)->end_export();
  } catch (...) {
  }
}

std::string hex(std::uintptr_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%" PRIxPTR, v);
  return text;
}

PyObject* fast_release(PyObject* self, PyObject*) {
  try {
    py::handle(self).cast<PyBuffer&>().release();
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyMethodDef g_release = {
    "release", fast_release, METH_NOARGS,
    "Returns the block to the pool (once no DLPack or buffer-protocol view remains). Using "
    "the buffer afterwards raises InvalidInputError."};

// The context manager, as plain CPython methods: through pybind11's dispatcher the two
// calls cost more than the allocation and the release together (issue 13's round trip).
PyObject* fast_enter(PyObject* self, PyObject*) {
  Py_INCREF(self);
  return self;
}

PyObject* fast_exit(PyObject* self, PyObject* const*, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "__exit__() takes 3 arguments (%zd given)", nargs);
    return nullptr;
  }
  try {
    py::handle(self).cast<PyBuffer&>().release();
    Py_RETURN_FALSE;  // exceptions propagate
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyMethodDef g_enter = {"__enter__", fast_enter, METH_NOARGS, "The buffer itself."};

PyMethodDef g_exit = {
    "__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_exit)), METH_FASTCALL,
    "Releases the buffer (see release()); exceptions propagate."};

using BufferClass = py::class_<PyBuffer, std::unique_ptr<PyBuffer>>;

// What a buffer is: address, size, element type, device, stream.
void def_buffer_properties(BufferClass& buffer_class) {
  buffer_class
      .def_property_readonly("released", [](const PyBuffer& b) { return b.released; },
                             "Whether release() ran (the block may wait for views to go).")
      .def_property_readonly("ptr",
                             [](const PyBuffer& b) {
                               b.require_live("ptr");
                               return reinterpret_cast<std::uintptr_t>(b.buffer.data());
                             },
                             "Address of the first byte.")
      .def_property_readonly("nbytes", &PyBuffer::nbytes, "Size in bytes (size * itemsize).")
      .def_property_readonly("size", [](const PyBuffer& b) { return b.count; },
                             "Number of elements.")
      .def("__len__", [](const PyBuffer& b) { return b.count; }, "Number of elements.")
      .def_property_readonly("precision", [](const PyBuffer& b) { return b.precision; },
                             "Element type (Precision).")
      .def_property_readonly("device", [](const PyBuffer& b) { return b.device; },
                             "The device_id the buffer was asked for: a CUDA ordinal, or the id "
                             "given to a host pool.")
      .def_property_readonly("kind", [](const PyBuffer& b) { return std::string(to_string(b.kind)); },
                             "The pool kind it came from: 'device', 'async', 'host' or 'pinned'.")
      .def_property_readonly("stream", [](const PyBuffer& b) { return b.buffer.stream(); },
                             "The stream (cudaStream_t as an int) the block is ordered on.")
      .def_property_readonly("exports", [](const PyBuffer& b) { return b.exports; },
                             "Live views (buffer protocol, DLPack) of this buffer.");
}

// Views for other libraries: CUDA array interface, DLPack, numpy.
void def_buffer_views(BufferClass& buffer_class) {
  buffer_class
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const PyBuffer& b) {
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
          })
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version, py::object dl_device,
             py::object copy) {
            PyBuffer& b = self.cast<PyBuffer&>();
            return make_dlpack(self, b, stream, max_version, dl_device, copy);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const PyBuffer& b) { return dlpack_device(b); })
      .def(
          "__array__",
          [](py::object self, py::object dtype, py::object copy) {
            PyBuffer& b = self.cast<PyBuffer&>();
            // numpy swallows buffer-protocol errors and would build a 0-d object array.
            b.require_live("__array__");
            if (!host_visible(b.kind)) {
              throw InvalidInputError("device memory does not become a numpy array without a "
                                      "copy: use to_bytes(), cupy.asarray or torch.from_dlpack");
            }
            py::object np = py::module_::import("numpy");
            py::object array = np.attr("asarray")(py::memoryview(self));
            if (!dtype.is_none()) array = array.attr("astype")(dtype, py::arg("copy") = false);
            if (!copy.is_none() && copy.cast<bool>()) array = array.attr("copy")();
            return array;
          },
          py::arg("dtype") = py::none(), py::kw_only(), py::arg("copy") = py::none(),
          "A numpy view of host-visible memory (no copy); it keeps the memory alive.");
}

// Copies in and out, and the repr.
void def_buffer_copies(BufferClass& buffer_class) {
  buffer_class
      .def(
          "copy_from_host",
          [](PyBuffer& b, const py::object& data) {
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
          "protocol) into the start of the buffer.")
      .def(
          "to_bytes",
          [](PyBuffer& b) {
            b.require_live("to_bytes");
            std::string out(b.nbytes(), '\0');
            {
              py::gil_scoped_release nogil;
              copy_block(b.kind, b.device, b.buffer.stream(), out.data(), b.buffer.data(),
                         out.size());
            }
            return py::bytes(out);
          },
          "The buffer's contents as bytes, after the work queued on its stream.")
      .def("__repr__", [](const PyBuffer& b) {
        if (b.released || !b.buffer) return std::string("<ManagedBuffer released>");
        return "<ManagedBuffer " + std::string(to_string(b.kind)) + ":" +
               std::to_string(b.device) + " " + std::to_string(b.count) + " x " +
               to_string(b.precision) + " (" + std::to_string(b.nbytes()) + " bytes) at " +
               hex(reinterpret_cast<std::uintptr_t>(b.buffer.data())) + ">";
      });
}

}  // namespace

void init_buffer(py::module_& m) {
  BufferClass buffer_class(
      m, "ManagedBuffer", py::custom_type_setup([](PyHeapTypeObject* heap_type) {
        heap_type->ht_type.tp_as_buffer = &heap_type->as_buffer;
        heap_type->as_buffer.bf_getbuffer = get_buffer;
        heap_type->as_buffer.bf_releasebuffer = release_buffer;
      }),
      "One pool block, returned to its pool by release(), at the end of a `with` block, or "
      "when the buffer is garbage. Views taken through the buffer protocol or DLPack keep "
      "the memory alive until they are gone.");
  def_buffer_properties(buffer_class);
  def_buffer_views(buffer_class);
  def_buffer_copies(buffer_class);
  add_fast_method(buffer_class, &g_release);
  add_fast_method(buffer_class, &g_enter);
  add_fast_method(buffer_class, &g_exit);
}

}  // namespace gpukeeper::py_bindings
