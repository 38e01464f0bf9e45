// The example's ViT with PyTorch's weights: tests/data/vit_torch holds a small ViT trained
// in PyTorch (bench/vit/torch_reference.py export), saved as F32 and BF16 safetensors, and
// its logits on the first Fashion-MNIST test images in float64, float32 and under bf16
// autocast. precis loads the weights through vit::torch_name and must give the same logits:
// in float32 within 1e-4 of the logits' scale of the float64 reference; under bf16_mixed
// about as close to it as PyTorch's bf16 autocast is.
#include <precis/nn/safetensors.hpp>
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "../../examples/vit/fashion_mnist.hpp"
#include "../../examples/vit/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace precis;
namespace st = precis::safetensors;

namespace {

const std::filesystem::path data_dir = PRECIS_VIT_TORCH_DIR;
constexpr std::size_t depth = 2;

/// logits.csv: kind -> [image][class].
std::map<std::string, std::vector<std::vector<double>>> read_logits() {
  std::ifstream in(data_dir / "logits.csv");
  REQUIRE(in);
  std::string line;
  std::getline(in, line);
  std::map<std::string, std::vector<std::vector<double>>> out;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string image, kind, v;
    std::getline(ss, image, ',');
    std::getline(ss, kind, ',');
    std::vector<double> row;
    while (std::getline(ss, v, ',')) row.push_back(std::stod(v));
    REQUIRE(row.size() == 10);
    REQUIRE(std::stoul(image) == out[kind].size());
    out[kind].push_back(row);
  }
  return out;
}

vit::config config_of(const st::file& f) {
  auto n = [&](const char* k) { return std::size_t(std::stoul(f.metadata().at(k))); };
  vit::config c{.image = n("image"), .patch = n("patch"), .channels = n("channels"), .width = n("width"),
                .heads = n("heads"), .classes = n("classes")};
  REQUIRE(n("depth") == depth);
  return c;
}

/// The first `count` test images, normalised as the script did (in double, then float).
host_tensor<float, 4> test_images(const st::file& f, std::size_t count) {
  const double mean = std::stod(f.metadata().at("mean")), sd = std::stod(f.metadata().at("std"));
  const auto set = vit::load_fashion_mnist(vit::fashion_mnist_dir, vit::split::test);
  host_tensor<float, 4> x({count, 1, set.rows, set.cols});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float((double(set.pixels[i]) / 255.0 - mean) / sd);
  return x;
}

template <class P>
std::vector<std::vector<double>> precis_logits(P, const st::file& weights, const host_tensor<float, 4>& x) {
  const auto c = config_of(weights);
  using S = nn::activation_type_t<P>;
  auto model = nn::build<S, 4>(P{}, vit::blueprint<depth>(c), {.seed = 7});
  nn::load_safetensors(model, weights, vit::torch_name);
  host_tensor<S, 4> xs(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) xs.data()[i] = round_to<S>(x.data()[i]);
  const auto& y = model.forward(cpu_context{2}, xs, nn::mode::eval);
  std::vector<std::vector<double>> out(y.shape()[0], std::vector<double>(y.shape()[1]));
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t k = 0; k < out[i].size(); ++k) out[i][k] = double(float(y.data()[i * out[i].size() + k]));
  }
  return out;
}

/// The largest |a - b| over every logit, and the largest |ref|.
double max_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::size_t k = 0; k < a[i].size(); ++k) d = std::max(d, std::abs(a[i][k] - b[i][k]));
  }
  return d;
}
double largest_abs(const std::vector<std::vector<double>>& a) {
  double m = 0;
  for (const auto& r : a) {
    for (double v : r) m = std::max(m, std::abs(v));
  }
  return m;
}

}  // namespace

TEST_CASE("the torch weights name every parameter of the blueprint, and the BF16 file holds them rounded") {
  const auto f32 = st::file::read(data_dir / "vit_f32.safetensors");
  const auto bf16 = st::file::read(data_dir / "vit_bf16.safetensors");
  auto a = nn::build<float, 4>(presets::fp32{}, vit::blueprint<depth>(config_of(f32)), {.seed = 7});
  auto b = a;
  nn::load_safetensors(a, f32, vit::torch_name);  // every tensor used, every shape right
  nn::load_safetensors(b, bf16, vit::torch_name);
  std::size_t n = 0;
  a.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto& expected = f32.floats(f32.at(vit::torch_name(path)));
    REQUIRE(expected.size() == p.size());
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(p.master().data()[i] == expected[i]);
    n += p.size();
  });
  CHECK(n == a.parameter_count());
  // PyTorch rounded the BF16 file; precis's rounding of the F32 values must agree.
  const auto ma = a.masters(), mb = b.masters();
  for (std::size_t t = 0; t < ma.size(); ++t) {
    for (std::size_t i = 0; i < ma[t].size(); ++i) CHECK(mb[t][i] == float(round_to<bfloat16>(ma[t][i])));
  }
  CHECK_THROWS_WITH_AS(vit::torch_name("encoder.0.2.x"), doctest::Contains("no parameter at path"), error);
}

TEST_CASE("precis's logits with PyTorch's weights match PyTorch's") {
  const auto weights = st::file::read(data_dir / "vit_f32.safetensors");
  auto ref = read_logits();
  const auto& f64 = ref.at("float64");
  const auto& f32 = ref.at("float32");
  const auto& autocast = ref.at("bf16_autocast");
  const auto x = test_images(weights, f64.size());
  const double scale = largest_abs(f64);
  REQUIRE(scale > 1.0);  // a trained model's logits, not all near zero

  const auto p32 = precis_logits(presets::fp32{}, weights, x);
  const double e32 = max_diff(p32, f64), t32 = max_diff(f32, f64);
  MESSAGE("float32: precis " << e32 / scale << ", torch " << t32 / scale << " of the logits' scale " << scale);
  CHECK(e32 <= 1e-4 * scale);

  const auto p16 = precis_logits(presets::bf16_mixed{}, weights, x);
  const double e16 = max_diff(p16, f64), t16 = max_diff(autocast, f64);
  MESSAGE("bf16: precis bf16_mixed " << e16 / scale << ", torch bf16 autocast " << t16 / scale);
  // Both round activations to bfloat16 (8 significant bits) between layers; neither may be
  // much further from float64 than the other, and both stay within a few bfloat16 steps.
  CHECK(e16 <= 2.0 * t16);
  CHECK(e16 <= 4 * 0x1p-8 * scale);
  // The predicted classes agree wherever float64's top two logits are apart by more than
  // both errors.
  for (std::size_t i = 0; i < f64.size(); ++i) {
    auto top = [](const std::vector<double>& r) { return std::size_t(std::max_element(r.begin(), r.end()) - r.begin()); };
    std::vector<double> sorted = f64[i];
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 2 * (e16 + t16)) {
      CHECK(top(p16[i]) == top(f64[i]));
      CHECK(top(p32[i]) == top(f64[i]));
    }
  }
}
