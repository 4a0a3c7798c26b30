// HybridLayout: requests over PoolOptions::small_size in expandable ranges, small ones
// in fixed segments: no page is ever moved for the many small operations of a step, and
// their waste is bounded by what small segments can strand. Needs the upstream's virtual
// memory; SegmentLayout::automatic picks it over device memory that has it.
// Python: MemoryPool(expandable="hybrid"). Registered in pool_layout.cpp (kLayouts).
#pragma once

#include "gpukeeper/memory/pool_layout.hpp"

namespace gpukeeper {

class HybridLayout final : public PoolLayout {
 public:
  SegmentLayout id() const noexcept override;
  SegmentSource source(bool small) const noexcept override;
};

}  // namespace gpukeeper
