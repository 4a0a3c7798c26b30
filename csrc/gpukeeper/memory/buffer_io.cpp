#include "gpukeeper/memory/buffer_io.hpp"

#include <cstring>
#include <string>

#include "gpukeeper/core/errors.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

#ifdef GPUKEEPER_WITH_CUDA
namespace {
cudaStream_t as_stream(stream_t s) { return reinterpret_cast<cudaStream_t>(s); }

void copy_ordered(int device, stream_t stream, void* dst, const void* src, std::size_t bytes) {
  detail::DeviceGuard guard(device);
  GK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
  GK_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}
}  // namespace
#endif

void copy_block(ResourceKind kind, int device, stream_t stream, void* dst, const void* src,
                std::size_t bytes) {
  if (bytes == 0) return;
  // memcpy from or to nullptr is undefined, and CUDA would fail the call: refuse it first.
  if (dst == nullptr || src == nullptr) {
    throw InvalidInputError(std::string("copy_block: ") + (dst == nullptr ? "dst" : "src") +
                            " is null for a copy of " + std::to_string(bytes) + " bytes");
  }
  if (kind == ResourceKind::host) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef GPUKEEPER_WITH_CUDA
  copy_ordered(device, stream, dst, src, bytes);
#else
  (void)device;
  (void)stream;
  throw DeviceError("copy_block", 0, "unavailable", "built without CUDA");
#endif
}

void order_streams(int device, stream_t producer, stream_t consumer) {
  if (producer == consumer) return;
#ifdef GPUKEEPER_WITH_CUDA
  detail::DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  GK_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t recorded = cudaEventRecord(event, as_stream(producer));
  cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(as_stream(consumer), event, 0) : recorded;
  (void)cudaEventDestroy(event);  // safe: destruction is deferred until the event completes
  detail::check_cuda(waited, recorded == cudaSuccess ? "cudaStreamWaitEvent" : "cudaEventRecord");
#else
  (void)device;
#endif
}

}  // namespace gpukeeper
