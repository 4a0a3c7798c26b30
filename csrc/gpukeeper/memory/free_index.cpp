#include "gpukeeper/memory/free_index.hpp"

namespace gpukeeper::detail {

namespace {
// Candidates compared in a bin before settling: bins are narrow, so the first few
// hold a near-best block, and a bound keeps a long bin from costing a scan.
constexpr int kScanLimit = 8;
}  // namespace

std::uint32_t FreeIndex::bin_of(std::size_t bytes) noexcept {
  std::uint64_t units = bytes >> kUnitShift;
  if (units < kLinearBins) return static_cast<std::uint32_t>(units);
  unsigned log2 = 63u - static_cast<unsigned>(__builtin_clzll(units));  // >= 6
  if (log2 >= kMaxLog2) return kBins - 1;
  unsigned sub = static_cast<unsigned>(units >> (log2 - 5)) & (kSubBins - 1);
  return kLinearBins + (log2 - 6) * kSubBins + sub;
}

unsigned FreeIndex::next_used(unsigned bin) const noexcept {
  if (bin >= kBins) return kBins;
  unsigned w = bin / 64;
  std::uint64_t bits = used_[w] & (~std::uint64_t{0} << (bin % 64));
  while (bits == 0) {
    if (++w == kWords) return kBins;
    bits = used_[w];
  }
  return w * 64 + static_cast<unsigned>(__builtin_ctzll(bits));
}

Block* FreeIndex::best_fit(std::size_t bytes) const noexcept {
  if (count_ == 0) return nullptr;
  unsigned bin = bin_of(bytes);
  // Own bin: blocks may be smaller than the request; take the smallest that fits.
  Block* best = nullptr;
  int seen = 0;
  for (Block* b = heads_[bin]; b != nullptr; b = b->free_next) {
    if (b->size < bytes) continue;
    if (b->size == bytes) return b;
    if (best == nullptr || b->size < best->size) best = b;
    if (++seen == kScanLimit) break;
  }
  if (best != nullptr) return best;
  // Any block of a later bin fits; prefer the smallest of the first few.
  unsigned next = next_used(bin + 1);
  if (next == kBins) return nullptr;
  seen = 0;
  for (Block* b = heads_[next]; b != nullptr && seen < kScanLimit; b = b->free_next, ++seen) {
    if (best == nullptr || b->size < best->size) best = b;
  }
  return best;
}

Block* FreeIndex::largest() const noexcept {
  if (count_ == 0) return nullptr;
  for (int w = static_cast<int>(kWords) - 1; w >= 0; --w) {
    if (used_[w] == 0) continue;
    unsigned bin = static_cast<unsigned>(w) * 64 + 63u -
                   static_cast<unsigned>(__builtin_clzll(used_[w]));
    Block* largest = heads_[bin];
    for (Block* b = heads_[bin]; b != nullptr; b = b->free_next) {
      if (b->size > largest->size) largest = b;
    }
    return largest;
  }
  return nullptr;
}

}  // namespace gpukeeper::detail
