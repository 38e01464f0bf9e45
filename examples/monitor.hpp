// The training examples' --monitor and --advise outputs (precis::diagnostics).
#pragma once

#include "common.hpp"

#include <precis/diagnostics/diagnostics.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace examples {

/// Prints the monitor's table for the run `name` and writes under `out`:
/// ranges_<name>.csv (per layer), series_<name>.csv (amax per observed step) and
/// ranges_<name>.png (gnuplot); with a non-empty `advise`, the advised policy map there,
/// its first line naming `command` (how the run was made).
inline void write_monitor(const precis::diagnostics::monitor& m, const std::filesystem::path& out,
                          const std::string& name, const std::filesystem::path& advise,
                          const std::string& command) {
  std::printf("ranges under %s (every %llu steps):\n%s", name.c_str(),
              static_cast<unsigned long long>(m.options().every), m.table().c_str());
  const auto series = out / ("series_" + name + ".csv");
  write_file(out / ("ranges_" + name + ".csv"), m.csv());
  write_file(series, m.series_csv());
  const auto png = out / ("ranges_" + name + ".png");
  draw_with_gnuplot(out / ("ranges_" + name + ".gp"),
                    m.gnuplot_script(series.string(), png.string()), png);
  if (!advise.empty()) {
    write_file(advise, precis::diagnostics::advise(m, {.note = "made by: " + command}));
    std::printf("  wrote the advised policy map to %s\n", advise.string().c_str());
  }
}

/// The command line, for the advised map's first line.
inline std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i != 0) s += ' ';
    s += i == 0 ? std::filesystem::path(argv[0]).filename().string() : std::string(argv[i]);
  }
  return s;
}

}  // namespace examples
