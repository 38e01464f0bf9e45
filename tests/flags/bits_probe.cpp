// One translation unit that tests/flags/CMakeLists.txt builds several times, with
// different compilers and flags (-march=native or not, -ffp-contract=fast or off). Each
// build prints one line per result: a name and a 64-bit hash of the result's bits;
// compare_bits.cmake requires the lines to be identical between the builds. The same
// builds' machine code is checked for products the compiler fused on its own
// (no_contraction.sh).
#include <precis/nn/shape.hpp>
#include <precis/precis.hpp>

#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace precis;

namespace {

const cpu_context ctx{2};

struct hasher {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  void add(std::uint64_t w) { h = (h ^ w) * 0x100000001B3ULL; }
  void add(float x) { add(std::uint64_t{std::bit_cast<std::uint32_t>(x)}); }
  void add(double x) { add(std::bit_cast<std::uint64_t>(x)); }
  template <class T>
  void add_all(const T& range) {
    for (const auto& x : range) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(x)>, double>) {
        add(x);
      } else {
        add(static_cast<float>(x));
      }
    }
  }
};

void print(const std::string& name, const hasher& h) { std::printf("%s %016" PRIx64 "\n", name.c_str(), h.h); }

// Inputs from an integer hash, exactly representable, with no floating-point arithmetic
// (std::normal_distribution's own arithmetic would differ between the builds): values
// m * 2^-23 * scale with |m| < 2^23, scale a power of two.
std::vector<float> inputs(std::size_t n, int log2_scale, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL;
  for (auto& e : v) {
    x += 0x9E3779B97F4A7C15ULL;
    std::uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const auto m = static_cast<std::int64_t>(z >> 40) - (std::int64_t(1) << 23);
    e = std::ldexp(static_cast<float>(m), log2_scale - 23);
  }
  return v;
}

template <class T, std::size_t N>
host_tensor<T, N> tensor_of(std::array<std::size_t, N> shape, int log2_scale, std::uint64_t seed) {
  host_tensor<T, N> t(shape);
  const auto v = inputs(t.size(), log2_scale, seed);
  std::size_t i = 0;
  for (auto& x : t) x = T(v[i++]);
  return t;
}

template <class Model>
void add_masters(hasher& h, Model& m) {
  for (auto s : m.masters()) h.add_all(s);
}

// A small MLP with a layer norm: gemm, layer norm, GELU, softmax cross-entropy, AdamW,
// trained a few steps under policy P with scaler S.
template <class P, class S>
void mlp(const std::string& name, S scaler) {
  using T = typename P::storage_type;
  auto model = nn::build<T, 2>(P{}, nn::seq(nn::linear(16, 48), nn::layer_norm(48), nn::gelu(), nn::linear(48, 48),
                                            nn::tanh(), nn::linear(48, 5)),
                               {.seed = 7});
  nn::softmax_cross_entropy<P> loss;
  adamw opt(model.masters(), {.lr = 3e-3, .weight_decay = 0.05});
  nn::trainer tr(model, loss, opt, scaler, {.max_grad_norm = 1.0});
  const auto x = tensor_of<T, 2>({64, 16}, 1, 1);
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{64});
  for (std::size_t r = 0; r < 64; ++r) t(r) = std::int32_t((r * 7) % 5);
  hasher h;
  for (int step = 0; step < 6; ++step) {
    const auto r = tr.step(ctx, x, t);
    h.add(r.loss);
    h.add(r.grad_norm);
  }
  add_masters(h, model);
  print(name, h);
}

// A convolutional block: conv, batch norm, ReLU, pooling, SGD with Nesterov momentum.
template <class P>
void conv(const std::string& name) {
  using T = typename P::storage_type;
  const conv2d_params same{.padding = {1, 1}};
  auto model = nn::build<T, 4>(P{},
                               nn::seq(nn::conv2d(3, 8, 3, same), nn::batch_norm(8), nn::relu(), nn::max_pool2d({.kernel = {2, 2}, .stride = {2, 2}}),
                                       nn::conv2d(8, 8, 3, same, nn::no_bias), nn::sigmoid(), nn::global_avg_pool(),
                                       nn::linear(8, 4)),
                               {.seed = 9});
  nn::softmax_cross_entropy<P> loss;
  sgd opt(model.masters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
  scaler_for<P> scaler;
  nn::trainer tr(model, loss, opt, scaler);
  const auto x = tensor_of<T, 4>({4, 3, 12, 12}, 0, 2);
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{4});
  for (std::size_t r = 0; r < 4; ++r) t(r) = std::int32_t(r);
  hasher h;
  for (int step = 0; step < 4; ++step) h.add(tr.step(ctx, x, t).loss);
  add_masters(h, model);
  print(name, h);
}

// Kernels called directly: row kernels with a float output (float arithmetic inside, no
// products of inputs), casts to every format, losses.
void kernels() {
  using P = presets::bf16_exact;
  const auto x = tensor_of<bfloat16, 2>({8, 300}, 2, 3);
  {
    host_tensor<float, 2> y(x.shape());
    hasher h;
    softmax<P>(ctx, x, y);
    h.add_all(y);
    log_softmax<P>(ctx, x, y);
    h.add_all(y);
    print("softmax_log_softmax", h);
  }
  {
    const auto g = tensor_of<float, 1>({300}, 0, 4), b = tensor_of<float, 1>({300}, 0, 5);
    host_tensor<float, 2> y(x.shape());
    host_tensor<float, 1> mean(std::array<std::size_t, 1>{8}), rstd(std::array<std::size_t, 1>{8});
    layer_norm<P>(ctx, x, g, b, y, mean, rstd, 1e-5);
    hasher h;
    h.add_all(y);
    h.add_all(mean);
    h.add_all(rstd);
    const auto dy = tensor_of<bfloat16, 2>({8, 300}, 0, 10);
    host_tensor<float, 2> dx(x.shape());
    host_tensor<float, 1> dg(std::array<std::size_t, 1>{300}), db(std::array<std::size_t, 1>{300});
    layer_norm_backward<P>(ctx, dy, x, g, mean, rstd, dx, dg, db);
    h.add_all(dx);
    h.add_all(dg);
    h.add_all(db);
    print("layer_norm", h);
  }
  {
    // The SIMD math (GELU, sigmoid, exp) and long rows (5003 columns: several blocks of
    // the row sums, a tail), forward and backward.
    using F = presets::fp32;
    const auto z = tensor_of<float, 2>({4, 5003}, 3, 8), dz = tensor_of<float, 2>({4, 5003}, 0, 9);
    host_tensor<float, 2> y(z.shape()), d(z.shape());
    hasher h;
    gelu<F>(ctx, z, y);
    h.add_all(y);
    gelu_backward<F>(ctx, dz, z, y);
    h.add_all(y);
    sigmoid<F>(ctx, z, y);
    h.add_all(y);
    sigmoid_backward<F>(ctx, dz, z, y);
    h.add_all(y);
    softmax<F>(ctx, z, y);
    h.add_all(y);
    softmax_backward<F>(ctx, dz, y, d);
    h.add_all(d);
    log_softmax<F>(ctx, z, y);
    h.add_all(y);
    log_softmax_backward<F>(ctx, dz, y, d);
    h.add_all(d);
    host_tensor<float, 1> lse(std::array<std::size_t, 1>{4});
    logsumexp<F>(ctx, z, lse);
    h.add_all(lse);
    host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{4});
    for (std::size_t r = 0; r < 4; ++r) t(r) = std::int32_t(r * 1000);
    h.add(float(cross_entropy<F>(ctx, z, t)));
    cross_entropy_backward<F>(ctx, z, t, d);
    h.add_all(d);
    print("simd_math_and_long_rows", h);
  }
  {
    const auto f = tensor_of<float, 1>({4096}, 7, 6);
    hasher h;
    host_tensor<bfloat16, 1> b(f.shape());
    host_tensor<float16, 1> s(f.shape());
    host_tensor<float8_e4m3, 1> e4(f.shape());
    host_tensor<float8_e5m2, 1> e5(f.shape());
    cast(ctx, f, b);
    cast(ctx, f, s);
    cast<rounding::nearest_even, overflow::saturate>(ctx, f, e4);
    cast<rounding::nearest_even, overflow::saturate>(ctx, f, e5);
    h.add_all(b);
    h.add_all(s);
    h.add_all(e4);
    h.add_all(e5);
    print("casts", h);
  }
}

using f64 = policy<double, double, double, double>;

// The scalar and less common paths, in float or double (P): tanh, the tanh GELU, products
// with a broadcast operand, losses, bilinear resampling, norms, gemm with beta and bias, a
// convolution (double: the direct loops), and the l2 norm.
template <class P>
void more_kernels(const std::string& name) {
  using T = typename P::storage_type;
  hasher h;
  const auto z = tensor_of<T, 2>({6, 97}, 2, 20), dz = tensor_of<T, 2>({6, 97}, 0, 21);
  host_tensor<T, 2> y(z.shape()), d(z.shape());
  tanh<P>(ctx, z, y);
  h.add_all(y);
  tanh_backward<P>(ctx, dz, z, y);
  h.add_all(y);
  gelu<P>(ctx, z, y, gelu_approximation::tanh);
  h.add_all(y);
  gelu_backward<P>(ctx, dz, z, y, gelu_approximation::tanh);
  h.add_all(y);
  gelu<P>(ctx, z, y);
  h.add_all(y);
  gelu_backward<P>(ctx, dz, z, y);
  h.add_all(y);
  const auto row = tensor_of<T, 1>({97}, 0, 22);
  host_tensor<T, 1> drow(row.shape());
  mul_backward<P>(ctx, dz, z, row, d, drow);
  h.add_all(d);
  h.add_all(drow);
  const auto t = tensor_of<T, 2>({6, 97}, -1, 23);
  h.add(double(smooth_l1_loss<P>(ctx, z, t, 0.5)));
  smooth_l1_loss_backward<P>(ctx, z, t, d, 0.5);
  h.add_all(d);
  h.add(double(bce_with_logits<P>(ctx, z, t)));
  bce_with_logits_backward<P>(ctx, z, t, d);
  h.add_all(d);
  h.add(double(dice_loss<P>(ctx, z, t)));
  dice_loss_backward<P>(ctx, z, t, d);
  h.add_all(d);
  h.add(double(l2_norm<P>(ctx, z)));
  const auto img = tensor_of<T, 4>({2, 3, 5, 7}, 0, 24);
  host_tensor<T, 4> up(std::array<std::size_t, 4>{2, 3, 11, 13}), dimg(img.shape());
  for (const bool corners : {false, true}) {
    upsample_bilinear2d<P>(ctx, img, up, corners);
    h.add_all(up);
    upsample_bilinear2d_backward<P>(ctx, up, dimg, corners);
    h.add_all(dimg);
  }
  const auto g = tensor_of<T, 1>({97}, 0, 25), b = tensor_of<T, 1>({97}, 0, 26);
  host_tensor<T, 1> mean(std::array<std::size_t, 1>{6}), rstd(mean.shape()), dg(g.shape()),
      db(g.shape());
  layer_norm<P>(ctx, z, g, b, y, mean, rstd, 1e-5);
  h.add_all(y);
  layer_norm_backward<P>(ctx, dz, z, g, mean, rstd, d, dg, db);
  h.add_all(d);
  h.add_all(dg);
  h.add_all(db);
  const auto cg = tensor_of<T, 1>({3}, 0, 27), cb = tensor_of<T, 1>({3}, 0, 28);
  host_tensor<T, 1> rm(std::array<std::size_t, 1>{3}), rv(rm.shape()), sm(rm.shape()),
      sr(rm.shape()), dcg(rm.shape()), dcb(rm.shape());
  for (auto& v : rm) v = T(0.5);
  for (auto& v : rv) v = T(2);
  host_tensor<T, 4> bn(img.shape()), dbn(img.shape());
  batch_norm_train<P>(ctx, img, cg, cb, rm, rv, bn, sm, sr);
  h.add_all(bn);
  h.add_all(rm);
  h.add_all(rv);
  batch_norm_backward<P>(ctx, img, img, cg, sm, sr, dbn, dcg, dcb);
  h.add_all(dbn);
  h.add_all(dcg);
  batch_norm_infer<P>(ctx, img, cg, cb, rm, rv, bn);
  h.add_all(bn);
  const auto wa = tensor_of<T, 2>({97, 33}, 0, 29);
  const auto bias = tensor_of<T, 1>({33}, 0, 30);
  host_tensor<T, 2> c = tensor_of<T, 2>({6, 33}, 0, 31);
  gemm<P>(ctx, z, wa, bias, c, {.alpha = 0.7f, .beta = 0.3f});
  h.add_all(c);
  const auto w = tensor_of<T, 4>({4, 3, 3, 3}, 0, 32);
  const conv2d_params same{.padding = {1, 1}};
  host_tensor<T, 4> cy(std::array<std::size_t, 4>{2, 4, 5, 7}), dx(img.shape()), dw(w.shape());
  conv2d<P>(ctx, img, w, cy, same);
  h.add_all(cy);
  conv2d_backward_data<P>(ctx, cy, w, dx, same);
  h.add_all(dx);
  conv2d_backward_weights<P>(ctx, img, cy, dw, same);
  h.add_all(dw);
  print(name, h);
}

// The optimizers on their own, with inexact hyperparameters, and the dynamic scaler with
// factors float cannot hold.
void optimizers_and_scaler() {
  auto w = inputs(1000, 0, 10), w2 = w;
  adamw a({std::span<float>(w)}, {.lr = 1e-3, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.1});
  sgd s({std::span<float>(w2)}, {.lr = 0.03, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3});
  for (int step = 0; step < 50; ++step) {
    auto g = inputs(1000, -3, 100 + std::uint64_t(step)), g2 = g;
    a.step(g);
    s.step(g2);
  }
  hasher ha, hs;
  ha.add_all(w);
  hs.add_all(w2);
  print("adamw", ha);
  print("sgd", hs);
  warmup_cosine schedule(3e-3, 7, 300, 1e-5);
  hasher hl;
  for (int step = 0; step < 300; ++step) {
    hl.add(schedule.lr());
    schedule.advance(true);
  }
  print("warmup_cosine", hl);
  dynamic_scaler scaler({.init_scale = 1000.3f, .growth_factor = 1.3, .backoff_factor = 0.7, .growth_interval = 2});
  struct none {
    void step(std::vector<float>&) {}
  } opt;
  hasher h;
  for (int step = 0; step < 200; ++step) {
    std::vector<float> g{step % 5 == 0 ? INFINITY : 0.5f};
    h.add(scaler.step(opt, scaler.scaled_gradients(std::move(g))).scale_after);
  }
  print("dynamic_scaler", h);
}

}  // namespace

int main() {
  // bf16 with exact products: bf16_mixed's hardware products (oneDNN's dot-product
  // instructions, fused multiply-adds in the vector math) depend on the machine and build.
  mlp<presets::bf16_exact>("mlp_bf16", no_scaling{});
  mlp<presets::fp16_mixed>("mlp_fp16", dynamic_scaler({.init_scale = 4096.0f,
                                                       .growth_factor = 1.5,
                                                       .backoff_factor = 0.6,
                                                       .growth_interval = 3}));
  mlp<presets::fp32>("mlp_fp32", no_scaling{});
  conv<presets::bf16_exact>("conv_bf16");
  conv<presets::fp32>("conv_fp32");
  kernels();
  more_kernels<presets::fp32>("kernels_fp32");
  more_kernels<f64>("kernels_f64");
  optimizers_and_scaler();
  return 0;
}
