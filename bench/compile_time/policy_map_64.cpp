// Compile-time cost of policy maps: a map with 64 layer overrides (and a few operation
// kind overrides), every layer resolved and checked. Compare with baseline.cpp, which
// includes the same headers and resolves nothing (bench/compile_time.py).
#include <precis/policy/policy.hpp>

#include <cstddef>
#include <utility>

namespace bench {

using namespace precis;

template <std::size_t I>
struct block : layer<op::matmul, gemm_shape<64 * (I % 4 + 1), 128, 256>, max_abs<1000 + I>> {};
struct norm : layer<op::layer_norm> {};
struct loss : layer<op::loss> {};

// Overrides alternate between three policies so that resolution has real work.
template <std::size_t I>
constexpr auto override_for() {
  if constexpr (I % 3 == 0) {
    return for_layer<block<I>>(presets::bf16_mixed{});
  } else if constexpr (I % 3 == 1) {
    return for_layer<block<I>>(presets::fp32{});
  } else {
    return for_layer<block<I>>(presets::tf32{});
  }
}

template <std::size_t... I>
constexpr auto make_map(std::index_sequence<I...>) {
  return make_policy_map(presets::fp16_mixed{}, for_op<op::loss>(presets::fp32{}),
                         for_op<op::elementwise>(presets::bf16_mixed{}), override_for<I>()...);
}

constexpr auto policies = make_map(std::make_index_sequence<64>{});

template <std::size_t... I>
constexpr std::size_t resolve_all(std::index_sequence<I...>) {
  // Each resolution instantiates the layer's checks.
  return (sizeof(policy_for_t<block<I>, decltype(policies)>) + ... + 0) +
         sizeof(policy_for_t<norm, decltype(policies)>) + sizeof(policy_for_t<loss, decltype(policies)>);
}

static_assert(resolve_all(std::make_index_sequence<64>{}) == 66);

}  // namespace bench

int main() { return 0; }
