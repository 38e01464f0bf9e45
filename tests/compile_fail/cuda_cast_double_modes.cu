// A device cast from double to float with saturation: the device narrows double to float
// only to nearest-even with IEEE overflow.
#include <precis/kernels/cuda/cast.hpp>
void f(precis::cuda_context& ctx) {
  precis::device_tensor<double, 1> a;
  precis::device_tensor<float, 1> b;
  precis::cast<precis::rounding::nearest_even, precis::overflow::saturate>(ctx, a, b);
}
