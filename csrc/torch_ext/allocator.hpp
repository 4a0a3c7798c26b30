// gpukeeper's pools as PyTorch's CUDA allocator: a CUDAAllocator built against the
// installed PyTorch's headers, so that everything PyTorch asks of its allocator from C++
// (cuDNN's cacheInfo, CUDA graph trees' pool checks and checkpoints, CUDA IPC, memory
// history and snapshots, the OOM observer, device stats) has an answer. The pools are
// _core's, reached through the table in pool_api.hpp.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "torch_ext/history.hpp"
#include "torch_ext/pool_api.hpp"
#include "torch_ext/stream_uses.hpp"
#include "torch_ext/torch_version.hpp"

namespace gpukeeper::torch_ext {

namespace cca = c10::cuda::CUDACachingAllocator;

class Allocator final : public cca::CUDAAllocator {
 public:
  explicit Allocator(const torch_api::Api* api);

  // ---- c10::Allocator
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // ---- allocation outside tensors (cuBLAS and cuDNN workspaces, NCCL, extensions)
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;

  // ---- setup, limits, books
  void init(int device_count) override;
  bool initialized() override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
#if GPUKEEPER_TORCH_AT_LEAST(2, 10)
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;
#endif
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
#if GPUKEEPER_TORCH_AT_LEAST(2, 11)
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
#else
  // 2.9 and 2.10 always include the traces.
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id) override { return snapshot(mempool_id, true); }
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces);
#endif

  // ---- CUDA graphs' private pools, and CUDA graph trees' checks and checkpoints
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;

  // ---- CUDA IPC (ipc.cpp)
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // ---- memory history (history.cpp) and observers
  bool isHistoryEnabled() override;
#if GPUKEEPER_TORCH_AT_LEAST(2, 11)
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override;
#else
  // 2.9 and 2.10 have no skip_actions: every action is recorded.
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clear_history) override {
    recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, {});
  }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions);
#endif
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;
#if GPUKEEPER_TORCH_AT_LEAST(2, 12)
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override;
#endif

  // ---- peers
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override;
  std::string name() override;

  // Where _core's pools report their segment events (pool_api.hpp's SegmentSink): to the
  // memory history and the trace trackers, as PyTorch's allocator records its own.
  static void segment_event(int device, torch_api::PoolId pool, int kind, std::uintptr_t address,
                            std::size_t size, void* stream);

  // The deleter of every DataPtr this allocator makes (a plain function, as PyTorch's
  // graph trees compare deleters to tell its storages from others).
  static void delete_block(void* ptr);

 private:
  void* malloc_block(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream);
  void free_block(void* ptr);
  [[noreturn]] void raise_oom(size_t nbytes, c10::DeviceIndex device, const std::string& detail);
  static torch_api::PoolId to_id(c10::MempoolId_t id) { return {id.first, id.second}; }

  const torch_api::Api* api_;
  std::atomic<bool> initialized_{false};
  int device_count_ = 0;

  MemoryHistory history_;
  StreamUses uses_;

  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trace_trackers_;
  std::atomic<bool> has_trackers_{false};  // spares segment events the lock until one is attached
};

}  // namespace gpukeeper::torch_ext
