// HybridLayout (hybrid_layout.hpp).
#include "gpukeeper/memory/hybrid_layout.hpp"

namespace gpukeeper {

SegmentLayout HybridLayout::id() const noexcept { return SegmentLayout::hybrid; }

SegmentSource HybridLayout::source(bool small) const noexcept {
  return small ? SegmentSource::fixed : SegmentSource::expandable;
}

}  // namespace gpukeeper
