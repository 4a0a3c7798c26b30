// The error types every layer throws. Python maps each to a class of the same name
// (InvalidInputError is also a ValueError, AllocationError also a MemoryError).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace gpukeeper {

class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something the library cannot act on; no state was changed.
class InvalidInputError : public GpuError {
 public:
  using GpuError::GpuError;
};

// Memory could not be had even after releasing caches and running reclaim callbacks.
class AllocationError : public GpuError {
 public:
  AllocationError(const std::string& what, std::size_t requested)
      : GpuError(what), requested_(requested) {}
  std::size_t requested() const noexcept { return requested_; }

 private:
  std::size_t requested_;
};

// A CUDA call failed for a reason other than running out of memory.
class DeviceError : public GpuError {
 public:
  DeviceError(const std::string& call, int code, const std::string& code_name,
              const std::string& message)
      : GpuError(call + " failed: " + code_name + " (" + std::to_string(code) + "): " + message),
        call_(call),
        code_(code) {}
  const std::string& call() const noexcept { return call_; }
  int code() const noexcept { return code_; }

 private:
  std::string call_;
  int code_;
};

}  // namespace gpukeeper
