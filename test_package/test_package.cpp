#include <precis/precis.hpp>

#include <cstdio>

int main() {
  precis::bfloat16 x(1.5f);
  std::printf("precis %d: bfloat16(1.5) = %g\n", PRECIS_VERSION, static_cast<double>(x));
  return static_cast<float>(x) == 1.5f ? 0 : 1;
}
