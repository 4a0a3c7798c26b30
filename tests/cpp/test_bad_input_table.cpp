// Bad input over the whole public C++ API, as one table: each entry is a call with one bad
// argument, the gpukeeper error type it must raise, and a word of the message that names
// that argument. After each, the pool's books are as before and validate() finds nothing.
// The table runs over a busy pool of every kind of memory this machine has; the entries
// that do not touch the pool run each time too (they must leave it alone all the same).
// Sizes beyond the memory there is (AllocationError) are in test_bad_input.cpp, tagged
// [cuda_oom]; nothing here makes a CUDA call fail.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gpukeeper/memory/buffer_io.hpp"
#include "gpukeeper/memory/fault_injecting_resource.hpp"
#include "gpukeeper/memory/managed_buffer.hpp"
#include "gpukeeper/memory/pool_registry.hpp"
#include "gpukeeper/memory/precision.hpp"
#include "gpukeeper/timing/event_log.hpp"
#include "gpukeeper/timing/event_pool.hpp"
#include "gpukeeper/timing/launch_floor.hpp"
#include "gpukeeper/timing/stream_gate.hpp"
#include "gpukeeper/timing/timer.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::DeviceError;
using gpukeeper::kCpuDevice;

namespace {

constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// What an entry may touch: a pool with one live block and a cached segment, a pointer it
// handed out and took back, and a few foreign addresses.
struct Fixture {
  std::shared_ptr<CachingPool> pool;
  void* live = nullptr;   // 1000 bytes, live
  void* freed = nullptr;  // 4096 bytes, returned
  int on_stack = 0;
  explicit Fixture(ResourceKind kind) : pool(make_pool(kind)) {
    live = pool->allocate(1000);
    freed = pool->allocate(4096);
    pool->deallocate(freed);
    pool->deallocate(pool->allocate(12 * MiB));
  }
  ~Fixture() { pool->deallocate(live); }
  void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
  char* live_plus(std::size_t n) { return static_cast<char*>(live) + n; }
};

enum class Expect { invalid_input, device };

struct BadInput {
  const char* what;   // the call, as a reader would write it
  Expect expect;      // the error type
  const char* names;  // the message names the argument with this
  std::function<void(Fixture&)> call;
};

PoolOptions options(std::function<void(PoolOptions&)> change) {
  PoolOptions o;
  change(o);
  return o;
}

std::unique_ptr<gpukeeper::MemoryResource> host() {
  return std::make_unique<gpukeeper::HostResource>();
}

const std::vector<BadInput>& table() {
  using E = Expect;
  static const std::vector<BadInput> entries = {
      // ---- CachingPool::allocate: sizes
      {"allocate(0)", E::invalid_input, "0 bytes", [](Fixture& f) { f.pool->allocate(0); }},
      {"allocate(0, stream 7)", E::invalid_input, "0 bytes",
       [](Fixture& f) { f.pool->allocate(0, 7); }},
      {"allocate(SIZE_MAX)", E::invalid_input, "bytes", [](Fixture& f) { f.pool->allocate(kHuge); }},
      {"allocate(-256 as size_t)", E::invalid_input, "bytes",
       [](Fixture& f) { f.pool->allocate(static_cast<std::size_t>(-256)); }},
      {"allocate(INT64_MIN as size_t)", E::invalid_input, "bytes",
       [](Fixture& f) {
         f.pool->allocate(static_cast<std::size_t>(std::numeric_limits<std::int64_t>::min()));
       }},
      {"allocate(kMaxRequest + 1)", E::invalid_input, "bytes",
       [](Fixture& f) { f.pool->allocate(CachingPool::kMaxRequest + 1); }},
      // ---- CachingPool::deallocate: pointers it did not hand out, or took back
      {"deallocate(nullptr)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(nullptr); }},
      {"deallocate(nullptr, stream 3)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(nullptr, 3); }},
      {"deallocate(a stack address)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(&f.on_stack); }},
      {"deallocate(0x1000)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.at(0x1000)); }},
      {"deallocate(~0)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.at(~std::uintptr_t{0})); }},
      {"deallocate(inside a live block)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.live_plus(256)); }},
      {"deallocate(one byte into a live block)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.live_plus(1)); }},
      {"deallocate(a returned block): double free", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.freed); }},
      {"deallocate(a returned block, stream 0)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate(f.freed, 0); }},
      {"deallocate(a block of another pool)", E::invalid_input, "pointer",
       [](Fixture& f) {
         auto other = std::make_shared<CachingPool>(host());
         gpukeeper::ManagedBuffer theirs(other, 4096);
         f.pool->deallocate(theirs.data());
       }},
      // ---- deallocate_checked and requested_size
      {"deallocate_checked(live, 999): not the size requested", E::invalid_input, "bytes",
       [](Fixture& f) { f.pool->deallocate_checked(f.live, 999); }},
      {"deallocate_checked(live, 1024): the rounded size", E::invalid_input, "bytes",
       [](Fixture& f) { f.pool->deallocate_checked(f.live, 1024); }},
      {"deallocate_checked(live, 0)", E::invalid_input, "size 0",
       [](Fixture& f) { f.pool->deallocate_checked(f.live, 0); }},
      {"deallocate_checked(nullptr, 16)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate_checked(nullptr, 16); }},
      {"deallocate_checked(a returned block, 4096)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->deallocate_checked(f.freed, 4096); }},
      {"requested_size(nullptr)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->requested_size(nullptr); }},
      {"requested_size(a returned block)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->requested_size(f.freed); }},
      {"requested_size(inside a live block)", E::invalid_input, "pointer",
       [](Fixture& f) { f.pool->requested_size(f.live_plus(8)); }},
      // ---- limits and callbacks
      {"set_limit(1): below what is allocated", E::invalid_input, "limit",
       [](Fixture& f) { f.pool->set_limit(1); }},
      {"set_limit(allocated - 1)", E::invalid_input, "limit",
       [](Fixture& f) { f.pool->set_limit(f.pool->stats().allocated_bytes - 1); }},
      {"add_watermark(0)", E::invalid_input, "level",
       [](Fixture& f) { f.pool->add_watermark(0.0, [](double) {}); }},
      {"add_watermark(-0.5)", E::invalid_input, "level",
       [](Fixture& f) { f.pool->add_watermark(-0.5, [](double) {}); }},
      {"add_watermark(1.5)", E::invalid_input, "level",
       [](Fixture& f) { f.pool->add_watermark(1.5, [](double) {}); }},
      {"add_watermark(NaN)", E::invalid_input, "level",
       [](Fixture& f) { f.pool->add_watermark(kNaN, [](double) {}); }},
      {"add_watermark(inf)", E::invalid_input, "level",
       [](Fixture& f) { f.pool->add_watermark(HUGE_VAL, [](double) {}); }},
      {"add_watermark(0.5, an empty callback)", E::invalid_input, "callback",
       [](Fixture& f) { f.pool->add_watermark(0.5, nullptr); }},
      {"add_reclaim_callback(an empty callback)", E::invalid_input, "callback",
       [](Fixture& f) { f.pool->add_reclaim_callback(nullptr); }},
      // ---- CachingPool construction
      {"CachingPool(nullptr)", E::invalid_input, "upstream",
       [](Fixture&) { CachingPool(nullptr); }},
      {"PoolOptions.small_size = 0", E::invalid_input, "small_size",
       [](Fixture&) { CachingPool(host(), options([](PoolOptions& o) { o.small_size = 0; })); }},
      {"PoolOptions.small_size above small_segment", E::invalid_input, "small_size",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.small_size = 4 * MiB; }));
       }},
      {"PoolOptions.small_segment not a multiple of 256", E::invalid_input, "small_segment",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.small_segment = 2 * MiB + 1; }));
       }},
      {"PoolOptions.large_segment not a multiple of 256", E::invalid_input, "large_segment",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.large_segment = 20 * MiB + 100; }));
       }},
      {"PoolOptions.large_cutoff above large_segment", E::invalid_input, "large_cutoff",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.large_cutoff = 40 * MiB; }));
       }},
      {"PoolOptions.segment_granularity = 3 MiB", E::invalid_input, "segment_granularity",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.segment_granularity = 3 * MiB; }));
       }},
      {"PoolOptions.segment_granularity = 128", E::invalid_input, "segment_granularity",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.segment_granularity = 128; }));
       }},
      {"PoolOptions.segment_granularity = 0", E::invalid_input, "segment_granularity",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) { o.segment_granularity = 0; }));
       }},
      {"PoolOptions.expandable_slack = -0.1", E::invalid_input, "expandable_slack",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) {
                       o.segments = SegmentLayout::expandable;
                       o.expandable_slack = -0.1;
                     }));
       }},
      {"PoolOptions.expandable_slack = NaN", E::invalid_input, "expandable_slack",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) {
                       o.segments = SegmentLayout::expandable;
                       o.expandable_slack = kNaN;
                     }));
       }},
      {"PoolOptions.expandable_range = SIZE_MAX", E::invalid_input, "expandable_range",
       [](Fixture&) {
         CachingPool(host(), options([](PoolOptions& o) {
                       o.segments = SegmentLayout::expandable;
                       o.expandable_range = kHuge;
                     }));
       }},
      {"PoolOptions.expandable over an upstream without virtual memory", E::invalid_input,
       "expandable",
       [](Fixture&) {
         CachingPool(std::make_unique<TestUpstream>(0),
                     options([](PoolOptions& o) { o.segments = SegmentLayout::expandable; }));
       }},
      // ---- ManagedBuffer and copies
      {"ManagedBuffer(no pool, 1024)", E::invalid_input, "pool",
       [](Fixture&) { gpukeeper::ManagedBuffer(nullptr, 1024); }},
      {"ManagedBuffer(pool, 0)", E::invalid_input, "0 bytes",
       [](Fixture& f) { gpukeeper::ManagedBuffer(f.pool, 0); }},
      {"ManagedBuffer(pool, SIZE_MAX)", E::invalid_input, "bytes",
       [](Fixture& f) { gpukeeper::ManagedBuffer(f.pool, kHuge); }},
      {"copy_block(host, dst = nullptr)", E::invalid_input, "dst",
       [](Fixture& f) {
         gpukeeper::copy_block(ResourceKind::host, 0, 0, nullptr, f.live, 16);
       }},
      {"copy_block(host, src = nullptr)", E::invalid_input, "src",
       [](Fixture& f) {
         gpukeeper::copy_block(ResourceKind::host, 0, 0, f.live, nullptr, 16);
       }},
      // ---- FaultInjectingResource
      {"FaultInjectingResource(nullptr)", E::invalid_input, "upstream",
       [](Fixture&) { gpukeeper::FaultInjectingResource(nullptr, {}); }},
      {"FaultPlan.probability = -0.1", E::invalid_input, "probability",
       [](Fixture&) { gpukeeper::FaultInjectingResource(host(), {0, -0.1, 1}); }},
      {"FaultPlan.probability = 1.5", E::invalid_input, "probability",
       [](Fixture&) { gpukeeper::FaultInjectingResource(host(), {0, 1.5, 1}); }},
      {"FaultPlan.probability = NaN", E::invalid_input, "probability",
       [](Fixture&) { gpukeeper::FaultInjectingResource(host(), {0, kNaN, 1}); }},
      // ---- kinds, devices, precisions
      {"parse_resource_kind(\"gpu\")", E::invalid_input, "memory kind",
       [](Fixture&) { gpukeeper::parse_resource_kind("gpu"); }},
      {"parse_resource_kind(\"\")", E::invalid_input, "memory kind",
       [](Fixture&) { gpukeeper::parse_resource_kind(""); }},
      {"make_resource(host, 1)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::make_resource(ResourceKind::host, 1); }},
      {"make_resource(host, -1)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::make_resource(ResourceKind::host, -1); }},
      {"make_resource(device, -1)", E::invalid_input, "device -1",
       [](Fixture&) { gpukeeper::make_resource(ResourceKind::device, -1); }},
      {"make_resource(async, -3)", E::invalid_input, "device -3",
       [](Fixture&) { gpukeeper::make_resource(ResourceKind::async, -3); }},
      {"make_resource(pinned, INT_MIN)", E::invalid_input, "device",
       [](Fixture&) {
         gpukeeper::make_resource(ResourceKind::pinned, std::numeric_limits<int>::min());
       }},
      {"PoolRegistry(host).pool(-1)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::PoolRegistry(ResourceKind::host).pool(-1); }},
      {"PoolRegistry(host).pool(1)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::PoolRegistry(ResourceKind::host).pool(1); }},
      {"device_memory_info(-1)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::device_memory_info(kCpuDevice); }},
      {"parse_precision(\"fp13\")", E::invalid_input, "precision",
       [](Fixture&) { gpukeeper::parse_precision("fp13"); }},
      {"parse_precision(\"\")", E::invalid_input, "precision",
       [](Fixture&) { gpukeeper::parse_precision(""); }},
      {"bytes_for(SIZE_MAX / 4 elements, fp64)", E::invalid_input, "elements",
       [](Fixture&) { gpukeeper::bytes_for(kHuge / 4, gpukeeper::Precision::fp64); }},
      // ---- timing
      {"Timer(device -2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::Timer(-2); }},
      {"Timer(CPU, gate timeout 0)", E::invalid_input, "timeout",
       [](Fixture&) { gpukeeper::Timer(kCpuDevice, 0, true, 0); }},
      {"Timer.stop() before start()", E::invalid_input, "stop()",
       [](Fixture&) { gpukeeper::Timer(kCpuDevice).stop(); }},
      {"Timer.elapsed_ms() before start()", E::invalid_input, "elapsed_ms()",
       [](Fixture&) { gpukeeper::Timer(kCpuDevice).elapsed_ms(); }},
      {"Timer.elapsed_ms() before stop()", E::invalid_input, "stop()",
       [](Fixture&) {
         gpukeeper::Timer t(kCpuDevice);
         t.start();
         t.elapsed_ms();
       }},
      {"Timer.start() on a moved-from timer", E::invalid_input, "moved-from",
       [](Fixture&) {
         gpukeeper::Timer t(kCpuDevice);
         gpukeeper::Timer taken(std::move(t));
         t.start();  // NOLINT(bugprone-use-after-move): the misuse under test
       }},
      {"EventLog(device -2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::EventLog(-2); }},
      {"EventLog.end() without begin()", E::invalid_input, "begin()",
       [](Fixture&) { gpukeeper::EventLog(kCpuDevice).end(); }},
      {"EventLog.resolve() with an interval open", E::invalid_input, "end()",
       [](Fixture&) {
         gpukeeper::EventLog log(kCpuDevice);
         log.begin("open");
         log.resolve();
       }},
      {"StreamGate(timeout 0)", E::invalid_input, "timeout",
       [](Fixture&) { gpukeeper::StreamGate(0, 0, 0); }},
      {"StreamGate(device -2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::StreamGate(-2, 0); }},
      {"timing_uses_cuda(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::timing_uses_cuda(-2); }},
      {"synchronize_device(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::synchronize_device(-2); }},
      {"EventPool::for_device(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::EventPool::for_device(-2); }},
      {"launch_floor_ms(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::launch_floor_ms(-2); }},
      {"gate_slot_stats(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::gate_slot_stats(-2); }},
      {"release_idle_gate_slots(-2)", E::invalid_input, "device",
       [](Fixture&) { gpukeeper::release_idle_gate_slots(-2); }},
  };
  return entries;
}

const char* name(Expect e) {
  return e == Expect::invalid_input ? "InvalidInputError" : "DeviceError";
}

// Runs one entry; returns "" when it raised the expected type naming the argument, else
// what went wrong.
std::string check(const BadInput& entry, Fixture& f) {
  std::string message;
  try {
    entry.call(f);
    return "nothing was thrown";
  } catch (const InvalidInputError& e) {
    if (entry.expect != Expect::invalid_input) return std::string("InvalidInputError: ") + e.what();
    message = e.what();
  } catch (const DeviceError& e) {
    if (entry.expect != Expect::device) return std::string("DeviceError: ") + e.what();
    message = e.what();
  } catch (const GpuError& e) {
    return std::string("another GpuError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("an untyped error escaped: ") + e.what();
  }
  if (!contains(message, entry.names)) {
    return "the message does not name the argument ('" + std::string(entry.names) + "'): " + message;
  }
  return "";
}

}  // namespace

TEST_CASE("bad input: a table over the public C++ API, each a typed error naming the argument",
          "[bad_input]") {
  REQUIRE(table().size() >= 50);
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  Fixture f(kind);
  for (const BadInput& entry : table()) {
    INFO(entry.what << " -> " << name(entry.expect));
    const Books before(f.pool->stats());
    CHECK(check(entry, f) == "");
    GK_REQUIRE_BALANCED(f.pool, before);
    REQUIRE(f.pool->owns(f.live));
    REQUIRE(f.pool->requested_size(f.live) == 1000);
  }
  // The pool still works, and the returned block is still free to take.
  void* p = f.pool->allocate(4096);
  f.pool->deallocate(p);
  REQUIRE(f.pool->validate() == "");
}
