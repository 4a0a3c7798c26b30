// The memory history PyTorch's torch.cuda.memory._record_memory_history() turns on: a
// ring of trace entries (allocations and frees with the stacks PyTorch gathers) and the
// stack that allocated each live block, for _snapshot() and memory_viz.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "torch_ext/pool_api.hpp"
#include "torch_ext/torch_version.hpp"

namespace gpukeeper::torch_ext {

namespace cca = c10::cuda::CUDACachingAllocator;

class MemoryHistory {
 public:
  // As CUDAAllocator::recordHistory. `skip_actions` names actions as PyTorch spells them
  // ("alloc", "free_requested", ...); an unknown name raises.
  void configure(bool enabled, cca::CreateContextFn recorder, std::size_t max_entries,
                 cca::RecordContext when, bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // Called on each allocation and free while enabled; they gather the stack outside the
  // lock, as the calling thread may hold the GIL the gathering needs.
  // `pool`: the pool that handed the block out ({0, 0}: the main pool), as the trace names it.
  void on_alloc(int device, void* ptr, std::size_t size, void* stream, torch_api::PoolId pool);
  // A free: its device, size and stream are those the allocation recorded.
  void on_free(void* ptr);
  void on_event(TraceAction action, int device, std::size_t addr, std::size_t size, void* stream,
                torch_api::PoolId pool = {0, 0});

  // An entry as PyTorch's trace holds it (its constructor differs between releases).
  static TraceEntry entry(TraceAction action, int device, std::size_t addr, std::size_t size,
                          void* stream, torch_api::PoolId pool,
                          std::shared_ptr<c10::GatheredContext> context = nullptr);

  // The stack that allocated a live block (nullptr when not recorded).
  std::shared_ptr<c10::GatheredContext> context_of(const void* ptr) const;
  // The traces, oldest first, one list per device (device_count lists).
  std::vector<std::vector<TraceEntry>> traces(int device_count) const;

 private:
  bool skipped(TraceAction action) const noexcept {
    return (skip_mask_ >> static_cast<unsigned>(action)) & 1u;
  }
  void append(TraceEntry entry);

  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  cca::CreateContextFn recorder_ = nullptr;
  cca::RecordContext when_ = cca::RecordContext::NEVER;
  std::size_t max_entries_ = 0;
  std::uint32_t skip_mask_ = 0;
  std::vector<TraceEntry> ring_;  // ring_[next_] is the oldest once full
  std::size_t next_ = 0;
  struct Live {
    std::shared_ptr<c10::GatheredContext> context;
    std::size_t size = 0;
    int device = 0;
    void* stream = nullptr;
    torch_api::PoolId pool{0, 0};
  };
  std::unordered_map<const void*, Live> live_;
};

}  // namespace gpukeeper::torch_ext
