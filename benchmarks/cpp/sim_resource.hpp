// SimulatedDeviceResource: an upstream that hands out addresses from a large reserved
// virtual range without ever touching (or committing) memory, so that allocation traces
// of tens of gigabytes replay through a CachingPool on any machine, GPU or not.
//
// The range is mmap'ed PROT_NONE | MAP_NORESERVE: no physical memory and no commit
// charge, and any stray access faults at once instead of corrupting something. When the
// mapping cannot be had, plain integers from a fixed high base are used instead (the
// pool never dereferences its memory). A capacity emulates the device's size: a request
// that would take the live bytes above it returns nullptr, as cudaMalloc's OOM does, so
// the pool's release-and-retry path is exercised as on a real device.
//
// Not stream ordered (there is no device work to wait for), so the pool never records
// events for it. Single-threaded use only (the pool serialises its upstream calls).
// Where the core has expandable segments, virtual_memory() offers the same capacity as
// reserved ranges and 2 MiB pages (SimulatedVirtualMemory), so they replay anywhere too.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpukeeper/memory/resource.hpp"

// Expandable segments (CachingPool over VirtualMemory) are used when the core has them.
#if __has_include("gpukeeper/memory/virtual_memory.hpp")
#include <memory>
#include <mutex>

#include "gpukeeper/memory/virtual_memory.hpp"
#define GKBENCH_HAVE_VIRTUAL_MEMORY 1
#else
#define GKBENCH_HAVE_VIRTUAL_MEMORY 0
#endif

namespace gkbench {

// Counts a shared capacity: the simulated device's bytes, whether held as whole
// allocations or as virtual-memory pages.
struct SimulatedCapacity {
  std::size_t capacity = 0;
  std::size_t live = 0;
  std::size_t peak = 0;
  bool take(std::size_t bytes) {
    if (bytes > capacity - live) return false;
    live += bytes;
    if (live > peak) peak = live;
    return true;
  }
  void give(std::size_t bytes) { live -= bytes; }
};

#if GKBENCH_HAVE_VIRTUAL_MEMORY
// Address ranges reserved PROT_NONE (nothing touched or committed) and pages that are only
// numbers: a VirtualMemory as a GPU offers it (cuMemAddressReserve / cuMemCreate / cuMemMap),
// with page_size 2 MiB like CUDA's allocation granularity, drawing on the same capacity.
class SimulatedVirtualMemory final : public gpukeeper::VirtualMemory {
 public:
  SimulatedVirtualMemory(SimulatedCapacity& cap, std::size_t page_size)
      : cap_(cap), page_size_(page_size) {}
  std::size_t page_size() const noexcept override { return page_size_; }
  std::uintptr_t reserve(std::size_t bytes) override {
    void* p = ::mmap(nullptr, bytes + page_size_, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::uintptr_t base;
    if (p != MAP_FAILED) {
      base = (reinterpret_cast<std::uintptr_t>(p) + page_size_ - 1) / page_size_ * page_size_;
    } else {
      base = next_fake_;  // plain numbers high above the heap; never dereferenced
      next_fake_ += (bytes + page_size_) / page_size_ * page_size_ + page_size_;
    }
    ranges_.push_back({base, p != MAP_FAILED ? p : nullptr, bytes + page_size_});
    return base;
  }
  void unreserve(std::uintptr_t base, std::size_t) noexcept override {
    for (std::size_t i = 0; i < ranges_.size(); ++i) {
      if (ranges_[i].base != base) continue;
      if (ranges_[i].mapping) ::munmap(ranges_[i].mapping, ranges_[i].length);
      ranges_.erase(ranges_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  page_t create_page() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!cap_.take(page_size_)) return 0;
    ++pages_created_;
    if (!free_ids_.empty()) {
      page_t id = free_ids_.back();
      free_ids_.pop_back();
      return id;
    }
    return ++last_id_;
  }
  void release_page(page_t page) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    cap_.give(page_size_);
    free_ids_.push_back(page);
  }
  void map(std::uintptr_t, page_t) override { ++maps_; }
  void set_access(std::uintptr_t, std::size_t) override {}
  void unmap(std::uintptr_t) noexcept override { ++unmaps_; }
  ~SimulatedVirtualMemory() override {
    for (auto& r : ranges_) {
      if (r.mapping) ::munmap(r.mapping, r.length);
    }
  }
  std::uint64_t maps() const noexcept { return maps_; }
  std::uint64_t pages_created() const noexcept { return pages_created_; }

 private:
  struct Range {
    std::uintptr_t base;
    void* mapping;
    std::size_t length;
  };
  SimulatedCapacity& cap_;
  std::size_t page_size_;
  std::mutex mutex_;
  std::vector<Range> ranges_;
  std::vector<page_t> free_ids_;
  page_t last_id_ = 0;
  std::uintptr_t next_fake_ = std::uintptr_t{1} << 45;
  std::uint64_t maps_ = 0, unmaps_ = 0, pages_created_ = 0;
};
#endif

class SimulatedDeviceResource final : public gpukeeper::MemoryResource {
 public:
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;  // like cudaMalloc's pages

  // `capacity`: the simulated device's memory; the address range reserved is 4x that
  // (fragmentation of the address space itself must never be what fails).
  explicit SimulatedDeviceResource(std::size_t capacity) {
    cap_.capacity = capacity;
    span_ = round_up(capacity * 4, kGranularity);
    void* p = ::mmap(nullptr, span_ + kGranularity, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      mapping_ = p;
      base_ = round_up(reinterpret_cast<std::uintptr_t>(p), kGranularity);
    } else {
      base_ = std::uintptr_t{1} << 44;  // 16 TiB: above any heap this process will have
    }
    free_ranges_.emplace(base_, span_);
  }
  ~SimulatedDeviceResource() override {
    if (mapping_) ::munmap(mapping_, span_ + kGranularity);
  }
  SimulatedDeviceResource(const SimulatedDeviceResource&) = delete;
  SimulatedDeviceResource& operator=(const SimulatedDeviceResource&) = delete;

  void* allocate(std::size_t bytes, gpukeeper::stream_t) override {
    if (bytes == 0 || bytes > cap_.capacity - cap_.live) return nullptr;
    const std::size_t span = round_up(bytes, kGranularity);
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {  // first fit
      if (it->second < span) continue;
      std::uintptr_t addr = it->first;
      std::size_t left = it->second - span;
      free_ranges_.erase(it);
      if (left) free_ranges_.emplace(addr + span, left);
      cap_.take(bytes);
      ++allocations_;
      return reinterpret_cast<void*>(addr);
    }
    return nullptr;  // address range exhausted (only with extreme fragmentation)
  }

  void deallocate(void* ptr, std::size_t bytes, gpukeeper::stream_t) noexcept override {
    std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t span = round_up(bytes, kGranularity);
    cap_.give(bytes);
    ++frees_;
    auto next = free_ranges_.lower_bound(addr);
    if (next != free_ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == addr) {
        addr = prev->first;
        span += prev->second;
        free_ranges_.erase(prev);
      }
    }
    if (next != free_ranges_.end() && addr + span == next->first) {
      span += next->second;
      free_ranges_.erase(next);
    }
    free_ranges_.emplace(addr, span);
  }

  gpukeeper::ResourceKind kind() const noexcept override { return gpukeeper::ResourceKind::device; }
  int device() const noexcept override { return 0; }
  bool stream_ordered() const noexcept override { return false; }
  bool device_accessible() const noexcept override { return true; }
  bool host_accessible() const noexcept override { return false; }
  gpukeeper::MemoryInfo memory_info() const override {
    gpukeeper::MemoryInfo info;
    info.total = cap_.capacity;
    info.free = cap_.capacity - cap_.live;
    return info;
  }

#if GKBENCH_HAVE_VIRTUAL_MEMORY
  gpukeeper::VirtualMemory* virtual_memory() override {
    if (!vm_) vm_ = std::make_unique<SimulatedVirtualMemory>(cap_, kGranularity);
    return vm_.get();
  }
#endif

  // Bytes held (whole allocations and virtual-memory pages together), and their peak.
  std::size_t live_bytes() const noexcept { return cap_.live; }
  std::size_t peak_bytes() const noexcept { return cap_.peak; }
  std::uint64_t allocations() const noexcept { return allocations_; }
  std::uint64_t frees() const noexcept { return frees_; }
  bool mapped() const noexcept { return mapping_ != nullptr; }

 private:
  static std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

  SimulatedCapacity cap_;
#if GKBENCH_HAVE_VIRTUAL_MEMORY
  std::unique_ptr<SimulatedVirtualMemory> vm_;  // declared after cap_: dies first
#endif
  std::size_t span_ = 0;
  void* mapping_ = nullptr;
  std::uintptr_t base_ = 0;
  std::map<std::uintptr_t, std::size_t> free_ranges_;  // address -> bytes
  std::uint64_t allocations_ = 0, frees_ = 0;
};

}  // namespace gkbench
