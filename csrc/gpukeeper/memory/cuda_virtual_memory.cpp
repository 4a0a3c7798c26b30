#include "gpukeeper/memory/cuda_virtual_memory.hpp"

#include <vector>

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda.h>

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

class CudaVirtualMemory final : public VirtualMemory {
 public:
  explicit CudaVirtualMemory(int device) : device_(device) {
    detail::DeviceGuard guard(device_);
    GK_CUDA_CHECK(cudaFree(nullptr));  // the primary context must exist for the driver calls
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    access_.push_back(access_to(device_));
    // Memory from cudaMalloc is open to peers once they enable peer access; mapped pages
    // are open only to the devices named here. So every device that can reach this one
    // is named, as NCCL's ncclMemAlloc does, and a kernel or copy on a peer works the same
    // with either layout. One call grants them all.
    for (int peer = 0; peer < cuda_device_count(); ++peer) {
      int can = 0;
      if (peer != device_ && cudaDeviceCanAccessPeer(&can, peer, device_) == cudaSuccess && can) {
        access_.push_back(access_to(peer));
      }
      detail::clear_cuda_error();
    }
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
    driver().release(static_cast<CUmemGenericAllocationHandle>(page));
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
  static CUmemAccessDesc access_to(int device) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return desc;
  }

  CUmemAllocationProp prop_{};
  std::vector<CUmemAccessDesc> access_;  // this device first, then its peers
};

}  // namespace

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

#endif

}  // namespace gpukeeper
