/// @file
/// The resolved policies of a model's layers, as a table.
#pragma once

#include <precis/policy/map.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace precis {

namespace detail {

/// The name of a type as the compiler spells it (GCC and Clang), without namespaces'
/// noise removed: "head", "my_model::encoder".
template <class T>
constexpr std::string_view type_name() {
  std::string_view f = __PRETTY_FUNCTION__;
  const auto start = f.find("T = ") + 4;
  const auto end = f.find_first_of(";]", start);
  return f.substr(start, end - start);
}

template <class L>
constexpr std::string_view layer_name() {
  if constexpr (requires { std::string_view(L::name); }) {
    return L::name;
  } else {
    return type_name<L>();
  }
}

template <class... Rules>
std::string rule_names(rule_list<Rules...>) {
  std::string s;
  ((s += (s.empty() ? "" : ","), s += Rules::name), ...);
  return s.empty() ? "-" : s;
}

inline std::string_view source_name(policy_source s) {
  switch (s) {
    case policy_source::layer_override: return "layer";
    case policy_source::op_override: return "op";
    case policy_source::default_policy: return "default";
  }
  return "?";
}

template <Layer L, class Map>
std::vector<std::string> describe_row() {
  using r = resolution<L, Map>;
  using P = typename r::type;
  using G = typename r::given;
  using Op = typename L::op;
  std::string notes;
  auto note = [&](std::string_view n) {
    if (!notes.empty()) notes += "; ";
    notes += n;
  };
  if (!std::is_same_v<typename P::compute_type, typename G::compute_type> ||
      !std::is_same_v<typename P::accumulate_type, typename G::accumulate_type>) {
    note("fp32 by rule");
  }
  if (!std::is_same_v<typename P::storage_type, typename G::storage_type>) {
    note("float8 stays in matrix products");
  }
  if constexpr (is_gemm_like_v<Op> &&
                std::is_same_v<typename P::products_type, products::hardware>) {
    note("hardware products");
  }
  if constexpr (is_gemm_like_v<Op> && is_float8_v<typename P::storage_type>) {
    note("float8 product inputs, " + std::string(type_name_v<typename P::compute_type>) + " between layers");
  }
  if constexpr (!std::is_void_v<activation_bound_t<L>>) {
    char bound[48];
    std::snprintf(bound, sizeof bound, "activations up to %g", activation_bound_t<L>::value);
    note(bound);
  }
  if constexpr (!std::is_void_v<gemm_shape_t<L>>) {
    using S = gemm_shape_t<L>;
    constexpr bool sixteen_bit = sizeof(typename P::storage_type) == 2;
    if (is_gemm_like_v<Op> && sixteen_bit && !S::aligned_to(8)) {
      note("performance: M, N, K not all multiples of 8 (tensor cores run slower)");
    }
  }
  return {std::string(layer_name<L>()),
          std::string(Op::name),
          std::string(type_name_v<typename P::storage_type>),
          std::string(type_name_v<typename P::compute_type>),
          std::string(type_name_v<typename P::accumulate_type>),
          std::string(type_name_v<typename P::master_type>),
          std::string(type_name_v<typename P::gradient_type>),
          std::string(P::fp8_recipe::name),
          std::string(source_name(r::source)),
          rule_names(typename P::waived_rules{}),
          notes.empty() ? "-" : notes};
}

inline std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace detail

/// The table of the layers' resolved policies under `map`: layer, operation kind, the
/// five types, float8 recipe, which map entry applied, waived rules, and notes (rules that
/// changed the policy, declared bounds, performance warnings).
///
///     std::cout << precis::describe<encoder, head>(policies);
template <Layer... Ls, class Map>
std::string describe(Map) {
  std::vector<std::vector<std::string>> rows{{"layer", "op", "storage", "compute", "accumulate",
                                              "master", "gradient", "fp8", "from", "waived",
                                              "notes"}};
  (rows.push_back(detail::describe_row<Ls, Map>()), ...);
  return detail::format_table(rows);
}

/// One policy on one line: "storage=bfloat16 compute=bfloat16 accumulate=float ...".
template <Policy P>
std::string describe_policy() {
  return "storage=" + std::string(type_name_v<typename P::storage_type>) +
         " compute=" + std::string(type_name_v<typename P::compute_type>) +
         " accumulate=" + std::string(type_name_v<typename P::accumulate_type>) +
         " master=" + std::string(type_name_v<typename P::master_type>) +
         " gradient=" + std::string(type_name_v<typename P::gradient_type>) +
         " fp8=" + std::string(P::fp8_recipe::name) +
         " products=" + std::string(P::products_type::name) +
         " waived=" + detail::rule_names(typename P::waived_rules{});
}

}  // namespace precis
