// Python values to core types for every binding file: streams, counts, device ids, precisions.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::py_bindings {

std::string type_name(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__name__"));
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

// The Precision enum is registered in this file, not with the pool, because to_precision
// compares against its member objects before any slower lookup.
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

void init_precision(py::module_& m) {
  py::enum_<Precision> precision(m, "Precision",
                                 "Element type of a buffer; sizes count these elements.");
  g_precision_type = precision.ptr();  // the module keeps the type alive
  precision.value("Fp64", Precision::fp64)
      .value("Fp32", Precision::fp32)
      .value("Fp16", Precision::fp16)
      .value("Bf16", Precision::bf16)
      .value("Int64", Precision::int64)
      .value("Int32", Precision::int32)
      .value("Int16", Precision::int16)
      .value("Int8", Precision::int8)
      .value("Uint8", Precision::uint8)
      .value("Bool", Precision::boolean)
      .def_property_readonly(
          "itemsize", [](Precision p) { return element_size(p); }, "Bytes per element.")
      .def_property_readonly(
          "label", [](Precision p) { return std::string(to_string(p)); },
          "Short name: 'fp32', 'bf16', ...")
      .def_static(
          "parse", [](const py::object& o) { return to_precision(o); }, py::arg("value"),
          "A Precision from a name ('fp32', 'float32', 'half') or a numpy/torch dtype.");
  int i = 0;
  for (const char* name :
       {"Fp64", "Fp32", "Fp16", "Bf16", "Int64", "Int32", "Int16", "Int8", "Uint8", "Bool"}) {
    py::object member = precision.attr(name);
    g_precision_members[i++] = {member.ptr(), member.cast<Precision>()};
    member.release();  // never dropped: the table compares against these objects
  }
}

}  // namespace gpukeeper::py_bindings
