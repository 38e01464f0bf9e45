// precis::diagnostics: the monitor's value statistics against a direct count, what it reads
// from a model against the model's own passes, observation every N steps, the layer a
// skipped step's first non-finite value came from (forward and backward), and the advice.
#include <precis/diagnostics/diagnostics.hpp>
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "loop_model.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace precis;
namespace diag = precis::diagnostics;

namespace {

const cpu_context ctx{1};
const auto fp32_map = make_policy_map(presets::fp32{});

template <class T>
double amax_of(const T& t) {
  double m = 0.0;
  for (std::size_t i = 0; i < t.size(); ++i) m = std::max(m, std::fabs(double(t.data()[i])));
  return m;
}

const diag::layer_record& find(const diag::monitor& m, const std::string& path) {
  for (const auto& r : m.layers()) {
    if (r.path == path) return r;
  }
  FAIL("no layer " << path);
  return m.layers().front();
}

}  // namespace

TEST_CASE("value_stats counts what each format loses, at any power-of-two scale") {
  std::mt19937_64 g(7);
  std::uniform_real_distribution<double> exponent(-160.0, 40.0);
  std::vector<double> values;
  for (int i = 0; i < 20000; ++i) values.push_back((g() & 1 ? -1.0 : 1.0) * std::exp2(exponent(g)));
  values.push_back(0.0);
  values.push_back(-0.0);
  values.push_back(std::numeric_limits<double>::infinity());
  values.push_back(std::numeric_limits<double>::quiet_NaN());
  diag::value_stats s;
  for (double v : values) s.add(v);
  CHECK(s.values == values.size());
  CHECK(s.zeros == 2);
  CHECK(s.nonfinite == 2);

  // The reference: each format's limits from its own type, compared value by value.
  const auto check_format = [&](diag::format f, double max, double min_normal, double denorm_min) {
    for (double scale : {1.0, 0x1p-12, 0x1p16}) {
      std::size_t over = 0, zero = 0, sub = 0, finite_amax_count = 0;
      for (double v : values) {
        const double a = std::fabs(v) * scale;
        if (!std::isfinite(a) || a == 0.0) continue;
        ++finite_amax_count;
        if (a > max) ++over;
        if (a < denorm_min / 2) ++zero;
        if (a >= denorm_min / 2 && a < min_normal) ++sub;
      }
      const double n = double(values.size());
      CHECK(s.zero_fraction(f, scale) == doctest::Approx(double(zero) / n));
      CHECK(s.subnormal_fraction(f, scale) == doctest::Approx(double(sub) / n));
      if (scale == 1.0) CHECK(s.overflow_fraction(f) == doctest::Approx(double(over) / n));
      CHECK(zero > 0);
      CHECK(finite_amax_count > 0);
    }
  };
  check_format(diag::format::float16, double(float(format_traits<float16>::max())),
               double(float(format_traits<float16>::min_normal())),
               double(float(format_traits<float16>::denorm_min())));
  check_format(diag::format::bfloat16, double(float(format_traits<bfloat16>::max())),
               double(float(format_traits<bfloat16>::min_normal())),
               double(float(format_traits<bfloat16>::denorm_min())));
  check_format(diag::format::float8_e4m3, double(float(format_traits<float8_e4m3>::max())),
               double(float(format_traits<float8_e4m3>::min_normal())),
               double(float(format_traits<float8_e4m3>::denorm_min())));
  check_format(diag::format::float8_e5m2, double(float(format_traits<float8_e5m2>::max())),
               double(float(format_traits<float8_e5m2>::min_normal())),
               double(float(format_traits<float8_e5m2>::denorm_min())));

  // What the conversions do agrees with the counts away from the boundaries: a value below
  // half of float16's smallest subnormal converts to zero, one above its max to infinity.
  CHECK(float(float16(float(0x1p-26))) == 0.0f);
  CHECK(std::isinf(float(float16(70000.0f))));
}

TEST_CASE("the one-pass float scan agrees with adding value by value") {
  std::mt19937_64 g(11);
  std::uniform_real_distribution<double> exponent(-150.0, 128.0);
  std::vector<float> v;
  for (int i = 0; i < 5000; ++i)
    v.push_back(float((g() & 1 ? -1.0 : 1.0) * std::exp2(exponent(g))));
  v.push_back(0.0f);
  v.push_back(std::numeric_limits<float>::denorm_min());
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  for (double scale : {1.0, 65536.0, 0x1p-20, 3.0}) {
    diag::value_stats stored, unscaled, ref_stored, ref_unscaled;
    diag::detail::scan_floats(v.data(), v.size(), scale, stored, &unscaled);
    for (float x : v) {
      ref_stored.add(double(x));
      ref_unscaled.add(double(x) / scale);
    }
    using both = std::pair<const diag::value_stats*, const diag::value_stats*>;
    for (const both& p : {both{&stored, &ref_stored}, both{&unscaled, &ref_unscaled}}) {
      const auto& [got, want] = p;
      CHECK(got->values == want->values);
      CHECK(got->zeros == want->zeros);
      CHECK(got->nonfinite == want->nonfinite);
      CHECK(got->amax == want->amax);
      CHECK(got->overflows == want->overflows);
      for (int e = diag::exponent_histogram::lowest; e <= diag::exponent_histogram::highest;
           e += 3) {
        CHECK(got->exponents.below(e) == want->exponents.below(e));
      }
    }
  }
}

TEST_CASE("the monitor reads each layer's input, output and gradients of the step") {
  diag::monitor mon;
  const auto result = diag_loop::train<decltype(fp32_map), no_scaling>(fp32_map, 1, &mon);
  (void)result;
  std::vector<std::string> paths;
  for (const auto& r : mon.layers()) paths.push_back(r.path);
  CHECK(paths == std::vector<std::string>{"fc1", "act", "boost", "norm", "head"});

  // The reference: the same model (same seed), one forward and backward pass by hand.
  auto model = nn::build<float, 2>(fp32_map, diag_loop::blueprint(), {.seed = 5});
  nn::softmax_cross_entropy<presets::fp32> loss;
  const auto d = diag_loop::make_data<float>(256, 1);
  const auto& y = model.forward(ctx, d.x, nn::mode::train);
  (void)loss.forward(ctx, y, d.labels);
  (void)model.backward(ctx, loss.backward(ctx, 1.0));
  double act_dx = -1.0;  // the input gradient of "act", as the reference computed it
  model.for_each_observed(
      [&](const std::string& path, auto, const auto*, const auto&, const auto&... g) {
        if (path == "act") ((act_dx = amax_of(g)), ...);
      });

  CHECK(find(mon, "fc1").input.amax == amax_of(d.x));
  CHECK(find(mon, "head").output.amax == amax_of(y));
  CHECK(act_dx > 0.0);
  CHECK(find(mon, "act").input_grad.amax == act_dx);
  CHECK(find(mon, "act").input_grad_scaled.amax == act_dx);  // no scaling
  // The trainer leaves out the gradient with respect to the model's input
  // (nn::model::backward_parameters): fc1, which reads it, records none.
  CHECK(find(mon, "fc1").input_grad.values == 0);
  // boost multiplies by 1e5: its output is what the norm reads.
  CHECK(find(mon, "boost").output.amax == find(mon, "norm").input.amax);
  CHECK(find(mon, "boost").output.amax > 65504.0);
  CHECK(find(mon, "boost").output.overflow_fraction(diag::format::float16) > 0.0);
  CHECK(find(mon, "boost").output.overflow_fraction(diag::format::bfloat16) == 0.0);
  CHECK(find(mon, "fc1").param_grad.amax > 0.0);
  CHECK(find(mon, "fc1").storage == "float");
  CHECK(find(mon, "norm").op_name == "layer_norm");
  CHECK_FALSE(mon.first_nonfinite().has_value());
  CHECK(mon.series().size() == 1);

  const std::string table = mon.table();
  CHECK(table.find("boost") != std::string::npos);
  const std::string csv = mon.csv();
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);  // header and five layers
  // fc1's input-gradient fields are empty (none was computed), its others filled: the row
  // "fc1,<tag>,linear,float,float,1,<out amax>,,<param grad amax>,0,,...".
  const std::string fc1 = csv.substr(csv.find("\nfc1,") + 1);
  std::vector<std::string> fields;
  for (std::size_t b = 0, e = 0; e != std::string::npos && fields.size() < 11; b = e + 1) {
    e = fc1.find(',', b);
    fields.push_back(fc1.substr(b, e == std::string::npos ? e : e - b));
  }
  REQUIRE(fields.size() == 11);
  CHECK(fields[7].empty());   // grad_amax
  CHECK(!fields[8].empty());  // param_grad_amax
  CHECK(fields[10].empty());  // grad_nonfinite
  // The series row: step, scale, five output amaxes, then fc1's input-gradient amax, empty.
  const std::string series = mon.series_csv();
  const std::string row = series.substr(series.find('\n') + 1);
  std::size_t at = 0;
  for (std::size_t commas = 0; commas < 7 && at < row.size(); ++at) commas += row[at] == ',';
  REQUIRE(at < row.size());
  CHECK(row[at] == ',');
  CHECK(mon.gnuplot_script("series.csv", "ranges.png").find("float16 max") != std::string::npos);
}

TEST_CASE("every N steps: only the due steps are observed") {
  diag::monitor mon({.every = 3});
  (void)diag_loop::train<decltype(fp32_map), no_scaling>(fp32_map, 7, &mon);
  REQUIRE(mon.series().size() == 3);
  CHECK(mon.series()[0].step == 0);
  CHECK(mon.series()[1].step == 3);
  CHECK(mon.series()[2].step == 6);
  CHECK(find(mon, "fc1").observations == 3);
  CHECK_THROWS_AS(diag::monitor({.every = 0}), precis::error);
}

TEST_CASE("a skipped step names the layer whose output overflowed first") {
  // Everything in float16: boost's 1e5 overflows float16, so every step is skipped.
  const auto fp16_map = make_policy_map(presets::fp16_mixed{});
  diag::monitor mon({.every = 1000});
  const auto o = diag_loop::train<decltype(fp16_map), dynamic_scaler>(fp16_map, 2, &mon);
  CHECK(o.skipped == 2);
  REQUIRE(mon.skipped_steps().size() == 2);
  CHECK(mon.skipped_steps()[0].layer == "boost");
  CHECK(mon.skipped_steps()[0].pass == diag::pass::forward);
  CHECK(mon.skipped_steps()[1].step == 1);
  REQUIRE(mon.first_nonfinite().has_value());
  CHECK(mon.first_nonfinite()->message() ==
        "step 0: first non-finite value in boost (forward output)");
}

TEST_CASE("a skipped step names the layer whose gradient overflowed first") {
  // No boost, float16, and a loss scale of 2^40: the loss's gradient overflows, so the last
  // layer is the first whose input gradient is not finite.
  auto model =
      nn::build<float16, 2>(presets::fp16_mixed{},
                            nn::seq(nn::linear<diag_loop::fc1>(16, 32), nn::gelu<diag_loop::act>(),
                                    nn::linear<diag_loop::head>(32, 4)),
                            {.seed = 1});
  nn::softmax_cross_entropy<presets::fp16_mixed> loss;
  sgd opt(model.masters(), {.lr = 0.1});
  static_scaler scaler(0x1p40f);
  nn::trainer tr(model, loss, opt, scaler);
  const auto d = diag_loop::make_data<float16>(64, 3);
  diag::monitor mon({.every = 1000});
  const auto r = tr.step(ctx, d.x, d.labels, mon);
  CHECK(r.skipped);
  REQUIRE(mon.skipped_steps().size() == 1);
  CHECK(mon.skipped_steps()[0].layer == "head");
  CHECK(mon.skipped_steps()[0].pass == diag::pass::backward);
}

TEST_CASE("advice: the boosted layer and its reader to bfloat16, the rest float16") {
  diag::monitor mon({.every = 5});
  (void)diag_loop::train<decltype(fp32_map), no_scaling>(fp32_map, 20, &mon);
  const auto advice = diag::advise_layers(mon);
  REQUIRE(advice.size() == 5);
  CHECK(advice[0].pick == diag::choice::float16);   // fc1
  CHECK(advice[1].pick == diag::choice::float16);   // act
  CHECK(advice[2].pick == diag::choice::bfloat16);  // boost: output past 65504
  CHECK(advice[3].pick == diag::choice::bfloat16);  // norm: reads boost's output
  CHECK(advice[4].pick == diag::choice::float16);   // head
  CHECK(advice[2].reason.find("> float16 max 65504 -> bfloat16") != std::string::npos);
  CHECK(advice[3].reason.find("input amax") != std::string::npos);

  const std::string h = diag::advise(mon);
  CHECK(h.find("precis::presets::fp16_mixed{},  // default: float16") != std::string::npos);
  CHECK(h.find("precis::for_layer<::diag_loop::boost>(precis::presets::bf16_mixed{})") !=
        std::string::npos);
  // layer_norm computes in float (rule c): its override keeps float compute.
  CHECK(h.find("precis::for_layer<::diag_loop::norm>(precis::policy<precis::bfloat16, float, "
               "float, float>{})") != std::string::npos);
  CHECK(h.find("struct precis::measured_max_abs<::diag_loop::boost>") != std::string::npos);
  CHECK(h.find("for_layer<::diag_loop::fc1>") == std::string::npos);

  // A stricter headroom moves nothing to float16 that did not fit; a huge one moves all.
  const auto all_bf16 = diag::advise_layers(mon, {.headroom = 1e30});
  for (const auto& a : all_bf16) CHECK(a.pick != diag::choice::float16);
  CHECK_THROWS_AS(diag::advise_layers(mon, {.headroom = 0.5}), precis::error);
  CHECK_THROWS_AS(diag::advise(diag::monitor{}), precis::error);
}

namespace {
struct hidden : precis::layer<precis::op::matmul> {};
}  // namespace

TEST_CASE("advise refuses tags the generated header could not name") {
  auto model =
      nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear<hidden>(16, 4)), {.seed = 1});
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters(), {.lr = 0.1});
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  const auto d = diag_loop::make_data<float>(16, 3);
  diag::monitor mon;
  (void)tr.step(ctx, d.x, d.labels, mon);
  CHECK_THROWS_WITH_AS(diag::advise(mon), doctest::Contains("cannot be named"), precis::error);
}
