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
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

#include "gpukeeper/memory/resource.hpp"

namespace gkbench {

class SimulatedDeviceResource final : public gpukeeper::MemoryResource {
 public:
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;  // like cudaMalloc's pages

  // `capacity`: the simulated device's memory; the address range reserved is 4x that
  // (fragmentation of the address space itself must never be what fails).
  explicit SimulatedDeviceResource(std::size_t capacity) : capacity_(capacity) {
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
    if (bytes == 0 || bytes > capacity_ - live_) return nullptr;
    const std::size_t span = round_up(bytes, kGranularity);
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {  // first fit
      if (it->second < span) continue;
      std::uintptr_t addr = it->first;
      std::size_t left = it->second - span;
      free_ranges_.erase(it);
      if (left) free_ranges_.emplace(addr + span, left);
      live_ += bytes;
      if (live_ > peak_) peak_ = live_;
      ++allocations_;
      return reinterpret_cast<void*>(addr);
    }
    return nullptr;  // address range exhausted (only with extreme fragmentation)
  }

  void deallocate(void* ptr, std::size_t bytes, gpukeeper::stream_t) noexcept override {
    std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t span = round_up(bytes, kGranularity);
    live_ -= bytes;
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
    info.total = capacity_;
    info.free = capacity_ - live_;
    return info;
  }

  std::size_t live_bytes() const noexcept { return live_; }
  std::size_t peak_bytes() const noexcept { return peak_; }
  std::uint64_t allocations() const noexcept { return allocations_; }
  std::uint64_t frees() const noexcept { return frees_; }
  bool mapped() const noexcept { return mapping_ != nullptr; }

 private:
  static std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

  std::size_t capacity_;
  std::size_t span_ = 0;
  void* mapping_ = nullptr;
  std::uintptr_t base_ = 0;
  std::map<std::uintptr_t, std::size_t> free_ranges_;  // address -> bytes
  std::size_t live_ = 0, peak_ = 0;
  std::uint64_t allocations_ = 0, frees_ = 0;
};

}  // namespace gkbench
