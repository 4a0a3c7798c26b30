// Whether a stream is capturing a CUDA graph, and a hook on the captured graph's end.
//
//   StreamCapture c = capture_of(stream);
//   if (c.active) on_graph_destroyed(c.graph, [](void* ctx) { ... }, ctx);
//
// The pool registry routes allocations made during a capture that nobody announced (CuPy's
// Stream.begin_capture, a raw cudaStreamBeginCapture) to a pool of the capture's own; the
// graph then tells it, through a CUDA user object, when that pool's blocks may go to other
// work again.
#pragma once

#include <cstdint>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper::detail {

struct StreamCapture {
  bool active = false;
  std::uint64_t id = 0;    // unique per capture in the process (CUDA's capture id)
  void* graph = nullptr;   // cudaGraph_t being built; valid until the capture ends
};

// The capture state of `stream`. Never throws: the legacy default stream (0, 1), which
// cannot capture, a build without CUDA, and a failed query all read as not capturing.
StreamCapture capture_of(stream_t stream) noexcept;

// Calls `fn(context)` once `graph` and every executable graph made from it are destroyed
// and their launches are complete, on a thread of CUDA's: `fn` must not call CUDA.
// False (and `fn` never called) where the hook cannot be set; the caller then keeps what it
// guards for the life of the process.
bool on_graph_destroyed(void* graph, void (*fn)(void*), void* context) noexcept;

}  // namespace gpukeeper::detail
