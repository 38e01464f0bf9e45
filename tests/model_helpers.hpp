// Helpers for tests of nn models.
#pragma once

#include <vector>

namespace precis_test {

/// Every float master weight of a model, in the order of its masters().
template <class Model>
std::vector<float> masters_of(Model& m) {
  std::vector<float> out;
  for (auto s : m.masters()) out.insert(out.end(), s.begin(), s.end());
  return out;
}

}  // namespace precis_test
