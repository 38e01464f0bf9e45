// Helpers the example programs share: command-line numbers, whole-file writes, gnuplot.
#pragma once

#include <precis/config.hpp>
#include <precis/io/file.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <type_traits>

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
