#include "gpukeeper/core/cuda_check.hpp"

namespace gpukeeper::detail {

void throw_cuda_error(cudaError_t status, const char* call) {
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  clear_cuda_error();
  throw DeviceError(call, static_cast<int>(status), name ? name : "unknown",
                    text ? text : "no message");
}

}  // namespace gpukeeper::detail
