// calibrate(): one spin kernel timed by a Timer (see timer_calibration.hpp).
#include "gpukeeper/timing/timer_calibration.hpp"

#include <cstdint>
#include <string>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/timer.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

Calibration calibrate(std::uint64_t duration_ns, int device, stream_t stream,
                      bool hide_launch_latency) {
  if (!calibration_kernels_available()) launch_spin_kernel(0, stream);  // throws, says why
#ifdef GPUKEEPER_WITH_CUDA
  if (device < 0 || !timing_uses_cuda(device)) {
    throw DeviceError(
        "calibrate", 0, "unavailable",
        "calibration needs a usable CUDA device (device " + std::to_string(device) + ")");
  }
  detail::DeviceGuard guard(device);
  std::uint64_t* out = nullptr;
  GK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 2 * sizeof(std::uint64_t)));
  struct Free {
    std::uint64_t* p;
    ~Free() { (void)cudaFree(p); }
  } free_out{out};

  Timer timer(device, stream, hide_launch_latency);
  launch_spin_kernel(0, stream, out);  // warm-up: loads the module, touches `out`
  GK_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  timer.start();
  launch_spin_kernel(duration_ns, stream, out);
  timer.stop();

  Calibration result;
  result.requested_ns = duration_ns;
  result.event_ms = timer.elapsed_ms();
  result.launch_hidden = timer.launch_hidden();
  std::uint64_t host[2] = {0, 0};
  GK_CUDA_CHECK(cudaMemcpyAsync(host, out, sizeof host, cudaMemcpyDeviceToHost,
                                reinterpret_cast<cudaStream_t>(stream)));
  GK_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  result.kernel_ns = host[1] - host[0];
  return result;
#else
  (void)duration_ns;
  (void)device;
  (void)stream;
  (void)hide_launch_latency;
  throw DeviceError("calibrate", 0, "unavailable", "gpukeeper was built without CUDA");
#endif
}

}  // namespace gpukeeper
