// Timer, EventLog and the calibration kernels for Python (see csrc/gpukeeper/timing/ and
// kernels/calibration.hpp). Calls that wait for the GPU release the GIL. One Python
// thread at a time per Timer / EventLog object.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/event_log.hpp"
#include "gpukeeper/timing/event_pool.hpp"
#include "gpukeeper/timing/launch_floor.hpp"
#include "gpukeeper/timing/stream_gate.hpp"
#include "gpukeeper/timing/timer.hpp"
#include "gpukeeper/timing/timer_calibration.hpp"

namespace gpukeeper::py_bindings {

namespace {

std::uint64_t to_duration_ns(const py::handle& obj) {
  return static_cast<std::uint64_t>(to_count(obj, "duration_ns"));
}

int to_timing_device(const py::handle& obj) {
  if (obj.is_none()) return 0;
  if (PyBool_Check(obj.ptr()) || !PyLong_Check(obj.ptr())) {
    throw InvalidInputError("device must be an int (" + std::to_string(kCpuDevice) +
                            " for CPU timing), got " +
                            std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  long long value = 0;
  try {
    value = obj.cast<long long>();
  } catch (const py::cast_error&) {
    throw InvalidInputError("device id out of range");
  }
  if (value < kCpuDevice || value > 1 << 20) {
    throw InvalidInputError("device must be " + std::to_string(kCpuDevice) +
                            " (CPU) or a CUDA device id, got " + std::to_string(value));
  }
  return static_cast<int>(value);
}

// A gate timeout in milliseconds (a positive finite number) as nanoseconds.
std::uint64_t to_timeout_ns(const py::handle& obj) {
  if (PyBool_Check(obj.ptr()) || !(PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr()))) {
    throw InvalidInputError("timeout_ms must be a number of milliseconds");
  }
  double ms = obj.cast<double>();
  if (!(ms > 0.0) || ms > 3.6e6) {  // also rejects NaN; an hour is the most that is useful
    throw InvalidInputError("timeout_ms must be > 0 and at most 3 600 000 (one hour), got " +
                            std::string(py::str(obj)));
  }
  return static_cast<std::uint64_t>(ms * 1e6);
}

const char* outcome_name(GateOutcome o) {
  switch (o) {
    case GateOutcome::opened:
      return "opened";
    case GateOutcome::timed_out:
      return "timed_out";
    default:
      return "pending";
  }
}

int to_cuda_device(const py::handle& obj) {
  int device = to_timing_device(obj);
  if (device < 0) throw InvalidInputError("a CUDA device id (>= 0) is needed here");
  return device;
}

// One event from the device's EventPool, handed back when the Python object goes.
class PyEvent {
 public:
  explicit PyEvent(int device) : device_(device), event_(EventPool::for_device(device)) {}

  void record(stream_t stream) {
    detail::record_event(event_.get(), device_, stream);
    recorded_ = true;
  }
  bool query() const { return !recorded_ || detail::event_done(event_.get(), device_); }
  void synchronize() const {
    if (recorded_) detail::synchronize_event(event_.get(), device_);
  }
  double elapsed_ms(const PyEvent& end) const {
    if (!recorded_ || !end.recorded_) {
      throw InvalidInputError("elapsed_ms needs both events recorded");
    }
    if (end.device_ != device_) {
      throw InvalidInputError("elapsed_ms needs two events of the same device");
    }
    end.synchronize();
    return detail::event_elapsed_ms(event_.get(), end.event_.get());
  }
  int device() const noexcept { return device_; }
  bool recorded() const noexcept { return recorded_; }

 private:
  int device_;
  PooledEvent event_;
  bool recorded_ = false;
};

void init_timer(py::module_& m) {
  py::class_<Timer>(m, "Timer",
                    "An interval timer on a CUDA stream (pooled events), or on the steady clock "
                    "for device -1 / without a usable GPU. start() and stop() never wait; "
                    "elapsed_ms() waits for the stop event only.")
      .def(py::init([](const py::handle& device, const py::handle& stream,
                       bool hide_launch_latency, const py::handle& gate_timeout_ms) {
             return Timer(to_timing_device(device), to_stream(stream), hide_launch_latency,
                          to_timeout_ns(gate_timeout_ms));
           }),
           py::arg("device") = 0, py::arg("stream") = 0, py::kw_only(),
           py::arg("hide_launch_latency") = false, py::arg("gate_timeout_ms") = 1000.0)
      .def("start", &Timer::start,
           "Records the start (restarts a used timer); with hide_launch_latency, closes a "
           "StreamGate first.")
      .def("stop", &Timer::stop, "Records the stop (and opens the gate).")
      .def("launch_hidden", &Timer::launch_hidden, py::call_guard<py::gil_scoped_release>(),
           "Whether the last measurement's gate opened before its timeout (waits for the "
           "stop event).")
      .def_property_readonly("hides_launch_latency", &Timer::hides_launch_latency)
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

}

void init_event_log(py::module_& m) {
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

}

void init_stream_gate(py::module_& m) {
  py::class_<StreamGate>(m, "StreamGate",
                         "Holds a CUDA stream: the gate kernel is queued at construction, and "
                         "work queued after it waits on the device until open() (or the timeout). "
                         "Used as a context manager it opens on exit; it also opens when the "
                         "object goes away.")
      .def(py::init([](const py::handle& stream, const py::handle& device,
                       const py::handle& timeout_ms) {
             return StreamGate(to_cuda_device(device), to_stream(stream),
                               to_timeout_ns(timeout_ms));
           }),
           py::arg("stream") = 0, py::arg("device") = 0, py::arg("timeout_ms") = 1000.0)
      .def("queue_floor_kernel", &StreamGate::queue_floor_kernel,
           "Queues the zero-length calibration kernel behind the closed gate: an event "
           "recorded before it and one after read the launch floor in place (the device's "
           "own cost of a bracket, on this stream, just before the measured work). "
           "InvalidInputError once the gate is open.")
      .def("open", &StreamGate::open, "Lets the queued work through (idempotent).")
      .def_property_readonly(
          "outcome", [](const StreamGate& g) { return outcome_name(g.outcome()); },
          "'pending' until the gate kernel finished, then 'opened' or 'timed_out'.")
      .def_property_readonly("is_open", &StreamGate::is_open)
      .def_property_readonly("device", &StreamGate::device)
      .def_property_readonly("stream", &StreamGate::stream)
      .def_property_readonly("timeout_ms",
                             [](const StreamGate& g) { return g.timeout_ns() / 1e6; })
      .def("__enter__", [](StreamGate& g) -> StreamGate& { return g; },
           py::return_value_policy::reference)
      .def("__exit__", [](StreamGate& g, const py::args&) { g.open(); })
      .def("__repr__", [](const StreamGate& g) {
        return "<gpukeeper._core.StreamGate cuda:" + std::to_string(g.device()) +
               " stream=" + std::to_string(g.stream()) + " " +
               (g.is_open() ? std::string(outcome_name(g.outcome())) : std::string("closed")) +
               ">";
      });

  m.def(
      "synchronize",
      [](const py::handle& device) {
        int dev = to_cuda_device(device);
        py::gil_scoped_release nogil;
        synchronize_device(dev);
      },
      py::arg("device") = 0,
      "Waits for all work on a CUDA device (GIL released); DeviceError without one.");

  m.def(
      "launch_floor_ms",
      [](const py::handle& device, bool refresh) {
        int dev = to_cuda_device(device);
        py::gil_scoped_release nogil;
        return launch_floor_ms(dev, refresh);
      },
      py::arg("device") = 0, py::arg("refresh") = false,
      "What a gated event pair reads around an empty kernel on this device (ms): the "
      "device's own cost of a measurement, measured once and cached. DeviceError without "
      "gates.");

  m.def("stream_gates_available", &stream_gates_available,
        "Whether StreamGate (and Timer(hide_launch_latency=True)) work here: a CUDA build "
        "with the gate kernel and a usable device.");

  m.def(
      "gate_slot_stats",
      [](const py::handle& device) {
        GateSlotStats st = gate_slot_stats(to_cuda_device(device));
        py::dict d;
        d["created"] = st.created;
        d["idle"] = st.idle;
        d["retiring"] = st.retiring;
        return d;
      },
      py::arg("device") = 0,
      "{'created', 'idle', 'retiring'} gate slots of a device (DeviceError without gates).");

}

// Single events, and the calibration kernels.
void init_events(py::module_& m) {
  py::class_<PyEvent>(m, "Event",
                      "A timing event from gpukeeper's per-device event pool (given back when "
                      "the object goes). record(stream) never waits; elapsed_ms(end) waits for "
                      "end (GIL released).")
      .def(py::init([](const py::handle& device) { return std::make_unique<PyEvent>(to_cuda_device(device)); }),
           py::arg("device") = 0)
      .def(
          "record",
          [](PyEvent& e, const py::handle& stream) { e.record(to_stream(stream)); },
          py::arg("stream") = 0, "Records the event on a stream (int handle, torch or CuPy stream).")
      .def("query", &PyEvent::query, "True when the device has passed the last record.")
      .def("synchronize", &PyEvent::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("elapsed_ms", &PyEvent::elapsed_ms, py::arg("end"),
           py::call_guard<py::gil_scoped_release>(),
           "Milliseconds from this event to `end`; waits for `end`.")
      .def_property_readonly("device", &PyEvent::device)
      .def_property_readonly("recorded", &PyEvent::recorded);

  m.def("calibration_kernels_available", &calibration_kernels_available,
        "Whether this build has the calibration kernels (it was built with CUDA).");

  m.def(
      "spin_kernel",
      [](const py::handle& duration_ns, const py::handle& stream, const py::handle& out) {
        std::uint64_t* device_out = nullptr;
        if (!out.is_none()) {
          std::size_t address = to_count(out, "out");
          if (address % alignof(std::uint64_t) != 0) {
            throw InvalidInputError("out must be an 8-byte aligned device address");
          }
          device_out = reinterpret_cast<std::uint64_t*>(address);
        }
        launch_spin_kernel(to_duration_ns(duration_ns), to_stream(stream), device_out);
      },
      py::arg("duration_ns"), py::arg("stream") = 0, py::arg("out") = py::none(),
      "Queues a kernel that spins for duration_ns by %globaltimer on stream (current "
      "device); does not wait. With out (the device address of two uint64), the kernel "
      "writes its first and last %globaltimer readings there (ns). DeviceError without the "
      "kernels.");

  m.def(
      "calibrate",
      [](const py::handle& duration_ns, const py::handle& stream, const py::handle& device,
         bool hide_launch_latency) {
        std::uint64_t ns = to_duration_ns(duration_ns);
        stream_t s = to_stream(stream);
        int dev = to_timing_device(device);
        Calibration c;
        {
          py::gil_scoped_release nogil;
          c = calibrate(ns, dev, s, hide_launch_latency);
        }
        py::dict d;
        d["requested_ns"] = c.requested_ns;
        d["kernel_ns"] = c.kernel_ns;
        d["event_ms"] = c.event_ms;
        d["launch_hidden"] = c.launch_hidden;
        return d;
      },
      py::arg("duration_ns"), py::arg("stream") = 0, py::arg("device") = 0, py::kw_only(),
      py::arg("hide_launch_latency") = false,
      "Times one spin kernel with a Timer: {'requested_ns', 'kernel_ns' (from %globaltimer), "
      "'event_ms', 'launch_hidden'}. Waits (GIL released). DeviceError without kernels or a "
      "GPU.");
}

}  // namespace

void init_timing(py::module_& m) {
  init_timer(m);
  init_event_log(m);
  init_stream_gate(m);
  init_events(m);
}

}  // namespace gpukeeper::py_bindings
