// FreeStarts: a FreeIndex's free blocks of over one page in expandable ranges, in address
// order.
//
// An expandable class places a block of over one page in the lowest free block whose
// pages under it are all mapped (CachingPool::own_fit). Finding that block by a walk of
// the range's blocks, allocated ones included, cost a mixed-size pair about 15 ns; here
// it is a scan of bitmap words. Each range keeps a bit per page, set for the page where
// such a block starts, and the block: at most one can start in a page, since a block of
// over one page reaches into the next. Blocks of a page or less are not kept: a request
// of over one page fits none of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpukeeper/memory/block.hpp"

namespace gpukeeper::detail {

class FreeStarts {
 public:
  // Blocks over `page` bytes (a power of two) are kept; 0 (the default) keeps none. Set
  // only for an index of an expandable class, whose blocks all lie in expandable ranges.
  void set_page(std::size_t page) noexcept {
    page_ = page;
    shift_ = page == 0 ? 0 : static_cast<unsigned>(__builtin_ctzll(page));
  }
  bool active() const noexcept { return page_ != 0; }

  // `block` joins or leaves the index (active() only). Every block comes through, kept or
  // not, and neither branches on its size: the sizes of a mixed workload are random, and
  // with a branch on them a mixed-size pair was 5 ns slower than without this index (1 to
  // 3 ns with none). A block that is not kept changes nothing: its page's slot keeps
  // whatever kept block starts there.
  void add(Block* block) {
    Range* r = range_of(block);
    const std::size_t slot = (block->addr - r->base) >> shift_;
    if (slot >= r->blocks.size()) grow(*r, slot);
    const bool kept = block->size > page_;
    Block* const old = r->blocks[slot];
    r->count += static_cast<std::size_t>(kept && old == nullptr);
    r->blocks[slot] = kept ? block : old;
    r->bits[slot / 64] |= std::uint64_t{kept} << (slot % 64);
  }
  void drop(const Block* block) noexcept {
    Range* r = known(block->segment->base);
    if (r == nullptr) return;
    const std::size_t slot = (block->addr - r->base) >> shift_;
    if (slot >= r->blocks.size()) return;
    Block* const old = r->blocks[slot];
    const bool match = old == block;
    r->count -= static_cast<std::size_t>(match);
    r->blocks[slot] = match ? nullptr : old;
    r->bits[slot / 64] &= ~(std::uint64_t{match} << (slot % 64));
  }

  // The range at `base` is given back: it holds no kept block (its one free block left
  // the index first), and a later range may take its addresses.
  void forget(std::uintptr_t base) noexcept;
  // Kept blocks (validate()).
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (const Range& r : ranges_) n += r.count;
    return n;
  }

  // In address order (lowest range first), the first kept block that `accept` takes, or
  // nullptr.
  template <typename Accept>
  Block* lowest_where(Accept&& accept) const {
    for (const Range& r : ranges_) {
      if (r.count == 0) continue;
      for (std::size_t w = 0; w < r.bits.size(); ++w) {
        std::uint64_t bits = r.bits[w];
        while (bits != 0) {
          const std::size_t slot = w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits));
          bits &= bits - 1;
          if (accept(r.blocks[slot])) return r.blocks[slot];
        }
      }
    }
    return nullptr;
  }

 private:
  struct Range {
    std::uintptr_t base = 0;
    std::vector<std::uint64_t> bits;  // bit s: a kept block starts in page s
    std::vector<Block*> blocks;       // per page: that block
    std::size_t count = 0;
  };
  Range* range_of(const Block* block) {
    const std::uintptr_t base = block->segment->base;
    if (last_ != nullptr && last_->base == base) return last_;
    return &find_or_make(base);
  }
  // The range at `base`, or nullptr when none has been made.
  Range* known(std::uintptr_t base) noexcept {
    if (last_ != nullptr && last_->base == base) return last_;
    for (Range& r : ranges_) {
      if (r.base == base) return &r;
    }
    return nullptr;
  }
  // The range at `base`, made (in base order) when new.
  Range& find_or_make(std::uintptr_t base);
  // Room for page `slot` of `r`.
  static void grow(Range& r, std::size_t slot);

  std::vector<Range> ranges_;  // by base; a handful (one growing range per class, and any not yet given back)
  Range* last_ = nullptr;      // the range found last: nearly always the growing one
  std::size_t page_ = 0;
  unsigned shift_ = 0;  // log2 of page_
};

}  // namespace gpukeeper::detail
