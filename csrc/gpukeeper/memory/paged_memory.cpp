// Expandable segments' physical pages (paged_memory.hpp): reserving ranges, mapping pages
// under allocated blocks, moving idle pages to where they are needed, and unmapping them.
#include "gpukeeper/memory/paged_memory.hpp"

#include <algorithm>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"

namespace gpukeeper::detail {

PagedMemory::PagedMemory(VirtualMemory& vm, std::size_t range_bytes, double slack)
    : vm_(vm),
      page_(vm.page_size()),
      range_((range_bytes + page_ - 1) / page_ * page_),
      slack_(slack) {
  if (page_ == 0 || range_ == 0) throw InvalidInputError("PagedMemory: empty page or range");
  if (!(slack_ >= 0.0 && slack_ <= 1.0)) throw InvalidInputError("PagedMemory: slack not in [0, 1]");
}

void PagedMemory::ref(PageTable::Page& page) noexcept {
  if (page.refs++ == 0 && ++live_ > peak_live_) peak_live_ = live_;
}

// Whether one more page keeps the pages held within the slack over the live peak.
bool PagedMemory::within_slack() const noexcept {
  const double peak = static_cast<double>(std::max(peak_live_, live_ + 1));
  return static_cast<double>(mapped_pages_ + 1) <= peak * (1.0 + slack_);
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
  movable_.erase(std::remove_if(movable_.begin(), movable_.end(),
                                [table](const Slot& s) { return s.table == table; }),
                 movable_.end());
  vm_.unreserve(table->base, table->capacity);
  tables_.erase(std::find_if(tables_.begin(), tables_.end(),
                             [table](const auto& t) { return t.get() == table; }));
}

void PagedMemory::extend(PageTable* table, std::size_t bytes) {
  std::size_t pages = (bytes + page_ - 1) / page_;
  if (pages > table->pages.size()) table->pages.resize(pages);
}

VirtualMemory::page_t PagedMemory::take_movable(const StreamsDone& done,
                                                std::vector<Slot>& skipped) {
  while (!movable_.empty()) {
    Slot slot = movable_.front();
    movable_.pop_front();
    PageTable::Page& page = slot.table->pages[slot.index];
    page.listed = false;
    if (page.handle == 0 || page.refs != 0) continue;  // stale entry
    if (page.streams != 0 && !done(page.streams)) {
      skipped.push_back(slot);
      continue;
    }
    VirtualMemory::page_t handle = page.handle;
    vm_.unmap(address_of(slot.table, slot.index));
    page.handle = 0;
    page.streams = 0;
    --slot.table->mapped;
    --mapped_pages_;
    ++moved_;
    return handle;
  }
  return 0;
}

bool PagedMemory::acquire(PageTable* table, std::uintptr_t addr, std::size_t size,
                          const StreamsDone& done, const std::function<bool()>& may_create) {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  // Count the block on its mapped pages first, so that none of them is moved into a hole.
  std::size_t unmapped = 0;
  for (std::size_t i = first; i <= last; ++i) {
    if (table->pages[i].handle != 0) {
      ref(table->pages[i]);
    } else {
      ++unmapped;
    }
  }
  if (unmapped == 0) return true;  // the cached case: nothing to map

  std::vector<Slot> skipped;
  bool mapped = false;
  try {
    mapped = map_unmapped(table, first, last, done, may_create, skipped);
  } catch (...) {
    undo_acquire(table, first, last, skipped);
    throw;
  }
  if (!mapped) {
    undo_acquire(table, first, last, skipped);
    return false;
  }
  relist(skipped);
  return true;
}

// Maps a page under each unmapped page of [first, last]; runs of pages mapped here get
// their access in one call each. False when no page can be had; pages mapped so far stay
// mapped (and counted) for the caller to undo.
bool PagedMemory::map_unmapped(PageTable* table, std::size_t first, std::size_t last,
                               const StreamsDone& done, const std::function<bool()>& may_create,
                               std::vector<Slot>& skipped) {
  Run run;
  try {
    for (std::size_t i = first; i <= last; ++i) {
      if (table->pages[i].handle != 0) {  // mapped before this call (counted by acquire)
        flush_run(table, run);
        continue;
      }
      VirtualMemory::page_t handle = find_page(done, may_create, skipped);
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

// A page for a hole: a new one while the pages held stay within the slack, else a
// movable one whose streams are done, else a new one if may_create allows; 0 if none.
VirtualMemory::page_t PagedMemory::find_page(const StreamsDone& done,
                                             const std::function<bool()>& may_create,
                                             std::vector<Slot>& skipped) {
  VirtualMemory::page_t handle = 0;
  if (within_slack() && may_create()) handle = vm_.create_page();
  if (handle != 0) {
    ++created_;
    return handle;
  }
  handle = take_movable(done, skipped);
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
  ref(page);
  page.streams = 0;
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

// Puts back the movable pages take_movable skipped (their streams were busy).
void PagedMemory::relist(const std::vector<Slot>& skipped) {
  for (const Slot& s : skipped) {
    s.table->pages[s.index].listed = true;
    movable_.push_back(s);
  }
}

// A failed acquire: the block is uncounted from the pages of [first, last]; pages mapped
// by the call stay mapped and become movable.
void PagedMemory::undo_acquire(PageTable* table, std::size_t first, std::size_t last,
                               const std::vector<Slot>& skipped) {
  relist(skipped);
  for (std::size_t j = first; j <= last; ++j) {
    if (table->pages[j].handle != 0) unref(table, j, 0);
  }
}

void PagedMemory::unref(PageTable* table, std::size_t index, std::uint64_t stream_bits) {
  PageTable::Page& page = table->pages[index];
  page.streams |= stream_bits;
  if (--page.refs != 0) return;
  --live_;
  if (!page.listed && page.handle != 0) {
    page.listed = true;
    movable_.push_back({table, index});
  }
}

void PagedMemory::release(PageTable* table, std::uintptr_t addr, std::size_t size,
                          std::uint64_t stream_bits) {
  const std::size_t first = (addr - table->base) / page_;
  const std::size_t last = (addr + size - 1 - table->base) / page_;
  for (std::size_t i = first; i <= last; ++i) unref(table, i, stream_bits);
}

std::size_t PagedMemory::unmap_movable(std::size_t keep_bytes) {
  std::size_t released = 0;
  while (!movable_.empty() && mapped_bytes() > keep_bytes) {
    Slot slot = movable_.front();
    movable_.pop_front();
    PageTable::Page& page = slot.table->pages[slot.index];
    page.listed = false;
    if (page.handle == 0 || page.refs != 0) continue;
    vm_.unmap(address_of(slot.table, slot.index));
    vm_.release_page(page.handle);
    page.handle = 0;
    page.streams = 0;
    --slot.table->mapped;
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
    if (page.handle != 0) ++mapped;
  }
  if (mapped != table->mapped) problems << "mapped page count disagrees; ";
  return problems.str();
}

}  // namespace gpukeeper::detail
