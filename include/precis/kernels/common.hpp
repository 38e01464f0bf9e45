/// @file
/// How kernels read a policy. Shared by every kernel family.
///
/// A kernel for operation kind Op under policy P runs under apply_rules_t<Op, P> (the
/// default rule set): inputs arrive in their tensors' element types, arithmetic is done in
/// `opmath_t` of the compute type (float for float16, bfloat16, float8 and tfloat32, as
/// GPUs do), sums are kept in the accumulate type (rounded after every addition when that
/// type is narrower than float, so an unsafe float16 accumulator behaves as one), and each
/// output element is rounded once to its tensor's element type.
#pragma once

#include <precis/numeric/detail/unfused.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/policy/policy.hpp>

#include <type_traits>

namespace precis {

/// The policy a kernel of kind Op runs under when called with policy P.
template <op_kind Op, Policy P>
using kernel_policy_t = apply_rules_t<Op, P>;

/// The built-in type arithmetic of compute type T is carried out in: T itself when it is
/// float or wider, float otherwise.
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// A running sum kept in type Acc: exact float/double addition for those, and for a
/// narrower Acc the sum rounded to Acc after every addition. A term is taken as a rounded
/// value (a product passed in is never fused into the sum: see opaque).
template <class Acc>
class accumulator {
 public:
  /// The built-in type the sum is held and returned in (opmath_t of Acc).
  using value_type = opmath_t<Acc>;
  constexpr accumulator() = default;
  /// A sum starting at `v`, rounded to Acc.
  PRECIS_HOST_DEVICE constexpr explicit accumulator(value_type v) : sum_(round(v)) {}
  /// Adds `x` (an addition never fused with the product that made `x`), then rounds the sum
  /// to Acc.
  PRECIS_HOST_DEVICE constexpr void add(value_type x) { sum_ = round(detail::add(sum_, x)); }
  /// The sum so far (a value of Acc, held in value_type).
  PRECIS_HOST_DEVICE constexpr value_type value() const { return sum_; }

 private:
  PRECIS_HOST_DEVICE static constexpr value_type round(value_type v) {
    if constexpr (std::is_same_v<Acc, float> || std::is_same_v<Acc, double>) {
      return v;
    } else {
      return value_type(Acc(v));
    }
  }
  value_type sum_ = 0;
};

/// Rounds an opmath value once to the element type T of an output tensor.
template <class T, class V>
PRECIS_HOST_DEVICE constexpr T round_to(V v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<T>(v);
  } else {
    return T(v);
  }
}

namespace detail {

/// A strided copy of rank R: to[sum i_k to_k] = from[sum i_k from_k] for every index
/// (i_0, ..., i_{R-1}) of `shape` (strides in elements; a source stride 0 repeats). The
/// data layers' permutations, gathers and broadcasts on the device are one launch of it
/// each (context_traits<cuda_context>::strided_copy), and the host tests run the same plans
/// through copy_offsets to check them against the host layers.
template <std::size_t R>
struct copy_plan {
  std::size_t shape[R];  ///< the extent of each axis
  std::size_t from[R];   ///< the source's stride of each axis
  std::size_t to[R];     ///< the destination's stride of each axis
  /// Elements copied: the product of the extents.
  PRECIS_HOST_DEVICE constexpr std::size_t elements() const {
    std::size_t n = 1;
    for (std::size_t k = 0; k < R; ++k) n *= shape[k];
    return n;
  }
};

/// The source and destination offsets of element e (row-major over the plan's shape).
template <std::size_t R>
PRECIS_HOST_DEVICE constexpr void copy_offsets(const copy_plan<R>& p, std::size_t e, std::size_t& from,
                                               std::size_t& to) {
  from = 0;
  to = 0;
  for (std::size_t k = R; k-- > 0;) {
    const std::size_t i = e % p.shape[k];
    e /= p.shape[k];
    from += i * p.from[k];
    to += i * p.to[k];
  }
}

/// Runs a copy plan on the host, one element at a time (the reference the device's launch
/// is tested against).
template <std::size_t R, class T>
void run_copy_plan(const copy_plan<R>& p, const T* from, T* to) {
  const std::size_t n = p.elements();
  for (std::size_t e = 0; e < n; ++e) {
    std::size_t a = 0, b = 0;
    copy_offsets(p, e, a, b);
    to[b] = from[a];
  }
}

}  // namespace detail

/// An element type a kernel accepts: float, double or a precis format.
template <class T>
concept kernel_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                         detail::precis_format<T>;

}  // namespace precis
