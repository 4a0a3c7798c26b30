#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::py_bindings {

namespace {
PyObject* g_gpu_error = nullptr;
PyObject* g_invalid_input = nullptr;
PyObject* g_allocation = nullptr;
PyObject* g_device = nullptr;

PyObject* new_error(py::module_& m, const char* name, const char* doc, PyObject* bases) {
  std::string qualified = std::string("gpukeeper.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module owns a reference
  return type;
}
}  // namespace

void set_python_error() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const InvalidInputError& e) {
    PyErr_SetString(g_invalid_input, e.what());
  } catch (const AllocationError& e) {
    PyErr_SetString(g_allocation, e.what());
  } catch (const DeviceError& e) {
    PyErr_SetString(g_device, e.what());
  } catch (const GpuError& e) {
    PyErr_SetString(g_gpu_error, e.what());
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

void add_fast_method(py::handle cls, PyMethodDef* def) {
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (descr == nullptr) throw py::error_already_set();
  int failed = PyObject_SetAttrString(cls.ptr(), def->ml_name, descr);
  Py_DECREF(descr);
  if (failed) throw py::error_already_set();
}

void init_errors(py::module_& m) {
  g_gpu_error = new_error(m, "GpuError", "Base class of every gpukeeper error.", nullptr);
  py::tuple invalid_bases = py::make_tuple(py::handle(g_gpu_error), py::handle(PyExc_ValueError));
  g_invalid_input = new_error(m, "InvalidInputError",
                              "Bad input; nothing was changed. Also a ValueError.",
                              invalid_bases.ptr());
  py::tuple alloc_bases = py::make_tuple(py::handle(g_gpu_error), py::handle(PyExc_MemoryError));
  g_allocation = new_error(m, "AllocationError",
                           "Memory could not be had after releasing caches and running reclaim "
                           "callbacks. Also a MemoryError.",
                           alloc_bases.ptr());
  py::tuple device_bases = py::make_tuple(py::handle(g_gpu_error), py::handle(PyExc_RuntimeError));
  g_device = new_error(m, "DeviceError",
                       "A CUDA call failed; the message names the call, the error code's name "
                       "and its text.",
                       device_bases.ptr());

  // Ours only: anything else falls through to pybind11's own translators.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const GpuError&) {
      set_python_error();
    }
  });
}

}  // namespace gpukeeper::py_bindings
