// VirtualMemory on plain host memory: reserved ranges are PROT_NONE mappings and pages
// are slices of one memfd, so a page really moves between addresses, as on a GPU. It
// lets expandable segments run (and be tested) without a GPU.
#pragma once

#include <mutex>
#include <vector>

#include "gpukeeper/memory/virtual_memory.hpp"

namespace gpukeeper {

class HostVirtualMemory final : public VirtualMemory {
 public:
  explicit HostVirtualMemory(std::size_t page_size = std::size_t{2} << 20);
  ~HostVirtualMemory() override;

  std::size_t page_size() const noexcept override { return page_size_; }
  std::uintptr_t reserve(std::size_t bytes) override;
  void unreserve(std::uintptr_t base, std::size_t bytes) noexcept override;
  page_t create_page() override;
  void release_page(page_t page) noexcept override;
  void map(std::uintptr_t address, page_t page) override;
  void set_access(std::uintptr_t, std::size_t) override {}  // map() grants it already
  void unmap(std::uintptr_t address) noexcept override;

 private:
  std::size_t page_size_;
  int fd_ = -1;
  std::mutex mutex_;
  std::size_t file_pages_ = 0;        // length of the memfd, in pages
  std::vector<std::size_t> unused_;   // page slots of the file that are free
};

}  // namespace gpukeeper
