// Expandable segments' physical pages (paged_memory.hpp): reserving ranges, mapping pages
// under allocated blocks, moving idle pages to where they are needed, and unmapping them.
#include "gpukeeper/memory/paged_memory.hpp"

#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"

namespace gpukeeper::detail {

namespace {

// Calls f(word index, mask) for the words of a bitmap covering bits [from, to].
template <typename F>
void for_each_word(std::size_t from, std::size_t to, F&& f) {
  for (std::size_t w = from / 64; w <= to / 64; ++w) {
    std::uint64_t mask = ~std::uint64_t{0};
    if (w == from / 64) mask &= ~std::uint64_t{0} << (from % 64);
    if (w == to / 64 && to % 64 != 63) mask &= (std::uint64_t{1} << (to % 64 + 1)) - 1;
    f(w, mask);
  }
}

}  // namespace

PagedMemory::PagedMemory(VirtualMemory& vm, std::size_t range_bytes)
    : vm_(vm), page_(vm.page_size()), range_((range_bytes + page_ - 1) / page_ * page_) {
  if (page_ == 0 || range_ == 0) throw InvalidInputError("PagedMemory: empty page or range");
}

void PagedMemory::set_movable(PageTable* table, std::size_t index, bool movable) noexcept {
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  if (movable) {
    table->movable[index / 64] |= bit;
  } else {
    table->movable[index / 64] &= ~bit;
  }
}

void PagedMemory::set_mapped(PageTable* table, std::size_t index, bool mapped) noexcept {
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  if (mapped) {
    table->mapped_bits[index / 64] |= bit;
  } else {
    table->mapped_bits[index / 64] &= ~bit;
  }
}

void PagedMemory::ref(PageTable* table, std::size_t index) noexcept {
  if (table->refs[index]++ != 0) return;
  set_movable(table, index, false);
  if (++live_ > peak_live_) peak_live_ = live_;
}

void PagedMemory::ref_inner(PageTable* table, std::size_t first, std::size_t last) noexcept {
  if (last < first + 2) return;
  std::size_t counted = 0;
  for_each_word(first + 1, last - 1, [&](std::size_t w, std::uint64_t mask) {
    std::uint64_t bits = table->mapped_bits[w] & mask;
    table->movable[w] &= ~bits;
    counted += static_cast<std::size_t>(__builtin_popcountll(bits));
    while (bits != 0) {
      table->refs[w * 64 + static_cast<unsigned>(__builtin_ctzll(bits))] = 1;
      bits &= bits - 1;
    }
  });
  live_ += counted;
  if (live_ > peak_live_) peak_live_ = live_;
}

void PagedMemory::unref_inner(PageTable* table, std::size_t first, std::size_t last,
                              std::uint64_t stream_bits) noexcept {
  if (last < first + 2) return;
  const std::size_t begin = first + 1, count = last - first - 1;
  std::fill_n(table->refs.begin() + static_cast<std::ptrdiff_t>(begin), count, 0u);
  if (stream_bits != 0) {
    std::uint64_t* streams = table->streams.data() + begin;
    for (std::size_t k = 0; k < count; ++k) streams[k] |= stream_bits;
  }
  // A live block sits on mapped pages only: every one of them becomes movable.
  for_each_word(begin, last - 1, [&](std::size_t w, std::uint64_t mask) {
    table->movable[w] |= table->mapped_bits[w] & mask;
  });
  live_ -= count;
}

std::size_t PagedMemory::unmapped_pages(const PageTable* table, std::uintptr_t addr,
                                        std::size_t size) const noexcept {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  const std::size_t n = table->page_count();
  if (first >= n) return last - first + 1;
  const std::size_t end = std::min(last, n - 1);
  std::size_t mapped = 0;
  for_each_word(first, end, [&](std::size_t w, std::uint64_t mask) {
    mapped += static_cast<std::size_t>(__builtin_popcountll(table->mapped_bits[w] & mask));
  });
  return last - first + 1 - mapped;
}

// Pages up to the most that live blocks touched at once are memory the trace needed, never
// spare; beyond them, the caller's limit (its budget for spare memory) decides.
bool PagedMemory::may_add_page(std::size_t spare_limit) const noexcept {
  const std::size_t after = mapped_pages_ + 1;
  return after <= std::max(peak_live_, live_ + 1) || after * page_ <= spare_limit;
}

PagedMemory::~PagedMemory() {
  for (auto& table : tables_) {
    for (std::size_t i = 0; i < table->page_count(); ++i) {
      if (VirtualMemory::page_t h = table->handles[i]) {
        vm_.unmap(address_of(table.get(), i));
        vm_.release_page(h);
      }
    }
    vm_.unreserve(table->base, table->capacity);
  }
}

PageTable* PagedMemory::reserve() {
  std::uintptr_t base = vm_.reserve(range_);
  if (base == 0) return nullptr;
  auto table = std::make_unique<PageTable>();
  table->base = base;
  table->capacity = range_;
  tables_.push_back(std::move(table));
  return tables_.back().get();
}

void PagedMemory::unreserve(PageTable* table) {
  if (table->mapped != 0) throw GpuError("PagedMemory::unreserve: range still has mapped pages");
  vm_.unreserve(table->base, table->capacity);
  tables_.erase(std::find_if(tables_.begin(), tables_.end(),
                             [table](const auto& t) { return t.get() == table; }));
}

void PagedMemory::extend(PageTable* table, std::size_t bytes) {
  std::size_t pages = (bytes + page_ - 1) / page_;
  if (pages > table->page_count()) {
    table->handles.resize(pages, 0);
    table->refs.resize(pages, 0);
    table->streams.resize(pages, 0);
    table->mapped_bits.resize((pages + 63) / 64, 0);
    table->movable.resize((pages + 63) / 64, 0);
  }
}

bool PagedMemory::next_movable(Cursor& cursor) const noexcept {
  while (cursor.table != 0) {
    const PageTable* table = tables_[cursor.table - 1].get();
    std::size_t end = std::min(cursor.page, table->page_count());  // pages [0, end) left
    while (end != 0) {
      const std::size_t word = (end - 1) / 64;
      std::uint64_t bits = table->movable[word];
      const unsigned below = static_cast<unsigned>(end - word * 64);  // bits of this word left
      if (below < 64) bits &= (std::uint64_t{1} << below) - 1;
      if (bits != 0) {
        cursor.page = word * 64 + 63u - static_cast<unsigned>(__builtin_clzll(bits));
        return true;
      }
      end = word * 64;
    }
    --cursor.table;
    cursor.page = ~std::size_t{0};
  }
  return false;
}

// Unmaps the highest movable page below `cursor` whose streams are done, for the caller
// to map elsewhere; 0 when none is.
VirtualMemory::page_t PagedMemory::take_movable(Cursor& cursor, const StreamsDone& done) {
  while (next_movable(cursor)) {
    PageTable* table = tables_[cursor.table - 1].get();
    const std::size_t i = cursor.page;
    if (table->streams[i] != 0 && !done(table->streams[i])) continue;  // busy: look lower
    VirtualMemory::page_t handle = table->handles[i];
    vm_.unmap(address_of(table, i));
    set_movable(table, i, false);
    set_mapped(table, i, false);
    table->handles[i] = 0;
    table->streams[i] = 0;
    --table->mapped;
    --mapped_pages_;
    ++moved_;
    return handle;
  }
  return 0;
}

bool PagedMemory::acquire(PageTable* table, std::uintptr_t addr, std::size_t size,
                          const StreamsDone& done, const std::function<bool()>& may_create,
                          std::size_t spare_limit) {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  // Count the block on its mapped pages first, so that none of them is moved into a hole.
  // The two end pages may be shared with neighbours; those inside are the block's alone.
  std::size_t unmapped = unmapped_pages(table, addr, size);
  ref_inner(table, first, last);
  for (std::size_t i : {first, last}) {
    if (table->handles[i] != 0) ref(table, i);
    if (last == first) break;
  }
  if (unmapped == 0) return true;  // the cached case: nothing to map

  bool mapped = false;
  try {
    mapped = map_unmapped(table, first, last, done, may_create, spare_limit);
  } catch (...) {
    undo_acquire(table, first, last);
    throw;
  }
  if (!mapped) {
    undo_acquire(table, first, last);
    return false;
  }
  return true;
}

// Maps a page under each unmapped page of [first, last]; runs of pages mapped here get
// their access in one call each. False when no page can be had; pages mapped so far stay
// mapped (and counted) for the caller to undo.
bool PagedMemory::map_unmapped(PageTable* table, std::size_t first, std::size_t last,
                               const StreamsDone& done, const std::function<bool()>& may_create,
                               std::size_t spare_limit) {
  Run run;
  Cursor cursor = top();
  try {
    for (std::size_t i = first; i <= last; ++i) {
      if (table->handles[i] != 0) {  // mapped before this call (counted by acquire)
        flush_run(table, run);
        continue;
      }
      VirtualMemory::page_t handle = find_page(cursor, done, may_create, spare_limit);
      if (handle == 0) {
        flush_run(table, run);
        return false;
      }
      map_page(table, i, handle);
      if (run.length == 0) run.start = i;
      ++run.length;
    }
    flush_run(table, run);
  } catch (...) {
    try {
      flush_run(table, run);
    } catch (...) {
    }
    throw;
  }
  return true;
}

// A page for a hole: a new one while may_add_page() allows, else a movable one whose
// streams are done, else a new one if may_create allows; 0 if none.
VirtualMemory::page_t PagedMemory::find_page(Cursor& cursor, const StreamsDone& done,
                                             const std::function<bool()>& may_create,
                                             std::size_t spare_limit) {
  VirtualMemory::page_t handle = 0;
  if (may_add_page(spare_limit) && may_create()) handle = vm_.create_page();
  if (handle != 0) {
    ++created_;
    return handle;
  }
  handle = take_movable(cursor, done);
  if (handle == 0 && may_create()) {
    handle = vm_.create_page();
    if (handle != 0) ++created_;
  }
  return handle;
}

// Maps `handle` at page `index` and counts the new block on it; the page is released if
// the mapping fails.
void PagedMemory::map_page(PageTable* table, std::size_t index, VirtualMemory::page_t handle) {
  try {
    vm_.map(address_of(table, index), handle);
  } catch (...) {
    vm_.release_page(handle);
    throw;
  }
  table->handles[index] = handle;
  table->refs[index] = 0;
  table->streams[index] = 0;
  set_mapped(table, index, true);
  ref(table, index);
  ++table->mapped;
  ++mapped_pages_;
}

// Gives the pages of `run` access (one call) and empties it. When that fails, its pages
// are unmapped and released: pages nobody may access must not stay mapped, or a later
// block would fault on them.
void PagedMemory::flush_run(PageTable* table, Run& run) {
  if (run.length == 0) return;
  const std::size_t start = run.start, count = run.length;
  run.length = 0;
  try {
    vm_.set_access(address_of(table, start), count * page_);
  } catch (...) {
    for (std::size_t k = start; k < start + count; ++k) {
      vm_.unmap(address_of(table, k));
      vm_.release_page(table->handles[k]);
      set_mapped(table, k, false);
      table->handles[k] = 0;
      table->refs[k] = 0;
      --live_;
      --table->mapped;
      --mapped_pages_;
    }
    throw;
  }
}

// A failed acquire: the block is uncounted from the pages of [first, last]; pages mapped
// by the call stay mapped and become movable.
void PagedMemory::undo_acquire(PageTable* table, std::size_t first, std::size_t last) {
  for (std::size_t j = first; j <= last; ++j) {
    if (table->handles[j] != 0) unref(table, j, 0);
  }
}

void PagedMemory::unref(PageTable* table, std::size_t index, std::uint64_t stream_bits) {
  table->streams[index] |= stream_bits;
  if (--table->refs[index] != 0) return;
  --live_;
  if (table->handles[index] != 0) set_movable(table, index, true);
}

void PagedMemory::release(PageTable* table, std::uintptr_t addr, std::size_t size,
                          std::uint64_t stream_bits) {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  unref_inner(table, first, last, stream_bits);
  unref(table, first, stream_bits);
  if (last != first) unref(table, last, stream_bits);
}

std::size_t PagedMemory::unmap_movable(std::size_t keep_bytes) {
  std::size_t released = 0;
  Cursor cursor = top();
  while (mapped_bytes() > keep_bytes && next_movable(cursor)) {
    PageTable* table = tables_[cursor.table - 1].get();
    const std::size_t i = cursor.page;
    vm_.unmap(address_of(table, i));
    vm_.release_page(table->handles[i]);
    set_movable(table, i, false);
    set_mapped(table, i, false);
    table->handles[i] = 0;
    table->streams[i] = 0;
    --table->mapped;
    --mapped_pages_;
    released += page_;
  }
  return released;
}

std::string PagedMemory::check(const PageTable* table,
                               const std::vector<std::uint32_t>& expected_refs) const {
  Text problems;
  std::size_t mapped = 0;
  for (std::size_t i = 0; i < table->page_count(); ++i) {
    const std::uint32_t refs = table->refs[i];
    const bool is_mapped = table->handles[i] != 0;
    std::uint32_t expected = i < expected_refs.size() ? expected_refs[i] : 0;
    if (refs != expected) {
      problems << "page " << i << " counts " << refs << " blocks, " << expected << " live; ";
    }
    if (refs > 0 && !is_mapped) problems << "page " << i << " used but unmapped; ";
    const bool movable = (table->movable[i / 64] >> (i % 64)) & 1u;
    if (movable != (is_mapped && refs == 0)) {
      problems << "page " << i << (movable ? " listed as movable but in use or unmapped; "
                                          : " mapped and unused but not listed as movable; ");
    }
    if (((table->mapped_bits[i / 64] >> (i % 64)) & 1u) != (is_mapped ? 1u : 0u)) {
      problems << "page " << i << "'s mapped bit disagrees with its handle; ";
    }
    if (is_mapped) ++mapped;
  }
  if (mapped != table->mapped) problems << "mapped page count disagrees; ";
  return problems.str();
}

}  // namespace gpukeeper::detail
