// A layer written outside the library that picks its own policy instead of the one the map
// gives its tag: nn::build refuses it with a precis: message (the map decides every
// layer's precision).
#include <precis/precis.hpp>

#include <cstddef>
#include <string_view>

namespace user {

using namespace precis;

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class square_layer;

template <Layer Tag>
struct square_spec {
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = square_layer<Tag, presets::fp32, R, Ctx>;  // not the map's
};

struct square_tag : nn::tags::positional_tag<op::elementwise> {};

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class square_layer : public nn::layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using S = typename nn::layer_base<Tag, P, op::elementwise, R, R, Ctx>::input_type;
  using tensor = nn::tensor_t<Ctx, S, R>;

 public:
  static constexpr std::string_view kind = "square";
  explicit square_layer(const square_spec<Tag>&) {}
  nn::shape_t<R> output_shape(const nn::shape_t<R>& in, std::string_view) const { return in; }
  const tensor& forward(nn::context_ref_t<Ctx> ctx, const tensor& x, nn::mode = nn::mode::train) {
    nn::ensure(y_, nn::shape_of<R>(x));
    precis::mul<P>(ctx, x, x, y_);
    return y_;
  }
  const tensor& backward(nn::context_ref_t<Ctx> ctx, const tensor& dy) {
    nn::ensure(dx_, nn::shape_of<R>(dy));
    precis::mul<P>(ctx, dy, dy, dx_);  // not the derivative: only compilation matters here
    return dx_;
  }
  std::string shape() const { return "-"; }
  std::size_t own_bytes() const { return nn::bytes_of(y_); }

 private:
  tensor y_, dx_;
};

}  // namespace user

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 2>(presets::bf16_mixed{}, nn::seq(nn::linear(4, 4), user::square_spec<user::square_tag>{}));
  (void)model;
}
