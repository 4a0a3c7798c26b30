// Copies between host memory and a pool block of any kind, ordered after the work queued
// on the block's stream, and stream-to-stream ordering for handing a block to a consumer.
#pragma once

#include <cstddef>

#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper {

// Copies `bytes` between host memory and a block of `kind` on `device` (either way),
// after the work queued on the block's `stream`, and returns once the copy is complete.
// InvalidInputError for a null dst or src (with bytes > 0); DeviceError when CUDA fails.
void copy_block(ResourceKind kind, int device, stream_t stream, void* dst, const void* src,
                std::size_t bytes);

// Makes work queued on `consumer` from now on wait for the work queued on `producer` so
// far, without blocking the host. A no-op when both are the same stream or without CUDA.
void order_streams(int device, stream_t producer, stream_t consumer);

}  // namespace gpukeeper
