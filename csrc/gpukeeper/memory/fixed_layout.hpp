// FixedLayout: every size class in fixed segments, taken from the upstream whole and
// kept until released (cleanup, trim, a limit change, or an upstream that runs out). Needs
// no virtual memory: it serves any upstream, and CUDA graphs' private pools use it (pages
// never move under a graph's addresses).
// Python: MemoryPool(expandable=False). Registered in pool_layout.cpp (kLayouts).
#pragma once

#include "gpukeeper/memory/pool_layout.hpp"

namespace gpukeeper {

class FixedLayout final : public PoolLayout {
 public:
  SegmentLayout id() const noexcept override;
  SegmentSource source(bool small) const noexcept override;
};

}  // namespace gpukeeper
