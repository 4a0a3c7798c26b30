#include "gpukeeper/memory/fault_injecting_resource.hpp"

#include <mutex>
#include <string>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

// The upstream's pages, with create_page() under the same plan.
class FaultInjectingResource::Pages final : public VirtualMemory {
 public:
  Pages(FaultInjectingResource& owner, VirtualMemory& vm) : owner_(owner), vm_(vm) {}
  std::size_t page_size() const noexcept override { return vm_.page_size(); }
  std::uintptr_t reserve(std::size_t bytes) override { return vm_.reserve(bytes); }
  void unreserve(std::uintptr_t base, std::size_t bytes) noexcept override { vm_.unreserve(base, bytes); }
  page_t create_page() override {
    if (owner_.refuse_next()) return 0;
    page_t page = vm_.create_page();
    if (page != 0) owner_.pages_.fetch_add(1, std::memory_order_relaxed);
    return page;
  }
  void release_page(page_t page) noexcept override {
    owner_.pages_.fetch_sub(1, std::memory_order_relaxed);
    vm_.release_page(page);
  }
  void map(std::uintptr_t address, page_t page) override { vm_.map(address, page); }
  void set_access(std::uintptr_t address, std::size_t bytes) override { vm_.set_access(address, bytes); }
  void unmap(std::uintptr_t address) noexcept override { vm_.unmap(address); }
  int share_page(page_t page) override { return vm_.share_page(page); }

 private:
  FaultInjectingResource& owner_;
  VirtualMemory& vm_;
};

FaultInjectingResource::FaultInjectingResource(std::unique_ptr<MemoryResource> upstream, FaultPlan plan)
    : upstream_(std::move(upstream)), plan_(plan) {
  if (!upstream_) throw InvalidInputError("FaultInjectingResource: the upstream is null");
  if (!(plan_.probability >= 0.0 && plan_.probability <= 1.0)) {
    throw InvalidInputError("FaultInjectingResource: probability must be in [0, 1], got " +
                            std::to_string(plan_.probability));
  }
}

FaultInjectingResource::~FaultInjectingResource() = default;

namespace {
// A well-mixed 64-bit hash (splitmix64's finaliser): call n's decision depends on the seed
// and n alone, so threads need no shared generator and a seed replays the same refusals.
std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

bool FaultInjectingResource::refuse_next() noexcept {
  if (!enabled_.load(std::memory_order_relaxed)) return false;
  const std::uint64_t n = calls_.fetch_add(1, std::memory_order_relaxed) + 1;
  bool refuse = plan_.every_nth != 0 && n % plan_.every_nth == 0;
  if (!refuse && plan_.probability > 0.0) {
    const double u = static_cast<double>(mix(plan_.seed ^ mix(n)) >> 11) * 0x1.0p-53;
    refuse = u < plan_.probability;
  }
  if (refuse) injected_.fetch_add(1, std::memory_order_relaxed);
  return refuse;
}

void* FaultInjectingResource::allocate(std::size_t bytes, stream_t stream) {
  if (refuse_next()) return nullptr;
  void* ptr = upstream_->allocate(bytes, stream);
  if (ptr != nullptr) outstanding_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  return ptr;
}

void FaultInjectingResource::deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  outstanding_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  upstream_->deallocate(ptr, bytes, stream);
}

VirtualMemory* FaultInjectingResource::virtual_memory() {
  std::call_once(pages_once_, [this] {
    if (VirtualMemory* vm = upstream_->virtual_memory()) pages_vm_ = std::make_unique<Pages>(*this, *vm);
  });
  return pages_vm_.get();
}

}  // namespace gpukeeper
