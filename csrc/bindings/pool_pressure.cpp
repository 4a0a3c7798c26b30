// MemoryPool under memory pressure: cleanup, trim, the limit, watermark and reclaim callbacks.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "memory_pool.hpp"

namespace gpukeeper::py_bindings {

namespace {

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

// Watermark and reclaim callbacks.
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
            return pool && id <= static_cast<std::size_t>(INT_MAX) &&
                   pool->remove_watermark(static_cast<int>(id));
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
            return pool && id <= static_cast<std::size_t>(INT_MAX) &&
                   pool->remove_reclaim_callback(static_cast<int>(id));
          },
          py::arg("device_id"), py::arg("callback_id"));
}

}  // namespace gpukeeper::py_bindings
