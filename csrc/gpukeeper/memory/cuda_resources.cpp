#include "gpukeeper/memory/cuda_resources.hpp"

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/cuda_virtual_memory.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

namespace {

void require_usable(ResourceKind kind, int device) {
  std::string why;
  if (!resource_available(kind, device, &why)) {
    if (device < 0 || (cuda_device_count() > 0 && device >= cuda_device_count())) {
      throw InvalidInputError(why);
    }
    throw DeviceError(std::string("make_resource(") + to_string(kind) + ")", 0,
                      "unavailable", why);
  }
}

#ifdef GPUKEEPER_WITH_CUDA
cudaStream_t as_cuda(stream_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Out-of-memory is an expected answer from an upstream; everything else is a fault.
// Callers must make the call first and pass its pointer after: argument evaluation order
// is unspecified, so `f(cudaMalloc(&p, n), p)` may read p before cudaMalloc writes it.
void* oom_or_throw(cudaError_t status, void* ptr, const char* call) {
  if (status == cudaSuccess) return ptr;
  if (status == cudaErrorMemoryAllocation) {
    detail::clear_cuda_error();
    return nullptr;
  }
  detail::throw_cuda_error(status, call);
}

// While a thread captures a CUDA graph in the global mode (PyTorch's default), cudaMalloc
// and cudaMallocHost are "potentially unsafe" calls on every thread: they fail and
// invalidate the capture. A graph's private pool grows during its capture (PyTorch's does
// too), so the calls run in the relaxed mode, for this thread and for their duration only.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};
#endif

}  // namespace

CudaDeviceResource::CudaDeviceResource(int device) : device_(device) {
  require_usable(ResourceKind::device, device);
}

VirtualMemory* CudaDeviceResource::virtual_memory() {
  std::call_once(vm_once_, [this] { vm_ = make_cuda_virtual_memory(device_); });
  return vm_.get();
}

CudaAsyncResource::CudaAsyncResource(int device) : device_(device) {
  require_usable(ResourceKind::async, device);
}

CudaPinnedResource::CudaPinnedResource(int device) : device_(device) {
  require_usable(ResourceKind::pinned, device);
}

#ifdef GPUKEEPER_WITH_CUDA

void* CudaDeviceResource::allocate(std::size_t bytes, stream_t) {
  detail::DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, bytes);
  return oom_or_throw(status, ptr, "cudaMalloc");
}

void CudaDeviceResource::deallocate(void* ptr, std::size_t, stream_t) noexcept {
  int previous = 0;
  (void)cudaGetDevice(&previous);
  if (previous != device_) (void)cudaSetDevice(device_);
  if (cudaFree(ptr) != cudaSuccess) detail::clear_cuda_error();
  if (previous != device_) (void)cudaSetDevice(previous);
}

void* CudaAsyncResource::allocate(std::size_t bytes, stream_t stream) {
  detail::DeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t status = cudaMallocAsync(&ptr, bytes, as_cuda(stream));
  return oom_or_throw(status, ptr, "cudaMallocAsync");
}

void CudaAsyncResource::deallocate(void* ptr, std::size_t, stream_t stream) noexcept {
  int previous = 0;
  (void)cudaGetDevice(&previous);
  if (previous != device_) (void)cudaSetDevice(device_);
  if (cudaFreeAsync(ptr, as_cuda(stream)) != cudaSuccess) detail::clear_cuda_error();
  if (previous != device_) (void)cudaSetDevice(previous);
}

void* CudaPinnedResource::allocate(std::size_t bytes, stream_t) {
  detail::DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;
  void* ptr = nullptr;
  cudaError_t status = cudaMallocHost(&ptr, bytes);
  return oom_or_throw(status, ptr, "cudaMallocHost");
}

void CudaPinnedResource::deallocate(void* ptr, std::size_t, stream_t) noexcept {
  if (cudaFreeHost(ptr) != cudaSuccess) detail::clear_cuda_error();
}

#else  // CPU-only build: the constructors above have already thrown.

void* CudaDeviceResource::allocate(std::size_t, stream_t) { return nullptr; }
void CudaDeviceResource::deallocate(void*, std::size_t, stream_t) noexcept {}
void* CudaAsyncResource::allocate(std::size_t, stream_t) { return nullptr; }
void CudaAsyncResource::deallocate(void*, std::size_t, stream_t) noexcept {}
void* CudaPinnedResource::allocate(std::size_t, stream_t) { return nullptr; }
void CudaPinnedResource::deallocate(void*, std::size_t, stream_t) noexcept {}

#endif

}  // namespace gpukeeper
