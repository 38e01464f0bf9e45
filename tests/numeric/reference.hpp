// An exact reference for rounding to the narrow formats, written from the formats'
// definitions and independent of precis's encoder: every finite value of the format is
// listed in double (exact), and a double input is placed between two neighbours by
// comparing it with their midpoint (exact in double, since the formats have few bits).
#pragma once

#include <precis/numeric/format_traits.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace precis_test {

struct format_definition {
  int exponent_bits;
  int mantissa_bits;
  bool has_infinity;
  std::uint32_t max_bits;  // largest finite magnitude pattern
};

template <class T>
format_definition definition_of() {
  using F = precis::format_traits<T>;
  return {F::exponent_bits, F::mantissa_bits, F::has_infinity, F::max_bits};
}

/// Value of a non-negative finite pattern, from the definition of a binary format.
inline double value_of(const format_definition& d, std::uint32_t magnitude_bits) {
  const int bias = (1 << (d.exponent_bits - 1)) - 1;
  const std::uint32_t e = magnitude_bits >> d.mantissa_bits;
  const std::uint32_t f = magnitude_bits & ((1U << d.mantissa_bits) - 1U);
  if (e == 0) return std::ldexp(double(f), 1 - bias - d.mantissa_bits);
  return std::ldexp(double((1U << d.mantissa_bits) + f), int(e) - bias - d.mantissa_bits);
}

enum class ref_rounding { nearest_even, toward_zero };
enum class ref_overflow { infinity, saturate };

class reference_rounder {
 public:
  explicit reference_rounder(format_definition d) : d_(d) {
    for (std::uint32_t b = 0; b <= d.max_bits; ++b) values_.push_back(value_of(d, b));
    // One step beyond max: the value the next pattern would have, used only to place the
    // overflow threshold (max + half an ulp).
    values_.push_back(value_of(d, d.max_bits) + (value_of(d, d.max_bits) -
                                                 value_of(d, d.max_bits - 1)));
  }

  std::uint32_t sign_bit() const { return 1U << (d_.exponent_bits + d_.mantissa_bits); }
  std::uint32_t nan_bits() const { return sign_bit() - 1U; }
  std::uint32_t inf_bits() const {
    return d_.has_infinity ? (((1U << d_.exponent_bits) - 1U) << d_.mantissa_bits) : nan_bits();
  }
  const std::vector<double>& values() const { return values_; }  // includes the one beyond max

  /// Correctly rounded pattern of x under the given modes (NaN -> canonical NaN).
  std::uint32_t round(double x, ref_rounding r, ref_overflow o) const {
    if (std::isnan(x)) return nan_bits();
    const std::uint32_t sign = std::signbit(x) ? sign_bit() : 0U;
    const double a = std::fabs(x);
    if (std::isinf(a)) return sign | (o == ref_overflow::saturate ? d_.max_bits : inf_bits());
    // Largest listed value <= a.
    auto it = std::upper_bound(values_.begin(), values_.end(), a);
    std::uint32_t k = std::uint32_t(it - values_.begin()) - 1U;
    std::uint32_t result;
    if (values_[k] == a || r == ref_rounding::toward_zero) {
      result = k;
    } else if (k + 1 >= values_.size()) {
      result = k + 1;  // beyond the extra value: certainly overflow
    } else {
      const double mid = (values_[k] + values_[k + 1]) / 2;  // exact
      if (a < mid) result = k;
      else if (a > mid) result = k + 1;
      else result = (k % 2 == 0) ? k : k + 1;
    }
    if (result > d_.max_bits) {
      const bool to_max = o == ref_overflow::saturate || r == ref_rounding::toward_zero;
      return sign | (to_max ? d_.max_bits : inf_bits());
    }
    return sign | result;
  }

 private:
  format_definition d_;
  std::vector<double> values_;
};

}  // namespace precis_test
