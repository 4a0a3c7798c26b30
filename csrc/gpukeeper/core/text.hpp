// A string builder with `<<`, for messages. It formats numbers with std::to_string and
// snprintf instead of iostreams: iostreams consult the global locale, and a module that
// carries its own copy of libstdc++ next to PyTorch's must not (seen crashing in codecvt).
#pragma once

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

}  // namespace gpukeeper::detail
