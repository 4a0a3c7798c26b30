// The physical side of expandable segments.
//
// Each expandable segment is a reserved address range (a PageTable) whose blocks are
// laid out as in any segment, while physical pages are mapped only under blocks that are
// allocated. A page counts the allocated blocks on it; when the count drops to zero the
// page becomes movable. When a block needs a page, a new page is made while the pages
// held stay within the most that live blocks have touched at once, or within the spare
// limit the caller gives (the pool's budget, caching_pool.hpp's expandable_slack); beyond
// that a movable page is unmapped and mapped under the block instead: the one at the
// highest address whose streams are done. The memory held thus follows the pages
// allocated blocks touch, however the address space fragments, and the spare pages
// within the limit spare most moves (each costs driver calls, about 60 us on an H100:
// benchmarks/cpp/page_move_bench) when block positions shift from one step to the next.
//
// A page that moves keeps its old mapping as a stale alias (at most kMaxAliases of them):
// the unmap, a third of a move's cost, is spared, and when a block lands on the old
// address again while the page is free, its streams are done and it is the page a move
// would take anyway (the highest movable), the page goes back home with no driver call.
// A stale alias is unmapped when a block needs its address and the page is in use
// elsewhere, and all of them at cleanup. Placement counts an alias as unmapped.
//
// Why the highest page: the pool places blocks low in the range first (mapped-first,
// then the fewest pages to map, lowest address on ties), so taking pages from the top
// keeps the mapped pages packed where the next step's blocks will land. Taking the page
// that became movable first (a queue, tried) takes them from wherever the last step
// freed a block, which the next step's blocks then need again: with the same placement
// it moved 1.2-6x (forcefield) and 14-29x (transformer) more pages in warm replays of
// the recorded traces (docs/performance.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpukeeper/memory/virtual_memory.hpp"

namespace gpukeeper::detail {

// One reserved range's pages, a column per field, so that the pages inside a block (which
// no other block touches) are counted in and out with fills and bitmap words rather than
// a walk of per-page records: a large block spans hundreds of pages, and every allocation
// and free of one updates them all.
//
// A slot (one page of addresses) holds nothing, its physical page's home mapping (the one
// blocks use), or a stale alias: a second mapping of a page that has since moved home
// elsewhere, kept because bringing it back costs no driver call (PagedMemory).
struct PageTable {
  std::uintptr_t base = 0;
  std::size_t capacity = 0;  // bytes reserved
  std::size_t mapped = 0;    // pages whose home is here: the memory this range holds
  std::size_t aliases = 0;   // stale aliases here
  // Per slot, covering the part of the range that blocks tile:
  std::vector<std::uint32_t> ids;   // the physical page mapped here (PagedMemory's id); 0: none
  std::vector<std::uint32_t> refs;  // allocated blocks on the page
  // Stream slots (bits) that freed blocks on the page since it came home here: it may move
  // once their work is done. 0 for a slot that is not a home. A column rather than a
  // field of the page, so that freeing a large block ORs one run of words.
  std::vector<std::uint64_t> streams;
  // Bit i: slot i holds its page's home. Counting a block's missing pages is a popcount.
  std::vector<std::uint64_t> home_bits;
  // Bit i: slot i is movable (a home with no allocated block on it). A bitmap rather than
  // a queue: a free sets one bit, and the highest movable page is found by a scan of words
  // from the top, made only when a page must move.
  std::vector<std::uint64_t> movable;

  std::size_t page_count() const noexcept { return ids.size(); }
};

class PagedMemory {
 public:
  // Says whether all streams in a mask of stream slots are done with their work.
  using StreamsDone = std::function<bool(std::uint64_t streams)>;

  PagedMemory(VirtualMemory& vm, std::size_t range_bytes);
  ~PagedMemory();
  PagedMemory(const PagedMemory&) = delete;
  PagedMemory& operator=(const PagedMemory&) = delete;

  std::size_t page_size() const noexcept { return page_; }
  std::size_t range_bytes() const noexcept { return range_; }
  std::size_t mapped_bytes() const noexcept { return mapped_pages_ * page_; }
  std::uint64_t pages_moved() const noexcept { return moved_; }
  // Stale aliases brought back as homes: pages that came back to an address they had left
  // with no driver call at all.
  std::uint64_t pages_revived() const noexcept { return revived_; }
  std::uint64_t pages_created() const noexcept { return created_; }
  // Pages given back to the driver (unmapped and released), for whatever reason.
  std::uint64_t pages_released() const noexcept { return released_; }
  std::size_t live_pages() const noexcept { return live_; }
  std::size_t peak_live_pages() const noexcept { return peak_live_; }

  // A new address range of range_bytes(), or nullptr when no address space is left.
  PageTable* reserve();
  // Gives the range back; it must have no mapping, home or alias.
  void unreserve(PageTable* table);
  // Blocks now tile the first `bytes` of the range.
  void extend(PageTable* table, std::size_t bytes);

  // Counts a new allocated block on the pages under [addr, addr + size) and maps those
  // that are unmapped: with new pages while the pages held stay within the live peak or
  // `spare_limit` bytes, else by moving movable pages whose streams `done` says are
  // finished, else with new pages while `may_create` allows. Returns false when no page
  // can be had: the block is uncounted and the pages the call made are released (pages
  // it moved stay moved).
  bool acquire(PageTable* table, std::uintptr_t addr, std::size_t size, const StreamsDone& done,
               const std::function<bool()>& may_create, std::size_t spare_limit);

  // Pages under [addr, addr + size) of `table` that are not mapped: what placing a block
  // there would cost in page maps.
  std::size_t unmapped_pages(const PageTable* table, std::uintptr_t addr, std::size_t size) const noexcept;

  // Whether every page under [addr, addr + size) of `table` is mapped: placing a block
  // there maps nothing. Word compares, no counting: the check of every warm placement.
  bool all_mapped(const PageTable* table, std::uintptr_t addr, std::size_t size) const noexcept;

  // Counts a new block on pages that are all mapped (all_mapped()): acquire() with
  // nothing to map.
  void count_in(PageTable* table, std::uintptr_t addr, std::size_t size) noexcept;

  // POSIX descriptors of the pages under [addr, addr + size) of `table`, in address order,
  // for another process to import (VirtualMemory::share_page): an allocated block's pages,
  // all mapped at home. Throws GpuError where one is not, or the memory cannot be shared.
  std::vector<int> share(const PageTable* table, std::uintptr_t addr, std::size_t size);

  // Uncounts a freed block, freed on the streams in `stream_bits`.
  void release(PageTable* table, std::uintptr_t addr, std::size_t size, std::uint64_t stream_bits);

  // Unmaps every stale alias, then unmaps and frees movable pages, from the highest
  // address down, until at most `keep_bytes` stay mapped. The caller has made sure that no
  // stream still uses them. Returns the bytes released.
  std::size_t unmap_movable(std::size_t keep_bytes);

  // Told of every page that takes up or leaves its home address (a map or a move there; a
  // move away, an unmap or a release): what holds memory at which address. Stale aliases,
  // which hold nothing, are not reported. Must not throw.
  using HomeObserver = std::function<void(bool mapped, std::uintptr_t address, std::size_t bytes)>;
  void set_observer(HomeObserver observer) { observer_ = std::move(observer); }

  // What is inconsistent between the page counts and `expected_refs` (allocated blocks
  // per page of `table`, computed by the caller); "" when all is well.
  std::string check(const PageTable* table, const std::vector<std::uint32_t>& expected_refs) const;

 private:
  // Where the search for a movable page goes on from, downwards: the pages at and
  // above it were taken, or are still in use by a stream (so that one acquire() call
  // asks about each busy page once).
  struct Cursor {
    std::size_t table;  // index into tables_ + 1; 0: no table left to look at
    std::size_t page;   // pages below this one are still to be looked at
  };
  struct Slot {
    PageTable* table = nullptr;
    std::size_t index = 0;
  };
  // Stale aliases a page keeps at most; a move beyond them unmaps the old home. Two
  // cover a page that shuttles between the same few addresses every step.
  static constexpr unsigned kMaxAliases = 2;
  struct Page {
    VirtualMemory::page_t handle = 0;  // 0: the id is free
    Slot home;
    unsigned alias_count = 0;
    Slot alias[kMaxAliases];
  };
  std::uintptr_t address_of(const PageTable* t, std::size_t i) const noexcept {
    return t->base + (i << shift_);
  }
  // The slot of `table` holding byte `addr`.
  std::size_t page_index(const PageTable* t, std::uintptr_t addr) const noexcept {
    return (addr - t->base) >> shift_;
  }
  static bool is_home(const PageTable* table, std::size_t i) noexcept {
    return (table->home_bits[i / 64] >> (i % 64)) & 1u;
  }
  void unref(PageTable* table, std::size_t index, std::uint64_t stream_bits);
  void ref(PageTable* table, std::size_t index) noexcept;
  static void set_movable(PageTable* table, std::size_t index, bool movable) noexcept;
  static void set_home_bit(PageTable* table, std::size_t index, bool home) noexcept;
  // The pages strictly inside [first, last] (no other block touches them): counted in,
  // for a block placed there (only those with their home there; the rest are mapped
  // later, one by one), or counted out, for a freed block (all homes).
  void ref_inner(PageTable* table, std::size_t first, std::size_t last) noexcept;
  void unref_inner(PageTable* table, std::size_t first, std::size_t last,
                   std::uint64_t stream_bits) noexcept;
  // Whether one more page keeps the pages held within the live peak or `spare_limit`.
  bool may_add_page(std::size_t spare_limit) const noexcept;
  Cursor top() const noexcept { return Cursor{tables_.size(), ~std::size_t{0}}; }
  // Moves `cursor` to the highest movable page below it; false when there is none.
  bool next_movable(Cursor& cursor) const noexcept;
  std::uint32_t take_movable(Cursor& cursor, const StreamsDone& done);
  // Page ids: a new one for a page just made, and one given back.
  std::uint32_t new_page(VirtualMemory::page_t handle);
  // The page leaves its home: the slot stays mapped as a stale alias while the page has
  // room for one, else it is unmapped. The caller gives the page a new home.
  void leave_home(std::uint32_t id);
  void set_home(std::uint32_t id, PageTable* table, std::size_t index) noexcept;
  // Takes the stale alias at a slot off its page's list; the mapping stays (revive() makes
  // it the page's home).
  void forget_alias(PageTable* table, std::size_t index) noexcept;
  // forget_alias(), then unmaps the slot.
  void drop_alias(PageTable* table, std::size_t index) noexcept;
  // Unmaps every mapping of a page with no block on it, and frees it.
  void drop_page(std::uint32_t id) noexcept;
  // acquire()'s steps (paged_memory.cpp).
  struct Run {  // pages mapped by one acquire() call, awaiting their access
    std::size_t start = 0;
    std::size_t length = 0;
  };
  bool map_unmapped(PageTable* table, std::size_t first, std::size_t last,
                    const StreamsDone& done, const std::function<bool()>& may_create,
                    std::size_t spare_limit);
  bool revive(PageTable* table, std::size_t index, const Cursor& cursor, const StreamsDone& done);
  std::uint32_t find_page(Cursor& cursor, const StreamsDone& done,
                          const std::function<bool()>& may_create, std::size_t spare_limit);
  void map_page(PageTable* table, std::size_t index, std::uint32_t id);
  void flush_run(PageTable* table, Run& run);
  void undo_acquire(PageTable* table, std::size_t first, std::size_t last);

  VirtualMemory& vm_;
  std::size_t page_;
  unsigned shift_ = 0;  // log2(page_)
  std::size_t range_;
  std::vector<std::unique_ptr<PageTable>> tables_;
  std::vector<Page> pages_{1};  // by id; id 0 is "none"
  std::vector<std::uint32_t> free_ids_;
  std::vector<std::uint32_t> made_;  // pages made by the acquire() call under way
  HomeObserver observer_;
  std::size_t mapped_pages_ = 0;  // physical pages held
  std::size_t live_ = 0;          // pages with allocated blocks on them
  std::size_t peak_live_ = 0;
  std::uint64_t moved_ = 0;
  std::uint64_t revived_ = 0;
  std::uint64_t created_ = 0;
  std::uint64_t released_ = 0;
};

}  // namespace gpukeeper::detail
