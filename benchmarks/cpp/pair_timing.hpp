// The timing loop the alloc+free pair benchmarks share (alloc_pair_bench, rmm_pair_bench):
// a planned number of timed batches per row, the mixed-sizes workload, and the rows as
// JSON. Shared so that the peers compared in separate programs are timed the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gkbench {

struct Plan {
  std::size_t batches = 101;        // timed batches per row
  std::size_t min_batches = 15;     // slow rows may drop to this many
  std::size_t max_pairs = 1000;     // pairs per batch
  double budget_ns = 1.5e9;         // rough time per row, warm-up excluded
  double warmup_ns = 20e6;          // warm-up time per row (at least 3 pairs)
  std::size_t warmup_max = 20000;   // warm-up pairs at most
};

struct Row {
  std::string allocator;  // stable key
  std::string label;      // for the table
  std::string workload;   // "256B", ..., "mixed"
  std::size_t size = 0;   // bytes (0 for mixed)
  std::vector<double> ns_per_pair;  // one per batch
  Summary summary;
  std::size_t pairs_per_batch = 0;
  std::size_t batches = 0;
  std::string error;
};

// Runs `pair()` as planned and fills the timing fields of `row`. `after_batch()` runs
// untimed after each batch (e.g. to drain a stream).
template <typename Pair, typename After>
void measure(Row& row, const Plan& plan, Pair&& pair, After&& after_batch) {
  // Warm-up in doubling chunks; the last chunk estimates the cost of one pair.
  double spent = 0, per_pair = 0;
  std::size_t done = 0;
  for (std::size_t chunk = 1;; chunk *= 2) {
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < chunk; ++i) pair();
    auto t1 = Clock::now();
    after_batch();
    double ns = elapsed_ns(t0, t1);
    spent += ns;
    done += chunk;
    per_pair = ns / static_cast<double>(chunk);
    if (done >= 3 && (spent >= plan.warmup_ns || done >= plan.warmup_max)) break;
  }
  std::size_t batches = plan.batches;
  double pairs = plan.budget_ns / (static_cast<double>(batches) * std::max(per_pair, 1.0));
  std::size_t ppb = static_cast<std::size_t>(std::max(1.0, std::min(pairs, double(plan.max_pairs))));
  if (ppb == 1) {
    double fit = plan.budget_ns / std::max(per_pair, 1.0);
    batches = std::max(plan.min_batches, std::min(batches, static_cast<std::size_t>(fit)));
  }
  row.pairs_per_batch = ppb;
  row.batches = batches;
  row.ns_per_pair.reserve(batches);
  for (std::size_t b = 0; b < batches; ++b) {
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < ppb; ++i) pair();
    auto t1 = Clock::now();
    after_batch();
    row.ns_per_pair.push_back(elapsed_ns(t0, t1) / static_cast<double>(ppb));
  }
  row.summary = summarize(row.ns_per_pair);
}

// The mixed-sizes workload: a fixed random sequence shared by every allocator.
struct MixedWorkload {
  static constexpr std::size_t kSlots = 64;
  static constexpr std::size_t kLength = 1 << 14;
  std::vector<std::size_t> sizes;     // kLength
  std::vector<std::uint32_t> slots;   // kLength
  std::vector<std::size_t> initial;   // kSlots

  explicit MixedWorkload(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> logsize(std::log(256.0), std::log(16.0 * (1 << 20)));
    std::uniform_int_distribution<std::uint32_t> slot(0, kSlots - 1);
    auto draw = [&] {
      // Element counts of 4-byte types: sizes are multiples of 4, rarely of 256.
      std::size_t n = static_cast<std::size_t>(std::exp(logsize(rng)));
      return std::max<std::size_t>(4, n / 4 * 4);
    };
    for (std::size_t i = 0; i < kSlots; ++i) initial.push_back(draw());
    for (std::size_t i = 0; i < kLength; ++i) {
      sizes.push_back(draw());
      slots.push_back(slot(rng));
    }
  }
  double mean_size() const {
    double s = 0;
    for (auto x : sizes) s += static_cast<double>(x);
    return s / static_cast<double>(sizes.size());
  }
};

// Runs the mixed workload through alloc/free callables.
template <typename Alloc, typename Free, typename After>
void measure_mixed(Row& row, const Plan& plan, const MixedWorkload& w, Alloc&& alloc, Free&& free_,
                   After&& after_batch) {
  std::vector<void*> live(MixedWorkload::kSlots, nullptr);
  std::vector<std::size_t> live_size(MixedWorkload::kSlots, 0);
  for (std::size_t i = 0; i < MixedWorkload::kSlots; ++i) {
    live[i] = alloc(w.initial[i]);
    live_size[i] = w.initial[i];
  }
  std::size_t step = 0;
  auto pair = [&] {
    std::size_t k = step++ & (MixedWorkload::kLength - 1);
    std::uint32_t s = w.slots[k];
    free_(live[s], live_size[s]);
    live[s] = alloc(w.sizes[k]);
    live_size[s] = w.sizes[k];
  };
  try {
    measure(row, plan, pair, after_batch);
  } catch (...) {
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (live[i]) free_(live[i], live_size[i]);
    }
    throw;
  }
  for (std::size_t i = 0; i < live.size(); ++i) free_(live[i], live_size[i]);
  after_batch();
}

#ifdef GPUKEEPER_WITH_CUDA
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}
#endif

// A fixed request size and its key in the table and the JSON ("256B", "64KiB", ...).
struct Size {
  std::size_t bytes;
  const char* key;
};

// The plan's options, shared by the programs so that they read alike: --batches,
// --pairs, --budget-ms, --quick. True when argv[*i] was one of them.
inline bool take_plan_arg(int argc, char** argv, int* i, Plan* plan) {
  std::string v;
  if (take_arg(argc, argv, i, "--batches", &v)) {
    plan->batches = std::max<std::size_t>(1, parse_u64(v, "--batches"));
    plan->min_batches = std::min(plan->min_batches, plan->batches);
  } else if (take_arg(argc, argv, i, "--pairs", &v)) {
    plan->max_pairs = std::max<std::size_t>(1, parse_u64(v, "--pairs"));
  } else if (take_arg(argc, argv, i, "--budget-ms", &v)) {
    plan->budget_ns = static_cast<double>(parse_u64(v, "--budget-ms")) * 1e6;
  } else if (std::string(argv[*i]) == "--quick") {
    plan->batches = 21;
    plan->min_batches = 7;
    plan->budget_ns = 0.2e9;
    plan->warmup_ns = 5e6;
  } else {
    return false;
  }
  return true;
}

// The plan as the "config" block of the JSON starts it.
inline JsonObject plan_json(const Plan& plan) {
  JsonObject config;
  config.integer("batches", plan.batches);
  config.integer("min_batches", plan.min_batches);
  config.integer("max_pairs_per_batch", plan.max_pairs);
  config.num("budget_ms_per_row", plan.budget_ns / 1e6);
  config.num("warmup_ms_per_row", plan.warmup_ns / 1e6);
  config.str("timer", "std::chrono::steady_clock around each batch");
  config.str("statistic", "mean ns per pair within a batch; median/p10/p90 across batches");
  return config;
}

// The rows as a JSON array: timing fields for a measured row, the error for a failed one.
inline std::vector<std::string> rows_json(const std::vector<Row>& rs) {
  std::vector<std::string> out;
  for (const Row& r : rs) {
    JsonObject o;
    o.str("allocator", r.allocator);
    o.str("label", r.label);
    o.str("workload", r.workload);
    o.integer("size_bytes", r.size);
    if (r.error.empty()) {
      o.summary("ns_", r.summary);
      o.integer("pairs_per_batch", r.pairs_per_batch);
      o.integer("batches", r.batches);
      o.raw("error", "null");
    } else {
      o.str("error", r.error);
    }
    out.push_back(o.dump(4));
  }
  return out;
}

}  // namespace gkbench
