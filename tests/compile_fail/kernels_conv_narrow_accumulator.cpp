// conv under a policy that waives the fp32 rule to accumulate in float16.
#include <precis/kernels/conv.hpp>
using narrow = precis::unsafe<precis::policy<precis::float16, precis::float16, precis::float16>,
                              precis::rule::fp32_operation>;
void f(const precis::cpu_context& ctx) {
  precis::host_tensor<precis::float16, 4> x, w, y;
  precis::conv2d<narrow>(ctx, x, w, y);
}
