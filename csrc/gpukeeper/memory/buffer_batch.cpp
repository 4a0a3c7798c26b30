#include "gpukeeper/memory/buffer_batch.hpp"

#include <algorithm>
#include <utility>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

BufferBatch::BufferBatch(std::shared_ptr<CachingPool> pool, stream_t stream)
    : pool_(std::move(pool)), stream_(stream) {
  if (!pool_) throw InvalidInputError("BufferBatch needs a pool");
}

BufferBatch::BufferBatch(BufferBatch&& other) noexcept
    : pool_(std::move(other.pool_)),
      stream_(other.stream_),
      buffers_(std::move(other.buffers_)),
      total_bytes_(std::exchange(other.total_bytes_, 0)) {
  other.buffers_.clear();
}

BufferBatch& BufferBatch::operator=(BufferBatch&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = std::move(other.pool_);
    stream_ = other.stream_;
    buffers_ = std::move(other.buffers_);
    other.buffers_.clear();
    total_bytes_ = std::exchange(other.total_bytes_, 0);
  }
  return *this;
}

std::size_t BufferBatch::add(std::size_t bytes) {
  // Room first, growing geometrically, so that push_back below cannot throw (a failed
  // add leaves the batch as it was) and n adds cost O(n).
  if (buffers_.size() == buffers_.capacity()) {
    buffers_.reserve(std::max<std::size_t>(8, 2 * buffers_.size()));
  }
  buffers_.push_back(ManagedBuffer(pool_, bytes, stream_));
  total_bytes_ += bytes;
  return buffers_.size() - 1;
}

void BufferBatch::clear() noexcept {
  while (!buffers_.empty()) buffers_.pop_back();
  total_bytes_ = 0;
}

}  // namespace gpukeeper
