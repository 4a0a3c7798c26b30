// Randomized multithreaded stress of the caching pool, over every usable kind of memory.
//
// Threads allocate and free random sizes (256 B to 64 MiB) in random order on several
// streams (on the GPU: the legacy default stream and three created ones; on the host,
// stream ids 0..3, which host memory ignores). A checker thread calls validate() while
// they run. Between rounds, with all threads stopped, the test checks that no two live
// blocks overlap, that the statistics equal the sums over the live blocks, and then
// deals the live blocks out afresh so that blocks are freed by other threads than the
// ones that allocated them. Host-visible blocks carry a tag in their first and last
// byte, checked when they are freed, so that an overlap also shows as a clobbered tag.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpukeeper/memory/fault_injecting_resource.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::FaultInjectingResource;
using gpukeeper::FaultPlan;

namespace {

struct LiveBlock {
  void* ptr;
  std::size_t size;
  stream_t stream;
  unsigned char tag;
};

struct StressConfig {
  int threads = 4;
  int rounds = 8;
  int ops_per_round = 20000;  // per thread
  double min_log2 = 8.0;     // 256 B
  double max_log2 = 26.0;    // 64 MiB
  std::size_t cap_per_thread = 256 * MiB;  // live bytes
  int alloc_percent = 55;
  // With an upstream that refuses on purpose: AllocationError is an allowed outcome
  // (counted), any other exception is not.
  bool refusals_allowed = false;
  // Per mille of operations that are instead a trim() or an emergency_cleanup().
  int maintenance_permille = 0;
  // The pool's limit (0: none); the checker fails the run if reserved ever exceeds it.
  std::size_t limit = 0;
};

struct Worker {
  std::mt19937_64 rng;
  std::vector<LiveBlock> live;
  std::size_t live_bytes = 0;
  std::string error;  // the first thing that went wrong (Catch's macros are not thread-safe)
  std::size_t allocations = 0, frees = 0, refusals = 0, maintenance = 0;
};

class Stress {
 public:
  Stress(std::shared_ptr<CachingPool> pool, StressConfig cfg, std::vector<stream_t> streams)
      : pool_(std::move(pool)), cfg_(cfg), streams_(std::move(streams)) {
    host_pattern_ = pool_->upstream().host_accessible();
#ifdef GPUKEEPER_WITH_CUDA
    // Real work on the streams for device memory: a memset ordered on the block's stream.
    device_work_ = !pool_->upstream().host_accessible() && pool_->upstream().device_accessible();
#endif
    workers_.resize(cfg_.threads);
    for (int t = 0; t < cfg_.threads; ++t) workers_[t].rng.seed(1000 + t);
  }

  std::size_t random_size(std::mt19937_64& rng) const {
    double e = std::uniform_real_distribution<double>(cfg_.min_log2, cfg_.max_log2)(rng);
    auto size = static_cast<std::size_t>(std::pow(2.0, e));
    std::size_t lo = static_cast<std::size_t>(std::pow(2.0, cfg_.min_log2));
    std::size_t hi = static_cast<std::size_t>(std::pow(2.0, cfg_.max_log2));
    return std::min(hi, std::max(lo, size));
  }

  void allocate_one(Worker& w, int thread, int op) {
    std::size_t size = random_size(w.rng);
    if (w.live_bytes + size > cfg_.cap_per_thread) {
      free_one(w);
      return;
    }
    stream_t stream = streams_[w.rng() % streams_.size()];
    void* p = nullptr;
    try {
      p = pool_->allocate(size, stream);
    } catch (const AllocationError&) {
      if (cfg_.refusals_allowed) {
        ++w.refusals;
        return;
      }
      w.error = "allocate(" + std::to_string(size) + ") was refused";
      return;
    } catch (const std::exception& e) {
      w.error = "allocate(" + std::to_string(size) + ") threw: " + e.what();
      return;
    }
    if (p == nullptr || addr(p) % CachingPool::kAlignment != 0) {
      w.error = "allocate(" + std::to_string(size) + ") gave a null or misaligned pointer";
      return;
    }
    auto tag = static_cast<unsigned char>((thread * 61 + op * 7) % 255 + 1);
    if (host_pattern_) {
      static_cast<unsigned char*>(p)[0] = tag;
      static_cast<unsigned char*>(p)[size - 1] = tag;
    }
#ifdef GPUKEEPER_WITH_CUDA
    if (device_work_) {
      cudaError_t err = cudaMemsetAsync(p, tag, std::min(size, 1 * MiB),
                                        reinterpret_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) {
        w.error = std::string("cudaMemsetAsync failed: ") + cudaGetErrorString(err);
        return;
      }
    }
#endif
    w.live.push_back({p, size, stream, tag});
    w.live_bytes += size;
    ++w.allocations;
  }

  void free_one(Worker& w) {
    if (w.live.empty()) return;
    std::size_t i = w.rng() % w.live.size();
    LiveBlock b = w.live[i];
    w.live[i] = w.live.back();
    w.live.pop_back();
    w.live_bytes -= b.size;
    if (host_pattern_) {
      const auto* bytes = static_cast<const unsigned char*>(b.ptr);
      if (bytes[0] != b.tag || bytes[b.size - 1] != b.tag) {
        w.error = "block at " + std::to_string(addr(b.ptr)) + " of " + std::to_string(b.size) +
                  " bytes was overwritten (another live block overlaps it)";
        return;
      }
    }
    try {
      switch (w.rng() % 8) {
        case 0:
        case 1:
        case 2: pool_->deallocate(b.ptr); break;
        case 3:
        case 4: pool_->deallocate_checked(b.ptr, b.size); break;
        case 5:
          // Hand the block to another stream. With device work queued on the block's own
          // stream, that would break the contract, so there it stays on its stream.
          pool_->deallocate(b.ptr, device_work_ ? b.stream : streams_[w.rng() % streams_.size()]);
          break;
        default: pool_->deallocate(b.ptr, b.stream); break;
      }
    } catch (const std::exception& e) {
      w.error = "deallocate of a live block threw: " + std::string(e.what());
      return;
    }
    ++w.frees;
  }

  void run_round(bool free_everything) {
    std::atomic<bool> stop{false};
    std::atomic<bool> checking{false};  // the workers start once the checker runs
    std::string checker_error;
    std::size_t checks = 0;
    std::thread checker([&] {
      // validate() takes the pool's lock, so its books must agree at any moment.
      while (!stop.load()) {
        std::string problems = pool_->validate();
        PoolStats s = pool_->stats();
        ++checks;
        checking = true;
        if (!problems.empty()) {
          checker_error = "validate() during the run: " + problems;
          return;
        }
        if (cfg_.limit != 0 && s.reserved_bytes > cfg_.limit) {
          checker_error = "reserved " + std::to_string(s.reserved_bytes) + " bytes, over the limit " +
                          std::to_string(cfg_.limit);
          return;
        }
        if (s.largest_free_block > s.cached_bytes || s.fragmentation() < 0.0 ||
            s.fragmentation() > 1.0) {
          checker_error = "inconsistent snapshot: largest free block above cached bytes";
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < cfg_.threads; ++t) {
      threads.emplace_back([this, t, free_everything, &checking] {
        while (!checking.load()) std::this_thread::yield();
        Worker& w = workers_[t];
        if (free_everything) {
          while (!w.live.empty() && w.error.empty()) free_one(w);
          return;
        }
        for (int op = 0; op < cfg_.ops_per_round && w.error.empty(); ++op) {
          if (cfg_.maintenance_permille > 0 && static_cast<int>(w.rng() % 1000) < cfg_.maintenance_permille) {
            maintain(w);
            continue;
          }
          bool alloc = w.live.empty() || static_cast<int>(w.rng() % 100) < cfg_.alloc_percent;
          if (alloc) {
            allocate_one(w, t, op);
          } else {
            free_one(w);
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    stop = true;
    checker.join();
    for (int t = 0; t < cfg_.threads; ++t) {
      INFO("thread " << t);
      REQUIRE(workers_[t].error == "");
    }
    REQUIRE(checker_error == "");
    REQUIRE(checks > 0);
  }

  // A trim to a random level or an emergency_cleanup, racing the other threads.
  void maintain(Worker& w) {
    try {
      if (w.rng() % 2 == 0) {
        pool_->emergency_cleanup();
      } else {
        pool_->trim(static_cast<std::size_t>(w.rng() % (512 * MiB)));
      }
      ++w.maintenance;
    } catch (const std::exception& e) {
      w.error = std::string("trim/emergency_cleanup threw: ") + e.what();
    }
  }

  std::size_t total(std::size_t Worker::*field) const {
    std::size_t sum = 0;
    for (const auto& w : workers_) sum += w.*field;
    return sum;
  }

  // All threads stopped: the live blocks are exactly what the pool's books say.
  void checkpoint() {
#ifdef GPUKEEPER_WITH_CUDA
    if (device_work_) REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#endif
    std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
    std::size_t allocated = 0, requested = 0;
    for (auto& w : workers_) {
      for (auto& b : w.live) {
        ranges.emplace_back(addr(b.ptr), round_up(b.size));
        allocated += round_up(b.size);
        requested += b.size;
      }
    }
    REQUIRE(find_overlap(ranges) == "");
    PoolStats s = pool_->stats();
    REQUIRE(s.allocated_count == ranges.size());
    REQUIRE(s.allocated_bytes == allocated);
    REQUIRE(s.requested_bytes == requested);
    REQUIRE(s.reserved_bytes >= s.allocated_bytes);
    REQUIRE(s.peak_allocated_bytes >= s.allocated_bytes);
    REQUIRE(s.peak_reserved_bytes >= s.reserved_bytes);
    REQUIRE(pool_->validate() == "");
    std::size_t unknown = 0;
    for (auto& w : workers_) {
      for (auto& b : w.live) {
        if (!pool_->owns(b.ptr) || pool_->requested_size(b.ptr) != b.size) ++unknown;
      }
    }
    REQUIRE(unknown == 0);
  }

  // Deals all live blocks out again at random, so that other threads free them.
  void redeal(std::mt19937_64& rng) {
    std::vector<LiveBlock> all;
    for (auto& w : workers_) {
      all.insert(all.end(), w.live.begin(), w.live.end());
      w.live.clear();
      w.live_bytes = 0;
    }
    std::shuffle(all.begin(), all.end(), rng);
    for (std::size_t i = 0; i < all.size(); ++i) {
      Worker& w = workers_[i % workers_.size()];
      w.live.push_back(all[i]);
      w.live_bytes += all[i].size;
    }
  }

  void run() {
    std::mt19937_64 rng(7);
    for (int r = 0; r < cfg_.rounds; ++r) {
      INFO("round " << r);
      run_round(false);
      checkpoint();
      redeal(rng);
    }
    std::size_t allocations = 0;
    for (auto& w : workers_) allocations += w.allocations;
    REQUIRE(allocations > static_cast<std::size_t>(cfg_.threads * cfg_.rounds));

    run_round(true);  // every thread frees what it holds, all at once
#ifdef GPUKEEPER_WITH_CUDA
    if (device_work_) REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#endif
    PoolStats s = pool_->stats();
    REQUIRE(s.allocated_bytes == 0);
    REQUIRE(s.allocated_count == 0);
    REQUIRE(s.requested_bytes == 0);
    REQUIRE(s.cached_bytes == s.reserved_bytes);
    REQUIRE(pool_->validate() == "");

    const std::size_t reserved = s.reserved_bytes;
    REQUIRE(pool_->emergency_cleanup() == reserved);
    s = pool_->stats();
    REQUIRE(s.reserved_bytes == 0);
    REQUIRE(s.segment_count == 0);
    REQUIRE(s.largest_free_block == 0);
    REQUIRE(s.upstream_frees == s.upstream_allocations);
    REQUIRE(pool_->validate() == "");
  }

 private:
  std::shared_ptr<CachingPool> pool_;
  StressConfig cfg_;
  std::vector<stream_t> streams_;
  std::vector<Worker> workers_;
  bool host_pattern_ = false;
  bool device_work_ = false;
};

// Streams for the stress: the legacy default stream and three created ones on a GPU;
// plain integers on the host (host memory ignores streams, the pool's books do not).
class StressStreams {
 public:
  explicit StressStreams(ResourceKind kind) {
    ids_.push_back(0);
#ifdef GPUKEEPER_WITH_CUDA
    if (kind != ResourceKind::host) {
      for (int i = 0; i < 3; ++i) {
        cudaStream_t s = nullptr;
        REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
        created_.push_back(s);
        ids_.push_back(reinterpret_cast<stream_t>(s));
      }
      return;
    }
#endif
    (void)kind;
    for (stream_t s = 1; s <= 3; ++s) ids_.push_back(s);
  }
  ~StressStreams() {
#ifdef GPUKEEPER_WITH_CUDA
    for (void* s : created_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
#endif
  }
  const std::vector<stream_t>& ids() const { return ids_; }

 private:
  std::vector<stream_t> ids_;
  std::vector<void*> created_;
};

// The pool under stress: plain segments, or expandable ones (address ranges with pages
// mapped under allocated blocks) where the kind offers virtual memory. Null, with *why
// saying why, when it does not.
std::shared_ptr<CachingPool> stress_pool(ResourceKind kind, bool expandable, std::string* why) {
  PoolOptions options;
  options.segments = expandable ? SegmentLayout::expandable : SegmentLayout::fixed;
  try {
    return std::make_shared<CachingPool>(gpukeeper::make_resource(kind, 0), options);
  } catch (const GpuError& e) {
    if (!expandable) throw;
    *why = std::string("expandable segments on ") + gpukeeper::to_string(kind) +
           " memory: " + e.what();
    return nullptr;
  }
}

}  // namespace

TEST_CASE("stress: random sizes 256 B - 64 MiB, 4 threads, 4 streams", "[stress]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  const bool expandable = GENERATE(false, true);
  INFO("expandable segments: " << expandable);
  StressStreams streams(kind);  // outlives the pool, which may use them to its end
  std::string why;
  auto pool = stress_pool(kind, expandable, &why);
  if (!pool) GK_SKIP(why);
  StressConfig cfg;
  if (kind != ResourceKind::host) cfg.rounds = 4;  // each op also queues device work
  Stress(pool, cfg, streams.ids()).run();
  pool.reset();
}

TEST_CASE("stress: small blocks, 8 threads, high churn", "[stress]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  const bool expandable = GENERATE(false, true);
  INFO("expandable segments: " << expandable);
  StressStreams streams(kind);
  std::string why;
  auto pool = stress_pool(kind, expandable, &why);
  if (!pool) GK_SKIP(why);
  StressConfig cfg;
  cfg.threads = 8;
  cfg.rounds = 4;
  cfg.ops_per_round = kind == ResourceKind::host ? 60000 : 20000;
  cfg.min_log2 = 0.0;   // 1 byte
  cfg.max_log2 = 16.0;  // 64 KiB
  cfg.cap_per_thread = 8 * MiB;
  Stress(pool, cfg, streams.ids()).run();
  pool.reset();
}

// Operations for the fault-injection stress: GPUKEEPER_STRESS_OPS (the GPU round sets 10
// million per memory kind), else a bound that keeps CI short.
int stress_ops(int fallback) {
  const char* env = std::getenv("GPUKEEPER_STRESS_OPS");
  if (env == nullptr || *env == '\0') return fallback;
  const long long n = std::atoll(env);
  return n > 0 ? static_cast<int>(std::min<long long>(n, 1000000000LL)) : fallback;
}

// GPUKEEPER_STRESS_KINDS ("host,device", say) keeps the fault stress to those memory kinds,
// so that the GPU round runs one process per kind side by side; unset means all.
bool stress_kind_selected(ResourceKind kind) {
  const char* env = std::getenv("GPUKEEPER_STRESS_KINDS");
  if (env == nullptr || *env == '\0') return true;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + gpukeeper::to_string(kind) + ",") != std::string::npos;
}

TEST_CASE("stress: injected upstream faults, 8 threads, limit, cleanup and reclaim racing",
          "[stress]") {
  // The upstream refuses every 11th call and 2% of the others at random; the pool has a
  // limit, reclaim callbacks run when it is short, and workers trim or empty it while the
  // others allocate. A fixed-segment pool reuses its cache so well that a CI-sized run may
  // reach its upstream fewer than 100 times (92 once): the period must be short enough that
  // every run meets a refusal, whatever the scheduling. After every round the books must still equal the live blocks; every
  // failure must be AllocationError; reserved never exceeds the limit.
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  if (!stress_kind_selected(kind)) GK_SKIP("not in GPUKEEPER_STRESS_KINDS");
  GK_SKIP_UNLESS_USABLE(kind);
  // Fixed segments, every class expandable, and hybrid (the default over device memory).
  const SegmentLayout layout =
      GENERATE(SegmentLayout::fixed, SegmentLayout::expandable, SegmentLayout::hybrid);
  INFO("segments: " << gpukeeper::to_string(layout));
  if (layout != SegmentLayout::fixed && kind != ResourceKind::host && kind != ResourceKind::device) {
    GK_SKIP("expandable segments need device or host memory");
  }
  StressStreams streams(kind);
  FaultPlan plan;
  plan.every_nth = 11;
  plan.probability = 0.02;
  plan.seed = 2026;
  PoolOptions options;
  options.segments = layout;
  auto faults = std::make_unique<FaultInjectingResource>(gpukeeper::make_resource(kind, 0), plan);
  FaultInjectingResource* injector = faults.get();
  std::shared_ptr<CachingPool> pool;
  try {
    pool = std::make_shared<CachingPool>(std::move(faults), options);
  } catch (const GpuError& e) {
    GK_SKIP(std::string("expandable segments: ") + e.what());
  }
  std::atomic<int> reclaims{0};
  pool->add_reclaim_callback([&](std::size_t) {
    ++reclaims;
    return std::size_t{0};
  });
  StressConfig cfg;
  cfg.threads = 8;
  cfg.rounds = 4;
  // GPUKEEPER_STRESS_OPS counts per memory kind: host and device memory split it between
  // their three layouts. The CI bound (unset) counts per run.
  const bool three_layouts = kind == ResourceKind::host || kind == ResourceKind::device;
  const int total_ops = std::getenv("GPUKEEPER_STRESS_OPS") != nullptr && three_layouts
                            ? stress_ops(0) / 3
                            : stress_ops(kind == ResourceKind::host ? 320000 : 160000);
  cfg.ops_per_round = std::max(1000, total_ops / (cfg.threads * cfg.rounds));
  cfg.max_log2 = 24.0;  // 16 MiB
  cfg.cap_per_thread = 96 * MiB;
  cfg.limit = 512 * MiB;  // below the 768 MiB that 8 threads may hold at once: it bites
  cfg.refusals_allowed = true;
  cfg.maintenance_permille = 2;
  pool->set_limit(cfg.limit);
  Stress stress(pool, cfg, streams.ids());
  stress.run();
  INFO("upstream calls " << injector->calls() << ", refused on purpose " << injector->injected());
  CHECK(injector->injected() > 0);
  CHECK(stress.total(&Worker::maintenance) > 0);
  CHECK(pool->stats().reserved_bytes == 0);  // run() ends with an emergency_cleanup
  CHECK(injector->outstanding_bytes() == 0);
  CHECK(injector->outstanding_pages() == 0);
  WARN("fault stress (" << gpukeeper::to_string(kind) << ", " << gpukeeper::to_string(layout)
       << "): " << stress.total(&Worker::allocations) << " allocations, " << stress.total(&Worker::frees)
       << " frees, " << stress.total(&Worker::refusals) << " refused (AllocationError), "
       << injector->injected() << " upstream calls refused on purpose of " << injector->calls()
       << ", " << stress.total(&Worker::maintenance) << " trims/cleanups, " << reclaims.load()
       << " reclaim calls");
  pool.reset();
}

TEST_CASE("stress: a tight limit, with reclaim callbacks racing the threads", "[stress]") {
  // Growth fails often; the pool releases its cache and runs callbacks concurrently with
  // other threads' frees. Allocation errors are allowed here, broken books are not.
  const bool expandable = GENERATE(false, true);
  INFO("expandable segments: " << expandable);
  std::string why;
  auto pool = stress_pool(ResourceKind::host, expandable, &why);
  if (!pool) GK_SKIP(why);
  pool->set_limit(192 * MiB);
  std::atomic<int> reclaims{0};
  pool->add_reclaim_callback([&](std::size_t) {
    ++reclaims;
    return std::size_t{0};
  });
  std::vector<std::thread> threads;
  std::atomic<int> errors{0}, failures{0};
  std::vector<std::string> first_error(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(77 + t);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int op = 0; op < 20000; ++op) {
        if (live.empty() || rng() % 100 < 55) {
          double exponent = std::uniform_real_distribution<double>(8.0, 25.0)(rng);
          auto size = static_cast<std::size_t>(std::pow(2.0, exponent));
          try {
            live.emplace_back(pool->allocate(size, t), size);
          } catch (const AllocationError&) {
            ++failures;
          } catch (const std::exception& e) {
            ++errors;
            first_error[t] = e.what();
          }
        } else {
          std::size_t i = rng() % live.size();
          try {
            pool->deallocate_checked(live[i].first, live[i].second);
          } catch (const std::exception& e) {
            ++errors;
            first_error[t] = e.what();
          }
          live[i] = live.back();
          live.pop_back();
        }
      }
      for (auto& b : live) pool->deallocate(b.first);
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : first_error) REQUIRE(e == "");
  REQUIRE(errors == 0);
  PoolStats s = pool->stats();
  INFO("allocation failures " << failures.load() << ", reclaim calls " << reclaims.load());
  REQUIRE(s.reserved_bytes <= 192 * MiB);
  REQUIRE(s.peak_reserved_bytes <= 192 * MiB);
  REQUIRE(s.allocated_bytes == 0);
  REQUIRE(s.allocated_count == 0);
  REQUIRE(pool->validate() == "");
  REQUIRE(failures > 0);  // the limit was tight enough to matter
  REQUIRE(reclaims.load() > 0);
  pool->emergency_cleanup();
  REQUIRE(pool->stats().reserved_bytes == 0);
}
