/// @file
/// What the CPU kernels of elementwise.hpp, reduce.hpp, softmax.hpp, loss.hpp and norm.hpp share:
/// the math type a policy gives, conversion of blocks of elements to and from it, argument checks,
/// and the thread split over rows. Private to precis (namespace precis::detail).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/policy/policy.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace precis::detail {

/// The arithmetic of the float SIMD math (vmath) under policy P: fused multiply-adds where
/// the build targets them for policies with the hardware's products, every product
/// rounded on its own for exact ones (see vmath::exact_arith).
template <Policy P>
using arith_t = std::conditional_t<std::is_same_v<typename P::products_type, products::hardware>,
                                   vmath::fused_arith, vmath::exact_arith>;

/// The built-in type a kernel of kind Op under P does its arithmetic in: opmath of the
/// rule set's compute type promoted with the element types of the inputs, so that a double
/// tensor is never computed in float and float16 with bfloat16 meets in float.
template <op_kind Op, Policy P, class... Ts>
using math_t = opmath_t<promote_t<typename kernel_policy_t<Op, P>::compute_type, Ts...>>;

/// The type a kernel of kind Op under P keeps its sums in.
template <op_kind Op, Policy P>
using accumulate_t = typename kernel_policy_t<Op, P>::accumulate_type;

/// Below this many elements per thread a thread is not worth starting (about 10 us of work).
inline constexpr std::size_t elements_per_thread = std::size_t(1) << 15;

/// Elements converted at a time: small enough for the stack and L1, large enough for the
/// vectorised array conversions.
inline constexpr std::size_t block_size = 256;

/// One element as the math type M.
template <class M, class T>
constexpr M load(T x) {
  if constexpr (precis_format<T>) {
    return static_cast<M>(float(x));
  } else {
    return static_cast<M>(x);
  }
}

/// `n` elements as the math type M (the array conversion decodes formats vectorised;
/// bfloat16, float's upper half, by a shift written out here, which the compiler inlines
/// and vectorises: short rows pay no call).
template <class M, class T>
void load_block(const T* src, M* dst, std::size_t n) {
  if constexpr (std::is_same_v<M, float> && std::is_same_v<T, bfloat16>) {
    for (std::size_t i = 0; i < n; ++i) {
      dst[i] = std::bit_cast<float>(std::uint32_t(src[i].bits()) << 16);
    }
  } else if constexpr (std::is_same_v<M, float> && precis_format<T>) {
    precis::convert(std::span<const T>(src, n), std::span<M>(dst, n));
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = load<M>(src[i]);
  }
}

/// `n` math values rounded once each to T (nearest-even, overflow to infinity, as
/// round_to does).
template <class T, class M>
void store_block(const M* src, T* dst, std::size_t n) {
  if constexpr (std::is_same_v<M, float> && precis_format<T>) {
    precis::convert(std::span<const M>(src, n), std::span<T>(dst, n));
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = round_to<T>(src[i]);
  }
}

/// Adds `x` (a math value) to a running sum kept in Acc. A double value is rounded to a
/// float accumulator explicitly: the policy chose float sums.
template <class Acc, class M>
constexpr void accumulate(accumulator<Acc>& acc, M x) {
  acc.add(static_cast<typename accumulator<Acc>::value_type>(x));
}

/// The floats of `n` elements at src for a row kernel's float path: src itself where T is
/// float (read in place, no copy), else load_block's conversion into `scratch` (n floats).
template <class T>
const float* float_view(const T* src, float* scratch, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    load_block(src, scratch, n);
    return scratch;
  }
}

/// out[i] = f(a[i], b[i], ...) over n elements, f taking and giving vmath vectors, each
/// result rounded once to Y as store_block rounds it: written directly where Y is float,
/// rounded in registers where Y is bfloat16 (vmath::store_upper_half, the same rounding),
/// through blocks of `block_size` and store_block otherwise. out may be one of the
/// inputs when Y is float.
template <class Y, class F, class... In>
void map_store(Y* out, std::size_t n, F f, const In*... in) {
  using vmath::lanes;
  if constexpr (std::is_same_v<Y, float>) {
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) vmath::store(out + i, f(vmath::load(in + i)...));
    if (i < n) vmath::store_partial(out + i, f(vmath::load_partial(in + i, n - i)...), n - i);
  } else if constexpr (std::is_same_v<Y, bfloat16>) {
    auto* bits = reinterpret_cast<std::uint16_t*>(out);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      vmath::store_upper_half<bfloat16::format>(bits + i, f(vmath::load(in + i)...));
    }
    if (i < n) {
      vmath::store_upper_half<bfloat16::format>(bits + i, f(vmath::load_partial(in + i, n - i)...),
                                                n - i);
    }
  } else {
    std::array<float, block_size> res;
    for (std::size_t b = 0; b < n; b += block_size) {
      const std::size_t len = std::min(block_size, n - b);
      map_store(res.data(), len, f, (in + b)...);
      store_block(res.data(), out + b, len);
    }
  }
}

/// Calls f(start, len, out, in...) over [0, n) in blocks of `block_size`, with each input
/// block converted to M and `out` (M) rounded to `Out` afterwards; blocks are shared among
/// threads. Inputs already of type M are read in place and an output of type M is written
/// in place (f computes element j from the inputs' element j only, so an output that is
/// also an input is fine). Every element is computed alone, so results do not depend on
/// the split.
template <class M, class Out, class F, class... In>
void map_blocks(const cpu_context& ctx, std::size_t n, Out* out, F&& f, const In*... in) {
  parallel_for(ctx, n, elements_per_thread, [&](std::size_t begin, std::size_t end) {
    std::array<std::array<M, block_size>, sizeof...(In) == 0 ? 1 : sizeof...(In)> bufs;
    std::array<M, block_size> res;
    for (std::size_t i = begin; i < end; i += block_size) {
      const std::size_t len = std::min(block_size, end - i);
      M* dst = res.data();
      if constexpr (std::is_same_v<Out, M>) dst = out + i;
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        const auto view = [&](const auto* p, M* buf) -> const M* {
          if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(p)>>, M>) {
            return p;
          } else {
            load_block(p, buf, len);
            return buf;
          }
        };
        f(i, len, dst, view(in + i, bufs[K].data())...);
      }(std::index_sequence_for<In...>{});
      if constexpr (!std::is_same_v<Out, M>) store_block(res.data(), out + i, len);
    }
  });
}

/// Calls f(begin, end) over rows [0, rows) of `cols` elements each, on as many threads as
/// pay for themselves. Rows are independent, so results do not depend on the split.
template <class F>
void for_rows(const cpu_context& ctx, std::size_t rows, std::size_t cols, F&& f) {
  const std::size_t per_thread =
      std::max<std::size_t>(1, elements_per_thread / std::max<std::size_t>(1, cols));
  parallel_for(ctx, rows, per_thread, std::forward<F>(f));
}

/// Rows per run for the row kernels: consecutive rows of about 2048 elements in all (at
/// least one row), so that short rows (attention scores, a transformer's activations) are
/// converted to and from their math type a run at a time and the SIMD work of a run's rows
/// overlaps. Rows stay independent: results do not depend on the runs.
inline std::size_t row_run(std::size_t cols) {
  return std::max<std::size_t>(1, 2048 / std::max<std::size_t>(1, cols));
}

/// Number of elements of a tensor's shape.
template <class X>
std::size_t element_count(const X& t) {
  std::size_t n = 1;
  for (auto d : t.shape()) n *= std::size_t(d);
  return n;
}

/// The extent of the last axis (1 for rank 0) and the number of rows before it.
template <class X>
std::pair<std::size_t, std::size_t> rows_and_cols(const X& t) {
  if (t.dimension() == 0) return {1, 1};
  const std::size_t cols = std::size_t(t.shape()[t.dimension() - 1]);
  std::size_t rows = 1;
  for (std::size_t i = 0; i + 1 < t.dimension(); ++i) rows *= std::size_t(t.shape()[i]);
  return {rows, cols};
}

/// A tensor's shape as a std::array (for check_shape).
template <std::size_t N, class X>
std::array<std::size_t, N> shape_array(const X& t) {
  std::array<std::size_t, N> s{};
  for (std::size_t i = 0; i < N; ++i) s[i] = std::size_t(t.shape()[i]);
  return s;
}

/// The shape with axis `axis` removed.
template <std::size_t N, class X>
std::array<std::size_t, N - 1> shape_without(const X& t, std::size_t axis) {
  std::array<std::size_t, N - 1> s{};
  for (std::size_t i = 0, j = 0; i < N; ++i) {
    if (i != axis) s[j++] = std::size_t(t.shape()[i]);
  }
  return s;
}

/// Throws precis::error unless `t` has at least one element: the kernels' means and
/// statistics are undefined on empty input, and a silent NaN would hide the mistake.
template <class X>
void check_not_empty(std::string_view what, const X& t) {
  if (element_count(t) == 0) {
    throw error(std::string(what) + " is empty (shape " + shape_string(t.shape()) + ")");
  }
}

/// Throws precis::error unless `ok`, with `what` ("precis::layer_norm: eps") and `why`.
inline void check_argument(bool ok, std::string_view what, std::string_view why) {
  if (!ok) throw error(std::string(what) + " " + std::string(why));
}

}  // namespace precis::detail
