// Layers without device kernels say so at compile time: a global average pooling built for
// another context than the CPU's is refused with a precis: message (not an overload error
// later).
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
  using model = nn::model_t<float, 4, presets::fp32, decltype(nn::global_avg_pool()), fake::device_context>;
  static_assert(sizeof(model) > 0);
}
