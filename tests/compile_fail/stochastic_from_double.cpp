// Stochastic rounding of a double: refused, not rounded to float first (which would round
// twice).
#include <precis/numeric/numeric.hpp>
auto x = precis::stochastic_round<precis::float16>(1.0, 7U);
