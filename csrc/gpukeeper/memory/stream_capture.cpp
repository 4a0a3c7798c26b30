#include "gpukeeper/memory/stream_capture.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper::detail {

#ifdef GPUKEEPER_WITH_CUDA

StreamCapture capture_of(stream_t stream) noexcept {
  StreamCapture out;
  if (stream == 0 || stream == reinterpret_cast<stream_t>(cudaStreamLegacy)) return out;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
#if CUDART_VERSION >= 13000
  cudaError_t rc = cudaStreamGetCaptureInfo(s, &status, &id, &graph, nullptr, nullptr, nullptr);
#else
  cudaError_t rc = cudaStreamGetCaptureInfo_v2(s, &status, &id, &graph, nullptr, nullptr);
#endif
  if (rc != cudaSuccess) {
    clear_cuda_error();
    return out;
  }
  // An invalidated capture is still under way until its end call: its allocations must not
  // reach the main pool either (the capture fails, but the blocks were handed out).
  out.active = status != cudaStreamCaptureStatusNone;
  out.id = id;
  out.graph = graph;
  return out;
}

bool on_graph_destroyed(void* graph, void (*fn)(void*), void* context) noexcept {
  if (graph == nullptr || fn == nullptr) return false;
  cudaUserObject_t object = nullptr;
  if (cudaUserObjectCreate(&object, context, fn, 1, cudaUserObjectNoDestructorSync) != cudaSuccess) {
    clear_cuda_error();
    return false;
  }
  // Moves our one reference to the graph; executable graphs made from it take theirs.
  if (cudaGraphRetainUserObject(static_cast<cudaGraph_t>(graph), object, 1, cudaGraphUserObjectMove) !=
      cudaSuccess) {
    clear_cuda_error();
    // Dropping the reference would run fn now, as if the graph were gone: it is not.
    return false;
  }
  return true;
}

#else

StreamCapture capture_of(stream_t) noexcept { return {}; }
bool on_graph_destroyed(void*, void (*)(void*), void*) noexcept { return false; }

#endif

}  // namespace gpukeeper::detail
