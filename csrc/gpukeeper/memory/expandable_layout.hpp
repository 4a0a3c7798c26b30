// ExpandableLayout: every size class in expandable ranges: one reserved address range per
// class, physical pages mapped only under allocated blocks and moved to where they are
// needed before new ones are made. Needs the upstream's virtual memory (device and host
// kinds).
// Python: MemoryPool(expandable=True). Registered in pool_layout.cpp (kLayouts).
#pragma once

#include "gpukeeper/memory/pool_layout.hpp"

namespace gpukeeper {

class ExpandableLayout final : public PoolLayout {
 public:
  SegmentLayout id() const noexcept override;
  SegmentSource source(bool small) const noexcept override;
};

}  // namespace gpukeeper
