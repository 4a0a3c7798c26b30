// PoolHistory and the segment snapshot for Python: plain read-only records, converted to
// PyTorch's formats (memory_stats, memory_snapshot) by gpukeeper.integrations.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gpukeeper/memory/pool_history.hpp"

namespace gpukeeper::py_bindings {

namespace {

py::dict counter_dict(const StatCounter& c) {
  py::dict d;
  d["current"] = c.current;
  d["peak"] = c.peak;
  d["allocated"] = c.allocated;
  d["freed"] = c.freed;
  return d;
}

py::dict family_dict(const StatFamily& f) {
  py::dict d;
  d["all"] = counter_dict(f.all);
  d["large_pool"] = counter_dict(f.large);
  d["small_pool"] = counter_dict(f.small);
  return d;
}

// One call instead of ~100 attribute reads: memory_stats() runs every step in some loops.
py::dict history_dict(const PoolHistory& h) {
  py::dict d;
  d["allocated_bytes"] = family_dict(h.allocated_bytes);
  d["allocations"] = family_dict(h.allocations);
  d["requested_bytes"] = family_dict(h.requested_bytes);
  d["reserved_bytes"] = family_dict(h.reserved_bytes);
  d["segments"] = family_dict(h.segments);
  d["inactive_split_bytes"] = family_dict(h.inactive_split_bytes);
  d["inactive_splits"] = family_dict(h.inactive_splits);
  d["alloc_retries"] = h.alloc_retries;
  d["ooms"] = h.ooms;
  d["limit_rejections"] = h.limit_rejections;
  d["device_allocs"] = h.device_allocs;
  d["device_frees"] = h.device_frees;
  d["device_syncs"] = h.device_syncs;
  return d;
}

}  // namespace

void init_pool_history(py::module_& m) {
  py::class_<StatCounter>(m, "StatCounter",
                          "One quantity: current value, peak, and total increase/decrease.")
      .def_readonly("current", &StatCounter::current)
      .def_readonly("peak", &StatCounter::peak)
      .def_readonly("allocated", &StatCounter::allocated)
      .def_readonly("freed", &StatCounter::freed)
      .def("__repr__", [](const StatCounter& c) {
        return "StatCounter(current=" + std::to_string(c.current) +
               ", peak=" + std::to_string(c.peak) + ", allocated=" + std::to_string(c.allocated) +
               ", freed=" + std::to_string(c.freed) + ")";
      });
  py::class_<StatFamily>(m, "StatFamily", "A quantity in all and per size class.")
      .def_readonly("all", &StatFamily::all)
      .def_readonly("small", &StatFamily::small)
      .def_readonly("large", &StatFamily::large);
  py::class_<PoolHistory>(m, "PoolHistory",
                          "What a pool has done, in PyTorch's memory_stats terms.")
      .def_readonly("allocated_bytes", &PoolHistory::allocated_bytes)
      .def_readonly("allocations", &PoolHistory::allocations)
      .def_readonly("requested_bytes", &PoolHistory::requested_bytes)
      .def_readonly("reserved_bytes", &PoolHistory::reserved_bytes)
      .def_readonly("segments", &PoolHistory::segments)
      .def_readonly("inactive_split_bytes", &PoolHistory::inactive_split_bytes)
      .def_readonly("inactive_splits", &PoolHistory::inactive_splits)
      .def_readonly("alloc_retries", &PoolHistory::alloc_retries)
      .def_readonly("ooms", &PoolHistory::ooms)
      .def_readonly("limit_rejections", &PoolHistory::limit_rejections)
      .def_readonly("device_allocs", &PoolHistory::device_allocs)
      .def_readonly("device_frees", &PoolHistory::device_frees)
      .def_readonly("device_syncs", &PoolHistory::device_syncs)
      .def("to_dict", &history_dict,
           "Every figure as nested dicts: family -> all/large_pool/small_pool -> "
           "current/peak/allocated/freed, plus the event counts.");
  py::class_<BlockSnapshot>(m, "BlockSnapshot", "One block of a segment.")
      .def_readonly("address", &BlockSnapshot::address)
      .def_readonly("size", &BlockSnapshot::size)
      .def_readonly("requested", &BlockSnapshot::requested)
      .def_readonly("allocated", &BlockSnapshot::allocated);
  py::class_<SegmentSnapshot>(m, "SegmentSnapshot", "One segment with its blocks in address order.")
      .def_readonly("address", &SegmentSnapshot::address)
      .def_readonly("size", &SegmentSnapshot::size)
      .def_readonly("mapped_bytes", &SegmentSnapshot::mapped_bytes)
      .def_readonly("stream", &SegmentSnapshot::stream)
      .def_readonly("small", &SegmentSnapshot::small)
      .def_readonly("expandable", &SegmentSnapshot::expandable)
      .def_readonly("blocks", &SegmentSnapshot::blocks);
}

}  // namespace gpukeeper::py_bindings
