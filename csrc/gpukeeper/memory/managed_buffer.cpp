#include "gpukeeper/memory/managed_buffer.hpp"

#include <utility>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

ManagedBuffer::ManagedBuffer(std::shared_ptr<CachingPool> pool, std::size_t bytes,
                             stream_t stream)
    : pool_(std::move(pool)), bytes_(bytes), stream_(stream) {
  if (!pool_) throw InvalidInputError("ManagedBuffer needs a pool");
  ptr_ = pool_->allocate(bytes, stream);
}

ManagedBuffer::ManagedBuffer(ManagedBuffer&& other) noexcept
    : pool_(std::move(other.pool_)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(other.stream_) {}

ManagedBuffer& ManagedBuffer::operator=(ManagedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = other.stream_;
  }
  return *this;
}

void ManagedBuffer::reset() noexcept {
  if (ptr_ != nullptr) {
    // Cannot fail: the buffer is the block's only owner, so the pool knows the pointer.
    try {
      pool_->deallocate(ptr_);
    } catch (...) {
    }
    ptr_ = nullptr;
  }
  bytes_ = 0;
  pool_.reset();
}

}  // namespace gpukeeper
