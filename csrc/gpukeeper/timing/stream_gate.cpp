#include "gpukeeper/timing/stream_gate.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/timer.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

class GateSlotPool;

struct StreamGate::Slot {
  volatile std::uint32_t* host_flag = nullptr;
  volatile std::uint32_t* host_outcome = nullptr;
  const volatile std::uint32_t* device_flag = nullptr;
  volatile std::uint32_t* device_outcome = nullptr;
  GateSlotPool* pool = nullptr;
};

// The slots of one device, carved from pinned host-mapped chunks of kSlotsPerChunk cells.
// A chunk may be read by a queued gate kernel at any time until that kernel has written
// its outcome, and written by the StreamGate that holds a slot: it is freed only when all
// its slots are idle (release_idle), which happens at process exit (release_all_at_exit
// below) or when asked (release_idle_gate_slots). The pool object itself is never
// destroyed, so a StreamGate that outlives the release still finds its pool.
class GateSlotPool {
 public:
  explicit GateSlotPool(int device) : device_(device) {}

  StreamGate::Slot* acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished();
    if (idle_.empty()) grow();
    StreamGate::Slot* slot = idle_.back();
    idle_.pop_back();
    *slot->host_flag = 0;
    *slot->host_outcome = static_cast<std::uint32_t>(GateOutcome::pending);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return slot;
  }

  // The gate kernel of `slot` may still be queued: the slot waits in `retiring_` until
  // its outcome word says the kernel is done.
  void retire(StreamGate::Slot* slot) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      retiring_.push_back(slot);
    } catch (...) {
      // No memory for the list: the slot is lost (a few bytes), never reused early.
    }
  }

  // For a kernel that was never launched: nothing will write its outcome.
  void give_back_unused(StreamGate::Slot* slot) noexcept {
    *slot->host_outcome = static_cast<std::uint32_t>(GateOutcome::opened);
    retire(slot);
  }

  GateSlotStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished();
    return GateSlotStats{created_, idle_.size(), retiring_.size()};
  }

  // Frees the chunks whose slots are all idle: no gate holds one and every kernel that
  // used one was seen finished, so neither the host nor the device reads the memory
  // again. Chunks still in use stay (a gate held by a static object, a kernel still
  // queued behind other work): freeing them would be a use-after-free; they are the
  // driver's to reclaim with the context. Returns the slots freed.
  std::size_t release_idle() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished();
    std::size_t freed = 0;
    for (std::size_t c = 0; c < chunks_.size();) {
      const Chunk& chunk = chunks_[c];
      auto in_chunk = [&chunk](const StreamGate::Slot* s) {
        const auto first = reinterpret_cast<std::uintptr_t>(chunk.slots.get());
        const auto at = reinterpret_cast<std::uintptr_t>(s);
        return at >= first && at < first + kSlotsPerChunk * sizeof(StreamGate::Slot);
      };
      if (static_cast<std::size_t>(std::count_if(idle_.begin(), idle_.end(), in_chunk)) !=
          kSlotsPerChunk) {
        ++c;
        continue;
      }
      idle_.erase(std::remove_if(idle_.begin(), idle_.end(), in_chunk), idle_.end());
#ifdef GPUKEEPER_WITH_CUDA
      // cudaFreeHost waits for nothing here: no queued kernel reads this chunk. Should the
      // runtime already be unloading, the call fails and the driver frees the memory with
      // the context: nothing to report at exit.
      if (cudaFreeHost(chunk.host) != cudaSuccess) detail::clear_cuda_error();
#endif
      chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(c));
      created_ -= kSlotsPerChunk;
      freed += kSlotsPerChunk;
    }
    return freed;
  }

 private:
  static constexpr std::size_t kSlotsPerChunk = 64;
  // Flag and outcome of a slot share one 16-byte cell; cells never share a word.
  static constexpr std::size_t kCellBytes = 16;

  struct Chunk {
    void* host;  // from cudaHostAlloc, kSlotsPerChunk * kCellBytes bytes
    std::unique_ptr<StreamGate::Slot[]> slots;
  };

  void collect_finished() {
    for (std::size_t i = 0; i < retiring_.size();) {
      if (*retiring_[i]->host_outcome != static_cast<std::uint32_t>(GateOutcome::pending)) {
        idle_.push_back(retiring_[i]);
        retiring_[i] = retiring_.back();
        retiring_.pop_back();
      } else {
        ++i;
      }
    }
  }

  void grow();

  int device_;
  std::mutex mutex_;
  std::vector<Chunk> chunks_;
  std::vector<StreamGate::Slot*> idle_;
  std::vector<StreamGate::Slot*> retiring_;
  std::size_t created_ = 0;
};

namespace {

// The pools by device id. Allocated once and never destroyed: a StreamGate in a static
// object may hand its slot back during static destruction, after any destructor of ours
// would have run.
struct SlotPools {
  std::mutex mutex;
  std::vector<GateSlotPool*> by_device;
};

SlotPools& slot_pools() {
  static SlotPools* pools = new SlotPools;
  return *pools;
}

GateSlotPool& slot_pool(int device) {
  SlotPools& pools = slot_pools();
  std::lock_guard<std::mutex> lock(pools.mutex);
  auto& v = pools.by_device;
  if (v.size() <= static_cast<std::size_t>(device)) v.resize(device + 1, nullptr);
  if (v[device] == nullptr) v[device] = new GateSlotPool(device);
  return *v[device];
}

#ifdef GPUKEEPER_WITH_CUDA
// Gives the pinned chunks back at exit, so that a leak check at the end of the process
// (compute-sanitizer --leak-check full) finds none of ours.
//
// Why atexit, and why it runs while the CUDA runtime is still up: handlers registered
// with atexit and the destructors of static objects run in the reverse order of their
// registration. The runtime registers its own teardown when it is loaded or initialized;
// this handler is registered after the first cudaHostAlloc has succeeded, that is after
// the runtime was initialized, so it runs before that teardown. (A destructor of a
// function-local static made at the same point would run at the same time; atexit keeps
// the registration next to the allocation that makes it necessary.) Should the runtime
// be gone anyway, cudaFreeHost fails and release_idle ignores it: the memory goes with
// the context. Chunks still in use are kept (see release_idle). In a shared library,
// glibc ties the handler to the library, so it also runs, before unloading, on dlclose.
void release_all_at_exit() {
  SlotPools& pools = slot_pools();
  std::lock_guard<std::mutex> lock(pools.mutex);
  for (GateSlotPool* pool : pools.by_device) {
    if (pool != nullptr) pool->release_idle();
  }
}
#endif

}  // namespace

void GateSlotPool::grow() {
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device_);
  void* host = nullptr;
  GK_CUDA_CHECK(cudaHostAlloc(&host, kSlotsPerChunk * kCellBytes,
                              cudaHostAllocMapped | cudaHostAllocPortable));
  // After the runtime is initialized (see release_all_at_exit). Once per process; should
  // registration fail, the chunks stay until the context goes, as before.
  static const bool registered = std::atexit(release_all_at_exit) == 0;
  (void)registered;
  void* dev = nullptr;
  cudaError_t status = cudaHostGetDevicePointer(&dev, host, 0);
  if (status != cudaSuccess) {
    (void)cudaFreeHost(host);
    detail::check_cuda(status, "cudaHostGetDevicePointer");
  }
  std::unique_ptr<StreamGate::Slot[]> slots;
  try {
    slots = std::make_unique<StreamGate::Slot[]>(kSlotsPerChunk);
    chunks_.reserve(chunks_.size() + 1);
    idle_.reserve(idle_.size() + kSlotsPerChunk);
    retiring_.reserve(created_ + kSlotsPerChunk);  // retire() must never allocate
  } catch (...) {
    (void)cudaFreeHost(host);
    throw;
  }
  Chunk chunk{host, std::move(slots)};
  for (std::size_t i = 0; i < kSlotsPerChunk; ++i) {
    auto* h = reinterpret_cast<std::uint32_t*>(static_cast<char*>(host) + i * kCellBytes);
    auto* d = reinterpret_cast<std::uint32_t*>(static_cast<char*>(dev) + i * kCellBytes);
    StreamGate::Slot& s = chunk.slots[i];
    s.host_flag = h;
    s.host_outcome = h + 1;
    s.device_flag = d;
    s.device_outcome = d + 1;
    s.pool = this;
    idle_.push_back(&s);
  }
  created_ += kSlotsPerChunk;
  chunks_.push_back(std::move(chunk));
#else
  throw DeviceError("StreamGate", 0, "unavailable", "gpukeeper was built without CUDA");
#endif
}

bool stream_gates_available() noexcept {
  try {
    return calibration_kernels_available() && cuda_device_count() > 0;
  } catch (...) {
    return false;
  }
}

// The device must be a usable CUDA device: gates have no CPU meaning.
void require_stream_gates(int device, const char* what) {
  if (!timing_uses_cuda(device) || device < 0) {  // throws InvalidInputError for bad ids
    throw DeviceError(what, 0, "unavailable",
                      "stream gates need a usable CUDA device (device " + std::to_string(device) +
                          ")");
  }
  if (!calibration_kernels_available()) {
    throw DeviceError(what, 0, "unavailable",
                      "gpukeeper was built without CUDA: there is no gate kernel");
  }
}

StreamGate::StreamGate(int device, stream_t stream, std::uint64_t timeout_ns)
    : device_(device), stream_(stream), timeout_ns_(timeout_ns) {
  if (timeout_ns == 0) throw InvalidInputError("StreamGate timeout must be > 0 ns");
  require_stream_gates(device, "StreamGate");
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  GK_CUDA_CHECK(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    throw InvalidInputError(
        "cannot close a gate on a stream that is capturing a CUDA graph: the graph would "
        "hold a gate that nothing opens (time the graph's replay instead)");
  }
  GateSlotPool& pool = slot_pool(device);
  Slot* slot = pool.acquire();
  try {
    launch_gate_kernel(slot->device_flag, slot->device_outcome, timeout_ns, stream);
  } catch (...) {
    pool.give_back_unused(slot);
    throw;
  }
  slot_ = slot;
#endif
}

StreamGate::StreamGate(StreamGate&& other) noexcept
    : slot_(other.slot_),
      device_(other.device_),
      stream_(other.stream_),
      timeout_ns_(other.timeout_ns_),
      opened_(other.opened_) {
  other.slot_ = nullptr;
  other.opened_ = false;
}

StreamGate& StreamGate::operator=(StreamGate&& other) noexcept {
  if (this != &other) {
    reset();
    slot_ = other.slot_;
    device_ = other.device_;
    stream_ = other.stream_;
    timeout_ns_ = other.timeout_ns_;
    opened_ = other.opened_;
    other.slot_ = nullptr;
    other.opened_ = false;
  }
  return *this;
}

void StreamGate::queue_floor_kernel() {
  if (slot_ == nullptr || opened_) {
    throw InvalidInputError(
        "queue_floor_kernel needs a closed gate: a kernel queued after open() is not "
        "behind it, and its bracket would hold the launch latency");
  }
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device_);
  launch_spin_kernel(0, stream_);
#endif
}

void StreamGate::open() noexcept {
  if (slot_ == nullptr || opened_) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  *slot_->host_flag = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  opened_ = true;
}

GateOutcome StreamGate::outcome() const noexcept {
  if (slot_ == nullptr) return GateOutcome::pending;
  std::uint32_t value = *slot_->host_outcome;
  if (value == static_cast<std::uint32_t>(GateOutcome::timed_out)) return GateOutcome::timed_out;
  if (value == static_cast<std::uint32_t>(GateOutcome::opened)) return GateOutcome::opened;
  return GateOutcome::pending;
}

void StreamGate::reset() noexcept {
  if (slot_ == nullptr) return;
  open();
  slot_->pool->retire(slot_);
  slot_ = nullptr;
  opened_ = false;
}

GateSlotStats gate_slot_stats(int device) {
  require_stream_gates(device, "gate_slot_stats");
  return slot_pool(device).stats();
}

std::size_t release_idle_gate_slots(int device) {
  require_stream_gates(device, "release_idle_gate_slots");
  return slot_pool(device).release_idle();
}

}  // namespace gpukeeper
