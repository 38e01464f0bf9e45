// The advisor's closed loop, first half: trains diag_loop's model in float with a monitor
// and writes the advised policy header to argv[1] (then tests/diagnostics/advise_check.cpp
// is built from it).
#include <precis/diagnostics/diagnostics.hpp>
#include <precis/io/file.hpp>

#include "loop_model.hpp"

#include <cstdio>
#include <exception>
#include <filesystem>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HEADER\n", argv[0]);
    return 2;
  }
  try {
    precis::diagnostics::monitor mon({.every = 5});
    const auto run = diag_loop::train<decltype(precis::make_policy_map(precis::presets::fp32{})),
                                      precis::no_scaling>(
        precis::make_policy_map(precis::presets::fp32{}), diag_loop::loop_steps, &mon);
    std::printf("float run: loss %.4f, test accuracy %.4f\n%s", run.train_loss, run.test_accuracy,
                mon.table().c_str());
    const std::string header = precis::diagnostics::advise(mon);
    const std::filesystem::path path(argv[1]);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    precis::write_file_atomically(path, header);
    std::printf("wrote %s:\n%s", argv[1], header.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "advise_generate: %s\n", e.what());
    return 1;
  }
}
