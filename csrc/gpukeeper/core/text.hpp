// A string builder with `<<`, for messages. It formats numbers with std::to_string and
// snprintf instead of iostreams: iostreams consult the global locale, and a module that
// carries its own copy of libstdc++ next to PyTorch's must not (seen crashing in codecvt).
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace gpukeeper::detail {

class Text {
 public:
  Text& operator<<(const std::string& s) {
    text_ += s;
    return *this;
  }
  Text& operator<<(const char* s) {
    text_ += s;
    return *this;
  }
  Text& operator<<(char c) {
    text_ += c;
    return *this;
  }
  Text& operator<<(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    text_ += buf;
    return *this;
  }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  Text& operator<<(T v) {
    text_ += std::to_string(v);
    return *this;
  }
  const std::string& str() const noexcept { return text_; }

 private:
  std::string text_;
};

// "1.5 GiB": bytes for people, in powers of 1024, with one decimal as Python's
// byte_figures.fmt_bytes writes them.
inline std::string human_bytes(std::size_t bytes) {
  char text[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  }
  return text;
}

// "0x7f12...": a pointer for messages.
inline std::string hex(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%" PRIxPTR, reinterpret_cast<std::uintptr_t>(ptr));
  return text;
}

}  // namespace gpukeeper::detail
