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
  static constexpr std::string_view name = "matmul";  ///< Printed name.
  static constexpr bool fp32_rule = false;  ///< Keeps its policy's compute types.
};
/// convolutions, transposed convolutions
struct conv {
  static constexpr std::string_view name = "conv";  ///< Printed name.
  static constexpr bool fp32_rule = false;  ///< Keeps its policy's compute types.
};
/// add, mul, relu, gelu, sigmoid, tanh, casts
struct elementwise {
  static constexpr std::string_view name = "elementwise";  ///< Printed name.
  static constexpr bool fp32_rule = false;  ///< Keeps its policy's compute types.
};
/// max/avg pooling, upsampling
struct pooling {
  static constexpr std::string_view name = "pooling";  ///< Printed name.
  static constexpr bool fp32_rule = false;  ///< Keeps its policy's compute types.
};
/// exp overflows above ~11.1 in float16
struct exp {
  static constexpr std::string_view name = "exp";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// log of small float16 values underflows first
struct log {
  static constexpr std::string_view name = "log";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// pow overflows and underflows like exp
struct pow {
  static constexpr std::string_view name = "pow";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// exp plus a sum over a row
struct softmax {
  static constexpr std::string_view name = "softmax";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// as softmax, and a log
struct log_softmax {
  static constexpr std::string_view name = "log_softmax";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// as softmax
struct logsumexp {
  static constexpr std::string_view name = "logsumexp";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// mean and variance over many elements
struct layer_norm {
  static constexpr std::string_view name = "layer_norm";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// as layer_norm, plus running statistics
struct batch_norm {
  static constexpr std::string_view name = "batch_norm";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// as layer_norm
struct group_norm {
  static constexpr std::string_view name = "group_norm";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// every loss: sums and logs of many terms
struct loss {
  static constexpr std::string_view name = "loss";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
};
/// sums, means, norms over many elements
struct reduction {
  static constexpr std::string_view name = "reduction";  ///< Printed name.
  static constexpr bool fp32_rule = true;  ///< Computes and accumulates in fp32 or wider.
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
