// What each number format does to a value: the stored value, its relative error, and how
// each overflow mode treats values beyond the format's range.
#include <precis/precis.hpp>

#include <cmath>
#include <cstdio>
#include <limits>

namespace {

template <class T>
void show(const char* name, double x) {
  const T nearest(x);  // explicit: rounds once to nearest-even, overflow -> inf (NaN for e4m3)
  const T saturated = precis::saturate_cast<T>(x);
  const double stored = float(nearest);
  char error[32];
  if (std::isfinite(stored)) {
    std::snprintf(error, sizeof error, "%.2e", std::fabs(stored - x) / std::fabs(x));
  } else {
    std::snprintf(error, sizeof error, "overflow");
  }
  std::printf("  %-12s %-14.8g rel.err %-10s saturating: %-14.8g bits 0x%0*x\n", name, stored,
              error, double(float(saturated)), int(2 * sizeof(T)), unsigned(nearest.bits()));
}

template <class T>
void limits_row(const char* name) {
  using L = std::numeric_limits<T>;
  std::printf("  %-12s max %-12.6g min normal %-12.6g min subnormal %-12.6g epsilon %-10.6g\n",
              name, double(float(L::max())), double(float(L::min())),
              double(float(L::denorm_min())), double(float(L::epsilon())));
}

}  // namespace

int main() {
  std::printf("precis %d.%d.%d number formats\n\n", PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR,
              PRECIS_VERSION_PATCH);
  limits_row<precis::float16>("float16");
  limits_row<precis::bfloat16>("bfloat16");
  limits_row<precis::float8_e4m3>("float8_e4m3");
  limits_row<precis::float8_e5m2>("float8_e5m2");

  const double values[] = {0.1, 1.0 / 3.0, 3.14159265358979, 1000.7, 500.0, 70000.0, 1e-6, 1e-9};
  for (double x : values) {
    std::printf("\n%.15g\n", x);
    show<precis::float16>("float16", x);
    show<precis::bfloat16>("bfloat16", x);
    show<precis::float8_e4m3>("float8_e4m3", x);
    show<precis::float8_e5m2>("float8_e5m2", x);
  }

  // Rounding a double once matters: 1 + 2^-11 + 2^-40 is just above a float16 tie, but
  // rounding it to float first lands exactly on the tie, which then goes to even (1.0).
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  std::printf("\n1 + 2^-11 + 2^-40 -> float16 directly: %.10g, through float: %.10g\n",
              double(float(precis::float16(x))),
              double(float(precis::float16(static_cast<float>(x)))));
  return 0;
}
