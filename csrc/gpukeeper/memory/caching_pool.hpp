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
// their indexes first (take_recent). A repeated size thus costs no split, merge or index
// update, while every other placement sees free runs merged. Whole free segments go back
// to the upstream on emergency_cleanup(), trim(), a limit change, or when the upstream
// runs out.
// All members are thread-safe. Prefer ManagedBuffer (managed_buffer.hpp) to raw calls.
// The code is split by concern, as RMM splits its resources: caching_pool.cpp (allocate,
// free, merge, release), caching_pool_limits.cpp (limit, pressure, callbacks),
// caching_pool_expandable.cpp, caching_pool_books.cpp (stats, history, snapshot) and
// caching_pool_validation.cpp (options, validate(), the out-of-memory message).
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
#include "gpukeeper/memory/pool_history.hpp"
#include "gpukeeper/memory/pool_stats.hpp"
#include "gpukeeper/memory/ptr_map.hpp"
#include "gpukeeper/memory/resource.hpp"
#include "gpukeeper/memory/stream_events.hpp"

namespace gpukeeper {

namespace detail {
class Text;
}  // namespace detail

// How a pool lays out its segments (PoolOptions::segments).
enum class SegmentLayout : std::uint8_t {
  // The default. Hybrid where the upstream is device memory with virtual memory
  // management: reserved memory then stays within 5 % of the most requested at once on
  // every recorded trace, where fixed segments hold 1.15-3.40 times it
  // (docs/performance.md). Fixed elsewhere: host memory, and upstreams without virtual
  // memory (pinned, async, a device or driver without the support).
  automatic,
  fixed,       // segments from the upstream, each kept whole until released
  expandable,  // every size class in expandable ranges
  // Requests over small_size in expandable ranges, small ones in fixed segments: no page
  // is ever moved for them (most operations of a training step are small), and their
  // waste is bounded by what small segments can strand, a small share of the footprint.
  hybrid,
};

const char* to_string(SegmentLayout layout) noexcept;

struct PoolOptions {
  std::size_t small_size = std::size_t{1} << 20;      // requests up to this are small
  std::size_t small_segment = std::size_t{2} << 20;   // segment size for small requests
  std::size_t large_segment = std::size_t{20} << 20;  // segment for large requests ...
  std::size_t large_cutoff = std::size_t{10} << 20;   // ... of up to this size
  std::size_t segment_granularity = std::size_t{2} << 20;  // bigger ones: rounded to this
  std::size_t max_pool_size = 0;                      // reserved-bytes limit; 0: none
  // Where blocks live: segments taken from the upstream whole (fixed), or expandable
  // ranges: one reserved address range per size class, with physical pages mapped only
  // under allocated blocks and moved to where they are needed before new ones are made
  // (needs upstream().virtual_memory(): device and host kinds).
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
  // Freed blocks held back from the free index at a time (see take_recent).
  static constexpr unsigned kRecentFrees = 8;

  // Returns the bytes it released (a guess is fine); `needed` is the failed request.
  using ReclaimCallback = std::function<std::size_t(std::size_t needed)>;
  // Receives the pressure that crossed the watermark's level.
  using WatermarkCallback = std::function<void(double pressure)>;

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
  std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }

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
  // Makes the live blocks exactly `blocks`: every block live now is taken back, then each
  // of `blocks` is handed out at its own address, size and stream (a graph's recorded
  // memory layout put back). Returns the pointers taken back. InvalidInputError, changing
  // nothing, when a block is misaligned, overlaps another, or lies outside the pool's
  // fixed segments.
  std::vector<void*> restore_live_blocks(std::vector<LiveBlock> blocks);

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
  struct Watermark {
    int id;
    double level;
    WatermarkCallback callback;
    bool armed;
  };
  struct Reclaimer {
    int id;
    ReclaimCallback callback;
  };
  struct Tally;  // what validate() counts while it walks the segments
  // A freed block held back from the free index, with what a request must match: copied
  // from the block, so that the scan reads one small array rather than eight blocks.
  struct Recent {
    std::size_t size;
    stream_t stream;
    detail::Block* block;
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
  detail::Block* take_recent(std::size_t size, stream_t stream) noexcept;
  detail::Block* drop_recent(unsigned i) noexcept;
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
  void add_pending(detail::Block* block) noexcept;
  void remove_pending(detail::Block* block) noexcept;
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
  // caching_pool_expandable.cpp: expandable segments.
  void init_layout();
  void init_expandable();
  // Whether requests of this class live in expandable ranges.
  bool expandable_class(bool small) const noexcept {
    return paged_ && (!small || options_.segments == SegmentLayout::expandable);
  }
  detail::Block* grow_expandable(std::size_t size, bool small, stream_t stream);
  detail::Block* fewest_pages_fit(std::size_t size, bool small, stream_t stream) const;
  bool map_pages(detail::Block* block, std::size_t size, std::size_t requested);
  bool streams_done(std::uint64_t bits);
  void sync_reserved() noexcept;
  void release_expandable_segment(detail::Segment* segment);
  // caching_pool_limits.cpp: callbacks, run without mutex_ held.
  void notify_watermarks();
  std::size_t run_reclaimers(std::size_t needed);
  // caching_pool_validation.cpp: checks and the out-of-memory message.
  static void check_options(const PoolOptions& options);
  std::string oom_message(std::size_t bytes) const;
  void validate_segment(const detail::Segment* segment, Tally& tally,
                        detail::Text& problems) const;
  void validate_block(const detail::Segment* segment, const detail::Block* block,
                      const detail::Block* prev, std::uintptr_t expect, Tally& tally,
                      std::vector<std::uint32_t>& page_refs, detail::Text& problems) const;
  void validate_counters(const Tally& tally, detail::Text& problems) const;

  void count(std::atomic<std::size_t>& counter, std::ptrdiff_t delta) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }

  std::unique_ptr<MemoryResource> upstream_;
  // upstream_->stream_ordered(), asked once: every allocation and free needs it.
  bool stream_ordered_ = false;
  PoolOptions options_;
  std::unique_ptr<detail::PagedMemory> paged_;  // expandable mode only; dies before upstream_
  // Made once: building them per allocation would allocate on the hot path.
  detail::PagedMemory::StreamsDone streams_done_fn_;
  std::function<bool()> may_create_page_fn_;
  detail::Segment* expandable_[2] = {nullptr, nullptr};  // growing range: [0] small, [1] large
  std::size_t total_memory_ = 0;  // expandable: the upstream's whole memory; 0: unknown

  mutable SpinMutex mutex_;  // guards everything below up to the counters
  PoolHistory history_;
  std::size_t history_mapped_[2] = {0, 0};  // expandable: mapped bytes per class, as last seen
  std::size_t fixed_reserved_ = 0;  // bytes of fixed segments (all of reserved_ without paged_)
  // Expandable: the most bytes requested at once since the pool was made or released its
  // cache, the base of the spare-page budget (expandable_slack). Not reset by
  // reset_peaks(): a user's peak statistics must not change how much the pool keeps.
  std::size_t budget_peak_requested_ = 0;
  std::uint64_t pages_counted_ = 0;  // expandable: pages made that upstream_allocations_ holds
  detail::RecordArena<detail::Block> blocks_;
  detail::RecordArena<detail::Segment> segment_records_;
  detail::Segment* segments_ = nullptr;
  detail::Block* pending_ = nullptr;  // freed blocks not yet merged
  std::size_t pending_count_ = 0;
  Recent recent_[kRecentFrees];  // oldest first
  unsigned recent_count_ = 0;
  detail::PtrMap<detail::Block> live_;
  std::vector<std::unique_ptr<StreamFree>> streams_;
  StreamFree* last_stream_ = nullptr;
  detail::StreamEvents events_;

  // Written under mutex_, read by anyone.
  std::atomic<std::size_t> allocated_{0}, allocated_count_{0}, requested_{0}, reserved_{0},
      segment_count_{0}, peak_allocated_{0}, peak_reserved_{0},
      cache_hits_{0}, cache_misses_{0}, upstream_allocations_{0}, upstream_frees_{0},
      oom_events_{0}, callback_errors_{0}, pages_moved_{0};
  std::atomic<std::size_t> limit_{0};
  mutable std::atomic<std::size_t> largest_free_{0};
  // Set when the largest free block was handed out or a merge is pending: largest_free_
  // may then be off until the next refresh (slow paths, or stats() when the lock is
  // free). Keeps the scan for the new largest block off the allocation fast path.
  mutable std::atomic<bool> largest_stale_{false};

  std::mutex callbacks_mutex_;  // guards the callback lists; never held with mutex_
  std::vector<Watermark> watermarks_;
  std::vector<Reclaimer> reclaimers_;
  int next_callback_id_ = 1;
  std::atomic<bool> has_watermarks_{false};
};

}  // namespace gpukeeper
