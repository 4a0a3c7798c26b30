// Free blocks of one stream and one size class (small or large), in segregated size bins
// with a bitmap of the non-empty ones. Sizes are multiples of 256 bytes. Bins are exact
// below 16 KiB; above, each power of two is split into 32 bins (3% wide), so that a
// best-fit search looks at one short list and then jumps to the next non-empty bin.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpukeeper/memory/block.hpp"
#include "gpukeeper/memory/free_starts.hpp"

namespace gpukeeper::detail {

class FreeIndex {
 public:
  static constexpr unsigned kUnitShift = 8;  // 256-byte units
  static constexpr unsigned kLinearBins = 64;
  static constexpr unsigned kSubBins = 32;  // per power of two
  static constexpr unsigned kMaxLog2 = 56;  // units up to 2^56 (beyond any real request)
  static constexpr unsigned kBins = kLinearBins + (kMaxLog2 - 6) * kSubBins;
  static constexpr unsigned kWords = (kBins + 63) / 64;

  static std::uint32_t bin_of(std::size_t bytes) noexcept;

  void insert(Block* block);
  void remove(Block* block) noexcept;

  // Expandable classes: the free blocks of over `page` bytes are also kept in address
  // order (FreeStarts), for lowest_where.
  void keep_addresses(std::size_t page) noexcept { starts_.set_page(page); }
  // In address order, the first free block of over one page (keep_addresses) that
  // `accept` takes, or nullptr.
  template <typename Accept>
  Block* lowest_where(Accept&& accept) const {
    return starts_.lowest_where(accept);
  }
  // The expandable range at `base` is given back.
  void forget_range(std::uintptr_t base) noexcept { starts_.forget(base); }
  // Free blocks kept in address order.
  std::size_t kept() const noexcept { return starts_.size(); }

  // The smallest free block of at least `bytes` (exact within the request's bin, the
  // smallest of a few candidates in the next non-empty bin), or nullptr.
  Block* best_fit(std::size_t bytes) const noexcept;

  // In size order from the request's bin up, the first of at most `max_candidates` free
  // blocks of at least `bytes` that `accept` takes; nullptr when none of them does.
  // Expandable segments look for a block whose pages are mapped already before falling
  // back to best_fit: mapping a page costs driver calls, and bytes of address do not.
  template <typename Accept>
  Block* first_fit_where(std::size_t bytes, unsigned max_candidates, Accept&& accept) const {
    if (count_ == 0) return nullptr;
    unsigned seen = 0;
    for (unsigned bin = next_used(bin_of(bytes)); bin < kBins; bin = next_used(bin + 1)) {
      for (Block* b = heads_[bin]; b != nullptr; b = b->free_next) {
        if (b->size < bytes) continue;
        if (accept(b)) return b;
        if (++seen == max_candidates) return nullptr;
      }
    }
    return nullptr;
  }

  // The largest free block, or nullptr when empty.
  Block* largest() const noexcept;

  bool empty() const noexcept { return count_ == 0; }
  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

  template <typename F>
  void for_each(F&& f) const {
    for (unsigned w = 0; w < kWords; ++w) {
      std::uint64_t bits = used_[w];
      while (bits) {
        unsigned bin = w * 64 + static_cast<unsigned>(__builtin_ctzll(bits));
        bits &= bits - 1;
        for (Block* b = heads_[bin]; b != nullptr;) {
          Block* next = b->free_next;  // f may remove b
          f(b);
          b = next;
        }
      }
    }
  }

 private:
  // First non-empty bin at or after `bin`, or kBins.
  unsigned next_used(unsigned bin) const noexcept;

  std::array<Block*, kBins> heads_{};
  std::array<std::uint64_t, kWords> used_{};
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
  FreeStarts starts_;
};

// Inline: every free, merge and placement of the pool goes through them.
inline void FreeIndex::insert(Block* block) {
  if (starts_.active()) starts_.add(block);
  std::uint32_t bin = bin_of(block->size);
  block->bin = bin;
  block->free_prev = nullptr;
  block->free_next = heads_[bin];
  if (heads_[bin] != nullptr) heads_[bin]->free_prev = block;
  heads_[bin] = block;
  used_[bin / 64] |= std::uint64_t{1} << (bin % 64);
  ++count_;
  bytes_ += block->size;
}

inline void FreeIndex::remove(Block* block) noexcept {
  if (starts_.active()) starts_.drop(block);
  std::uint32_t bin = block->bin;
  if (block->free_prev != nullptr) {
    block->free_prev->free_next = block->free_next;
  } else {
    heads_[bin] = block->free_next;
    if (heads_[bin] == nullptr) used_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
  }
  if (block->free_next != nullptr) block->free_next->free_prev = block->free_prev;
  block->free_prev = block->free_next = nullptr;
  --count_;
  bytes_ -= block->size;
}

}  // namespace gpukeeper::detail
