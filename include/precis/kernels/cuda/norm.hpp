/// @file
/// Layer norm over the last axis and batch norm over axis 1 of device tensors, forward and
/// backward, with the calls of kernels/norm.hpp (a cuda_context in place of the cpu_context).
/// Statistics in at least float (the policy's accumulate type for the sums, two passes for the
/// variance, as on the host). Layer norm: rows of up to 8192 columns are read once and held in
/// registers (common.hpp's row_share: a warp per row up to 1024 columns, several rows per
/// block; a block per row beyond), longer rows once per pass by a block each. dgamma and dbeta
/// are column sums in two passes of a fixed order. Where a block's share of the sums fits its
/// shared memory (common.hpp's fused_norm_rows_for: float sums of rows up to 4096 columns,
/// double up to 2048), the first pass is in the kernel that computes dx, so that dy and x are
/// read once: each thread adds its columns' terms of its rows in row order, then a block's
/// row groups are combined in group order, a partial sum per block of up to 64 rows. Longer
/// rows take slabs of 64 rows, each summed by 8 strided threads and then across them. Then
/// each column's partial sums are added by a warp (reduce.hpp's column_totals): the same bits
/// on every run and device, within a float sum's bound of the host's row-order sums. Batch
/// norm: the statistics read x once (reduce.hpp's channel_moments_in: each block takes its
/// share's mean, then the squared distances to it, from values it holds, as the host's two
/// passes; the shares, 4096 elements of a plane or 64 rows of channels-last images, are
/// joined with common.hpp's combine_moments); the backward sums are channel reductions in two passes
/// (segments of 4096 elements of each image's plane, then each channel's segments by a block:
/// reduce.hpp's channel_reduce). Both have a fixed order: the same bits on every run and
/// device, within a float sum's bound of the host's. The running statistics take PyTorch's
/// update (unbiased running variance); y and dx are elementwise over planes, with no division
/// per element (16 bytes per access where a plane's length allows). Shapes and arguments are
/// checked on the host before anything is launched. Compiled by nvcc only.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/cuda/reduce.hpp>
#include <precis/kernels/norm.hpp>

#if defined(__CUDACC__)

#include <array>
#include <cstddef>

namespace precis {

namespace detail::cuda {

template <class M, class Acc, class X, class G, class B, class Y, class S>
__global__ void layer_norm_rows(const X* x, const G* gamma, const B* beta, Y* y, S* mean, S* rstd,
                                std::size_t cols, M eps) {
  using V = typename accumulator<Acc>::value_type;
  const std::size_t base = blockIdx.x * cols;
  accumulator<Acc> s;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) s.add(V(device_load<M>(x[base + j])));
  const M mu = block_sum<M>(s) / M(cols);
  accumulator<Acc> q;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M d = device_load<M>(x[base + j]) - mu;
    q.add(V(d * d));
  }
  const M var = block_sum<M>(q) / M(cols);
  const M rs = M(1) / ::sqrt(var + eps);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M v = (device_load<M>(x[base + j]) - mu) * rs * device_load<M>(gamma[j]) +
                device_load<M>(beta[j]);
    y[base + j] = round_to<Y>(v);
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = static_cast<S>(mu);
    rstd[blockIdx.x] = static_cast<S>(rs);
  }
}

/// layer_norm_rows for rows of at most resident_row_limit columns, x read once: the row group
/// G's threads hold the row in registers (common.hpp's row_share), V columns per access. The
/// statistics and the normalisation take the host's formulas (the mean, then the squared
/// distances to it).
template <class G, class M, class Acc, int V, int Slots, class X, class GA, class B, class Y, class S>
__global__ void __launch_bounds__(G::max_threads)
    layer_norm_resident(const X* x, const GA* gamma, const B* beta, Y* y, S* mean, S* rstd, std::size_t rows,
                        std::size_t cols, M eps, bool packed) {
  using A = typename accumulator<Acc>::value_type;
  for_each_row_share<G, M, V, Slots>(x, rows, cols, packed, [&](std::size_t r, row_share<M, V, Slots>& s) {
    accumulator<Acc> sum;
    s.template each<G>(cols, [&](M& v, std::size_t) { sum.add(A(v)); });
    const M mu = static_cast<M>(G::reduce(sum.value(), acc_add<Acc, A>{})) / M(cols);
    accumulator<Acc> q;
    s.template each<G>(cols, [&](M& v, std::size_t) {
      v -= mu;
      q.add(A(v * v));
    });
    const M var = static_cast<M>(G::reduce(q.value(), acc_add<Acc, A>{})) / M(cols);
    const M rs = M(1) / ::sqrt(var + eps);
    Y* out = y + r * cols;
#pragma unroll
    for (int i = 0; i < s.groups; ++i) {
      const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
      M g[V], b[V], o[V];
      load_slots<V>(gamma, c, cols, packed, g);
      load_slots<V>(beta, c, cols, packed, b);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = s.v[i][k] * rs * g[k] + b[k];
      store_slots<V>(out, c, cols, packed, o);
    }
    if (G::rank() == 0) {
      mean[r] = static_cast<S>(mu);
      rstd[r] = static_cast<S>(rs);
    }
  });
}

/// Row r of layer norm's backward pass for the row group G, rows of at most
/// resident_row_limit columns, dy and x read once (as layer_norm_resident): dx = rstd (g -
/// mean_j(g) - xhat mean_j(g xhat)), g = dy gamma; and, for each of the thread's slots s
/// below the row's end, terms(s, dy xhat, dy): dgamma's and dbeta's terms (as
/// layer_norm_param_terms).
template <class G, class M, class Acc, int V, int Slots, class DY, class X, class GA, class S, class DX, class Terms>
__device__ __forceinline__ void layer_norm_backward_row(const DY* dy, const X* x, const GA* gamma, const S* mean,
                                                        const S* rstd, DX* dx, std::size_t r, std::size_t cols,
                                                        bool packed, Terms&& terms) {
  using A = typename accumulator<Acc>::value_type;
  row_raw<DY, V, Slots> raw_g;
  row_raw<X, V, Slots> raw_x;
  raw_g.template load<G>(dy + r * cols, cols, packed);
  raw_x.template load<G>(x + r * cols, cols, packed);
  const M mu = static_cast<M>(mean[r]), rs = static_cast<M>(rstd[r]);
  auto g = raw_g.template share<M>();   // dy, then dy gamma
  auto xh = raw_x.template share<M>();  // x, then (x - mean) rstd
  accumulator<Acc> sg, sgx;
#pragma unroll
  for (int i = 0; i < g.groups; ++i) {
    const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
    M w[V];
    load_slots<V>(gamma, c, cols, packed, w);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      xh.v[i][k] = (xh.v[i][k] - mu) * rs;
      if (c + k < cols) terms(i * V + k, g.v[i][k] * xh.v[i][k], g.v[i][k]);
      g.v[i][k] = g.v[i][k] * w[k];
      if (c + k < cols) {
        sg.add(A(g.v[i][k]));
        sgx.add(A(g.v[i][k] * xh.v[i][k]));
      }
    }
  }
  const M a = static_cast<M>(G::reduce(sg.value(), acc_add<Acc, A>{})) / M(cols);
  const M b = static_cast<M>(G::reduce(sgx.value(), acc_add<Acc, A>{})) / M(cols);
  DX* out = dx + r * cols;
#pragma unroll
  for (int i = 0; i < g.groups; ++i) {
    M o[V];
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = rs * (g.v[i][k] - a - xh.v[i][k] * b);
    store_slots<V>(out, slot_column(i, G::rank(), G::threads(), V), cols, packed, o);
  }
}

/// layer_norm_backward_rows for rows of at most resident_row_limit columns, dy and x read once
/// (as layer_norm_resident); dgamma and dbeta are summed by a column_reduce after it.
template <class G, class M, class Acc, int V, int Slots, class DY, class X, class GA, class S, class DX>
__global__ void __launch_bounds__(G::max_threads)
    layer_norm_backward_resident(const DY* dy, const X* x, const GA* gamma, const S* mean, const S* rstd, DX* dx,
                                 std::size_t rows, std::size_t cols, bool packed) {
  for (std::size_t r = G::first(); r < rows; r += G::step()) {
    layer_norm_backward_row<G, M, Acc, V, Slots>(dy, x, gamma, mean, rstd, dx, r, cols, packed,
                                                 [](int, M, M) {});
  }
}

/// Dynamic shared memory of layer_norm_backward_fused (16-byte aligned; one name for every
/// instantiation).
extern __shared__ __align__(16) unsigned char fused_norm_shared[];

/// layer_norm_backward_resident with dgamma's and dbeta's first pass in it
/// (fused_norm_rows_for, kernels/common.hpp): block b takes rows [b block_rows, (b + 1)
/// block_rows), row group g of its `groups` the rows b block_rows + g, + groups, + 2 groups,
/// .. in order.
/// Each thread adds its slots' two terms of each of its rows, in row order, into its own
/// places of its group's slot groups below the row's end (fused_norm_used) in shared memory;
/// the block then combines its groups in group order into partial[(b cols + col) * 2 + k]
/// (k = 0: dgamma's sum, 1: dbeta's), which column_totals adds over the blocks.
/// At most 128 registers a thread (two blocks of 8 warps an SM): left to itself, ptxas gave
/// unpacked rows of 32 values a lane 158, one block an SM.
template <class G, class M, class Acc, int V, int Slots, class DY, class X, class GA, class S, class DX>
__global__ void __launch_bounds__(G::max_threads, 65536 / (G::max_threads * 128))
    layer_norm_backward_fused(const DY* dy, const X* x, const GA* gamma, const S* mean, const S* rstd, DX* dx,
                              std::size_t rows, std::size_t cols, bool packed, std::size_t block_rows,
                              typename accumulator<Acc>::value_type* partial) {
  using A = typename accumulator<Acc>::value_type;
  A* const shared = reinterpret_cast<A*>(fused_norm_shared);
  const unsigned threads = G::threads(), rank = G::rank();
  const std::size_t span = fused_norm_used(cols, threads, Slots, V) * V * threads;  // places per term and group
  A* const mine = shared + std::size_t(G::group()) * 2 * span;
  for (std::size_t p = rank; p < 2 * span; p += threads) mine[p] = device_sum<Acc>::init();
  const std::size_t first = blockIdx.x * block_rows;
  const std::size_t end = first + block_rows < rows ? first + block_rows : rows;
  for (std::size_t r = first + G::group(); r < end; r += G::groups()) {
    layer_norm_backward_row<G, M, Acc, V, Slots>(dy, x, gamma, mean, rstd, dx, r, cols, packed,
                                                 [&](int s, M gx, M gy) {
                                                   A& dg = mine[std::size_t(s) * threads + rank];
                                                   A& db = mine[span + std::size_t(s) * threads + rank];
                                                   dg = device_sum<Acc>::add(dg, gx);
                                                   db = device_sum<Acc>::add(db, gy);
                                                 });
  }
  __syncthreads();
  const unsigned groups = G::groups();
  for (std::size_t p = threadIdx.x; p < span; p += blockDim.x) {
    const std::size_t s = p / threads;
    const std::size_t col = slot_column(int(s / V), unsigned(p % threads), threads, V) + s % V;
    if (col >= cols) continue;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      A t = shared[k * span + p];
      for (unsigned h = 1; h < groups; ++h) t = device_sum<Acc>::combine(t, shared[(2 * h + k) * span + p]);
      partial[(blockIdx.x * cols + col) * 2 + k] = t;
    }
  }
}

// dx = rstd (g - mean_j(g) - xhat mean_j(g xhat)), g = dy gamma.
template <class M, class Acc, class DY, class X, class G, class S, class DX>
__global__ void layer_norm_backward_rows(const DY* dy, const X* x, const G* gamma, const S* mean,
                                         const S* rstd, DX* dx, std::size_t cols) {
  using V = typename accumulator<Acc>::value_type;
  const std::size_t base = blockIdx.x * cols;
  const M mu = static_cast<M>(mean[blockIdx.x]), rs = static_cast<M>(rstd[blockIdx.x]);
  accumulator<Acc> sg, sgx;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M g = device_load<M>(dy[base + j]) * device_load<M>(gamma[j]);
    const M xh = (device_load<M>(x[base + j]) - mu) * rs;
    sg.add(V(g));
    sgx.add(V(g * xh));
  }
  const M a = block_sum<M>(sg) / M(cols);
  const M b = block_sum<M>(sgx) / M(cols);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M g = device_load<M>(dy[base + j]) * device_load<M>(gamma[j]);
    const M xh = (device_load<M>(x[base + j]) - mu) * rs;
    dx[base + j] = round_to<DX>(rs * (g - a - xh * b));
  }
}

/// Layer norm's dgamma and dbeta terms of element (r, col): dy * xhat and dy.
template <class M, class DY, class X, class S>
struct layer_norm_param_terms {
  const DY* dy;
  const X* x;
  const S* mean;
  const S* rstd;
  std::size_t cols;
  static constexpr int pack_elements = pack_width<DY, X>;
  __device__ term_values<M, 2> operator()(std::size_t r, std::size_t col) const {
    const M gy = device_load<M>(dy[r * cols + col]);
    const M xh = (device_load<M>(x[r * cols + col]) - static_cast<M>(mean[r])) * static_cast<M>(rstd[r]);
    return {{gy * xh, gy}};
  }
  /// Columns col .. col + V - 1 of row r, their terms column by column.
  template <int V>
  __device__ term_values<M, 2 * V> pack(std::size_t r, std::size_t col) const {
    const auto g = load_pack<V>(dy + r * cols + col);
    const auto v = load_pack<V>(x + r * cols + col);
    const M mu = static_cast<M>(mean[r]), rs = static_cast<M>(rstd[r]);
    term_values<M, 2 * V> t;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const M gy = device_load<M>(g.v[e]);
      const M xh = (device_load<M>(v.v[e]) - mu) * rs;
      t.v[2 * e] = gy * xh;
      t.v[2 * e + 1] = gy;
    }
    return t;
  }
  template <int V>
  bool aligned() const {
    return pack_aligned<V>(dy, x);
  }
};

/// dgamma[col] and dbeta[col] from their column sums, each rounded once.
template <class DG, class DB>
struct store_layer_norm_params {
  DG* dgamma;
  DB* dbeta;
  template <class V>
  __device__ void operator()(std::size_t col, const V* t) const {
    dgamma[col] = round_to<DG>(t[0]);
    dbeta[col] = round_to<DB>(t[1]);
  }
};

/// Batch norm's statistics from each channel's moments (reduce.hpp's channel_moments_in):
/// mean[c] and rstd[c] in M for the normalisation, the saved statistics, and PyTorch's running
/// update (the unbiased variance), as the host's batch_norm_train.
template <class M, class R, class S>
struct batch_norm_statistics {
  M* mean;
  M* rstd;
  S* save_mean;
  S* save_rstd;
  R* running_mean;
  R* running_var;
  M count, eps, momentum;
  template <class A>
  __device__ void operator()(std::size_t c, const moments<A>& m) const {
    const M mu = static_cast<M>(m.mean);
    const M var = static_cast<M>(m.m2) / count;
    const M rs = M(1) / ::sqrt(var + eps);
    mean[c] = mu;
    rstd[c] = rs;
    save_mean[c] = static_cast<S>(mu);
    save_rstd[c] = static_cast<S>(rs);
    const M unbiased = var * count / (count - M(1));
    running_mean[c] = static_cast<R>((M(1) - momentum) * static_cast<M>(running_mean[c]) + momentum * mu);
    running_var[c] = static_cast<R>((M(1) - momentum) * static_cast<M>(running_var[c]) + momentum * unbiased);
  }
};

/// y = (x - mean[c]) rstd[c] gamma[c] + beta[c], per element, rounded once (mean and rstd
/// in M; or, Running, the running statistics in R for inference, rstd from the variance);
/// Relu: relu_fn of the rounded y, as detail::relu_of_stored on the host.
template <class M, class X, class G, class B, class T, class Y, bool Running, bool Relu>
struct batch_norm_normalise {
  const X* x;
  const G* gamma;
  const B* beta;
  const T* mean;
  const T* scale;  // rstd, or the running variance when Running
  Y* y;
  M eps;
  static constexpr int pack_elements = pack_width<X, Y>;  ///< elements per 16-byte access
  /// A channel's constants, read once per thread and channel (plane_elements).
  struct channel {
    M mu, rs, g, b;
  };
  __device__ channel constants(std::size_t c) const {
    channel k;
    k.mu = static_cast<M>(mean[c]);
    if constexpr (Running) {
      k.rs = M(1) / ::sqrt(static_cast<M>(scale[c]) + eps);
    } else {
      k.rs = static_cast<M>(scale[c]);
    }
    k.g = device_load<M>(gamma[c]);
    k.b = device_load<M>(beta[c]);
    return k;
  }
  /// The V elements from `at`, element e with the constants ch[e * step].
  template <int V>
  __device__ void apply(const channel* ch, int step, std::size_t at) const {
    const auto in = load_pack<V>(x + at);
    pack<Y, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const channel& k = ch[e * step];
      out.v[e] = round_to<Y>((device_load<M>(in.v[e]) - k.mu) * k.rs * k.g + k.b);
      if constexpr (Relu) out.v[e] = round_to<Y>(relu_fn<M>{}(device_load<M>(out.v[e])));
    }
    store_pack<V>(y + at, out);
  }
  /// Whether packs of V may be read and written.
  template <int V>
  bool aligned() const {
    return pack_aligned<V>(x, y);
  }
};

/// The gradient batch norm's backward pass reads: dy; or, with a fused ReLU (Z not void),
/// relu_grad_fn of dz where z, the stored relu(y), is positive (as the host's
/// batch_norm_backward_of).
template <class DY, class Z>
using relu_mask_t = std::conditional_t<std::is_void_v<Z>, DY, Z>;  ///< DY where unmasked (not read)
template <class M, class DY, class Z>
struct batch_norm_dy {
  static constexpr bool masked = !std::is_void_v<Z>;
  using mask_type = relu_mask_t<DY, Z>;
  const DY* dy;
  const mask_type* z;
  __device__ M operator()(std::size_t at) const {
    if constexpr (masked) {
      return relu_grad_fn<M>{}(device_load<M>(dy[at]), device_load<M>(z[at]));
    } else {
      return device_load<M>(dy[at]);
    }
  }
  /// The V gradients from `at`.
  template <int V>
  __device__ pack<M, V> load(std::size_t at) const {
    const auto gs = load_pack<V>(dy + at);
    pack<M, V> out;
    if constexpr (masked) {
      const auto zs = load_pack<V>(z + at);
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = relu_grad_fn<M>{}(device_load<M>(gs.v[e]), device_load<M>(zs.v[e]));
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = device_load<M>(gs.v[e]);
    }
    return out;
  }
  template <int V>
  bool aligned() const {
    if constexpr (masked) {
      return pack_aligned<V>(dy, z);
    } else {
      return pack_aligned<V>(dy);
    }
  }
};

/// Batch norm's backward terms of the element at `at`, of channel c: dy and dy xhat.
template <class M, class DY, class X, class S, class Z = void>
struct batch_norm_grad_terms {
  batch_norm_dy<M, DY, Z> dy;
  const X* x;
  const S* save_mean;
  const S* save_rstd;
  static constexpr int pack_elements = pack_width<DY, X, typename batch_norm_dy<M, DY, Z>::mask_type>;
  __device__ term_values<M, 2> operator()(std::size_t at, std::size_t c) const {
    const M g = dy(at);
    const M xh = (device_load<M>(x[at]) - static_cast<M>(save_mean[c])) * static_cast<M>(save_rstd[c]);
    return {{g, g * xh}};
  }
  /// The V elements from `at`, of channels c .. c + V - 1 (channels-last), their terms
  /// element by element.
  template <int V>
  __device__ term_values<M, 2 * V> pack(std::size_t at, std::size_t c) const {
    const auto gs = dy.template load<V>(at);
    const auto xs = load_pack<V>(x + at);
    term_values<M, 2 * V> t;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const M g = gs.v[e];
      const M xh = (device_load<M>(xs.v[e]) - static_cast<M>(save_mean[c + e])) * static_cast<M>(save_rstd[c + e]);
      t.v[2 * e] = g;
      t.v[2 * e + 1] = g * xh;
    }
    return t;
  }
  template <int V>
  bool aligned() const {
    return dy.template aligned<V>() && pack_aligned<V>(x);
  }
};

/// The backward sums' finish: dbeta = sum(dy), dgamma = sum(dy xhat), and the channel's
/// mean of each (a, b) for dx.
template <class M, class DG, class DB>
struct batch_norm_grad_sums {
  DG* dgamma;
  DB* dbeta;
  M* ab;
  M count;
  template <class V>
  __device__ void operator()(std::size_t c, const V* t) const {
    const M sum_dy = M(t[0]), sum_dyx = M(t[1]);
    dbeta[c] = round_to<DB>(sum_dy);
    dgamma[c] = round_to<DG>(sum_dyx);
    ab[2 * c] = sum_dy / count;
    ab[2 * c + 1] = sum_dyx / count;
  }
};

/// dx = gamma rstd (dy - a - xhat b) per element, rounded once.
template <class M, class DY, class X, class G, class S, class DX, class Z = void>
struct batch_norm_input_grad {
  batch_norm_dy<M, DY, Z> dy;
  const X* x;
  const G* gamma;
  const S* save_mean;
  const S* save_rstd;
  const M* ab;
  DX* dx;
  /// Elements per 16-byte access.
  static constexpr int pack_elements = pack_width<DY, X, DX, typename batch_norm_dy<M, DY, Z>::mask_type>;
  /// A channel's constants, read once per thread and channel (plane_elements).
  struct channel {
    M rs, mu, k, a, b;
  };
  __device__ channel constants(std::size_t c) const {
    channel k;
    k.rs = static_cast<M>(save_rstd[c]);
    k.mu = static_cast<M>(save_mean[c]);
    k.k = device_load<M>(gamma[c]) * k.rs;
    k.a = ab[2 * c];
    k.b = ab[2 * c + 1];
    return k;
  }
  /// The V elements from `at`, element e with the constants ch[e * step].
  template <int V>
  __device__ void apply(const channel* ch, int step, std::size_t at) const {
    const auto xs = load_pack<V>(x + at);
    const auto gs = dy.template load<V>(at);
    pack<DX, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const channel& c = ch[e * step];
      const M xh = (device_load<M>(xs.v[e]) - c.mu) * c.rs;
      out.v[e] = round_to<DX>(c.k * (gs.v[e] - c.a - xh * c.b));
    }
    store_pack<V>(dx + at, out);
  }
  /// Whether packs of V may be read and written.
  template <int V>
  bool aligned() const {
    return dy.template aligned<V>() && pack_aligned<V>(x, dx);
  }
};

/// Runs f(std::bool_constant<relu>{}) for `act`: a fused ReLU is a template argument of the
/// elementwise kernels, not a branch per element.
template <class F>
void with_relu(fused_activation act, F&& f) {
  if (act == fused_activation::relu) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace detail::cuda

/// Layer norm over the last axis on the device (see the host layer_norm): y, and the
/// statistics `mean` and `rstd` the backward pass needs.
template <Policy P, kernel_element X, kernel_element G, kernel_element B, kernel_element Y,
          statistics_element S, std::size_t N>
  requires(N >= 1)
void layer_norm(cuda_context& ctx, const device_tensor<X, N>& x, const device_tensor<G, 1>& gamma,
                const device_tensor<B, 1>& beta, device_tensor<Y, N>& y,
                device_tensor<S, N - 1>& mean, device_tensor<S, N - 1>& rstd, double eps = 1e-5) {
  using M = detail::math_t<op::layer_norm, P, X, G, B>;
  using Acc = detail::accumulate_t<op::layer_norm, P>;
  const std::array<std::size_t, 1> d{x.shape()[N - 1]};
  check_shape("precis::layer_norm: gamma", gamma, d);
  check_shape("precis::layer_norm: beta", beta, d);
  check_shape("precis::layer_norm: y", y, x.shape());
  check_shape("precis::layer_norm: mean", mean, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm: rstd", rstd, detail::shape_without<N>(x, N - 1));
  detail::check_argument(d[0] > 0, "precis::layer_norm: x", "has an empty last axis");
  detail::check_eps("precis::layer_norm", eps);
  const std::size_t rows = mean.size();
  if (rows == 0) return;
  if (d[0] <= detail::resident_row_limit) {
    constexpr int V = detail::cuda::pack_width<X>;
    const bool packed =
        d[0] % V == 0 && detail::cuda::pack_aligned<V>(x.data(), gamma.data(), beta.data(), y.data());
    detail::cuda::with_resident_rows<V>(rows, d[0], packed, true, [&](auto group, auto slots, auto width,
                                                                       unsigned blocks, unsigned threads) {
      detail::cuda::layer_norm_resident<decltype(group), M, Acc, decltype(width)::value, decltype(slots)::value>
          <<<blocks, threads, 0, ctx.stream()>>>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                                 rstd.data(), rows, d[0], static_cast<M>(eps), packed);
    });
  } else {
    detail::cuda::layer_norm_rows<M, Acc><<<detail::cuda::row_blocks(rows, "precis::layer_norm"),
                                            detail::cuda::row_threads, 0, ctx.stream()>>>(
        x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), d[0], static_cast<M>(eps));
  }
  check(cudaGetLastError(), "precis::layer_norm");
}

/// Gradients of layer_norm on the device from the saved `mean` and `rstd` (see the host
/// layer_norm_backward).
template <Policy P, kernel_element DY, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 1)
void layer_norm_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                         const device_tensor<X, N>& x, const device_tensor<G, 1>& gamma,
                         const device_tensor<S, N - 1>& mean, const device_tensor<S, N - 1>& rstd,
                         device_tensor<DX, N>& dx, device_tensor<DG, 1>& dgamma,
                         device_tensor<DB, 1>& dbeta) {
  using M = detail::math_t<op::layer_norm, P, DY, X, G>;
  using Acc = detail::accumulate_t<op::layer_norm, P>;
  const std::array<std::size_t, 1> d{x.shape()[N - 1]};
  check_same_shape("precis::layer_norm_backward: dy and x", dy, x);
  check_shape("precis::layer_norm_backward: gamma", gamma, d);
  check_shape("precis::layer_norm_backward: mean", mean, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm_backward: rstd", rstd, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm_backward: dx", dx, x.shape());
  check_shape("precis::layer_norm_backward: dgamma", dgamma, d);
  check_shape("precis::layer_norm_backward: dbeta", dbeta, d);
  const std::size_t rows = mean.size(), cols = d[0];
  if (cols == 0) return;
  const auto params = detail::cuda::store_layer_norm_params<DG, DB>{dgamma.data(), dbeta.data()};
  constexpr std::string_view params_name = "precis::layer_norm_backward (dgamma, dbeta)";
  if (rows != 0) {
    if (cols <= detail::resident_row_limit) {
      constexpr int V = detail::cuda::pack_width<DY, X>;
      const bool packed =
          cols % V == 0 && detail::cuda::pack_aligned<V>(dy.data(), x.data(), gamma.data(), dx.data());
      using A = typename accumulator<Acc>::value_type;
      // The blocks, and so the order of each column's additions, from the widest pack, so
      // that the sums do not depend on the alignment (unpacked rows need no more shared
      // memory: fused_norm_rows_for).
      const auto fused = detail::fused_norm_rows_for(rows, cols, V, sizeof(A));
      if (fused.groups != 0) {
        // dx and the column sums' first pass in one kernel (dy and x read once), then the
        // blocks' partial sums added column by column.
        const std::size_t blocks = (rows + fused.block_rows - 1) / fused.block_rows;
        device_tensor<A, 1> partial({blocks * cols * 2}, ctx.stream());
        detail::cuda::with_resident_rows<V>(rows, cols, packed, false, [&](auto group, auto slots, auto width,
                                                                            unsigned, unsigned threads) {
          using Group = decltype(group);
          const unsigned block = std::is_same_v<Group, detail::cuda::warp_per_row> ? unsigned(32 * fused.groups)
                                                                                   : threads;
          detail::cuda::layer_norm_backward_fused<Group, M, Acc, decltype(width)::value, decltype(slots)::value>
              <<<detail::cuda::row_blocks(blocks, "precis::layer_norm_backward"), block, fused.shared_bytes,
                 ctx.stream()>>>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), rows,
                                 cols, packed, fused.block_rows, partial.data());
        });
        check(cudaGetLastError(), "precis::layer_norm_backward");
        detail::cuda::launch_column_totals<Acc, 2>(ctx, partial.data(), blocks, cols, params, params_name);
        return;
      }
      detail::cuda::with_resident_rows<V>(rows, cols, packed, false, [&](auto group, auto slots, auto width,
                                                                          unsigned blocks, unsigned threads) {
        detail::cuda::layer_norm_backward_resident<decltype(group), M, Acc, decltype(width)::value,
                                                   decltype(slots)::value>
            <<<blocks, threads, 0, ctx.stream()>>>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                                                   dx.data(), rows, cols, packed);
      });
    } else {
      detail::cuda::layer_norm_backward_rows<M, Acc>
          <<<detail::cuda::row_blocks(rows, "precis::layer_norm_backward"), detail::cuda::row_threads, 0,
             ctx.stream()>>>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), cols);
    }
    check(cudaGetLastError(), "precis::layer_norm_backward");
  }
  if (rows == 0) {
    check(cudaMemsetAsync(dgamma.data(), 0, cols * sizeof(DG), ctx.stream()), "cudaMemsetAsync");
    check(cudaMemsetAsync(dbeta.data(), 0, cols * sizeof(DB), ctx.stream()), "cudaMemsetAsync");
    return;
  }
  detail::cuda::column_reduce<Acc, 2>(
      ctx, rows, cols,
      detail::cuda::layer_norm_param_terms<M, DY, X, S>{dy.data(), x.data(), mean.data(), rstd.data(), cols},
      params, params_name);
}

/// Batch norm in training mode on the device (see the host batch_norm_train: channels on
/// axis 1, PyTorch's momentum and unbiased running variance, save_mean / save_rstd for the
/// backward pass). Channels-last images (`layout` nhwc: channels on the last axis) take
/// channel_reduce_in's column order for the statistics, and coalesced elementwise passes.
/// `act` as the host's: fused_activation::relu stores relu(y) in the same pass.
template <Policy P, kernel_element X, kernel_element G, kernel_element B, statistics_element R,
          kernel_element Y, statistics_element S, std::size_t N>
  requires(N >= 2)
void batch_norm_train(cuda_context& ctx, const device_tensor<X, N>& x, const device_tensor<G, 1>& gamma,
                      const device_tensor<B, 1>& beta, device_tensor<R, 1>& running_mean,
                      device_tensor<R, 1>& running_var, device_tensor<Y, N>& y,
                      device_tensor<S, 1>& save_mean, device_tensor<S, 1>& save_rstd,
                      double momentum = 0.1, double eps = 1e-5, image_layout layout = image_layout::nchw,
                      fused_activation act = fused_activation::none) {
  using M = detail::math_t<op::batch_norm, P, X, G, B>;
  using Acc = detail::accumulate_t<op::batch_norm, P>;
  constexpr std::string_view name = "precis::batch_norm_train";
  const bool last = layout == image_layout::nhwc;
  detail::check_batch_norm_train<N>(name, x, gamma, beta, running_mean, running_var, y, save_mean, save_rstd,
                                    momentum, eps, last);
  const auto d = detail::batch_norm_dims(x, last);
  if (d[1] == 0) return;
  // Each channel's moments, x read once (each share's in two passes over the values it
  // holds, as the host's two passes; reduce.hpp's channel_moments_in); then y elementwise.
  const M count = static_cast<M>(d[0] * d[2]);
  device_tensor<M, 1> stats({2 * d[1]}, ctx.stream());  // mean, then rstd
  M* mean = stats.data();
  M* rstd = stats.data() + d[1];
  detail::cuda::channel_moments_in<Acc, M>(
      ctx, layout, d[0], d[1], d[2], x.data(),
      detail::cuda::batch_norm_statistics<M, R, S>{mean, rstd, save_mean.data(), save_rstd.data(),
                                                   running_mean.data(), running_var.data(), count,
                                                   static_cast<M>(eps), static_cast<M>(momentum)},
      name);
  detail::cuda::with_relu(act, [&](auto relu) {
    detail::cuda::plane_elements(ctx, d[0], d[1], d[2],
                                 detail::cuda::batch_norm_normalise<M, X, G, B, M, Y, false, decltype(relu)::value>{
                                     x.data(), gamma.data(), beta.data(), mean, rstd, y.data(), M(0)},
                                 name, layout);
  });
}

/// Batch norm in inference mode on the device, from the running statistics (see the host
/// batch_norm_infer; the same formula as training mode; `layout` and `act` as
/// batch_norm_train's).
template <Policy P, kernel_element X, kernel_element G, kernel_element B, statistics_element R,
          kernel_element Y, std::size_t N>
  requires(N >= 2)
void batch_norm_infer(cuda_context& ctx, const device_tensor<X, N>& x, const device_tensor<G, 1>& gamma,
                      const device_tensor<B, 1>& beta, const device_tensor<R, 1>& running_mean,
                      const device_tensor<R, 1>& running_var, device_tensor<Y, N>& y, double eps = 1e-5,
                      image_layout layout = image_layout::nchw, fused_activation act = fused_activation::none) {
  using M = detail::math_t<op::batch_norm, P, X, G, B>;
  constexpr std::string_view name = "precis::batch_norm_infer";
  const bool last = layout == image_layout::nhwc;
  detail::check_batch_norm_infer<N>(name, x, gamma, beta, running_mean, running_var, y, eps, last);
  const auto d = detail::batch_norm_dims(x, last);
  detail::cuda::with_relu(act, [&](auto relu) {
    detail::cuda::plane_elements(ctx, d[0], d[1], d[2],
                                 detail::cuda::batch_norm_normalise<M, X, G, B, R, Y, true, decltype(relu)::value>{
                                     x.data(), gamma.data(), beta.data(), running_mean.data(), running_var.data(),
                                     y.data(), static_cast<M>(eps)},
                                 name, layout);
  });
}

namespace detail::cuda {

/// batch_norm_backward, and with z (not null; Z not void) batch_norm_relu_backward (see
/// the host's batch_norm_backward_of).
template <Policy P, class Z, class DY, class X, class G, class S, class DX, class DG, class DB, std::size_t N>
void batch_norm_backward_of(std::string_view name, cuda_context& ctx, const device_tensor<DY, N>& dy,
                            const relu_mask_t<DY, Z>* z, const device_tensor<X, N>& x,
                            const device_tensor<G, 1>& gamma, const device_tensor<S, 1>& save_mean,
                            const device_tensor<S, 1>& save_rstd, device_tensor<DX, N>& dx,
                            device_tensor<DG, 1>& dgamma, device_tensor<DB, 1>& dbeta, image_layout layout) {
  using M = math_t<op::batch_norm, P, DY, X, G>;
  using Acc = accumulate_t<op::batch_norm, P>;
  const bool last = layout == image_layout::nhwc;
  check_batch_norm_backward<N>(name, dy, x, gamma, save_mean, save_rstd, dx, dgamma, dbeta, last);
  const auto d = batch_norm_dims(x, last);
  const std::size_t count = d[0] * d[2];
  if (count == 0 || d[1] == 0) return;
  // dbeta = sum(dy) and dgamma = sum(dy xhat) per channel (a channel reduction), then
  // dx = gamma rstd (dy - dbeta / count - xhat dgamma / count) elementwise.
  const batch_norm_dy<M, DY, Z> g{dy.data(), z};
  device_tensor<M, 1> ab({2 * d[1]}, ctx.stream());
  channel_reduce_in<Acc, 2>(ctx, layout, d[0], d[1], d[2],
                            batch_norm_grad_terms<M, DY, X, S, Z>{g, x.data(), save_mean.data(), save_rstd.data()},
                            batch_norm_grad_sums<M, DG, DB>{dgamma.data(), dbeta.data(), ab.data(),
                                                            static_cast<M>(count)},
                            name);
  plane_elements(ctx, d[0], d[1], d[2],
                 batch_norm_input_grad<M, DY, X, G, S, DX, Z>{g, x.data(), gamma.data(), save_mean.data(),
                                                                save_rstd.data(), ab.data(), dx.data()},
                 name, layout);
}

}  // namespace detail::cuda

/// Gradients of batch_norm_train on the device from its saved statistics (see the host
/// batch_norm_backward; `layout` as batch_norm_train's).
template <Policy P, kernel_element DY, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 2)
void batch_norm_backward(cuda_context& ctx, const device_tensor<DY, N>& dy, const device_tensor<X, N>& x,
                         const device_tensor<G, 1>& gamma, const device_tensor<S, 1>& save_mean,
                         const device_tensor<S, 1>& save_rstd, device_tensor<DX, N>& dx,
                         device_tensor<DG, 1>& dgamma, device_tensor<DB, 1>& dbeta,
                         image_layout layout = image_layout::nchw) {
  detail::cuda::batch_norm_backward_of<P, void>("precis::batch_norm_backward", ctx, dy, nullptr, x, gamma, save_mean,
                                                save_rstd, dx, dgamma, dbeta, layout);
}

/// Gradients of z = relu(batch_norm_train(x)) on the device from dz and z (see the host
/// batch_norm_relu_backward; `layout` as batch_norm_train's).
template <Policy P, kernel_element DZ, kernel_element Z, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 2)
void batch_norm_relu_backward(cuda_context& ctx, const device_tensor<DZ, N>& dz, const device_tensor<Z, N>& z,
                              const device_tensor<X, N>& x, const device_tensor<G, 1>& gamma,
                              const device_tensor<S, 1>& save_mean, const device_tensor<S, 1>& save_rstd,
                              device_tensor<DX, N>& dx, device_tensor<DG, 1>& dgamma, device_tensor<DB, 1>& dbeta,
                              image_layout layout = image_layout::nchw) {
  constexpr std::string_view name = "precis::batch_norm_relu_backward";
  check_same_shape(std::string(name) + ": z and x", z, x);
  detail::cuda::batch_norm_backward_of<P, Z>(name, ctx, dz, z.data(), x, gamma, save_mean, save_rstd, dx, dgamma,
                                             dbeta, layout);
}

}  // namespace precis

#endif
