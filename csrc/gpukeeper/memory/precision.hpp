// Element types of buffers: sizes in the Python API are counted in elements of these.
#pragma once

#include <cstddef>
#include <string>

namespace gpukeeper {

enum class Precision { fp64, fp32, fp16, bf16, int64, int32, int16, int8, uint8, boolean };

std::size_t element_size(Precision p) noexcept;
const char* to_string(Precision p) noexcept;

// Accepts our names ("fp32", "bf16", ...) and the usual dtype spellings ("float32",
// "float", "half", "bfloat16", "int64", "bool", ...). Throws InvalidInputError otherwise.
Precision parse_precision(const std::string& name);

// Bytes for `count` elements; InvalidInputError on overflow.
std::size_t bytes_for(std::size_t count, Precision p);

}  // namespace gpukeeper
