// Small timing harness shared by the benchmarks: best-of-N wall time, a printed table,
// and optional CSV output. Ratios are taken within one run, on one machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace precis_bench {

/// Best (minimum) wall time of `reps` calls of `f`, in milliseconds, after a warm-up.
/// It first waits 300 ms: the library measured before may leave worker threads polling
/// for work (OpenBLAS's and OpenMP's do for a while after a call, as precis's do for well
/// under a millisecond), and on a two-core machine they would take a core from `f`.
/// The warm-up runs `f` for at least 50 ms, so that newly started worker threads have been
/// spread over the cores before the timing starts (steady state, as in a training loop).
template <class F>
double best_ms(F&& f, int reps = 7) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto warm = std::chrono::steady_clock::now();
  do {
    f();
  } while (std::chrono::steady_clock::now() - warm < std::chrono::milliseconds(50));
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

/// Rows of named columns, printed aligned and optionally written as CSV.
class table {
 public:
  explicit table(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print() const {
    std::vector<std::size_t> width(columns_.size());
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      width[c] = columns_[c].size();
      for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& r) {
      for (std::size_t c = 0; c < r.size(); ++c) std::printf("%-*s  ", int(width[c]), r[c].c_str());
      std::printf("\n");
    };
    line(columns_);
    for (const auto& r : rows_) line(r);
  }

  /// Writes the table as CSV (RFC 4180: a field holding a comma, a quote or a line break is
  /// quoted, its quotes doubled), which docs/tools/perf_tables.py reads.
  void write_csv(const std::string& path) const {
    std::ofstream out(path);
    auto field = [&](const std::string& f) {
      if (f.find_first_of(",\"\n") == std::string::npos) {
        out << f;
        return;
      }
      out << '"';
      for (char ch : f) out << (ch == '"' ? "\"\"" : std::string(1, ch));
      out << '"';
    };
    auto line = [&](const std::vector<std::string>& r) {
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (c) out << ',';
        field(r[c]);
      }
      out << "\n";
    };
    line(columns_);
    for (const auto& r : rows_) line(r);
  }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

inline std::string fixed(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

/// The SIMD instruction set the float micro-kernel of precis's gemm and conv was compiled
/// for (chosen at compile time, as in kernels/cpu/gemm_kernel.hpp).
inline const char* simd_name() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2+FMA";
#else
  return "portable 16-byte vectors";
#endif
}

/// `v` as fixed(), or "n/a" when missing (a baseline this CPU cannot run).
inline std::string fixed_or_na(const std::optional<double>& v, int digits = 2) {
  return v ? fixed(*v, digits) : std::string("n/a");
}

/// The CPU's model name (Linux: /proc/cpuinfo), or "unknown CPU".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

/// The CPU's vector and dot-product extensions that matter to precis's kernels (Linux:
/// /proc/cpuinfo flags), e.g. "AVX-512 AVX512-BF16"; "unknown ISA" where nothing is read.
inline std::string cpu_isa() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    // Whether `flag` is one of the line's space-separated words.
    auto has = [&](std::string_view flag) {
      const std::string_view l(line);
      for (std::size_t pos = l.find(flag); pos != std::string_view::npos; pos = l.find(flag, pos + 1)) {
        const std::size_t end = pos + flag.size();
        if ((pos == 0 || l[pos - 1] == ' ' || l[pos - 1] == '\t') && (end == l.size() || l[end] == ' ')) return true;
      }
      return false;
    };
    std::string isa = has("avx512f") ? "AVX-512" : has("avx2") ? "AVX2" : "SSE";
    for (const auto& [flag, name] : {std::pair{"avx512_bf16", "AVX512-BF16"}, std::pair{"avx512_fp16", "AVX512-FP16"},
                                     std::pair{"amx_bf16", "AMX-BF16"}}) {
      if (has(flag)) isa += std::string(" ") + name;
    }
    return isa;
  }
  return "unknown ISA";
}

/// Prints the machine a benchmark ran on: CPU model, hardware threads, the SIMD set the
/// kernels were compiled for.
inline void print_machine() {
  std::printf("CPU: %s, %u hardware threads; kernels compiled for %s\n", cpu_model().c_str(),
              std::thread::hardware_concurrency(), simd_name());
}

/// `--csv <path>` from the command line, or empty.
inline std::string csv_path(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--csv") return argv[i + 1];
  }
  return {};
}

}  // namespace precis_bench
