#include "gpukeeper/memory/buffer_batch.hpp"

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

BufferBatch::BufferBatch(std::shared_ptr<CachingPool> pool, stream_t stream)
    : pool_(std::move(pool)), stream_(stream) {
  if (!pool_) throw InvalidInputError("BufferBatch needs a pool");
}

std::size_t BufferBatch::add(std::size_t bytes) {
  buffers_.reserve(buffers_.size() + 1);  // so that push_back below cannot throw
  buffers_.push_back(ManagedBuffer(pool_, bytes, stream_));
  total_bytes_ += bytes;
  return buffers_.size() - 1;
}

void BufferBatch::clear() noexcept {
  while (!buffers_.empty()) buffers_.pop_back();
  total_bytes_ = 0;
}

}  // namespace gpukeeper
