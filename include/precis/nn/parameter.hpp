/// @file
/// A trainable tensor, and the small pieces every layer shares.
///
/// A parameter keeps three tensors: the master weights in the policy's master type (float;
/// what the optimizer updates), a working copy in the storage type that the kernels read
/// (cast once per step by `refresh()`; when the storage type is the master type the master
/// is read directly and no copy is kept), and the gradient in the master type.
///
/// Gradient semantics: each backward pass rounds a parameter's gradient once to the
/// policy's gradient type (so a float16 gradient overflows or underflows as float16 does)
/// and adds it to the master-type gradient, where micro-batches accumulate and where
/// unscaling, clipping and the optimizer work — as mixed-precision training keeps its
/// fp32 gradients next to fp32 master weights.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cast.hpp>
#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

/// The tensor type a module on context `Ctx` holds, how it is passed (`ref`), and the few
/// operations nn needs besides the kernels (`io`). Specialised for each context: host
/// tensors for cpu_context here, device tensors for cuda_context in precis/nn/cuda.hpp.
template <class Ctx>
struct context_traits;

/// The context traits of precis::cpu_context: modules on the CPU hold precis::host_tensor
/// and run the CPU kernels.
template <>
struct context_traits<cpu_context> {
  /// The tensor type modules on the CPU hold: `host_tensor<T, N>`.
  template <class T, std::size_t N>
  using tensor = host_tensor<T, N>;
  /// How modules take the context.
  using ref = const cpu_context&;
  /// How a model hands out its master weights and gradients: host spans.
  template <class T>
  using span = std::span<T>;

  /// Sets every element to v.
  template <class T, std::size_t N>
  static void fill(host_tensor<T, N>& t, T v) {
    t.fill(v);
  }
  /// Sets every element to zero, in the context's order (on the CPU: now).
  template <class T, std::size_t N>
  static void zero(ref, host_tensor<T, N>& t) {
    t.fill(T(0));
  }
  /// Copies host values in (values.size() == t.size()).
  template <class T, std::size_t N>
  static void upload(host_tensor<T, N>& t, const std::vector<T>& values) {
    std::copy(values.begin(), values.end(), t.begin());
  }
  /// The values, on the host.
  template <class T, std::size_t N>
  static std::vector<T> download(const host_tensor<T, N>& t) {
    return std::vector<T>(t.begin(), t.end());
  }
  /// to[0, n) = from[0, n) (the reshaping layers' copies).
  template <class T>
  static void copy(ref, const T* from, T* to, std::size_t n) {
    std::copy(from, from + n, to);
  }
  /// sum += part elementwise, in sum's type (part already rounded to its own type).
  template <class M, class G, std::size_t N>
  static void accumulate(ref ctx, host_tensor<M, N>& sum, const host_tensor<G, N>& part) {
    // The elementwise kernel converts blocks of 16-bit values with the vector unit.
    precis::add<policy<G, float, float, float, G>>(ctx, sum, part, sum);
  }
  /// out = in converted, each value rounded once (nearest-even).
  template <class In, class Out, std::size_t N>
  static void cast(ref ctx, const host_tensor<In, N>& in, host_tensor<Out, N>& out) {
    precis::cast(ctx, in, out);
  }
  /// out = the sum of the inputs, added in float (double for double tensors) and rounded once.
  template <class Out, std::size_t N, class... In>
  static void add_rounded(ref ctx, host_tensor<Out, N>& out, const host_tensor<In, N>&... in) {
    if constexpr (sizeof...(In) == 2) {
      // Two terms (a residual): the elementwise kernel, which converts in vector blocks.
      [&](const auto& a, const auto& b) { precis::add<policy<Out, float, float, float, Out>>(ctx, a, b, out); }(in...);
    } else {
      using A = std::conditional_t<(std::is_same_v<Out, double> || ... || std::is_same_v<In, double>), double, float>;
      Out* o = out.data();
      precis::detail::parallel_for(ctx, out.size(), std::size_t(1) << 15, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) o[i] = round_to<Out>((A(0) + ... + static_cast<A>(in.data()[i])));
      });
    }
  }
  /// out = a - b elementwise, in float (double for double tensors) and rounded once
  /// (nn::subtract).
  template <class T, std::size_t N>
  static void subtract_rounded(ref ctx, host_tensor<T, N>& out, const host_tensor<T, N>& a,
                               const host_tensor<T, N>& b) {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* pa = a.data();
    const T* pb = b.data();
    T* o = out.data();
    precis::detail::parallel_for(ctx, out.size(), std::size_t(1) << 15, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) o[i] = round_to<T>(static_cast<A>(pa[i]) - static_cast<A>(pb[i]));
    });
  }
  /// y[n, c, ...] = round(sums[n, c, ...] + bias[c]): a convolution's bias added to its sums
  /// (kept in the math type M) and rounded once to y's type; with image_layout::nhwc the
  /// channels are the last axis, y[n, h, w, c] = round(sums[n, h, w, c] + bias[c]).
  template <class M, class S, std::size_t N>
  static void add_channel_bias(ref ctx, const host_tensor<M, N>& sums, const host_tensor<S, 1>& bias,
                               host_tensor<S, N>& y, image_layout layout = image_layout::nchw) {
    const std::size_t channels = bias.size();
    const S* b = bias.data();
    if (layout == image_layout::nhwc) {
      const std::size_t pixels = channels == 0 ? 0 : sums.size() / channels;
      precis::detail::for_rows(ctx, pixels, channels, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t q = lo; q < hi; ++q) {
          const M* from = sums.data() + q * channels;
          S* to = y.data() + q * channels;
          for (std::size_t c = 0; c < channels; ++c) to[c] = round_to<S>(from[c] + precis::detail::load<M>(b[c]));
        }
      });
      return;
    }
    const std::size_t planes = std::size_t(sums.shape()[0]) * channels;
    const std::size_t pixels = planes == 0 ? 0 : sums.size() / planes;
    precis::detail::for_rows(ctx, planes, pixels, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t plane = lo; plane < hi; ++plane) {
        const M shift = precis::detail::load<M>(b[plane % channels]);
        const M* from = sums.data() + plane * pixels;
        S* to = y.data() + plane * pixels;
        for (std::size_t q = 0; q < pixels; ++q) to[q] = round_to<S>(from[q] + shift);
      }
    });
  }
  /// out = -in elementwise (exact in every format).
  template <class T, std::size_t N>
  static void negate(ref, const host_tensor<T, N>& in, host_tensor<T, N>& out) {
    const T* from = in.data();
    T* to = out.data();
    for (std::size_t i = 0; i < in.size(); ++i) to[i] = T(-from[i]);
  }
  /// Copies the elements plan `p` names (precis::detail::copy_plan of rank 2 with unit inner
  /// strides: `p.shape[0]` rows of `p.shape[1]` contiguous elements), row by row: the
  /// concatenations' parts.
  template <class T>
  static void copy_rows(std::string_view, ref, const T* from, T* to, const precis::detail::copy_plan<2>& p) {
    for (std::size_t r = 0; r < p.shape[0]; ++r) std::copy_n(from + r * p.from[0], p.shape[1], to + r * p.to[0]);
  }
  /// y = f(x) elementwise under policy P, for the function object Fn; `name` prefixes the
  /// messages of the errors it throws.
  template <Policy P, template <class> class Fn, class X, class Y, std::size_t N>
  static void unary(std::string_view name, ref ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
    precis::detail::unary<P, Fn>(name, ctx, x, y);
  }
  /// dx = g(dy, x) elementwise under policy P, for the gradient function object Fn (g is dy
  /// times f'(x)): the backward pass of unary().
  template <Policy P, template <class> class Fn, class DY, class X, class DX, std::size_t N>
  static void unary_backward(std::string_view name, ref ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                             host_tensor<DX, N>& dx) {
    precis::detail::unary_backward<P, Fn>(name, ctx, dy, x, dx);
  }
};

/// A rank-N tensor of T on context Ctx.
template <class Ctx, class T, std::size_t N>
using tensor_t = typename context_traits<Ctx>::template tensor<T, N>;

/// How modules on context Ctx take it: `const cpu_context&`, `cuda_context&`.
template <class Ctx>
using context_ref_t = typename context_traits<Ctx>::ref;

namespace detail {

/// A value no parameter's working copy has had before in this process (see
/// parameter::version).
inline std::uint64_t next_parameter_version() {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace detail

/// A trainable tensor of rank N on context Ctx: master weights and gradient in M (float or
/// double), the working copy in S. Its buffers never move: assigning a parameter copies the
/// values into the existing storage, so an optimizer holding spans of the master weights
/// stays valid when a checkpoint is loaded into the model.
template <class S, class M, std::size_t N, class Ctx = cpu_context>
class parameter {
  static_assert(std::is_same_v<M, float> || std::is_same_v<M, double>,
                "precis: nn layers keep master weights in float (or double); a policy with "
                "narrower master weights (presets::bf16_pure) is not supported by precis::nn");

 public:
  /// Element type of the working copy the kernels read.
  using storage_type = S;
  /// Element type of the master weights and of the gradient.
  using master_type = M;
  /// The parameter's shape.
  using shape_type = std::array<std::size_t, N>;
  /// A tensor of T with the parameter's rank on its context.
  template <class T>
  using tensor = tensor_t<Ctx, T, N>;
  /// The context's tensor operations (nn::context_traits).
  using io = context_traits<Ctx>;

  /// A parameter of `shape` with master weights and gradient zero (layers draw their
  /// values in reset()).
  explicit parameter(const shape_type& shape) : master_(shape), grad_(shape) {
    io::fill(master_, M(0));
    io::fill(grad_, M(0));
    if constexpr (!same_storage) {
      working_ = tensor<S>(shape);
      version_ = detail::next_parameter_version();
    }
  }
  /// A parameter with its own buffers holding copies of `other`'s values.
  parameter(const parameter&) = default;
  /// Takes `other`'s buffers.
  parameter(parameter&&) noexcept = default;
  /// Copies the values of `other` into this parameter's buffers (they keep their
  /// addresses). Throws precis::error when the shapes differ.
  parameter& operator=(const parameter& other) {
    if (this != &other) assign(other);
    return *this;
  }
  /// Copies the values of `other`, as the copy assignment does: the buffers are not taken.
  parameter& operator=(parameter&& other) {
    if (this != &other) assign(other);
    return *this;
  }
  ~parameter() = default;

  /// The master weights (update them, then call refresh()).
  tensor<M>& master() { return master_; }
  /// The master weights, read-only.
  const tensor<M>& master() const { return master_; }
  /// The working copy the kernels read: the master rounded to S at the last refresh().
  const tensor<S>& value() const {
    if constexpr (same_storage) {
      return master_;
    } else {
      return working_;
    }
  }
  /// The gradient, accumulated over backward passes since zero_grad().
  tensor<M>& grad() { return grad_; }
  /// The gradient, read-only.
  const tensor<M>& grad() const { return grad_; }

  /// Names the contents of the working copy: a value taken afresh (never one this process
  /// used before) whenever they may change, at every refresh() and assignment; kernels may
  /// keep what they derived from value() under it (conv2d_params::weights_version). 0 when
  /// S is M: the working copy is then the master weights, which are written in place
  /// (master(), master_span()) without telling the parameter, so it names nothing.
  std::uint64_t version() const { return version_; }

  /// Rounds the master weights to the working copy (nearest-even), once per step.
  void refresh(context_ref_t<Ctx> ctx) {
    if constexpr (!same_storage) {
      version_ = detail::next_parameter_version();  // before the values change
      io::cast(ctx, master_, working_);
    }
  }
  /// refresh() on one CPU thread.
  void refresh()
    requires std::is_same_v<Ctx, cpu_context>
  {
    refresh(cpu_context{1});
  }
  /// Takes a new version for a working copy that was rewritten from the masters elsewhere,
  /// in the step's order (a device optimizer's fused refresh, precis::device_adamw's
  /// fuse_refresh).
  void mark_refreshed() {
    if constexpr (!same_storage) version_ = detail::next_parameter_version();
  }
  /// Sets the gradient to zero, before the backward passes of a step.
  void zero_grad() { io::fill(grad_, M(0)); }
  /// Sets the gradient to zero in ctx's order: on the device a memset queued on the
  /// context's stream, with nothing copied from the host and no wait (the training step's
  /// form).
  void zero_grad(context_ref_t<Ctx> ctx) { io::zero(ctx, grad_); }
  /// grad += part, elementwise in M (part is a gradient already rounded to its type).
  /// Throws precis::error when part's shape is not the parameter's.
  template <class G>
  void accumulate(context_ref_t<Ctx> ctx, const tensor<G>& part) {
    check_same_shape("precis::nn::parameter: gradient", part, master_);
    io::accumulate(ctx, grad_, part);
  }
  /// accumulate() on one CPU thread.
  template <class G>
    requires std::is_same_v<Ctx, cpu_context>
  void accumulate(const tensor<G>& part) {
    accumulate(cpu_context{1}, part);
  }
  /// Sets the master weights from host values (then refreshes the working copy).
  void set(context_ref_t<Ctx> ctx, const std::vector<M>& values) {
    if (values.size() != size()) {
      throw error("precis::nn::parameter: " + std::to_string(values.size()) + " values for a parameter of " +
                  std::to_string(size()));
    }
    io::upload(master_, values);
    refresh(ctx);
  }

  /// The master weights as one span of size() values, for an optimizer (call refresh()
  /// after updating them): a std::span on the host, a precis::device_span on the device.
  typename io::template span<M> master_span() { return {master_.data(), size()}; }
  /// The gradient as one span of size() values (std::span or precis::device_span).
  typename io::template span<M> grad_span() { return {grad_.data(), size()}; }
  /// The gradient as one span of size() values, read-only.
  typename io::template span<const M> grad_span() const { return {grad_.data(), size()}; }
  /// Number of elements.
  std::size_t size() const { return master_.size(); }
  /// Bytes held: master weights, gradient and (when S is not M) the working copy.
  std::size_t bytes() const { return size() * (2 * sizeof(M) + (same_storage ? 0 : sizeof(S))); }

  /// Saves or loads the master weights as `name` (see precis::save_checkpoint); a loaded
  /// tensor of the wrong size is reported by validate().
  template <class Archive>
  void visit_state(Archive& a, const std::string& name) {
    const auto m = io::download(master_);
    std::vector<float> v(m.begin(), m.end());
    a.floats(name, v);
    if (v.size() != size()) {
      problem_ = name + " has " + std::to_string(v.size()) + " values, the model has " +
                 std::to_string(size());
      return;
    }
    io::upload(master_, std::vector<M>(v.begin(), v.end()));
    if constexpr (std::is_same_v<Ctx, cpu_context>) refresh();
  }
  /// Empty, or what a load found wrong.
  const std::string& problem() const { return problem_; }

 private:
  static constexpr bool same_storage = std::is_same_v<S, M>;

  void assign(const parameter& other) {
    check_same_shape("precis::nn::parameter: assigning a parameter of another shape (parameters "
                     "keep their storage)",
                     other.master_, master_);
    std::copy(other.master_.begin(), other.master_.end(), master_.begin());
    std::copy(other.grad_.begin(), other.grad_.end(), grad_.begin());
    if constexpr (!same_storage) {
      version_ = detail::next_parameter_version();
      std::copy(other.working_.begin(), other.working_.end(), working_.begin());
    }
    problem_ = other.problem_;
  }

  tensor<M> master_;
  tensor<M> grad_;
  tensor<S> working_;  // empty when S is M
  std::uint64_t version_ = 0;  // see version()
  std::string problem_;
};

/// Whether a forward pass is for training (dropout active, batch statistics) or
/// evaluation (dropout off, running statistics).
enum class mode { train, eval };

namespace detail {

/// SplitMix64's finaliser: a well-mixed 64-bit value from a counter (host and device
/// code: dropout draws its masks with it on both).
PRECIS_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// A double in [0, 1) from (seed, stream, index) (host and device code).
PRECIS_HOST_DEVICE constexpr double unit_random(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = mix64(mix64(seed ^ mix64(stream)) + index);
  return double(h >> 11) * 0x1.0p-53;
}

}  // namespace detail

/// Sets the master weights of `p` uniformly in [-bound, bound], drawn from (seed, stream): the
/// same values on every machine and thread count. A layer's reset(seed) calls it with the seed
/// it is given (nn::model derives one per layer from its path) and one stream per parameter.
/// On the host the working copy is rounded at once; on the device at the model's refresh(ctx).
template <class S, class M, std::size_t N, class Ctx>
void fill_uniform(parameter<S, M, N, Ctx>& p, std::uint64_t seed, std::uint64_t stream, double bound) {
  std::vector<M> v(p.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<M>((precis::detail::mul(2.0, detail::unit_random(seed, stream, i)) - 1.0) * bound);
  if constexpr (std::is_same_v<Ctx, cpu_context>) {
    p.set(cpu_context{1}, v);
  } else {
    context_traits<Ctx>::upload(p.master(), v);  // the working copy follows at the model's refresh
  }
}

}  // namespace precis::nn
