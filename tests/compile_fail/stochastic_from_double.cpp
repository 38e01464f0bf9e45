// Stochastic rounding of a double.
#include <precis/numeric/numeric.hpp>
auto x = precis::detail::encode<precis::detail::float16_format, precis::rounding::stochastic,
                                precis::overflow::infinity>(1.0, 7U);
