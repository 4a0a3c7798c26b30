// A caching memory pool over any upstream MemoryResource.
//
//   auto pool = std::make_shared<CachingPool>(make_resource(ResourceKind::device, 0));
//   void* p = pool->allocate(1 << 20, stream);   // 256-byte aligned
//   pool->deallocate(p);                         // cached, reusable on `stream` at once
//
// Requests up to PoolOptions::small_size come from small segments and never split a
// large one. Free blocks are kept per stream: a block freed on stream A is reused on A
// at once and by another stream only once an event shows A's queued work is done.
// Neighbouring free blocks of a segment are merged a little late: a freed block is
// reusable at its own size at once, and the few blocks whose merge is pending are
// merged before any request that would split a block, once there are more than
// kMergeWindow of them, and before stats are read. Before even that, the last
// kRecentFrees freed blocks wait off the free index: a request of the same rounded size
// on the same stream takes the newest back whole, and any other request puts them all on
// their indexes first (RecentFrees). A repeated size thus costs no split, merge or index
// update, while every other placement sees free runs merged. Whole free segments go back
// to the upstream on emergency_cleanup(), trim(), a limit change, or when the upstream
// runs out.
// All members are thread-safe. Prefer ManagedBuffer (managed_buffer.hpp) to raw calls.
//
// Structure. The pool is composed of one type per concern, each with its own test, as RMM
// splits a pool's concerns into resource adaptors; here they are members, not wrappers
// around an upstream, so that the allocation path keeps one lock and no indirection:
//   - detail::PoolCounters (pool_counters.hpp): what stats() reports; written under the
//     pool's lock, read without it (relaxed atomics, inline: the fast path is unchanged);
//   - detail::PressureCallbacks (pressure_callbacks.hpp): watermark and reclaim callbacks,
//     with their own lock, run with no lock held (RMM's failure-callback adaptor);
//   - detail::PoolLimit (pool_limit.hpp): the reserved-bytes limit growth asks before it
//     takes memory, and the pressure it defines (RMM's limiting adaptor; inline reads);
//   - detail::RecentFrees (recent_frees.hpp): the last kRecentFrees freed blocks, held off
//     the free index (a fixed inline array: the fast path's first and last step);
//   - detail::PendingMerges (pending_merges.hpp): freed blocks whose merge is to come;
//   - detail::PoolAudit (pool_audit.hpp): validate()'s read-only walk of the books;
//   - the layout (pool_layout.hpp: one interface, PoolLayout, and one type per layout,
//     FixedLayout, ExpandableLayout, HybridLayout, named in one registry): where each size
//     class lives, fixed segments or expandable ranges. Asked once, by the constructor,
//     and kept as a flag per class: no allocation calls it;
// beside the record types it already used: detail::FreeIndex (free_index.hpp, one per
// stream and size class), detail::PtrMap (ptr_map.hpp, the live blocks),
// detail::StreamEvents (stream_events.hpp), detail::PagedMemory (paged_memory.hpp, the
// pages of expandable ranges) and PoolHistory (pool_history.hpp).
// What stays members of CachingPool, and why: the books that tie these together (segments,
// blocks, free indexes per stream) and the placement logic over them (caching_pool.cpp,
// caching_pool_idle_streams.cpp, caching_pool_placement.cpp); the release-and-reclaim
// sequence, the history and the two segment sources every layout picks from, fixed
// segments (grow()) and expandable ranges (caching_pool_limits.cpp, caching_pool_books.cpp,
// caching_pool_expandable.cpp), because each is read or written in the middle of a
// placement under the same lock (the history by every hand-out and free, the ranges by
// carve() and own_fit()): wrapping them as adaptors around an upstream would put an
// indirection or a second lock on the allocation path. caching_pool_validation.cpp holds the options check, the out-of-memory message
// and validate(). Every other part's header sits beside its own .cpp (pool_audit.cpp,
// pressure_callbacks.cpp, pool_layout.cpp, ...); the caching_pool_*.cpp files are
// caching_pool.hpp's, one per group of its members.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpukeeper/core/spin_mutex.hpp"
#include "gpukeeper/memory/block.hpp"
#include "gpukeeper/memory/free_index.hpp"
#include "gpukeeper/memory/paged_memory.hpp"
#include "gpukeeper/memory/pending_merges.hpp"
#include "gpukeeper/memory/placement_guard.hpp"
#include "gpukeeper/memory/pool_counters.hpp"
#include "gpukeeper/memory/pool_history.hpp"
#include "gpukeeper/memory/pool_layout.hpp"
#include "gpukeeper/memory/pool_limit.hpp"
#include "gpukeeper/memory/pool_stats.hpp"
#include "gpukeeper/memory/pressure_callbacks.hpp"
#include "gpukeeper/memory/ptr_map.hpp"
#include "gpukeeper/memory/recent_frees.hpp"
#include "gpukeeper/memory/resource.hpp"
#include "gpukeeper/memory/segment_events.hpp"
#include "gpukeeper/memory/stream_events.hpp"

namespace gpukeeper {

struct PoolOptions {
  std::size_t small_size = std::size_t{1} << 20;      // requests up to this are small
  std::size_t small_segment = std::size_t{2} << 20;   // segment size for small requests
  std::size_t large_segment = std::size_t{20} << 20;  // segment for large requests ...
  std::size_t large_cutoff = std::size_t{10} << 20;   // ... of up to this size
  std::size_t segment_granularity = std::size_t{2} << 20;  // bigger ones: rounded to this
  std::size_t max_pool_size = 0;                      // reserved-bytes limit; 0: none
  // Where blocks live (pool_layout.hpp): segments taken from the upstream whole (fixed),
  // or expandable ranges: one reserved address range per size class, with physical pages
  // mapped only under allocated blocks and moved to where they are needed before new ones
  // are made (needs upstream().virtual_memory(): device and host kinds).
  SegmentLayout segments = SegmentLayout::automatic;
  std::size_t expandable_range = 0;  // bytes of addresses per range; 0: twice the memory
  // The memory an expandable pool may hold beyond what was asked of it, as a fraction of
  // the most bytes requested at once (since it was made or last released its cache):
  // new pages are made while reserved bytes (fixed segments and mapped pages together)
  // stay within (1 + slack) times that peak, and pages are moved beyond it. Pages up to
  // the most that live blocks touched at once are always made. The budget is the very
  // ratio the recorded traces are held to (<= 1.05, docs/performance.md): 0 moves a page
  // for nearly every placement change; more spares moves (each about 60 us of driver
  // calls on an H100) and holds more memory.
  double expandable_slack = 0.045;
};

class CachingPool {
 public:
  static constexpr std::size_t kAlignment = 256;
  // Larger requests are refused as input errors: no machine has a petabyte to give.
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 50;
  // PoolOptions::expandable_range above this is refused: 128 PiB, the user address space of
  // x86-64 with 5-level paging (larger than any other; rounding it up cannot overflow).
  static constexpr std::size_t kMaxExpandableRange = std::size_t{1} << 57;
  // Freed blocks that may stay unmerged with their free neighbours at a time.
  static constexpr std::size_t kMergeWindow = 4;
  // Free blocks an expandable class looks through for one already mapped (own_fit).
  static constexpr unsigned kMappedCandidates = 16;
  // Freed blocks held back from the free index at a time (recent_frees.hpp).
  static constexpr unsigned kRecentFrees = detail::RecentFrees::kCapacity;

  // Returns the bytes it released (a guess is fine); `needed` is the failed request.
  using ReclaimCallback = detail::PressureCallbacks::ReclaimCallback;
  // Receives the pressure that crossed the watermark's level.
  using WatermarkCallback = detail::PressureCallbacks::WatermarkCallback;

  explicit CachingPool(std::unique_ptr<MemoryResource> upstream, PoolOptions options = {});
  ~CachingPool();
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // A block of at least `bytes`, 256-byte aligned, ordered on `stream`.
  // Throws InvalidInputError for 0 or absurd sizes, AllocationError when memory cannot
  // be had after releasing caches and running reclaim callbacks.
  void* allocate(std::size_t bytes, stream_t stream = 0);

  // Returns a block; its later users must be ordered after the work queued on the
  // block's stream (or on `stream`, if given) so far. Throws InvalidInputError, and
  // changes nothing, for a pointer this pool did not hand out or that was returned.
  void deallocate(void* ptr);
  void deallocate(void* ptr, stream_t stream);
  // As deallocate(ptr) for a live block of this pool; false, changing nothing, for any
  // other pointer. One lookup: for callers that hold several pools and try the likely
  // one first (PyTorch's free under CUDA graph pools).
  bool try_deallocate(void* ptr);
  // As deallocate(ptr), and also checks that `bytes` is the size that was requested.
  void deallocate_checked(void* ptr, std::size_t bytes);

  bool owns(const void* ptr) const;
  // The size requested for a live block; InvalidInputError when ptr is not one.
  std::size_t requested_size(const void* ptr) const;

  PoolStats stats() const noexcept;
  // Resets every peak (of stats() and of history()) to the current value.
  void reset_peaks() noexcept;
  // The pool's history in PyTorch's terms (pool_history.hpp); takes the lock and walks
  // the books for the inactive splits: a slow path, for reports.
  PoolHistory history() const;
  // Restarts history()'s totals and event counts (not PoolStats' counters).
  void reset_accumulated() noexcept;
  // Every segment with its blocks, in address order (see SegmentSnapshot).
  std::vector<SegmentSnapshot> snapshot() const;

  // Limits reserved bytes (0 removes the limit). Releases cached segments to get under
  // it. InvalidInputError when below the bytes currently allocated.
  void set_limit(std::size_t bytes);
  std::size_t limit() const noexcept { return limit_.get(); }

  // In [0, 1]: reserved / limit with a limit, else the upstream's used fraction.
  double memory_pressure() const;

  // `callback` runs (outside the pool's lock) when pressure rises to `level` in (0, 1];
  // it re-arms once pressure falls below. Returns an id for remove_watermark.
  int add_watermark(double level, WatermarkCallback callback);
  bool remove_watermark(int id);
  // Runs when the upstream refuses memory even after the pool released its cache.
  int add_reclaim_callback(ReclaimCallback callback);
  bool remove_reclaim_callback(int id);

  // Returns every whole free segment to the upstream after the streams that used them
  // are done. Returns the bytes released.
  std::size_t emergency_cleanup();
  // Like emergency_cleanup(), stopping once reserved bytes are at most `keep_bytes`.
  std::size_t trim(std::size_t keep_bytes);

  MemoryResource& upstream() noexcept { return *upstream_; }
  const MemoryResource& upstream() const noexcept { return *upstream_; }
  ResourceKind kind() const noexcept { return upstream_->kind(); }
  int device() const noexcept { return upstream_->device(); }
  // The options in force: `segments` is never automatic here, but the layout it chose.
  const PoolOptions& options() const noexcept { return options_; }

  // ---- Exact placement (caching_pool_placement.cpp): what PyTorch's CUDA graph trees
  // and CUDA IPC ask of an allocator beyond allocate and deallocate.

  // A handed-out block as the books hold it.
  struct LiveBlock {
    void* ptr = nullptr;
    std::size_t size = 0;       // rounded, as the pool holds it
    std::size_t requested = 0;  // as asked for
    stream_t stream = 0;
  };
  // Every live block, in address order.
  std::vector<LiveBlock> live_blocks() const;
  // The segment holding address `ptr` (any byte of it); false when none does.
  struct SegmentRange {
    void* base = nullptr;
    std::size_t size = 0;
    bool expandable = false;
  };
  bool segment_of(const void* ptr, SegmentRange& out) const;
  // CUDA IPC of a live block in an expandable range: the pages under it, as POSIX
  // descriptors of this process that stay open while the pages live (another process
  // takes copies with pidfd_getfd). False, changing nothing, when `ptr` is not the start
  // of a live block in an expandable range; GpuError where the pages cannot be shared.
  struct SharedPages {
    void* first_page = nullptr;  // the address of the first page under the block
    std::size_t page_size = 0;
    std::vector<int> fds;
  };
  bool share_pages(const void* ptr, SharedPages& out);
  // Makes the live blocks exactly `blocks`: every block live now is taken back, then each
  // of `blocks` is handed out at its own address, size and stream (a graph's recorded
  // memory layout put back). Returns the pointers taken back. InvalidInputError, changing
  // nothing, when a block is misaligned, overlaps another, or lies outside the pool's
  // fixed segments.
  std::vector<void*> restore_live_blocks(std::vector<LiveBlock> blocks);

  // Tells `observer` (segment_events.hpp; an empty one: nobody) of every segment taken from
  // or given back to the upstream, and every page mapped at or unmapped from an address of
  // an expandable range, from now on.
  void set_segment_observer(SegmentObserver observer);

  // Walks the books and returns what is inconsistent ("" when all is well): blocks that
  // do not tile their segment, unmerged free neighbours, counters that disagree.
  std::string validate() const;

 private:
  struct StreamFree {
    stream_t stream;
    std::uint64_t bit;  // this stream's bit in page stream masks (all bits past 64 streams)
    detail::FreeIndex small;
    detail::FreeIndex large;
    detail::FreeIndex& index(bool is_small) noexcept { return is_small ? small : large; }
  };

  static constexpr std::size_t round_up(std::size_t value, std::size_t to) noexcept {
    return (value + to - 1) / to * to;
  }

  // caching_pool.cpp: allocation, deallocation, merging, releasing segments.
  // False, changing nothing, for a pointer that is not a live block when !must_own.
  bool free_block(void* ptr, bool has_stream, stream_t stream, std::size_t expected,
                  bool must_own = true);
  StreamFree& stream_free(stream_t stream);
  detail::FreeIndex& index_of(const detail::Block* block);
  detail::Block* take_cached(std::size_t size, bool small, stream_t stream);
  detail::Block* own_fit(detail::FreeIndex& index, std::size_t size, bool small, stream_t stream);
  detail::Block* try_allocate(std::size_t size, std::size_t requested, bool small,
                              stream_t stream, bool& grew);
  detail::Block* grow(std::size_t size, bool small, stream_t stream);
  detail::Segment* add_segment(std::uintptr_t base, std::size_t size, stream_t stream,
                               bool small, detail::PageTable* table);
  detail::Block* carve(detail::Block* block, std::size_t size, std::size_t requested,
                       stream_t stream);
  void hand_out(detail::Block* block, std::size_t requested, stream_t stream);
  void hold_recent(detail::Block* block);
  void settle_recent();
  // Puts a freed block on its index (its pages counted out), pending a merge when a
  // neighbour is free; merges nothing itself.
  void settle(detail::Block* block);
  // Books a live block as free (counters, history); the caller files it.
  void unbook(detail::Block* block);
  detail::Segment* segment_holding(std::uintptr_t addr) const noexcept;
  void place_at(const LiveBlock& spec);
  void insert_free(detail::Block* block);
  void add_pending(detail::Block* block) noexcept {
    if (pending_.add(block)) counters_.mark_largest_stale();  // a merge may make a larger block
  }
  void remove_pending(detail::Block* block) noexcept { pending_.remove(block); }
  void merge_pending();
  // caching_pool_idle_streams.cpp: free blocks of idle streams, adopted and merged.
  bool adopt_idle_streams(stream_t stream, bool small);
  detail::Block* merge_neighbours(detail::Block* block);
  void refresh_largest() const noexcept;
  std::size_t release_free_segments(std::size_t keep_reserved);
  void release_segment(detail::Segment* segment);
  // Takes a wholly free segment's one block out of the free index and the segment out of
  // the segment list; what backs its memory is the caller's to give back.
  void unlink_free_segment(detail::Segment* segment);
  std::size_t segment_size_for(std::size_t size, bool small) const noexcept;
  // caching_pool_expandable.cpp: the layout (pool_layout.hpp), asked once, and
  // expandable segments.
  void init_layout();
  void init_expandable();
  // Whether requests of this class live in expandable ranges: the layout's answer, kept.
  bool expandable_class(bool small) const noexcept { return expandable_class_[small]; }
  detail::Block* grow_expandable(std::size_t size, bool small, stream_t stream);
  detail::Block* fewest_pages_fit(std::size_t size, bool small, stream_t stream) const;
  detail::Block* fewest_pages_fit(const detail::FreeIndex& index, std::size_t size) const;
  bool map_pages(detail::Block* block, std::size_t size, std::size_t requested);
  bool streams_done(std::uint64_t bits);
  void sync_reserved() noexcept;
  void release_expandable_segment(detail::Segment* segment);
  // caching_pool_limits.cpp: measures the pressure for the watermarks; run without
  // mutex_ held.
  void notify_watermarks();
  // caching_pool_validation.cpp: checks and the out-of-memory message.
  static void check_options(const PoolOptions& options);
  std::string oom_message(std::size_t bytes) const;

  std::unique_ptr<MemoryResource> upstream_;
  // upstream_->stream_ordered(), asked once: every allocation and free needs it.
  bool stream_ordered_ = false;
  PoolOptions options_;
  std::unique_ptr<detail::PagedMemory> paged_;  // expandable mode only; dies before upstream_
  SegmentObserver segment_observer_;
  // The expandable range holding `addr`'s stream, for its page events (under the lock).
  void observe_pages();
  // Made once: building them per allocation would allocate on the hot path.
  detail::PagedMemory::StreamsDone streams_done_fn_;
  std::function<bool()> may_create_page_fn_;
  detail::Segment* expandable_[2] = {nullptr, nullptr};  // growing range: [0] small, [1] large
  std::size_t total_memory_ = 0;  // expandable: the upstream's whole memory; 0: unknown
  // Per size class, indexed by `small` ([0] large, [1] small): whether its blocks live in
  // expandable ranges (PoolLayout::source), asked once by init_layout so that placement
  // calls no layout.
  bool expandable_class_[2] = {false, false};

  mutable SpinMutex mutex_;  // guards everything below up to the counters
  PoolHistory history_;
  std::size_t history_mapped_[2] = {0, 0};  // expandable: mapped bytes per class, as last seen
  std::size_t fixed_reserved_ = 0;  // bytes of fixed segments (all reserved bytes without paged_)
  // Expandable: the most bytes requested at once since the pool was made or released its
  // cache, the base of the spare-page budget (expandable_slack). Not reset by
  // reset_peaks(): a user's peak statistics must not change how much the pool keeps.
  std::size_t budget_peak_requested_ = 0;
  std::uint64_t pages_counted_ = 0;  // expandable: pages made that counters_' upstream allocations hold
  detail::RecordArena<detail::Block> blocks_;
  detail::RecordArena<detail::Segment> segment_records_;
  detail::Segment* segments_ = nullptr;
  detail::PendingMerges pending_;  // freed blocks not yet merged
  detail::RecentFrees recent_;     // freed blocks held off the free index
  detail::PtrMap<detail::Block> live_;
  std::vector<std::unique_ptr<StreamFree>> streams_;
  StreamFree* last_stream_ = nullptr;
  detail::StreamEvents events_;

  // Written under mutex_, read by anyone.
  detail::PoolCounters counters_;
  detail::PoolLimit limit_;  // the reserved-bytes limit (pool_limit.hpp)

  detail::PressureCallbacks callbacks_;  // its own lock; never held with mutex_

  // Expandable mode only: classes placed in size order while cycling (under mutex_). On
  // the heap and last: 1.5 KiB that only placements over one page read, kept off the
  // pool's hot cache lines, whose offsets stay as they were.
  std::unique_ptr<detail::PlacementGuard> guard_;
};

}  // namespace gpukeeper
