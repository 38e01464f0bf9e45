// A context plan keyed by a struct with padding: keys are compared byte for byte.
#include <precis/kernels/cuda_context.hpp>
struct key {
  char kind;
  long long size;
};
int f(precis::cuda_context& ctx) {
  return ctx.plan<int>(key{'a', 1}, [] { return 0; });
}
