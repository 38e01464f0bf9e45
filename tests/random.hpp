// One random generator per test executable, seeded afresh each run; the seed is printed
// so that a failure can be replayed: PRECIS_TEST_SEED=<seed> in the environment sets it.
#pragma once

#include <doctest/doctest.h>

#include "seed.hpp"

#include <random>
#include <string>

namespace precis_test {

inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    const auto seed = std::random_device::result_type(seed_from_environment());
    MESSAGE("random seed " << seed);
    return std::mt19937_64(seed);
  }();
  return g;
}

}  // namespace precis_test
