// The seed of a test executable's random data, shared by the host tests (random.hpp) and
// the device tests (gpu.hpp): PRECIS_TEST_SEED=N where set (replaying a run whose seed was
// printed), else a fresh one from std::random_device. The caller prints it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <random>

namespace precis_test {

/// PRECIS_TEST_SEED's value, or a fresh seed. A value that is not a number ends the program
/// (exit status 2), naming it: a typo must not run with another seed.
inline unsigned long seed_from_environment() {
  const char* given = std::getenv("PRECIS_TEST_SEED");
  if (given == nullptr) return std::random_device{}();
  char* end = nullptr;
  const unsigned long seed = std::strtoul(given, &end, 10);
  if (end == given || *end != '\0') {
    std::fprintf(stderr, "PRECIS_TEST_SEED must be a number, got '%s'\n", given);
    std::exit(2);
  }
  return seed;
}

}  // namespace precis_test
