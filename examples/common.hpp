// Helpers the example programs share: command-line numbers, `--device cuda`, seeded
// shuffles, whole-file writes, gnuplot.
#pragma once

#include <precis/config.hpp>
#include <precis/io/file.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

namespace examples {

/// Reads argv[i + 1] as a whole number of at least `min` into `out` and moves i past it;
/// false when there is no next argument or it is not such a number.
template <class T>
bool next_count(int argc, char** argv, int& i, long long min, T& out) {
  if (i + 1 >= argc) return false;
  char* end = nullptr;
  const long long v = std::strtoll(argv[++i], &end, 10);
  if (*end != '\0' || v < min) return false;
  out = static_cast<T>(v);
  return true;
}

/// `--device cuda` anywhere on the command line: runs `program` (the example's CUDA build;
/// null where the build has no CUDA backend) in this process's place with the other
/// arguments. Returns -1 when the run stays on the CPU (no --device, or --device cpu), and 2
/// after a message when --device names something else or the program cannot be started.
inline int run_on_device(const char* example, const char* program, int argc, char** argv) {
  bool cuda = false;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) != "--device") continue;
    const std::string_view d = argv[i + 1];
    if (d != "cpu" && d != "cuda") {
      std::fprintf(stderr, "%s: --device takes cpu or cuda, not '%s'\n", example, argv[i + 1]);
      return 2;
    }
    cuda = d == "cuda";
  }
  if (!cuda) return -1;
  if (program == nullptr) {
    std::fprintf(stderr, "%s: --device cuda needs a build with the CUDA backend (-DPRECIS_CUDA=ON)\n", example);
    return 2;
  }
  std::vector<char*> args{const_cast<char*>(program)};
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--device") {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "%s: cannot run %s for --device cuda\n", example, program);
  return 2;
}

/// SplitMix64's mixing function: the examples' random draws, the same on every platform
/// (never a standard-library distribution).
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The order of an epoch's n items: a Fisher-Yates shuffle driven by mix64 on (seed,
/// epoch), the same on every platform.
inline std::vector<std::size_t> epoch_order(std::size_t n, std::uint64_t seed, std::size_t epoch) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (std::size_t i = n; i > 1; --i) {
    const std::size_t j = mix64(mix64(seed * 1000003 + epoch) + i) % i;
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

/// `v` printed with the printf format `fmt`.
inline std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

/// Writes `text` to `path` atomically (precis::write_file_atomically): a failed run leaves
/// no half-written file. Throws precis::error when it cannot.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  precis::write_file_atomically(path, text);
}

/// Writes the gnuplot `script` and runs it to draw `png`. Without gnuplot it says so (the
/// data files are written either way); a gnuplot that fails throws precis::error.
inline void draw_with_gnuplot(const std::filesystem::path& script, const std::string& text,
                              const std::filesystem::path& png) {
  write_file(script, text);
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("gnuplot is not installed: %s was not drawn (apt-get install gnuplot-nox)\n", png.string().c_str());
    return;
  }
  const std::string cmd = "gnuplot '" + script.string() + "'";
  if (std::system(cmd.c_str()) != 0) throw precis::error("gnuplot failed on " + script.string());
  std::printf("wrote %s\n", png.string().c_str());
}

}  // namespace examples
