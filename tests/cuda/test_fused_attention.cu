// Fused attention (cuDNN's flash attention, kernels/cuda/fused_attention.hpp) in nn::attention
// on the device against the host's unfused pieces, built from one blueprint with the same
// masters: the output, the input gradient and the four parameter gradients within the storage
// type's bounds. The fused kernel keeps the scores in float where the pieces store them in the
// scores' 16-bit type, and sums in its own order, hence a factor of 8 on the bounds. Also:
// which maps fuse (compile-time), describe's note, the engine alone against attention in
// double (each of dq, dk and dv against its own largest value), deterministic backward passes,
// a head width and a token count cuDNN does not take (refused, naming the remedy), and a
// second geometry (a second plan). Exits 77 (skipped) where no GPU is present or the build has no cuDNN frontend.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "nn_compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

template <class Map, class Ctx = cuda_context>
using attention_t = nn::attention_layer<nn::tags::attention_qkv, nn::tags::attention_scores, nn::tags::attention_softmax,
                                        nn::tags::attention_context, nn::tags::attention_out, Map, Ctx>;
template <class P>
using map_of = decltype(make_policy_map(P{}));

// Which maps fuse: bfloat16 or float16 with the hardware's products, on the device, where
// the build has the frontend. Exact products, float and TF32 keep the pieces, and so does
// the host.
static_assert(attention_t<map_of<presets::bf16_mixed>>::fused == has_fused_attention);
static_assert(attention_t<map_of<presets::fp16_hardware>>::fused == has_fused_attention);
static_assert(!attention_t<map_of<presets::bf16_exact>>::fused && !attention_t<map_of<presets::fp16_mixed>>::fused);
static_assert(!attention_t<map_of<presets::fp32>>::fused && !attention_t<map_of<presets::tf32>>::fused);
static_assert(!attention_t<map_of<presets::bf16_mixed>, cpu_context>::fused);
// A map that sends the scores product through exact products keeps every piece.
using pieces_map =
    decltype(make_policy_map(presets::bf16_mixed{}, for_layer<nn::tags::attention_scores>(presets::bf16_exact{})));
static_assert(!attention_t<pieces_map>::fused);

template <class P>
void check_against_host(cuda_context& ctx, const std::string& tag) {
  // ViT's token count (64 patches and a class token), head width 16, and a wider head.
  compare_models<P, 3>(ctx, tag + " attention, 65 tokens, 4 heads of 16", nn::attention(64, 4), {3, 65, 64}, 8);
  compare_models<P, 3>(ctx, tag + " attention, 17 tokens, 2 heads of 64", nn::attention(128, 2), {2, 17, 128}, 8);
  compare_models<P, 3>(ctx, tag + " two attention layers",
                       nn::seq(nn::attention(64, 2), nn::gelu(), nn::attention(64, 4)), {2, 33, 64}, 8);
}

#if defined(PRECIS_HAS_CUDNN_FRONTEND)  // the engine and its plans exist only with the frontend
// Three backward passes from the same state give the same bits (cuDNN's deterministic
// algorithm): 512 tokens and 8 heads, so that each dq element sums hundreds of terms, whose
// order a nondeterministic algorithm would vary. The model keeps one plan per direction and
// geometry.
void check_deterministic(cuda_context& ctx) {
  auto m = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(512, 8), {.seed = 3});
  const auto x = to_device(random_tensor<bfloat16, 3>({2, 512, 512}));
  const auto dy = to_device(random_tensor<bfloat16, 3>({2, 512, 512}, 0.1F));
  const auto pass = [&] {
    m.zero_grad(ctx);
    (void)m.forward(ctx, x);
    return to_host(m.backward(ctx, dy), ctx.stream());
  };
  const auto a = pass();
  for (int run = 2; run <= 3; ++run) {
    const auto b = pass();
    expect(std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0,
           "fused backward: the same bits, run " + std::to_string(run));
  }
  expect(m.root().engine().plans() == 2, "fused: one plan forward and one backward for one geometry");
  const auto x2 = to_device(random_tensor<bfloat16, 3>({1, 9, 512}));
  (void)m.forward(ctx, x2);
  expect(m.root().engine().plans() == 3, "fused: a new geometry makes its own plan");
  {
    // Plans belong to a context (its id(), not its handle's address, which a later context
    // may get): the same geometry on another context makes its own.
    ctx.synchronize();
    cuda_context other;
    (void)m.forward(other, x2);
    other.synchronize();
    expect(m.root().engine().plans() == 4, "fused: another context makes its own plan");
  }
  // One token: cuDNN's backward refuses it, so a training pass is refused before it runs;
  // an evaluation pass is not.
  const auto x1 = to_device(random_tensor<bfloat16, 3>({2, 1, 512}));
  expect_error("fused: one token in training", [&] { (void)m.forward(ctx, x1); }, "at least 2 tokens");
  expect(m.forward(ctx, x1, nn::mode::eval).shape()[1] == 1, "fused: one token in evaluation");
}

// The engine alone against attention computed in double on the host from the same bfloat16
// q, k, v and dO: the context, the log-sum-exp statistics, and dq, dk and dv each against its
// own largest value (so that a wrong dq cannot hide under a larger dv). `amplitude` 4 makes
// the softmax peaked.
void check_engine(cuda_context& ctx, std::size_t n, std::size_t h, std::size_t t, std::size_t dh, float amplitude) {
  const std::string tag = "fused engine N" + std::to_string(n) + " H" + std::to_string(h) + " T" + std::to_string(t) +
                          " dh" + std::to_string(dh) + " amplitude " + std::to_string(int(amplitude));
  const std::size_t w = h * dh;
  const double scale = 1.0 / std::sqrt(double(dh));
  const auto qkv = random_tensor<bfloat16, 3>({n, t, 3 * w}, amplitude);
  const auto dout = random_tensor<bfloat16, 3>({n, t, w});
  auto o = poisoned<bfloat16, 3>({n, t, w});
  auto dqkv = poisoned<bfloat16, 3>({n, t, 3 * w});
  auto stats = poisoned<float, 3>({n * h, t, 1});
  const auto qkv_d = to_device(qkv);
  const auto dout_d = to_device(dout);
  fused_attention_engine engine;
  const fused_attention_shape s{std::int64_t(n), std::int64_t(h), std::int64_t(t), std::int64_t(dh), false,
                                float(scale)};
  engine.forward(ctx, s, qkv_d.data(), o.data(), stats.data());
  engine.backward(ctx, s, qkv_d.data(), o.data(), dout_d.data(), stats.data(), dqkv.data());
  const auto o_h = to_host(o, ctx.stream());
  const auto dqkv_h = to_host(dqkv, ctx.stream());
  const auto stats_h = to_host(stats, ctx.stream());

  // The reference, per (batch, head): p = softmax(scale q k^T), o = p v; dv = p^T dO,
  // dp = dO v^T, ds = p (dp - rowsum(dp p)), dq = scale ds k, dk = scale ds^T q.
  std::vector<double> want_o(n * t * w), want_d(n * t * 3 * w), want_lse(n * h * t);
  const auto at = [&](std::size_t b, std::size_t r, std::size_t part, std::size_t head, std::size_t d) {
    return (b * t + r) * 3 * w + part * w + head * dh + d;
  };
  std::vector<double> p(t * t), dp(t * t);
  for (std::size_t b = 0; b < n; ++b) {
    for (std::size_t head = 0; head < h; ++head) {
      const auto q = [&](std::size_t r, std::size_t d) { return double(qkv.data()[at(b, r, 0, head, d)]); };
      const auto k = [&](std::size_t r, std::size_t d) { return double(qkv.data()[at(b, r, 1, head, d)]); };
      const auto v = [&](std::size_t r, std::size_t d) { return double(qkv.data()[at(b, r, 2, head, d)]); };
      const auto g = [&](std::size_t r, std::size_t d) { return double(dout.data()[(b * t + r) * w + head * dh + d]); };
      for (std::size_t i = 0; i < t; ++i) {
        double m = -HUGE_VAL;
        for (std::size_t j = 0; j < t; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < dh; ++d) dot += q(i, d) * k(j, d);
          p[i * t + j] = scale * dot;
          m = std::max(m, p[i * t + j]);
        }
        double sum = 0;
        for (std::size_t j = 0; j < t; ++j) sum += std::exp(p[i * t + j] - m);
        want_lse[(b * h + head) * t + i] = m + std::log(sum);
        for (std::size_t j = 0; j < t; ++j) p[i * t + j] = std::exp(p[i * t + j] - m) / sum;
        for (std::size_t d = 0; d < dh; ++d) {
          double c = 0;
          for (std::size_t j = 0; j < t; ++j) c += p[i * t + j] * v(j, d);
          want_o[(b * t + i) * w + head * dh + d] = c;
        }
        double row = 0;
        for (std::size_t j = 0; j < t; ++j) {
          double e = 0;
          for (std::size_t d = 0; d < dh; ++d) e += g(i, d) * v(j, d);
          dp[i * t + j] = e;
          row += e * p[i * t + j];
        }
        for (std::size_t j = 0; j < t; ++j) dp[i * t + j] = p[i * t + j] * (dp[i * t + j] - row);  // ds
      }
      for (std::size_t r = 0; r < t; ++r) {
        for (std::size_t d = 0; d < dh; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (std::size_t j = 0; j < t; ++j) {
            dq += dp[r * t + j] * k(j, d);
            dk += dp[j * t + r] * q(j, d);
            dv += p[j * t + r] * g(j, d);
          }
          want_d[at(b, r, 0, head, d)] = scale * dq;
          want_d[at(b, r, 1, head, d)] = scale * dk;
          want_d[at(b, r, 2, head, d)] = dv;
        }
      }
    }
  }
  // max |got(i) - want(i)| <= limit * max |want(i)| over i < count (a NaN fails).
  const auto within = [&](const char* what, std::size_t count, auto got, auto want, double limit) {
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double x = got(i), y = want(i);
      err = std::isfinite(x) ? std::max(err, std::abs(x - y)) : HUGE_VAL;
      norm = std::max(norm, std::abs(y));
    }
    expect(err <= limit * norm, tag + ": " + what + " (error " + std::to_string(err / norm) + " of its largest)");
  };
  // Each output is rounded to bfloat16 once, after float sums over probabilities the kernel
  // rounded to bfloat16: a few units of bfloat16's precision.
  const double limit = 4 * bound<bfloat16>();
  within("context", o_h.size(), [&](std::size_t i) { return double(o_h.data()[i]); },
         [&](std::size_t i) { return want_o[i]; }, limit);
  within("log-sum-exp statistics", want_lse.size(), [&](std::size_t i) { return double(stats_h.data()[i]); },
         [&](std::size_t i) { return want_lse[i]; }, 1e-3);
  const char* names[3] = {"dq", "dk", "dv"};
  for (std::size_t part = 0; part < 3; ++part) {
    const std::size_t count = n * t * w;
    const auto index = [&](std::size_t i) {  // the i-th element of this third
      const std::size_t row = i / w, col = i % w;
      return row * 3 * w + part * w + col;
    };
    within(names[part], count, [&](std::size_t i) { return double(dqkv_h.data()[index(i)]); },
           [&](std::size_t i) { return want_d[index(i)]; }, limit);
  }
}

#endif

}  // namespace

int main() {
#if !defined(PRECIS_HAS_CUDNN_FRONTEND)
  static_assert(!has_fused_attention);
  std::printf("skipped: built without precis::cudnn_frontend (pip install nvidia-cudnn-frontend)\n");
  return skipped;
#else
  {
    if (!have_gpu()) return skipped;
    cuda_context ctx;
    check_against_host<presets::bf16_mixed>(ctx, "bf16_mixed");
    check_against_host<presets::fp16_hardware>(ctx, "fp16_hardware");
    check_engine(ctx, 2, 3, 33, 16, 1.0F);
    check_engine(ctx, 1, 2, 70, 64, 4.0F);
    check_deterministic(ctx);
    // describe notes the fused pieces, and only where they are.
    {
      const auto fused = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(64, 4));
      const auto pieces = nn::build<bfloat16, 3, cuda_context>(presets::bf16_exact{}, nn::attention(64, 4));
      const std::string note = "fused (cuDNN flash attention)";
      const auto count = [&](const std::string& table) {
        std::size_t n = 0;
        for (auto at = table.find(note); at != std::string::npos; at = table.find(note, at + 1)) ++n;
        return n;
      };
      expect(count(nn::describe(fused)) == 3, "describe: scores, softmax and context noted fused");
      expect(count(nn::describe(pieces)) == 0, "describe: no fused note where the pieces run");
    }
    // cuDNN takes head widths that are multiples of 8: heads of 4 are refused before any launch.
    {
      auto m = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(16, 4));
      const auto x = to_device(random_tensor<bfloat16, 3>({1, 5, 16}));
      expect_error("fused: head width 4", [&] { (void)m.forward(ctx, x); }, "products::exact");
    }
    return finish();
  }
#endif
}
