// BufferBatch: many ManagedBuffers with one lifetime; all go back together.
//
//   BufferBatch batch(pool, stream);
//   for (auto& chunk : chunks) batch.add(chunk.bytes());
//   run(batch[0].data(), batch[1].data());
//   // all returned when `batch` dies, or at batch.clear()
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "gpukeeper/memory/managed_buffer.hpp"

namespace gpukeeper {

class BufferBatch {
 public:
  explicit BufferBatch(std::shared_ptr<CachingPool> pool, stream_t stream = 0);

  BufferBatch(BufferBatch&& other) noexcept;
  BufferBatch& operator=(BufferBatch&& other) noexcept;

  // Allocates one more buffer; on failure the batch is unchanged. Returns its index.
  std::size_t add(std::size_t bytes);

  ManagedBuffer& operator[](std::size_t i) { return buffers_.at(i); }
  const ManagedBuffer& operator[](std::size_t i) const { return buffers_.at(i); }
  std::size_t size() const noexcept { return buffers_.size(); }
  std::size_t total_bytes() const noexcept { return total_bytes_; }
  const std::shared_ptr<CachingPool>& pool() const noexcept { return pool_; }

  // Returns every buffer, newest first (so that neighbours merge as they go back).
  void clear() noexcept;

  ~BufferBatch() { clear(); }

 private:
  std::shared_ptr<CachingPool> pool_;
  stream_t stream_;
  std::vector<ManagedBuffer> buffers_;
  std::size_t total_bytes_ = 0;
};

}  // namespace gpukeeper
