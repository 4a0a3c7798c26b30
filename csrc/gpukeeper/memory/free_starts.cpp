// FreeStarts (free_starts.hpp): the rarer steps, a range met for the first time, given
// back, or grown.
#include "gpukeeper/memory/free_starts.hpp"

#include <algorithm>

namespace gpukeeper::detail {

FreeStarts::Range& FreeStarts::find_or_make(std::uintptr_t base) {
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), base,
                             [](const Range& r, std::uintptr_t b) { return r.base < b; });
  if (it == ranges_.end() || it->base != base) {
    Range fresh;
    fresh.base = base;
    it = ranges_.insert(it, std::move(fresh));  // the others may move: last_ is set below
  }
  last_ = &*it;
  return *it;
}

void FreeStarts::forget(std::uintptr_t base) noexcept {
  for (auto it = ranges_.begin(); it != ranges_.end(); ++it) {
    if (it->base != base) continue;
    ranges_.erase(it);
    last_ = nullptr;
    return;
  }
}

void FreeStarts::grow(Range& r, std::size_t slot) {
  // Ranges grow a page at a time: room for twice as many, so that a growing range
  // resizes rarely.
  const std::size_t pages = std::max<std::size_t>(64, 2 * (slot + 1));
  r.blocks.resize(pages, nullptr);
  r.bits.resize((pages + 63) / 64, 0);
}

}  // namespace gpukeeper::detail
