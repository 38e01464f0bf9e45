// Each branch of nn::fork gives one tensor: a branch that is itself a fork (two tensors)
// does not compile; flatten the fork instead.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{},
                                   nn::fork(nn::fork(nn::relu(), nn::tanh()), nn::sigmoid()));
  (void)model;
}
