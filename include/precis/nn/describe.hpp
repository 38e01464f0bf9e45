/// @file
/// A built model as a table, with the same policy columns as precis::describe<Layers...>(map)
/// (policy/describe.hpp): one row function serves both.
#pragma once

#include <precis/kernels/gemm.hpp>
#include <precis/nn/build.hpp>
#include <precis/policy/describe.hpp>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

namespace detail {

template <class T>
struct is_cast_layer : std::false_type {};
template <class In, class Out, class GIn, class GOut, std::size_t R, class Ctx>
struct is_cast_layer<cast_layer<In, Out, GIn, GOut, R, Ctx>> : std::true_type {};

/// A piece's name in paths: its tag's name, or the tag's kind for positional tags.
template <class Tag>
std::string path_name_or_kind() {
  if constexpr (positional_tag_v<Tag>) {
    return std::string(Tag::name);
  } else {
    return std::string(path_name<Tag>());
  }
}

inline std::string byte_string(std::size_t bytes) {
  char buf[32];
  if (bytes < 10 * 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else if (bytes < 10 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  }
  return buf;
}

}  // namespace detail

/// The model as a table: for each layer its path, kind and shape, then the policy columns of
/// precis::describe (tag, operation kind, storage / compute / accumulate / master /
/// gradient, float8 recipe, the map entry that decided it, waived rules, notes such as
/// "fp32 by rule", "hardware products", or on attention's pieces "fused (cuDNN flash
/// attention)" where nn::attention_layer::fused, or on a batch norm "one pass with the next
/// relu" where nn::sequence fuses the two), its parameter count and bytes; every cast build
/// inserted, with the conversion it makes; then totals, and, when a layer uses hardware
/// products, the engine that runs them here (precis::cpu_products_engine(), and
/// precis::cpu_float_products_engine() for float and float16 storage).
template <class Root, class Map>
std::string describe(const model<Root, Map>& m) {
  std::vector<std::vector<std::string>> rows{{"path", "kind", "shape", "layer", "op", "storage", "compute",
                                              "accumulate", "master", "gradient", "fp8", "from", "waived", "notes",
                                              "params", "bytes"}};
  std::set<std::string> fused_first;  // layers that run in one pass with the next (a sequence's)
  walk(m.root(), std::string(m.root().name()), [&](const std::string& path, const auto& node) {
    using N = std::remove_cvref_t<decltype(node)>;
    if constexpr (requires { N::fuses_with_next(std::size_t(0)); }) {
      std::size_t i = 0;
      N::for_each_child(node, [&](std::string_view component, const auto&) {
        if (N::fuses_with_next(i)) fused_first.insert(join_path(path, component));
        ++i;
      });
    }
    if constexpr (leaf<N>) {
      std::size_t count = 0, bytes = 0;
      for_each_parameter_of(node, [&](std::string_view, const auto& p) {
        count += p.size();
        bytes += p.bytes();
      });
      std::vector<std::string> row{path_or_root(path), std::string(N::kind), node.shape()};
      if constexpr (requires { typename N::piece_tags; }) {
        // A layer made of tagged pieces (attention): a row for each piece under its path.
        [&]<class... Tags>(std::type_identity<std::tuple<Tags...>>) {
          bool first = true;
          std::size_t index = 0;
          (
              [&] {
                std::vector<std::string> piece{join_path(path, detail::path_name_or_kind<Tags>()), std::string(N::kind),
                                               first ? node.shape() : "-"};
                for (auto& c : precis::detail::describe_row<Tags, Map>()) piece.push_back(std::move(c));
                // Attention's scores, softmax and context (pieces 1 to 3) in one fused kernel.
                if constexpr (requires { N::fused; }) {
                  if (N::fused && index >= 1 && index <= 3) {
                    auto& notes = piece.back();
                    notes = (notes.empty() || notes == "-" ? "" : notes + "; ") + "fused (cuDNN flash attention)";
                  }
                }
                ++index;
                piece.push_back(first ? std::to_string(count) : "");
                piece.push_back(first ? (count == 0 ? "-" : detail::byte_string(bytes)) : "");
                rows.push_back(std::move(piece));
                first = false;
              }(),
              ...);
        }(std::type_identity<typename N::piece_tags>{});
        return;
      } else if constexpr (has_policy<N>) {
        static_assert(std::is_same_v<typename N::policy_type, policy_for_t<typename N::tag_type, Map>>);
        for (auto& c : precis::detail::describe_row<typename N::tag_type, Map>()) row.push_back(std::move(c));
        if (fused_first.contains(path)) {
          auto& notes = row.back();
          notes = (notes.empty() || notes == "-" ? "" : notes + "; ") + "one pass with the next relu";
        }
      } else {
        row.insert(row.end(), {std::string(precis::detail::layer_name<typename N::tag_type>()), "-",
                               std::string(type_name_v<typename N::output_type>), "-", "-", "-",
                               std::string(type_name_v<typename N::output_grad_type>), "-", "-", "-", "-"});
      }
      row.push_back(std::to_string(count));
      row.push_back(count == 0 ? "-" : detail::byte_string(bytes));
      rows.push_back(std::move(row));
    } else if constexpr (detail::is_cast_layer<N>::value) {
      rows.push_back({path_or_root(path), "cast", node.shape(), "-", "-",
                      std::string(type_name_v<typename N::output_type>), "-", "-", "-",
                      std::string(type_name_v<typename N::output_grad_type>) + "->" +
                          std::string(type_name_v<typename N::input_grad_type>),
                      "-", "build", "-", "inserted cast", "0", "-"});
    } else if constexpr (!composite<N> && requires { N::kind; node.shape(); } &&
                         !std::is_same_v<N, identity_layer<typename N::input_type, typename N::input_grad_type,
                                                           N::input_rank, typename N::context_type>>) {
      // Layers that only move data (reshape, patchify, ...): no policy of their own.
      rows.push_back({path_or_root(path), std::string(N::kind), node.shape(), "-", "-",
                      std::string(type_name_v<typename N::output_type>), "-", "-", "-",
                      std::string(type_name_v<typename N::output_grad_type>), "-", "-", "-", "-", "0", "-"});
    }
  });
  // Which engines this build and CPU give the layers whose products are the hardware's:
  // float and float16 inputs (storage float or float16) run on oneDNN's float kernels,
  // others on its bfloat16 ones.
  const auto column = [&](std::string_view name) {
    return std::size_t(std::find(rows.front().begin(), rows.front().end(), name) -
                       rows.front().begin());
  };
  const std::size_t storage = column("storage"), notes = column("notes");
  bool hardware_float = false, hardware_other = false;
  for (const auto& r : rows) {
    if (r.size() > notes && r[notes].find("hardware products") != std::string::npos) {
      (r[storage] == "float" || r[storage] == "float16" ? hardware_float : hardware_other) = true;
    }
  }
  std::vector<std::string> total(rows.front().size(), "");
  total[0] = "total";
  total[total.size() - 2] = std::to_string(m.parameter_count());
  total[total.size() - 1] = detail::byte_string(m.parameter_bytes());
  rows.push_back(std::move(total));
  std::string table = precis::detail::format_table(rows);
  if (hardware_other) table += "hardware products run on: " + cpu_products_engine() + "\n";
  if (hardware_float) {
    table +=
        "hardware products with float or float16 inputs run on: " + cpu_float_products_engine() +
        "\n";
  }
  return table;
}

}  // namespace precis::nn
