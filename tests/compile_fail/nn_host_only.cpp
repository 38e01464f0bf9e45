// Layers without device kernels say so at compile time: a linear layer built for
// cuda_context is refused with a precis: message (not an overload error later).
#include <precis/precis.hpp>

namespace fake {
struct device_context {};
}  // namespace fake

template <>
struct precis::nn::context_traits<fake::device_context> {
  template <class T, std::size_t N>
  using tensor = precis::host_tensor<T, N>;
  using ref = fake::device_context&;
};

int main() {
  using namespace precis;
  using model = nn::model_t<float, 2, presets::fp32, decltype(nn::linear(4, 4)), fake::device_context>;
  static_assert(sizeof(model) > 0);
}
