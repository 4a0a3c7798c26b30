// Alloc+free pair latency of gpukeeper's pool against RMM's, side by side in one run.
// Built only when CMake found RMM (-DGPUKEEPER_RMM_ROOT=..., see
// find_rmm.cmake). Rows:
//
//   gpukeeper CachingPool over the device upstream
//   rmm::mr::pool_memory_resource over rmm::mr::cuda_memory_resource
//   rmm::mr::cuda_async_memory_resource (its own cudaMemPool; RMM keeps it caching)
//   cudaMallocAsync + cudaFreeAsync (the device's default mempool, release threshold max)
//
// all on one created non-blocking stream, for 256 B, 4 KiB, 64 KiB, 1 MiB and 16 MiB,
// then alloc_pair_bench's mixed-sizes loop. Every row warms up before it is timed, so
// the timed pairs are served from each allocator's cache. The stream is synchronized,
// untimed, after every batch of every row (the stream-ordered allocators need it to
// reuse their memory; the others get it too so that all rows run alike). Timing and
// statistics are pair_timing.hpp's, the same as alloc_pair_bench's.
//
// Without a usable CUDA device nothing is measured: the program says so and exits 0.
//
//   rmm_pair_bench [--json PATH] [--batches N] [--pairs N] [--budget-ms MS] [--quick]
//                  [--rmm-initial-mib MIB]
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda/stream>
#include <cuda_runtime_api.h>
#include <rmm/aligned.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

#include "bench_common.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/resource.hpp"
#include "pair_timing.hpp"

using namespace gkbench;

namespace {

const Size kSizes[] = {{256, "256B"},        {4 << 10, "4KiB"}, {64 << 10, "64KiB"},
                       {1 << 20, "1MiB"},    {16 << 20, "16MiB"}};

// Row keys, in table order; the first is what the ratios divide by.
const char* const kGpukeeper = "gpukeeper_pool_device";
const char* const kRmmPool = "rmm_pool";
const char* const kRmmAsync = "rmm_cuda_async";
const char* const kMallocAsync = "cudaMallocAsync";

void usage() {
  std::puts(
      "usage: rmm_pair_bench [--json PATH] [--batches N] [--pairs N] [--budget-ms MS]\n"
      "                      [--quick] [--rmm-initial-mib MIB]\n"
      "  --json PATH            write the results as JSON\n"
      "  --batches N            timed batches per row (default 101)\n"
      "  --pairs N              alloc+free pairs per batch at most (default 1000)\n"
      "  --budget-ms MS         rough time per row; slow rows get fewer pairs (default 1500)\n"
      "  --quick                21 batches, 200 ms per row (a smoke test)\n"
      "  --rmm-initial-mib MIB  initial size of RMM's pool_memory_resource (default 1024)");
}

std::string ratio_text(const Row* num, const Row* den) {
  if (!num || !den || !(den->summary.median > 0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", num->summary.median / den->summary.median);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Plan plan;
  std::string json_path;
  std::size_t rmm_initial = std::size_t{1} << 30;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    std::string arg = argv[i];
    if (take_arg(argc, argv, &i, "--json", &v)) {
      json_path = v;
    } else if (take_plan_arg(argc, argv, &i, &plan)) {
      continue;
    } else if (take_arg(argc, argv, &i, "--rmm-initial-mib", &v)) {
      rmm_initial = static_cast<std::size_t>(parse_u64(v, "--rmm-initial-mib")) << 20;
    } else if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }

  std::printf("gpukeeper vs RMM %s: alloc+free pair latency\n%s", RMM_VERSION,
              environment_line().c_str());
  const gpukeeper::CudaStatus cuda = gpukeeper::cuda_status();
  JsonObject config = plan_json(plan);
  config.str("rmm_version", RMM_VERSION);
  config.integer("rmm_pool_initial_bytes", rmm_initial);
  config.str("stream", "one created non-blocking stream for every row, synchronized (untimed) after each batch");
  config.str("cudaMallocAsync_setup", "device default mempool, cudaMemPoolAttrReleaseThreshold=UINT64_MAX (restored at exit)");
  config.str("rmm_cuda_async_setup", "cuda_async_memory_resource{}: its own pool, release threshold UINT64_MAX (RMM's default)");
  config.integer("mixed_slots", MixedWorkload::kSlots);
  config.str("mixed_sizes", "log-uniform 256 B .. 16 MiB, multiples of 4");

  JsonObject root;
  root.str("benchmark", "rmm_pair");
  root.raw("environment", environment_json().dump(2));
  if (!cuda.available) {
    std::string note = "CUDA unavailable (" + cuda.reason + "): nothing measured (every row needs a GPU)";
    std::printf("NOTE: %s\n", note.c_str());
    if (!json_path.empty()) {
      root.raw("config", config.dump(2));
      root.boolean("host_only", true);
      root.str("note", note);
      root.raw("results", "[]");
      root.raw("mixed", "[]");
      if (!write_file(json_path, root.dump())) return 1;
    }
    return 0;
  }

  // ------------------------------------------------------------- set-up
  cudaStream_t stream = nullptr;
  cudaMemPool_t mempool = nullptr;
  std::uint64_t old_threshold = 0;
  std::shared_ptr<gpukeeper::CachingPool> gk_pool;
  std::optional<rmm::mr::pool_memory_resource> rmm_pool;
  std::optional<rmm::mr::cuda_async_memory_resource> rmm_async;
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
    gk_pool = std::make_shared<gpukeeper::CachingPool>(
        gpukeeper::make_resource(gpukeeper::ResourceKind::device, 0));
    rmm_pool.emplace(rmm::mr::cuda_memory_resource{}, rmm_initial);
    rmm_async.emplace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "set-up failed: %s\n", e.what());
    return 1;
  }
  const gpukeeper::stream_t gk_stream = reinterpret_cast<gpukeeper::stream_t>(stream);
  const cuda::stream_ref sref{stream};
  constexpr std::size_t kAlign = rmm::CUDA_ALLOCATION_ALIGNMENT;

  auto drain = [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); };

  // ------------------------------------------------------------- rows
  // One allocator at a time over every size, then the mixed loop. Each allocator's calls
  // are inlined into its own timing loop (a template, no std::function), as in
  // alloc_pair_bench, so no row pays an indirection the others do not.
  std::vector<Row> rows, mixed_rows;
  const MixedWorkload mixed(12345);
  auto run_row = [&](Row& r, auto&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      r.error = e.what();
      std::fprintf(stderr, "  %s %s failed: %s\n", r.allocator.c_str(), r.workload.c_str(), e.what());
    }
  };
  auto bench_peer = [&](const char* key, const char* label, auto&& alloc, auto&& free_) {
    for (const Size& size : kSizes) {
      Row r;
      r.allocator = key;
      r.label = label;
      r.workload = size.key;
      r.size = size.bytes;
      const std::size_t n = size.bytes;
      run_row(r, [&] {
        measure(r, plan, [&] {
          void* p = alloc(n);
          do_not_optimize(p);
          free_(p, n);
        }, drain);
      });
      rows.push_back(std::move(r));
    }
    Row r;
    r.allocator = key;
    r.label = label;
    r.workload = "mixed";
    run_row(r, [&] { measure_mixed(r, plan, mixed, alloc, free_, drain); });
    mixed_rows.push_back(std::move(r));
  };
  bench_peer(kGpukeeper, "gpukeeper CachingPool, device upstream",
             [&](std::size_t n) { return gk_pool->allocate(n, gk_stream); },
             [&](void* p, std::size_t) { gk_pool->deallocate(p); });
  bench_peer(kRmmPool, "rmm pool_memory_resource(cuda_memory_resource)",
             [&](std::size_t n) { return rmm_pool->allocate(sref, n, kAlign); },
             [&](void* p, std::size_t n) { rmm_pool->deallocate(sref, p, n, kAlign); });
  bench_peer(kRmmAsync, "rmm cuda_async_memory_resource",
             [&](std::size_t n) { return rmm_async->allocate(sref, n, kAlign); },
             [&](void* p, std::size_t n) { rmm_async->deallocate(sref, p, n, kAlign); });
  bench_peer(kMallocAsync, "cudaMallocAsync + cudaFreeAsync (threshold max)",
             [&](std::size_t n) {
               void* p = nullptr;
               check(cudaMallocAsync(&p, n, stream), "cudaMallocAsync");
               return p;
             },
             [&](void* p, std::size_t) { check(cudaFreeAsync(p, stream), "cudaFreeAsync"); });

  // ------------------------------------------------------------- table and ratios
  auto find = [](const std::vector<Row>& rs, const char* alloc, const std::string& wl) -> const Row* {
    for (const Row& r : rs) {
      if (r.allocator == alloc && r.workload == wl && r.error.empty()) return &r;
    }
    return nullptr;
  };
  std::printf("\nns per alloc+free pair (median, p10, p90 across batches); last column: "
              "median / gpukeeper's\n");
  std::printf("%-8s %-48s %10s %10s %10s %13s %11s\n", "size", "allocator", "median", "p10", "p90",
              "pairs x bat", "/ gpukeeper");
  std::vector<std::string> ratio_json;
  auto print_workload = [&](const std::vector<Row>& rs, const std::string& wl) {
    for (const Row& r : rs) {
      if (r.workload != wl) continue;
      if (!r.error.empty()) {
        std::printf("%-8s %-48s   FAILED: %s\n", r.workload.c_str(), r.label.c_str(), r.error.c_str());
        continue;
      }
      char pb[32];
      std::snprintf(pb, sizeof pb, "%zu x %zu", r.pairs_per_batch, r.batches);
      std::printf("%-8s %-48s %10s %10s %10s %13s %11s\n", r.workload.c_str(), r.label.c_str(),
                  fmt_ns(r.summary.median).c_str(), fmt_ns(r.summary.p10).c_str(),
                  fmt_ns(r.summary.p90).c_str(), pb,
                  ratio_text(&r, find(rs, kGpukeeper, r.workload)).c_str());
    }
  };
  auto add_ratios = [&](const std::vector<Row>& rs, const std::string& wl) {
    const Row* gk = find(rs, kGpukeeper, wl);
    JsonObject t;
    t.str("workload", wl);
    for (const char* key : {kGpukeeper, kRmmPool, kRmmAsync, kMallocAsync}) {
      const Row* r = find(rs, key, wl);
      t.num(std::string(key) + "_ns", r ? r->summary.median : std::nan(""));
      if (std::string(key) != kGpukeeper) {
        // gpukeeper's median over the peer's: below 1, gpukeeper is faster.
        t.num(std::string("gpukeeper_over_") + key,
              gk && r ? gk->summary.median / r->summary.median : std::nan(""));
      }
    }
    ratio_json.push_back(t.dump(4));
  };
  for (const Size& size : kSizes) {
    print_workload(rows, size.key);
    std::printf("\n");
  }
  print_workload(mixed_rows, "mixed");
  for (const Size& size : kSizes) add_ratios(rows, size.key);
  add_ratios(mixed_rows, "mixed");

  // One line per workload, each starting "median ", for scripts to grep into a summary.
  std::printf("\n");
  auto median_line = [&](const std::vector<Row>& rs, const std::string& wl) {
    std::string line = "median " + wl + ":";
    const char* sep = " ";
    for (const char* key : {kGpukeeper, kRmmPool, kRmmAsync, kMallocAsync}) {
      const Row* r = find(rs, key, wl);
      line += sep + std::string(key) + " " + (r ? fmt_ns(r->summary.median) + " ns" : std::string("-"));
      if (r && std::string(key) != kGpukeeper) line += " (" + ratio_text(r, find(rs, kGpukeeper, wl)) + "x gpukeeper)";
      sep = ", ";
    }
    std::printf("%s\n", line.c_str());
  };
  for (const Size& size : kSizes) median_line(rows, size.key);
  median_line(mixed_rows, "mixed");

  std::string problems = gk_pool->validate();
  if (!problems.empty()) std::fprintf(stderr, "gpukeeper pool: books inconsistent: %s\n", problems.c_str());

  // ------------------------------------------------------------- JSON
  if (!json_path.empty()) {
    config.num("mixed_mean_bytes", mixed.mean_size());
    root.raw("config", config.dump(2));
    root.boolean("host_only", false);
    root.str("note", "");
    root.raw("results", json_array(rows_json(rows), 2));
    root.raw("mixed", json_array(rows_json(mixed_rows), 2));
    root.raw("ratios", json_array(ratio_json, 2));
    root.integer("rmm_pool_size_bytes", rmm_pool->pool_size());
    root.boolean("gpukeeper_books_consistent", problems.empty());
    if (!write_json_report(json_path, root.dump())) return 1;
  }

  // ------------------------------------------------------------- tear-down
  // The resources return their memory before the stream they used goes away.
  gk_pool.reset();
  rmm_pool.reset();
  rmm_async.reset();
  (void)cudaStreamSynchronize(stream);
  (void)cudaMemPoolTrimTo(mempool, 0);
  (void)cudaMemPoolSetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &old_threshold);
  (void)cudaStreamDestroy(stream);
  for (const Row& r : rows) {
    if (!r.error.empty()) return 1;
  }
  for (const Row& r : mixed_rows) {
    if (!r.error.empty()) return 1;
  }
  return problems.empty() ? 0 : 1;
}
