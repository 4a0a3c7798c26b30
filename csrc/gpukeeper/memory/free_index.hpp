// Free blocks of one stream and one size class (small or large), in segregated size bins
// with a bitmap of the non-empty ones. Sizes are multiples of 256 bytes. Bins are exact
// below 16 KiB; above, each power of two is split into 32 bins (3% wide), so that a
// best-fit search looks at one short list and then jumps to the next non-empty bin.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpukeeper/memory/block.hpp"

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

  void insert(Block* block) noexcept;
  void remove(Block* block) noexcept;

  // The smallest free block of at least `bytes` (exact within the request's bin, the
  // smallest of a few candidates in the next non-empty bin), or nullptr.
  Block* best_fit(std::size_t bytes) const noexcept;

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
};

}  // namespace gpukeeper::detail
