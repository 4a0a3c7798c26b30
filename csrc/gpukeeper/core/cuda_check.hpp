// Checked CUDA runtime calls. Only included by translation units built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call);

inline void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw_cuda_error(status, call);
}

// Clears the runtime's last-error slot after a failure we handled ourselves, so that
// a later cudaGetLastError() in user code does not report our recovered error.
inline void clear_cuda_error() noexcept { (void)cudaGetLastError(); }

// Makes `device` current for the lifetime of the guard, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace gpukeeper::detail

#define GK_CUDA_CHECK(expr) ::gpukeeper::detail::check_cuda((expr), #expr)
