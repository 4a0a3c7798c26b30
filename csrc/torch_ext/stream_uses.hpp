// Blocks used on streams other than their own (Tensor.record_stream): their frees wait
// until the work queued on those streams at the time of the free is done.
//
// A block is ordered on the stream it was allocated on; PyTorch's record_stream(s) says
// that work on stream s uses it too. When such a block is freed, an event is recorded
// on each of those streams and the block goes back to the pool only once they have all
// completed (looked at on later allocations and frees, and waited for by emptyCache).
// While one of those streams captures a CUDA graph no event can be recorded on it: the
// block then waits until the capture is over.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gpukeeper::torch_ext {

class StreamUses {
 public:
  using Release = std::function<void(void* ptr)>;

  // Notes that `stream` uses block `ptr`, allocated on `own_stream`.
  void record(void* ptr, cudaStream_t own_stream, cudaStream_t stream);
  // Whether any block has uses recorded: the free path's one check when none has.
  bool any() const noexcept { return active_.load(std::memory_order_acquire) != 0; }
  // Takes the free of `ptr`: true when it must wait (release runs later), false when the
  // block has no other stream and the caller frees it now.
  bool defer_free(void* ptr);
  // Releases the deferred blocks whose streams are done (all of them, waiting, with
  // `wait`).
  void poll(const Release& release, bool wait);

 private:
  struct Deferred {
    void* ptr;
    std::vector<cudaStream_t> streams;  // not yet given an event (capturing at the free)
    std::vector<cudaEvent_t> events;
  };
  static bool record_events(Deferred& d);

  std::mutex mutex_;
  std::unordered_map<void*, std::vector<cudaStream_t>> uses_;
  std::vector<Deferred> deferred_;
  std::atomic<std::size_t> active_{0};  // uses_.size() + deferred_.size()
};

}  // namespace gpukeeper::torch_ext
