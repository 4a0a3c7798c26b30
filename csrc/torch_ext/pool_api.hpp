// The functions gpukeeper's module (_core) hands to its PyTorch allocator component.
//
// The component (allocator.cpp and its neighbours) is built against the installed
// PyTorch's headers and is a CUDAAllocator to PyTorch; the pools behind it live in _core,
// which is built without PyTorch. _core hands the component this table once
// (gpukeeper_torch_pool_api(), called from Python with the address), so that both
// modules share one set of pools and neither links the other. Both are C++ built by the
// same compiler against the same libstdc++, so the table carries C++ types; errors
// other than an allocation's cross it as std::exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpukeeper/memory/pool_history.hpp"

namespace gpukeeper::torch_api {

// Raised with every change to the table's layout (or to PoolHistory's); the component
// refuses another.
constexpr std::uint32_t kVersion = 4;

// PyTorch's MempoolId_t: (0, n) for its graphs' pools, (n, 0) for user pools.
using PoolId = std::pair<std::uint64_t, std::uint64_t>;

enum class Status : int { ok = 0, out_of_memory = 1, invalid = 2 };

struct LiveBlock {
  void* ptr = nullptr;
  std::size_t size = 0;       // as the pool holds it (rounded)
  std::size_t requested = 0;  // as asked for
  void* stream = nullptr;     // cudaStream_t
};

struct BlockEntry {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // 0 for free blocks
  bool allocated = false;
};

struct SegmentEntry {
  PoolId pool{0, 0};  // {0, 0}: the main pool
  std::uintptr_t address = 0;
  std::size_t size = 0;
  void* stream = nullptr;
  bool small = false;
  bool expandable = false;
  std::vector<BlockEntry> blocks;
};

// A block in an expandable range, as CUDA IPC sends it: the pages under it.
struct SharedPages {
  void* first_page = nullptr;  // the address of the first page
  std::size_t page_size = 0;
  std::vector<int> fds;  // this process's descriptors, open while the pages live
};

// Where the pools behind PyTorch report their segment events: `kind` 0 a segment taken
// from the driver, 1 given back, 2 a page mapped at `address`, 3 unmapped from it; `pool`
// {0, 0} for the main pool, else the private pool's id. Called while the pool holds its
// lock, as PyTorch calls its trace trackers: the sink must not call into the pools.
using SegmentSink = void (*)(int device, PoolId pool, int kind, std::uintptr_t address,
                             std::size_t size, void* stream);

struct Api {
  std::uint32_t version = kVersion;
  std::uint32_t size = sizeof(Api);

  // The hot path: a block of `bytes` on `stream` (a capture's private pool while one is
  // routed there), or nullptr with `status` and `error` set. Never throws.
  void* (*allocate)(std::size_t bytes, int device, void* stream, Status* status,
                    std::string* error) = nullptr;
  // Returns a block to whichever of the device's pools handed it out: false, changing
  // nothing, when none of them did. Never throws.
  bool (*deallocate)(void* ptr, int device) = nullptr;

  // Books and limits.
  std::size_t (*largest_free)(int device) = nullptr;  // the largest block given without growing
  bool (*segment_of)(void* ptr, int device, void** base, std::size_t* size, bool* expandable) = nullptr;
  // CUDA IPC of a block in an expandable range: false when `ptr` starts no live block in
  // an expandable range of the device's pools; throws (std::exception) where its pages
  // cannot be shared.
  bool (*share_pages)(void* ptr, int device, SharedPages* out) = nullptr;
  // Maps pages that process `pid` shares (its descriptor numbers `fds`) at a new range of
  // this process; the range goes when the last owner lets go. Throws with the cause and
  // the remedy where the system refuses.
  std::shared_ptr<void> (*import_pages)(int device, int pid, const std::vector<int>& fds,
                                        std::size_t page_size) = nullptr;
  // The books of the device's pools, graph pools included, summed (totals() applied).
  void (*history)(int device, PoolHistory* out) = nullptr;
  void (*reset)(int device, bool peaks, bool accumulated) = nullptr;
  std::size_t (*release_cache)(int device) = nullptr;  // device -1: every device
  // The cached memory of one private pool (a CUDA graph's or a MemPool's) on every device,
  // where no graph uses it any more; bytes released.
  std::size_t (*release_pool_cache)(PoolId id) = nullptr;
  void (*set_fraction)(int device, double fraction) = nullptr;
  double (*fraction)(int device) = nullptr;
  std::vector<SegmentEntry> (*segments)(int device) = nullptr;
  // Sends every pool's segment events to `sink` from now on (nullptr: to nobody).
  void (*watch_segments)(SegmentSink sink) = nullptr;
  // The pool holding the live block at `ptr`: false when none of the device's pools does.
  bool (*pool_of)(void* ptr, int device, PoolId* out) = nullptr;
  std::size_t (*total_memory)(int device) = nullptr;

  // CUDA graphs' private pools (graph_pools.hpp).
  void (*begin_pool)(int device, PoolId id, std::function<bool(void*)> filter) = nullptr;
  void (*end_pool)(int device, PoolId id) = nullptr;
  void (*release_pool)(int device, PoolId id) = nullptr;
  int (*pool_uses)(int device, PoolId id) = nullptr;  // -1: no such pool
  std::vector<LiveBlock> (*pool_live_blocks)(int device, PoolId id) = nullptr;
  std::vector<void*> (*restore_pool)(int device, PoolId id, const std::vector<LiveBlock>& blocks) = nullptr;
};

}  // namespace gpukeeper::torch_api
