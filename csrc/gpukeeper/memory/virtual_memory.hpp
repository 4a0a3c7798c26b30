// Address space and physical pages, separately: the basis of expandable segments.
//
// A pool reserves a large virtual range once and maps physical pages into it where
// blocks need them. A page no block touches can be unmapped and its physical memory
// mapped elsewhere, so the memory a pool holds follows what is allocated, not the
// shape of its address space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpukeeper {

class VirtualMemory {
 public:
  using page_t = std::uint64_t;  // a physical page; 0 is "none"

  virtual ~VirtualMemory() = default;

  // Bytes of one page: every map/unmap covers exactly one page at a page-aligned address.
  virtual std::size_t page_size() const noexcept = 0;

  // A range of `bytes` (a multiple of page_size()) of addresses with nothing mapped; 0
  // when no address space is left.
  virtual std::uintptr_t reserve(std::size_t bytes) = 0;
  virtual void unreserve(std::uintptr_t base, std::size_t bytes) noexcept = 0;

  // One physical page, or 0 when memory is exhausted. Throws DeviceError on faults.
  virtual page_t create_page() = 0;
  virtual void release_page(page_t page) noexcept = 0;

  // Maps `page` at `address` (page-aligned, inside a reserved range, unmapped). It is
  // usable once set_access() has covered it.
  virtual void map(std::uintptr_t address, page_t page) = 0;
  // Grants read and write access to `bytes` of mapped pages from `address` (one call
  // may cover many pages mapped one by one).
  virtual void set_access(std::uintptr_t address, std::size_t bytes) = 0;
  // The caller guarantees that no work touches the page any more.
  virtual void unmap(std::uintptr_t address) noexcept = 0;

  // A POSIX file descriptor naming `page`, for another process to take with pidfd_getfd
  // and import (CUDA IPC of a block in an expandable range). The descriptor belongs to
  // this object and stays open until the page is released: the receiver takes its own
  // copy while it is open, whenever it gets to it, so it cannot be closed after sending.
  // Throws GpuError, saying why, where the memory cannot be shared.
  virtual int share_page(page_t page);
};

}  // namespace gpukeeper
