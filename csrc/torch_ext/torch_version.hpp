// The PyTorch release the component is compiled against, and the names that differ
// between the releases it is built for (2.9 and later): one build per release, since
// PyTorch's allocator interface is not part of its stable ABI.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

// 2.10 moved the version macros to torch/headeronly; 2.9 has them in libtorch's API folder.
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#define GPUKEEPER_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gpukeeper::torch_ext {

// 2.11 moved the snapshot's and the trace's types from the CUDA allocator's namespace to
// the device-generic one (and a trace entry's stream from cudaStream_t to void*).
#if GPUKEEPER_TORCH_AT_LEAST(2, 11)
using TraceEntry = c10::CachingDeviceAllocator::TraceEntry;
using SegmentInfo = c10::CachingDeviceAllocator::SegmentInfo;
using BlockInfo = c10::CachingDeviceAllocator::BlockInfo;
#else
using TraceEntry = c10::cuda::CUDACachingAllocator::TraceEntry;
using SegmentInfo = c10::cuda::CUDACachingAllocator::SegmentInfo;
using BlockInfo = c10::cuda::CUDACachingAllocator::BlockInfo;
#endif
using TraceAction = TraceEntry::Action;

}  // namespace gpukeeper::torch_ext
