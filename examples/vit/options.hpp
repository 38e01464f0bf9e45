// The options example_vit (the CPU run) and example_vit_cuda (the GPU run) share: their
// fields, their defaults, how the command line spells them and what --check changes. Each
// program adds its own (threads and MPI on the CPU, --graph on the GPU).
#pragma once

#include "../common.hpp"
#include "fashion_mnist.hpp"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

namespace vit {

/// The recipe and the inputs and outputs of a run.
struct run_options {
  std::size_t epochs = 10;
  std::size_t batch = 128;
  std::size_t train_size = 0;  // 0: all 60,000
  std::size_t test_size = 0;   // 0: all 10,000
  std::size_t seed = 0;
  double lr = 2e-3;
  double weight_decay = 0.05;
  bool check = false;
  std::set<std::string> policies;  // empty: all
  std::filesystem::path data = fashion_mnist_dir;
  std::filesystem::path out;

  /// --check's configuration: one epoch on 4,096 training and 1,000 test images, unless
  /// --train or --test say otherwise.
  void apply_check() {
    if (!check) return;
    epochs = 1;
    train_size = train_size != 0 ? train_size : 4096;
    test_size = test_size != 0 ? test_size : 1000;
  }
};

/// Reads argv[i] (and the value after it, moving i past it) into `o` where it is one of the
/// shared options: --epochs, --batch, --train, --test, --seed, --lr, --policy, --data, --out,
/// --check. Returns std::nullopt where argv[i] is none of them, else whether it was well
/// formed: a count of at least its minimum, a positive finite learning rate, policies among
/// `known` (an unknown one is named on stderr after `program`).
inline std::optional<bool> read_shared_option(int argc, char** argv, int& i, run_options& o,
                                              const std::set<std::string>& known, const char* program) {
  const std::string_view a = argv[i];
  const bool valued = i + 1 < argc;
  const auto count = [&](long long min, std::size_t& out) { return examples::next_count(argc, argv, i, min, out); };
  if (a == "--epochs") return count(1, o.epochs);
  if (a == "--batch") return count(1, o.batch);
  if (a == "--train") return count(1, o.train_size);
  if (a == "--test") return count(1, o.test_size);
  if (a == "--seed") return count(0, o.seed);
  if (a == "--check") {
    o.check = true;
    return true;
  }
  if (a != "--lr" && a != "--policy" && a != "--data" && a != "--out") return std::nullopt;
  if (!valued) return false;
  const char* value = argv[++i];
  if (a == "--lr") {
    char* end = nullptr;
    o.lr = std::strtod(value, &end);
    return end != value && *end == '\0' && o.lr > 0 && std::isfinite(o.lr);
  }
  if (a == "--data") {
    o.data = value;
    return true;
  }
  if (a == "--out") {
    o.out = value;
    return true;
  }
  bool ok = true;
  std::stringstream list(value);
  for (std::string name; std::getline(list, name, ',');) {
    if (!known.contains(name)) {
      std::fprintf(stderr, "%s: unknown policy '%s'\n", program, name.c_str());
      ok = false;
    }
    o.policies.insert(name);
  }
  return ok;
}

}  // namespace vit
