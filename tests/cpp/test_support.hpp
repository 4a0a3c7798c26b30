// Shared helpers of the C++ tests: the kinds of memory to run over, a test-only upstream
// that counts, checks and refuses on demand, and checks of a pool's books.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/caching_pool.hpp"
#include "gpukeeper/memory/host_resource.hpp"
#include "gpukeeper/memory/resource.hpp"

namespace gktest {

using gpukeeper::AllocationError;
using gpukeeper::CachingPool;
using gpukeeper::GpuError;
using gpukeeper::InvalidInputError;
using gpukeeper::MemoryInfo;
using gpukeeper::MemoryResource;
using gpukeeper::PoolOptions;
using gpukeeper::PoolStats;
using gpukeeper::ResourceKind;
using gpukeeper::SegmentLayout;
using gpukeeper::stream_t;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

inline std::size_t round_up(std::size_t value, std::size_t to = CachingPool::kAlignment) {
  return (value + to - 1) / to * to;
}

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

inline const std::vector<ResourceKind>& all_kinds() {
  static const std::vector<ResourceKind> kinds = {ResourceKind::host, ResourceKind::device,
                                                  ResourceKind::async, ResourceKind::pinned};
  return kinds;
}

// Whether `kind` works on device 0 here; when it does not, *why says why.
inline bool kind_usable(ResourceKind kind, std::string* why) {
  return gpukeeper::resource_available(kind, 0, why);
}

// In a test case: skips it (GK_SKIP, catch.hpp) when `kind` is not usable on this machine.
#define GK_SKIP_UNLESS_USABLE(kind)                                                    \
  do {                                                                                 \
    std::string gk_why_;                                                               \
    if (!::gktest::kind_usable((kind), &gk_why_)) {                                    \
      GK_SKIP(::gpukeeper::to_string(kind) << " memory: " << gk_why_);                 \
    }                                                                                  \
  } while (0)

// In a test case: skips it unless CUDA is usable (a CUDA build, a driver, a device).
#define GK_SKIP_UNLESS_CUDA()                                                          \
  do {                                                                                 \
    auto gk_status_ = ::gpukeeper::cuda_status();                                      \
    if (!gk_status_.available) GK_SKIP("CUDA unavailable: " << gk_status_.reason);     \
  } while (0)

// Options for cases whose numbers are those of fixed segments (sizes, counts, release):
// PoolOptions{} is hybrid over device memory (test_pool_layout.cpp), whose ranges and
// pages test_caching_pool_expandable.cpp counts.
inline PoolOptions fixed_segments() {
  PoolOptions options;
  options.segments = SegmentLayout::fixed;
  return options;
}

inline std::shared_ptr<CachingPool> make_pool(ResourceKind kind, PoolOptions options = {}) {
  return std::make_shared<CachingPool>(gpukeeper::make_resource(kind, 0), options);
}

// What an upstream saw; shared so that tests can read it after the pool is gone.
struct UpstreamLog {
  std::mutex mutex;
  std::map<std::uintptr_t, std::pair<std::size_t, stream_t>> outstanding;  // ptr -> (bytes, stream)
  std::size_t used = 0;           // bytes outstanding
  std::size_t allocations = 0;    // successful allocate calls
  std::size_t deallocations = 0;
  std::size_t refusals = 0;       // allocate calls answered with nullptr
  std::vector<std::size_t> requests;  // every allocate call's size, in order
  std::vector<std::string> contract_breaches;  // deallocate calls not matching an allocate

  std::size_t used_now() {
    std::lock_guard<std::mutex> lock(mutex);
    return used;
  }
};

// A test-only upstream: wraps another one (plain host memory by default), refuses any
// allocation that would take its outstanding bytes beyond `capacity` (0: no cap), and
// records every call, checking that each deallocate matches an allocate in pointer,
// size and stream. memory_info() reports the capacity as the total (or {0, 0}, "not
// known", with report_memory = false).
class TestUpstream final : public MemoryResource {
 public:
  explicit TestUpstream(std::size_t capacity, std::unique_ptr<MemoryResource> inner = nullptr,
                        bool report_memory = true)
      : inner_(inner ? std::move(inner) : std::make_unique<gpukeeper::HostResource>()),
        capacity_(capacity),
        report_memory_(report_memory),
        log_(std::make_shared<UpstreamLog>()) {}

  const std::shared_ptr<UpstreamLog>& log() const { return log_; }
  void set_capacity(std::size_t capacity) {
    std::lock_guard<std::mutex> lock(log_->mutex);
    capacity_ = capacity;
  }

  void* allocate(std::size_t bytes, stream_t stream) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->requests.push_back(bytes);
    if (capacity_ != 0 && (bytes > capacity_ || log_->used + bytes > capacity_)) {
      ++log_->refusals;
      return nullptr;
    }
    void* p = inner_->allocate(bytes, stream);
    if (p == nullptr) {
      ++log_->refusals;
      return nullptr;
    }
    log_->outstanding[addr(p)] = {bytes, stream};
    log_->used += bytes;
    ++log_->allocations;
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto it = log_->outstanding.find(addr(ptr));
    if (it == log_->outstanding.end()) {
      log_->contract_breaches.push_back("deallocate of unknown pointer");
      return;
    }
    if (it->second.first != bytes || it->second.second != stream) {
      log_->contract_breaches.push_back("deallocate with size " + std::to_string(bytes) +
                                        " / stream " + std::to_string(stream) + " for a block of " +
                                        std::to_string(it->second.first) + " / stream " +
                                        std::to_string(it->second.second));
    }
    log_->used -= it->second.first;
    ++log_->deallocations;
    // The stream the pool named, not the one recorded at allocation: that one may be dead
    // (the pool waits for the device and frees on the default stream then).
    inner_->deallocate(ptr, it->second.first, stream);
    log_->outstanding.erase(it);
  }

  ResourceKind kind() const noexcept override { return inner_->kind(); }
  int device() const noexcept override { return inner_->device(); }
  bool stream_ordered() const noexcept override { return inner_->stream_ordered(); }
  bool device_accessible() const noexcept override { return inner_->device_accessible(); }
  bool host_accessible() const noexcept override { return inner_->host_accessible(); }
  MemoryInfo memory_info() const override {
    if (!report_memory_) return {};
    if (capacity_ == 0) return inner_->memory_info();
    std::lock_guard<std::mutex> lock(log_->mutex);
    return {capacity_ - std::min(capacity_, log_->used), capacity_};
  }

 private:
  std::unique_ptr<MemoryResource> inner_;
  std::size_t capacity_;
  bool report_memory_;
  std::shared_ptr<UpstreamLog> log_;
};

// A pool over a TestUpstream of `capacity` bytes; *log gets the upstream's record.
inline std::shared_ptr<CachingPool> make_test_pool(std::size_t capacity,
                                                   std::shared_ptr<UpstreamLog>* log,
                                                   PoolOptions options = {},
                                                   bool report_memory = true) {
  auto upstream = std::make_unique<TestUpstream>(capacity, nullptr, report_memory);
  if (log) *log = upstream->log();
  return std::make_shared<CachingPool>(std::move(upstream), options);
}

// The fields that say what a pool holds (not the event counters).
struct Books {
  std::size_t allocated_bytes, allocated_count, requested_bytes, reserved_bytes, segment_count,
      limit_bytes;
  explicit Books(const PoolStats& s)
      : allocated_bytes(s.allocated_bytes),
        allocated_count(s.allocated_count),
        requested_bytes(s.requested_bytes),
        reserved_bytes(s.reserved_bytes),
        segment_count(s.segment_count),
        limit_bytes(s.limit_bytes) {}
  bool operator==(const Books& o) const {
    return allocated_bytes == o.allocated_bytes && allocated_count == o.allocated_count &&
           requested_bytes == o.requested_bytes && reserved_bytes == o.reserved_bytes &&
           segment_count == o.segment_count && limit_bytes == o.limit_bytes;
  }
};

inline std::string describe(const Books& b) {
  return "allocated " + std::to_string(b.allocated_bytes) + " B in " +
         std::to_string(b.allocated_count) + " blocks (requested " +
         std::to_string(b.requested_bytes) + "), reserved " + std::to_string(b.reserved_bytes) +
         " B in " + std::to_string(b.segment_count) + " segments, limit " +
         std::to_string(b.limit_bytes);
}

// Checks that the pool's books equal `before` and that validate() finds nothing.
#define GK_REQUIRE_BALANCED(pool, before)                                  \
  do {                                                                     \
    ::gktest::Books gk_now_((pool)->stats());                              \
    INFO("before: " << ::gktest::describe(before));                       \
    INFO("after:  " << ::gktest::describe(gk_now_));                       \
    REQUIRE(gk_now_ == (before));                                          \
    REQUIRE((pool)->validate() == "");                                     \
  } while (0)

// Runs f, which must throw E; returns the message (or a marker when it did not throw).
// Any other exception type propagates, and Catch reports it.
template <typename E, typename F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<nothing was thrown>";
}

inline bool near(double a, double b, double tolerance = 1e-9) {
  return a - b <= tolerance && b - a <= tolerance;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Live blocks as [begin, begin + size) must not overlap; returns the first overlap found.
inline std::string find_overlap(std::vector<std::pair<std::uintptr_t, std::size_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].first + ranges[i - 1].second > ranges[i].first) {
      char text[160];
      std::snprintf(text, sizeof text, "[%#zx, +%zu) overlaps [%#zx, +%zu)",
                    static_cast<std::size_t>(ranges[i - 1].first), ranges[i - 1].second,
                    static_cast<std::size_t>(ranges[i].first), ranges[i].second);
      return text;
    }
  }
  return "";
}

}  // namespace gktest
