// An upstream adaptor that refuses allocations on purpose, for tests: every Nth call, or
// each call with a probability (deterministic for a seed), or both.
//
// A refusal is what an exhausted upstream does (allocate returns nullptr, create_page
// returns 0), so the pool's release-and-retry path, its reclaim callbacks and its
// AllocationError run as they would at a real out-of-memory. Pages of expandable
// segments go through the same plan. RMM's failure-callback adaptor is the model: wrap
// any resource, forward everything else unchanged.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper {

struct FaultPlan {
  std::uint64_t every_nth = 0;  // refuse calls N, 2N, 3N, ... (0: none by count)
  double probability = 0.0;     // refuse each call with this probability, in [0, 1]
  std::uint64_t seed = 1;       // the same seed refuses the same calls
};

class FaultInjectingResource final : public MemoryResource {
 public:
  // Throws InvalidInputError for a null upstream or a probability outside [0, 1].
  FaultInjectingResource(std::unique_ptr<MemoryResource> upstream, FaultPlan plan);
  ~FaultInjectingResource() override;

  void* allocate(std::size_t bytes, stream_t stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  ResourceKind kind() const noexcept override { return upstream_->kind(); }
  int device() const noexcept override { return upstream_->device(); }
  bool stream_ordered() const noexcept override { return upstream_->stream_ordered(); }
  bool device_accessible() const noexcept override { return upstream_->device_accessible(); }
  bool host_accessible() const noexcept override { return upstream_->host_accessible(); }
  MemoryInfo memory_info() const override { return upstream_->memory_info(); }
  VirtualMemory* virtual_memory() override;

  // Injection can be paused (a test's clean-up phase) and resumed.
  void set_enabled(bool enabled) noexcept { enabled_.store(enabled, std::memory_order_relaxed); }
  // Calls decided (allocations and pages), and how many of them were refused on purpose.
  std::uint64_t calls() const noexcept { return calls_.load(std::memory_order_relaxed); }
  std::uint64_t injected() const noexcept { return injected_.load(std::memory_order_relaxed); }
  // Bytes handed out and not yet given back, and pages made and not yet released: both
  // must be zero once the pool is gone.
  std::int64_t outstanding_bytes() const noexcept { return outstanding_.load(std::memory_order_relaxed); }
  std::int64_t outstanding_pages() const noexcept { return pages_.load(std::memory_order_relaxed); }

 private:
  class Pages;
  bool refuse_next() noexcept;

  std::unique_ptr<MemoryResource> upstream_;
  FaultPlan plan_;
  std::once_flag pages_once_;
  std::unique_ptr<Pages> pages_vm_;
  std::atomic<bool> enabled_{true};
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> injected_{0};
  std::atomic<std::int64_t> outstanding_{0};
  std::atomic<std::int64_t> pages_{0};
};

}  // namespace gpukeeper
