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
/// ranges_<name>.png (gnuplot); with a non-empty `advise`, the advised policy map there.
inline void write_monitor(const precis::diagnostics::monitor& m, const std::filesystem::path& out,
                          const std::string& name, const std::filesystem::path& advise) {
  std::printf("ranges under %s (every %llu steps):\n%s", name.c_str(),
              static_cast<unsigned long long>(m.options().every), m.table().c_str());
  const auto series = out / ("series_" + name + ".csv");
  write_file(out / ("ranges_" + name + ".csv"), m.csv());
  write_file(series, m.series_csv());
  const auto png = out / ("ranges_" + name + ".png");
  draw_with_gnuplot(out / ("ranges_" + name + ".gp"),
                    m.gnuplot_script(series.string(), png.string()), png);
  if (!advise.empty()) {
    write_file(advise, precis::diagnostics::advise(m));
    std::printf("  wrote the advised policy map to %s\n", advise.string().c_str());
  }
}

}  // namespace examples
