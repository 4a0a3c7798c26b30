// CUDA IPC for the component: the handle of a block's segment to send to another process,
// and the mapping of a handle received from one (torch.multiprocessing's CUDA tensors).
//
// The handle is PyTorch's own wire format, so that either end may run PyTorch's native
// allocator: a version byte, a type byte ('c': a cudaMalloc'd segment), then the
// cudaIpcMemHandle_t of the segment's base; the block's offset in its segment travels
// beside it. Version 2 is written: PyTorch 2.11 reads versions up to 2 and later
// releases read 2 as well. Blocks in expandable (virtual-memory) ranges are refused with
// the reason and the remedy (use_torch_allocator(expandable=False)): their pages are not
// one cudaMalloc allocation an IPC handle can name.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "torch_ext/allocator.hpp"

namespace gpukeeper::torch_ext {

namespace {

constexpr char kHandleVersionWritten = 2;
constexpr char kHandleVersionRead = 3;  // the newest layout of a 'c' handle known to match
constexpr char kCudaMallocHandle = 'c';
constexpr char kExpandableHandle = 'e';

// Opened handles, shared while any receiver tensor holds them (as PyTorch's allocator
// keeps them): opening one twice in a process fails in CUDA.
struct OpenedHandles {
  std::mutex mutex;
  std::unordered_map<std::string, std::weak_ptr<void>> by_handle;
};
OpenedHandles& opened() {
  static auto* handles = new OpenedHandles();  // outlives tensors freed at exit
  return *handles;
}

}  // namespace

cca::ShareableHandle Allocator::shareIpcHandle(void* ptr) {
  cudaPointerAttributes attributes{};
  C10_CUDA_CHECK(cudaPointerGetAttributes(&attributes, ptr));
  const int device = attributes.device;
  void* base = nullptr;
  std::size_t size = 0;
  bool expandable = false;
  TORCH_CHECK(api_->segment_of(ptr, device, &base, &size, &expandable),
              "gpukeeper: cannot share ", ptr, " with another process: it is not memory of "
              "gpukeeper's pools on device ", device);
  TORCH_CHECK(!expandable,
              "gpukeeper: cannot share a tensor in an expandable (virtual-memory) segment with "
              "another process: CUDA IPC names one cudaMalloc allocation, and such a segment is "
              "many mapped pages. In a process that sends CUDA tensors, call "
              "gpukeeper.use_torch_allocator(expandable=False): every block is then in a "
              "cudaMalloc segment, as under PyTorch's own allocator");
  cudaIpcMemHandle_t handle;
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
  }
  std::string bytes;
  bytes.reserve(2 + CUDA_IPC_HANDLE_SIZE);
  bytes.push_back(kHandleVersionWritten);
  bytes.push_back(kCudaMallocHandle);
  bytes.append(reinterpret_cast<const char*>(&handle), CUDA_IPC_HANDLE_SIZE);
  return cca::ShareableHandle{static_cast<char*>(ptr) - static_cast<char*>(base), bytes};
}

std::shared_ptr<void> Allocator::getIpcDevPtr(std::string handle) {
  cudaIpcMemHandle_t mem{};
  if (handle.size() == CUDA_IPC_HANDLE_SIZE) {
    std::memcpy(&mem, handle.data(), CUDA_IPC_HANDLE_SIZE);  // the unversioned layout
  } else {
    TORCH_CHECK(handle.size() >= 2, "gpukeeper: a CUDA IPC handle of ", handle.size(),
                " bytes is none PyTorch makes");
    const char version = handle[0];
    const char type = handle[1];
    TORCH_CHECK(version <= kHandleVersionRead,
                "gpukeeper: received a CUDA IPC handle of version ", static_cast<int>(version),
                ", newer than this build reads (", static_cast<int>(kHandleVersionRead),
                "): the sending process runs a newer PyTorch");
    TORCH_CHECK(type != kExpandableHandle,
                "gpukeeper: received a CUDA IPC handle of an expandable segment (the sender runs "
                "PyTorch's allocator with expandable_segments:True); gpukeeper opens only "
                "cudaMalloc handles. Send from fixed segments, or receive without "
                "use_torch_allocator()");
    TORCH_CHECK(type == kCudaMallocHandle && handle.size() == 2 + CUDA_IPC_HANDLE_SIZE,
                "gpukeeper: a CUDA IPC handle of unknown type '", type, "'");
    std::memcpy(&mem, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
  }
  OpenedHandles& handles = opened();
  std::lock_guard<std::mutex> lock(handles.mutex);
  auto it = handles.by_handle.find(handle);
  if (it != handles.by_handle.end()) {
    if (auto alive = it->second.lock()) return alive;
  }
  void* ptr = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, mem, cudaIpcMemLazyEnablePeerAccess));
  const c10::DeviceIndex device = c10::cuda::current_device();
  std::shared_ptr<void> mapped(ptr, [handle, device](void* p) {
    c10::cuda::CUDAGuard guard(device);
    OpenedHandles& all = opened();
    {
      std::lock_guard<std::mutex> lock(all.mutex);
      auto found = all.by_handle.find(handle);
      if (found != all.by_handle.end() && found->second.expired()) all.by_handle.erase(found);
    }
    C10_CUDA_CHECK_WARN(cudaIpcCloseMemHandle(p));
  });
  handles.by_handle[handle] = mapped;
  return mapped;
}

}  // namespace gpukeeper::torch_ext
