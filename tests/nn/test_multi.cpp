// Models with several outputs or inputs: nn::fork, nn::taps, nn::each, nn::top_down,
// nn::add_all, nn::concat_all. Every gradient against central differences in float64; a
// feature-pyramid-shaped model; a trainer step with a loss of two terms over two outputs.
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "gradcheck.hpp"

#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>

using namespace precis;
using precis_test::check_gradients;
using precis_test::f64;
using precis_test::random_tensor;

namespace {

const cpu_context ctx{1};

// A pyramid on feature vectors: three stages, lateral projections, a top-down path whose
// node is a linear map, and the levels concatenated, as an FPN's neck is wired.
auto pyramid() {
  return nn::seq(nn::taps(nn::linear(4, 6), nn::seq(nn::tanh(), nn::linear(6, 6)), nn::seq(nn::tanh(), nn::linear(6, 6))),
                 nn::each(nn::linear(6, 5), nn::linear(6, 5), nn::linear(6, 5)),
                 nn::top_down(nn::seq(nn::sigmoid(), nn::linear(5, 5))),
                 nn::each(nn::linear(5, 3), nn::relu(), nn::tanh()), nn::concat_all(1));
}

// sum over outputs i of sum(w_i * y_i), with its gradients w_i.
template <class Y, class W>
double weighted(const Y& ys, const W& ws) {
  double s = 0;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          const auto& y = *std::get<I>(ys);
          const auto& w = std::get<I>(ws);
          for (std::size_t k = 0; k < y.size(); ++k) s += y.data()[k] * w.data()[k];
        }(),
        ...);
  }(std::make_index_sequence<std::tuple_size_v<Y>>{});
  return s;
}

}  // namespace

TEST_CASE("taps, each, top_down and concat_all: a pyramid's gradients match central differences") {
  auto m = nn::build<double, 2>(f64{}, pyramid(), {.seed = 5});
  CHECK(m.output_shape({3, 4}) == nn::shape_t<2>{3, 3 + 5 + 5});
  check_gradients(m, random_tensor<2>({3, 4}), 1e-6);
}

TEST_CASE("top_down adds the node's output of the level after, from the last level to the first") {
  // With the node the identity and three equal inputs x: p2 = x, p1 = 2x, p0 = 3x.
  auto m = nn::build<double, 2>(f64{}, nn::seq(nn::fork(nn::identity(), nn::identity(), nn::identity()),
                                               nn::top_down(nn::identity()), nn::concat_all(1)));
  auto x = random_tensor<2>({2, 3});
  const auto& y = m.forward(ctx, x);
  for (std::size_t r = 0; r < 2; ++r) {
    for (std::size_t c = 0; c < 3; ++c) {
      CHECK(y(r, c) == doctest::Approx(3 * x(r, c)));
      CHECK(y(r, 3 + c) == doctest::Approx(2 * x(r, c)));
      CHECK(y(r, 6 + c) == doctest::Approx(x(r, c)));
    }
  }
  // dL/dx = 3 + 2 + 1 per element for L = sum(y).
  host_tensor<double, 2> dy(y.shape());
  dy.fill(1.0);
  const auto& dx = m.backward(ctx, dy);
  for (double v : dx) CHECK(v == doctest::Approx(6.0));
}

TEST_CASE("a model with two outputs (nn::fork) and one with two inputs: gradients match central differences") {
  auto m = nn::build<double, 2>(f64{}, nn::seq(nn::linear(4, 5), nn::fork(nn::linear(5, 2), nn::seq(nn::tanh(), nn::linear(5, 3)))),
                                {.seed = 2});
  using out = std::remove_cvref_t<decltype(m.forward(ctx, std::declval<const host_tensor<double, 2>&>()))>;
  static_assert(std::is_same_v<out, std::tuple<const host_tensor<double, 2>*, const host_tensor<double, 2>*>>);
  auto x = random_tensor<2>({3, 4});
  const auto ws = std::tuple{random_tensor<2>({3, 2}), random_tensor<2>({3, 3})};
  m.zero_grad();
  m.forward(ctx, x);
  const auto dx = m.backward(ctx, std::tuple{&std::get<0>(ws), &std::get<1>(ws)});
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x.data()[i];
    x.data()[i] = keep + h;
    const double up = weighted(m.forward(ctx, x), ws);
    x.data()[i] = keep - h;
    const double down = weighted(m.forward(ctx, x), ws);
    x.data()[i] = keep;
    CHECK(dx.data()[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6));
  }

  // Two inputs, projected and added.
  using two = nn::values<nn::sig<double, double, 2>, nn::sig<double, double, 2>>;
  auto j = nn::build<two, 0>(f64{}, nn::seq(nn::each(nn::linear(3, 4), nn::linear(2, 4)), nn::add_all()), {.seed = 3});
  auto a = random_tensor<2>({2, 3});
  auto b = random_tensor<2>({2, 2});
  const auto w = random_tensor<2>({2, 4});
  j.forward(ctx, std::tuple{&a, &b});
  const auto grads = j.backward(ctx, w);
  const host_tensor<double, 2> da = *std::get<0>(grads), db = *std::get<1>(grads);
  auto objective = [&] {
    const auto& y = j.forward(ctx, std::tuple{&a, &b});
    double s = 0;
    for (std::size_t k = 0; k < y.size(); ++k) s += y.data()[k] * w.data()[k];
    return s;
  };
  for (auto* t : {&a, &b}) {
    const auto& d = t == &a ? da : db;
    for (std::size_t i = 0; i < t->size(); ++i) {
      const double keep = t->data()[i];
      t->data()[i] = keep + h;
      const double up = objective();
      t->data()[i] = keep - h;
      const double down = objective();
      t->data()[i] = keep;
      CHECK(d.data()[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6));
    }
  }
}

namespace {

// A loss of two terms over a model's two outputs: cross-entropy on the first, and on the
// second, weighted by 0.5. It reads the model's multi-tensor output and gives the gradient
// of both.
template <class P>
struct two_term_loss {
  using policy_type = P;
  using S = typename P::storage_type;
  using input_type = nn::values<nn::sig<S, S, 2>, nn::sig<S, S, 2>>;
  using input_grad_type = input_type;
  static constexpr std::size_t input_rank = 0;
  using target_tensor = host_tensor<std::int32_t, 1>;

  nn::softmax_cross_entropy<P> first, second;
  float forward(const cpu_context& c, const std::tuple<const host_tensor<S, 2>*, const host_tensor<S, 2>*>& y,
                const target_tensor& t) {
    return first.forward(c, *std::get<0>(y), t) + 0.5f * second.forward(c, *std::get<1>(y), t);
  }
  std::tuple<const host_tensor<S, 2>*, const host_tensor<S, 2>*> backward(const cpu_context& c, double dloss) {
    return {&first.backward(c, dloss), &second.backward(c, 0.5 * dloss)};
  }
};

}  // namespace

TEST_CASE("the trainer steps a model with two outputs on a loss of two terms") {
  using P = presets::bf16_mixed;
  auto m = nn::build<bfloat16, 2>(P{}, nn::seq(nn::linear(8, 16), nn::gelu(), nn::fork(nn::linear(16, 3), nn::linear(16, 3))),
                                  {.seed = 1});
  two_term_loss<P> loss;
  adamw opt(m.masters(), {.lr = 0.05f}, m.decay_mask());
  no_scaling scaler;
  nn::trainer tr(m, loss, opt, scaler);
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{12, 8});
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{12});
  for (std::size_t r = 0; r < 12; ++r) {
    t(r) = std::int32_t(r % 3);
    for (std::size_t k = 0; k < 8; ++k) x(r, k) = bfloat16(k % 3 == r % 3 ? 1.0f : -0.25f);
  }
  const double first = tr.step(ctx, x, t).loss;
  double last = first;
  for (int s = 0; s < 20; ++s) last = tr.step(ctx, x, t).loss;
  CHECK(last < 0.5 * first);
}

TEST_CASE("multi-tensor nodes name their children in paths and check shapes, naming the path") {
  auto m = nn::build<float, 2>(presets::fp32{}, nn::named("neck", pyramid()), {.seed = 1});
  const auto names = m.parameter_names();
  CHECK(names.front() == "neck.0.0.weight");
  CHECK(std::find(names.begin(), names.end(), "neck.2.1.1.weight") != names.end());  // top_down node of level 1
  host_tensor<float, 2> wrong(std::array<std::size_t, 2>{2, 5});
  CHECK_THROWS_WITH_AS(m.forward(ctx, wrong), doctest::Contains("layer neck.0.0 (linear)"), error);
  // Levels whose shapes the node does not map onto each other are refused.
  auto bad = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::fork(nn::linear(4, 3), nn::linear(4, 2)),
                                                          nn::top_down(nn::identity()), nn::concat_all(1)));
  host_tensor<float, 2> x(std::array<std::size_t, 2>{2, 4});
  CHECK_THROWS_WITH_AS(bad.forward(ctx, x), doctest::Contains("level 1 of shape [2, 2] becomes [2, 2], but level 0 has shape [2, 3]"),
                       error);
  const std::string table = nn::describe(m);
  CHECK(table.find("neck.2.0.1") != std::string::npos);
}

TEST_CASE("subtract: a - b of a two-tensor edge, as DBNet's binarization sigmoid(k (P - T)) reads it") {
  // Gradients in double through fork -> subtract -> scale -> sigmoid.
  auto m = nn::build<double, 2>(f64{}, nn::seq(nn::fork(nn::linear(3, 4), nn::seq(nn::tanh(), nn::linear(3, 4))),
                                               nn::subtract(), nn::scale(5.0), nn::sigmoid()),
                                {.seed = 4});
  check_gradients(m, random_tensor<2>({2, 3}));
  // Values: the difference is taken in float and rounded once to the storage type.
  auto h = nn::build<float16, 2>(presets::fp16_mixed{}, nn::seq(nn::fork(nn::identity(), nn::scale(1.0 / 3.0)), nn::subtract()));
  host_tensor<float16, 2> x(std::array<std::size_t, 2>{2, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float16(0.7f * float(i) - 1.1f);
  const auto& y = h.forward(ctx, x);
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float third = float(float16(float(x.data()[i]) * float(1.0 / 3.0)));
    CHECK(y.data()[i].bits() == float16(float(x.data()[i]) - third).bits());
  }
  auto bad = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::fork(nn::linear(3, 4), nn::linear(3, 2)), nn::subtract()));
  host_tensor<float, 2> xf(std::array<std::size_t, 2>{2, 3});
  CHECK_THROWS_WITH_AS(bad.forward(ctx, xf), doctest::Contains("which cannot be subtracted"), error);
}

TEST_CASE("the concatenations' copy plans, run element by element, give the host's joined tensor and slices") {
  // The device runs nn::concat and nn::concat_all as one strided copy per part from these
  // plans; here the plans run through the reference loop against the host layers' results.
  auto m = nn::build<float, 3>(presets::fp32{}, nn::seq(nn::fork(nn::identity(), nn::scale(2.0), nn::scale(-1.0)),
                                                       nn::concat_all(1)));
  host_tensor<float, 3> x(std::array<std::size_t, 3>{2, 3, 4});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(i) + 0.5F;
  const auto& y = m.forward(ctx, x);
  REQUIRE(y.shape() == std::array<std::size_t, 3>{2, 9, 4});
  std::vector<float> joined(y.size(), -7.0F);
  const std::array<float, 3> factor{1.0F, 2.0F, -1.0F};
  std::size_t offset = 0;
  for (std::size_t part = 0; part < 3; ++part) {
    std::vector<float> values(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) values[i] = x.data()[i] * factor[part];
    const auto d = nn::detail::split_at<3>({2, 3, 4}, 1);
    precis::detail::run_copy_plan(nn::detail::concat_part_plan(d, 9, false), values.data(), joined.data() + offset * d[2]);
    // The part's slice of the joined tensor, copied back, is the part.
    std::vector<float> back(x.size(), -7.0F);
    precis::detail::run_copy_plan(nn::detail::concat_part_plan(d, 9, true), y.data() + offset * d[2], back.data());
    CHECK(back == values);
    offset += d[1];
  }
  CHECK(joined == std::vector<float>(y.begin(), y.end()));
}
