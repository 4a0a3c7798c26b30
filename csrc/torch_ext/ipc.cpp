// CUDA IPC for the component: the handle of a block to send to another process, and the
// mapping of a handle received from one (torch.multiprocessing's CUDA tensors).
//
// The handle is PyTorch's own wire format, so that either end may run PyTorch's native
// allocator: a version byte, a type byte, then
// - 'c', a block of a cudaMalloc segment: the cudaIpcMemHandle_t of the segment's base;
// - 'e', a block of an expandable range: a header (the sender's pid, its 4 bytes of
//   padding written as zeros, the page size and the page count as 64-bit words), then one
//   32-bit POSIX descriptor of the sender's per page under the block. The receiver copies
//   each descriptor with pidfd_open + pidfd_getfd, imports the page and maps the pages in
//   order at a range of its own; the sender keeps its descriptors open while the pages live.
// The block's offset from the first byte sent travels beside the handle. Version 2 is
// written (PyTorch 2.5 to 2.12 write it, and 2.13 reads it); versions up to 3 are read.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "torch_ext/allocator.hpp"

namespace gpukeeper::torch_ext {

namespace {

constexpr char kHandleVersionWritten = 2;
constexpr char kHandleVersionRead = 3;  // the newest version whose layouts are known to match
constexpr char kCudaMallocHandle = 'c';
constexpr char kExpandableHandle = 'e';

// The header of an 'e' handle, laid out as PyTorch's (a 32-bit pid, padding, two words).
struct ShareHeader {
  std::int32_t pid = 0;
  std::int32_t padding = 0;  // PyTorch leaves it unset; zeros keep equal handles equal
  std::uint64_t page_size = 0;
  std::uint64_t pages = 0;
};
static_assert(sizeof(ShareHeader) == 24, "the 'e' handle's header is 24 bytes on the wire");

std::string expandable_handle(const torch_api::SharedPages& pages) {
  ShareHeader header;
  header.pid = static_cast<std::int32_t>(::getpid());
  header.page_size = pages.page_size;
  header.pages = pages.fds.size();
  std::string bytes;
  bytes.reserve(2 + sizeof header + 4 * pages.fds.size());
  bytes.push_back(kHandleVersionWritten);
  bytes.push_back(kExpandableHandle);
  bytes.append(reinterpret_cast<const char*>(&header), sizeof header);
  for (int fd : pages.fds) {
    const std::int32_t wire = fd;
    bytes.append(reinterpret_cast<const char*>(&wire), sizeof wire);
  }
  return bytes;
}

// The pages an 'e' handle names, mapped here. The sizes must agree with the header: a
// handle of another layout (a PyTorch release that changed it) is refused, not guessed.
std::shared_ptr<void> open_expandable(const torch_api::Api& api, const std::string& handle,
                                      c10::DeviceIndex device) {
  ShareHeader header;
  TORCH_CHECK(handle.size() >= 2 + sizeof header,
              "gpukeeper: an expandable-segment CUDA IPC handle of ", handle.size(),
              " bytes is shorter than its header");
  std::memcpy(&header, handle.data() + 2, sizeof header);
  const std::size_t body = handle.size() - 2 - sizeof header;
  TORCH_CHECK(header.pid > 0 && header.pages > 0 && header.page_size > 0 &&
                  body == 4 * header.pages,
              "gpukeeper: an expandable-segment CUDA IPC handle of ", handle.size(),
              " bytes (version ", static_cast<int>(handle[0]),
              ") does not have the layout this build reads (pid, page size, page count, one "
              "descriptor per page): the sending process runs a PyTorch release whose layout "
              "differs. Send from fixed segments (use_torch_allocator(expandable=False), or "
              "expandable_segments:False under PyTorch's allocator)");
  std::vector<int> fds(header.pages);
  for (std::size_t i = 0; i < fds.size(); ++i) {
    std::int32_t wire = 0;
    std::memcpy(&wire, handle.data() + 2 + sizeof header + 4 * i, sizeof wire);
    fds[i] = wire;
  }
  try {
    return api.import_pages(device, header.pid, fds, header.page_size);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpukeeper: ", e.what());
  }
}

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
  if (expandable) {
    torch_api::SharedPages pages;
    bool found = false;
    try {
      found = api_->share_pages(ptr, device, &pages);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "gpukeeper: cannot share a tensor of an expandable range with another "
                  "process: ", e.what(), ". Call gpukeeper.use_torch_allocator(expandable=False) "
                  "in this process to send from cudaMalloc segments");
    }
    TORCH_CHECK(found, "gpukeeper: cannot share ", ptr, " with another process: it is not the "
                "start of a live block of gpukeeper's pools on device ", device);
    return cca::ShareableHandle{static_cast<char*>(ptr) - static_cast<char*>(pages.first_page),
                                expandable_handle(pages)};
  }
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
    TORCH_CHECK(type == kExpandableHandle ||
                    (type == kCudaMallocHandle && handle.size() == 2 + CUDA_IPC_HANDLE_SIZE),
                "gpukeeper: a CUDA IPC handle of unknown type '", type, "'");
    if (type == kCudaMallocHandle) std::memcpy(&mem, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
  }
  OpenedHandles& handles = opened();
  std::lock_guard<std::mutex> lock(handles.mutex);
  auto it = handles.by_handle.find(handle);
  if (it != handles.by_handle.end()) {
    if (auto alive = it->second.lock()) return alive;
  }
  if (handle.size() != CUDA_IPC_HANDLE_SIZE && handle[1] == kExpandableHandle) {
    std::shared_ptr<void> pages = open_expandable(*api_, handle, c10::cuda::current_device());
    // The cache entry goes with the last tensor; the pages go with `pages`.
    std::shared_ptr<void> mapped(pages.get(), [handle, pages](void*) mutable {
      OpenedHandles& all = opened();
      {
        std::lock_guard<std::mutex> lock(all.mutex);
        auto found = all.by_handle.find(handle);
        if (found != all.by_handle.end() && found->second.expired()) all.by_handle.erase(found);
      }
      pages.reset();
    });
    handles.by_handle[handle] = mapped;
    return mapped;
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
