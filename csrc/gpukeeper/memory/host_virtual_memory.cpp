#include "gpukeeper/memory/host_virtual_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gpukeeper/core/errors.hpp"

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif

namespace gpukeeper {

namespace {
[[noreturn]] void throw_errno(const char* call) {
  throw DeviceError(call, errno, "errno", std::strerror(errno));
}
}  // namespace

HostVirtualMemory::HostVirtualMemory(std::size_t page_size) : page_size_(page_size) {
  long os_page = sysconf(_SC_PAGESIZE);
  if (page_size_ == 0 || (os_page > 0 && page_size_ % static_cast<std::size_t>(os_page) != 0)) {
    throw InvalidInputError("page size must be a multiple of the OS page size");
  }
  fd_ = static_cast<int>(syscall(SYS_memfd_create, "gpukeeper-pages", MFD_CLOEXEC));
  if (fd_ < 0) throw_errno("memfd_create");
}

HostVirtualMemory::~HostVirtualMemory() {
  if (fd_ >= 0) close(fd_);
}

std::uintptr_t HostVirtualMemory::reserve(std::size_t bytes) {
  void* base = mmap(nullptr, bytes + page_size_, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return 0;
  // Align the start to a page so that pages map at page-aligned addresses; trim the rest.
  auto raw = reinterpret_cast<std::uintptr_t>(base);
  std::uintptr_t aligned = (raw + page_size_ - 1) / page_size_ * page_size_;
  if (aligned > raw) munmap(base, aligned - raw);
  std::size_t tail = (raw + bytes + page_size_) - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return aligned;
}

void HostVirtualMemory::unreserve(std::uintptr_t base, std::size_t bytes) noexcept {
  munmap(reinterpret_cast<void*>(base), bytes);
}

VirtualMemory::page_t HostVirtualMemory::create_page() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t slot;
  if (!unused_.empty()) {
    slot = unused_.back();
    unused_.pop_back();
  } else {
    slot = file_pages_;
    if (ftruncate(fd_, static_cast<off_t>((file_pages_ + 1) * page_size_)) != 0) {
      if (errno == ENOSPC || errno == ENOMEM || errno == EFBIG) return 0;
      throw_errno("ftruncate");
    }
    ++file_pages_;
  }
  return static_cast<page_t>(slot) + 1;
}

void HostVirtualMemory::release_page(page_t page) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t slot = static_cast<std::size_t>(page - 1);
  // Give the memory back to the kernel now; the slot is reused by a later page.
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(slot * page_size_),
            static_cast<off_t>(page_size_));
  unused_.push_back(slot);
}

void HostVirtualMemory::map(std::uintptr_t address, page_t page) {
  off_t offset = static_cast<off_t>((page - 1) * page_size_);
  void* at = mmap(reinterpret_cast<void*>(address), page_size_, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_FIXED, fd_, offset);
  if (at == MAP_FAILED) throw_errno("mmap");
}

void HostVirtualMemory::unmap(std::uintptr_t address) noexcept {
  // Put the reservation back rather than leaving a hole another mapping could take.
  mmap(reinterpret_cast<void*>(address), page_size_, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

}  // namespace gpukeeper
