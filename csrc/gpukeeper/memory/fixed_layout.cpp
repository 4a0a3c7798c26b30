// FixedLayout (fixed_layout.hpp).
#include "gpukeeper/memory/fixed_layout.hpp"

namespace gpukeeper {

SegmentLayout FixedLayout::id() const noexcept { return SegmentLayout::fixed; }

SegmentSource FixedLayout::source(bool /*small*/) const noexcept { return SegmentSource::fixed; }

}  // namespace gpukeeper
