// Asks whether the work queued on a stream so far has finished, with one reusable event
// per stream. The pool calls it only on its slow paths (taking a block another stream
// freed, releasing segments), never per allocation: recording at the time of the
// question covers everything queued before the block was freed, so no event is needed
// at free time.
#pragma once

#include <utility>
#include <vector>

#include "gpukeeper/core/stream.hpp"

namespace gpukeeper::detail {

class StreamEvents {
 public:
  // With `enabled` false (host memory) every stream counts as done at once.
  StreamEvents(int device, bool enabled) : device_(device), enabled_(enabled) {}
  ~StreamEvents();
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  // True when all work queued on `stream` so far has completed. Does not block. It
  // records on `stream`: the caller must know the stream is alive (a block freed on it
  // is being reused, the stream's owner has not destroyed it). False, recording nothing,
  // while `stream` captures a CUDA graph.
  bool done(stream_t stream);

  // Blocks until all work queued on the device so far has completed. The release paths
  // use this rather than one wait per stream: a stream the pool has seen may have been
  // destroyed by its owner since, and recording on a destroyed stream's handle is
  // undefined behaviour (a CuPy stream collected before a pool was emptied crashed the
  // process in cudaEventRecord).
  void synchronize_device();

 private:
  void* event_for(stream_t stream);  // cudaEvent_t, created on first use

  int device_;
  bool enabled_;
  std::vector<std::pair<stream_t, void*>> events_;
};

}  // namespace gpukeeper::detail
