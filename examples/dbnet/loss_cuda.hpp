// DB's training loss on the device (loss.hpp has the definition), for a DBNet built on a
// cuda_context: dbnet::loss_t<Map, Model> picks it when the model is a device model.
//
// Every pixel is computed by the host's functions (detail::pixel_forward, pixel_terms,
// pixel_backward, finish_loss), rounded as the policies say, so that under a map that
// waives rule fp32_operation the device meets the same overflow, and the same NaN
// gradients, as the host. What differs is the order of the sums:
//   - counts (positives, negatives, the threshold mask's pixels) are integers, added with
//     atomics: exact, as on the host;
//   - the hard negatives follow the host's rule: the candidates' BCE terms (NaN as +inf, -0
//     as +0) sorted in descending order by CUB's radix sort, which is stable, so that ties
//     keep index order, and the first min(negatives, 3 positives) of them kept. The set is
//     the host's where the terms have the host's bits; the device's exp and log1p may differ
//     from the host's libm in the last place, so where two candidates at the cut are within
//     an ulp of each other the other one may be kept (a term of the same loss to an ulp);
//   - the five sums (the kept BCE terms, B y m, B m, y m and the L1 terms) in float or
//     double are taken in two passes of a fixed order (precis's reduce_terms): the same bits
//     on every run and device, within a float sum's bound of the host's index-order sums.
//     In an accumulate type narrower than float (a map that waives rule fp32_operation, as
//     the seed's does) a sum in another order is not near the host's: a float16 sum of
//     terms below 1 stops growing at 2048 in index order, while a tree of partial sums keeps
//     growing and can overflow. There one thread adds every pixel in index order, rounding
//     each addition as the host does (sums_in_order): the host's sums, at a single thread's
//     speed, on a configuration kept only to show its failure.
// The loss, its terms and the scalars backward() reads stay in device memory: a step reads
// nothing on the host. terms(ctx) and kept(ctx) wait and download, for logs and tests.
// CUDA code only: include after <precis/nn/cuda.hpp> and loss.hpp.
#pragma once

#include "loss.hpp"

#include <precis/nn/cuda.hpp>

#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace dbnet {

/// A batch's targets in device memory (targets' four maps, each [N, 1, H, W]).
struct device_targets {
  device_tensor<float, 4> shrink, shrink_mask, thresh, thresh_mask;
  /// The four maps, for the key of a step captured as a CUDA graph (nn::trainer).
  auto tensors() const { return std::tie(shrink, shrink_mask, thresh, thresh_mask); }
};

namespace detail::cuda {

/// What the loss keeps in device memory between its kernels and for backward().
template <class M>
struct loss_state {
  unsigned long long positives, negatives, l1_count, kept;
  loss_scalars<M> scalars;
  double terms[3];  ///< BCE, dice and L1 of the last forward pass
};

/// The sort key of pixel i: its BCE term where it is a negative inside the shrink mask (NaN
/// as +inf, -0 as +0), -inf elsewhere (after every candidate in descending order).
template <class M>
__device__ M negative_key(bool candidate, M term) {
  if (!candidate) return -M(INFINITY);
  if (term != term) return M(INFINITY);
  return term == M(0) ? M(0) : term;
}

/// Forward, per pixel: P, e, B and the BCE term (pixel_forward); the sort keys and
/// indices; the positives marked kept; the three counts added into the state.
template <class CB, class CL, class M, class SP, class ST>
__global__ void pixel_kernel(const SP* x, const ST* th, const float* gt, const float* gm, const float* tmask,
                             std::size_t n, M k, M* p, M* e, M* b, M* term, M* keys, std::uint32_t* index,
                             std::uint8_t* keep, loss_state<M>* state) {
  __shared__ unsigned long long counts[3];
  if (threadIdx.x < 3) counts[threadIdx.x] = 0;
  __syncthreads();
  unsigned long long mine[3] = {0, 0, 0};
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const auto v = pixel_forward<CB, CL>(dbnet::detail::load<M>(x[i]), dbnet::detail::load<M>(th[i]), M(gt[i]), k);
    p[i] = v.p;
    e[i] = v.e;
    b[i] = v.b;
    term[i] = v.term;
    const bool in = gm[i] != 0.0F, positive = in && gt[i] != 0.0F, negative = in && gt[i] == 0.0F;
    keys[i] = negative_key(negative, v.term);
    index[i] = std::uint32_t(i);
    keep[i] = positive ? 1 : 0;
    mine[0] += positive ? 1U : 0U;
    mine[1] += negative ? 1U : 0U;
    mine[2] += tmask[i] != 0.0F ? 1U : 0U;
  }
  for (int c = 0; c < 3; ++c) {
    if (mine[c] != 0) atomicAdd(&counts[c], mine[c]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&state->positives, counts[0]);
    atomicAdd(&state->negatives, counts[1]);
    atomicAdd(&state->l1_count, counts[2]);
  }
}

/// Marks the first min(negatives, positives * ratio) pixels of the sorted order kept (the
/// host's limit: the product in double, truncated).
template <class M>
__global__ void keep_kernel(const std::uint32_t* sorted, std::size_t n, double ratio, std::uint8_t* keep,
                            loss_state<M>* state) {
  const auto limit = static_cast<unsigned long long>(double(state->positives) * ratio);
  const unsigned long long kept = state->negatives < limit ? state->negatives : limit;
  if (blockIdx.x == 0 && threadIdx.x == 0) state->kept = kept;
  for (std::size_t j = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; j < n && j < kept;
       j += std::size_t(gridDim.x) * blockDim.x) {
    keep[sorted[j]] = 1;
  }
}

/// The five terms of pixel i for reduce_terms: its BCE term where kept (else 0, which
/// leaves a sum as it is), then pixel_terms.
template <class CL, class M, class ST>
struct sum_terms {
  const M* term;
  const M* b;
  const std::uint8_t* keep;
  const ST* th;
  const float* gt;
  const float* gm;
  const float* tm;
  const float* tmask;
  __device__ precis::detail::cuda::term_values<M, 5> operator()(std::size_t i) const {
    precis::detail::cuda::term_values<M, 5> r;
    r.v[0] = keep[i] != 0 ? term[i] : M(0);
    pixel_terms<CL>(b[i], M(gt[i]), M(gm[i]), dbnet::detail::load<M>(th[i]), M(tm[i]), M(tmask[i]), r.v + 1);
    return r;
  }
};

/// Thread 0 of reduce_terms' last block: the loss from the sums and counts (finish_loss).
template <class CL, class M>
struct finish_sums {
  loss_state<M>* state;
  M* loss;
  loss_options o;
  template <class S>
  __device__ void operator()(const S* totals) const {
    const M sums[5] = {M(totals[0]), M(totals[1]), M(totals[2]), M(totals[3]), M(totals[4])};
    M terms[3];
    loss[0] = finish_loss<CL>(sums, double(state->positives), double(state->kept), double(state->l1_count), o,
                              state->scalars, terms);
    for (int t = 0; t < 3; ++t) state->terms[t] = double(terms[t]);
  }
};

/// The five sums of terms(i) in index order by one thread, each addition rounded to Acc
/// (the host's loop), then finish(totals): for an accumulate type narrower than float.
template <class Acc, class Terms, class Finish>
__global__ void sums_in_order(Terms terms, std::size_t n, Finish finish) {
  using sum = precis::detail::cuda::device_sum<Acc>;
  typename sum::state totals[5];
  for (auto& t : totals) t = sum::init();
  for (std::size_t i = 0; i < n; ++i) {
    const auto t = terms(i);
    for (int k = 0; k < 5; ++k) totals[k] = sum::add(totals[k], t.v[k]);
  }
  finish(totals);
}

/// Backward, per pixel (pixel_backward), dloss read when the kernel runs.
template <class CB, class CL, class M, class SP, class ST, class GP, class GT>
__global__ void backward_kernel(const SP* x, const ST* th, const float* gt, const float* gm, const float* tm,
                                const float* tmask, const std::uint8_t* keep, const M* p, const M* e, const M* b,
                                std::size_t n, M k, loss_options o, precis::device_dloss dloss,
                                const loss_state<M>* state, GP* dx, GT* dt) {
  const loss_scalars<M> s = state->scalars;
  const gradient_scales<CL, M> g(precis::detail::cuda::dloss_of<M>(dloss), s, o);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    M gx, gth;
    pixel_backward<CB, CL>(dbnet::detail::load<M>(x[i]), dbnet::detail::load<M>(th[i]), M(gt[i]), M(gm[i]), M(tm[i]), M(tmask[i]), keep[i] != 0,
                           pixel_values<M>{p[i], e[i], b[i], M(0)}, g, s, k, gx, gth);
    dx[i] = round_to<GP>(gx);
    dt[i] = round_to<GT>(gth);
  }
}

}  // namespace detail::cuda

/// DB's loss on the device (see the file comment and the host basic_loss).
template <Policy LossPolicy, Policy BinPolicy, class SP, class GP, class ST, class GT>
class basic_loss<LossPolicy, BinPolicy, nn::values<nn::sig<SP, GP, 4>, nn::sig<ST, GT, 4>>, cuda_context>
    : public loss_types<LossPolicy, BinPolicy, SP, GP, ST, GT> {
  using CL = typename LossPolicy::compute_type;
  using AL = typename LossPolicy::accumulate_type;
  using CB = typename BinPolicy::compute_type;
  using M = typename loss_types<LossPolicy, BinPolicy, SP, GP, ST, GT>::value_type;
  using state_type = detail::cuda::loss_state<M>;
  using edge = typename loss_types<LossPolicy, BinPolicy, SP, GP, ST, GT>::input_type;

 public:
  /// The targets: the four maps in device memory.
  using target_tensor = device_targets;
  /// The gradients backward() returns.
  using grad_tuple = std::tuple<const device_tensor<GP, 4>*, const device_tensor<GT, 4>*>;

  /// Throws precis::error for the host's bad options.
  explicit basic_loss(loss_options o = {}) : o_(o), loss_({1}), state_({1}) {
    // The host's checks and messages.
    (void)basic_loss<LossPolicy, BinPolicy, edge, cpu_context>(o);
  }

  /// Throws precis::error, before any launch, when a target map's shape is not the output's
  /// `out` (the trainer's check of a batch).
  template <class Shapes>
  void check_targets(const Shapes& out, const device_targets& t) const {
    check(std::get<0>(out), std::get<1>(out), t);
  }

  /// Writes the loss of (P logits, T) against `t` to value() and returns it; nothing waits.
  /// Throws precis::error on shapes that differ, before any launch.
  const device_tensor<M, 1>& forward(cuda_context& ctx,
                                     const std::tuple<const device_tensor<SP, 4>*, const device_tensor<ST, 4>*>& y,
                                     const device_targets& t) {
    x_ = std::get<0>(y);
    th_ = std::get<1>(y);
    t_ = &t;
    check(x_->shape(), th_->shape(), t);
    const std::size_t n = x_->size();
    if (n > std::size_t(std::numeric_limits<std::uint32_t>::max()) ||
        n > std::size_t(std::numeric_limits<int>::max())) {
      throw error("dbnet::loss: more than 2^31 - 1 pixels in a batch on the device");
    }
    const nn::shape_t<1> s{n};
    nn::ensure(p_, s);
    nn::ensure(e_, s);
    nn::ensure(b_, s);
    nn::ensure(term_, s);
    nn::ensure(keys_, s);
    nn::ensure(sorted_keys_, s);
    nn::ensure(index_, s);
    nn::ensure(sorted_, s);
    nn::ensure(keep_, s);
    // The sort ping-pongs between the pixel kernel's keys and indices and a second buffer
    // of each (CUB's double-buffer form: no copies of its own in the scratch); which one
    // holds the sorted indices is known on the host once the call returns.
    cub::DoubleBuffer<M> keys(keys_.data(), sorted_keys_.data());
    cub::DoubleBuffer<std::uint32_t> values(index_.data(), sorted_.data());
    std::size_t temp = 0;
    precis::check(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp, keys, values, int(n), 0,
                                                            int(sizeof(M) * 8), ctx.stream()),
                  "cub::DeviceRadixSort (size)");
    if (temp_.size() < temp) nn::ensure(temp_, nn::shape_t<1>{temp});
    precis::check(cudaMemsetAsync(state_.data(), 0, sizeof(state_type), ctx.stream()), "cudaMemsetAsync");
    const unsigned grid = precis::detail::cuda::grid_for(n);
    detail::cuda::pixel_kernel<CB, CL><<<grid, 256, 0, ctx.stream()>>>(
        x_->data(), th_->data(), t.shrink.data(), t.shrink_mask.data(), t.thresh_mask.data(), n, M(o_.k), p_.data(),
        e_.data(), b_.data(), term_.data(), keys_.data(), index_.data(), keep_.data(), state_.data());
    precis::check(cudaGetLastError(), "dbnet::loss (pixels)");
    std::size_t bytes = temp_.size();
    precis::check(cub::DeviceRadixSort::SortPairsDescending(temp_.data(), bytes, keys, values, int(n), 0,
                                                            int(sizeof(M) * 8), ctx.stream()),
                  "cub::DeviceRadixSort");
    detail::cuda::keep_kernel<<<grid, 256, 0, ctx.stream()>>>(values.Current(), n, o_.negative_ratio, keep_.data(),
                                                              state_.data());
    precis::check(cudaGetLastError(), "dbnet::loss (hard negatives)");
    const detail::cuda::sum_terms<CL, M, ST> terms{term_.data(),       b_.data(),      keep_.data(),
                                                   th_->data(),        t.shrink.data(), t.shrink_mask.data(),
                                                   t.thresh.data(),    t.thresh_mask.data()};
    const detail::cuda::finish_sums<CL, M> finish{state_.data(), loss_.data(), o_};
    if constexpr (std::is_floating_point_v<AL>) {  // float or double; precis's narrow formats are classes
      precis::detail::cuda::reduce_terms<precis::detail::cuda::device_sum<AL>, 5>(ctx, n, terms, finish,
                                                                                 "dbnet::loss (sums)");
    } else {
      detail::cuda::sums_in_order<AL><<<1, 1, 0, ctx.stream()>>>(terms, n, finish);
      precis::check(cudaGetLastError(), "dbnet::loss (sums in index order)");
    }
    return loss_;
  }

  /// The gradients of dloss * loss with respect to P logits and T (dloss a host value or a
  /// device float, the loss scale), each element rounded once to the model's gradient
  /// types. Throws precis::error without a forward pass.
  grad_tuple backward(cuda_context& ctx, precis::device_dloss dloss = 1.0) {
    if (x_ == nullptr) throw error("dbnet::loss::backward: no forward pass to differentiate");
    nn::ensure(dx_, x_->shape());
    nn::ensure(dt_, th_->shape());
    const std::size_t n = x_->size();
    detail::cuda::backward_kernel<CB, CL><<<precis::detail::cuda::grid_for(n), 256, 0, ctx.stream()>>>(
        x_->data(), th_->data(), t_->shrink.data(), t_->shrink_mask.data(), t_->thresh.data(), t_->thresh_mask.data(),
        keep_.data(), p_.data(), e_.data(), b_.data(), n, M(o_.k), o_, dloss, state_.data(), dx_.data(), dt_.data());
    precis::check(cudaGetLastError(), "dbnet::loss (backward)");
    return {&dx_, &dt_};
  }

  /// The last forward pass's loss (device memory).
  const device_tensor<M, 1>& value() const { return loss_; }
  /// The last forward pass's terms and counts (waits for the device).
  loss_terms terms(cuda_context& ctx) const {
    state_type s{};
    precis::check(cudaMemcpyAsync(&s, state_.data(), sizeof s, cudaMemcpyDeviceToHost, ctx.stream()),
                  "cudaMemcpyAsync");
    ctx.synchronize();
    return {s.terms[0], s.terms[1], s.terms[2], std::size_t(s.positives), std::size_t(s.kept)};
  }
  /// Which pixels the last forward pass's BCE took (1: a positive or a kept negative);
  /// waits for the device.
  std::vector<std::uint8_t> kept(cuda_context& ctx) const {
    const auto h = to_host(keep_, ctx.stream());
    return std::vector<std::uint8_t>(h.begin(), h.end());
  }
  /// B of the last forward pass (waits for the device).
  std::vector<M> binary_map(cuda_context& ctx) const {
    const auto h = to_host(b_, ctx.stream());
    return std::vector<M>(h.begin(), h.end());
  }
  std::string shape() const { return "-"; }
  /// Bytes of the buffers it keeps between forward and backward and of the sort's.
  std::size_t own_bytes() const {
    return nn::bytes_of(p_) + nn::bytes_of(e_) + nn::bytes_of(b_) +
           nn::bytes_of(term_) + nn::bytes_of(keys_) + nn::bytes_of(sorted_keys_) +
           nn::bytes_of(index_) + nn::bytes_of(sorted_) + nn::bytes_of(keep_) +
           nn::bytes_of(temp_) + nn::bytes_of(dx_) + nn::bytes_of(dt_);
  }

 private:
  static void check(const nn::shape_t<4>& shape, const nn::shape_t<4>& th, const device_targets& t) {
    detail::check_shapes(shape, th, t);
  }

  loss_options o_;
  const device_tensor<SP, 4>* x_ = nullptr;
  const device_tensor<ST, 4>* th_ = nullptr;
  const device_targets* t_ = nullptr;
  device_tensor<M, 1> p_, e_, b_, term_, keys_, sorted_keys_;
  device_tensor<std::uint32_t, 1> index_, sorted_;
  device_tensor<std::uint8_t, 1> keep_, temp_;
  device_tensor<M, 1> loss_;
  device_tensor<state_type, 1> state_;
  device_tensor<GP, 4> dx_;
  device_tensor<GT, 4> dt_;
};

}  // namespace dbnet
