// precis::sgd, precis::adamw and the dynamic scaler against PyTorch's own trajectories,
// bit for bit. The trajectories come from tests/data/torch_golden/make_golden.py (torch on
// the CPU; the files record its version): for every step a 64-bit hash of all weights'
// bits (or the scale's bits), and every weight after the last step. The weights and
// gradients are exactly representable floats generated here by the script's formula.
#include <precis/optim/optim.hpp>
#include <precis/scaling/scaling.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef PRECIS_TORCH_GOLDEN_DIR
#error "PRECIS_TORCH_GOLDEN_DIR must name tests/data/torch_golden"
#endif

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// make_golden.py's value(): 0 with probability 1/64, else m * 2^-(23 + e), exactly.
float value(std::uint64_t seed, std::uint64_t step, std::uint64_t tensor, std::uint64_t index, std::uint64_t max_exp) {
  const std::uint64_t h = mix(mix(mix(seed + step) + tensor) + index);
  if (((h >> 4) & 63) == 0) return 0.0f;
  const auto m = static_cast<std::int64_t>(h >> 40) - (std::int64_t(1) << 23);
  const auto e = static_cast<int>(h % max_exp);
  return std::ldexp(static_cast<float>(m), -(23 + e));
}

std::uint64_t fnv(const std::vector<std::vector<float>>& ts) {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (const auto& t : ts) {
    for (float x : t) h = (h ^ std::bit_cast<std::uint32_t>(x)) * 0x100000001B3ULL;
  }
  return h;
}

// A golden file: `key value...` lines (comments start with '#'); `hash`, `scale` and
// `final` lines are collected in order.
struct golden {
  std::map<std::string, std::string> keys;
  std::vector<std::uint64_t> hashes;
  std::vector<std::pair<bool, std::uint32_t>> scales;
  std::vector<std::uint32_t> final_bits;

  explicit golden(const std::string& name) {
    const std::string path = std::string(PRECIS_TORCH_GOLDEN_DIR) + "/" + name + ".txt";
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      std::string key;
      ls >> key;
      if (key == "hash") {
        std::string h;
        ls >> h;
        hashes.push_back(std::stoull(h, nullptr, 16));
      } else if (key == "scale") {
        int found = 0;
        std::string bits;
        ls >> found >> bits;
        scales.emplace_back(found != 0, static_cast<std::uint32_t>(std::stoul(bits, nullptr, 16)));
      } else if (key == "final") {
        std::string w;
        while (ls >> w) final_bits.push_back(static_cast<std::uint32_t>(std::stoul(w, nullptr, 16)));
      } else {
        std::string rest;
        std::getline(ls >> std::ws, rest);
        keys[key] = rest;
      }
    }
  }
  double real(const std::string& k) const { return std::strtod(at(k).c_str(), nullptr); }  // hex floats too
  std::uint64_t integer(const std::string& k) const { return std::stoull(at(k)); }
  std::vector<std::uint64_t> list(const std::string& k) const {
    std::istringstream ls(at(k));
    std::vector<std::uint64_t> v;
    for (std::uint64_t x; ls >> x;) v.push_back(x);
    return v;
  }
  const std::string& at(const std::string& k) const {
    auto it = keys.find(k);
    REQUIRE_MESSAGE(it != keys.end(), "golden file lacks '" << k << "'");
    return it->second;
  }
};

template <class Optimizer, class Options>
void replay(const std::string& name, Options options) {
  INFO("golden trajectory " << name);
  const golden g(name);
  const auto seed = g.integer("seed"), steps = g.integer("steps");
  const auto sizes = g.list("sizes"), decay_flags = g.list("decay");
  REQUIRE(g.hashes.size() == steps);
  std::vector<std::vector<float>> w(sizes.size());
  std::vector<std::span<float>> masters;
  std::vector<bool> decay;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::uint64_t i = 0; i < sizes[t]; ++i) w[t].push_back(value(seed, 0, t, i, 4));
    masters.emplace_back(w[t]);
    decay.push_back(decay_flags.at(t) != 0);
  }
  Optimizer opt(masters, options, decay);
  std::uint64_t first_mismatch = 0;
  for (std::uint64_t step = 1; step <= steps; ++step) {
    std::vector<std::vector<float>> grads(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      for (std::uint64_t i = 0; i < sizes[t]; ++i) grads[t].push_back(value(seed, step, t, i, 20));
    }
    opt.step(grads);
    if (first_mismatch == 0 && fnv(w) != g.hashes[step - 1]) first_mismatch = step;
  }
  std::size_t same = 0, total = 0;
  for (const auto& t : w) {
    for (float x : t) same += total < g.final_bits.size() && std::bit_cast<std::uint32_t>(x) == g.final_bits[total], ++total;
  }
  CHECK_MESSAGE(first_mismatch == 0, "weights differ from PyTorch's first at step " << first_mismatch);
  CHECK(total == g.final_bits.size());
  CHECK_MESSAGE(same == total, same << " of " << total << " final weights are PyTorch's bits");
}

precis::adamw_options adamw_from(const golden& g) {
  return {.lr = g.real("lr"), .beta1 = g.real("beta1"), .beta2 = g.real("beta2"), .eps = g.real("eps"),
          .weight_decay = g.real("weight_decay")};
}

precis::sgd_options sgd_from(const golden& g) {
  return {.lr = g.real("lr"), .momentum = g.real("momentum"), .dampening = g.real("dampening"),
          .weight_decay = g.real("weight_decay"), .nesterov = g.integer("nesterov") != 0};
}

}  // namespace

TEST_CASE("adamw gives torch.optim.AdamW's bits at every step") {
  for (const char* name : {"adamw_defaults", "adamw_custom", "adamw_large_lr"}) {
    replay<precis::adamw>(name, adamw_from(golden(name)));
  }
}

TEST_CASE("sgd gives torch.optim.SGD's bits at every step") {
  for (const char* name : {"sgd_plain", "sgd_momentum", "sgd_nesterov", "sgd_dampening"}) {
    replay<precis::sgd>(name, sgd_from(golden(name)));
  }
}

TEST_CASE("the dynamic scaler gives GradScaler's scale at every step, for any factors") {
  struct finite_only {
    void step(std::vector<float>&) {}
  } opt;
  for (std::string name : {"scaler_defaults", "scaler_inexact_factors", "scaler_tenth"}) {
    INFO("golden trajectory " << name);
    const golden g(name);
    precis::dynamic_scaler_options o;
    o.init_scale = static_cast<float>(g.real("init_scale"));
    o.growth_factor = g.real("growth_factor");
    o.backoff_factor = g.real("backoff_factor");
    o.growth_interval = static_cast<std::uint32_t>(g.integer("growth_interval"));
    o.min_scale = std::numeric_limits<float>::denorm_min();  // PyTorch has no bounds
    precis::dynamic_scaler scaler(o);
    REQUIRE(g.scales.size() == g.integer("steps"));
    for (std::size_t i = 0; i < g.scales.size(); ++i) {
      const bool found_inf = g.scales[i].first;  // no structured binding: clang 14's doctest macros cannot capture one
      const std::uint32_t bits = g.scales[i].second;
      std::vector<float> grad{found_inf ? INFINITY : 0.0f};
      const auto r = scaler.step(opt, scaler.scaled_gradients(std::move(grad)));
      REQUIRE(r.found_inf == found_inf);
      REQUIRE_MESSAGE(std::bit_cast<std::uint32_t>(r.scale_after) == bits,
                      "step " << i + 1 << ": " << r.scale_after << " vs PyTorch's " << std::bit_cast<float>(bits));
    }
  }
}
