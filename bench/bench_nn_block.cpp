// What the layer machinery costs: a ResNet basic block with a projection shortcut (ResNet-18's
// first layer2 block: 64 -> 128 channels, stride 2, on 56x56 images), forward + backward,
// built from a blueprint by nn::build, against the same kernel calls written by hand with
// buffers made once (ratio = by hand / built: above 1, the built block is faster). Both use the same kernels, policies and rounding points (the outputs
// are compared bit for bit first); the ratio is what nn adds: shape checks through the
// whole model, the saved-input bookkeeping, parameter gradients summed into float.
//
//     bench_nn_block [--batch N] [--repeats R] [--threads T] [--csv FILE]
#include <precis/precis.hpp>

#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace precis;

struct conv1 : layer<op::conv> {
  static constexpr std::string_view name = "conv1";
};
struct conv2 : layer<op::conv> {
  static constexpr std::string_view name = "conv2";
};
struct proj : layer<op::conv> {
  static constexpr std::string_view name = "proj";
};
struct bn1 : layer<op::batch_norm> {
  static constexpr std::string_view name = "bn1";
};
struct bn2 : layer<op::batch_norm> {
  static constexpr std::string_view name = "bn2";
};
struct bn_proj : layer<op::batch_norm> {
  static constexpr std::string_view name = "bn_proj";
};

constexpr std::size_t cin = 64, cout = 128;

auto basic_block() {
  const conv2d_params s2p1{.stride = {2, 2}, .padding = {1, 1}}, p1{.padding = {1, 1}}, s2{.stride = {2, 2}};
  return nn::seq(nn::residual(nn::seq(nn::conv2d<conv1>(cin, cout, 3, s2p1, nn::no_bias), nn::batch_norm<bn1>(cout),
                                      nn::relu(), nn::conv2d<conv2>(cout, cout, 3, p1, nn::no_bias),
                                      nn::batch_norm<bn2>(cout)),
                              nn::seq(nn::conv2d<proj>(cin, cout, 1, s2, nn::no_bias), nn::batch_norm<bn_proj>(cout))),
                 nn::relu());
}

// The same block as kernel calls on buffers the caller owns.
template <class P>
struct by_hand {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  using Pc = kernel_policy_t<op::conv, P>;
  using Pb = kernel_policy_t<op::batch_norm, P>;
  using Pe = kernel_policy_t<op::elementwise, P>;
  template <std::size_t N>
  using dims = std::array<std::size_t, N>;

  struct norm {
    host_tensor<S, 1> gamma, beta;
    host_tensor<float, 1> rmean, rvar, smean, srstd, ggamma, gbeta;
    host_tensor<G, 1> dgamma, dbeta;
    host_tensor<S, 4> y;
    host_tensor<G, 4> dx;
  };
  struct conv {
    host_tensor<S, 4> w, y;
    host_tensor<float, 4> grad;
    host_tensor<G, 4> dw, dx;
  };
  conv c1, c2, cp;
  norm n1, n2, np;
  host_tensor<S, 4> a1, sum, out;
  host_tensor<G, 4> ds, da1, dx;
  conv2d_params s2p1{.stride = {2, 2}, .padding = {1, 1}}, p1{.padding = {1, 1}}, s2{.stride = {2, 2}};

  by_hand(std::size_t batch, std::size_t hw) {
    const std::size_t ho = hw / 2;
    auto make_conv = [&](conv& c, dims<4> w, dims<4> y, dims<4> x) {
      c.w = host_tensor<S, 4>(w);
      c.grad = host_tensor<float, 4>(w);
      c.dw = host_tensor<G, 4>(w);
      c.y = host_tensor<S, 4>(y);
      c.dx = host_tensor<G, 4>(x);
    };
    make_conv(c1, {cout, cin, 3, 3}, {batch, cout, ho, ho}, {batch, cin, hw, hw});
    make_conv(c2, {cout, cout, 3, 3}, {batch, cout, ho, ho}, {batch, cout, ho, ho});
    make_conv(cp, {cout, cin, 1, 1}, {batch, cout, ho, ho}, {batch, cin, hw, hw});
    for (norm* n : {&n1, &n2, &np}) {
      for (auto* t : {&n->rmean, &n->rvar, &n->smean, &n->srstd, &n->ggamma, &n->gbeta}) *t = host_tensor<float, 1>(dims<1>{cout});
      n->gamma = host_tensor<S, 1>(dims<1>{cout});
      n->beta = host_tensor<S, 1>(dims<1>{cout});
      n->dgamma = host_tensor<G, 1>(dims<1>{cout});
      n->dbeta = host_tensor<G, 1>(dims<1>{cout});
      n->y = host_tensor<S, 4>(dims<4>{batch, cout, ho, ho});
      n->dx = host_tensor<G, 4>(dims<4>{batch, cout, ho, ho});
    }
    for (auto* t : {&a1, &sum, &out}) *t = host_tensor<S, 4>(dims<4>{batch, cout, ho, ho});
    for (auto* t : {&ds, &da1}) *t = host_tensor<G, 4>(dims<4>{batch, cout, ho, ho});
    dx = host_tensor<G, 4>(dims<4>{batch, cin, hw, hw});
  }

  // Parameters from a built model, by path, so that both compute the same thing.
  template <class Model>
  void take(Model& m) {
    m.for_each_parameter([&](const std::string& path, auto& p) {
      auto copy = [&](auto& dst) { std::copy(p.value().begin(), p.value().end(), dst.begin()); };
      if (path.ends_with("conv1.weight")) copy(c1.w);
      if (path.ends_with("conv2.weight")) copy(c2.w);
      if (path.ends_with("proj.weight")) copy(cp.w);
      for (auto [name, n] : {std::pair{"bn1", &n1}, std::pair{"bn2", &n2}, std::pair{"bn_proj", &np}}) {
        if (path.ends_with(std::string(name) + ".gamma")) copy(n->gamma);
        if (path.ends_with(std::string(name) + ".beta")) copy(n->beta);
      }
    });
    for (norm* n : {&n1, &n2, &np}) {
      n->rmean.fill(0.0f);
      n->rvar.fill(1.0f);
    }
  }

  void bn_forward(const cpu_context& ctx, norm& n, const host_tensor<S, 4>& x) {
    batch_norm_train<Pb>(ctx, x, n.gamma, n.beta, n.rmean, n.rvar, n.y, n.smean, n.srstd, 0.1, 1e-5);
  }
  void bn_backward(const cpu_context& ctx, norm& n, const host_tensor<G, 4>& dy, const host_tensor<S, 4>& x) {
    batch_norm_backward<Pb>(ctx, dy, x, n.gamma, n.smean, n.srstd, n.dx, n.dgamma, n.dbeta);
    for (std::size_t i = 0; i < cout; ++i) {
      n.ggamma(i) += float(n.dgamma(i));
      n.gbeta(i) += float(n.dbeta(i));
    }
  }
  void conv_backward(const cpu_context& ctx, conv& c, const host_tensor<G, 4>& dy, const host_tensor<S, 4>& x,
                     const conv2d_params& p) {
    conv2d_backward_data<Pc>(ctx, dy, c.w, c.dx, p);
    conv2d_backward_weights<Pc>(ctx, x, dy, c.dw, p);
    float* g = c.grad.data();
    const G* d = c.dw.data();
    for (std::size_t i = 0; i < c.grad.size(); ++i) g[i] += float(d[i]);
  }

  const host_tensor<S, 4>& forward(const cpu_context& ctx, const host_tensor<S, 4>& x) {
    conv2d<Pc>(ctx, x, c1.w, c1.y, s2p1);
    bn_forward(ctx, n1, c1.y);
    relu<Pe>(ctx, n1.y, a1);
    conv2d<Pc>(ctx, a1, c2.w, c2.y, p1);
    bn_forward(ctx, n2, c2.y);
    conv2d<Pc>(ctx, x, cp.w, cp.y, s2);
    bn_forward(ctx, np, cp.y);
    add<Pe>(ctx, n2.y, np.y, sum);
    relu<Pe>(ctx, sum, out);
    return out;
  }
  const host_tensor<G, 4>& backward(const cpu_context& ctx, const host_tensor<S, 4>& x, const host_tensor<G, 4>& dy) {
    relu_backward<Pe>(ctx, dy, sum, ds);
    bn_backward(ctx, np, ds, cp.y);
    conv_backward(ctx, cp, np.dx, x, s2);
    bn_backward(ctx, n2, ds, c2.y);
    conv_backward(ctx, c2, n2.dx, a1, p1);
    relu_backward<Pe>(ctx, c2.dx, n1.y, da1);
    bn_backward(ctx, n1, da1, c1.y);
    conv_backward(ctx, c1, n1.dx, x, s2p1);
    add<Pe>(ctx, c1.dx, cp.dx, dx);
    return dx;
  }
};

template <class T>
bool same_bits(const T& a, const T& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

template <class P>
void run(const char* name, std::size_t batch, std::size_t repeats, unsigned threads, precis_bench::table& out) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  const std::size_t hw = 56;
  const cpu_context ctx{threads};
  auto model = nn::build<S, 4>(P{}, basic_block(), {.seed = 1});
  by_hand<P> hand(batch, hw);
  hand.take(model);
  host_tensor<S, 4> x(std::array<std::size_t, 4>{batch, cin, hw, hw});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = S(float(int(i * 2654435761u % 2001) - 1000) / 500.0f);
  host_tensor<G, 4> dy(std::array<std::size_t, 4>{batch, cout, hw / 2, hw / 2});
  for (std::size_t i = 0; i < dy.size(); ++i) dy.data()[i] = G(float(int(i * 40503u % 2001) - 1000) / 1e5f);

  // Same work, same bits.
  const auto& ym = model.forward(ctx, x);
  const auto& yh = hand.forward(ctx, x);
  const auto& dxm = model.backward(ctx, dy);
  const auto& dxh = hand.backward(ctx, x, dy);
  if (!same_bits(ym, yh) || !same_bits(dxm, dxh)) {
    std::fprintf(stderr, "bench_nn_block: the built block and the hand-written calls differ\n");
    std::exit(1);
  }
  // Alternated rounds, so that both see the same machine state.
  double built = 1e30, hand_ms = 1e30;
  for (int round = 0; round < 3; ++round) {
    built = std::min(built, precis_bench::best_ms(
                                [&] {
                                  model.forward(ctx, x);
                                  model.backward(ctx, dy);
                                },
                                int(repeats)));
    hand_ms = std::min(hand_ms, precis_bench::best_ms(
                                    [&] {
                                      hand.forward(ctx, x);
                                      hand.backward(ctx, x, dy);
                                    },
                                    int(repeats)));
  }
  out.add({name, std::to_string(batch), std::to_string(threads), precis_bench::fixed(hand_ms, 2), precis_bench::fixed(built, 2),
           precis_bench::fixed(hand_ms / built, 3), precis_bench::cpu_model(), precis_bench::simd_name()});
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t batch = 4, repeats = 5;
  unsigned threads = 0;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) {
      batch = std::stoul(argv[++i]);
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::stoul(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = unsigned(std::stoul(argv[++i]));
    } else if (a == "--csv" && i + 1 < argc) {
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--batch N] [--repeats R] [--threads T] [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  precis_bench::print_machine();
  std::printf("ResNet-18 layer2.0 basic block (64 -> 128, stride 2, projection shortcut), forward + backward, "
              "best of %zu x 3\n\n",
              repeats);
  precis_bench::table t({"policy", "batch", "threads", "by_hand_ms", "build_ms", "ratio", "cpu", "simd"});
  const std::vector<unsigned> thread_counts = threads != 0 ? std::vector<unsigned>{threads} : std::vector<unsigned>{1, 2};
  for (unsigned th : thread_counts) {
    run<presets::fp32>("fp32", batch, repeats, th, t);
    run<presets::bf16_mixed>("bf16_mixed", batch, repeats, th, t);
    run<presets::fp16_mixed>("fp16_mixed", batch, repeats, th, t);
    run<presets::fp32_hardware>("fp32_hardware", batch, repeats, th, t);
    run<presets::fp16_hardware>("fp16_hardware", batch, repeats, th, t);
  }
  t.print();
  if (!csv.empty()) t.write_csv(csv);
  return 0;
}
