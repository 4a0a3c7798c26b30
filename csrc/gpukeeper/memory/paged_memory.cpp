// Expandable segments' physical pages (paged_memory.hpp): reserving ranges, mapping pages
// under allocated blocks, moving idle pages to where they are needed, and unmapping them.
#include "gpukeeper/memory/paged_memory.hpp"

#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"

namespace gpukeeper::detail {

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

void PagedMemory::ref(PageTable* table, std::size_t index) noexcept {
  if (table->pages[index].refs++ != 0) return;
  set_movable(table, index, false);
  if (++live_ > peak_live_) peak_live_ = live_;
}

// Pages up to the most that live blocks touched at once are memory the trace needed, never
// spare; beyond them, the caller's limit (its budget for spare memory) decides.
bool PagedMemory::may_add_page(std::size_t spare_limit) const noexcept {
  const std::size_t after = mapped_pages_ + 1;
  return after <= std::max(peak_live_, live_ + 1) || after * page_ <= spare_limit;
}

PagedMemory::~PagedMemory() {
  for (auto& table : tables_) {
    for (std::size_t i = 0; i < table->pages.size(); ++i) {
      if (VirtualMemory::page_t h = table->pages[i].handle) {
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
  if (pages > table->pages.size()) {
    table->pages.resize(pages);
    table->movable.resize((pages + 63) / 64, 0);
  }
}

bool PagedMemory::next_movable(Cursor& cursor) const noexcept {
  while (cursor.table != 0) {
    const PageTable* table = tables_[cursor.table - 1].get();
    std::size_t end = std::min(cursor.page, table->pages.size());  // pages [0, end) left
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
    PageTable::Page& page = table->pages[cursor.page];
    if (page.streams != 0 && !done(page.streams)) continue;  // busy: look lower
    VirtualMemory::page_t handle = page.handle;
    vm_.unmap(address_of(table, cursor.page));
    set_movable(table, cursor.page, false);
    page.handle = 0;
    page.streams = 0;
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
  std::size_t unmapped = 0;
  for (std::size_t i = first; i <= last; ++i) {
    if (table->pages[i].handle != 0) {
      ref(table, i);
    } else {
      ++unmapped;
    }
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
      if (table->pages[i].handle != 0) {  // mapped before this call (counted by acquire)
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
  PageTable::Page& page = table->pages[index];
  page.handle = handle;
  page.refs = 0;
  page.streams = 0;
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
      PageTable::Page& p = table->pages[k];
      vm_.unmap(address_of(table, k));
      vm_.release_page(p.handle);
      p.handle = 0;
      p.refs = 0;
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
    if (table->pages[j].handle != 0) unref(table, j, 0);
  }
}

void PagedMemory::unref(PageTable* table, std::size_t index, std::uint64_t stream_bits) {
  PageTable::Page& page = table->pages[index];
  page.streams |= stream_bits;
  if (--page.refs != 0) return;
  --live_;
  if (page.handle != 0) set_movable(table, index, true);
}

void PagedMemory::release(PageTable* table, std::uintptr_t addr, std::size_t size,
                          std::uint64_t stream_bits) {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  for (std::size_t i = first; i <= last; ++i) unref(table, i, stream_bits);
}

std::size_t PagedMemory::unmap_movable(std::size_t keep_bytes) {
  std::size_t released = 0;
  Cursor cursor = top();
  while (mapped_bytes() > keep_bytes && next_movable(cursor)) {
    PageTable* table = tables_[cursor.table - 1].get();
    PageTable::Page& page = table->pages[cursor.page];
    vm_.unmap(address_of(table, cursor.page));
    vm_.release_page(page.handle);
    set_movable(table, cursor.page, false);
    page.handle = 0;
    page.streams = 0;
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
  for (std::size_t i = 0; i < table->pages.size(); ++i) {
    const PageTable::Page& page = table->pages[i];
    std::uint32_t expected = i < expected_refs.size() ? expected_refs[i] : 0;
    if (page.refs != expected) {
      problems << "page " << i << " counts " << page.refs << " blocks, " << expected << " live; ";
    }
    if (page.refs > 0 && page.handle == 0) problems << "page " << i << " used but unmapped; ";
    const bool movable = (table->movable[i / 64] >> (i % 64)) & 1u;
    if (movable != (page.handle != 0 && page.refs == 0)) {
      problems << "page " << i << (movable ? " listed as movable but in use or unmapped; "
                                          : " mapped and unused but not listed as movable; ");
    }
    if (page.handle != 0) ++mapped;
  }
  if (mapped != table->mapped) problems << "mapped page count disagrees; ";
  return problems.str();
}

}  // namespace gpukeeper::detail
