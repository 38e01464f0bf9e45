/// @file
/// Operation kinds, as tag types, and which of them the numerical rules require to compute in fp32.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

namespace precis {
namespace op {

// Each kind names what a layer or kernel does. `fp32_rule` says the default rule set
// computes and accumulates it in fp32 (or wider) whatever the layer's policy says.
/// matrix products (linear layers, attention): tensor cores
struct matmul {
  static constexpr std::string_view name = "matmul";
  static constexpr bool fp32_rule = false;
};
/// convolutions, transposed convolutions
struct conv {
  static constexpr std::string_view name = "conv";
  static constexpr bool fp32_rule = false;
};
/// add, mul, relu, gelu, sigmoid, tanh, casts
struct elementwise {
  static constexpr std::string_view name = "elementwise";
  static constexpr bool fp32_rule = false;
};
/// max/avg pooling, upsampling
struct pooling {
  static constexpr std::string_view name = "pooling";
  static constexpr bool fp32_rule = false;
};
/// exp overflows above ~11.1 in float16
struct exp {
  static constexpr std::string_view name = "exp";
  static constexpr bool fp32_rule = true;
};
/// log of small float16 values underflows first
struct log {
  static constexpr std::string_view name = "log";
  static constexpr bool fp32_rule = true;
};
/// pow overflows and underflows like exp
struct pow {
  static constexpr std::string_view name = "pow";
  static constexpr bool fp32_rule = true;
};
/// exp plus a sum over a row
struct softmax {
  static constexpr std::string_view name = "softmax";
  static constexpr bool fp32_rule = true;
};
/// as softmax, and a log
struct log_softmax {
  static constexpr std::string_view name = "log_softmax";
  static constexpr bool fp32_rule = true;
};
/// as softmax
struct logsumexp {
  static constexpr std::string_view name = "logsumexp";
  static constexpr bool fp32_rule = true;
};
/// mean and variance over many elements
struct layer_norm {
  static constexpr std::string_view name = "layer_norm";
  static constexpr bool fp32_rule = true;
};
/// as layer_norm, plus running statistics
struct batch_norm {
  static constexpr std::string_view name = "batch_norm";
  static constexpr bool fp32_rule = true;
};
/// as layer_norm
struct group_norm {
  static constexpr std::string_view name = "group_norm";
  static constexpr bool fp32_rule = true;
};
/// every loss: sums and logs of many terms
struct loss {
  static constexpr std::string_view name = "loss";
  static constexpr bool fp32_rule = true;
};
/// sums, means, norms over many elements
struct reduction {
  static constexpr std::string_view name = "reduction";
  static constexpr bool fp32_rule = true;
};

}  // namespace op

/// True for the operation kinds above (and for user kinds that provide `name` and
/// `fp32_rule` the same way).
template <class T>
concept op_kind = requires {
  { T::name } -> std::convertible_to<std::string_view>;
  { T::fp32_rule } -> std::convertible_to<bool>;
};

/// True for the kinds whose storage may be float8: the inputs of matrix products and
/// convolutions.
template <class Op>
inline constexpr bool is_gemm_like_v = std::is_same_v<Op, op::matmul> || std::is_same_v<Op, op::conv>;

}  // namespace precis
