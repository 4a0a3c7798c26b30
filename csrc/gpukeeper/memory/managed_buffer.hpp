// ManagedBuffer: the one owner of a pool block; the block goes back when it dies.
//
//   {
//     ManagedBuffer buf(pool, 1 << 20, stream);
//     launch(buf.data(), stream);
//   }  // returned here, reusable on `stream` at once
//
// Move-only. The buffer keeps its pool alive, so a pool never dies under a buffer.
// After reset() or a move, data() is nullptr and the buffer owns nothing.
#pragma once

#include <cstddef>
#include <memory>

#include "gpukeeper/memory/caching_pool.hpp"

namespace gpukeeper {

class ManagedBuffer {
 public:
  ManagedBuffer() noexcept = default;
  ManagedBuffer(std::shared_ptr<CachingPool> pool, std::size_t bytes, stream_t stream = 0);
  ~ManagedBuffer() { reset(); }

  ManagedBuffer(ManagedBuffer&& other) noexcept;
  ManagedBuffer& operator=(ManagedBuffer&& other) noexcept;
  ManagedBuffer(const ManagedBuffer&) = delete;
  ManagedBuffer& operator=(const ManagedBuffer&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return bytes_; }  // bytes requested
  stream_t stream() const noexcept { return stream_; }
  const std::shared_ptr<CachingPool>& pool() const noexcept { return pool_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

  // Returns the block to the pool now; the buffer is empty afterwards.
  void reset() noexcept;

 private:
  std::shared_ptr<CachingPool> pool_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  stream_t stream_ = 0;
};

}  // namespace gpukeeper
