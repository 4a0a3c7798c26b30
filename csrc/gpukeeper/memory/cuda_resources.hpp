// The three CUDA upstreams. Declared in every build; in a CPU-only build their
// constructors throw DeviceError, so that callers need no #ifdef.
#pragma once

#include <memory>
#include <mutex>

#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper {

// cudaMalloc / cudaFree.
class CudaDeviceResource final : public MemoryResource {
 public:
  explicit CudaDeviceResource(int device);
  void* allocate(std::size_t bytes, stream_t stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  ResourceKind kind() const noexcept override { return ResourceKind::device; }
  int device() const noexcept override { return device_; }
  bool stream_ordered() const noexcept override { return true; }
  bool device_accessible() const noexcept override { return true; }
  bool host_accessible() const noexcept override { return false; }
  MemoryInfo memory_info() const override { return device_memory_info(device_); }
  // The driver's virtual memory management (cuMemCreate/cuMemMap) on this device.
  VirtualMemory* virtual_memory() override;

 private:
  int device_;
  std::once_flag vm_once_;
  std::unique_ptr<VirtualMemory> vm_;
};

// cudaMallocAsync / cudaFreeAsync on the device's current memory pool.
class CudaAsyncResource final : public MemoryResource {
 public:
  explicit CudaAsyncResource(int device);
  void* allocate(std::size_t bytes, stream_t stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  ResourceKind kind() const noexcept override { return ResourceKind::async; }
  int device() const noexcept override { return device_; }
  bool stream_ordered() const noexcept override { return true; }
  bool device_accessible() const noexcept override { return true; }
  bool host_accessible() const noexcept override { return false; }
  MemoryInfo memory_info() const override { return device_memory_info(device_); }

 private:
  int device_;
};

// cudaMallocHost / cudaFreeHost: page-locked host memory, usable by copies and kernels.
class CudaPinnedResource final : public MemoryResource {
 public:
  explicit CudaPinnedResource(int device);
  void* allocate(std::size_t bytes, stream_t stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  ResourceKind kind() const noexcept override { return ResourceKind::pinned; }
  int device() const noexcept override { return device_; }
  bool stream_ordered() const noexcept override { return true; }
  bool device_accessible() const noexcept override { return true; }
  bool host_accessible() const noexcept override { return true; }
  MemoryInfo memory_info() const override { return host_memory_info(); }

 private:
  int device_;
};

}  // namespace gpukeeper
