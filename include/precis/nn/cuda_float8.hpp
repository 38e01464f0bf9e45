/// @file
/// The float8 products of nn::linear on the device (presets::fp8_hybrid): the host's float8
/// linear layer (nn/linear.hpp) with cuBLASLt's float8 products and delayed scaling whose
/// state lives on the device (precis::device_delayed_scaling), so that a training step reads
/// nothing back. Included by precis/nn/cuda.hpp; compiled by nvcc only.
///
/// As on the host: x and W are cast to float8_e4m3 in the forward pass and dy to float8_e5m2
/// in the backward pass, each as q = saturate(v * scale) with its own delayed recipe; a
/// training pass records each tensor's amax and updates its recipe right after the cast
/// (evaluation leaves the recipes as they were); the products are y = (x_q W_q^T) / (s_x s_w)
/// + b, dx = (dy_q W_q) / (s_dy s_w), dW = (dy_q^T x_q) / (s_dy s_x), with the scales each
/// saved tensor was cast with. cuBLASLt takes float8 operands only as C = A B^T with M, N and K
/// multiples of 16, so the backward pass multiplies transposed copies (W_q^T, x_q^T, dy_q^T:
/// one strided copy each), and a layer whose rows or features are not multiples of 16 is
/// refused at its first pass, naming the sizes. cuBLASLt sums in its own order and applies
/// 1 / (s_a s_b) after the sum: the results agree with the host's within float sums' bounds
/// over float8 inputs, not bit for bit.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/common.hpp>
#include <precis/kernels/cuda/blas_lt.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda/scaling_kernels.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/nn/module.hpp>
#include <precis/policy/policy.hpp>
#include <precis/scaling/fp8.hpp>
#include <precis/tensor/device_tensor.hpp>

#if defined(__CUDACC__)

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

namespace precis::nn::detail {

template <class T>
inline constexpr bool device_float8_false = false;

/// The float8 state of a linear layer under policy P on the device: a device delayed-scaling
/// recipe per product input (x, W, dy), the float8 tensors the backward pass reuses, and
/// the inverse scales they were cast with (each in its own 16-byte slot, as cuBLASLt wants
/// its scale pointers). See the file comment.
template <Policy P, std::size_t R>
struct device_float8_linear_state {
  using forward_format = typename P::storage_type;
  using backward_format = typename P::gradient_type;
  static_assert(is_float8_v<forward_format> && is_float8_v<backward_format>,
                "precis: nn::linear takes float8 in both passes (storage float8_e4m3 and "
                "gradients float8_e5m2, as presets::fp8_hybrid) or in neither");
  static_assert(std::is_same_v<forward_format, float8_e4m3>,
                "precis: cuBLASLt's float8 products take float8_e4m3 in the forward pass (e5m2 x e5m2 is refused); "
                "store a float8 linear layer on the device in float8_e4m3");
  static_assert(std::is_same_v<typename P::fp8_recipe, recipe::delayed>,
                "precis: nn::linear's float8 products on the device use delayed scaling (recipe::delayed, "
                "as presets::fp8_hybrid); current scaling runs on the host so far");

  std::unique_ptr<device_delayed_scaling<forward_format>> input, weight;
  std::unique_ptr<device_delayed_scaling<backward_format>> grad_output;
  device_tensor<forward_format, 2> xq, wq, xq_t, wq_t;  // rows x in, out x in, in x rows, in x out
  device_tensor<backward_format, 2> dyq, dyq_t;         // rows x out, out x rows
  device_tensor<float, 1> saved;                        // 1 / s_x at 0, 1 / s_w at 4, 1 / s_dy at 8
  bool have_forward = false;
  /// Recipes given by visit_state before the first pass, which makes the device's from them.
  struct host_recipes {
    delayed_scaling<forward_format> input, weight;
    delayed_scaling<backward_format> grad_output;
  };
  std::optional<host_recipes> pending;

  std::size_t own_bytes() const {
    return bytes_of(xq) + bytes_of(wq) + bytes_of(xq_t) + bytes_of(wq_t) + bytes_of(dyq) + bytes_of(dyq_t) +
           bytes_of(saved);
  }
  /// Multi-process amaxes are the host's so far: device recipes are single-process.
  template <class Reducer>
  void set_reducer(Reducer) {
    static_assert(device_float8_false<Reducer>,
                  "precis: float8 recipes on the device measure one process's amax so far; "
                  "set_amax_reducer applies to host models");
  }
  /// The host float8 layer's checkpoint fields (the recipes under "fp8.input.", "fp8.weight."
  /// and "fp8.grad_output."), which nn::copy_state moves between a device model and a host
  /// model. The recipes' state is downloaded (waiting for the device) and visited as host
  /// recipes; what a reader gave replaces it on the device, on the stream of the context of
  /// the layer's last pass, or, before any pass, is kept and made into the device recipes by
  /// the first. A loaded state that is inconsistent changes nothing and is what validate()
  /// reports.
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    delayed_scaling<forward_format> x, w;
    delayed_scaling<backward_format> dy;
    if (input) {
      x = delayed_scaling<forward_format>(input->options());
      w = delayed_scaling<forward_format>(weight->options());
      dy = delayed_scaling<backward_format>(grad_output->options());
      input->store(*ctx_, x);
      weight->store(*ctx_, w);
      grad_output->store(*ctx_, dy);
    } else if (pending) {
      x = pending->input;
      w = pending->weight;
      dy = pending->grad_output;
    }
    visit_recipe(a, prefix + "fp8.input.", x);
    visit_recipe(a, prefix + "fp8.weight.", w);
    visit_recipe(a, prefix + "fp8.grad_output.", dy);
    problem_.clear();
    const auto check = [&](std::string_view name, const std::string& p) {
      if (!p.empty()) problem_ += (problem_.empty() ? "" : "; ") + std::string(name) + " recipe: " + p;
    };
    check("fp8.input", x.validate());
    check("fp8.weight", w.validate());
    check("fp8.grad_output", dy.validate());
    if (!problem_.empty()) return;
    if (input) {
      replace(input, x);
      replace(weight, w);
      replace(grad_output, dy);
    } else {
      pending = host_recipes{x, w, dy};
    }
  }
  /// Empty, or what the last visit_state found wrong in the state it read.
  std::string validate() const { return problem_; }

  /// y [rows, out] = x [rows, in] W^T + bias in S, through float8 (see the file comment).
  template <class S>
  void forward(cuda_context& ctx, const S* x, const S* w, S* y, const S* bias, std::size_t rows, std::size_t in,
               std::size_t out, bool record) {
    static_assert(std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>,
                  "precis: cuBLASLt's float8 products write bfloat16 or float16 (with a bias of that type); give "
                  "a float8 linear layer on the device bfloat16 or float16 activations");
    check_sizes(rows, in, out);
    ctx_ = &ctx;
    if (!input) {
      // Made on the first pass: the recipes visit_state gave, or the default options, as the
      // host layer's. New device memory, counted as a layer buffer's (a CUDA graph captured
      // before would hold none of it).
      const host_recipes r = pending ? *pending : host_recipes();
      input = std::make_unique<device_delayed_scaling<forward_format>>(ctx, r.input);
      weight = std::make_unique<device_delayed_scaling<forward_format>>(ctx, r.weight);
      grad_output = std::make_unique<device_delayed_scaling<backward_format>>(ctx, r.grad_output);
      saved = device_tensor<float, 1>({12}, ctx.stream());
      pending.reset();
      device_reallocations.fetch_add(1, std::memory_order_relaxed);
    }
    ensure(xq, rows, in, ctx);
    ensure(wq, out, in, ctx);
    cast(ctx, *input, x, xq.data(), rows * in, saved.data() + 0, record);
    cast(ctx, *weight, w, wq.data(), out * in, saved.data() + 4, record);
    lt_product<forward_format, forward_format, S> p;
    p.m = std::int64_t(rows);
    p.n = std::int64_t(out);
    p.k = std::int64_t(in);
    p.a = xq.data();
    p.b = wq.data();
    p.c = y;
    p.trans_b = true;
    p.epilogue = bias ? lt_epilogue::bias : lt_epilogue::none;
    p.bias = bias;
    p.a_scale = saved.data() + 0;
    p.b_scale = saved.data() + 4;
    lt_matmul<float>(ctx, p);
    have_forward = true;
  }

  /// dw [out, in] = dy^T x and, when dx is given, dx [rows, in] = dy W, in G, through float8.
  template <class G>
  void backward(cuda_context& ctx, const G* dy, G* dx, G* dw, std::size_t rows, std::size_t in, std::size_t out) {
    if (!have_forward) {
      throw error("precis::nn::linear: backward() called without a forward() since the layer was made or copied");
    }
    ensure(dyq, rows, out, ctx);
    cast(ctx, *grad_output, dy, dyq.data(), rows * out, saved.data() + 8, true);
    if (dx) {
      // dx = dy_q (rows x out) times W_q (out x in) = dy_q (W_q^T)^T.
      ensure(wq_t, in, out, ctx);
      transpose(ctx, wq.data(), wq_t.data(), out, in);
      product(ctx, dyq.data(), wq_t.data(), dx, rows, in, out, saved.data() + 8, saved.data() + 4);
    }
    // dW = dy_q^T (out x rows) times x_q (rows x in) = dy_q^T (x_q^T)^T.
    ensure(dyq_t, out, rows, ctx);
    ensure(xq_t, in, rows, ctx);
    transpose(ctx, dyq.data(), dyq_t.data(), rows, out);
    transpose(ctx, xq.data(), xq_t.data(), rows, in);
    product(ctx, dyq_t.data(), xq_t.data(), dw, out, in, rows, saved.data() + 8, saved.data() + 0);
  }

 private:
  static void check_sizes(std::size_t rows, std::size_t in, std::size_t out) {
    if (rows % 16 != 0 || in % 16 != 0 || out % 16 != 0) {
      throw error("precis::nn::linear: float8 products on the device need rows, in and out features that are "
                  "multiples of 16 (cuBLASLt's), got " + std::to_string(rows) + " rows, " + std::to_string(in) +
                  " in, " + std::to_string(out) + " out; map this layer to a bfloat16 policy");
    }
  }
  cuda_context* ctx_ = nullptr;  // the context of the last pass: the recipes' stream
  std::string problem_;
  // The device recipe `r` takes host recipe h's state: in place where the history keeps its
  // length, else made anew (counted as a reallocated buffer).
  template <class Format>
  void replace(std::unique_ptr<device_delayed_scaling<Format>>& r, const delayed_scaling<Format>& h) {
    if (r->options().history_length == h.options().history_length) {
      r->load(*ctx_, h);
    } else {
      r = std::make_unique<device_delayed_scaling<Format>>(*ctx_, h);
      device_reallocations.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // Another shape within its memory, or new memory in the stream's order, counted as every
  // layer buffer is (nn::ensure): a captured step from before is then refused.
  template <class T>
  static void ensure(device_tensor<T, 2>& t, std::size_t a, std::size_t b, cuda_context& ctx) {
    nn::ensure(t, shape_t<2>{a, b}, ctx.stream());
  }
  // q = saturate(v * scale) under recipe r, its inverse scale saved to `slot`; then the
  // recipe records the amax and updates (training), or forgets the amax (evaluation).
  template <class Recipe, class T, class F>
  static void cast(cuda_context& ctx, Recipe& r, const T* v, F* q, std::size_t n, float* slot, bool record) {
    precis::detail::cuda::scaled_cast_elements(ctx, v, q, n, r.scale(), r.amax());
    check(cudaMemcpyAsync(slot, r.inverse_scale(), sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()),
          "cudaMemcpyAsync");
    if (record) {
      r.update_async(ctx);
    } else {
      check(cudaMemsetAsync(r.amax(), 0, sizeof(float), ctx.stream()), "cudaMemsetAsync");
    }
  }
  // to (cols x rows) = from (rows x cols)^T, one strided copy.
  template <class T>
  static void transpose(cuda_context& ctx, const T* from, T* to, std::size_t rows, std::size_t cols) {
    precis::detail::cuda::strided_copy(ctx.stream(), from, to, precis::detail::transpose_plan(1, rows, cols),
                                       "precis::nn::linear (float8 transpose)");
  }
  // c (m x n) = a (m x k) b (n x k)^T / (s_a s_b), the inverse scales on the device.
  template <class A, class B, class C>
  static void product(cuda_context& ctx, const A* a, const B* b, C* c, std::size_t m, std::size_t n, std::size_t k,
                      const float* a_inverse, const float* b_inverse) {
    lt_product<A, B, C> p;
    p.m = std::int64_t(m);
    p.n = std::int64_t(n);
    p.k = std::int64_t(k);
    p.a = a;
    p.b = b;
    p.c = c;
    p.trans_b = true;
    p.a_scale = a_inverse;
    p.b_scale = b_inverse;
    lt_matmul<float>(ctx, p);
  }
};

}  // namespace precis::nn::detail

#endif
