// nn layers on the device against the same layers on the host, built by nn::build from one
// blueprint with the same masters: one forward and backward pass on the same data, the
// outputs, input gradients and parameter gradients within the types' bounds. Exits 77
// (skipped) where no GPU is present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "nn_compare.hpp"

#include <string>

namespace {

using namespace precis_test;
using namespace precis;

struct fc1 : layer<op::matmul> {
  static constexpr std::string_view name = "fc1";
};
struct fc2 : layer<op::matmul> {
  static constexpr std::string_view name = "fc2";
};

// Rows of several slabs of the column sum (64 rows each), and a last slab cut short.
auto mlp() { return nn::seq(nn::linear<fc1>(24, 40), nn::relu(), nn::linear<fc2>(40, 10, nn::no_bias)); }

template <class P>
void check_linear(cuda_context& ctx, const std::string& tag) {
  compare_models<P, 2>(ctx, tag + " mlp", mlp(), {150, 24}, {150, 10});
  // Rank 3: the leading axes are rows of one product.
  compare_models<P, 3>(ctx, tag + " linear rank 3", nn::linear<fc1>(24, 40), {3, 70, 24}, {3, 70, 40});
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_linear<presets::fp32>(ctx, "fp32");
  check_linear<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_linear<presets::fp16_mixed>(ctx, "fp16_mixed");
  // A batch of the wrong width is refused, naming the layer, before any launch.
  {
    auto model = nn::build<bfloat16, 2, cuda_context>(presets::bf16_mixed{}, mlp());
    const auto x = to_device(random_tensor<bfloat16, 2>({4, 23}));
    expect_error("linear: wrong width", [&] { (void)model.forward(ctx, x); }, "fc1");
  }
  return finish();
}
