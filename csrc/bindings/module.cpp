// gpukeeper._core: the compiled half of the package. See bindings.hpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gpukeeper/device/runtime.hpp"

namespace py = pybind11;
using namespace gpukeeper;
using namespace gpukeeper::py_bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "gpukeeper's C++ core: memory pool, buffers, device queries.";
  init_errors(m);

  m.def(
      "build_info",
      []() {
        BuildInfo b = build_info();
        py::dict d;
        d["cuda"] = b.cuda;
        d["cuda_version"] = b.cuda ? py::object(py::str(b.cuda_version)) : py::object(py::none());
        d["static_cudart"] = b.static_cudart;
        d["compiler"] = b.compiler;
        d["cxx_standard"] = b.cxx_standard;
        d["build_type"] = b.build_type;
        d["pybind11_version"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                                std::to_string(PYBIND11_VERSION_MINOR) + "." +
                                std::to_string(PYBIND11_VERSION_PATCH);
        return d;
      },
      "How the core was built: CUDA or CPU-only, CUDA version, compiler.");

  m.def(
      "cuda_status",
      []() {
        CudaStatus s = cuda_status();
        py::dict d;
        d["available"] = s.available;
        d["device_count"] = s.device_count;
        d["driver_version"] = s.driver_version;
        d["runtime_version"] = s.runtime_version;
        d["reason"] = s.reason;
        return d;
      },
      "CUDA at run time: available, device count, driver/runtime versions, and why not.");

  m.def("cuda_device_count", &cuda_device_count, "Usable CUDA devices (0 without CUDA).");

  m.def(
      "device_memory_info",
      [](int device) {
        MemoryInfo info = device_memory_info(device);
        return py::make_tuple(info.free, info.total);
      },
      py::arg("device"), "(free, total) bytes of a CUDA device (cudaMemGetInfo).");

  m.def(
      "host_memory_info",
      []() {
        MemoryInfo info = host_memory_info();
        return py::make_tuple(info.free, info.total);
      },
      "(available, total) bytes of host memory.");

  init_pool_history(m);
  init_precision(m);
  init_pool_stats(m);
  init_memory_pool(m);
  init_buffer(m);
  init_torch_allocator(m);
  init_timing(m);
  init_device(m);
}
