// What the training examples report beside their results: the CPU they ran on, their peak
// memory, and CSV fields.
#pragma once

#include "../bench/common.hpp"

#include <cstdlib>
#include <fstream>
#include <string>

namespace examples {

/// The CPU model and its ISA extensions, and what the kernels were compiled for.
inline std::string cpu_line() {
  return precis_bench::cpu_model() + " (" + precis_bench::cpu_isa() + "; kernels for " + precis_bench::simd_name() + ")";
}

/// The process's peak resident memory in MiB (VmHWM), or 0 where /proc does not say.
inline double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0.0;
}

/// Starts a new peak-memory measurement (Linux: writing 5 to clear_refs resets VmHWM).
inline void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

/// `s` quoted for CSV when it holds a comma or a quote.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace examples
