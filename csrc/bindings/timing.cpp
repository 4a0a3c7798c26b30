// Timer, EventLog and the calibration kernels for Python (see csrc/gpukeeper/timing/ and
// kernels/calibration.hpp). Calls that wait for the GPU release the GIL. One Python
// thread at a time per Timer / EventLog object.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/event_log.hpp"
#include "gpukeeper/timing/event_pool.hpp"
#include "gpukeeper/timing/timer.hpp"

namespace gpukeeper::py_bindings {

namespace {

std::uint64_t to_duration_ns(const py::handle& obj) {
  return static_cast<std::uint64_t>(to_count(obj, "duration_ns"));
}

int to_timing_device(const py::handle& obj) {
  if (obj.is_none()) return 0;
  if (PyBool_Check(obj.ptr()) || !PyLong_Check(obj.ptr())) {
    throw InvalidInputError("device must be an int (-1 for CPU timing), got " +
                            std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  long long value = 0;
  try {
    value = obj.cast<long long>();
  } catch (const py::cast_error&) {
    throw InvalidInputError("device id out of range");
  }
  if (value < -1 || value > 1 << 20) {
    throw InvalidInputError("device must be -1 (CPU) or a CUDA device id, got " +
                            std::to_string(value));
  }
  return static_cast<int>(value);
}

}  // namespace

void init_timing(py::module_& m) {
  py::class_<Timer>(m, "Timer",
                    "An interval timer on a CUDA stream (pooled events), or on the steady clock "
                    "for device -1 / without a usable GPU. start() and stop() never wait; "
                    "elapsed_ms() waits for the stop event only.")
      .def(py::init([](const py::handle& device, const py::handle& stream) {
             return Timer(to_timing_device(device), to_stream(stream));
           }),
           py::arg("device") = 0, py::arg("stream") = 0)
      .def("start", &Timer::start, "Records the start (restarts a used timer).")
      .def("stop", &Timer::stop, "Records the stop.")
      .def("elapsed_ms", &Timer::elapsed_ms, py::call_guard<py::gil_scoped_release>(),
           "Milliseconds from start to stop; waits for the stop event (GIL released).")
      .def("ready", &Timer::ready, "Whether elapsed_ms() would return without waiting.")
      .def_property_readonly("is_gpu", &Timer::is_gpu)
      .def_property_readonly("device", &Timer::device, "-1 in CPU mode.")
      .def_property_readonly("stream", &Timer::stream)
      .def("__repr__", [](const Timer& t) {
        return std::string("<gpukeeper._core.Timer ") +
               (t.is_gpu() ? "cuda:" + std::to_string(t.device()) +
                                 " stream=" + std::to_string(t.stream())
                           : std::string("cpu")) +
               ">";
      });

  py::class_<EventLog>(m, "EventLog",
                       "Many intervals on one stream, recorded without host synchronization and "
                       "resolved later. mark(label) ends the lap since the previous mark (the "
                       "first mark only sets the origin); begin(label)/end() make nestable "
                       "intervals; resolve() -> [(label, ms)] in the order they ended.")
      .def(py::init([](const py::handle& device, const py::handle& stream) {
             return EventLog(to_timing_device(device), to_stream(stream));
           }),
           py::arg("device") = 0, py::arg("stream") = 0)
      .def("mark", &EventLog::mark, py::arg("label"))
      .def("begin", &EventLog::begin, py::arg("label"))
      .def("end", &EventLog::end)
      .def(
          "resolve",
          [](EventLog& log) {
            std::vector<TimedInterval> got;
            {
              py::gil_scoped_release nogil;
              got = log.resolve();
            }
            py::list out(got.size());
            for (std::size_t i = 0; i < got.size(); ++i) {
              out[i] = py::make_tuple(std::move(got[i].label), got[i].gpu_ms);
            }
            return out;
          },
          "[(label, ms)] of the intervals completed since the last resolve; waits for the "
          "last event (GIL released). The last mark stays the origin of the next lap.")
      .def("ready", &EventLog::ready)
      .def("clear", &EventLog::clear)
      .def_property_readonly("pending", &EventLog::pending)
      .def_property_readonly("open", &EventLog::open)
      .def_property_readonly("is_gpu", &EventLog::is_gpu)
      .def_property_readonly("device", &EventLog::device)
      .def_property_readonly("stream", &EventLog::stream)
      .def("__len__", &EventLog::pending);

  m.def(
      "event_pool_stats",
      [](int device) {
        EventPool& pool = EventPool::for_device(device);
        py::dict d;
        d["created"] = pool.created();
        d["idle"] = pool.idle();
        return d;
      },
      py::arg("device") = 0,
      "{'created', 'idle'} events of a device's event pool (GpuError without CUDA).");

  m.def("calibration_kernels_available", &calibration_kernels_available,
        "Whether this build has the calibration kernels (nvcc was found at build time).");

  m.def(
      "spin_kernel",
      [](const py::handle& duration_ns, const py::handle& stream) {
        launch_spin_kernel(to_duration_ns(duration_ns), to_stream(stream));
      },
      py::arg("duration_ns"), py::arg("stream") = 0,
      "Queues a kernel that spins for duration_ns by %globaltimer on stream (current "
      "device); does not wait. DeviceError without the kernels.");

  m.def(
      "calibrate",
      [](const py::handle& duration_ns, const py::handle& stream, const py::handle& device) {
        std::uint64_t ns = to_duration_ns(duration_ns);
        stream_t s = to_stream(stream);
        int dev = to_timing_device(device);
        Calibration c;
        {
          py::gil_scoped_release nogil;
          c = calibrate(ns, dev, s);
        }
        py::dict d;
        d["requested_ns"] = c.requested_ns;
        d["kernel_ns"] = c.kernel_ns;
        d["event_ms"] = c.event_ms;
        return d;
      },
      py::arg("duration_ns"), py::arg("stream") = 0, py::arg("device") = 0,
      "Times one spin kernel with a Timer: {'requested_ns', 'kernel_ns' (from %globaltimer), "
      "'event_ms'}. Waits (GIL released). DeviceError without kernels or a GPU.");
}

}  // namespace gpukeeper::py_bindings
