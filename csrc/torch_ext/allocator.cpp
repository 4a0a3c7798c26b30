// The component's allocator: allocation, books, limits, graph pools and checkpoints
// (see allocator.hpp). IPC: ipc.cpp; history: history.cpp; record_stream: stream_uses.cpp.
#include "torch_ext/allocator.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>

#include "gpukeeper/core/text.hpp"

namespace gpukeeper::torch_ext {

namespace {

Allocator* g_allocator = nullptr;  // set once installed; never destroyed (tensors die late)

// A graph tree's checkpoint of one private pool: its live blocks at that point.
struct PoolCheckpoint final : cca::AllocatorState {
  c10::DeviceIndex device = 0;
  torch_api::PoolId id{0, 0};
  std::vector<torch_api::LiveBlock> blocks;
};

c10::DeviceIndex current_device() {
  c10::DeviceIndex device = -1;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

void fill(c10::CachingAllocator::StatArray& array, const StatFamily& family) {
  auto set = [](c10::CachingAllocator::Stat& stat, const StatCounter& c) {
    stat.current = static_cast<std::int64_t>(c.current);
    stat.peak = static_cast<std::int64_t>(c.peak);
    stat.allocated = static_cast<std::int64_t>(c.allocated);
    stat.freed = static_cast<std::int64_t>(c.freed);
  };
  using c10::CachingAllocator::StatType;
  set(array[static_cast<std::size_t>(StatType::AGGREGATE)], family.all);
  set(array[static_cast<std::size_t>(StatType::SMALL_POOL)], family.small);
  set(array[static_cast<std::size_t>(StatType::LARGE_POOL)], family.large);
}

}  // namespace

Allocator::Allocator(const torch_api::Api* api) : api_(api) {}

// ---------------------------------------------------------------- allocation

void* Allocator::malloc_block(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors
  if (uses_.any()) {
    uses_.poll([this](void* p) { free_block(p); }, false);
  }
  torch_api::Status status = torch_api::Status::ok;
  std::string error;
  void* ptr = api_->allocate(nbytes, device, stream, &status, &error);
  if (ptr == nullptr) {
    if (status == torch_api::Status::out_of_memory) raise_oom(nbytes, device, error);
    TORCH_CHECK(false, "gpukeeper: ", error);
  }
  if (history_.enabled()) {
    torch_api::PoolId pool{0, 0};
    api_->pool_of(ptr, device, &pool);  // a capture's private pool names itself in the trace
    history_.on_alloc(device, ptr, nbytes, stream, pool);
  }
  return ptr;
}

void Allocator::raise_oom(size_t nbytes, c10::DeviceIndex device, const std::string& detail) {
  size_t device_free = 0;
  size_t device_total = 0;
  {
    c10::cuda::CUDAGuard guard(device);
    if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
  }
  PoolHistory books;
  api_->history(device, &books);
  const auto allocated = static_cast<int64_t>(books.allocated_bytes.all.current);
  if (history_.enabled()) history_.on_event(TraceAction::OOM, device, device_free, nbytes, nullptr);
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    observers = oom_observers_;
  }
  for (const auto& observer : observers) {
    observer(device, static_cast<size_t>(allocated), device_total, device_free);
  }
  // PyTorch's wording first: code that recognises an OOM by its text (accelerate's
  // should_reduce_batch_size, many training scripts) looks for "CUDA out of memory.".
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                   detail::human_bytes(nbytes), ". gpukeeper: ", detail);
}

void Allocator::free_block(void* ptr) {
  if (history_.enabled()) history_.on_free(ptr);
  const int count = std::max(device_count_, 1);
  // Frees run in destructors, also while the process exits and the CUDA runtime is
  // unloading: nothing here may throw. The current device is only where to look first.
  int first = 0;
  if (cudaGetDevice(&first) != cudaSuccess) {
    (void)cudaGetLastError();
    first = 0;
  }
  if (api_->deallocate(ptr, first)) return;
  for (int d = 0; d < count; ++d) {
    if (d != first && api_->deallocate(ptr, d)) return;
  }
}

void Allocator::delete_block(void* ptr) {
  if (ptr == nullptr || g_allocator == nullptr) return;
  Allocator& self = *g_allocator;
  try {
    if (self.uses_.any()) {
      if (self.uses_.defer_free(ptr)) return;
      self.uses_.poll([&self](void* p) { self.free_block(p); }, false);
    }
    self.free_block(ptr);
  } catch (const std::exception& e) {
    // A deleter runs inside destructors: an escaping error would end the process. The
    // block stays out of use, which is safe; say so once.
    TORCH_WARN_ONCE("gpukeeper: a block could not be returned to its pool: ", e.what());
  }
}

c10::DataPtr Allocator::allocate(size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  void* ptr = malloc_block(nbytes, device, stream);
  return {ptr, ptr, &Allocator::delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr Allocator::raw_deleter() const { return &Allocator::delete_block; }

void Allocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

void* Allocator::raw_alloc(size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  return malloc_block(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* Allocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  return malloc_block(nbytes, current_device(), stream);
}

void Allocator::raw_delete(void* ptr) { delete_block(ptr); }

// ---------------------------------------------------------------- setup, limits, books

void Allocator::init(int device_count) {
  device_count_ = device_count;
  g_allocator = this;
  api_->watch_segments(&Allocator::segment_event);
  initialized_.store(true, std::memory_order_release);
}

void Allocator::segment_event(int device, torch_api::PoolId pool, int kind, std::uintptr_t address,
                              std::size_t size, void* stream) {
  Allocator* self = g_allocator;
  if (self == nullptr) return;
  const bool recording = self->history_.enabled();
  const bool tracking = self->has_trackers_.load(std::memory_order_acquire);
  if (!recording && !tracking) return;
  static constexpr TraceAction kActions[] = {TraceAction::SEGMENT_ALLOC, TraceAction::SEGMENT_FREE,
                                             TraceAction::SEGMENT_MAP, TraceAction::SEGMENT_UNMAP};
  if (kind < 0 || kind > 3) return;
  const TraceAction action = kActions[kind];
  try {
    if (recording) self->history_.on_event(action, device, address, size, stream, pool);
    if (tracking) {
      std::vector<cca::AllocatorTraceTracker> trackers;
      {
        std::lock_guard<std::mutex> lock(self->observers_mutex_);
        trackers = self->trace_trackers_;
      }
      const TraceEntry entry = MemoryHistory::entry(action, device, address, size, stream, pool);
      for (const auto& tracker : trackers) tracker(entry);
    }
  } catch (const std::exception& e) {
    // Called inside a pool's books: an escaping error would leave them half-written.
    TORCH_WARN_ONCE("gpukeeper: a segment event could not be recorded: ", e.what());
  }
}

bool Allocator::initialized() { return initialized_.load(std::memory_order_acquire); }

double Allocator::getMemoryFraction(c10::DeviceIndex device) { return api_->fraction(device); }

void Allocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  try {
    api_->set_fraction(device, fraction);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
}

#if GPUKEEPER_TORCH_AT_LEAST(2, 10)
std::vector<cca::StreamSegmentSize> Allocator::getExpandableSegmentSizes(c10::DeviceIndex device) {
  // The expandable ranges of the main pool, each with the bytes blocks tile in it.
  std::vector<cca::StreamSegmentSize> sizes;
  for (const torch_api::SegmentEntry& seg : api_->segments(device)) {
    if (!seg.expandable || seg.pool.first != 0 || seg.pool.second != 0) continue;
    sizes.emplace_back(static_cast<cudaStream_t>(seg.stream), seg.small, seg.size);
  }
  return sizes;
}
#endif

void Allocator::enable(bool) {}  // always on: PyTorch calls this only to switch its own off

bool Allocator::isEnabled() const { return true; }

void Allocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  // What cuDNN may take for a workspace without the pool growing: the largest cached
  // free block, as PyTorch's own allocator answers (it adds the device's free memory only
  // when its cache is empty, which the pool's next segment would then come from).
  size_t largest = api_->largest_free(device);
  if (largest == 0) {
    size_t device_free = 0;
    size_t device_total = 0;
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &device_total));
    largest = device_free;
  }
  *largest_block = std::max(*largest_block, largest);
}

void* Allocator::getBaseAllocation(void* ptr, size_t* size) {
  cudaPointerAttributes attributes{};
  C10_CUDA_CHECK(cudaPointerGetAttributes(&attributes, ptr));
  void* base = nullptr;
  bool expandable = false;
  TORCH_CHECK(api_->segment_of(ptr, attributes.device, &base, size, &expandable),
              "gpukeeper: ", ptr, " is not memory of gpukeeper's pools");
  return base;
}

void Allocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (ptr.get() == nullptr || ptr.get_deleter() != &Allocator::delete_block) return;
  // The block's own stream is not kept here; the pool knows it. Recording the current
  // stream as its own is harmless: a stream equal to it adds nothing.
  uses_.record(ptr.get(), nullptr, stream.stream());
}

void Allocator::emptyCache(c10::MempoolId_t mempool_id) {
  if (uses_.any()) uses_.poll([this](void* p) { free_block(p); }, true);
  if (mempool_id.first == 0 && mempool_id.second == 0) {
    api_->release_cache(-1);
  } else {
    // One private pool: its cache goes once no graph may replay from it.
    api_->release_pool_cache(to_id(mempool_id));
  }
}

c10::CachingDeviceAllocator::DeviceStats Allocator::getDeviceStats(c10::DeviceIndex device) {
  PoolHistory h;
  api_->history(device, &h);
  c10::CachingDeviceAllocator::DeviceStats s;
  fill(s.allocation, h.allocations);
  fill(s.segment, h.segments);
  fill(s.active, h.allocations);  // a block is active while allocated: frees are not deferred
  fill(s.inactive_split, h.inactive_splits);
  fill(s.allocated_bytes, h.allocated_bytes);
  fill(s.reserved_bytes, h.reserved_bytes);
  fill(s.active_bytes, h.allocated_bytes);
  fill(s.inactive_split_bytes, h.inactive_split_bytes);
  fill(s.requested_bytes, h.requested_bytes);
  s.num_alloc_retries = static_cast<int64_t>(h.alloc_retries);
  s.num_ooms = static_cast<int64_t>(h.ooms);
  s.num_sync_all_streams = static_cast<int64_t>(h.device_syncs);
  s.num_device_alloc = static_cast<int64_t>(h.device_allocs);
  s.num_device_free = static_cast<int64_t>(h.device_frees);
  return s;
}

void Allocator::resetAccumulatedStats(c10::DeviceIndex device) { api_->reset(device, false, true); }

void Allocator::resetPeakStats(c10::DeviceIndex device) { api_->reset(device, true, false); }

cca::SnapshotInfo Allocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  cca::SnapshotInfo info;
  const bool one_pool = mempool_id.first != 0 || mempool_id.second != 0;
  for (int d = 0; d < std::max(device_count_, 1); ++d) {
    for (const torch_api::SegmentEntry& seg : api_->segments(d)) {
      if (one_pool && (seg.pool.first != mempool_id.first || seg.pool.second != mempool_id.second)) {
        continue;
      }
      SegmentInfo out;
      out.device = static_cast<c10::DeviceIndex>(d);
      out.address = seg.address;
      out.total_size = seg.size;
      out.stream = static_cast<cudaStream_t>(seg.stream);  // cudaStream_t before 2.11
      out.is_large = !seg.small;
      out.is_expandable = seg.expandable;
      out.owner_private_pool_id = {seg.pool.first, seg.pool.second};
      for (const torch_api::BlockEntry& b : seg.blocks) {
        BlockInfo block;
        block.size = b.size;
        block.requested_size = b.requested;
        block.allocated = b.allocated;
        block.active = b.allocated;
        if (b.allocated) {
          out.allocated_size += b.size;
          out.active_size += b.size;
          out.requested_size += b.requested;
          block.context_when_allocated = history_.context_of(reinterpret_cast<void*>(b.address));
        }
        out.blocks.push_back(std::move(block));
      }
      info.segments.push_back(std::move(out));
    }
  }
  if (include_traces) info.device_traces = history_.traces(device_count_);
  else info.device_traces.resize(static_cast<std::size_t>(std::max(device_count_, 1)));
  info.config_metadata.garbage_collection_threshold = 0.0;
  info.config_metadata.max_split_size = std::numeric_limits<size_t>::max();
  info.config_metadata.expandable_segments = false;
  info.config_metadata.last_allocator_settings = "gpukeeper";
  return info;
}

// ---------------------------------------------------------------- CUDA graphs

void Allocator::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                    std::function<bool(cudaStream_t)> filter) {
  try {
    api_->begin_pool(device, to_id(mempool_id), [filter = std::move(filter)](void* s) {
      return filter(static_cast<cudaStream_t>(s));
    });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
}

void Allocator::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  try {
    api_->end_pool(device, to_id(mempool_id));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
}

void Allocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  try {
    api_->release_pool(device, to_id(mempool_id));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
}

int Allocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  return std::max(api_->pool_uses(device, to_id(mempool_id)), 0);
}

bool Allocator::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                         const std::unordered_set<void*>& expected) {
  if (api_->pool_uses(device, to_id(mempool_id)) < 0) return expected.empty();
  std::vector<torch_api::LiveBlock> live;
  try {
    live = api_->pool_live_blocks(device, to_id(mempool_id));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
  if (live.size() != expected.size()) return false;
  for (const auto& b : live) {
    if (expected.count(b.ptr) == 0) return false;
  }
  return true;
}

std::shared_ptr<cca::AllocatorState> Allocator::getCheckpointState(c10::DeviceIndex device,
                                                                   c10::MempoolId_t id) {
  auto state = std::make_shared<PoolCheckpoint>();
  state->device = device;
  state->id = to_id(id);
  try {
    state->blocks = api_->pool_live_blocks(device, state->id);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
  return state;
}

cca::CheckpointDelta Allocator::setCheckpointPoolState(c10::DeviceIndex device,
                                                       std::shared_ptr<cca::AllocatorState> pps) {
  auto* state = dynamic_cast<PoolCheckpoint*>(pps.get());
  TORCH_CHECK(state != nullptr, "gpukeeper: the checkpoint was not made by gpukeeper's allocator");
  TORCH_CHECK(state->device == device, "gpukeeper: a checkpoint of device ", state->device,
              " cannot be set on device ", device);
  cca::CheckpointDelta delta;
  try {
    delta.ptrs_freed = api_->restore_pool(device, state->id, state->blocks);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
  for (const auto& b : state->blocks) {
    delta.dataptrs_allocd.emplace_back(b.ptr, b.ptr, &Allocator::delete_block,
                                       c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

// ---------------------------------------------------------------- history and observers

bool Allocator::isHistoryEnabled() { return history_.enabled(); }

void Allocator::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                              size_t alloc_trace_max_entries, cca::RecordContext when,
                              bool clear_history, const std::vector<std::string>& skip_actions) {
  history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clear_history,
                     skip_actions);
}

void Allocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

void Allocator::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  // Trackers hear of segments taken and given back and of pages mapped and unmapped (what
  // PyTorch's NCCL buffer registration acts on); allocations and frees reach the memory
  // history alone, which keeps the hot path free of calls.
  std::lock_guard<std::mutex> lock(observers_mutex_);
  trace_trackers_.push_back(std::move(tracker));
  has_trackers_.store(true, std::memory_order_release);
}

#if GPUKEEPER_TORCH_AT_LEAST(2, 12)
void Allocator::attachOomRejectionObserver(cca::OomRejectionObserver) {
  // gpukeeper never rejects an allocation ahead of the driver: nothing to observe.
}
#endif

// ---------------------------------------------------------------- peers

void Allocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  c10::cuda::CUDAGuard guard(dev);
  const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    C10_CUDA_CHECK(err);
  }
}

cudaError_t Allocator::memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                                   size_t count, cudaStream_t stream, bool p2p_enabled) {
  // Blocks of expandable ranges are mapped pages, which a plain device-to-device copy
  // between devices reaches only through peer access: without it, cudaMemcpyPeerAsync
  // stages the copy, as PyTorch's own allocator does for its expandable segments.
  if (p2p_enabled || dst_device == src_device) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

std::string Allocator::name() { return "gpukeeper"; }

}  // namespace gpukeeper::torch_ext
