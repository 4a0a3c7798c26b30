// Small helpers shared by the C++ benchmarks: order statistics, a JSON writer, the
// machine's description, argument parsing. Header-only; no dependencies beyond the core.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <type_traits>

#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/memory/caching_pool.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gkbench {

using Clock = std::chrono::steady_clock;

// PoolOptions::expandable_slack (the spare-memory budget) for this run; negative: the default.
inline double g_expandable_slack = -1.0;

// How a pool lays out its segments in a benchmark: all fixed, all expandable, hybrid
// (large requests in expandable ranges, small ones in fixed segments), or the default
// (PoolOptions{}: hybrid where the upstream is device memory with virtual memory).
struct SegmentLayout {
  const char* name;  // "fixed", "expandable", "hybrid", "default": the suffix of a mode's name
  gpukeeper::SegmentLayout segments;
};
inline constexpr SegmentLayout kFixed{"fixed", gpukeeper::SegmentLayout::fixed};
inline constexpr SegmentLayout kExpandable{"expandable", gpukeeper::SegmentLayout::expandable};
inline constexpr SegmentLayout kHybrid{"hybrid", gpukeeper::SegmentLayout::hybrid};
inline constexpr SegmentLayout kDefault{"default", gpukeeper::SegmentLayout::automatic};

inline gpukeeper::PoolOptions pool_options(const SegmentLayout& layout) {
  gpukeeper::PoolOptions o;
  o.segments = layout.segments;
  if (g_expandable_slack >= 0.0) o.expandable_slack = g_expandable_slack;
  return o;
}

inline double elapsed_ns(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

// Keeps the compiler from proving a value unused (and the call producing it removable).
template <typename T>
inline void do_not_optimize(T const& value) {
#if defined(__GNUC__) || defined(__clang__)
  asm volatile("" : : "r,m"(value) : "memory");
#else
  static volatile T sink;
  sink = value;
#endif
}

// Linear-interpolated quantile q in [0, 1] of `values` (copied and sorted).
inline double quantile(std::vector<double> values, double q) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  double pos = q * static_cast<double>(values.size() - 1);
  std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  std::size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return values[lo] * (1.0 - frac) + values[hi] * frac;
}

struct Summary {
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
};

inline Summary summarize(const std::vector<double>& v) {
  Summary s;
  if (v.empty()) {
    s.median = s.p10 = s.p90 = s.min = s.max = s.mean = std::nan("");
    return s;
  }
  s.median = quantile(v, 0.5);
  s.p10 = quantile(v, 0.1);
  s.p90 = quantile(v, 0.9);
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

// ------------------------------------------------------------------ JSON

inline std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

inline std::string json_str(const std::string& s) { return "\"" + json_escape(s) + "\""; }

inline std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

inline std::string json_num(std::uint64_t x) { return std::to_string(x); }
inline std::string json_num(std::int64_t x) { return std::to_string(x); }
inline std::string json_num(int x) { return std::to_string(x); }
inline std::string json_bool(bool b) { return b ? "true" : "false"; }

// Builds one JSON object; values are inserted already encoded.
class JsonObject {
 public:
  JsonObject& raw(const std::string& key, const std::string& encoded) {
    fields_.emplace_back(key, encoded);
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& v) { return raw(key, json_str(v)); }
  JsonObject& num(const std::string& key, double v) { return raw(key, json_num(v)); }
  JsonObject& integer(const std::string& key, std::uint64_t v) { return raw(key, json_num(v)); }
  JsonObject& boolean(const std::string& key, bool v) { return raw(key, json_bool(v)); }
  JsonObject& summary(const std::string& prefix, const Summary& s) {
    num(prefix + "median", s.median);
    num(prefix + "p10", s.p10);
    num(prefix + "p90", s.p90);
    num(prefix + "min", s.min);
    num(prefix + "max", s.max);
    num(prefix + "mean", s.mean);
    return *this;
  }
  std::string dump(int indent = 0) const {
    std::string pad(static_cast<std::size_t>(indent) + 2, ' ');
    std::string out = "{";
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      out += (i ? ",\n" : "\n") + pad + json_str(fields_[i].first) + ": " + fields_[i].second;
    }
    out += fields_.empty() ? "}" : "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "}";
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

inline std::string json_array(const std::vector<std::string>& encoded, int indent = 0) {
  if (encoded.empty()) return "[]";
  std::string pad(static_cast<std::size_t>(indent) + 2, ' ');
  std::string out = "[";
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    out += (i ? ",\n" : "\n") + pad + encoded[i];
  }
  return out + "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "]";
}

inline bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) return false;
  f << text << "\n";
  return static_cast<bool>(f);
}

// Writes a benchmark's JSON report and says where, or why not (false then).
inline bool write_json_report(const std::string& path, const std::string& json) {
  if (!write_file(path, json)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::printf("\nJSON written to %s\n", path.c_str());
  return true;
}

// ------------------------------------------------------------------ machine

inline std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

inline std::string host_cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(line.find_first_not_of(' ', pos + 1));
    }
  }
  return "unknown";
}

inline std::string hostname() {
  std::ifstream f("/proc/sys/kernel/hostname");
  std::string name;
  std::getline(f, name);
  return name.empty() ? "unknown" : name;
}

// Build, CUDA state and (when usable) device 0, as a JSON object.
inline JsonObject environment_json() {
  JsonObject env;
  gpukeeper::BuildInfo b = gpukeeper::build_info();
  gpukeeper::CudaStatus s = gpukeeper::cuda_status();
  env.str("timestamp_utc", utc_now());
  env.str("hostname", hostname());
  env.str("cpu", host_cpu_model());
  env.boolean("build_cuda", b.cuda);
  env.str("build_cuda_version", b.cuda_version);
  env.boolean("static_cudart", b.static_cudart);
  env.str("compiler", b.compiler);
  env.str("build_type", b.build_type);
  env.boolean("cuda_available", s.available);
  env.str("cuda_unavailable_reason", s.reason);
  env.integer("cuda_device_count", static_cast<std::uint64_t>(s.device_count));
  env.integer("cuda_driver_version", static_cast<std::uint64_t>(s.driver_version));
  env.integer("cuda_runtime_version", static_cast<std::uint64_t>(s.runtime_version));
#ifdef GPUKEEPER_WITH_CUDA
  if (s.available) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      env.str("gpu_name", prop.name);
      env.integer("gpu_total_memory", static_cast<std::uint64_t>(prop.totalGlobalMem));
      env.str("gpu_compute_capability",
              std::to_string(prop.major) + "." + std::to_string(prop.minor));
    } else {
      (void)cudaGetLastError();
    }
  }
#endif
  return env;
}

inline std::string environment_line() {
  gpukeeper::BuildInfo b = gpukeeper::build_info();
  gpukeeper::CudaStatus s = gpukeeper::cuda_status();
  std::ostringstream out;
  out << "build: " << (b.cuda ? "CUDA " + b.cuda_version : std::string("CPU-only")) << ", "
      << b.compiler << ", " << b.build_type << "; cpu: " << host_cpu_model() << "\n";
  if (!s.available) {
    out << "CUDA: unavailable (" << s.reason << ")\n";
  } else {
    out << "CUDA: " << s.device_count << " device(s), driver " << s.driver_version
        << ", runtime " << s.runtime_version;
#ifdef GPUKEEPER_WITH_CUDA
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      out << "; device 0: " << prop.name << " (" << (prop.totalGlobalMem >> 20) << " MiB)";
    } else {
      (void)cudaGetLastError();
    }
#endif
    out << "\n";
  }
  return out.str();
}

// ------------------------------------------------------------------ formatting

inline std::string human_size(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

inline std::string fmt_ns(double ns) {
  char buf[32];
  if (!std::isfinite(ns)) return "-";
  if (ns < 10) {
    std::snprintf(buf, sizeof buf, "%.2f", ns);
  } else if (ns < 1000) {
    std::snprintf(buf, sizeof buf, "%.1f", ns);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", ns);
  }
  return buf;
}

// ------------------------------------------------------------------ arguments

// "--key value" or "--key=value"; returns true and sets *value when `key` matches argv[*i].
inline bool take_arg(int argc, char** argv, int* i, const char* key, std::string* value) {
  std::string arg = argv[*i];
  std::string k = key;
  if (arg == k) {
    if (*i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", key);
      std::exit(2);
    }
    *value = argv[++*i];
    return true;
  }
  if (arg.rfind(k + "=", 0) == 0) {
    *value = arg.substr(k.size() + 1);
    return true;
  }
  return false;
}

inline std::uint64_t parse_u64(const std::string& text, const char* what) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 0);
  if (end == text.c_str() || *end != '\0') {
    std::fprintf(stderr, "bad value for %s: '%s'\n", what, text.c_str());
    std::exit(2);
  }
  return v;
}

}  // namespace gkbench
