// Alloc+free pair latency, side by side in one run:
//
//   gpukeeper CachingPool over the host upstream (runs anywhere)
//   gpukeeper CachingPool over the device upstream          (CUDA)
//   gpukeeper ManagedBuffer (RAII) over the same device pool (CUDA; host pool without)
//   cudaMalloc + cudaFree                                    (CUDA)
//   cudaMallocAsync + cudaFreeAsync on a created stream, default mempool with
//     cudaMemPoolAttrReleaseThreshold = UINT64_MAX (so it caches)  (CUDA)
//   malloc + free (host reference)
//
// for 256 B, 64 KiB, 1 MiB and 64 MiB, then a single-threaded "mixed sizes" loop
// (64 live slots; each step frees a random slot and refills it with a log-uniform size
// in [256 B, 16 MiB]). Method: warm up (which also estimates the cost of one pair), then
// B batches of P pairs, each batch timed with std::chrono::steady_clock; reported are
// the median, p10 and p90 across batches of the mean ns per pair. P is 1000 unless the
// per-row time budget would be exceeded (slow rows such as cudaMalloc at 64 MiB get
// fewer pairs per batch, and if need be fewer batches, never below --min-batches).
//
// Only the CUDA runtime API is used (host compiler, no kernels). Without a usable CUDA
// device only the host rows run, and the output says so.
//
//   alloc_pair_bench [--json PATH] [--batches N] [--pairs N] [--budget-ms MS] [--quick]
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pair_timing.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/managed_buffer.hpp"
#include "gpukeeper/memory/resource.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace gkbench;

namespace {

const Size kSizes[] = {{256, "256B"}, {64 << 10, "64KiB"}, {1 << 20, "1MiB"}, {64 << 20, "64MiB"}};


JsonObject stats_json(const gpukeeper::PoolStats& s) {
  JsonObject o;
  o.integer("allocated_bytes", s.allocated_bytes);
  o.integer("reserved_bytes", s.reserved_bytes);
  o.integer("segment_count", s.segment_count);
  o.integer("peak_allocated_bytes", s.peak_allocated_bytes);
  o.integer("peak_reserved_bytes", s.peak_reserved_bytes);
  o.integer("cache_hits", s.cache_hits);
  o.integer("cache_misses", s.cache_misses);
  o.integer("upstream_allocations", s.upstream_allocations);
  o.integer("upstream_frees", s.upstream_frees);
  return o;
}

void usage() {
  std::puts(
      "usage: alloc_pair_bench [--json PATH] [--batches N] [--pairs N] [--budget-ms MS]\n"
      "                        [--quick] [--no-host-reference]\n"
      "  --json PATH     write the results as JSON\n"
      "  --batches N     timed batches per row (default 101)\n"
      "  --pairs N       alloc+free pairs per batch at most (default 1000)\n"
      "  --budget-ms MS  rough time per row; slow rows get fewer pairs (default 1500)\n"
      "  --quick         21 batches, 200 ms per row (a smoke test)");
}

}  // namespace

int main(int argc, char** argv) {
  Plan plan;
  std::string json_path;
  bool host_reference = true;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    std::string arg = argv[i];
    if (take_arg(argc, argv, &i, "--json", &v)) {
      json_path = v;
    } else if (take_plan_arg(argc, argv, &i, &plan)) {
      continue;
    } else if (arg == "--no-host-reference") {
      host_reference = false;
    } else if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }

  std::printf("gpukeeper alloc+free pair latency\n%s", environment_line().c_str());
  const gpukeeper::CudaStatus cuda = gpukeeper::cuda_status();
  const bool have_cuda = cuda.available;
  std::string note;
  if (!have_cuda) {
    note = "CUDA unavailable (" + cuda.reason +
           "): only the host rows ran (gpukeeper pool over host memory, malloc/free)";
    std::printf("NOTE: %s\n", note.c_str());
  }

  std::vector<Row> rows;
  std::vector<Row> mixed_rows;
  JsonObject pool_stats_json;
  auto fail_row = [](Row& row, const std::exception& e) {
    row.error = e.what();
    std::fprintf(stderr, "  %s %s failed: %s\n", row.allocator.c_str(), row.workload.c_str(),
                 e.what());
  };

  // ------------------------------------------------------------- upstream set-up
  std::shared_ptr<gpukeeper::CachingPool> host_pool, device_pool;
  try {
    host_pool = std::make_shared<gpukeeper::CachingPool>(
        gpukeeper::make_resource(gpukeeper::ResourceKind::host, 0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host pool: %s\n", e.what());
    return 1;
  }
  gpukeeper::stream_t gk_stream = 0;
#ifdef GPUKEEPER_WITH_CUDA
  cudaStream_t stream = nullptr;
  cudaMemPool_t mempool = nullptr;
  std::uint64_t old_threshold = 0;
  if (have_cuda) {
    try {
      check(cudaSetDevice(0), "cudaSetDevice");
      check(cudaFree(nullptr), "cudaFree(0) (context creation)");
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      check(cudaDeviceGetDefaultMemPool(&mempool, 0), "cudaDeviceGetDefaultMemPool");
      check(cudaMemPoolGetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &old_threshold),
            "cudaMemPoolGetAttribute");
      std::uint64_t threshold = UINT64_MAX;
      check(cudaMemPoolSetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &threshold),
            "cudaMemPoolSetAttribute(ReleaseThreshold)");
      gk_stream = reinterpret_cast<gpukeeper::stream_t>(stream);
      device_pool = std::make_shared<gpukeeper::CachingPool>(
          gpukeeper::make_resource(gpukeeper::ResourceKind::device, 0));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "CUDA set-up failed: %s\n", e.what());
      return 1;
    }
  }
#endif
  auto nothing = [] {};

  // The pools measured: fixed segments, and expandable ones where the core has them.
  struct NamedPool {
    std::string key, label;
    std::shared_ptr<gpukeeper::CachingPool> pool;
    gpukeeper::stream_t stream;
  };
  std::vector<NamedPool> pools_measured;
  pools_measured.push_back({"gpukeeper_pool_host", "gpukeeper pool, host upstream (C++)", host_pool, 0});
  auto add_expandable = [&](gpukeeper::ResourceKind kind, const char* key, const char* label,
                            gpukeeper::stream_t s) {
    try {
      auto pool = std::make_shared<gpukeeper::CachingPool>(gpukeeper::make_resource(kind, 0),
                                                           pool_options(kExpandable));
      pools_measured.push_back({key, label, pool, s});
    } catch (const std::exception& e) {
      std::printf("NOTE: no %s: %s\n", label, e.what());
    }
  };
  add_expandable(gpukeeper::ResourceKind::host, "gpukeeper_pool_host_expandable",
                 "gpukeeper pool, host, expandable (C++)", 0);
  if (device_pool) {
    pools_measured.push_back({"gpukeeper_pool_device", "gpukeeper pool, device upstream (C++)",
                              device_pool, gk_stream});
    add_expandable(gpukeeper::ResourceKind::device, "gpukeeper_pool_device_expandable",
                   "gpukeeper pool, device, expandable (C++)", gk_stream);
  }

  // ------------------------------------------------------------- fixed sizes
  for (const Size& size : kSizes) {
    const std::size_t n = size.bytes;
    auto new_row = [&](const char* key, const std::string& label) {
      Row r;
      r.allocator = key;
      r.label = label;
      r.workload = size.key;
      r.size = n;
      return r;
    };
    for (const NamedPool& np : pools_measured) {
      Row r = new_row(np.key.c_str(), np.label);
      gpukeeper::CachingPool& pool = *np.pool;
      const gpukeeper::stream_t s = np.stream;
      try {
        measure(r, plan, [&] {
          void* p = pool.allocate(n, s);
          do_not_optimize(p);
          pool.deallocate(p);
        }, nothing);
      } catch (const std::exception& e) {
        fail_row(r, e);
      }
      rows.push_back(std::move(r));
    }
    {
      const bool dev = static_cast<bool>(device_pool);
      Row r = new_row(dev ? "gpukeeper_managed_buffer_device" : "gpukeeper_managed_buffer_host",
                      dev ? "gpukeeper ManagedBuffer, device (C++)"
                          : "gpukeeper ManagedBuffer, host (C++)");
      std::shared_ptr<gpukeeper::CachingPool> pool = dev ? device_pool : host_pool;
      const gpukeeper::stream_t s = dev ? gk_stream : 0;
      try {
        measure(r, plan, [&] {
          gpukeeper::ManagedBuffer buf(pool, n, s);
          do_not_optimize(buf.data());
        }, nothing);
      } catch (const std::exception& e) {
        fail_row(r, e);
      }
      rows.push_back(std::move(r));
    }
#ifdef GPUKEEPER_WITH_CUDA
    if (have_cuda) {
      Row r = new_row("cudaMalloc", "cudaMalloc + cudaFree");
      try {
        measure(r, plan, [&] {
          void* p = nullptr;
          check(cudaMalloc(&p, n), "cudaMalloc");
          do_not_optimize(p);
          check(cudaFree(p), "cudaFree");
        }, nothing);
      } catch (const std::exception& e) {
        fail_row(r, e);
      }
      rows.push_back(std::move(r));

      Row a = new_row("cudaMallocAsync", "cudaMallocAsync + cudaFreeAsync (threshold max)");
      try {
        measure(a, plan, [&] {
          void* p = nullptr;
          check(cudaMallocAsync(&p, n, stream), "cudaMallocAsync");
          do_not_optimize(p);
          check(cudaFreeAsync(p, stream), "cudaFreeAsync");
        }, [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); });
      } catch (const std::exception& e) {
        fail_row(a, e);
      }
      rows.push_back(std::move(a));
    }
#endif
    if (host_reference) {
      Row r = new_row("malloc", "malloc + free (host reference)");
      try {
        measure(r, plan, [&] {
          void* p = std::malloc(n);
          do_not_optimize(p);
          std::free(p);
        }, nothing);
      } catch (const std::exception& e) {
        fail_row(r, e);
      }
      rows.push_back(std::move(r));
    }
  }

  // ------------------------------------------------------------- mixed sizes
  const MixedWorkload mixed(12345);
  auto new_mixed = [&](const char* key, const std::string& label) {
    Row r;
    r.allocator = key;
    r.label = label;
    r.workload = "mixed";
    return r;
  };
  for (const NamedPool& np : pools_measured) {
    Row r = new_mixed(np.key.c_str(), np.label);
    gpukeeper::CachingPool& pool = *np.pool;
    const gpukeeper::stream_t s = np.stream;
    try {
      measure_mixed(r, plan, mixed, [&](std::size_t n) { return pool.allocate(n, s); },
                    [&](void* p, std::size_t) { pool.deallocate(p); }, nothing);
    } catch (const std::exception& e) {
      fail_row(r, e);
    }
    mixed_rows.push_back(std::move(r));
  }
#ifdef GPUKEEPER_WITH_CUDA
  if (have_cuda) {
    Row r = new_mixed("cudaMalloc", "cudaMalloc + cudaFree");
    try {
      measure_mixed(r, plan, mixed,
                    [&](std::size_t n) {
                      void* p = nullptr;
                      check(cudaMalloc(&p, n), "cudaMalloc");
                      return p;
                    },
                    [&](void* p, std::size_t) { check(cudaFree(p), "cudaFree"); }, nothing);
    } catch (const std::exception& e) {
      fail_row(r, e);
    }
    mixed_rows.push_back(std::move(r));

    Row a = new_mixed("cudaMallocAsync", "cudaMallocAsync + cudaFreeAsync (threshold max)");
    try {
      measure_mixed(a, plan, mixed,
                    [&](std::size_t n) {
                      void* p = nullptr;
                      check(cudaMallocAsync(&p, n, stream), "cudaMallocAsync");
                      return p;
                    },
                    [&](void* p, std::size_t) { check(cudaFreeAsync(p, stream), "cudaFreeAsync"); },
                    [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); });
    } catch (const std::exception& e) {
      fail_row(a, e);
    }
    mixed_rows.push_back(std::move(a));
  }
#endif
  if (host_reference) {
    Row r = new_mixed("malloc", "malloc + free (host reference)");
    try {
      measure_mixed(r, plan, mixed, [&](std::size_t n) { return std::malloc(n); },
                    [&](void* p, std::size_t) { std::free(p); }, nothing);
    } catch (const std::exception& e) {
      fail_row(r, e);
    }
    mixed_rows.push_back(std::move(r));
  }

  // ------------------------------------------------------------- pool books
  JsonObject pools;
  for (const NamedPool& np : pools_measured) {
    std::string problems = np.pool->validate();
    if (!problems.empty()) {
      std::fprintf(stderr, "%s: books inconsistent: %s\n", np.key.c_str(), problems.c_str());
    }
    pools.raw(np.key, stats_json(np.pool->stats()).boolean("books_consistent", problems.empty()).dump(2));
  }

  // ------------------------------------------------------------- table
  auto find = [&](const std::vector<Row>& rs, const std::string& alloc, const std::string& wl) -> const Row* {
    for (const Row& r : rs) {
      if (r.allocator == alloc && r.workload == wl && r.error.empty()) return &r;
    }
    return nullptr;
  };
  const char* ref_key = have_cuda ? "cudaMallocAsync" : "malloc";
  auto print_table = [&](const std::vector<Row>& rs, const char* title) {
    std::printf("\n%s (ns per alloc+free pair; median, p10, p90 across batches)\n", title);
    std::printf("%-8s %-50s %10s %10s %10s %13s %10s\n", "size", "allocator", "median", "p10",
                "p90", "pairs x bat", have_cuda ? "vs async" : "vs malloc");
    std::string last;
    for (const Row& r : rs) {
      if (r.workload != last && !last.empty()) std::printf("\n");
      last = r.workload;
      if (!r.error.empty()) {
        std::printf("%-8s %-50s   FAILED: %s\n", r.workload.c_str(), r.label.c_str(), r.error.c_str());
        continue;
      }
      std::string speed = "-";
      const Row* ref = find(rs, ref_key, r.workload);
      if (ref && r.allocator != ref_key && r.summary.median > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1fx", ref->summary.median / r.summary.median);
        speed = buf;
      }
      char pb[32];
      std::snprintf(pb, sizeof pb, "%zu x %zu", r.pairs_per_batch, r.batches);
      std::printf("%-8s %-50s %10s %10s %10s %13s %10s\n", r.workload.c_str(), r.label.c_str(),
                  fmt_ns(r.summary.median).c_str(), fmt_ns(r.summary.p10).c_str(),
                  fmt_ns(r.summary.p90).c_str(), pb, speed.c_str());
    }
  };
  print_table(rows, "Fixed sizes");
  char mixed_title[160];
  std::snprintf(mixed_title, sizeof mixed_title,
                "Mixed sizes (%zu live slots, log-uniform 256 B..16 MiB, mean %.0f KiB; one free + one alloc per pair)",
                MixedWorkload::kSlots, mixed.mean_size() / 1024.0);
  print_table(mixed_rows, mixed_title);

  // ------------------------------------------------------------- targets
  // Targets: C++ pair <= 50 ns median on cached sizes, and >= 10x faster than cudaMallocAsync.
  std::vector<std::string> target_json;
  bool all_met = true;
  bool any_checked = false;
  std::printf("\nTargets: pool pair <= 50 ns median, >= 10x faster than cudaMallocAsync\n");
  std::vector<std::string> target_pools = {have_cuda ? "gpukeeper_pool_device" : "gpukeeper_pool_host"};
  {
    target_pools.push_back(have_cuda ? "gpukeeper_pool_device_expandable"
                                     : "gpukeeper_pool_host_expandable");
  }
  for (const std::string& target_pool : target_pools)
  for (const Size& size : kSizes) {
    const Row* pool = find(rows, target_pool, size.key);
    const Row* async = find(rows, "cudaMallocAsync", size.key);
    if (!pool) continue;
    JsonObject t;
    t.str("size", size.key);
    t.str("pool_row", pool->allocator);
    t.num("pool_median_ns", pool->summary.median);
    bool lat_ok = pool->summary.median <= 50.0;
    t.boolean("latency_target_met", lat_ok);
    std::string verdict = std::string(lat_ok ? "met" : "MISSED") + " (" + fmt_ns(pool->summary.median) + " ns)";
    bool ok = lat_ok;
    if (async) {
      double speedup = async->summary.median / pool->summary.median;
      bool sp_ok = speedup >= 10.0;
      t.num("speedup_vs_cudaMallocAsync", speedup);
      t.boolean("speedup_target_met", sp_ok);
      ok = ok && sp_ok;
      char buf[64];
      std::snprintf(buf, sizeof buf, "; %.1fx vs cudaMallocAsync: %s", speedup, sp_ok ? "met" : "MISSED");
      verdict += buf;
    } else {
      t.raw("speedup_vs_cudaMallocAsync", "null");
      verdict += "; speed-up vs cudaMallocAsync not measured (no CUDA)";
    }
    any_checked = true;
    all_met = all_met && ok;
    std::printf("  %-34s %-6s %s\n", target_pool.c_str(), size.key, verdict.c_str());
    target_json.push_back(t.dump(4));
  }
  if (any_checked) {
    std::printf("  => %s%s\n", all_met ? "all met" : "some MISSED",
                have_cuda ? "" : " (host pool only: the device targets need a GPU run)");
  }

  // ------------------------------------------------------------- JSON
  if (!json_path.empty()) {
    JsonObject config = plan_json(plan);
    config.integer("mixed_slots", MixedWorkload::kSlots);
    config.str("mixed_sizes", "log-uniform 256 B .. 16 MiB, multiples of 4");
    config.num("mixed_mean_bytes", mixed.mean_size());
    config.str("cudaMallocAsync_setup",
               "created non-blocking stream; default mempool, cudaMemPoolAttrReleaseThreshold=UINT64_MAX; stream synchronized (untimed) after each batch");
    config.str("pool_stream", have_cuda ? "the same created stream" : "0");

    JsonObject root;
    root.str("benchmark", "alloc_pair");
    root.raw("environment", environment_json().dump(2));
    root.raw("config", config.dump(2));
    root.boolean("host_only", !have_cuda);
    root.str("note", note);
    root.raw("results", json_array(rows_json(rows), 2));
    root.raw("mixed", json_array(rows_json(mixed_rows), 2));
    root.raw("pool_stats", pools.dump(2));
    root.raw("targets", json_array(target_json, 2));
    root.boolean("targets_met", any_checked && all_met && have_cuda);
    if (!write_json_report(json_path, root.dump())) return 1;
  }

  // ------------------------------------------------------------- tear-down
  pools_measured.clear();
  host_pool.reset();
  device_pool.reset();
#ifdef GPUKEEPER_WITH_CUDA
  if (have_cuda) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaMemPoolTrimTo(mempool, 0);
    (void)cudaMemPoolSetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &old_threshold);
    (void)cudaStreamDestroy(stream);
  }
#endif
  for (const Row& r : rows) {
    if (!r.error.empty()) return 1;
  }
  for (const Row& r : mixed_rows) {
    if (!r.error.empty()) return 1;
  }
  return 0;
}
