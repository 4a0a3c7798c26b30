// The component's entry points, called from Python through ctypes
// (gpukeeper/integrations/torch_component.py): install the allocator, and say which
// PyTorch it was built for. Plain C functions: the component has no Python binding of
// its own, so it depends on nothing but PyTorch's C++ libraries.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "torch_ext/allocator.hpp"

namespace {

void put(const std::string& text, char* out, std::size_t capacity) {
  if (capacity == 0) return;
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" {

// The PyTorch version this component was compiled against ("2.11.0"): its C++ allocator
// interface changes between releases, so another version must not load it.
__attribute__((visibility("default"))) const char* gpukeeper_torch_built_for() {
  return TORCH_VERSION;
}

// Makes gpukeeper's pools PyTorch's CUDA allocator. `api_address` is _core's table
// (pool_api.hpp) and `version` the table version _core reports. Returns 0, or 1 with the
// reason in `error`.
__attribute__((visibility("default"))) int gpukeeper_torch_install(std::uintptr_t api_address,
                                                                   std::uint32_t version,
                                                                   char* error,
                                                                   std::size_t error_capacity) {
  namespace api = gpukeeper::torch_api;
  try {
    const auto* table = reinterpret_cast<const api::Api*>(api_address);
    if (table == nullptr || version != api::kVersion || table->version != api::kVersion ||
        table->size != sizeof(api::Api)) {
      put("gpukeeper's module and its PyTorch component come from different builds "
          "(pool table version " + std::to_string(version) + ", component expects " +
              std::to_string(api::kVersion) + "); reinstall gpukeeper",
          error, error_capacity);
      return 1;
    }
    auto* current = c10::cuda::CUDACachingAllocator::allocator.load();
    if (current != nullptr && current->initialized()) {
      put("PyTorch's CUDA allocator (" + current->name() +
              ") is already in use: use_torch_allocator() must run before the first CUDA "
              "tensor is made",
          error, error_capacity);
      return 1;
    }
    auto allocator = std::make_shared<gpukeeper::torch_ext::Allocator>(table);
    allocator->init(static_cast<int>(c10::cuda::device_count()));
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    put(e.what(), error, error_capacity);
    return 1;
  }
}

}  // extern "C"
