// Replays allocation traces through a gpukeeper CachingPool and reports how much memory
// the pool had to reserve for them, and how fast it served them.
//
// Trace format (text, one event per line; benchmarks/python/record_traces.py and
// synth_trace.py write it):
//   a <id> <size> [<stream>]   allocate <size> bytes on <stream> (an integer; default 0)
//   f <id>                     free the allocation <id>
//   # <key>: <value>           metadata (kept in the JSON), any other '#' line a comment
//
// Reported per trace and mode:
//   peak requested  the peak over time of the sum of live requested sizes (from the trace)
//   peak allocated  the pool's peak of live block bytes (requests rounded up to 256 B)
//   peak reserved   the pool's peak of bytes held from the upstream
//   reserved / requested and reserved / allocated (the fragmentation overhead), for the
//   first replay on a fresh pool, and after all passes (a warm pool that kept its cache);
//   ns per op: the first (cold) pass, and the median of the warm passes (each pass's
//   time over its operations: page moves and all);
//   op p50 / p99: one more warm pass with every operation timed on its own (the clock's
//   own cost taken off): the median operation, and the slow tail where moves land.
//
// Modes:
//   sim     a SimulatedDeviceResource upstream (sim_resource.hpp): addresses from a reserved
//           virtual range, no memory touched, no GPU needed; capacity --capacity (80 GiB)
//   device  the real cudaMalloc upstream, when CUDA is usable (trace streams other than 0
//           are mapped to streams created here); plus, as a reference, the same trace
//           through cudaMallocFromPoolAsync on a fresh mempool with release threshold
//           UINT64_MAX (its ReservedMemHigh / UsedMemHigh), unless --no-async-reference
//
// The frontier (--frontier S1,S2,...): for each expandable layout of the run and each
// PoolOptions::expandable_slack given, a simulated replay's reserved over requested (all
// passes) against its warm mean operation and page maps per 1000 operations, with the
// device's warm mean estimated as the simulated one plus maps/kop x --map-cost-us (a page
// map or move: about 60 us on an H100, benchmarks/cpp/page_move_bench); beside it the
// references: cudaMallocAsync (device mode) and PyTorch's recorded peaks with and without
// expandable segments (the trace's metadata).
//
//   trace_replay [--mode sim|device|all] [--passes N] [--capacity BYTES] [--json PATH]
//                [--frontier S1,S2,...] [--map-cost-us US] TRACE...
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/resource.hpp"
#include "sim_resource.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace gkbench;

namespace {


struct Op {
  std::uint64_t size;    // 0: free
  std::uint32_t slot;    // dense index of the live allocation
  std::uint32_t stream;  // index into Trace::streams
};

struct Trace {
  std::string path;
  std::string name;
  std::vector<Op> ops;
  std::vector<std::uint64_t> streams;  // index -> the stream value in the file
  std::size_t slots = 0;
  std::vector<std::pair<std::string, std::string>> meta;
  std::uint64_t allocs = 0, frees = 0, unmatched_frees = 0, duplicate_ids = 0, zero_sizes = 0,
                bad_lines = 0;
  std::uint64_t live_at_end = 0, live_bytes_at_end = 0;
  std::uint64_t peak_requested = 0, peak_rounded = 0, peak_live_count = 0;
  std::uint64_t max_size = 0, total_bytes = 0;

  const std::string* find_meta(const std::string& key) const {
    for (auto& kv : meta) {
      if (kv.first == key) return &kv.second;
    }
    return nullptr;
  }
};

std::string base_name(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

std::string trim(const std::string& s) {
  auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  auto b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

bool load_trace(const std::string& path, Trace* t, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot open " + path;
    return false;
  }
  t->path = path;
  t->name = base_name(path);
  std::unordered_map<std::uint64_t, std::uint32_t> live;  // id -> slot
  std::vector<std::uint64_t> slot_size;
  std::vector<std::uint32_t> free_slots;
  std::unordered_map<std::uint64_t, std::uint32_t> stream_index;
  std::uint64_t requested = 0, rounded = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const char* s = line.c_str();
    if (s[0] == '#') {
      std::string body = trim(line.substr(1));
      auto colon = body.find(':');
      if (colon != std::string::npos && colon > 0 &&
          body.find(' ') > colon) {  // "# key: value", key without spaces
        t->meta.emplace_back(body.substr(0, colon), trim(body.substr(colon + 1)));
      }
      continue;
    }
    char* end = nullptr;
    if (s[0] == 'a' && s[1] == ' ') {
      std::uint64_t id = std::strtoull(s + 2, &end, 10);
      std::uint64_t size = std::strtoull(end, &end, 10);
      std::uint64_t stream = std::strtoull(end, &end, 10);  // 0 when absent
      if (size == 0) {
        ++t->zero_sizes;
        continue;
      }
      if (live.count(id)) {
        ++t->duplicate_ids;
        continue;
      }
      std::uint32_t slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<std::uint32_t>(slot_size.size());
        slot_size.push_back(0);
      }
      slot_size[slot] = size;
      live.emplace(id, slot);
      auto si = stream_index.find(stream);
      std::uint32_t sidx;
      if (si == stream_index.end()) {
        sidx = static_cast<std::uint32_t>(t->streams.size());
        stream_index.emplace(stream, sidx);
        t->streams.push_back(stream);
      } else {
        sidx = si->second;
      }
      t->ops.push_back(Op{size, slot, sidx});
      ++t->allocs;
      t->total_bytes += size;
      if (size > t->max_size) t->max_size = size;
      requested += size;
      rounded += (size + 255) / 256 * 256;
      if (requested > t->peak_requested) t->peak_requested = requested;
      if (rounded > t->peak_rounded) t->peak_rounded = rounded;
      if (live.size() > t->peak_live_count) t->peak_live_count = live.size();
    } else if (s[0] == 'f' && s[1] == ' ') {
      std::uint64_t id = std::strtoull(s + 2, &end, 10);
      auto it = live.find(id);
      if (it == live.end()) {
        ++t->unmatched_frees;
        continue;
      }
      std::uint32_t slot = it->second;
      live.erase(it);
      requested -= slot_size[slot];
      rounded -= (slot_size[slot] + 255) / 256 * 256;
      free_slots.push_back(slot);
      t->ops.push_back(Op{0, slot, 0});
      ++t->frees;
    } else {
      ++t->bad_lines;
    }
  }
  t->slots = slot_size.size();
  t->live_at_end = live.size();
  t->live_bytes_at_end = requested;
  if (t->allocs == 0) {
    *error = path + ": no allocations in the trace";
    return false;
  }
  return true;
}

struct PassTimes {
  double cold_ns_per_op = 0;
  std::vector<double> warm_ns_per_op;
};

struct ModeResult {
  std::string mode;    // "sim", "device", "cudaMallocAsync"
  std::string label;
  bool ran = false;
  std::string error;   // non-empty: failed
  std::string skipped; // non-empty: not run, and why
  std::uint64_t peak_reserved_first = 0, peak_allocated_first = 0;
  std::uint64_t peak_reserved_all = 0, peak_allocated_all = 0;
  gpukeeper::PoolStats stats_first{}, stats_all{};
  bool is_pool = true;
  bool books_consistent = true;
  std::string books;
  PassTimes times;
  Summary warm;
  std::uint64_t min_capacity = 0;  // sim: the least simulated capacity the trace runs in
  int min_capacity_probes = 0;
  // Page mappings (pages made + pages moved) per 1000 operations of the warm passes: what
  // an expandable pool pays in driver calls once warm (each costs microseconds on a
  // device), counted the same in simulation.
  double warm_maps_per_kop = 0.0;
  // One more warm pass, every operation timed alone: percentiles over its operations, ns.
  double op_p50 = std::nan(""), op_p99 = std::nan("");
};

// What reading the clock twice costs (the median of many back-to-back reads), so that a
// single operation's time can be told apart from it.
double clock_overhead_ns() {
  std::vector<double> d(2001);
  for (double& x : d) {
    auto a = Clock::now();
    auto b = Clock::now();
    x = elapsed_ns(a, b);
  }
  return quantile(d, 0.5);
}

// One operation of a trace: an allocation into its slot, or the free of the slot's block.
template <typename Alloc, typename Free>
inline void run_op(const Op& op, std::vector<void*>& ptrs, std::vector<std::uint32_t>& owner,
                   Alloc& alloc, Free& free_) {
  if (op.size != 0) {
    ptrs[op.slot] = alloc(op.size, op.stream);
    owner[op.slot] = op.stream;
  } else {
    free_(ptrs[op.slot], owner[op.slot]);
    ptrs[op.slot] = nullptr;
  }
}

// Frees what a pass left live (untimed), so that every pass starts from an empty trace.
template <typename Free>
void free_live(std::vector<void*>& ptrs, const std::vector<std::uint32_t>& owner, Free& free_) {
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] != nullptr) {
      free_(ptrs[i], owner[i]);
      ptrs[i] = nullptr;
    }
  }
}

// One pass over the trace; frees what is still live at the end (untimed). Returns ns/op.
template <typename Alloc, typename Free>
double replay_pass(const Trace& t, std::vector<void*>& ptrs, std::vector<std::uint32_t>& owner,
                   Alloc&& alloc, Free&& free_) {
  auto t0 = Clock::now();
  for (const Op& op : t.ops) run_op(op, ptrs, owner, alloc, free_);
  auto t1 = Clock::now();
  free_live(ptrs, owner, free_);
  return elapsed_ns(t0, t1) / static_cast<double>(t.ops.size());
}

// One pass with each operation timed alone; stores the median and the 99th percentile of
// the operations' times, less the clock's overhead, into r.
template <typename Alloc, typename Free>
void latency_pass(const Trace& t, std::vector<void*>& ptrs, std::vector<std::uint32_t>& owner,
                  Alloc&& alloc, Free&& free_, ModeResult* r) {
  static const double overhead = clock_overhead_ns();
  std::vector<double> ns(t.ops.size());
  auto prev = Clock::now();
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    run_op(t.ops[i], ptrs, owner, alloc, free_);
    auto now = Clock::now();
    ns[i] = std::max(0.0, elapsed_ns(prev, now) - overhead);
    prev = now;
  }
  free_live(ptrs, owner, free_);
  r->op_p50 = quantile(ns, 0.5);
  r->op_p99 = quantile(ns, 0.99);
}


// Cold pass on a fresh pool, then `passes` warm passes on the same pool.
void replay_pool(const Trace& t, gpukeeper::CachingPool& pool,
                 const std::vector<gpukeeper::stream_t>& streams, int passes, ModeResult* r) {
  std::vector<void*> ptrs(t.slots, nullptr);
  std::vector<std::uint32_t> owner(t.slots, 0);
  auto alloc = [&](std::uint64_t size, std::uint32_t s) { return pool.allocate(size, streams[s]); };
  auto free_ = [&](void* p, std::uint32_t) { pool.deallocate(p); };
  auto cleanup = [&] {
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
      if (ptrs[i]) pool.deallocate(ptrs[i]);
      ptrs[i] = nullptr;
    }
  };
  try {
    r->times.cold_ns_per_op = replay_pass(t, ptrs, owner, alloc, free_);
    r->stats_first = pool.stats();
    r->peak_reserved_first = r->stats_first.peak_reserved_bytes;
    r->peak_allocated_first = r->stats_first.peak_allocated_bytes;
    for (int p = 0; p < passes; ++p) {
      r->times.warm_ns_per_op.push_back(replay_pass(t, ptrs, owner, alloc, free_));
    }
    r->stats_all = pool.stats();
    const std::uint64_t warm_ops = static_cast<std::uint64_t>(passes) * t.ops.size();
    const std::uint64_t warm_maps =
        (r->stats_all.pages_moved - r->stats_first.pages_moved) +
        (r->stats_all.upstream_allocations - r->stats_first.upstream_allocations);
    r->warm_maps_per_kop = warm_ops ? 1000.0 * static_cast<double>(warm_maps) / warm_ops : 0.0;
    r->peak_reserved_all = r->stats_all.peak_reserved_bytes;
    r->peak_allocated_all = r->stats_all.peak_allocated_bytes;
    r->warm = summarize(r->times.warm_ns_per_op);
    latency_pass(t, ptrs, owner, alloc, free_, r);
    r->books = pool.validate();
    r->books_consistent = r->books.empty();
    r->ran = true;
  } catch (const std::exception& e) {
    r->error = e.what();
    try {
      cleanup();
    } catch (...) {
    }
  }
}

// Whether one pass over the trace completes on a fresh pool over a simulated device of
// `capacity` bytes (the pool releasing its cache and retrying when the upstream refuses).
bool fits(const Trace& t, std::uint64_t capacity, const SegmentLayout& layout) {
  gpukeeper::CachingPool pool(std::make_unique<SimulatedDeviceResource>(capacity),
                              pool_options(layout));
  std::vector<void*> ptrs(t.slots, nullptr);
  std::vector<std::uint32_t> owner(t.slots, 0);
  try {
    replay_pass(t, ptrs, owner, [&](std::uint64_t size, std::uint32_t s) {
      return pool.allocate(size, s); }, [&](void* p, std::uint32_t) { pool.deallocate(p); });
    return true;
  } catch (const gpukeeper::AllocationError&) {
    for (void* p : ptrs) {
      if (p) pool.deallocate(p);
    }
    return false;
  }
}

// The least capacity (to 0.25% or 2 MiB) in which the trace replays, by bisection between
// the trace's peak requested bytes and the peak the pool reserved with room to spare.
std::uint64_t min_capacity(const Trace& t, std::uint64_t upper, const SegmentLayout& layout,
                           int* probes) {
  const std::uint64_t step = std::uint64_t{2} << 20;
  std::uint64_t lo = t.peak_rounded, hi = std::max(upper, lo + step);
  *probes = 0;
  if (fits(t, lo, layout)) return lo;
  ++*probes;
  while (hi - lo > std::max(step, lo / 400)) {
    std::uint64_t mid = lo + (hi - lo) / 2;
    ++*probes;
    if (fits(t, mid, layout)) hi = mid; else lo = mid;
  }
  return hi;
}

#ifdef GPUKEEPER_WITH_CUDA
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

// The reference: the same trace through CUDA's stream-ordered allocator (its own pool,
// which also caches, with a release threshold of UINT64_MAX).
void replay_async(const Trace& t, const std::vector<cudaStream_t>& streams, int passes,
                  ModeResult* r) {
  r->is_pool = false;
  cudaMemPool_t mp = nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  std::vector<void*> ptrs(t.slots, nullptr);
  std::vector<std::uint32_t> owner(t.slots, 0);
  try {
    check(cudaMemPoolCreate(&mp, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    auto alloc = [&](std::uint64_t size, std::uint32_t s) {
      void* p = nullptr;
      check(cudaMallocFromPoolAsync(&p, size, mp, streams[s]), "cudaMallocFromPoolAsync");
      return p;
    };
    auto free_ = [&](void* p, std::uint32_t s) { check(cudaFreeAsync(p, streams[s]), "cudaFreeAsync"); };
    auto read = [&](cudaMemPoolAttr a) {
      std::uint64_t v = 0;
      check(cudaMemPoolGetAttribute(mp, a, &v), "cudaMemPoolGetAttribute");
      return v;
    };
    r->times.cold_ns_per_op = replay_pass(t, ptrs, owner, alloc, free_);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    r->peak_reserved_first = read(cudaMemPoolAttrReservedMemHigh);
    r->peak_allocated_first = read(cudaMemPoolAttrUsedMemHigh);
    for (int p = 0; p < passes; ++p) {
      r->times.warm_ns_per_op.push_back(replay_pass(t, ptrs, owner, alloc, free_));
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    r->peak_reserved_all = read(cudaMemPoolAttrReservedMemHigh);
    r->peak_allocated_all = read(cudaMemPoolAttrUsedMemHigh);
    r->warm = summarize(r->times.warm_ns_per_op);
    latency_pass(t, ptrs, owner, alloc, free_, r);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    r->ran = true;
  } catch (const std::exception& e) {
    r->error = e.what();
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
      if (ptrs[i]) (void)cudaFreeAsync(ptrs[i], streams[owner[i]]);
    }
    (void)cudaGetLastError();
  }
  if (mp) {
    (void)cudaDeviceSynchronize();
    (void)cudaMemPoolDestroy(mp);
  }
}
#endif

double ratio(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? std::nan("") : static_cast<double>(a) / static_cast<double>(b);
}

std::string fmt_ratio(double r) {
  if (!std::isfinite(r)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", r);
  return buf;
}

double meta_ratio(const Trace& t, const char* num, const char* den) {
  const std::string* a = t.find_meta(num);
  const std::string* b = t.find_meta(den);
  if (!a || !b) return std::nan("");
  double x = std::strtod(a->c_str(), nullptr), y = std::strtod(b->c_str(), nullptr);
  return y > 0 ? x / y : std::nan("");
}

// "sim", "sim-expandable", "sim-hybrid", "sim-default" (likewise "device..."): fixed
// segments keep the plain name, as in earlier JSON.
std::string mode_name(const char* upstream, const SegmentLayout& layout) {
  return layout.segments == gpukeeper::SegmentLayout::fixed ? std::string(upstream)
                                                            : std::string(upstream) + "-" + layout.name;
}

// "gpukeeper pool, hybrid segments, device"; the default layout says what it chose.
std::string mode_label(const SegmentLayout& layout, const gpukeeper::CachingPool& pool,
                       const char* upstream) {
  std::string name = layout.name;
  if (layout.segments == gpukeeper::SegmentLayout::automatic) {
    name += std::string(" (") + gpukeeper::to_string(pool.options().segments) + ")";
  }
  return "gpukeeper pool, " + name + " segments, " + upstream;
}

// One point of the frontier: a layout and a spare budget, and what the replay cost.
struct FrontierPoint {
  std::string trace, layout;
  double slack = 0;
  bool ran = false;
  std::string error;
  double ratio_all = std::nan("");  // peak reserved (all passes) over peak requested
  double warm_ns = std::nan("");    // the simulated warm passes' median ns/op
  double maps_per_kop = std::nan("");
};

// The device's warm mean operation as the simulation predicts it: the simulated bookkeeping
// plus what the warm passes' page maps cost on the device.
double device_estimate_ns(const FrontierPoint& p, double map_cost_us) {
  return p.warm_ns + p.maps_per_kop * map_cost_us;  // maps per 1000 ops x us = ns per op
}

std::vector<double> parse_list(const std::string& text, const char* what) {
  std::vector<double> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = trim(text.substr(at, comma - at));
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || end == nullptr || *end != '\0' || !(v >= 0.0)) {
      throw std::runtime_error(std::string(what) + ": '" + item + "' is not a number >= 0");
    }
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

void usage() {
  std::puts(
      "usage: trace_replay [--mode sim|device|all] [--segments fixed|expandable|hybrid|default|both|all]\n"
      "                    [--passes N] [--capacity BYTES]\n"
      "                    [--no-async-reference] [--no-min-capacity] [--json PATH] TRACE...\n"
      "  --mode        sim: simulated upstream only; device: cudaMalloc upstream only;\n"
      "                all (default): sim, plus device when CUDA is usable\n"
      "  --slack X     expandable segments: reserved bytes may exceed the peak requested by\n"
      "                this fraction before pages move (PoolOptions::expandable_slack)\n"
      "  --segments    the pool's segments: fixed, expandable (PoolOptions::segments),\n"
      "                hybrid (expandable for large requests, fixed for small ones),\n"
      "                default (PoolOptions{}: hybrid on a device, or a simulated one, with\n"
      "                virtual memory), both (fixed and expandable) or all (fixed,\n"
      "                expandable and hybrid; the default where the core has expandable segments)\n"
      "  --passes N    warm passes after the first (default 5)\n"
      "  --capacity B  simulated device memory in bytes (default 80 GiB; suffixes K M G)\n"
      "  --no-min-capacity  skip the search for the least simulated capacity that runs\n"
      "                the trace (the pool then releases its cache when the upstream refuses)\n"
      "  --frontier S1,S2,...  also replay every expandable layout of the run (simulated)\n"
      "                with each expandable_slack given, and print reserved/requested against\n"
      "                warm ns/op and maps/kop, beside cudaMallocAsync and PyTorch's figures\n"
      "  --map-cost-us US  what one page map costs on the device, for the frontier's\n"
      "                estimate of the device's warm mean operation (default 60)\n"
      "  --max-ratio R exit 1 when a simulated replay's peak reserved over peak requested\n"
      "                (all passes) exceeds R: a checked number in CI\n"
      "  --json PATH   write the results as JSON");
}

std::uint64_t parse_bytes(std::string v) {
  std::uint64_t mult = 1;
  if (!v.empty()) {
    char c = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    if (c == 'K' || c == 'M' || c == 'G' || c == 'T') {
      mult = c == 'K' ? 1ull << 10 : c == 'M' ? 1ull << 20 : c == 'G' ? 1ull << 30 : 1ull << 40;
      v.pop_back();
    }
  }
  return parse_u64(v, "--capacity") * mult;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "all", json_path;
  int passes = 5;
  std::uint64_t capacity = std::uint64_t{80} << 30;
  bool async_reference = true;
  bool search_min_capacity = true;
  double max_ratio = 0.0;  // > 0: fail when a simulated replay reserves more, over requested
  std::vector<double> frontier_slacks;  // --frontier
  double map_cost_us = 60.0;
  std::string segments = "all";
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    std::string v, arg = argv[i];
    if (take_arg(argc, argv, &i, "--mode", &v)) {
      mode = v;
      if (mode != "sim" && mode != "device" && mode != "all") {
        std::fprintf(stderr, "--mode must be sim, device or all\n");
        return 2;
      }
    } else if (take_arg(argc, argv, &i, "--passes", &v)) {
      passes = static_cast<int>(parse_u64(v, "--passes"));
    } else if (take_arg(argc, argv, &i, "--capacity", &v)) {
      capacity = parse_bytes(v);
    } else if (take_arg(argc, argv, &i, "--json", &v)) {
      json_path = v;
    } else if (arg == "--no-async-reference") {
      async_reference = false;
    } else if (take_arg(argc, argv, &i, "--slack", &v)) {
      g_expandable_slack = std::atof(v.c_str());
    } else if (take_arg(argc, argv, &i, "--segments", &v)) {
      segments = v;
      if (segments != "fixed" && segments != "expandable" && segments != "hybrid" &&
          segments != "default" && segments != "both" && segments != "all") {
        std::fprintf(stderr, "--segments must be fixed, expandable, hybrid, default, both or all\n");
        return 2;
      }
    } else if (take_arg(argc, argv, &i, "--max-ratio", &v)) {
      max_ratio = std::atof(v.c_str());
      if (!(max_ratio >= 1.0)) {
        std::fprintf(stderr, "--max-ratio must be a number >= 1\n");
        return 2;
      }
    } else if (take_arg(argc, argv, &i, "--frontier", &v)) {
      try {
        frontier_slacks = parse_list(v, "--frontier");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
    } else if (take_arg(argc, argv, &i, "--map-cost-us", &v)) {
      map_cost_us = std::atof(v.c_str());
      if (!(map_cost_us >= 0.0)) {
        std::fprintf(stderr, "--map-cost-us must be a number >= 0\n");
        return 2;
      }
    } else if (arg == "--no-min-capacity") {
      search_min_capacity = false;
    } else if (arg == "-h" || arg == "--help") {
      usage();
      return 0;
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "unknown argument '%s'\n", arg.c_str());
      usage();
      return 2;
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.empty()) {
    usage();
    return 2;
  }

  std::vector<SegmentLayout> layouts;
  if (segments == "fixed" || segments == "both" || segments == "all") layouts.push_back(kFixed);
  if (segments == "expandable" || segments == "both" || segments == "all") layouts.push_back(kExpandable);
  if (segments == "hybrid" || segments == "all") layouts.push_back(kHybrid);
  if (segments == "default") layouts.push_back(kDefault);

  std::printf("gpukeeper trace replay\n%s", environment_line().c_str());
  std::printf("segments: %s\n", segments.c_str());
  const gpukeeper::CudaStatus cuda = gpukeeper::cuda_status();
  const bool want_device = mode == "device" || mode == "all";
  [[maybe_unused]] const bool run_device = want_device && cuda.available;  // unused without CUDA
  std::string note;
  if (want_device && !cuda.available) {
    note = "CUDA unavailable (" + cuda.reason + "): device mode skipped, simulated upstream only";
    std::printf("NOTE: %s\n", note.c_str());
  }
  if (mode == "device" && !cuda.available) {
    std::fprintf(stderr, "--mode device needs CUDA\n");
    return 1;
  }

  std::vector<std::string> json_traces;
  bool failed = false;
  struct Line {
    std::string trace, mode;
    const Trace* t;
    ModeResult r;
  };
  std::vector<Trace> traces;
  traces.reserve(paths.size());
  std::vector<Line> lines;
  std::vector<FrontierPoint> frontier;
  // Per trace, the references the frontier is read against.
  struct Reference {
    const Trace* t;
    double async_ratio = std::nan(""), async_warm_ns = std::nan("");
  };
  std::vector<Reference> references;

  for (const std::string& path : paths) {
    traces.emplace_back();
    Trace& t = traces.back();
    std::string error;
    auto t0 = Clock::now();
    if (!load_trace(path, &t, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      failed = true;
      traces.pop_back();
      continue;
    }
    double load_ms = elapsed_ns(t0, Clock::now()) / 1e6;
    std::printf("\n%s: %zu ops (%" PRIu64 " allocs, %" PRIu64 " frees), %zu stream(s), peak live %" PRIu64
                " blocks, peak requested %s, largest request %s; loaded in %.0f ms\n",
                t.name.c_str(), t.ops.size(), t.allocs, t.frees, t.streams.size(), t.peak_live_count,
                human_size(t.peak_requested).c_str(), human_size(t.max_size).c_str(), load_ms);
    if (t.unmatched_frees || t.duplicate_ids || t.zero_sizes || t.bad_lines) {
      std::printf("  skipped: %" PRIu64 " frees of unknown ids, %" PRIu64 " duplicate ids, %" PRIu64
                  " zero sizes, %" PRIu64 " unreadable lines\n",
                  t.unmatched_frees, t.duplicate_ids, t.zero_sizes, t.bad_lines);
    }

    std::vector<ModeResult> results;
    for (const SegmentLayout& layout : layouts) {
      if (mode != "sim" && mode != "all") break;
      ModeResult r;
      r.mode = mode_name("sim", layout);
      r.label = std::string("gpukeeper pool, ") + layout.name + " segments, simulated upstream";
      // Streams are plain integers to a pool whose upstream is not stream ordered.
      std::vector<gpukeeper::stream_t> streams;
      for (std::size_t i = 0; i < t.streams.size(); ++i) streams.push_back(t.streams[i] == 0 ? 0 : i + 1);
      try {
        auto sim = std::make_unique<SimulatedDeviceResource>(capacity);
        SimulatedDeviceResource* sim_raw = sim.get();
        gpukeeper::CachingPool pool(std::move(sim), pool_options(layout));
        r.label = mode_label(layout, pool, "simulated upstream");
        replay_pool(t, pool, streams, passes, &r);
        if (r.ran && sim_raw->peak_bytes() != r.peak_reserved_all) {
          r.books += "simulated upstream's peak of held bytes " + std::to_string(sim_raw->peak_bytes()) +
                     " != pool peak reserved " + std::to_string(r.peak_reserved_all) + "; ";
          r.books_consistent = false;
        }
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      if (r.ran && search_min_capacity) {
        auto m0 = Clock::now();
        try {
          r.min_capacity = min_capacity(t, r.peak_reserved_first, layout, &r.min_capacity_probes);
          std::printf("  %s: least capacity that runs the trace %s (%.3f x peak requested; %d probes, %.0f ms)\n",
                      r.mode.c_str(), human_size(r.min_capacity).c_str(), ratio(r.min_capacity, t.peak_requested),
                      r.min_capacity_probes, elapsed_ns(m0, Clock::now()) / 1e6);
        } catch (const std::exception& e) {
          std::printf("  %s: least-capacity search failed: %s\n", r.mode.c_str(), e.what());
        }
      }
      results.push_back(std::move(r));
    }
#ifdef GPUKEEPER_WITH_CUDA
    if (run_device) {
      std::vector<cudaStream_t> created;
      std::vector<cudaStream_t> cstreams;
      std::vector<gpukeeper::stream_t> streams;
      std::string device_skip;
      try {
        check(cudaSetDevice(0), "cudaSetDevice");
        for (std::uint64_t s : t.streams) {
          cudaStream_t cs = nullptr;
          if (s != 0) {
            check(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), "cudaStreamCreate");
            created.push_back(cs);
          }
          cstreams.push_back(cs);
          streams.push_back(reinterpret_cast<gpukeeper::stream_t>(cs));
        }
        gpukeeper::MemoryInfo info = gpukeeper::device_memory_info(0);
        if (info.free < t.peak_requested + (t.peak_requested >> 4)) {
          device_skip = "device has " + human_size(info.free) + " free, the trace needs at least " +
                        human_size(t.peak_requested);
        }
      } catch (const std::exception& e) {
        device_skip = std::string("set-up failed: ") + e.what();
      }
      for (const SegmentLayout& layout : layouts) {
        ModeResult r;
        r.mode = mode_name("device", layout);
        r.label = std::string("gpukeeper pool, ") + layout.name + " segments, device";
        if (!device_skip.empty()) {
          r.skipped = device_skip;
        } else {
          try {
            gpukeeper::CachingPool pool(gpukeeper::make_resource(gpukeeper::ResourceKind::device, 0),
                                        pool_options(layout));
            r.label = mode_label(layout, pool, "device");
            replay_pool(t, pool, streams, passes, &r);
          } catch (const std::exception& e) {
            r.error = e.what();
          }
        }
        results.push_back(std::move(r));
      }
      if (async_reference) {
        ModeResult a;
        a.mode = "cudaMallocAsync";
        a.label = "cudaMallocAsync (own mempool, threshold max)";
        if (!device_skip.empty()) {
          a.skipped = device_skip;
        } else if (cstreams.size() == t.streams.size()) {
          replay_async(t, cstreams, passes, &a);
        } else {
          a.skipped = "stream set-up failed";
        }
        results.push_back(std::move(a));
      }
      for (cudaStream_t cs : created) (void)cudaStreamDestroy(cs);
    }
#endif

    // ---- the frontier: each expandable layout of the run under each spare budget
    std::vector<std::string> frontier_json;
    if (!frontier_slacks.empty() && (mode == "sim" || mode == "all")) {
      std::vector<gpukeeper::stream_t> streams;
      for (std::size_t i = 0; i < t.streams.size(); ++i) streams.push_back(t.streams[i] == 0 ? 0 : i + 1);
      const double asked_slack = g_expandable_slack;
      for (const SegmentLayout& layout : layouts) {
        if (layout.segments == gpukeeper::SegmentLayout::fixed) continue;
        for (double slack : frontier_slacks) {
          FrontierPoint p;
          p.trace = t.name;
          p.layout = layout.name;
          p.slack = slack;
          ModeResult r;
          g_expandable_slack = slack;
          try {
            gpukeeper::CachingPool pool(std::make_unique<SimulatedDeviceResource>(capacity),
                                        pool_options(layout));
            replay_pool(t, pool, streams, passes, &r);
          } catch (const std::exception& e) {
            r.error = e.what();
          }
          p.ran = r.ran;
          p.error = r.error;
          if (r.ran) {
            p.ratio_all = ratio(r.peak_reserved_all, t.peak_requested);
            p.warm_ns = r.warm.median;
            p.maps_per_kop = r.warm_maps_per_kop;
          }
          JsonObject fj;
          fj.str("layout", p.layout);
          fj.num("expandable_slack", p.slack);
          fj.boolean("ran", p.ran);
          fj.str("error", p.error);
          fj.num("reserved_over_requested_all_passes", p.ratio_all);
          fj.num("warm_ns_per_op_median", p.warm_ns);
          fj.num("warm_maps_per_kop", p.maps_per_kop);
          fj.num("device_warm_ns_per_op_estimate", device_estimate_ns(p, map_cost_us));
          frontier_json.push_back(fj.dump(6));
          frontier.push_back(std::move(p));
        }
      }
      g_expandable_slack = asked_slack;
    }
    Reference ref{&t};
    for (const ModeResult& r : results) {
      if (r.mode == "cudaMallocAsync" && r.ran) {
        ref.async_ratio = ratio(r.peak_reserved_all, t.peak_requested);
        ref.async_warm_ns = r.warm.median;
      }
    }
    references.push_back(ref);

    // ---- JSON for this trace
    JsonObject tj;
    tj.str("trace", t.name);
    tj.str("path", t.path);
    tj.integer("ops", t.ops.size());
    tj.integer("allocs", t.allocs);
    tj.integer("frees", t.frees);
    tj.integer("streams", t.streams.size());
    tj.integer("unmatched_frees", t.unmatched_frees);
    tj.integer("duplicate_ids", t.duplicate_ids);
    tj.integer("live_at_end", t.live_at_end);
    tj.integer("peak_live_count", t.peak_live_count);
    tj.integer("peak_requested_bytes", t.peak_requested);
    tj.integer("peak_requested_rounded256_bytes", t.peak_rounded);
    tj.integer("max_request_bytes", t.max_size);
    tj.integer("total_requested_bytes", t.total_bytes);
    JsonObject meta;
    for (auto& kv : t.meta) meta.str(kv.first, kv.second);
    tj.raw("meta", meta.dump(4));
    double torch_ratio = meta_ratio(t, "torch_max_memory_reserved", "torch_max_memory_allocated");
    double torch_exp_ratio =
        meta_ratio(t, "torch_expandable_max_memory_reserved", "torch_expandable_max_memory_allocated");
    tj.num("torch_reserved_over_allocated", torch_ratio);
    tj.num("torch_reserved_over_requested",
           meta_ratio(t, "torch_max_memory_reserved", "torch_peak_requested"));
    tj.num("torch_expandable_reserved_over_allocated", torch_exp_ratio);
    std::vector<std::string> modes_json;
    for (ModeResult& r : results) {
      JsonObject m;
      m.str("mode", r.mode);
      m.str("label", r.label);
      m.boolean("ran", r.ran);
      m.str("error", r.error);
      m.str("skipped", r.skipped);
      if (r.ran) {
        m.integer("peak_reserved_bytes", r.peak_reserved_first);
        m.integer("peak_allocated_bytes", r.peak_allocated_first);
        m.num("reserved_over_requested", ratio(r.peak_reserved_first, t.peak_requested));
        m.num("reserved_over_allocated", ratio(r.peak_reserved_first, r.peak_allocated_first));
        m.integer("peak_reserved_bytes_all_passes", r.peak_reserved_all);
        m.num("reserved_over_requested_all_passes", ratio(r.peak_reserved_all, t.peak_requested));
        m.num("reserved_over_allocated_all_passes", ratio(r.peak_reserved_all, r.peak_allocated_all));
        m.num("cold_ns_per_op", r.times.cold_ns_per_op);
        m.summary("warm_ns_per_op_", r.warm);
        m.integer("warm_passes", r.times.warm_ns_per_op.size());
        m.num("op_ns_p50", r.op_p50);
        m.num("op_ns_p99", r.op_p99);
        if (r.min_capacity) {
          m.integer("min_capacity_bytes", r.min_capacity);
          m.num("min_capacity_over_requested", ratio(r.min_capacity, t.peak_requested));
          m.integer("min_capacity_probes", static_cast<std::uint64_t>(r.min_capacity_probes));
        }
        if (r.is_pool) {
          m.integer("segments_after", r.stats_all.segment_count);
          m.integer("reserved_after", r.stats_all.reserved_bytes);
          m.integer("cache_hits", r.stats_all.cache_hits);
          m.integer("cache_misses", r.stats_all.cache_misses);
          m.integer("upstream_allocations", r.stats_all.upstream_allocations);
          m.integer("upstream_frees", r.stats_all.upstream_frees);
          m.integer("pages_moved", r.stats_all.pages_moved);
          m.integer("oom_events", r.stats_all.oom_events);
          m.integer("upstream_allocations_first_pass", r.stats_first.upstream_allocations);
          m.integer("pages_moved_first_pass", r.stats_first.pages_moved);
          m.num("warm_maps_per_kop", r.warm_maps_per_kop);
          m.boolean("books_consistent", r.books_consistent);
          m.str("books", r.books);
        }
      }
      modes_json.push_back(m.dump(6));
      if (!r.error.empty() || !r.books_consistent) failed = true;
      const double all_ratio = ratio(r.peak_reserved_all, t.peak_requested);
      if (max_ratio > 0 && r.ran && r.mode.rfind("sim", 0) == 0 && !(all_ratio <= max_ratio)) {
        std::fprintf(stderr, "  %s: %s reserved %.3f x peak requested, over --max-ratio %.3f\n",
                     t.name.c_str(), r.mode.c_str(), all_ratio, max_ratio);
        failed = true;
      }
      if (!r.error.empty()) std::fprintf(stderr, "  %s: %s failed: %s\n", t.name.c_str(), r.mode.c_str(), r.error.c_str());
      if (!r.books_consistent) std::fprintf(stderr, "  %s: %s books: %s\n", t.name.c_str(), r.mode.c_str(), r.books.c_str());
      lines.push_back(Line{t.name, r.mode, &t, std::move(r)});
    }
    tj.raw("modes", json_array(modes_json, 4));
    if (!frontier_json.empty()) {
      tj.num("map_cost_us", map_cost_us);
      tj.raw("frontier", json_array(frontier_json, 4));
    }
    json_traces.push_back(tj.dump(2));
  }

  // ---- table
  std::printf("\nPeak reserved vs peak requested / allocated (first replay on a fresh pool; "
              "'all' = after all passes)\n");
  std::printf("%-26s %-18s %10s %10s %10s %9s %10s %9s %9s %10s %10s %7s %7s %8s %11s\n", "trace", "mode",
              "peak req", "peak alloc", "peak resv", "resv/req", "resv/alloc", "all:r/req",
              "mincap/rq", "cold ns/op", "warm ns/op", "op p50", "op p99", "maps/kop", "torch r/a");
  for (const Line& l : lines) {
    const ModeResult& r = l.r;
    double tr = meta_ratio(*l.t, "torch_max_memory_reserved", "torch_max_memory_allocated");
    double te = meta_ratio(*l.t, "torch_expandable_max_memory_reserved",
                           "torch_expandable_max_memory_allocated");
    std::string torch = fmt_ratio(tr);
    if (std::isfinite(te)) torch += "/" + fmt_ratio(te);
    if (!r.ran) {
      std::printf("%-26s %-18s   %s\n", l.trace.c_str(), l.mode.c_str(),
                  (!r.error.empty() ? "FAILED: " + r.error : "skipped: " + r.skipped).c_str());
      continue;
    }
    char maps[32];
    std::snprintf(maps, sizeof maps, "%.2f", r.warm_maps_per_kop);
    std::printf("%-26s %-18s %10s %10s %10s %9s %10s %9s %9s %10s %10s %7s %7s %8s %11s\n", l.trace.c_str(),
                l.mode.c_str(), human_size(l.t->peak_requested).c_str(),
                human_size(r.peak_allocated_first).c_str(), human_size(r.peak_reserved_first).c_str(),
                fmt_ratio(ratio(r.peak_reserved_first, l.t->peak_requested)).c_str(),
                fmt_ratio(ratio(r.peak_reserved_first, r.peak_allocated_first)).c_str(),
                fmt_ratio(ratio(r.peak_reserved_all, l.t->peak_requested)).c_str(),
                r.min_capacity ? fmt_ratio(ratio(r.min_capacity, l.t->peak_requested)).c_str() : "-",
                fmt_ns(r.times.cold_ns_per_op).c_str(), fmt_ns(r.warm.median).c_str(),
                fmt_ns(r.op_p50).c_str(), fmt_ns(r.op_p99).c_str(), r.is_pool ? maps : "-", torch.c_str());
  }
  std::printf("(mincap/rq: the least simulated device capacity in which the pool runs the trace,"
              " releasing its cache when the upstream refuses, over peak requested)\n");
  std::printf("(maps/kop: pages mapped, made or moved, per 1000 operations of the warm passes)\n");
  std::printf("(op p50 / p99: one more warm pass, each operation timed alone, the clock's cost taken off)\n");
  std::printf("(torch r/a: PyTorch's own max_memory_reserved / max_memory_allocated for the recorded run,"
              " then with expandable_segments, where the trace carries them)\n");

  if (!frontier.empty()) {
    std::printf("\nFrontier: reserved over requested (all passes) against the warm mean operation and page maps"
                " (simulated upstream; dev ns/op = sim ns/op + maps/kop x %.0f us)\n", map_cost_us);
    std::printf("%-26s %-26s %9s %10s %9s %11s\n", "trace", "setting", "all:r/req", "sim ns/op", "maps/kop",
                "dev ns/op~");
    for (const Reference& ref : references) {
      const Trace& t = *ref.t;
      for (const FrontierPoint& p : frontier) {
        if (p.trace != t.name) continue;
        char setting[64];
        std::snprintf(setting, sizeof setting, "%s, slack %.3f", p.layout.c_str(), p.slack);
        if (!p.ran) {
          std::printf("%-26s %-26s   FAILED: %s\n", t.name.c_str(), setting, p.error.c_str());
          continue;
        }
        std::printf("%-26s %-26s %9s %10s %9.2f %11s\n", t.name.c_str(), setting, fmt_ratio(p.ratio_all).c_str(),
                    fmt_ns(p.warm_ns).c_str(), p.maps_per_kop, fmt_ns(device_estimate_ns(p, map_cost_us)).c_str());
      }
      if (std::isfinite(ref.async_ratio)) {
        std::printf("%-26s %-26s %9s %10s %9s %11s\n", t.name.c_str(), "cudaMallocAsync (device)",
                    fmt_ratio(ref.async_ratio).c_str(), "-", "-", fmt_ns(ref.async_warm_ns).c_str());
      }
      const double torch_default = meta_ratio(t, "torch_max_memory_reserved", "torch_peak_requested");
      const double torch_expandable =
          meta_ratio(t, "torch_expandable_max_memory_reserved", "torch_expandable_peak_requested");
      if (std::isfinite(torch_default)) {
        std::printf("%-26s %-26s %9s %10s %9s %11s\n", t.name.c_str(), "PyTorch (recorded)",
                    fmt_ratio(torch_default).c_str(), "-", "-", "-");
      }
      if (std::isfinite(torch_expandable)) {
        std::printf("%-26s %-26s %9s %10s %9s %11s\n", t.name.c_str(), "PyTorch expandable (rec.)",
                    fmt_ratio(torch_expandable).c_str(), "-", "-", "-");
      }
    }
    std::printf("(PyTorch rows: its max_memory_reserved over its peak requested bytes for the recorded run;"
                " cudaMallocAsync: ReservedMemHigh over peak requested and its warm ns/op, device mode only)\n");
  }

  if (!json_path.empty()) {
    JsonObject config;
    config.str("mode", mode);
    config.integer("warm_passes", static_cast<std::uint64_t>(passes));
    config.integer("sim_capacity_bytes", capacity);
    config.boolean("async_reference", async_reference);
    config.boolean("min_capacity_search", search_min_capacity);
    config.str("segments", segments);
    if (!frontier_slacks.empty()) {
      std::vector<std::string> slacks;
      for (double v : frontier_slacks) slacks.push_back(fmt_ratio(v));
      config.raw("frontier_slacks", "[" + [&] {
        std::string joined;
        for (std::size_t i = 0; i < slacks.size(); ++i) joined += (i ? ", " : "") + slacks[i];
        return joined;
      }() + "]");
      config.num("map_cost_us", map_cost_us);
    }
    config.str("peak_requested", "peak of the sum of live requested sizes, from the trace");
    config.str("peak_allocated", "pool: peak of live block bytes (256-byte rounding); cudaMallocAsync: UsedMemHigh");
    config.str("peak_reserved", "pool: peak of segment bytes held from the upstream; cudaMallocAsync: ReservedMemHigh");
    JsonObject root;
    root.str("benchmark", "trace_replay");
    root.raw("environment", environment_json().dump(2));
    root.raw("config", config.dump(2));
    root.str("note", note);
    root.raw("traces", json_array(json_traces, 2));
    if (!write_json_report(json_path, root.dump())) return 1;
  }
  return failed ? 1 : 0;
}
