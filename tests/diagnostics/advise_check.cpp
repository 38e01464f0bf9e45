// The advisor's closed loop, second half: built from the header advise_generate wrote
// (advised_map.hpp), it trains diag_loop's model under the advised map and in float, and
// requires the advised run to match the float run's test accuracy within 2 points, with
// the boosted layer (activations past 65504) moved off float16 by the advice.
#include "loop_model.hpp"

#include "advised_map.hpp"

#include <cstdio>
#include <exception>
#include <type_traits>

int main() {
  try {
    using advised = std::remove_cvref_t<decltype(advised_map)>;
    using boost_storage = precis::policy_for_t<diag_loop::boost, advised>::storage_type;
    using fc1_storage = precis::policy_for_t<diag_loop::fc1, advised>::storage_type;
    std::printf("advised: boost stores %s, fc1 stores %s\n",
                std::string(precis::type_name_v<boost_storage>).c_str(),
                std::string(precis::type_name_v<fc1_storage>).c_str());
    const auto reference =
        diag_loop::train<decltype(precis::make_policy_map(precis::presets::fp32{})),
                         precis::no_scaling>(precis::make_policy_map(precis::presets::fp32{}),
                                             diag_loop::loop_steps);
    const auto run =
        diag_loop::train<advised, precis::dynamic_scaler>(advised_map, diag_loop::loop_steps);
    std::printf(
        "float:   loss %.4f, test accuracy %.4f\nadvised: loss %.4f, test accuracy %.4f, %d "
        "skipped steps\n",
        reference.train_loss, reference.test_accuracy, run.train_loss, run.test_accuracy,
        run.skipped);
    bool ok = true;
    if (std::is_same_v<boost_storage, precis::float16>) {
      std::puts("FAIL: the boosted layer (activations past 65504) was advised float16");
      ok = false;
    }
    if (!std::is_same_v<fc1_storage, precis::float16>) {
      std::puts("FAIL: fc1 (activations of a few units) was not advised float16");
      ok = false;
    }
    if (!(run.test_accuracy >= reference.test_accuracy - 0.02)) {
      std::puts("FAIL: the advised map's test accuracy is more than 2 points below float's");
      ok = false;
    }
    if (!(reference.test_accuracy >= 0.8)) {
      std::puts("FAIL: the float run did not learn the blobs (accuracy below 0.8)");
      ok = false;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "advise_check: %s\n", e.what());
    return 1;
  }
}
