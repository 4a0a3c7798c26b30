// ExpandableLayout (expandable_layout.hpp).
#include "gpukeeper/memory/expandable_layout.hpp"

namespace gpukeeper {

SegmentLayout ExpandableLayout::id() const noexcept { return SegmentLayout::expandable; }

SegmentSource ExpandableLayout::source(bool /*small*/) const noexcept {
  return SegmentSource::expandable;
}

}  // namespace gpukeeper
