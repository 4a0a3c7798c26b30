// PoolLimit (pool_limit.hpp): setting the limit and the pressure it defines.
#include "gpukeeper/memory/pool_limit.hpp"

#include <algorithm>
#include <string>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/core/text.hpp"
#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper::detail {

void PoolLimit::set(std::size_t bytes, std::size_t allocated) {
  if (bytes != 0 && bytes < allocated) {
    throw InvalidInputError("limit of " + std::to_string(bytes) + " bytes (" + human_bytes(bytes) +
                            ") is below the " + std::to_string(allocated) + " bytes (" +
                            human_bytes(allocated) + ") now allocated; return buffers first");
  }
  bytes_.store(bytes, std::memory_order_relaxed);
}

double PoolLimit::pressure(std::size_t reserved, const MemoryResource& upstream) const {
  const std::size_t limit = get();
  if (limit != 0) {
    double p = static_cast<double>(reserved) / limit;
    return std::min(1.0, p);
  }
  MemoryInfo info = upstream.memory_info();
  if (info.total == 0) return 0.0;
  double used = static_cast<double>(info.total - std::min(info.free, info.total));
  return std::min(1.0, used / static_cast<double>(info.total));
}

}  // namespace gpukeeper::detail
