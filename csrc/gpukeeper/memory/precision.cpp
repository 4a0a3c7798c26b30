#include "gpukeeper/memory/precision.hpp"

#include <algorithm>
#include <cctype>
#include <limits>

#include "gpukeeper/core/errors.hpp"

namespace gpukeeper {

std::size_t element_size(Precision p) noexcept {
  switch (p) {
    case Precision::fp64:
    case Precision::int64: return 8;
    case Precision::fp32:
    case Precision::int32: return 4;
    case Precision::fp16:
    case Precision::bf16:
    case Precision::int16: return 2;
    case Precision::int8:
    case Precision::uint8:
    case Precision::boolean: return 1;
  }
  return 1;
}

const char* to_string(Precision p) noexcept {
  switch (p) {
    case Precision::fp64: return "fp64";
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::int64: return "int64";
    case Precision::int32: return "int32";
    case Precision::int16: return "int16";
    case Precision::int8: return "int8";
    case Precision::uint8: return "uint8";
    case Precision::boolean: return "bool";
  }
  return "unknown";
}

Precision parse_precision(const std::string& name) {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (key.rfind("torch.", 0) == 0) key = key.substr(6);
  struct Alias {
    const char* name;
    Precision value;
  };
  static const Alias aliases[] = {
      {"fp64", Precision::fp64},   {"float64", Precision::fp64}, {"double", Precision::fp64},
      {"fp32", Precision::fp32},   {"float32", Precision::fp32}, {"float", Precision::fp32},
      {"fp16", Precision::fp16},   {"float16", Precision::fp16}, {"half", Precision::fp16},
      {"bf16", Precision::bf16},   {"bfloat16", Precision::bf16},
      {"int64", Precision::int64}, {"long", Precision::int64},   {"int32", Precision::int32},
      {"int", Precision::int32},   {"int16", Precision::int16},  {"short", Precision::int16},
      {"int8", Precision::int8},   {"uint8", Precision::uint8},  {"bool", Precision::boolean},
      {"boolean", Precision::boolean},
  };
  for (const Alias& a : aliases) {
    if (key == a.name) return a.value;
  }
  throw InvalidInputError("unknown precision '" + name +
                          "': expected one of fp64, fp32, fp16, bf16, int64, int32, int16, "
                          "int8, uint8, bool (or a dtype name such as 'float32')");
}

std::size_t bytes_for(std::size_t count, Precision p) {
  std::size_t size = element_size(p);
  if (count > std::numeric_limits<std::size_t>::max() / size) {
    throw InvalidInputError(std::to_string(count) + " elements of " + to_string(p) +
                            " overflow the address space");
  }
  return count * size;
}

}  // namespace gpukeeper
