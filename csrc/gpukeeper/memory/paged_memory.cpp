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
  auto relist_skipped = [&] {
    for (const Slot& s : skipped) {
      s.table->pages[s.index].listed = true;
      movable_.push_back(s);
    }
  };
  auto undo = [&] {
    relist_skipped();
    // Pages mapped by this call stay mapped and become movable.
    for (std::size_t j = first; j <= last; ++j) {
      if (table->pages[j].handle != 0) unref(table, j, 0);
    }
  };
  // Runs of pages mapped by this call get their access in one call each.
  std::size_t run_start = 0, run_length = 0;
  auto flush_run = [&] {
    if (run_length == 0) return;
    const std::size_t count = run_length;
    run_length = 0;
    try {
      vm_.set_access(address_of(table, run_start), count * page_);
    } catch (...) {
      // Pages nobody may access must not stay mapped: a later block would fault on them.
      for (std::size_t k = run_start; k < run_start + count; ++k) {
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
  };
  try {
    for (std::size_t i = first; i <= last; ++i) {
      PageTable::Page& page = table->pages[i];
      if (page.handle != 0) {  // mapped before this call (counted above)
        flush_run();
        continue;
      }
      VirtualMemory::page_t handle = 0;
      if (within_slack() && may_create()) handle = vm_.create_page();
      if (handle != 0) {
        ++created_;
      } else {
        handle = take_movable(done, skipped);
        if (handle == 0 && may_create()) {
          handle = vm_.create_page();
          if (handle != 0) ++created_;
        }
      }
      if (handle == 0) {
        flush_run();
        undo();
        return false;
      }
      try {
        vm_.map(address_of(table, i), handle);
      } catch (...) {
        vm_.release_page(handle);
        throw;
      }
      page.handle = handle;
      page.refs = 0;
      ref(page);
      page.streams = 0;
      ++table->mapped;
      ++mapped_pages_;
      if (run_length == 0) run_start = i;
      ++run_length;
    }
    flush_run();
  } catch (...) {
    try {
      flush_run();
    } catch (...) {
    }
    undo();
    throw;
  }
  relist_skipped();
  return true;
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
