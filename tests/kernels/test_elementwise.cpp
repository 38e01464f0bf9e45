// Elementwise kernels against float64 references on the same rounded inputs; their
// gradients against the analytic float64 gradients, which are checked against central
// differences. Bounds: kernel_checks.hpp.
#include <precis/kernels/elementwise.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <string>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::host_tensor;

// float64 references.
double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); }
double gelu_erf_grad(double x) {
  return 0.5 * (1 + std::erf(x / std::numbers::sqrt2)) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
}
const double k = std::sqrt(2 / std::numbers::pi);
double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad(double x) {
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Each unary op: the kernel pair and the float64 function and derivative.
struct relu_op {
  static constexpr const char* name = "relu";
  static double f(double x) { return x > 0 ? x : 0; }
  static double df(double x) { return x > 0 ? 1 : 0; }
  template <class P, class X, class Y, std::size_t N>
  static void fwd(const cpu_context& c, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::relu<P>(c, x, y);
  }
  template <class P, class G, class X, class D, std::size_t N>
  static void bwd(const cpu_context& c, const host_tensor<G, N>& g, const host_tensor<X, N>& x,
                  host_tensor<D, N>& d) {
    precis::relu_backward<P>(c, g, x, d);
  }
};
struct gelu_op {
  static constexpr const char* name = "gelu (erf)";
  static double f(double x) { return gelu_erf(x); }
  static double df(double x) { return gelu_erf_grad(x); }
  template <class P, class X, class Y, std::size_t N>
  static void fwd(const cpu_context& c, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::gelu<P>(c, x, y);
  }
  template <class P, class G, class X, class D, std::size_t N>
  static void bwd(const cpu_context& c, const host_tensor<G, N>& g, const host_tensor<X, N>& x,
                  host_tensor<D, N>& d) {
    precis::gelu_backward<P>(c, g, x, d);
  }
};
struct gelu_tanh_op {
  static constexpr const char* name = "gelu (tanh)";
  static double f(double x) { return gelu_tanh(x); }
  static double df(double x) { return gelu_tanh_grad(x); }
  template <class P, class X, class Y, std::size_t N>
  static void fwd(const cpu_context& c, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::gelu<P>(c, x, y, precis::gelu_approximation::tanh);
  }
  template <class P, class G, class X, class D, std::size_t N>
  static void bwd(const cpu_context& c, const host_tensor<G, N>& g, const host_tensor<X, N>& x,
                  host_tensor<D, N>& d) {
    precis::gelu_backward<P>(c, g, x, d, precis::gelu_approximation::tanh);
  }
};
struct sigmoid_op {
  static constexpr const char* name = "sigmoid";
  static double f(double x) { return sigmoid(x); }
  static double df(double x) { return sigmoid(x) * (1 - sigmoid(x)); }
  template <class P, class X, class Y, std::size_t N>
  static void fwd(const cpu_context& c, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::sigmoid<P>(c, x, y);
  }
  template <class P, class G, class X, class D, std::size_t N>
  static void bwd(const cpu_context& c, const host_tensor<G, N>& g, const host_tensor<X, N>& x,
                  host_tensor<D, N>& d) {
    precis::sigmoid_backward<P>(c, g, x, d);
  }
};
struct tanh_op {
  static constexpr const char* name = "tanh";
  static double f(double x) { return std::tanh(x); }
  static double df(double x) { return 1 - std::tanh(x) * std::tanh(x); }
  template <class P, class X, class Y, std::size_t N>
  static void fwd(const cpu_context& c, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::tanh<P>(c, x, y);
  }
  template <class P, class G, class X, class D, std::size_t N>
  static void bwd(const cpu_context& c, const host_tensor<G, N>& g, const host_tensor<X, N>& x,
                  host_tensor<D, N>& d) {
    precis::tanh_backward<P>(c, g, x, d);
  }
};

template <class Op, class C>
void check_unary() {
  using T = typename C::T;
  using P = typename C::P;
  INFO(std::string(Op::name));
  const cpu_context ctx{1};
  const auto x = random_tensor<T, 2>({7, 33}, -4, 4);
  const auto dy = random_tensor<T, 2>({7, 33});
  const auto xd = to_double(x), dyd = to_double(dy);
  auto ref = xd, dref = xd;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ref.data()[i] = Op::f(xd.data()[i]);
    dref.data()[i] = dyd.data()[i] * Op::df(xd.data()[i]);
  }
  auto y = poisoned<T, 2>(x.shape());
  Op::template fwd<P>(ctx, x, y);
  CHECK(rel_error(y, ref) < bound<T>());
  auto dx = poisoned<T, 2>(x.shape());
  Op::template bwd<P>(ctx, dy, x, dx);
  CHECK(rel_error(dx, dref) < bound<T>());
  // float outputs from narrow inputs: only the float math remains.
  auto yf = poisoned<float, 2>(x.shape());
  Op::template fwd<P>(ctx, x, yf);
  CHECK(rel_error(yf, ref) < bound<float>());
}

template <class Op>
void check_unary_gradient() {
  INFO(std::string(Op::name));
  auto x = to_double(random_tensor<double, 1>({40}, -4, 4));
  for (auto& v : x) {
    if (std::abs(v) < 1e-3) v = 0.5;  // away from relu's kink
  }
  const auto w = random_tensor<double, 1>({40});
  auto analytic = x;
  for (std::size_t i = 0; i < x.size(); ++i) analytic(i) = w(i) * Op::df(x(i));
  const auto fd = fd_gradient(
      [&](const host_tensor<double, 1>& v) {
        double s = 0;
        for (std::size_t i = 0; i < v.size(); ++i) s += w(i) * Op::f(v(i));
        return s;
      },
      x);
  CHECK(rel_error(fd, analytic) < fd_bound);
}

}  // namespace

TEST_CASE_TEMPLATE("unary elementwise kernels match float64", C, fp32_config, bf16_config, fp16_config) {
  check_unary<relu_op, C>();
  check_unary<gelu_op, C>();
  check_unary<gelu_tanh_op, C>();
  check_unary<sigmoid_op, C>();
  check_unary<tanh_op, C>();
}

TEST_CASE("unary float64 gradients match central differences") {
  check_unary_gradient<relu_op>();
  check_unary_gradient<gelu_op>();
  check_unary_gradient<gelu_tanh_op>();
  check_unary_gradient<sigmoid_op>();
  check_unary_gradient<tanh_op>();
}

TEST_CASE("the two gelu variants differ by less than 1e-3 and are not the same") {
  const cpu_context ctx{1};
  auto x = host_tensor<float, 1>::from_shape({201});
  for (std::size_t i = 0; i < x.size(); ++i) x(i) = -5.0f + 0.05f * float(i);
  auto a = poisoned<float, 1>(x.shape()), b = poisoned<float, 1>(x.shape());
  precis::gelu<precis::presets::fp32>(ctx, x, a);
  precis::gelu<precis::presets::fp32>(ctx, x, b, precis::gelu_approximation::tanh);
  double diff = 0;
  for (std::size_t i = 0; i < x.size(); ++i) diff = std::max(diff, double(std::abs(a(i) - b(i))));
  CHECK(diff < 1e-3);
  CHECK(diff > 1e-5);
}

TEST_CASE("sigmoid and tanh saturate without NaN") {
  const cpu_context ctx{1};
  host_tensor<float, 1> x = {-1000.0f, -90.0f, 90.0f, 1000.0f};
  auto y = poisoned<float, 1>(x.shape());
  precis::sigmoid<precis::presets::fp32>(ctx, x, y);
  CHECK(y(0) == 0.0f);
  CHECK(y(3) == 1.0f);
  precis::tanh<precis::presets::fp32>(ctx, x, y);
  CHECK(y(0) == -1.0f);
  CHECK(y(3) == 1.0f);
  precis::sigmoid_backward<precis::presets::fp32>(ctx, x, x, y);
  for (float v : y) CHECK(std::isfinite(v));
}

TEST_CASE_TEMPLATE("add and mul match float64, same shape and broadcast", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto a = random_tensor<T, 3>({4, 5, 6});
  const auto b = random_tensor<T, 3>({4, 5, 6});
  const auto bias = random_tensor<T, 1>({6});
  const auto ad = to_double(a), bd = to_double(b);
  const auto biasd = to_double(bias);
  auto sum_ref = ad, prod_ref = ad, bsum_ref = ad, bprod_ref = ad;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum_ref.data()[i] = ad.data()[i] + bd.data()[i];
    prod_ref.data()[i] = ad.data()[i] * bd.data()[i];
    bsum_ref.data()[i] = ad.data()[i] + biasd.data()[i % 6];
    bprod_ref.data()[i] = ad.data()[i] * biasd.data()[i % 6];
  }
  auto out = poisoned<T, 3>(a.shape());
  precis::add<P>(ctx, a, b, out);
  CHECK(rel_error(out, sum_ref) < bound<T>());
  poison(out);
  precis::mul<P>(ctx, a, b, out);
  CHECK(rel_error(out, prod_ref) < bound<T>());
  poison(out);
  precis::add<P>(ctx, a, bias, out);
  CHECK(rel_error(out, bsum_ref) < bound<T>());
  poison(out);
  precis::mul<P>(ctx, a, bias, out);
  CHECK(rel_error(out, bprod_ref) < bound<T>());
}

TEST_CASE("mixed element types promote: bfloat16 + float16 computes in float") {
  const cpu_context ctx{1};
  const auto a = random_tensor<bfloat16, 2>({3, 50});
  const auto b = random_tensor<float16, 2>({3, 50});
  const auto ad = to_double(a), bd = to_double(b);
  auto ref = ad;
  for (std::size_t i = 0; i < a.size(); ++i) ref.data()[i] = ad.data()[i] * bd.data()[i];
  auto out = poisoned<float, 2>(a.shape());
  precis::mul<precis::presets::bf16_mixed>(ctx, a, b, out);
  // bfloat16 x float16 significands (8 + 11 bits) fit in float's 24: exact.
  CHECK(rel_error(out, ref) == 0.0);
  auto d = poisoned<double, 2>(a.shape());
  const auto ad64 = to_double(a);
  precis::add<precis::presets::fp32>(ctx, ad64, b, d);  // double input: computed in double
  for (std::size_t i = 0; i < a.size(); ++i) ref.data()[i] = ad.data()[i] + bd.data()[i];
  CHECK(rel_error(d, ref) == 0.0);
}

TEST_CASE_TEMPLATE("add and mul gradients, with a broadcast operand", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto a = random_tensor<T, 2>({9, 7});
  const auto bias = random_tensor<T, 1>({7});
  const auto dy = random_tensor<T, 2>({9, 7});
  const auto ad = to_double(a), dyd = to_double(dy);
  const auto biasd = to_double(bias);
  // Analytic float64 gradients of sum(dy * (a * bias)) and of sum(dy * (a + bias)).
  auto da_ref = ad;
  auto db_ref = host_tensor<double, 1>::from_shape({7});
  auto dbias_add_ref = db_ref;
  db_ref.fill(0);
  dbias_add_ref.fill(0);
  for (std::size_t r = 0; r < 9; ++r) {
    for (std::size_t j = 0; j < 7; ++j) {
      da_ref(r, j) = dyd(r, j) * biasd(j);
      db_ref(j) += dyd(r, j) * ad(r, j);
      dbias_add_ref(j) += dyd(r, j);
    }
  }
  // The analytic gradients against central differences.
  const auto fd_a = fd_gradient(
      [&](const host_tensor<double, 2>& v) {
        double s = 0;
        for (std::size_t i = 0; i < v.size(); ++i) s += dyd.data()[i] * v.data()[i] * biasd(i % 7);
        return s;
      },
      ad);
  CHECK(rel_error(fd_a, da_ref) < fd_bound);
  const auto fd_b = fd_gradient(
      [&](const host_tensor<double, 1>& v) {
        double s = 0;
        for (std::size_t i = 0; i < ad.size(); ++i) s += dyd.data()[i] * ad.data()[i] * v(i % 7);
        return s;
      },
      biasd);
  CHECK(rel_error(fd_b, db_ref) < fd_bound);
  const auto fd_add = fd_gradient(
      [&](const host_tensor<double, 1>& v) {
        double s = 0;
        for (std::size_t i = 0; i < ad.size(); ++i) s += dyd.data()[i] * (ad.data()[i] + v(i % 7));
        return s;
      },
      biasd);
  CHECK(rel_error(fd_add, dbias_add_ref) < fd_bound);

  auto da = poisoned<T, 2>(a.shape());
  auto db = poisoned<T, 1>(bias.shape());
  precis::mul_backward<P>(ctx, dy, a, bias, da, db);
  CHECK(rel_error(da, da_ref) < bound<T>());
  CHECK(rel_error(db, db_ref) < bound<T>());
  poison(da);
  poison(db);
  precis::add_backward<P>(ctx, dy, da, db);
  CHECK(rel_error(da, dyd) == 0.0);
  CHECK(rel_error(db, dbias_add_ref) < bound<T>());
}

TEST_CASE("shape mismatches throw precis::error naming both shapes, and write nothing") {
  const cpu_context ctx{1};
  using P = precis::presets::fp32;
  const auto a = random_tensor<float, 2>({3, 4});
  auto wrong = poisoned<float, 2>(std::array<std::size_t, 2>{4, 3});
  check_error([&] { precis::relu<P>(ctx, a, wrong); }, "precis::relu", "[4, 3]", "[3, 4]");
  check_error([&] { precis::add<P>(ctx, a, wrong, wrong); }, "precis::add", "[4, 3]", "[3, 4]");
  const auto b3 = random_tensor<float, 1>({3});
  auto out = poisoned<float, 2>(a.shape());
  check_error([&] { precis::mul<P>(ctx, a, b3, out); }, "precis::mul", "[3]", "[3, 4]");
  check_error([&] { precis::gelu_backward<P>(ctx, wrong, a, out); }, "precis::gelu_backward",
              "[4, 3]", "[3, 4]");
  auto db = poisoned<float, 1>(std::array<std::size_t, 1>{3});
  auto da = poisoned<float, 2>(a.shape());
  check_error([&] { precis::add_backward<P>(ctx, a, da, db); }, "db", "[3]", "[3, 4]");
  for (float v : out) CHECK(std::isnan(v));
  for (float v : da) CHECK(std::isnan(v));
}

TEST_CASE("results are bit-identical for 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 2>({300, 1000});
  const auto bias = random_tensor<bfloat16, 1>({1000});
  auto y1 = poisoned<bfloat16, 2>(x.shape()), y2 = y1;
  precis::gelu<P>(cpu_context{1}, x, y1);
  precis::gelu<P>(cpu_context{2}, x, y2);
  CHECK(same_bits(y1, y2));
  precis::add<P>(cpu_context{1}, x, bias, y1);
  precis::add<P>(cpu_context{2}, x, bias, y2);
  CHECK(same_bits(y1, y2));
  auto d1 = poisoned<float, 1>(bias.shape()), d2 = d1;
  auto da1 = poisoned<bfloat16, 2>(x.shape()), da2 = da1;
  precis::mul_backward<P>(cpu_context{1}, x, y1, bias, da1, d1);
  precis::mul_backward<P>(cpu_context{2}, x, y1, bias, da2, d2);
  CHECK(same_bits(d1, d2));
  CHECK(same_bits(da1, da2));
}

// Inputs of 8 and 16 bits read gelu, sigmoid and their gradient factors from tables of
// every input value: the results must be those of the float computation on the converted
// inputs, rounded once to the output type (NaN where it gives NaN), for every input.
template <class X, class Y>
void check_tables_match_float_path() {
  using P = precis::presets::bf16_mixed;
  constexpr std::size_t n = std::size_t(1) << (8 * sizeof(X));
  auto x = host_tensor<X, 1>::from_shape({n});
  auto xf = host_tensor<float, 1>::from_shape({n});
  for (std::size_t i = 0; i < n; ++i) {
    x(i) = X::from_bits(static_cast<typename X::storage_type>(i));
    xf(i) = float(x(i));
  }
  const auto dy = random_tensor<Y, 1>({n}, -3.0, 3.0);
  auto dyf = host_tensor<float, 1>::from_shape({n});
  for (std::size_t i = 0; i < n; ++i) dyf(i) = float(dy(i));
  const auto same = [&](const host_tensor<Y, 1>& got, const host_tensor<float, 1>& ref) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Y want = Y(ref(i));
      const bool nan_both = std::isnan(float(got(i))) && std::isnan(float(want));
      if (!nan_both && std::bit_cast<std::array<unsigned char, sizeof(Y)>>(got(i)) !=
                           std::bit_cast<std::array<unsigned char, sizeof(Y)>>(want)) {
        ++bad;
      }
    }
    return bad;
  };
  const cpu_context ctx{2};
  auto got = poisoned<Y, 1>(x.shape());
  auto ref = poisoned<float, 1>(x.shape());
  // run(x, dy, out) on the narrow inputs and on their float values: the same bits.
  const auto both = [&](const auto& run) {
    run(x, dy, got);
    run(xf, dyf, ref);
    CHECK(same(got, ref) == 0);
  };
  both([&](const auto& in, const auto&, auto& out) { precis::gelu<P>(ctx, in, out); });
  both([&](const auto& in, const auto& g, auto& out) { precis::gelu_backward<P>(ctx, g, in, out); });
  both([&](const auto& in, const auto&, auto& out) { precis::sigmoid<P>(ctx, in, out); });
  both([&](const auto& in, const auto& g, auto& out) { precis::sigmoid_backward<P>(ctx, g, in, out); });
}

TEST_CASE("tabulated activations of 8- and 16-bit inputs equal the float computation") {
  check_tables_match_float_path<bfloat16, bfloat16>();
  check_tables_match_float_path<bfloat16, float>();
  check_tables_match_float_path<float16, float16>();
  check_tables_match_float_path<float16, bfloat16>();
  check_tables_match_float_path<precis::float8_e4m3, bfloat16>();
  check_tables_match_float_path<precis::float8_e5m2, float>();
}

// gelu_with_derivative: y is gelu's output and dy * d (precis::mul) is gelu_backward's,
// bit for bit, for float and bfloat16 inputs and outputs, rows of an odd length (vector
// tails) and 1 or 2 threads; a wrong shape throws before anything is written.
template <class X, class Y>
void check_gelu_with_derivative(const cpu_context& ctx) {
  using P = std::conditional_t<std::is_same_v<X, float>, precis::presets::fp32,
                               precis::presets::bf16_mixed>;
  // 300 x 257: more than two threads' worth of elements, and a vector tail.
  const auto x = random_tensor<X, 2>({300, 257}, -9.0, 9.0);
  const auto dy = random_tensor<Y, 2>(std::array<std::size_t, 2>{300, 257}, -3.0, 3.0);
  auto y = poisoned<Y, 2>(x.shape()), y_ref = y;
  auto d = poisoned<float, 2>(x.shape());
  auto dx = poisoned<Y, 2>(x.shape()), dx_ref = dx;
  precis::gelu_with_derivative<P>(ctx, x, y, d);
  precis::gelu<P>(ctx, x, y_ref);
  CHECK(same_bits(y, y_ref));
  precis::mul<P>(ctx, dy, d, dx);
  precis::gelu_backward<P>(ctx, dy, x, dx_ref);
  CHECK(same_bits(dx, dx_ref));
}

TEST_CASE("gelu_with_derivative: gelu's bits, and dy * d is gelu_backward's") {
  for (unsigned threads : {1U, 2U}) {
    const cpu_context ctx{threads};
    check_gelu_with_derivative<float, float>(ctx);
    check_gelu_with_derivative<bfloat16, bfloat16>(ctx);
    check_gelu_with_derivative<bfloat16, float>(ctx);
  }
  const cpu_context ctx{1};
  const auto x = random_tensor<float, 2>({3, 4});
  auto y = poisoned<float, 2>(x.shape());
  auto wrong = poisoned<float, 2>(std::array<std::size_t, 2>{4, 3});
  check_error([&] { precis::gelu_with_derivative<precis::presets::fp32>(ctx, x, y, wrong); },
              "precis::gelu_with_derivative", "[4, 3]", "[3, 4]");
  for (float v : y) CHECK(std::isnan(v));
}
