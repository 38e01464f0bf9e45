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

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace precis {

/// How a convolution's images (x, y and their gradients) are laid out: `nchw` [N, C, H, W]
/// (PyTorch's default), or `nhwc` [N, H, W, C], channels-last (PyTorch's
/// channels_last memory format, oneDNN's nhwc), where a pixel's channels are contiguous.
/// Weights are [Co, C / groups, KH, KW] either way. The layout changes where values are,
/// never a result: channels-last gives the same bits as NCHW for the same policy, machine
/// and thread count. It is the fast one for the CPU's bfloat16 convolutions (no transposes).
enum class image_layout { nchw, nhwc };

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

/// The copy plan that moves each of `count` row-major rows x cols matrices to cols x rows:
/// to[(n * cols + j) * rows + i] = from[(n * rows + i) * cols + j]. NHWC images to NCHW are
/// (N, H * W, C); a convolution's weight [O, I, KH, KW] to [O, KH, KW, I] is (O, I, KH * KW).
/// The destination is walked in order.
constexpr copy_plan<3> transpose_plan(std::size_t count, std::size_t rows, std::size_t cols) {
  return {{count, cols, rows}, {rows * cols, 1, cols}, {rows * cols, rows, 1}};
}

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

/// n / d and n % d for 32-bit n and a fixed divisor 1 <= d <= 2^31, by a multiply-high, an
/// addition and a shift (Granlund and Montgomery's round-up method: q = (hi(n m) + n) >> s
/// with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, the sum taken in 64 bits so
/// that it holds for every 32-bit n). The magic number is made once, on the host; the
/// device's index arithmetic then divides without a division instruction (a 64-bit
/// division is a long emulated sequence on a GPU). The host tests check it against `/` and
/// `%`.
struct fast_divmod {
  std::uint32_t divisor = 1;  ///< d
  std::uint32_t magic = 1;    ///< m
  std::uint32_t shift = 0;    ///< s
  /// Division by 1.
  constexpr fast_divmod() = default;
  /// Division by d (1 <= d <= 2^31: is_fast() says so).
  PRECIS_HOST_DEVICE constexpr explicit fast_divmod(std::uint32_t d) : divisor(d) {
    while (shift < 32 && (std::uint64_t(1) << shift) < d) ++shift;
    magic = std::uint32_t(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift) - d)) / d + 1);
  }
  /// Whether d can be divided by so.
  static constexpr bool fits(std::uint64_t d) { return d >= 1 && d <= (std::uint64_t(1) << 31); }
  /// n / d.
  PRECIS_HOST_DEVICE constexpr std::uint32_t div(std::uint32_t n) const {
    const std::uint64_t hi = (std::uint64_t(n) * magic) >> 32;
    return std::uint32_t((hi + n) >> shift);
  }
  /// n % d.
  PRECIS_HOST_DEVICE constexpr std::uint32_t mod(std::uint32_t n) const { return n - div(n) * divisor; }
};

/// A copy plan whose element count fits 32 bits and whose extents fit fast_divmod: its
/// index decomposes by multiplications (the device's strided copies use it where it fits).
template <std::size_t R>
struct fast_copy_plan {
  fast_divmod shape[R];  ///< the extent of each axis, as divisors
  std::size_t from[R];   ///< the source's stride of each axis
  std::size_t to[R];     ///< the destination's stride of each axis
};

/// Whether plan p fits fast_copy_plan (fewer than 2^32 elements, each extent at most 2^31).
template <std::size_t R>
constexpr bool fits_fast(const copy_plan<R>& p) {
  if (p.elements() > 0xffffffffULL) return false;
  for (std::size_t k = 0; k < R; ++k) {
    if (!fast_divmod::fits(p.shape[k])) return false;
  }
  return true;
}

/// p as a fast_copy_plan (fits_fast(p) must hold).
template <std::size_t R>
constexpr fast_copy_plan<R> make_fast(const copy_plan<R>& p) {
  fast_copy_plan<R> f{};
  for (std::size_t k = 0; k < R; ++k) {
    f.shape[k] = fast_divmod(std::uint32_t(p.shape[k]));
    f.from[k] = p.from[k];
    f.to[k] = p.to[k];
  }
  return f;
}

/// copy_offsets for a fast_copy_plan: the same offsets for element e < 2^32.
template <std::size_t R>
PRECIS_HOST_DEVICE constexpr void copy_offsets(const fast_copy_plan<R>& p, std::uint32_t e, std::size_t& from,
                                               std::size_t& to) {
  from = 0;
  to = 0;
  for (std::size_t k = R; k-- > 0;) {
    const std::uint32_t q = p.shape[k].div(e);
    const std::uint32_t i = e - q * p.shape[k].divisor;
    e = q;
    from += std::size_t(i) * p.from[k];
    to += std::size_t(i) * p.to[k];
  }
}

/// Where the planes (one image's channel) of the device's image kernels lie, indexed in 32
/// bits by multiplications (fast_divmod): NCHW, each plane contiguous; or channels-last with
/// `channels` channels, a plane's pixels `channels` apart. Planes are h x w in the input and
/// ho x wo in the output. Threads take elements in the tensor's own order; split() gives an
/// element's image, channel and pixel.
struct plane_index {
  using index_type = std::uint32_t;
  std::uint32_t channels = 1;
  bool last = false;  ///< channels-last
  std::uint32_t h = 1, w = 1, ho = 1, wo = 1;
  fast_divmod by_channels, by_in, by_out, by_w, by_wo;  // in: h w, out: ho wo

  /// Distance between neighbouring pixels of a plane.
  PRECIS_HOST_DEVICE constexpr std::uint32_t stride() const { return last ? channels : 1; }
  /// Element i of a tensor of planes of by.divisor pixels: its image (NCHW: its plane),
  /// channel (channels-last; else 0) and pixel in the plane.
  PRECIS_HOST_DEVICE constexpr void split(std::uint32_t i, const fast_divmod& by, std::uint32_t& image,
                                          std::uint32_t& c, std::uint32_t& pixel) const {
    if (!last) {
      image = by.div(i);
      c = 0;
      pixel = i - image * by.divisor;
    } else {
      const std::uint32_t rest = by_channels.div(i);
      c = i - rest * channels;
      image = by.div(rest);
      pixel = rest - image * by.divisor;
    }
  }
  /// The first element of the plane of (image, c) in a tensor of planes of `pixels`.
  PRECIS_HOST_DEVICE constexpr std::uint32_t first(std::uint32_t image, std::uint32_t c, std::uint32_t pixels) const {
    return last ? image * pixels * channels + c : image * pixels;
  }
  /// Output element i: the offset of its plane's first element in the input, and its row
  /// and column.
  PRECIS_HOST_DEVICE constexpr void output(std::uint32_t i, std::uint32_t& x_first, std::uint32_t& oy,
                                           std::uint32_t& ox) const {
    std::uint32_t image = 0, c = 0, o = 0;
    split(i, by_out, image, c, o);
    oy = by_wo.div(o);
    ox = o - oy * wo;
    x_first = first(image, c, h * w);
  }
  /// The offset of output pixel (oy, ox) from its plane's first element.
  PRECIS_HOST_DEVICE constexpr std::uint32_t out_at(std::uint32_t oy, std::uint32_t ox) const {
    return (oy * wo + ox) * stride();
  }
  /// Input element i: the offsets of its plane's first element in the input and in the
  /// output, its pixel in the plane, and its row and column.
  PRECIS_HOST_DEVICE constexpr void locate_input(std::uint32_t i, std::uint32_t& x_first, std::uint32_t& o_first,
                                                 std::uint32_t& at, std::uint32_t& iy, std::uint32_t& ix) const {
    std::uint32_t image = 0, c = 0;
    split(i, by_in, image, c, at);
    iy = by_w.div(at);
    ix = at - iy * w;
    x_first = first(image, c, h * w);
    o_first = first(image, c, ho * wo);
  }

 protected:
  /// Whether `planes` planes of these sizes fit: each tensor below 2^32 elements, and each
  /// divisor within fast_divmod's range.
  static constexpr bool planes_fit(std::uint64_t planes, std::uint64_t h, std::uint64_t w, std::uint64_t ho,
                                   std::uint64_t wo, std::uint64_t channels) {
    constexpr std::uint64_t limit = 0xffffffffULL;
    const auto divisor = [](std::uint64_t d) { return fast_divmod::fits(d); };
    return planes > 0 && planes <= limit && divisor(h) && divisor(w) && divisor(ho) && divisor(wo) &&
           divisor(channels) && divisor(h * w) && divisor(ho * wo) && planes * h * w <= limit &&
           planes * ho * wo <= limit;
  }
  /// Sets the layout and the planes' sizes (planes_fit must hold).
  constexpr void set_planes(std::uint64_t in_h, std::uint64_t in_w, std::uint64_t out_h, std::uint64_t out_w,
                            std::uint64_t channel_count, bool channels_last) {
    channels = std::uint32_t(channel_count);
    last = channels_last;
    h = std::uint32_t(in_h);
    w = std::uint32_t(in_w);
    ho = std::uint32_t(out_h);
    wo = std::uint32_t(out_w);
    by_channels = fast_divmod(channels);
    by_in = fast_divmod(h * w);
    by_out = fast_divmod(ho * wo);
    by_w = fast_divmod(w);
    by_wo = fast_divmod(wo);
  }
};

/// Nearest upsampling's index arithmetic (planes of h x w in, ho x wo out) by
/// multiplications, for the device's kernels where both tensors have fewer than 2^32
/// elements (fits): the generic kernels divide in 64 bits five or six times an element.
/// source() is an output element's input, outputs() the outputs an input element's gradient
/// gathers, both in the tensors' own element order; the host tests check them against the
/// 64-bit formulas and a brute-force search.
struct nearest_index : plane_index {
  fast_divmod by_h, by_ho;

  /// Whether planes of these sizes fit: each tensor below 2^32 elements, the products the
  /// outputs' bounds take ((h + 1) (ho + 1), (w + 1) (wo + 1)) too, and each divisor within
  /// fast_divmod's range.
  static constexpr bool fits(std::uint64_t planes, std::uint64_t h, std::uint64_t w, std::uint64_t ho,
                             std::uint64_t wo, std::uint64_t channels) {
    constexpr std::uint64_t limit = 0xffffffffULL;
    return planes_fit(planes, h, w, ho, wo, channels) && (h + 1) * (ho + 1) <= limit &&
           (w + 1) * (wo + 1) <= limit;
  }
  /// The indexer of these sizes (fits must hold).
  static constexpr nearest_index make(std::uint64_t h, std::uint64_t w, std::uint64_t ho, std::uint64_t wo,
                                      std::uint64_t channels, bool last) {
    nearest_index n;
    n.set_planes(h, w, ho, wo, channels, last);
    n.by_h = fast_divmod(n.h);
    n.by_ho = fast_divmod(n.ho);
    return n;
  }
  /// The offset in the input of output element i's source: input row oy h / ho, column
  /// ox w / wo (the host's).
  PRECIS_HOST_DEVICE constexpr std::uint32_t source(std::uint32_t i) const {
    std::uint32_t x_first = 0, oy = 0, ox = 0;
    output(i, x_first, oy, ox);
    const std::uint32_t iy = by_ho.div(oy * h), ix = by_wo.div(ox * w);
    return x_first + (iy * w + ix) * stride();
  }
  /// For input element i: the offset in the output of its plane's first element, and the
  /// output rows [oy0, oy1) and columns [ox0, ox1) whose source it is.
  PRECIS_HOST_DEVICE constexpr void outputs(std::uint32_t i, std::uint32_t& base, std::uint32_t& oy0,
                                            std::uint32_t& oy1, std::uint32_t& ox0, std::uint32_t& ox1) const {
    std::uint32_t x_first = 0, at = 0, iy = 0, ix = 0;
    locate_input(i, x_first, base, at, iy, ix);
    // The outputs o with o * in / outs == i: [ceil(i outs / in), ceil((i + 1) outs / in)).
    oy0 = by_h.div(iy * ho + h - 1);
    oy1 = by_h.div((iy + 1) * ho + h - 1);
    ox0 = by_w.div(ix * wo + w - 1);
    ox1 = by_w.div((ix + 1) * wo + w - 1);
    if (oy1 > ho) oy1 = ho;
    if (ox1 > wo) ox1 = wo;
  }
};

/// Bilinear upsampling's index arithmetic (planes of h x w in, ho x wo out) by
/// multiplications, for the device's kernels where both tensors have fewer than 2^32
/// elements (fits): output() places an output element, locate_input() an input element, in
/// the tensors' own element order (the taps themselves are precis::detail::bilinear_taps,
/// the host's). The generic kernels divide in 64 bits four times an element; the host tests
/// check these against the 64-bit formulas.
struct resample_index : plane_index {
  /// Whether planes of these sizes fit: each tensor below 2^32 elements, and each divisor
  /// within fast_divmod's range.
  static constexpr bool fits(std::uint64_t planes, std::uint64_t h, std::uint64_t w, std::uint64_t ho,
                             std::uint64_t wo, std::uint64_t channels) {
    return planes_fit(planes, h, w, ho, wo, channels);
  }
  /// The indexer of these sizes (fits must hold).
  static constexpr resample_index make(std::uint64_t h, std::uint64_t w, std::uint64_t ho, std::uint64_t wo,
                                       std::uint64_t channels, bool last) {
    resample_index n;
    n.set_planes(h, w, ho, wo, channels, last);
    return n;
  }
};

/// Pooling's index arithmetic (windows kh x kw, strides sh, sw, padding ph, pw over planes of
/// h x w in, ho x wo out) by multiplications, for the device's max and average pooling
/// kernels where both tensors have fewer than 2^32 elements (fits): the generic kernels
/// divide in 64 bits up to ten times an element. output() places an output element,
/// input() an input element and the outputs whose windows hold it (the gradient's gather),
/// both in the tensors' own element order; the host tests check them against the 64-bit
/// formulas and a brute-force search of the windows.
struct pool_index : plane_index {
  std::uint32_t kh = 1, kw = 1, ph = 0, pw = 0;
  fast_divmod by_sh, by_sw;  // the strides

  /// Whether these sizes fit: each tensor below 2^32 elements, each divisor within
  /// fast_divmod's range, and the padded coordinates the gather takes (up to h + ph + sh,
  /// w + pw + sw) below 2^32.
  static constexpr bool fits(std::uint64_t planes, std::uint64_t h, std::uint64_t w, std::uint64_t ho,
                             std::uint64_t wo, std::uint64_t channels, std::uint64_t kh, std::uint64_t kw,
                             std::uint64_t sh, std::uint64_t sw, std::uint64_t ph, std::uint64_t pw) {
    constexpr std::uint64_t limit = 0xffffffffULL;
    return planes_fit(planes, h, w, ho, wo, channels) && fast_divmod::fits(sh) && fast_divmod::fits(sw) &&
           kh <= limit && kw <= limit && ph <= limit && pw <= limit && h + ph + sh <= limit &&
           w + pw + sw <= limit;
  }
  /// The indexer of these sizes (fits must hold).
  static constexpr pool_index make(std::uint64_t h, std::uint64_t w, std::uint64_t ho, std::uint64_t wo,
                                   std::uint64_t channels, bool last, std::uint64_t kh, std::uint64_t kw,
                                   std::uint64_t sh, std::uint64_t sw, std::uint64_t ph, std::uint64_t pw) {
    pool_index n;
    n.set_planes(h, w, ho, wo, channels, last);
    n.kh = std::uint32_t(kh);
    n.kw = std::uint32_t(kw);
    n.ph = std::uint32_t(ph);
    n.pw = std::uint32_t(pw);
    n.by_sh = fast_divmod(std::uint32_t(sh));
    n.by_sw = fast_divmod(std::uint32_t(sw));
    return n;
  }
  /// Input element i: the offsets of its plane's first element in the input and in the
  /// output, its pixel in the plane, and the output rows [oy0, oy1) and columns [ox0, ox1)
  /// whose windows (before clipping to the input) hold it.
  PRECIS_HOST_DEVICE constexpr void input(std::uint32_t i, std::uint32_t& x_first, std::uint32_t& o_first,
                                          std::uint32_t& at, std::uint32_t& oy0, std::uint32_t& oy1,
                                          std::uint32_t& ox0, std::uint32_t& ox1) const {
    std::uint32_t iy = 0, ix = 0;
    locate_input(i, x_first, o_first, at, iy, ix);
    reading(iy, ph, kh, by_sh, ho, oy0, oy1);
    reading(ix, pw, kw, by_sw, wo, ox0, ox1);
  }

 private:
  // The outputs o along one axis with o s - pad <= i < o s - pad + k: [lo, hi).
  PRECIS_HOST_DEVICE static constexpr void reading(std::uint32_t i, std::uint32_t pad, std::uint32_t k,
                                                   const fast_divmod& by_s, std::uint32_t outs, std::uint32_t& lo,
                                                   std::uint32_t& hi) {
    const std::uint32_t top = i + pad;
    lo = top + 1 > k ? by_s.div(top + 1 - k + by_s.divisor - 1) : 0;
    hi = by_s.div(top) + 1;
    if (hi > outs) hi = outs;
  }
};

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

/// The count, mean and sum of squared distances to the mean (m2) of a set of values: batch
/// norm's statistics on the device (kernels/cuda/norm.hpp), x read once. Each block takes
/// the moments of its share of a channel in two passes over values it holds (the sum, the
/// mean, then the squared distances to that mean, as the host's two passes); the shares are
/// then joined by combine_moments.
template <class A>
struct moments {
  A count;  ///< values (a whole number; exact in float up to 2^24)
  A mean;
  A m2;  ///< the sum of (value - mean)^2
};

/// The moments of the union of two disjoint sets (Chan, Golub and LeVeque's update):
/// n = na + nb, d = mean_b - mean_a, mean = mean_a + d nb / n, m2 = m2_a + m2_b + d^2 na nb / n.
/// Its error stays of the order of the operands' rounding whatever the means' distance from
/// zero, as the two-pass formula's, unlike a sum of squares less n mean^2. An empty operand
/// gives the other one unchanged.
template <class A>
PRECIS_HOST_DEVICE constexpr moments<A> combine_moments(const moments<A>& a, const moments<A>& b) {
  if (b.count == A(0)) return a;
  if (a.count == A(0)) return b;
  const A n = a.count + b.count;
  const A d = b.mean - a.mean;
  const A wb = b.count / n;
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * (a.count * wb)};
}

/// combine_moments under the accumulate type Acc: the joined mean and m2 rounded to Acc, as
/// every addition of a sum in Acc is (nothing for float and double).
template <class Acc>
PRECIS_HOST_DEVICE constexpr moments<typename accumulator<Acc>::value_type> combine_moments_in(
    const moments<typename accumulator<Acc>::value_type>& a, const moments<typename accumulator<Acc>::value_type>& b) {
  auto m = combine_moments(a, b);
  m.mean = accumulator<Acc>(m.mean).value();
  m.m2 = accumulator<Acc>(m.m2).value();
  return m;
}

/// The first pass of the device's column reductions (column_sums, layer norm's dgamma and
/// dbeta, channels-last channel sums: kernels/cuda/reduce.hpp) gives a block 32 threads
/// across, each `width` columns wide, and a slab of rows; it aims at no fewer blocks than
/// this, where its rows allow. A constant, not the device's SM count, so that the order of
/// the additions depends on the shape alone.
inline constexpr std::size_t column_min_blocks = 256;

/// Rows per slab of a column reduction of `rows` x `cols` whose threads read `width`
/// columns each: `most` (the caller's largest slab), halved while the first pass would have
/// fewer than column_min_blocks blocks and the slab has more than `least` rows. `most` and
/// `least` are powers of two, least <= most; the result is one of most, most / 2, ..., least,
/// and depends on the arguments alone. Without it a channels-last batch norm of 512 channels
/// at 20 x 20, batch 16 (6,400 rows in slabs of 4,096) ran 4 blocks, each thread adding 512
/// rows in turn.
constexpr std::size_t column_slab_rows_for(std::size_t rows, std::size_t cols, std::size_t width, std::size_t most,
                                           std::size_t least) {
  const std::size_t across = (cols + 32 * width - 1) / (32 * width);  // blocks across the columns
  std::size_t slab = most;
  while (slab > least && across * ((rows + slab - 1) / slab) < column_min_blocks) slab /= 2;
  return slab;
}

/// The device's row kernels (softmax, log-softmax, layer norm, cross-entropy: kernels/cuda)
/// hold a row of at most resident_row_limit columns in registers: a warp per row (several
/// rows per block) up to warp_row_limit columns, a block per row beyond. Their geometry is
/// here, host and device alike, so that host tests check that it covers every column once.
inline constexpr std::size_t warp_row_limit = 1024;
inline constexpr std::size_t resident_row_limit = 8192;

/// How a row of the device's row kernels is held: by `threads` threads (a warp's 32, or a
/// block of 64 to 512), each with `slots` values.
struct resident_rows {
  bool per_warp;     ///< a warp per row (several rows per block), else a block per row
  unsigned threads;  ///< threads per row
  int slots;         ///< values each thread holds: 8, 16 or 32
};

/// The geometry of a row of `cols` (1 .. resident_row_limit) columns: a warp of 8 slots a
/// lane up to 256 columns, of 32 up to warp_row_limit; beyond, the smallest block of 64 to
/// 512 threads that leaves each at most 16 columns, 16 slots each.
constexpr resident_rows resident_rows_for(std::size_t cols) {
  if (cols <= warp_row_limit) return {true, 32, cols <= 32 * 8 ? 8 : 32};
  unsigned threads = 64;
  while (threads < 512 && std::size_t(threads) * 16 < cols) threads *= 2;
  return {false, threads, 16};
}

/// Rows each row group (a warp, or a block) of the device's row kernels takes, for `rows`
/// rows in blocks of `groups_per_block` groups: 4, 2 or 1, the most that leaves at least
/// resident_min_blocks blocks (a few waves of blocks on any GPU). A group reads its next row
/// while it reduces and writes the one before; which group takes a row never changes its
/// result.
inline constexpr std::size_t resident_min_blocks = 512;
PRECIS_HOST_DEVICE constexpr std::size_t resident_rows_per_group(std::size_t rows, std::size_t groups_per_block) {
  std::size_t r = 4;
  while (r > 1 && rows < r * groups_per_block * resident_min_blocks) r /= 2;
  return r;
}

/// Groups of V consecutive columns a thread with `slots` values holds (at least one: a
/// group is one access of V elements).
PRECIS_HOST_DEVICE constexpr int resident_groups(int slots, int v) { return slots < v ? 1 : slots / v; }

/// The first of the V columns of group i of thread `rank` of a row's `threads`: a warp's 32
/// threads read 32 consecutive groups.
PRECIS_HOST_DEVICE constexpr std::size_t slot_column(int i, unsigned rank, unsigned threads, int v) {
  return (std::size_t(i) * threads + rank) * std::size_t(v);
}

/// Layer norm's backward pass on the device sums dgamma's and dbeta's columns in the same
/// pass that computes dx (kernels/cuda/norm.hpp's layer_norm_backward_fused), where the sums
/// fit a block's shared memory: each thread adds its slots' two terms of each of its rows
/// into its own shared-memory places, and the block then writes one partial sum per column
/// for its rows. dy and x are read once in all, not once more for the column sums.
/// Dynamic shared memory per block: for warp rows 48 KiB, what a kernel may take without
/// opting in to more (they use no static shared memory); for a block per row 32 KiB, which
/// leaves the block reductions' static arrays room below 48 KiB.
inline constexpr std::size_t fused_norm_warp_shared_bytes = 48 * 1024;
inline constexpr std::size_t fused_norm_block_shared_bytes = 32 * 1024;
inline constexpr std::size_t fused_norm_max_groups = 8;        ///< warps per block for warp rows
inline constexpr std::size_t fused_norm_most_block_rows = 64;  ///< rows per block at most

/// The fused backward's geometry for `rows` rows of `cols` (1 .. resident_row_limit) columns,
/// read `v` columns per access, sums of `acc_bytes` bytes. The launch takes the blocks from
/// the widest pack, so that the order of the additions does not depend on whether a call's
/// pointers allow 16-byte reads, and `used` from the width it reads: one column per access
/// needs no more places than the widest pack's (the columns rounded up to threads, not to
/// threads times v).
struct fused_norm_rows {
  std::size_t groups;        ///< row groups per block (warps; 1 for a block per row); 0: the sums do not fit
  std::size_t used;          ///< groups of v slots a thread fills: those that reach below the row's end
  std::size_t block_rows;    ///< rows per block: one partial sum per column and block
  std::size_t shared_bytes;  ///< dynamic shared memory per block
};

/// Groups of v slots of a row's `threads` threads, `slots` values each, that reach below
/// column `cols` (fused_norm_rows::used; the kernel takes it from here too).
PRECIS_HOST_DEVICE constexpr std::size_t fused_norm_used(std::size_t cols, unsigned threads, int slots, int v) {
  const std::size_t held = std::size_t(resident_groups(slots, v));
  const std::size_t per_group = std::size_t(threads) * std::size_t(v);  // columns of one slot group
  const std::size_t reach = (cols + per_group - 1) / per_group;
  return reach < held ? reach : held;
}

/// A row group's shared memory holds, for k = 0 (dgamma's term) and 1 (dbeta's), `used`
/// groups of v slots of each of its threads: place (k * used * v + s) * threads + rank for
/// slot s of thread `rank` (resident_rows_for's threads), so that a warp's 32 threads touch
/// 32 consecutive places. A block holds as many warps as fit fused_norm_warp_shared_bytes, at
/// most fused_norm_max_groups; a block per row, the one block where it fits
/// fused_norm_block_shared_bytes. So float sums fuse rows of up to 4096 columns, double sums
/// rows of up to 2048, whatever the width. Rows per block: from
/// fused_norm_most_block_rows, halved while the grid would have fewer than column_min_blocks
/// blocks, down to the block's groups. It depends on the arguments alone, and so the order of
/// each column's additions (a group's rows in order, then the groups in order, then the
/// blocks) on the shape and the types alone.
constexpr fused_norm_rows fused_norm_rows_for(std::size_t rows, std::size_t cols, int v, std::size_t acc_bytes) {
  const resident_rows g = resident_rows_for(cols);
  const std::size_t per_group = std::size_t(g.threads) * std::size_t(v);
  const std::size_t used = fused_norm_used(cols, g.threads, g.slots, v);
  const std::size_t group_bytes = 2 * used * per_group * acc_bytes;
  const std::size_t most = g.per_warp ? fused_norm_max_groups : 1;
  const std::size_t fit = (g.per_warp ? fused_norm_warp_shared_bytes : fused_norm_block_shared_bytes) / group_bytes;
  const std::size_t groups = fit < most ? fit : most;
  if (groups == 0) return {0, used, 0, 0};
  std::size_t block_rows = fused_norm_most_block_rows;
  while (block_rows / 2 >= groups && (rows + block_rows - 1) / block_rows < column_min_blocks) block_rows /= 2;
  return {groups, used, block_rows, groups * group_bytes};
}

/// The device's reductions along an axis (x viewed as [outer, count, inner], each output
/// element the reduction of its `count` values in k order, the host's order) stage their
/// inputs through shared memory where count >= axis_stage_min_count: a block of
/// axis_stage_threads threads loads a tile of `outputs` output elements by `ks` of their k
/// values (axis_stage_bytes in all) with coalesced loads, the next tile's loads in flight
/// while one thread per output adds the tile's values in k order. The tile's geometry is
/// here, host and device alike, so that host tests check that a stage's loads cover the
/// tile once and that the adding threads read shared memory without bank conflicts.
inline constexpr unsigned axis_stage_threads = 256;
inline constexpr std::size_t axis_stage_bytes = 16384;
inline constexpr std::size_t axis_stage_min_count = 64;

/// Output elements per tile: 32 where there are at least 8192 outputs (256 tiles or more),
/// else 16, so that the tiles of 4096 outputs still fill an H100's 132 SMs twice.
constexpr unsigned axis_tile_outputs(std::size_t outputs) { return outputs >= 8192 ? 32 : 16; }

/// The tile of `Outputs` output elements of Size-byte values: `Rows` where inner == 1 (an
/// output's k values are contiguous in memory, and a tile row in shared memory, padded by
/// four bytes so that the adding threads, one per row, hit 32 different banks), else
/// columns (a k value's outputs are contiguous in memory and in shared memory).
template <bool Rows, unsigned Outputs, std::size_t Size>
struct axis_tile {
  /// Elements of a tile, and of its k values per output.
  static constexpr unsigned elements = unsigned(axis_stage_bytes / Size);
  static constexpr unsigned ks = elements / Outputs;
  /// Elements each thread loads per stage.
  static constexpr unsigned per_thread = elements / axis_stage_threads;
  /// Shared-memory elements between two outputs' rows (Rows) or two k values (columns).
  static constexpr unsigned pitch = Rows ? ks + (Size >= 4 ? 1U : unsigned(4 / Size)) : Outputs;
  /// Shared-memory elements of the tile.
  static constexpr unsigned size = Rows ? Outputs * pitch : ks * Outputs;
  /// Rows: threads per tile row (a row's k values are read `lanes` at a time), and the rows
  /// that the block's threads read at once.
  static constexpr unsigned lanes = ks < axis_stage_threads ? ks : axis_stage_threads;
  static constexpr unsigned rows_at_once = axis_stage_threads / lanes;
  /// Which of the tile's values thread t's load n (0 .. per_thread - 1) is: output j, k value
  /// kk. Rows: `lanes` consecutive threads read consecutive values of a row, load n + 1 the
  /// next `lanes` values of the row or, past its end, the row rows_at_once further on;
  /// columns: consecutive threads read consecutive outputs of one k value, load n + 1 the k
  /// value axis_stage_threads / Outputs further on. Either way the address of load n + 1 is
  /// that of load n plus a constant, so a thread keeps one pointer.
  PRECIS_HOST_DEVICE static constexpr void place(unsigned t, unsigned n, unsigned& j, unsigned& kk) {
    if constexpr (Rows) {
      constexpr unsigned per_row = ks / lanes;  // loads per row and thread
      j = n / per_row * rows_at_once + t / lanes;
      kk = n % per_row * lanes + t % lanes;
    } else {
      j = t % Outputs;
      kk = t / Outputs + n * (axis_stage_threads / Outputs);
    }
  }
  /// Where value (j, kk) lies in shared memory.
  PRECIS_HOST_DEVICE static constexpr unsigned offset(unsigned j, unsigned kk) {
    return Rows ? j * pitch + kk : kk * pitch + j;
  }
};

}  // namespace detail

/// An element type a kernel accepts: float, double or a precis format.
template <class T>
concept kernel_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                         detail::precis_format<T>;

}  // namespace precis
