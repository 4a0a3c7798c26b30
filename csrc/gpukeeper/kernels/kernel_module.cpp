// Loading timing_kernels.ptx and launching its kernels (see kernel_module.hpp).
#include "gpukeeper/kernels/kernel_module.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "gpukeeper/core/cuda_check.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/driver_api.hpp"

namespace gpukeeper::kernels {

// The PTX text, embedded at build time (CMakeLists.txt writes it from the .ptx file).
extern const char kTimingKernelsPtx[];

namespace {

using LibraryLoadData = CUresult(CUDAAPI*)(CUlibrary*, const void*, CUjit_option*, void**,
                                           unsigned int, CUlibraryOption*, void**, unsigned int);
using LibraryGetKernel = CUresult(CUDAAPI*)(CUkernel*, CUlibrary, const char*);
using LaunchKernel = CUresult(CUDAAPI*)(CUfunction, unsigned int, unsigned int, unsigned int,
                                        unsigned int, unsigned int, unsigned int, unsigned int,
                                        CUstream, void**, void**);
using GetErrorName = CUresult(CUDAAPI*)(CUresult, const char**);

// A library (CUDA 12.0) rather than a module: it is not tied to one context, and the
// driver loads its kernels into each context where they are first launched, so one load
// serves every device and every context the runtime makes current.
struct Module {
  LaunchKernel launch = nullptr;
  GetErrorName error_name = nullptr;
  CUkernel spin = nullptr;
  CUkernel gate = nullptr;
  std::string failure;  // why the module is unusable; empty when it loaded
  int failure_code = 0;
  std::string failure_name;
};

std::string driver_error_name(GetErrorName error_name, CUresult status) {
  const char* name = nullptr;
  if (error_name != nullptr) error_name(status, &name);
  return name != nullptr ? name : "CUDA driver error";
}

Module load() {
  Module m;
  auto library_load = reinterpret_cast<LibraryLoadData>(
      detail::driver_entry_point("cuLibraryLoadData", 12000));
  auto library_get_kernel = reinterpret_cast<LibraryGetKernel>(
      detail::driver_entry_point("cuLibraryGetKernel", 12000));
  m.launch = reinterpret_cast<LaunchKernel>(detail::driver_entry_point("cuLaunchKernel", 4000));
  m.error_name = reinterpret_cast<GetErrorName>(detail::driver_entry_point("cuGetErrorName", 6000));
  if (library_load == nullptr || library_get_kernel == nullptr || m.launch == nullptr) {
    m.failure_name = "unavailable";
    m.failure = "the CUDA driver lacks cuLibraryLoadData or cuLaunchKernel (a driver of CUDA 12.0 "
                "or newer is needed for gpukeeper's timing kernels)";
    return m;
  }
  // The driver calls below need cuInit, which the runtime's first call makes.
  if (cudaFree(nullptr) != cudaSuccess) {
    const cudaError_t init = cudaGetLastError();
    m.failure_code = static_cast<int>(init);
    m.failure_name = cudaGetErrorName(init);
    m.failure = "the CUDA runtime could not start on this device";
    return m;
  }
  CUlibrary library = nullptr;
  CUresult status = library_load(&library, kTimingKernelsPtx, nullptr, nullptr, 0, nullptr,
                                 nullptr, 0);
  if (status == CUDA_SUCCESS) status = library_get_kernel(&m.spin, library, "gk_spin_kernel");
  if (status == CUDA_SUCCESS) status = library_get_kernel(&m.gate, library, "gk_gate_kernel");
  if (status != CUDA_SUCCESS) {
    m.failure_code = static_cast<int>(status);
    m.failure_name = driver_error_name(m.error_name, status);
    m.failure = "the driver could not load gpukeeper's timing kernels (PTX ISA 7.0)";
  }
  // The library stays loaded for the life of the process: kernels launched from it may
  // still be queued when static objects are destroyed.
  return m;
}

const Module& module() {
  static const Module m = load();
  return m;
}

}  // namespace

void launch(Kernel kernel, stream_t stream, void** args, const char* what) {
  const Module& m = module();
  if (!m.failure.empty()) throw DeviceError(what, m.failure_code, m.failure_name, m.failure);
  // CUDA 12.0's cuLaunchKernel takes a CUkernel as its function and launches it in the
  // current context.
  auto function = reinterpret_cast<CUfunction>(kernel == Kernel::spin ? m.spin : m.gate);
  auto cu_stream = reinterpret_cast<CUstream>(stream);
  CUresult status = m.launch(function, 1, 1, 1, 1, 1, 1, 0, cu_stream, args, nullptr);
  if (status == CUDA_ERROR_INVALID_CONTEXT) {
    // A thread that has made no runtime call yet has no current context: the runtime's
    // first call makes its device's primary context current, as a <<<>>> launch would.
    detail::check_cuda(cudaFree(nullptr), "cudaFree(nullptr)");
    status = m.launch(function, 1, 1, 1, 1, 1, 1, 0, cu_stream, args, nullptr);
  }
  if (status != CUDA_SUCCESS) {
    throw DeviceError(what, static_cast<int>(status), driver_error_name(m.error_name, status),
                      "the driver refused the kernel launch");
  }
}

}  // namespace gpukeeper::kernels
