// Device questions answered by the driver without creating a context: whether libcuda is
// loaded, the driver's devices and their attributes, primary contexts, a foreign current
// context, PCI bus ids (device/runtime.hpp). None where the driver cannot tell.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.hpp"
#include "gpukeeper/core/stream.hpp"
#include "gpukeeper/device/runtime.hpp"

namespace gpukeeper::py_bindings {

namespace {

// driver_device_info as a dict holding only the keys the driver answered, or None.
py::object driver_info_dict(int device) {
  std::optional<DriverDeviceInfo> info;
  {
    py::gil_scoped_release nogil;
    info = driver_device_info(device);
  }
  if (!info) return py::none();
  py::dict d;
  auto put = [&d](const char* key, const std::optional<int>& value) {
    if (value) d[key] = *value;
  };
  put("multiprocessors", info->multiprocessors);
  put("sm_clock_max_mhz", info->sm_clock_max_mhz);
  put("memory_clock_max_mhz", info->memory_clock_max_mhz);
  put("memory_bus_width_bits", info->memory_bus_width_bits);
  put("l2_cache_bytes", info->l2_cache_bytes);
  put("cc_major", info->cc_major);
  put("cc_minor", info->cc_minor);
  if (info->name) {
    PyObject* name = PyUnicode_DecodeUTF8(info->name->data(),
                                          static_cast<Py_ssize_t>(info->name->size()), "replace");
    if (name == nullptr) throw py::error_already_set();
    d["name"] = py::reinterpret_steal<py::str>(name);
  }
  if (info->total_memory_bytes) d["total_memory_bytes"] = *info->total_memory_bytes;
  if (info->uuid) d["uuid"] = *info->uuid;
  return d;
}

}  // namespace

void init_device(py::module_& m) {
  m.attr("CPU_DEVICE") = kCpuDevice;
  m.def("cuda_driver_loaded", &cuda_driver_loaded,
        "Whether libcuda.so.1 is mapped into the process (asking loads nothing); None where "
        "this cannot be asked. Without it no CUDA context exists.");
  m.def("driver_device_count", &driver_device_count, py::call_guard<py::gil_scoped_release>(),
        "Devices the CUDA driver reports (cuInit + cuDeviceGetCount, no context), or None "
        "when the driver cannot be reached (CPU-only build, no driver, cuInit failed).");
  m.def("primary_context_active", &primary_context_active, py::arg("device"),
        py::call_guard<py::gil_scoped_release>(),
        "Whether the primary context of CUDA device `device` exists (cuDevicePrimaryCtxGetState; "
        "creates none). False when libcuda is not loaded; None when the driver cannot be "
        "asked or has no such device.");
  m.def("current_context_foreign", &current_context_foreign,
        py::call_guard<py::gil_scoped_release>(),
        "The CUDA ordinal of the context current on this thread when it is not its device's "
        "primary context (one made with cuCtxCreate, e.g. by OpenMM), else None.");
  m.def("device_pci_bus_id", &device_pci_bus_id, py::arg("device"),
        py::call_guard<py::gil_scoped_release>(),
        "The PCI bus id of CUDA device `device` ('0000:65:00.0', cuDeviceGetPCIBusId), or "
        "None when unknown.");
  m.def("driver_device_info", &driver_info_dict, py::arg("device"),
        "The device as the driver describes it without a context: a dict with the keys it "
        "answered of multiprocessors, sm_clock_max_mhz, memory_clock_max_mhz, "
        "memory_bus_width_bits, l2_cache_bytes, cc_major, cc_minor, name, "
        "total_memory_bytes, uuid ('GPU-...'); None when the driver cannot be reached or "
        "has no such device.");
}

}  // namespace gpukeeper::py_bindings
