#include "gpukeeper/timing/stream_gate.hpp"

#include <atomic>
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

// The slots of one device, carved from pinned host-mapped chunks that live until the
// process ends (a chunk may still be read by a queued kernel at any time before that).
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

 private:
  static constexpr std::size_t kSlotsPerChunk = 64;
  // Flag and outcome of a slot share one 16-byte cell; cells never share a word.
  static constexpr std::size_t kCellBytes = 16;

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

  void grow() {
#ifdef GPUKEEPER_WITH_CUDA
    detail::DeviceGuard guard(device_);
    void* host = nullptr;
    GK_CUDA_CHECK(cudaHostAlloc(&host, kSlotsPerChunk * kCellBytes,
                                cudaHostAllocMapped | cudaHostAllocPortable));
    void* dev = nullptr;
    cudaError_t status = cudaHostGetDevicePointer(&dev, host, 0);
    if (status != cudaSuccess) {
      (void)cudaFreeHost(host);
      detail::check_cuda(status, "cudaHostGetDevicePointer");
    }
    auto slots = std::make_unique<StreamGate::Slot[]>(kSlotsPerChunk);
    idle_.reserve(idle_.size() + kSlotsPerChunk);
    retiring_.reserve(created_ + kSlotsPerChunk);
    for (std::size_t i = 0; i < kSlotsPerChunk; ++i) {
      auto* h = reinterpret_cast<std::uint32_t*>(static_cast<char*>(host) + i * kCellBytes);
      auto* d = reinterpret_cast<std::uint32_t*>(static_cast<char*>(dev) + i * kCellBytes);
      StreamGate::Slot& s = slots[i];
      s.host_flag = h;
      s.host_outcome = h + 1;
      s.device_flag = d;
      s.device_outcome = d + 1;
      s.pool = this;
      idle_.push_back(&s);
    }
    created_ += kSlotsPerChunk;
    chunks_.push_back(std::move(slots));
#else
    throw DeviceError("StreamGate", 0, "unavailable", "gpukeeper was built without CUDA");
#endif
  }

  int device_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<StreamGate::Slot[]>> chunks_;
  std::vector<StreamGate::Slot*> idle_;
  std::vector<StreamGate::Slot*> retiring_;
  std::size_t created_ = 0;
};

namespace {

GateSlotPool& slot_pool(int device) {
  static std::mutex mutex;
  static std::vector<GateSlotPool*> pools;  // by device id; never freed (see GateSlotPool)
  std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(device + 1, nullptr);
  if (pools[device] == nullptr) pools[device] = new GateSlotPool(device);
  return *pools[device];
}

}  // namespace

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
                      "gpukeeper was built without nvcc: there is no gate kernel");
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

}  // namespace gpukeeper
