// PoolStats, orphaned pools, and MemoryPool's reads of a pool's books and history.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "memory_pool.hpp"

namespace gpukeeper::py_bindings {

void init_pool_stats(py::module_& m) {
  py::class_<PoolStats>(m, "PoolStats", "A snapshot of one pool's books (bytes and counts).")
      .def_readonly("allocated_bytes", &PoolStats::allocated_bytes)
      .def_readonly("allocated_count", &PoolStats::allocated_count)
      .def_readonly("requested_bytes", &PoolStats::requested_bytes)
      .def_readonly("reserved_bytes", &PoolStats::reserved_bytes)
      .def_readonly("segment_count", &PoolStats::segment_count)
      .def_readonly("cached_bytes", &PoolStats::cached_bytes)
      .def_readonly("peak_allocated_bytes", &PoolStats::peak_allocated_bytes)
      .def_readonly("peak_reserved_bytes", &PoolStats::peak_reserved_bytes)
      .def_readonly("largest_free_block", &PoolStats::largest_free_block)
      .def_readonly("limit_bytes", &PoolStats::limit_bytes)
      .def_readonly("cache_hits", &PoolStats::cache_hits)
      .def_readonly("cache_misses", &PoolStats::cache_misses)
      .def_readonly("upstream_allocations", &PoolStats::upstream_allocations)
      .def_readonly("upstream_frees", &PoolStats::upstream_frees)
      .def_readonly("oom_events", &PoolStats::oom_events)
      .def_readonly("callback_errors", &PoolStats::callback_errors)
      .def_readonly("pages_moved", &PoolStats::pages_moved)
      .def_property_readonly("fragmentation", &PoolStats::fragmentation,
                             "1 - largest free block / cached bytes.")
      .def("to_dict",
           [](const PoolStats& s) {
             py::dict d;
             d["allocated_bytes"] = s.allocated_bytes;
             d["allocated_count"] = s.allocated_count;
             d["requested_bytes"] = s.requested_bytes;
             d["reserved_bytes"] = s.reserved_bytes;
             d["segment_count"] = s.segment_count;
             d["cached_bytes"] = s.cached_bytes;
             d["peak_allocated_bytes"] = s.peak_allocated_bytes;
             d["peak_reserved_bytes"] = s.peak_reserved_bytes;
             d["largest_free_block"] = s.largest_free_block;
             d["limit_bytes"] = s.limit_bytes;
             d["cache_hits"] = s.cache_hits;
             d["cache_misses"] = s.cache_misses;
             d["upstream_allocations"] = s.upstream_allocations;
             d["upstream_frees"] = s.upstream_frees;
             d["oom_events"] = s.oom_events;
             d["callback_errors"] = s.callback_errors;
             d["pages_moved"] = s.pages_moved;
             d["fragmentation"] = s.fragmentation();
             return d;
           })
      .def("__getitem__",
           [](const PoolStats& s, const std::string& key) {
             py::object self = py::cast(s);
             if (!py::hasattr(self, key.c_str()) || key.rfind("_", 0) == 0) {
               throw py::key_error(key);
             }
             return self.attr(key.c_str());
           })
      .def("__repr__", [](const PoolStats& s) {
        return "PoolStats(allocated=" + std::to_string(s.allocated_bytes) +
               ", reserved=" + std::to_string(s.reserved_bytes) +
               ", segments=" + std::to_string(s.segment_count) +
               ", peak_allocated=" + std::to_string(s.peak_allocated_bytes) +
               ", hits=" + std::to_string(s.cache_hits) +
               ", misses=" + std::to_string(s.cache_misses) + ")";
      });

  // Pools that outlived their MemoryPool (pool_registry.hpp's orphaned_pools), as the
  // process's account reads them: kind, device, stats, peaks, and their cache released.
  py::class_<CachingPool, std::shared_ptr<CachingPool>>(m, "_OrphanPool")
      .def_property_readonly("kind",
                             [](const CachingPool& p) { return std::string(to_string(p.kind())); })
      .def_property_readonly("device", &CachingPool::device)
      .def("stats", &CachingPool::stats)
      .def("reset_peaks", &CachingPool::reset_peaks)
      .def("emergency_cleanup", [](CachingPool& p) {
        py::gil_scoped_release nogil;
        return p.emergency_cleanup();
      });
  m.def(
      "_orphaned_pools", [] { return orphaned_pools(); },
      "Pools whose MemoryPool is gone but whose blocks are still out (a buffer returned "
      "from a function that made its own pool).");
}

// Reading a pool: usage, stats and peaks.
void def_pool_usage(PoolClass& pool_class) {
  pool_class
      .def(
          "memory_usage",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            int id = to_device_id(device);
            if (id >= reg.device_count()) return py::none();
            auto pool = reg.find(id);
            if (!pool) return py::make_tuple(0, 0);
            PoolStats s = pool->stats();
            return py::make_tuple(s.allocated_bytes, s.peak_allocated_bytes);
          },
          py::arg("device_id"),
          "(allocated, peak allocated) bytes of the device's pool, or None for a device id "
          "that does not exist.")
      .def(
          "total_memory_usage",
          [](PoolRegistry& reg) {
            auto usage = reg.total_usage();
            return py::make_tuple(usage.first, usage.second);
          },
          "(allocated, peak allocated) bytes summed over every device's pool.")
      .def(
          "stats",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            auto pool = pool_if_valid(reg, device);
            if (!pool) return py::none();
            return py::cast(pool->stats());
          },
          py::arg("device_id"), "PoolStats of the device's pool, or None for an unknown id.")
      .def(
          "reset_peaks",
          [](PoolRegistry& reg, const py::handle& device) {
            if (auto pool = reg.find(to_device_id(device))) pool->reset_peaks();
          },
          py::arg("device_id"))
      .def(
          "devices",
          [](const PoolRegistry& reg) {
            std::vector<int> ids;
            for (const auto& p : reg.pools()) ids.push_back(p->device());
            return ids;
          },
          "Device ids whose pools exist.");
}

// Reading a pool: history, snapshot, validation.
void def_pool_history(PoolClass& pool_class) {
  pool_class
      .def(
          "history",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            int id = to_device_id(device);
            if (id >= reg.device_count()) return py::none();
            auto pool = reg.find(id);  // a pool not made yet has done nothing
            return py::cast(pool ? pool->history() : PoolHistory{});
          },
          py::arg("device_id"),
          "PoolHistory of the device's pool (PyTorch's memory_stats terms), or None for an "
          "unknown id.")
      .def(
          "reset_accumulated",
          [](PoolRegistry& reg, const py::handle& device) {
            if (auto pool = reg.find(to_device_id(device))) pool->reset_accumulated();
          },
          py::arg("device_id"), "Restarts the totals and event counts of history().")
      .def(
          "snapshot",
          [](PoolRegistry& reg, const py::handle& device) -> py::object {
            auto pool = reg.find(to_device_id(device));
            if (!pool) return py::list();
            return py::cast(pool->snapshot());
          },
          py::arg("device_id"),
          "The device pool's segments (SegmentSnapshot) with their blocks, in address order.")
      .def(
          "validate",
          [](PoolRegistry& reg, const py::handle& device) -> std::string {
            auto pool = reg.find(to_device_id(device));
            return pool ? pool->validate() : std::string();
          },
          py::arg("device_id"), "What is inconsistent in the pool's books; '' when all is well.")
      .def(
          "owns",
          [](PoolRegistry& reg, const py::handle& device, const py::handle& ptr) {
            auto pool = reg.find(to_device_id(device));
            return pool && pool->owns(reinterpret_cast<void*>(to_count(ptr, "pointer")));
          },
          py::arg("device_id"), py::arg("ptr"));
}

}  // namespace gpukeeper::py_bindings
