// Expandable segments' physical pages (paged_memory.hpp): reserving ranges, mapping pages
// under allocated blocks, moving idle pages to where they are needed (keeping the old
// mapping as a stale alias while there is room), and unmapping them.
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

void set_bit(std::vector<std::uint64_t>& bits, std::size_t index, bool on) noexcept {
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  if (on) {
    bits[index / 64] |= bit;
  } else {
    bits[index / 64] &= ~bit;
  }
}

}  // namespace

PagedMemory::PagedMemory(VirtualMemory& vm, std::size_t range_bytes)
    : vm_(vm), page_(vm.page_size()), range_(page_ ? (range_bytes + page_ - 1) / page_ * page_ : 0) {
  if (page_ == 0 || range_ == 0) throw InvalidInputError("PagedMemory: empty page or range");
  // Page indices are shifts, not divisions: a 64-bit division costs tens of cycles, and
  // every allocation and free of an expandable block computes four of them.
  if ((page_ & (page_ - 1)) != 0) {
    throw InvalidInputError("PagedMemory: page size " + std::to_string(page_) + " is not a power of two");
  }
  shift_ = static_cast<unsigned>(__builtin_ctzll(page_));
}

void PagedMemory::set_movable(PageTable* table, std::size_t index, bool movable) noexcept {
  set_bit(table->movable, index, movable);
}

void PagedMemory::set_home_bit(PageTable* table, std::size_t index, bool home) noexcept {
  set_bit(table->home_bits, index, home);
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
    std::uint64_t bits = table->home_bits[w] & mask;
    table->movable[w] &= ~bits;
    if (bits == mask) {  // all homes (the warm case): one run of slots, counted without popcount
      const unsigned low = static_cast<unsigned>(__builtin_ctzll(mask));
      const std::size_t n = 64u - low - static_cast<unsigned>(__builtin_clzll(mask));
      std::fill_n(table->refs.begin() + static_cast<std::ptrdiff_t>(w * 64 + low), n, 1u);
      counted += n;
      return;
    }
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
  // A live block sits on homes only: every one of them becomes movable.
  for_each_word(begin, last - 1, [&](std::size_t w, std::uint64_t mask) {
    table->movable[w] |= table->home_bits[w] & mask;
  });
  live_ -= count;
}

std::size_t PagedMemory::unmapped_pages(const PageTable* table, std::uintptr_t addr,
                                        std::size_t size) const noexcept {
  const std::size_t first = page_index(table, addr), last = page_index(table, addr + size - 1);
  const std::size_t n = table->page_count();
  if (first >= n) return last - first + 1;
  const std::size_t end = std::min(last, n - 1);
  std::size_t homes = 0;
  for_each_word(first, end, [&](std::size_t w, std::uint64_t mask) {
    homes += static_cast<std::size_t>(__builtin_popcountll(table->home_bits[w] & mask));
  });
  return last - first + 1 - homes;
}

bool PagedMemory::all_mapped(const PageTable* table, std::uintptr_t addr,
                             std::size_t size) const noexcept {
  const std::size_t first = page_index(table, addr), last = page_index(table, addr + size - 1);
  if (last >= table->page_count()) return false;
  bool all = true;
  for_each_word(first, last, [&](std::size_t w, std::uint64_t mask) {
    all &= (table->home_bits[w] & mask) == mask;
  });
  return all;
}

void PagedMemory::count_in(PageTable* table, std::uintptr_t addr, std::size_t size) noexcept {
  const std::size_t first = page_index(table, addr), last = page_index(table, addr + size - 1);
  // The two end pages may be shared with neighbours; those inside are the block's alone.
  ref_inner(table, first, last);
  for (std::size_t i : {first, last}) {
    if (is_home(table, i)) ref(table, i);
    if (last == first) break;
  }
}

// Pages up to the most that live blocks touched at once are memory the trace needed, never
// spare; beyond them, the caller's limit (its budget for spare memory) decides.
bool PagedMemory::may_add_page(std::size_t spare_limit) const noexcept {
  const std::size_t after = mapped_pages_ + 1;
  return after <= std::max(peak_live_, live_ + 1) || after * page_ <= spare_limit;
}

PagedMemory::~PagedMemory() {
  for (std::uint32_t id = 1; id < pages_.size(); ++id) {
    Page& p = pages_[id];
    if (p.handle == 0) continue;
    if (p.home.table != nullptr) vm_.unmap(address_of(p.home.table, p.home.index));
    for (unsigned a = 0; a < p.alias_count; ++a) vm_.unmap(address_of(p.alias[a].table, p.alias[a].index));
    vm_.release_page(p.handle);
  }
  for (auto& table : tables_) vm_.unreserve(table->base, table->capacity);
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
  if (table->mapped != 0 || table->aliases != 0) {
    throw GpuError("PagedMemory::unreserve: range still has mapped pages");
  }
  vm_.unreserve(table->base, table->capacity);
  tables_.erase(std::find_if(tables_.begin(), tables_.end(),
                             [table](const auto& t) { return t.get() == table; }));
}

void PagedMemory::extend(PageTable* table, std::size_t bytes) {
  std::size_t pages = (bytes + page_ - 1) / page_;
  if (pages > table->page_count()) {
    table->ids.resize(pages, 0);
    table->refs.resize(pages, 0);
    table->streams.resize(pages, 0);
    table->home_bits.resize((pages + 63) / 64, 0);
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

std::uint32_t PagedMemory::new_page(VirtualMemory::page_t handle) {
  std::uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    pages_.emplace_back();
    id = static_cast<std::uint32_t>(pages_.size() - 1);
  }
  pages_[id] = Page{};
  pages_[id].handle = handle;
  ++mapped_pages_;
  ++created_;
  made_.push_back(id);
  return id;
}

void PagedMemory::leave_home(std::uint32_t id) {
  Page& p = pages_[id];
  PageTable* table = p.home.table;
  const std::size_t i = p.home.index;
  if (observer_) observer_(false, address_of(table, i), page_);
  set_home_bit(table, i, false);
  set_movable(table, i, false);
  table->streams[i] = 0;
  --table->mapped;
  if (p.alias_count < kMaxAliases) {
    p.alias[p.alias_count++] = p.home;
    ++table->aliases;
  } else {
    vm_.unmap(address_of(table, i));
    table->ids[i] = 0;
  }
  p.home = Slot{};
}

void PagedMemory::set_home(std::uint32_t id, PageTable* table, std::size_t index) noexcept {
  pages_[id].home = Slot{table, index};
  if (observer_) observer_(true, address_of(table, index), page_);
  table->ids[index] = id;
  table->streams[index] = 0;
  set_home_bit(table, index, true);
  ++table->mapped;
}

void PagedMemory::forget_alias(PageTable* table, std::size_t index) noexcept {
  Page& p = pages_[table->ids[index]];
  for (unsigned a = 0; a < p.alias_count; ++a) {
    if (p.alias[a].table == table && p.alias[a].index == index) {
      p.alias[a] = p.alias[--p.alias_count];
      break;
    }
  }
  --table->aliases;
}

void PagedMemory::drop_alias(PageTable* table, std::size_t index) noexcept {
  forget_alias(table, index);
  vm_.unmap(address_of(table, index));
  table->ids[index] = 0;
}

std::vector<int> PagedMemory::share(const PageTable* table, std::uintptr_t addr, std::size_t size) {
  std::vector<int> fds;
  if (size == 0) return fds;
  const std::size_t first = page_index(table, addr);
  const std::size_t last = page_index(table, addr + size - 1);
  fds.reserve(last - first + 1);
  for (std::size_t i = first; i <= last; ++i) {
    const std::uint32_t id = table->ids[i];
    if (id == 0 || !is_home(table, i)) {
      throw GpuError("share: the page at " + hex(reinterpret_cast<const void*>(address_of(table, i))) +
                     " under the block is not mapped there");
    }
    fds.push_back(vm_.share_page(pages_[id].handle));
  }
  return fds;
}

void PagedMemory::drop_page(std::uint32_t id) noexcept {
  Page& p = pages_[id];
  while (p.alias_count != 0) drop_alias(p.alias[0].table, p.alias[0].index);
  if (PageTable* table = p.home.table) {
    const std::size_t i = p.home.index;
    if (observer_) observer_(false, address_of(table, i), page_);
    vm_.unmap(address_of(table, i));
    set_home_bit(table, i, false);
    set_movable(table, i, false);
    table->ids[i] = 0;
    table->refs[i] = 0;
    table->streams[i] = 0;
    --table->mapped;
  }
  vm_.release_page(p.handle);
  p = Page{};
  free_ids_.push_back(id);
  --mapped_pages_;
  ++released_;
}

// Takes the highest movable page below `cursor` whose streams are done from its home,
// for the caller to map elsewhere; 0 when none is.
std::uint32_t PagedMemory::take_movable(Cursor& cursor, const StreamsDone& done) {
  while (next_movable(cursor)) {
    PageTable* table = tables_[cursor.table - 1].get();
    const std::uint64_t streams = table->streams[cursor.page];
    if (streams != 0 && !done(streams)) continue;  // busy: look lower
    const std::uint32_t id = table->ids[cursor.page];
    leave_home(id);
    ++moved_;
    return id;
  }
  return 0;
}

bool PagedMemory::acquire(PageTable* table, std::uintptr_t addr, std::size_t size,
                          const StreamsDone& done, const std::function<bool()>& may_create,
                          std::size_t spare_limit) {
  const std::size_t first = page_index(table, addr), last = page_index(table, addr + size - 1);
  // Count the block on its homes first, so that none of them is moved into a hole.
  const bool mapped_already = all_mapped(table, addr, size);
  count_in(table, addr, size);
  if (mapped_already) return true;  // the cached case: nothing to map

  made_.clear();
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

// Brings back the stale alias at a slot as its page's home, with no driver call, when the
// page has no block on it and its streams are done (the new block may be on another
// stream than the page's last user). False, changing nothing, otherwise.
bool PagedMemory::revive(PageTable* table, std::size_t index, const Cursor& cursor,
                         const StreamsDone& done) {
  const std::uint32_t id = table->ids[index];
  Page& p = pages_[id];
  if (p.home.table->refs[p.home.index] != 0) return false;  // in use at its home
  // Only the page a move would take anyway (the highest movable one): taking another
  // from its home for free would leave a hole where the next step's blocks land (always
  // reviving, tried, moved 11.8 pages per 1 000 operations on mdlong instead of 0.07).
  Cursor probe = cursor;
  if (!next_movable(probe) || tables_[probe.table - 1].get() != p.home.table ||
      probe.page != p.home.index) {
    return false;
  }
  const std::uint64_t streams = p.home.table->streams[p.home.index];
  if (streams != 0 && !done(streams)) return false;
  forget_alias(table, index);
  leave_home(id);  // the old home becomes the alias now (room was just made)
  set_home(id, table, index);
  ref(table, index);
  ++revived_;
  return true;
}

// Gives each slot of [first, last] without a home a page: its stale alias brought back,
// else a new or moved page; runs of pages mapped here get their access in one call each.
// False when no page can be had; pages mapped so far stay mapped (and counted) for the
// caller to undo.
bool PagedMemory::map_unmapped(PageTable* table, std::size_t first, std::size_t last,
                               const StreamsDone& done, const std::function<bool()>& may_create,
                               std::size_t spare_limit) {
  Run run;
  Cursor cursor = top();
  try {
    for (std::size_t i = first; i <= last; ++i) {
      if (is_home(table, i)) {  // a home before this call (counted by acquire), or revived
        flush_run(table, run);
        continue;
      }
      if (table->ids[i] != 0) {
        if (revive(table, i, cursor, done)) {
          flush_run(table, run);  // the alias was granted access when it was mapped
          continue;
        }
        drop_alias(table, i);
      }
      const std::uint32_t id = find_page(cursor, done, may_create, spare_limit);
      if (id == 0) {
        flush_run(table, run);
        return false;
      }
      map_page(table, i, id);
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
std::uint32_t PagedMemory::find_page(Cursor& cursor, const StreamsDone& done,
                                     const std::function<bool()>& may_create,
                                     std::size_t spare_limit) {
  VirtualMemory::page_t handle = 0;
  if (may_add_page(spare_limit) && may_create()) handle = vm_.create_page();
  if (handle != 0) return new_page(handle);
  if (std::uint32_t id = take_movable(cursor, done)) return id;
  if (may_create()) {
    handle = vm_.create_page();
    if (handle != 0) return new_page(handle);
  }
  return 0;
}

// Maps page `id` (without a home) at slot `index`, which becomes its home, and counts the
// new block on it; the page is dropped (with its aliases) if the mapping fails.
void PagedMemory::map_page(PageTable* table, std::size_t index, std::uint32_t id) {
  try {
    vm_.map(address_of(table, index), pages_[id].handle);
  } catch (...) {
    drop_page(id);
    throw;
  }
  set_home(id, table, index);
  table->refs[index] = 0;
  ref(table, index);
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
      table->refs[k] = 0;
      --live_;
      drop_page(table->ids[k]);
    }
    throw;
  }
}

// A failed acquire: the block is uncounted from the homes of [first, last]. Pages the call
// made are released, so that a failed request holds no more memory than before; pages it
// moved stay where they are now, movable (moving them back would cost as much again).
void PagedMemory::undo_acquire(PageTable* table, std::size_t first, std::size_t last) {
  for (std::size_t j = first; j <= last; ++j) {
    if (is_home(table, j)) unref(table, j, 0);
  }
  for (std::uint32_t id : made_) {
    if (pages_[id].handle != 0) drop_page(id);  // a failed map may have dropped it already
  }
  made_.clear();
}

void PagedMemory::unref(PageTable* table, std::size_t index, std::uint64_t stream_bits) {
  table->streams[index] |= stream_bits;
  if (--table->refs[index] != 0) return;
  --live_;
  set_movable(table, index, true);
}

void PagedMemory::release(PageTable* table, std::uintptr_t addr, std::size_t size,
                          std::uint64_t stream_bits) {
  const std::size_t first = page_index(table, addr), last = page_index(table, addr + size - 1);
  unref_inner(table, first, last, stream_bits);
  unref(table, first, stream_bits);
  if (last != first) unref(table, last, stream_bits);
}

std::size_t PagedMemory::unmap_movable(std::size_t keep_bytes) {
  // Aliases hold no memory of their own but keep ranges from being given back.
  for (std::uint32_t id = 1; id < pages_.size(); ++id) {
    Page& p = pages_[id];
    while (p.alias_count != 0) drop_alias(p.alias[0].table, p.alias[0].index);
  }
  std::size_t released = 0;
  Cursor cursor = top();
  while (mapped_bytes() > keep_bytes && next_movable(cursor)) {
    PageTable* table = tables_[cursor.table - 1].get();
    drop_page(table->ids[cursor.page]);
    released += page_;
  }
  return released;
}

std::string PagedMemory::check(const PageTable* table,
                               const std::vector<std::uint32_t>& expected_refs) const {
  Text problems;
  std::size_t homes = 0, aliases = 0;
  for (std::size_t i = 0; i < table->page_count(); ++i) {
    const std::uint32_t refs = table->refs[i];
    const std::uint32_t id = table->ids[i];
    const bool home = is_home(table, i);
    std::uint32_t expected = i < expected_refs.size() ? expected_refs[i] : 0;
    if (refs != expected) {
      problems << "page " << i << " counts " << refs << " blocks, " << expected << " live; ";
    }
    if (refs > 0 && !home) problems << "page " << i << " used but not a page's home; ";
    if (table->streams[i] != 0 && !home) problems << "page " << i << " keeps streams but is not a home; ";
    const bool movable = (table->movable[i / 64] >> (i % 64)) & 1u;
    if (movable != (home && refs == 0)) {
      problems << "page " << i << (movable ? " listed as movable but in use or not a home; "
                                          : " a home and unused but not listed as movable; ");
    }
    if (id == 0) {
      if (home) problems << "page " << i << " marked a home with no page; ";
      continue;
    }
    const Page& p = pages_[id];
    if (home) {
      ++homes;
      if (p.home.table != table || p.home.index != i) problems << "page " << i << "'s page has its home elsewhere; ";
    } else {
      ++aliases;
      bool listed = false;
      for (unsigned a = 0; a < p.alias_count; ++a) listed |= p.alias[a].table == table && p.alias[a].index == i;
      if (!listed) problems << "page " << i << " holds a mapping its page does not list; ";
    }
  }
  if (homes != table->mapped) problems << "mapped page count disagrees; ";
  if (aliases != table->aliases) problems << "alias count disagrees; ";
  return problems.str();
}

}  // namespace gpukeeper::detail
