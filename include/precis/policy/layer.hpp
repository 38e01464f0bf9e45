/// @file
/// Layer tags: the operation kind a layer performs and what it declares about itself (activation
/// range, static GEMM shape), for per-layer policies.
#pragma once

#include <precis/policy/ops.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace precis {

/// Declares that a layer's activations reach `Bound` in magnitude (measured, or known
/// from the architecture). A storage type whose max is below it does not compile
/// (rule::activation_range): a ViT-H's activations exceed float16's 65504, so
/// `max_abs<200'000>` rules float16 out. The bound is an integer (floating-point template
/// arguments are not yet portable; the ranges that matter are whole numbers).
template <unsigned long long Bound>
struct max_abs {
  static_assert(Bound > 0, "precis: max_abs<Bound> needs a positive bound");
  static constexpr double value = double(Bound);  ///< The bound, as a double.
};

/// Declares a layer's matrix product as M x K times K x N, known at compile time, so that
/// the alignment tensor cores need can be checked (rule::fp8_alignment) or reported.
template <std::size_t M, std::size_t N, std::size_t K>
struct gemm_shape {
  /// Rows of the left operand and of the result.
  static constexpr std::size_t m = M, n = N, k = K;
  /** @var n
      Columns of the right operand and of the result. */
  /** @var k
      The summed dimension: columns of the left operand, rows of the right one. */
  /// True when every dimension is a multiple of `multiple`.
  static constexpr bool aligned_to(std::size_t multiple) {
    return M % multiple == 0 && N % multiple == 0 && K % multiple == 0;
  }
};

/// Base of layer tags: `struct attention_scores : precis::layer<op::matmul,
/// precis::max_abs<200'000>> {};`. A tag may also define `static constexpr std::string_view
/// name` for `describe`; otherwise its type name is printed.
template <op_kind Op, class... Properties>
struct layer {
  using op = Op;  ///< The operation kind, a tag from precis::op.
};

namespace detail {
template <class T>
struct is_max_abs : std::false_type {};
template <unsigned long long B>
struct is_max_abs<max_abs<B>> : std::true_type {};
template <class T>
struct is_gemm_shape : std::false_type {};
template <std::size_t M, std::size_t N, std::size_t K>
struct is_gemm_shape<gemm_shape<M, N, K>> : std::true_type {};

template <template <class> class Is, class... Ps>
struct find_property {
  using type = void;
};
template <template <class> class Is, class P, class... Ps>
struct find_property<Is, P, Ps...>
    : std::conditional_t<Is<P>::value, std::type_identity<P>, find_property<Is, Ps...>> {};

template <class Op, class... Ps>
constexpr auto properties_of(const layer<Op, Ps...>*) -> std::type_identity<layer<Op, Ps...>>;
template <class L>
using layer_base_t = typename decltype(properties_of(static_cast<const L*>(nullptr)))::type;

template <template <class> class Is, class Base>
struct property_of;
template <template <class> class Is, class Op, class... Ps>
struct property_of<Is, layer<Op, Ps...>> : find_property<Is, Ps...> {};
}  // namespace detail

/// A layer tag: derives from precis::layer<Op, Properties...>.
template <class L>
concept Layer = requires { typename L::op; } && op_kind<typename L::op> &&
                requires { detail::properties_of(static_cast<const L*>(nullptr)); };

/// A bound declared for a tag outside its definition: `measured_max_abs<Tag>::type` is
/// void, or a max_abs<...> that rule d (activation_range) checks as if the tag declared it
/// (the larger of the two where both do). The header precis::diagnostics::advise writes
/// specialises it with the range a monitored run measured; such a specialisation must be
/// seen before anything asks for the tag's policy (include it right after the tags).
template <class Tag>
struct measured_max_abs {
  using type = void;  ///< No measured bound; specialisations name a precis::max_abs.
};

namespace detail {
template <class A, class B>
struct larger_bound {
  using type = std::conditional_t<(A::value >= B::value), A, B>;
};
template <class A>
struct larger_bound<A, void> {
  using type = A;
};
template <class B>
struct larger_bound<void, B> {
  using type = B;
};
template <>
struct larger_bound<void, void> {
  using type = void;
};
}  // namespace detail

/// The layer's activation bound: its max_abs<...> property or its measured_max_abs, the
/// larger where both are given; void for none.
template <Layer L>
using activation_bound_t = typename detail::larger_bound<
    typename detail::property_of<detail::is_max_abs, detail::layer_base_t<L>>::type,
    typename measured_max_abs<L>::type>::type;
/// The layer's gemm_shape<...> property, or void.
template <Layer L>
using gemm_shape_t = typename detail::property_of<detail::is_gemm_shape, detail::layer_base_t<L>>::type;

}  // namespace precis
