// The ViT example's result tables, shared by the CPU program (train_vit.cpp) and the GPU
// program (train_vit_cuda.cu): summary.csv (one row per map) and curves.csv (one row per
// epoch). Each program's result type has the members used here.
#pragma once

#include "../report.hpp"

#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace vit {

/// summary.csv: policy, epochs, test accuracy, skipped steps, final scale, ms per step and
/// peak RSS for each result, then a last column named `column` that holds `hardware` (the
/// CPU or the GPU the run used).
template <class Result>
std::string summary_csv(const std::vector<Result>& results, std::size_t epochs, std::string_view column,
                        const std::string& hardware) {
  std::ostringstream s;
  s << "policy,epochs,test_accuracy,skipped_steps,final_scale,ms_per_step,peak_rss_mib," << column << "\n";
  for (const auto& r : results) {
    s << r.name << "," << epochs << "," << r.accuracy << "," << r.skipped << "," << r.final_scale << ","
      << r.ms_per_step << "," << r.peak_rss_mib << "," << examples::csv_field(hardware) << "\n";
  }
  return s.str();
}

/// curves.csv: for each of the first `epochs` epochs, each result's training loss, test
/// accuracy and loss scale at the epoch's end (columns <name>_train_loss, <name>_test_accuracy,
/// <name>_scale).
template <class Result>
std::string curves_csv(const std::vector<Result>& results, std::size_t epochs) {
  std::ostringstream c;
  c << "epoch";
  for (const auto& r : results) c << "," << r.name << "_train_loss," << r.name << "_test_accuracy," << r.name << "_scale";
  c << "\n";
  for (std::size_t ep = 0; ep < epochs; ++ep) {
    c << ep + 1;
    for (const auto& r : results) {
      const auto& er = r.epochs[ep];
      c << "," << er.train_loss << "," << er.test_accuracy << "," << er.scale;
    }
    c << "\n";
  }
  return c.str();
}

}  // namespace vit
