#include "gpukeeper/memory/cuda_virtual_memory.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gpukeeper/core/cuda_check.hpp"
#endif

namespace gpukeeper {

#ifdef GPUKEEPER_WITH_CUDA

namespace {

// The driver functions we use, resolved once per process.
struct DriverApi {
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuGetErrorName) error_name = nullptr;
  std::string missing;  // first symbol that could not be found
  // CUDA IPC of mapped pages; a driver without them only cannot share.
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
};

template <typename F>
void resolve(const char* symbol, F& fn, std::string& missing) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    detail::clear_cuda_error();
    if (missing.empty()) missing = symbol;
    return;
  }
  fn = reinterpret_cast<F>(address);
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    resolve("cuDeviceGetAttribute", a.device_get_attribute, a.missing);
    resolve("cuMemGetAllocationGranularity", a.granularity, a.missing);
    resolve("cuMemAddressReserve", a.address_reserve, a.missing);
    resolve("cuMemAddressFree", a.address_free, a.missing);
    resolve("cuMemCreate", a.create, a.missing);
    resolve("cuMemRelease", a.release, a.missing);
    resolve("cuMemMap", a.map, a.missing);
    resolve("cuMemUnmap", a.unmap, a.missing);
    resolve("cuMemSetAccess", a.set_access, a.missing);
    resolve("cuGetErrorName", a.error_name, a.missing);
    std::string optional;
    resolve("cuMemExportToShareableHandle", a.export_handle, optional);
    resolve("cuMemImportFromShareableHandle", a.import_handle, optional);
    return a;
  }();
  return api;
}

[[noreturn]] void throw_driver(CUresult status, const char* call) {
  const char* name = nullptr;
  if (driver().error_name) driver().error_name(status, &name);
  throw DeviceError(call, static_cast<int>(status), name ? name : "CUDA driver error",
                    "the driver refused the virtual memory operation");
}

CUmemAccessDesc access_to(int device) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

// Memory from cudaMalloc is open to peers once they enable peer access; mapped pages are
// open only to the devices named when access is set. So every device that can reach
// `device` is named, as NCCL's ncclMemAlloc does, and a kernel or copy on a peer works
// the same with either layout. One call grants them all; `device` comes first.
std::vector<CUmemAccessDesc> access_for(int device) {
  std::vector<CUmemAccessDesc> access{access_to(device)};
  for (int peer = 0; peer < cuda_device_count(); ++peer) {
    int can = 0;
    if (peer != device && cudaDeviceCanAccessPeer(&can, peer, device) == cudaSuccess && can) {
      access.push_back(access_to(peer));
    }
    detail::clear_cuda_error();
  }
  return access;
}

class CudaVirtualMemory final : public VirtualMemory {
 public:
  explicit CudaVirtualMemory(int device) : device_(device) {
    detail::DeviceGuard guard(device_);
    GK_CUDA_CHECK(cudaFree(nullptr));  // the primary context must exist for the driver calls
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    // Pages that can be exported as POSIX file descriptors, so that a block in an
    // expandable range can cross to another process (PyTorch's own expandable segments ask
    // the same, which the driver grants at no cost in memory).
    int posix_fd = 0;
    if (driver().export_handle == nullptr) {
      unshareable_ = "the driver lacks cuMemExportToShareableHandle";
    } else if (driver().device_get_attribute(
                   &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                   static_cast<CUdevice>(device_)) != CUDA_SUCCESS ||
               !posix_fd) {
      unshareable_ = "device " + std::to_string(device_) +
                     " does not export memory as POSIX file descriptors";
    } else {
      prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    }
    access_ = access_for(device_);
    std::size_t granularity = 0;
    CUresult status =
        driver().granularity(&granularity, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemGetAllocationGranularity");
    page_size_ = granularity;
  }

  std::size_t page_size() const noexcept override { return page_size_; }

  std::uintptr_t reserve(std::size_t bytes) override {
    CUdeviceptr base = 0;
    CUresult status = driver().address_reserve(&base, bytes, page_size_, 0, 0);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemAddressReserve");
    return static_cast<std::uintptr_t>(base);
  }

  void unreserve(std::uintptr_t base, std::size_t bytes) noexcept override {
    driver().address_free(static_cast<CUdeviceptr>(base), bytes);
  }

  page_t create_page() override {
    CUmemGenericAllocationHandle handle = 0;
    CUresult status = driver().create(&handle, page_size_, &prop_, 0);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemCreate");
    return static_cast<page_t>(handle);
  }

  void release_page(page_t page) noexcept override {
    if (has_shared_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      auto it = shared_.find(page);
      if (it != shared_.end()) {
        ::close(it->second);  // receivers hold their own copies
        shared_.erase(it);
      }
    }
    driver().release(static_cast<CUmemGenericAllocationHandle>(page));
  }

  int share_page(page_t page) override {
    if (!unshareable_.empty()) {
      throw GpuError("this device memory cannot be shared with another process: " + unshareable_);
    }
    std::lock_guard<std::mutex> lock(shared_mutex_);
    auto it = shared_.find(page);
    if (it != shared_.end()) return it->second;
    int fd = -1;
    CUresult status = driver().export_handle(&fd, static_cast<CUmemGenericAllocationHandle>(page),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemExportToShareableHandle");
    shared_.emplace(page, fd);
    has_shared_.store(true, std::memory_order_release);
    return fd;
  }

  void map(std::uintptr_t address, page_t page) override {
    auto va = static_cast<CUdeviceptr>(address);
    CUresult status = driver().map(va, page_size_, 0, static_cast<CUmemGenericAllocationHandle>(page), 0);
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemMap");
  }

  void set_access(std::uintptr_t address, std::size_t bytes) override {
    CUresult status = driver().set_access(static_cast<CUdeviceptr>(address), bytes,
                                          access_.data(), access_.size());
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemSetAccess");
  }

  void unmap(std::uintptr_t address) noexcept override {
    driver().unmap(static_cast<CUdeviceptr>(address), page_size_);
  }

 private:
  int device_;
  std::size_t page_size_ = 0;

  CUmemAllocationProp prop_{};
  std::vector<CUmemAccessDesc> access_;  // this device first, then its peers
  std::string unshareable_;              // why pages cannot be exported; "" when they can
  // Descriptors of exported pages, open until the page is released.
  std::mutex shared_mutex_;
  std::unordered_map<page_t, int> shared_;
  std::atomic<bool> has_shared_{false};  // spares release_page() the lock until one is shared
};

// A descriptor closed when it goes out of scope.
struct Descriptor {
  long fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(static_cast<int>(fd));
  }
};

constexpr const char* kFixedRemedy =
    " Or send from fixed segments: gpukeeper.use_torch_allocator(expandable=False) in the "
    "sending process puts every block in a cudaMalloc segment, which CUDA IPC shares "
    "without descriptors.";

// Another process's descriptor `fd`, copied into this one.
long take_descriptor(long pidfd, int pid, int fd) {
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
  const long mine = ::syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  if (mine >= 0) return mine;
  const int err = errno;
  if (err == ENOSYS) {
    throw GpuError(std::string("cannot receive a CUDA tensor of an expandable range: this "
                               "kernel lacks pidfd_getfd (Linux 5.6 or newer has it).") +
                   kFixedRemedy);
  }
  if (err == EPERM) {
    throw GpuError("cannot receive a CUDA tensor of an expandable range: the system refused "
                   "pidfd_getfd on process " + std::to_string(pid) +
                   " (EPERM). Taking a descriptor from another process needs ptrace permission "
                   "over it: the same user and, where Yama is on, kernel.yama.ptrace_scope=0 "
                   "or CAP_SYS_PTRACE (in a container: --cap-add=SYS_PTRACE)." + kFixedRemedy);
  }
  throw GpuError("cannot receive a CUDA tensor of an expandable range: pidfd_getfd on process " +
                 std::to_string(pid) + " failed: " + std::strerror(err) + "." + kFixedRemedy);
}

}  // namespace

std::shared_ptr<void> import_shared_pages(int device, int pid, const std::vector<int>& fds,
                                          std::size_t page_size) {
  if (fds.empty() || page_size == 0 || pid <= 0) {
    throw InvalidInputError("import_shared_pages: " + std::to_string(fds.size()) + " pages of " +
                            std::to_string(page_size) + " bytes from process " +
                            std::to_string(pid) + " name no memory");
  }
  const DriverApi& api = driver();
  if (!api.missing.empty() || api.import_handle == nullptr) {
    throw GpuError("cannot receive a CUDA tensor of an expandable range: the driver lacks " +
                   (api.missing.empty() ? std::string("cuMemImportFromShareableHandle") : api.missing));
  }
  detail::DeviceGuard guard(device);
  GK_CUDA_CHECK(cudaFree(nullptr));  // the primary context must exist for the driver calls
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
  Descriptor pidfd{::syscall(SYS_pidfd_open, pid, 0)};
  if (pidfd.fd < 0) {
    const int err = errno;
    throw GpuError(std::string("cannot receive a CUDA tensor of an expandable range: ") +
                   (err == ENOSYS ? "this kernel lacks pidfd_open (Linux 5.3 or newer has it)."
                    : err == ESRCH
                        ? "the sending process " + std::to_string(pid) +
                              " has exited, or runs in another PID namespace."
                        : "pidfd_open on process " + std::to_string(pid) + " failed: " +
                              std::strerror(err) + ".") +
                   kFixedRemedy);
  }
  // Everything taken so far is given back on any failure: the range, then the pages.
  struct Imported {
    CUdeviceptr base = 0;
    std::size_t bytes = 0;
    std::size_t page = 0;
    std::vector<CUmemGenericAllocationHandle> pages;
    std::size_t mapped = 0;
    ~Imported() {
      const DriverApi& a = driver();
      for (std::size_t i = 0; i < mapped; ++i) a.unmap(base + i * page, page);
      for (auto handle : pages) a.release(handle);
      if (base != 0) a.address_free(base, bytes);
    }
  };
  auto imported = std::make_unique<Imported>();
  imported->page = page_size;
  imported->bytes = page_size * fds.size();
  for (int remote : fds) {
    Descriptor mine{take_descriptor(pidfd.fd, pid, remote)};
    CUmemGenericAllocationHandle handle = 0;
    CUresult status = api.import_handle(
        &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(mine.fd)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemImportFromShareableHandle");
    imported->pages.push_back(handle);
  }
  // Alignment 0: the driver aligns to its granularity (a 20 MiB page size of PyTorch's large
  // segments is no power of two, which an explicit alignment must be).
  CUresult status = api.address_reserve(&imported->base, imported->bytes, 0, 0, 0);
  if (status != CUDA_SUCCESS) {
    imported->base = 0;
    throw_driver(status, "cuMemAddressReserve");
  }
  for (std::size_t i = 0; i < imported->pages.size(); ++i) {
    status = api.map(imported->base + i * page_size, page_size, 0, imported->pages[i], 0);
    if (status != CUDA_SUCCESS) throw_driver(status, "cuMemMap");
    imported->mapped = i + 1;
  }
  const std::vector<CUmemAccessDesc> access = access_for(device);
  status = api.set_access(imported->base, imported->bytes, access.data(), access.size());
  if (status != CUDA_SUCCESS) throw_driver(status, "cuMemSetAccess");
  void* base = reinterpret_cast<void*>(static_cast<std::uintptr_t>(imported->base));
  // The last owner unmaps: the receiver's work on it is done by then (PyTorch's IPC
  // reference counting waits for the receiver's storage to die, after its stream work).
  return std::shared_ptr<void>(base, [owned = imported.release(), device](void*) {
    detail::DeviceGuard release_guard(device);
    delete owned;
  });
}

bool cuda_virtual_memory_supported(int device, std::string* why) {
  auto fail = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  CudaStatus status = cuda_status();
  if (!status.available) return fail("CUDA is unavailable: " + status.reason);
  if (device < 0 || device >= status.device_count) {
    return fail("device " + std::to_string(device) + " does not exist");
  }
  const DriverApi& api = driver();
  if (!api.missing.empty()) return fail("the driver lacks " + api.missing);
  int supported = 0;
  if (api.device_get_attribute(&supported,
                               CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               static_cast<CUdevice>(device)) != CUDA_SUCCESS ||
      !supported) {
    return fail("device " + std::to_string(device) +
                " does not support virtual memory management");
  }
  return true;
}

std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device) {
  std::string why;
  if (!cuda_virtual_memory_supported(device, &why)) {
    throw DeviceError("make_cuda_virtual_memory", 0, "unsupported", why);
  }
  return std::make_unique<CudaVirtualMemory>(device);
}

#else

bool cuda_virtual_memory_supported(int, std::string* why) {
  if (why) *why = "gpukeeper was built without CUDA";
  return false;
}

std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int) {
  throw DeviceError("make_cuda_virtual_memory", 0, "unsupported", "built without CUDA");
}

std::shared_ptr<void> import_shared_pages(int, int, const std::vector<int>&, std::size_t) {
  throw GpuError("cannot receive a CUDA tensor: gpukeeper was built without CUDA");
}

#endif

}  // namespace gpukeeper
