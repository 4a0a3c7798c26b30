// Stream and device ids as every layer names them, in headers without CUDA.
//
//   stream_t s = reinterpret_cast<stream_t>(cuda_stream);   // 0: the legacy default stream
//   Timer t(kCpuDevice);                                     // times on the host clock
#pragma once

#include <cstdint>

namespace gpukeeper {

// A CUDA stream as an integer (cudaStream_t cast to uintptr_t). 0 is the legacy default
// stream; 2 is the per-thread default stream (cudaStreamPerThread).
using stream_t = std::uintptr_t;

// A device is a plain int: a CUDA ordinal (0, 1, ...; after CUDA_VISIBLE_DEVICES), or
// kCpuDevice where a function also accepts the host (timers, event logs).
constexpr int kCpuDevice = -1;

}  // namespace gpukeeper
