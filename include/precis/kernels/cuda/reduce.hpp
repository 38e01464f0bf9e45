/// @file
/// Sum, mean, max and L2 norm of device tensors, over all elements or along one axis, with the
/// calls of kernels/reduce.hpp (a cuda_context in place of the cpu_context), and the
/// per-channel sums of a convolution's bias gradient (conv2d_backward_bias), and the gradients of
/// a broadcast add and mul (add_backward, mul_backward: the broadcast operand's gradient is a
/// column sum, so they are here rather than in kernels/cuda/elementwise.hpp).
///
/// A whole-tensor reduction cannot return its value without the host waiting for the
/// device, so on the device it writes it to a one-element device tensor (`out`, shape {1},
/// rounded once to its element type) and returns at once; read it when you need it.
///
/// Order of additions: an axis reduction gives each output element to one thread, which
/// adds its axis in index order in the accumulate type -- the host's order, so the result
/// is the host's. A whole-tensor reduction runs in two passes: a number of blocks that
/// depends only on the element count (never on the device) each reduce a strided share
/// (each thread in element order, eight loads in flight before their additions, then the
/// block's threads in a fixed tree), and one block
/// adds the partial results in block order. Repeated calls give the same bits; the host's
/// single running sum may differ in the last places. Both passes keep sums in the policy's
/// accumulate type (rounded after every addition when narrower than float, as on the host).
/// Compiled by nvcc only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/conv.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/reduce.hpp>

#if defined(__CUDACC__)

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis {

namespace detail::cuda {

/// K values of one element, what a reduction's term functor returns.
template <class V, int K>
struct term_values {
  V v[K];
};

/// A running sum in Acc: its state, adding a term, combining two partial sums.
template <class Acc>
struct device_sum {
  using state = typename accumulator<Acc>::value_type;
  __device__ static state init() { return state(0); }
  __device__ static state combine(state a, state b) {
    accumulator<Acc> s(a);
    s.add(b);
    return s.value();
  }
  template <class M>
  __device__ static state add(state s, M x) {
    return combine(s, state(x));
  }
};

/// The largest value, NaN winning (the host's max_reducer).
template <class M>
struct device_max {
  using state = M;
  __device__ static state init() { return -static_cast<M>(INFINITY); }
  __device__ static state combine(state a, state b) { return max_nan(a, b); }
  __device__ static state add(state s, M x) { return max_nan(s, x); }
};

template <class Red>
struct combine_op {
  __device__ typename Red::state operator()(typename Red::state a, typename Red::state b) const {
    return Red::combine(a, b);
  }
};

/// Adds terms(i) for i = first, first + step, .. below end to the K states s with Red, in
/// that order; the terms of U consecutive steps are read before any of them is added, so that
/// U loads per thread are in flight together (the order of additions, and so every result,
/// is that of the plain loop).
template <class Red, int K, int U = 8, class Terms>
__device__ __forceinline__ void add_strided(typename Red::state (&s)[K], std::size_t first, std::size_t step,
                                            std::size_t end, const Terms& terms) {
  std::size_t i = first;
  for (; i < end && end - i > (U - 1) * step; i += U * step) {
    decltype(terms(i)) t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) t[u] = terms(i + u * step);
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] = Red::add(s[k], t[u].v[k]);
    }
  }
  for (; i < end; i += step) {
    const auto t = terms(i);
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = Red::add(s[k], t.v[k]);
  }
}

/// The V elements from p (one access of V elements: load_pack) as K = V terms in M.
template <class M, int V, class T>
__device__ __forceinline__ term_values<M, V> load_terms(const T* p) {
  const auto in = load_pack<V>(p);
  term_values<M, V> t;
#pragma unroll
  for (int e = 0; e < V; ++e) t.v[e] = device_load<M>(in.v[e]);
  return t;
}

inline constexpr unsigned reduce_threads = 256;

/// Blocks of a whole-tensor reduction's first pass: a function of n alone, so that the
/// order of additions, and so the result, is the same on every device.
inline unsigned reduce_blocks(std::size_t n) {
  constexpr std::size_t per_block = std::size_t(reduce_threads) * 16;
  return unsigned(std::clamp<std::size_t>((n + per_block - 1) / per_block, 1, 1024));
}

/// First pass: each block reduces the terms of its strided share into K partial states.
template <class Red, int K, class Terms>
__global__ void reduce_partials(Terms terms, std::size_t n, typename Red::state* partials) {
  __shared__ typename Red::state shared[32];
  typename Red::state s[K];
  for (int k = 0; k < K; ++k) s[k] = Red::init();
  add_strided<Red>(s, blockIdx.x * std::size_t(blockDim.x) + threadIdx.x, std::size_t(gridDim.x) * blockDim.x, n,
                   terms);
  for (int k = 0; k < K; ++k) {
    const auto r = block_reduce(s[k], combine_op<Red>{}, shared);
    if (threadIdx.x == 0) partials[blockIdx.x * K + k] = r;
  }
}

/// Second pass (one block): the partial states combined in block order, then
/// finish(totals) by thread 0.
template <class Red, int K, class Finish>
__global__ void reduce_final(const typename Red::state* partials, unsigned count, Finish finish) {
  __shared__ typename Red::state shared[32];
  typename Red::state total[K];
  for (int k = 0; k < K; ++k) {
    typename Red::state s = Red::init();
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x)
      s = Red::combine(s, partials[i * K + k]);
    total[k] = block_reduce(s, combine_op<Red>{}, shared);
  }
  if (threadIdx.x == 0) finish(total);
}

/// Reduces terms(i), i in [0, n) (K values each) with Red, then calls finish(totals) on the
/// device. Queued on ctx's stream.
template <class Red, int K, class Terms, class Finish>
void reduce_terms(cuda_context& ctx, std::size_t n, const Terms& terms, const Finish& finish,
                  std::string_view name) {
  const unsigned blocks = reduce_blocks(n);
  device_tensor<typename Red::state, 1> partials({std::size_t(blocks) * K}, ctx.stream());
  reduce_partials<Red, K><<<blocks, reduce_threads, 0, ctx.stream()>>>(terms, n, partials.data());
  check(cudaGetLastError(), name);
  reduce_final<Red, K><<<1, reduce_threads, 0, ctx.stream()>>>(partials.data(), blocks, finish);
  check(cudaGetLastError(), name);
}

enum class reduce_kind { sum, mean, max, l2 };

template <reduce_kind Kind, class M, class Acc>
using device_reducer_t =
    std::conditional_t<Kind == reduce_kind::max, device_max<M>, device_sum<Acc>>;

/// What an element adds: itself, or its square for the L2 norm.
template <reduce_kind Kind, class M>
__device__ inline M reduce_term(M v) {
  if constexpr (Kind == reduce_kind::l2) {
    return v * v;
  } else {
    return v;
  }
}

/// The result from the final state of `count` elements (the host reducers' finish).
template <reduce_kind Kind, class R, class S>
__device__ inline R reduce_finish(S s, std::size_t count) {
  if constexpr (Kind == reduce_kind::mean) {
    return R(s) / static_cast<R>(count);
  } else if constexpr (Kind == reduce_kind::l2) {
    return ::sqrt(R(s));
  } else {
    return R(s);
  }
}

template <reduce_kind Kind, class M, class T>
struct tensor_terms {
  const T* x;
  __device__ term_values<M, 1> operator()(std::size_t i) const {
    return {{reduce_term<Kind>(device_load<M>(x[i]))}};
  }
};

template <reduce_kind Kind, class R, class U>
struct scalar_finish {
  U* out;
  std::size_t count;
  template <class S>
  __device__ void operator()(const S* totals) const {
    out[0] = round_to<U>(reduce_finish<Kind, R>(totals[0], count));
  }
};

/// out[o * inner + i] = reduction over k of x[(o * count + k) * inner + i], one thread per
/// output element, k in order (eight loads in flight: add_strided).
template <reduce_kind Kind, class M, class Acc, class R, class T, class U>
__global__ void reduce_axis_kernel(const T* x, std::size_t outer, std::size_t count,
                                   std::size_t inner, U* out) {
  using Red = device_reducer_t<Kind, M, Acc>;
  for (std::size_t idx = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; idx < outer * inner;
       idx += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t o = idx / inner, i = idx % inner;
    const T* col = x + o * count * inner + i;
    typename Red::state s[1] = {Red::init()};
    add_strided<Red>(s, 0, inner, count * inner, [&](std::size_t at) {
      return term_values<M, 1>{{reduce_term<Kind>(device_load<M>(col[at]))}};
    });
    out[idx] = round_to<U>(reduce_finish<Kind, R>(s[0], count));
  }
}

/// reduce_axis_kernel for count >= axis_stage_min_count, the same additions in the same
/// order (so the same bits): the outputs in tiles of Outputs (kernels/common.hpp's
/// axis_tile; Rows where inner == 1), each tile's k values a stage of axis_stage_bytes at a
/// time through shared memory, loaded by the block's threads with coalesced loads (the next
/// stage's while the current one is added), then added by one thread per output in k order.
/// One thread per output reading global memory directly keeps too few loads in flight where
/// the outputs are few (0.04 of copy bandwidth for 8192 sums of 4096), and reads rows
/// uncoalesced where inner == 1.
template <reduce_kind Kind, class M, class Acc, class R, bool Rows, unsigned Outputs, class T, class U>
__global__ void __launch_bounds__(axis_stage_threads)
    reduce_axis_staged(const T* x, std::size_t count, std::size_t inner, std::size_t total, U* out) {
  using Red = device_reducer_t<Kind, M, Acc>;
  using Tile = axis_tile<Rows, Outputs, sizeof(T)>;
  __shared__ alignas(16) unsigned char raw[Tile::size * sizeof(T)];
  T* tile = reinterpret_cast<T*>(raw);
  const unsigned t = threadIdx.x;
  const std::size_t tiles = (total + Outputs - 1) / Outputs, stages = (count + Tile::ks - 1) / Tile::ks;
  for (std::size_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    const std::size_t first = b * Outputs;  // the tile's first output
    // This thread's first load (place(t, 0)) and the step between its loads: a pointer kept
    // and advanced, so that no address per load is held across the stages.
    unsigned j0 = 0, kk0 = 0;
    Tile::place(t, 0, j0, kk0);
    std::size_t start = 0;  // the offset of (j0, k = 0)
    if constexpr (Rows) {
      start = (first + j0) * count;
    } else {
      const std::size_t idx = first + j0;
      start = idx / inner * count * inner + idx % inner;
    }
    T v[Tile::per_thread]{};
    const auto load = [&](std::size_t stage) {
      const std::size_t k0 = stage * Tile::ks;
      if constexpr (Rows) {
        constexpr unsigned per_row = Tile::ks / Tile::lanes;
        const T* p = x + start + k0 + kk0;
#pragma unroll
        for (unsigned g = 0; g < Tile::per_thread / per_row; ++g) {
          const bool row = first + j0 + g * Tile::rows_at_once < total;
#pragma unroll
          for (unsigned s = 0; s < per_row; ++s) {
            if (row && k0 + kk0 + s * Tile::lanes < count) v[g * per_row + s] = p[s * Tile::lanes];
          }
          p += Tile::rows_at_once * count;
        }
      } else {
        constexpr unsigned step = axis_stage_threads / Outputs;
        const T* p = x + start + (k0 + kk0) * inner;
        const bool output = first + j0 < total;
#pragma unroll
        for (unsigned n = 0; n < Tile::per_thread; ++n) {
          if (output && k0 + kk0 + n * step < count) v[n] = *p;
          p += step * inner;
        }
      }
    };
    typename Red::state s = Red::init();
    load(0);
    for (std::size_t stage = 0; stage < stages; ++stage) {
#pragma unroll
      for (unsigned n = 0; n < Tile::per_thread; ++n) {
        unsigned j = 0, kk = 0;
        Tile::place(t, n, j, kk);
        tile[Tile::offset(j, kk)] = v[n];  // values past the tile's edges are never added
      }
      __syncthreads();
      if (stage + 1 < stages) load(stage + 1);
      if (t < Outputs) {
        const std::size_t k0 = stage * Tile::ks, left = count - k0;
        const unsigned n = left < Tile::ks ? unsigned(left) : Tile::ks;
#pragma unroll 8
        for (unsigned kk = 0; kk < n; ++kk) {
          s = Red::add(s, reduce_term<Kind>(device_load<M>(tile[Tile::offset(t, kk)])));
        }
      }
      __syncthreads();
    }
    if (t < Outputs && first + t < total) out[first + t] = round_to<U>(reduce_finish<Kind, R>(s, count));
  }
}

/// Rows summed per partial sum of column_sums: a constant, so that the order of additions,
/// and so the result, is the same on every device and for every launch.
inline constexpr std::size_t column_slab_rows = 64;

/// A column reduction's terms for V consecutive columns: terms.pack<V>(r, col) (the terms of
/// columns col .. col + V - 1, column by column, K each), or terms(r, col) for V = 1.
template <int V, class Terms>
__device__ __forceinline__ auto column_terms(const Terms& terms, std::size_t r, std::size_t col) {
  if constexpr (V == 1) {
    return terms(r, col);
  } else {
    return terms.template pack<V>(r, col);
  }
}

/// First pass of a column reduction (column_sums, layer norm's dgamma and dbeta, the
/// channels of channels-last images): block (32, 8) reduces the slab's rows (slab_rows of
/// them) of 32 V columns, K sums of terms(r, col) (a term_values<M, K>), each thread the rows
/// ty, ty + 8, ... of the slab in order for its V columns (read together: 16 bytes a row
/// where V > 1), then the 8 partial sums in ty order; partial[(slab * cols + col) * K + k].
/// The order of each column's additions does not depend on V.
template <class Acc, int K, int V, class Terms>
__global__ void column_partials(Terms terms, std::size_t rows, std::size_t cols, std::size_t slabs,
                                std::size_t slab_rows, typename accumulator<Acc>::value_type* partial) {
  using S = typename accumulator<Acc>::value_type;
  constexpr int KV = K * V;
  constexpr int U = V >= 4 ? 4 : 8;  // rows whose loads are in flight together
  __shared__ S shared[KV][8][33];
  const std::size_t col = (blockIdx.x * std::size_t(32) + threadIdx.x) * V;  // the first of V
  for (std::size_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    const std::size_t stop = (slab + 1) * slab_rows, end = stop < rows ? stop : rows;
    S s[KV];
    for (int k = 0; k < KV; ++k) s[k] = S(0);
    if (col < cols) {
      add_strided<device_sum<Acc>, KV, U>(s, slab * slab_rows + threadIdx.y, 8, end,
                                          [&](std::size_t r) { return column_terms<V>(terms, r, col); });
    }
    for (int k = 0; k < KV; ++k) shared[k][threadIdx.y][threadIdx.x] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      for (int k = 0; k < KV; ++k) {
        S t = shared[k][0][threadIdx.x];
        for (int y = 1; y < 8; ++y) t = device_sum<Acc>::combine(t, shared[k][y][threadIdx.x]);
        partial[(slab * cols + col) * K + k] = t;  // column col + k / K, its sum k % K
      }
    }
    __syncthreads();
  }
}

/// Threads of a block of column_totals: a warp per column.
inline constexpr unsigned column_total_threads = 256;

/// Second pass: a warp per column takes its K sums over the slabs, lane l those at l, l + 32,
/// .. in order with four in flight (add_strided), then the warp's butterfly (warp_reduce);
/// lane 0 hands them to finish(col, sums). The order depends on the slab count alone. One
/// thread per column adding every slab in turn gave ViT-B's 768 columns 3 blocks, each
/// thread 197 slabs.
template <class Acc, int K, class Finish>
__global__ void __launch_bounds__(column_total_threads)
    column_totals(const typename accumulator<Acc>::value_type* partial, std::size_t slabs, std::size_t cols,
                  Finish finish) {
  using S = typename accumulator<Acc>::value_type;
  constexpr unsigned warps = column_total_threads / 32;
  const unsigned lane = threadIdx.x % 32;
  // The same col for the whole warp, as warp_reduce needs.
  for (std::size_t col = blockIdx.x * std::size_t(warps) + threadIdx.x / 32; col < cols;
       col += std::size_t(gridDim.x) * warps) {
    S t[K];
    for (int k = 0; k < K; ++k) t[k] = device_sum<Acc>::init();
    add_strided<device_sum<Acc>, K, 4>(t, lane, 32, slabs, [&](std::size_t slab) {
      term_values<S, K> p;
      for (int k = 0; k < K; ++k) p.v[k] = partial[(slab * cols + col) * K + k];
      return p;
    });
    S r[K];
    for (int k = 0; k < K; ++k) r[k] = warp_reduce(t[k], combine_op<device_sum<Acc>>{});
    if (lane == 0) finish(col, r);
  }
}

/// Launches column_totals on ctx's stream: `cols` columns' K sums over `slabs` partial sums
/// each (partial[(slab * cols + col) * K + k]), handed to finish(col, sums).
template <class Acc, int K, class Finish>
void launch_column_totals(cuda_context& ctx, const typename accumulator<Acc>::value_type* partial,
                          std::size_t slabs, std::size_t cols, const Finish& finish, std::string_view name) {
  const std::size_t blocks = (cols + column_total_threads / 32 - 1) / (column_total_threads / 32);
  column_totals<Acc, K><<<unsigned(std::min<std::size_t>(blocks, 65535)), column_total_threads, 0, ctx.stream()>>>(
      partial, slabs, cols, finish);
  check(cudaGetLastError(), name);
}

/// Runs both passes of a column reduction of terms(r, col) over `rows` rows of `cols`
/// columns on ctx's stream, in slabs of up to `most_slab_rows` rows (a power of two of the
/// caller, at least column_slab_rows): column_slab_rows_for halves it, down to
/// column_slab_rows, where the first pass would have few blocks. The slab, and so the order,
/// depends on the shape and the terms' type alone. Its partial sums are in stream-ordered
/// scratch. Terms give pack_elements (their inputs' elements per 16 bytes), aligned<V>()
/// (whether packs of V columns may be read) and pack<V>(r, col).
template <class Acc, int K, class Terms, class Finish>
void column_reduce(cuda_context& ctx, std::size_t rows, std::size_t cols, const Terms& terms, const Finish& finish,
                   std::string_view name, std::size_t most_slab_rows = column_slab_rows) {
  using S = typename accumulator<Acc>::value_type;
  // The widest pack (not the one the pointers allow this call), so that the slab does not
  // depend on the alignment.
  constexpr int V = Terms::pack_elements < 8 ? Terms::pack_elements : 8;
  const std::size_t slab_rows = column_slab_rows_for(rows, cols, std::size_t(V), most_slab_rows, column_slab_rows);
  const std::size_t slabs = (rows + slab_rows - 1) / slab_rows;
  device_tensor<S, 1> partial({slabs * cols * K}, ctx.stream());
  const auto launch = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const dim3 grid(unsigned((cols / V + 31) / 32), unsigned(std::min<std::size_t>(slabs, 65535)));
    column_partials<Acc, K, V><<<grid, dim3(32, 8), 0, ctx.stream()>>>(terms, rows, cols, slabs, slab_rows,
                                                                        partial.data());
  };
  // 16 bytes of the terms' widest input per row and thread (at most 8 columns) where the
  // columns and pointers allow, and there are columns for a warp's 32 threads (else one
  // column each, as many threads as before).
  if (cols % V == 0 && cols >= 32 * std::size_t(V) && terms.template aligned<V>()) {
    launch(std::integral_constant<int, V>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  check(cudaGetLastError(), name);
  launch_column_totals<Acc, K>(ctx, partial.data(), slabs, cols, finish, name);
}

/// column_sums' term: element (r, col) of a matrix with row stride ld.
template <class M, class T>
struct matrix_terms {
  const T* x;
  std::size_t ld;
  static constexpr int pack_elements = pack_width<T>;
  __device__ term_values<M, 1> operator()(std::size_t r, std::size_t col) const {
    return {{device_load<M>(x[r * ld + col])}};
  }
  template <int V>
  __device__ term_values<M, V> pack(std::size_t r, std::size_t col) const {
    return load_terms<M, V>(x + r * ld + col);
  }
  template <int V>
  bool aligned() const {
    return ld % V == 0 && pack_aligned<V>(x);
  }
};

/// column_sums' finish: out[col] = the sum, rounded once to U.
template <class R, class U>
struct store_sums {
  U* out;
  template <class S>
  __device__ void operator()(std::size_t col, const S* t) const {
    out[col] = round_to<U>(R(t[0]));
  }
};

/// mul_backward's column term: a[r * ld + col] * b[r * ld + col] in M, as the host's
/// mul_backward forms it before adding.
template <class M, class A, class B>
struct product_terms {
  const A* a;
  const B* b;
  std::size_t ld;
  static constexpr int pack_elements = pack_width<A, B>;
  __device__ term_values<M, 1> operator()(std::size_t r, std::size_t col) const {
    return {{device_load<M>(a[r * ld + col]) * device_load<M>(b[r * ld + col])}};
  }
  template <int V>
  __device__ term_values<M, V> pack(std::size_t r, std::size_t col) const {
    const auto x = load_pack<V>(a + r * ld + col);
    const auto y = load_pack<V>(b + r * ld + col);
    term_values<M, V> t;
#pragma unroll
    for (int e = 0; e < V; ++e) t.v[e] = device_load<M>(x.v[e]) * device_load<M>(y.v[e]);
    return t;
  }
  template <int V>
  bool aligned() const {
    return ld % V == 0 && pack_aligned<V>(a, b);
  }
};

template <reduce_kind Kind, Policy P, class T, std::size_t N, class U>
void reduce_all_to(std::string_view name, cuda_context& ctx, const device_tensor<T, N>& x,
                   device_tensor<U, 1>& out) {
  using M = math_t<op::reduction, P, T>;
  using Acc = accumulate_t<op::reduction, P>;
  using R = reduce_result_t<P, T>;
  check_shape(std::string(name) + ": out", out, std::array<std::size_t, 1>{1});
  if constexpr (Kind == reduce_kind::mean || Kind == reduce_kind::max) {
    check_not_empty(std::string(name) + ": x", x);
  }
  reduce_terms<device_reducer_t<Kind, M, Acc>, 1>(ctx, x.size(), tensor_terms<Kind, M, T>{x.data()},
                                                  scalar_finish<Kind, R, U>{out.data(), x.size()},
                                                  name);
}

/// The launch of an axis reduction of x viewed as [outer, count, inner] into out [outer,
/// inner] under P (op::reduction): reduce_axis_kernel for short axes, reduce_axis_staged
/// for long ones, the same additions in the same order either way.
template <reduce_kind Kind, Policy P, class T, class U>
void launch_reduce_axis(std::string_view name, cuda_context& ctx, const T* x, std::size_t outer,
                        std::size_t count, std::size_t inner, U* out) {
  if (outer * inner == 0) return;
  using M = math_t<op::reduction, P, T>;
  using Acc = accumulate_t<op::reduction, P>;
  using R = reduce_result_t<P, T>;
  const std::size_t total = outer * inner;
  if (count < axis_stage_min_count) {
    reduce_axis_kernel<Kind, M, Acc, R>
        <<<grid_for(total), 256, 0, ctx.stream()>>>(x, outer, count, inner, out);
  } else {
    const auto launch = [&](auto rows, auto outputs) {
      constexpr unsigned O = decltype(outputs)::value;
      const std::size_t tiles = (total + O - 1) / O;
      reduce_axis_staged<Kind, M, Acc, R, decltype(rows)::value, O>
          <<<unsigned(std::min<std::size_t>(tiles, 1U << 20)), axis_stage_threads, 0,
             ctx.stream()>>>(x, count, inner, total, out);
    };
    using wide = std::integral_constant<unsigned, 32>;
    using narrow = std::integral_constant<unsigned, 16>;
    const bool wide_tiles = axis_tile_outputs(total) == wide::value;
    if (inner == 1) {
      wide_tiles ? launch(std::true_type{}, wide{}) : launch(std::true_type{}, narrow{});
    } else {
      wide_tiles ? launch(std::false_type{}, wide{}) : launch(std::false_type{}, narrow{});
    }
  }
  check(cudaGetLastError(), name);
}

template <reduce_kind Kind, Policy P, class T, std::size_t N, class U>
void reduce_axis_to(std::string_view name, cuda_context& ctx, const device_tensor<T, N>& x,
                    std::size_t axis, device_tensor<U, N - 1>& out) {
  check_argument(axis < N, std::string(name) + ": axis " + std::to_string(axis),
                 "is out of range for a tensor of rank " + std::to_string(N));
  check_shape(std::string(name) + ": out", out, shape_without<N>(x, axis));
  const std::size_t count = x.shape()[axis];
  const bool needs_elements = Kind == reduce_kind::mean || Kind == reduce_kind::max;
  if (needs_elements && count == 0 && out.size() != 0) {
    throw error(std::string(name) + ": axis " + std::to_string(axis) + " of shape " +
                shape_string(x.shape()) + " is empty");
  }
  std::size_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < axis; ++i) outer *= x.shape()[i];
  for (std::size_t i = axis + 1; i < N; ++i) inner *= x.shape()[i];
  launch_reduce_axis<Kind, P>(name, ctx, x.data(), outer, count, inner, out.data());
}

/// Pixels summed per partial sum of conv2d_backward_bias: a constant, so that the order of
/// additions is the same on every device.
inline constexpr std::size_t channel_segment = 4096;

/// First pass of a channel reduction over [N, C, inner] (conv2d_backward_bias, batch norm's
/// statistics and sums): block (image i, segment s) of grid row c reduces the elements
/// [s * channel_segment, ...) of plane (i, c), K sums of terms(at, c) (a term_values<M, K>;
/// at = (i * C + c) * inner + q, the element's offset),
/// each thread its strided share in order, then the block's tree;
/// partial[((c * images + i) * segments + s) * K + k].
template <class Acc, int K, class Terms>
__global__ void channel_partials(Terms terms, std::size_t images, std::size_t channels, std::size_t inner,
                                 std::size_t segments, typename accumulator<Acc>::value_type* partial) {
  using S = typename accumulator<Acc>::value_type;
  __shared__ S shared[32];
  const std::size_t i = blockIdx.x / segments, seg = blockIdx.x % segments;
  const std::size_t lo = seg * channel_segment, hi = inner < lo + channel_segment ? inner : lo + channel_segment;
  for (std::size_t c = blockIdx.y; c < channels; c += gridDim.y) {
    S acc[K];
    for (int k = 0; k < K; ++k) acc[k] = device_sum<Acc>::init();
    const std::size_t plane = (i * channels + c) * inner;
    add_strided<device_sum<Acc>>(acc, lo + threadIdx.x, blockDim.x, hi,
                                 [&](std::size_t q) { return terms(plane + q, c); });
    for (int k = 0; k < K; ++k) {
      const S r = block_reduce(acc[k], combine_op<device_sum<Acc>>{}, shared);
      if (threadIdx.x == 0) partial[((c * images + i) * segments + seg) * K + k] = r;
    }
  }
}

/// Threads of a block of channel_totals.
inline constexpr unsigned channel_total_threads = 128;

/// Second pass: block c takes channel c's K sums over its partial sums in (image, segment)
/// order, thread t those at t, t + 128, .. in order with four in flight (add_strided), then
/// the block's tree (block_reduce); thread 0 hands them to finish(c, sums). The order
/// depends on the count alone. One thread per channel chaining them all waited on each load
/// in turn: 1,600 of them for a plane of 640 x 640 at batch 16.
template <class Acc, int K, class Finish>
__global__ void __launch_bounds__(channel_total_threads)
    channel_totals(const typename accumulator<Acc>::value_type* partial, std::size_t per_channel,
                   std::size_t channels, Finish finish) {
  using S = typename accumulator<Acc>::value_type;
  __shared__ S shared[32];
  for (std::size_t c = blockIdx.x; c < channels; c += gridDim.x) {  // the same c for the whole block
    S t[K];
    for (int k = 0; k < K; ++k) t[k] = device_sum<Acc>::init();
    add_strided<device_sum<Acc>, K, 4>(t, threadIdx.x, blockDim.x, per_channel, [&](std::size_t p) {
      term_values<S, K> v;
      for (int k = 0; k < K; ++k) v.v[k] = partial[(c * per_channel + p) * K + k];
      return v;
    });
    S r[K];
    for (int k = 0; k < K; ++k) r[k] = block_reduce(t[k], combine_op<device_sum<Acc>>{}, shared);
    if (threadIdx.x == 0) finish(c, r);
  }
}

/// Runs both passes of a channel reduction of terms(at, c) over `images` planes of `inner`
/// elements per channel on ctx's stream (images and inner not 0), its partial sums in
/// stream-ordered scratch. The order depends on the shape alone: the same bits on every
/// run and device.
template <class Acc, int K, class Terms, class Finish>
void channel_reduce(cuda_context& ctx, std::size_t images, std::size_t channels, std::size_t inner,
                    const Terms& terms, const Finish& finish, std::string_view name) {
  using S = typename accumulator<Acc>::value_type;
  const std::size_t segments = (inner + channel_segment - 1) / channel_segment;
  if (images * segments > 0x7fffffffU) throw error(std::string(name) + ": too many images on the device");
  device_tensor<S, 1> partial({channels * images * segments * K}, ctx.stream());
  const dim3 grid(unsigned(images * segments), unsigned(std::min<std::size_t>(channels, 65535)));
  channel_partials<Acc, K><<<grid, 256, 0, ctx.stream()>>>(terms, images, channels, inner, segments, partial.data());
  check(cudaGetLastError(), name);
  channel_totals<Acc, K><<<unsigned(std::min<std::size_t>(channels, 65535)), channel_total_threads, 0, ctx.stream()>>>(
      partial.data(), images * segments, channels, finish);
  check(cudaGetLastError(), name);
}

/// A channel reduction's term: the element at `at` of x in M (its channel not needed).
template <class M, class T>
struct plane_terms {
  const T* x;
  static constexpr int pack_elements = pack_width<T>;
  __device__ term_values<M, 1> operator()(std::size_t at, std::size_t) const { return {{device_load<M>(x[at])}}; }
  /// The V elements from `at` (channels-last: V channels).
  template <int V>
  __device__ term_values<M, V> pack(std::size_t at, std::size_t) const {
    return load_terms<M, V>(x + at);
  }
  template <int V>
  bool aligned() const {
    return pack_aligned<V>(x);
  }
};

/// A channel reduction's terms(at, c) read as a column reduction's terms(r, c) over a
/// channels-last tensor [N, H, W, C] viewed as [N * H * W, C]: at = r * channels + c.
template <class Terms>
struct channels_last_terms {
  Terms terms;
  std::size_t channels;
  static constexpr int pack_elements = Terms::pack_elements;
  __device__ auto operator()(std::size_t r, std::size_t c) const { return terms(r * channels + c, c); }
  /// Channels c .. c + V - 1 of row r.
  template <int V>
  __device__ auto pack(std::size_t r, std::size_t c) const {
    return terms.template pack<V>(r * channels + c, c);
  }
  template <int V>
  bool aligned() const {
    return channels % V == 0 && terms.template aligned<V>();
  }
};

/// The channel reduction of terms(at, c) over images [images, channels, inner] in `layout`:
/// for NCHW, channel_reduce (segments of each plane, then each channel's segments by a
/// block); for channels-last [images, inner, channels], column_reduce over the rows of
/// [images * inner, channels] in slabs of up to channel_segment rows (fewer where that would
/// leave the first pass few blocks: column_slab_rows_for), then each channel's slabs by a
/// warp; its reads are coalesced along the channels. Either order depends on the shape alone; they
/// differ from each other by at most the float bound of a sum of images * inner terms. One
/// channel is laid out alike in both (element (i, q) at i * inner + q): it takes the NCHW
/// order, whose first pass spreads each image over segments, where the columns' would give
/// one lane in 32 a column to add.
template <class Acc, int K, class Terms, class Finish>
void channel_reduce_in(cuda_context& ctx, image_layout layout, std::size_t images, std::size_t channels,
                       std::size_t inner, const Terms& terms, const Finish& finish, std::string_view name) {
  // Planes of one element ([N, C] batch norm) lie as channels-last ones do: the columns'
  // order reads them coalesced, where the planes' would give each block one element.
  if ((layout == image_layout::nhwc || inner == 1) && channels > 1) {
    column_reduce<Acc, K>(ctx, images * inner, channels, channels_last_terms<Terms>{terms, channels}, finish, name,
                          channel_segment);
  } else {
    channel_reduce<Acc, K>(ctx, images, channels, inner, terms, finish, name);
  }
}

// ---- moments: count, mean and m2 of each channel, x read once ----
//
// Batch norm's statistics (kernels/common.hpp's moments). A block holds its share of a
// channel in registers, takes the share's sum, its mean, then the squared distances to that
// mean (two passes over the registers, as the host's two passes over the channel), and writes
// the share's moments; then a warp per channel joins its shares with combine_moments_in in a
// fixed order. The order depends on the shape and on whether x allows 16-byte reads: the same
// bits on every run and device.

/// A share's moments in partial[3 p .. 3 p + 2] (count, mean, m2).
template <class A>
__device__ __forceinline__ void store_moments(A* partial, std::size_t p, const moments<A>& m) {
  partial[3 * p] = m.count;
  partial[3 * p + 1] = m.mean;
  partial[3 * p + 2] = m.m2;
}

/// Values of a channel_moments_partials block per thread: a segment's channel_segment
/// elements over its 256 threads.
inline constexpr int channel_moment_threads = 256;
inline constexpr int channel_moment_values = int(channel_segment) / channel_moment_threads;

/// First pass, channels first (x [images, channels, inner]): block (i * segments + s, c)
/// holds elements [s * channel_segment, ...) of plane (i, c), thread t those at (j * 256 + t)
/// * V + e (16-byte reads of V elements where V > 1), and writes their moments at
/// (c * images + i) * segments + s. Each thread adds its values in (j, e) order, then the
/// block's tree (block_reduce), for the sum and again for the squared distances.
template <class Acc, class M, int V, class X>
__global__ void __launch_bounds__(channel_moment_threads)
    channel_moments_partials(const X* x, std::size_t images, std::size_t channels, std::size_t inner,
                             std::size_t segments, typename accumulator<Acc>::value_type* partial) {
  using A = typename accumulator<Acc>::value_type;
  constexpr int groups = channel_moment_values / V;
  static_assert(groups >= 1 && channel_moment_values % V == 0, "precis: a thread holds whole packs");
  __shared__ A shared[32];
  const std::size_t i = blockIdx.x / segments, seg = blockIdx.x % segments;
  const std::size_t lo = seg * channel_segment, hi = inner < lo + channel_segment ? inner : lo + channel_segment;
  const A n = A(hi - lo);
  for (std::size_t c = blockIdx.y; c < channels; c += gridDim.y) {
    const X* plane = x + (i * channels + c) * inner;
    // The first of element j's V values (lo and hi are multiples of V where V > 1, as inner
    // is: a pack lies inside the segment or past its end).
    const auto at = [&](int j) { return lo + (std::size_t(j) * channel_moment_threads + threadIdx.x) * V; };
    M v[groups][V];
#pragma unroll
    for (int j = 0; j < groups; ++j) load_slots<V>(plane, at(j), hi, V > 1, v[j]);
    accumulator<Acc> sum;
#pragma unroll
    for (int j = 0; j < groups; ++j) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (at(j) + e < hi) sum.add(A(v[j][e]));
      }
    }
    const A mean = block_reduce(sum.value(), combine_op<device_sum<Acc>>{}, shared) / n;
    accumulator<Acc> sq;
#pragma unroll
    for (int j = 0; j < groups; ++j) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (at(j) + e < hi) {
          const A d = A(v[j][e]) - mean;
          sq.add(d * d);
        }
      }
    }
    const A m2 = block_reduce(sq.value(), combine_op<device_sum<Acc>>{}, shared);
    if (threadIdx.x == 0) store_moments(partial, (c * images + i) * segments + seg, moments<A>{n, mean, m2});
  }
}

/// Rows of a channels-last slab: 8 per thread of a (32, 8) block.
inline constexpr std::size_t column_moment_rows = 64;
/// Blocks of column_moments_partials the grid aims at (a constant, so that the shares, and so
/// the order, depend on the shape alone).
inline constexpr std::size_t column_moment_blocks = 1024;

/// Row blocks (the grid's y) of column_moments_partials for `slabs` slabs and `across`
/// blocks across the columns: enough for column_moment_blocks blocks, at most one per slab.
inline std::size_t column_moment_shares(std::size_t slabs, std::size_t across) {
  across = std::max<std::size_t>(across, 1);
  const std::size_t want = (column_moment_blocks + across - 1) / across;
  return std::min<std::size_t>({slabs, want, 65535});
}

/// First pass, channels last (x [rows, cols], cols the channels): block (b, y) takes the
/// slabs y, y + gridDim.y, .. of 64 rows, of columns (b * 32 + tx) * V + e, thread (tx, ty)
/// a slab's rows ty, ty + 8, .. of its V columns (16 bytes a row where V > 1). A slab's
/// column sum is each thread's rows in order, then the 8 threads' sums in ty order (every
/// thread takes the same sum, so no broadcast is needed), and again for the squared
/// distances; the block joins its slabs' moments in slab order (combine_moments_in) and writes
/// them to y * cols + col.
template <class Acc, class M, int V, class X>
__global__ void __launch_bounds__(256)
    column_moments_partials(const X* x, std::size_t rows, std::size_t cols, std::size_t slabs,
                            typename accumulator<Acc>::value_type* partial) {
  using A = typename accumulator<Acc>::value_type;
  constexpr int R = int(column_moment_rows / 8);
  __shared__ A shared[8][V][32];
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  const std::size_t col = (blockIdx.x * std::size_t(32) + tx) * V;  // the first of V
  moments<A> joined[V];
#pragma unroll
  for (int e = 0; e < V; ++e) joined[e] = moments<A>{A(0), A(0), A(0)};
  for (std::size_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    const std::size_t first = slab * column_moment_rows;
    const std::size_t end = first + column_moment_rows < rows ? first + column_moment_rows : rows;
    const A n = A(end - first);
    pack<X, V> raw[R];  // as read (half a float's registers for 16-bit x); rows past the end unused
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const std::size_t r = first + ty + 8 * std::size_t(j);
      if constexpr (V > 1) {
        // cols is a multiple of V here: a pack lies inside the row or past its end.
        if (r < end && col < cols) raw[j] = load_pack<V>(x + r * cols + col);
      } else {
        if (r < end && col < cols) raw[j].v[0] = x[r * cols + col];
      }
    }
    const auto v = [&](int j, int e) { return A(device_load<M>(raw[j].v[e])); };
    const auto column_totals_of = [&](const accumulator<Acc> (&own)[V], A (&total)[V]) {
#pragma unroll
      for (int e = 0; e < V; ++e) shared[ty][e][tx] = own[e].value();
      __syncthreads();
#pragma unroll
      for (int e = 0; e < V; ++e) {
        accumulator<Acc> t(shared[0][e][tx]);
        for (int y = 1; y < 8; ++y) t.add(shared[y][e][tx]);
        total[e] = t.value();
      }
      __syncthreads();  // shared is written again
    };
    accumulator<Acc> sum[V];
    const bool inside = col < cols;  // columns past the end add nothing (their sums are never stored)
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (inside && first + ty + 8 * std::size_t(j) < end) {
#pragma unroll
        for (int e = 0; e < V; ++e) sum[e].add(v(j, e));
      }
    }
    A mean[V];
    column_totals_of(sum, mean);
#pragma unroll
    for (int e = 0; e < V; ++e) mean[e] /= n;
    accumulator<Acc> sq[V];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (inside && first + ty + 8 * std::size_t(j) < end) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A d = v(j, e) - mean[e];
          sq[e].add(d * d);
        }
      }
    }
    A m2[V];
    column_totals_of(sq, m2);
#pragma unroll
    for (int e = 0; e < V; ++e) joined[e] = combine_moments_in<Acc>(joined[e], moments<A>{n, mean[e], m2[e]});
  }
  if (ty == 0 && col < cols) {
#pragma unroll
    for (int e = 0; e < V; ++e) store_moments(partial, blockIdx.y * cols + col + e, joined[e]);
  }
}

/// combine_moments_in<Acc> over a warp's lanes: a butterfly (lane l with lane l ^ o, o = 16,
/// .., 1), the lower lane's moments always the first operand, so that both lanes of a pair
/// take the same bits; every lane ends with the same result.
template <class Acc, class A>
__device__ moments<A> warp_combine_moments(moments<A> m) {
  const unsigned lane = threadIdx.x % 32;
  for (int o = 16; o > 0; o /= 2) {
    const moments<A> other{__shfl_xor_sync(0xFFFFFFFFU, m.count, o), __shfl_xor_sync(0xFFFFFFFFU, m.mean, o),
                           __shfl_xor_sync(0xFFFFFFFFU, m.m2, o)};
    m = (lane & unsigned(o)) == 0 ? combine_moments_in<Acc>(m, other) : combine_moments_in<Acc>(other, m);
  }
  return m;
}

/// Second pass: a warp per channel c joins its `shares` moments, share p at
/// partial[3 (c * channel_stride + p * share_stride)]: lane l those at l, l + 32, .. in
/// order (four read before they are joined), then the lanes' (warp_combine_moments); lane 0
/// hands them to finish(c, moments).
template <class Acc, class Finish>
__global__ void __launch_bounds__(column_total_threads)
    moment_totals(const typename accumulator<Acc>::value_type* partial, std::size_t shares, std::size_t channels,
                  std::size_t channel_stride, std::size_t share_stride, Finish finish) {
  using A = typename accumulator<Acc>::value_type;
  constexpr unsigned warps = column_total_threads / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t c = blockIdx.x * std::size_t(warps) + threadIdx.x / 32; c < channels;
       c += std::size_t(gridDim.x) * warps) {  // the same c for the whole warp
    const auto share = [&](std::size_t p) {
      const A* at = partial + 3 * (c * channel_stride + p * share_stride);
      return moments<A>{at[0], at[1], at[2]};
    };
    moments<A> m{A(0), A(0), A(0)};
    std::size_t p = lane;
    for (; p + 3 * 32 < shares; p += 4 * 32) {
      moments<A> t[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) t[u] = share(p + std::size_t(u) * 32);
#pragma unroll
      for (int u = 0; u < 4; ++u) m = combine_moments_in<Acc>(m, t[u]);
    }
    for (; p < shares; p += 32) m = combine_moments_in<Acc>(m, share(p));
    m = warp_combine_moments<Acc>(m);
    if (lane == 0) finish(c, m);
  }
}

/// The moments of each channel of images [images, channels, inner] in `layout` (channels-last:
/// [images, inner, channels]; images, channels and inner not 0), x read once, handed to
/// finish(c, moments<A>) (A the accumulate type's value type) on ctx's stream: channels
/// first, channel_moments_partials over segments of each plane; channels last (or planes of
/// one element), column_moments_partials over slabs of 64 rows of [images * inner, channels]
/// (one channel takes the first: it is laid out alike); then moment_totals. The shares' moments are in
/// stream-ordered scratch.
template <class Acc, class M, class X, class Finish>
void channel_moments_in(cuda_context& ctx, image_layout layout, std::size_t images, std::size_t channels,
                        std::size_t inner, const X* x, const Finish& finish, std::string_view name) {
  using A = typename accumulator<Acc>::value_type;
  constexpr int V = pack_width<X> < channel_moment_values ? pack_width<X> : channel_moment_values;
  const std::size_t total_blocks = (channels + column_total_threads / 32 - 1) / (column_total_threads / 32);
  const unsigned totals = unsigned(std::min<std::size_t>(total_blocks, 65535));
  // Planes of one element ([N, C] batch norm) lie as channels-last ones do.
  if ((layout == image_layout::nhwc || inner == 1) && channels > 1) {
    const std::size_t rows = images * inner;
    const std::size_t slabs = (rows + column_moment_rows - 1) / column_moment_rows;
    // The shares depend on the widest pack (not the one x allows this call), so that they
    // do not depend on the alignment.
    const std::size_t shares = column_moment_shares(slabs, (channels + 32 * V - 1) / (32 * V));
    device_tensor<A, 1> partial({3 * shares * channels}, ctx.stream());
    const auto launch = [&](auto width) {
      constexpr int W = decltype(width)::value;
      const dim3 grid(unsigned((channels / W + 31) / 32), unsigned(shares));
      column_moments_partials<Acc, M, W><<<grid, dim3(32, 8), 0, ctx.stream()>>>(x, rows, channels, slabs,
                                                                                 partial.data());
    };
    // 16 bytes of channels a row and thread where the channels and x allow it, and there are
    // channels for a warp's 32 threads; else one channel each.
    if (channels % V == 0 && channels >= 32 * std::size_t(V) && pack_aligned<V>(x)) {
      launch(std::integral_constant<int, V>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
    check(cudaGetLastError(), name);
    moment_totals<Acc><<<totals, column_total_threads, 0, ctx.stream()>>>(partial.data(), shares, channels, 1,
                                                                           channels, finish);
  } else {
    const std::size_t segments = (inner + channel_segment - 1) / channel_segment;
    if (images * segments > 0x7fffffffU) throw error(std::string(name) + ": too many images on the device");
    device_tensor<A, 1> partial({3 * channels * images * segments}, ctx.stream());
    const dim3 grid(unsigned(images * segments), unsigned(std::min<std::size_t>(channels, 65535)));
    if (inner % V == 0 && pack_aligned<V>(x)) {
      channel_moments_partials<Acc, M, V><<<grid, channel_moment_threads, 0, ctx.stream()>>>(
          x, images, channels, inner, segments, partial.data());
    } else {
      channel_moments_partials<Acc, M, 1><<<grid, channel_moment_threads, 0, ctx.stream()>>>(
          x, images, channels, inner, segments, partial.data());
    }
    check(cudaGetLastError(), name);
    moment_totals<Acc><<<totals, column_total_threads, 0, ctx.stream()>>>(
        partial.data(), images * segments, channels, images * segments, 1, finish);
  }
  check(cudaGetLastError(), name);
}

/// Runs f.apply<V> over every V-th element at = (i * channels + c) * inner + q of a tensor
/// [images, channels, inner] (inner a multiple of V): the planes on the grid's y axis, their
/// packs on x, with no division per element; a thread reads its plane's channel constants
/// (f.constants(c)) once.
template <int V, class F>
__global__ void for_each_plane_element(F f, std::size_t planes, std::size_t channels, std::size_t inner) {
  for (std::size_t plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    const auto k = f.constants(plane % channels);
    for (std::size_t q = (blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) * V; q < inner;
         q += std::size_t(gridDim.x) * blockDim.x * V) {
      f.template apply<V>(&k, 0, plane * inner + q);
    }
  }
}

/// Runs f.apply<V> over a channels-last tensor viewed as [rows, channels] (channels a
/// multiple of V): thread x of the grid's x axis holds the V channels from x * V (their
/// constants read once), y walks the rows; a block is `groups` threads wide (at most 256)
/// and 256 / groups rows deep, so that a warp reads whole rows of consecutive packs.
template <int V, class F>
__global__ void for_each_channels_last_pack(F f, std::size_t rows, std::size_t channels) {
  const std::size_t group = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (group * V >= channels) return;
  decltype(f.constants(0)) k[V];
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = f.constants(group * V + e);
  for (std::size_t r = blockIdx.y * std::size_t(blockDim.y) + threadIdx.y; r < rows;
       r += std::size_t(gridDim.y) * blockDim.y) {
    f.template apply<V>(k, 1, r * channels + group * V);
  }
}

/// Launches f over every element of images [images, channels, inner] in `layout`
/// (channels-last: [images, inner, channels]) on ctx's stream: f.constants(c) reads channel
/// c's constants, f.apply<V>(k, step, at) computes the V elements from `at`, element e with
/// constants k[e * step] (step 0: one channel's; 1: V channels'). V = F::pack_elements (16 bytes of its widest element) where the
/// elements a thread takes at once allow it (NCHW: planes whose length is a multiple of V;
/// channels-last: channel counts that are) and f.aligned<V>(); else one element at a time.
template <class F>
void plane_elements(cuda_context& ctx, std::size_t images, std::size_t channels, std::size_t inner, const F& f,
                    std::string_view name, image_layout layout = image_layout::nchw) {
  const std::size_t planes = images * channels;
  if (planes == 0 || inner == 0) return;
  constexpr int V = F::pack_elements;
  // Planes of one element ([N, C] batch norm) lie as channels-last ones do; each element's
  // value does not depend on the launch.
  if (layout == image_layout::nhwc || inner == 1) {
    const std::size_t rows = images * inner;
    const auto launch = [&](auto width) {
      constexpr int W = decltype(width)::value;
      const std::size_t groups = channels / W;
      const unsigned wide = unsigned(std::min<std::size_t>(groups, 256)), deep = 256 / wide;
      const std::size_t x_blocks = (groups + wide - 1) / wide;
      const std::size_t y_blocks = std::min<std::size_t>({(rows + deep - 1) / deep, 65535,
                                                          std::max<std::size_t>(1, 4096 / x_blocks)});
      for_each_channels_last_pack<W>
          <<<dim3(unsigned(x_blocks), unsigned(y_blocks)), dim3(wide, deep), 0, ctx.stream()>>>(f, rows, channels);
    };
    if (channels % V == 0 && f.template aligned<V>()) {
      launch(std::integral_constant<int, V>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
    check(cudaGetLastError(), name);
    return;
  }
  const bool packed = inner % V == 0 && f.template aligned<V>();
  const std::size_t per_thread = packed ? V : 1;
  const std::size_t x_blocks = std::min<std::size_t>((inner / per_thread + 255) / 256,
                                                     std::max<std::size_t>(1, 8192 / planes + 1));
  const dim3 grid(unsigned(std::min<std::size_t>(x_blocks, 1024)), unsigned(std::min<std::size_t>(planes, 65535)));
  if (packed) {
    for_each_plane_element<V><<<grid, 256, 0, ctx.stream()>>>(f, planes, channels, inner);
  } else {
    for_each_plane_element<1><<<grid, 256, 0, ctx.stream()>>>(f, planes, channels, inner);
  }
  check(cudaGetLastError(), name);
}

}  // namespace detail::cuda

namespace detail {

/// column_sums on the device: out[j] = the sum over the rows of x[r * ld + j] (ld: the row
/// stride, `cols` when 0), two
/// passes in a fixed order (slabs of 64 rows, each summed by 8 strided threads and then
/// across them; then each column's slabs by a warp's strided lanes and its butterfly), so
/// repeated calls give the same bits on any
/// device. Each column's sum differs from the host's row-order sum by at most the float
/// bound of a sum of `rows` terms. Queued on ctx's stream; its scratch is stream-ordered.
template <Policy P, class T, class U>
void column_sums(cuda_context& ctx, const T* x, std::size_t rows, std::size_t cols, U* out,
                 std::size_t ld = 0) {
  using M = math_t<op::reduction, P, T>;
  using Acc = accumulate_t<op::reduction, P>;
  if (cols == 0) return;
  if (rows == 0) {
    check(cudaMemsetAsync(out, 0, cols * sizeof(U), ctx.stream()), "cudaMemsetAsync");
    return;
  }
  cuda::column_reduce<Acc, 1>(ctx, rows, cols, cuda::matrix_terms<M, T>{x, ld == 0 ? cols : ld},
                              cuda::store_sums<reduce_result_t<P, T>, U>{out}, "precis: column sums");
}

}  // namespace detail

/// db[c] = the sum of dy [N, C, H, W] over images and pixels, on the device: the bias
/// gradient of a convolution (see the host conv2d_backward_bias), in the policy's math and
/// accumulate types, rounded once to db's type. Two passes in a fixed order (segments of
/// 4096 pixels of each plane, each summed by a block's strided threads and then its tree;
/// then each channel's segments, a block's strided threads in image and segment order and
/// then its tree), so repeated calls give the
/// same bits on any device; a channel's sum differs from the host's index-order sum by at
/// most the bound of a float sum of N * H * W terms. Channels-last dy [N, H, W, C]
/// (`layout` nhwc) is summed as the columns of [N * H * W, C] (channel_reduce_in's order).
/// Queued on ctx's stream; its scratch is stream-ordered.
template <Policy P, kernel_element TG, kernel_element TB>
void conv2d_backward_bias(cuda_context& ctx, const device_tensor<TG, 4>& dy, device_tensor<TB, 1>& db,
                          image_layout layout = image_layout::nchw) {
  using M = detail::math_t<op::reduction, P, TG>;
  using Acc = detail::accumulate_t<op::reduction, P>;
  using S = typename accumulator<Acc>::value_type;
  const bool last = layout == image_layout::nhwc;
  const std::size_t n = dy.shape()[0], co = dy.shape()[last ? 3 : 1];
  const std::size_t pixels = last ? dy.shape()[1] * dy.shape()[2] : dy.shape()[2] * dy.shape()[3];
  check_shape("precis::conv2d_backward_bias: db", db, std::array<std::size_t, 1>{co});
  if (co == 0) return;
  if (n == 0 || pixels == 0) {
    check(cudaMemsetAsync(db.data(), 0, co * sizeof(TB), ctx.stream()), "cudaMemsetAsync");
    return;
  }
  detail::cuda::channel_reduce_in<Acc, 1>(ctx, layout, n, co, pixels, detail::cuda::plane_terms<M, TG>{dy.data()},
                                          detail::cuda::store_sums<S, TB>{db.data()}, "precis::conv2d_backward_bias");
}

/// out[0] = the sum of all elements of x, on the device (out: shape {1}). 0 for an empty
/// tensor. Queued on ctx's stream; nothing waits for it.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
void sum(cuda_context& ctx, const device_tensor<T, N>& x, device_tensor<U, 1>& out) {
  detail::cuda::reduce_all_to<detail::cuda::reduce_kind::sum, P>("precis::sum", ctx, x, out);
}

/// out = x summed along `axis`, on the device (the host's order and result).
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void sum(cuda_context& ctx, const device_tensor<T, N>& x, std::size_t axis,
                          device_tensor<U, N - 1>& out) {
  detail::cuda::reduce_axis_to<detail::cuda::reduce_kind::sum, P>("precis::sum", ctx, x, axis, out);
}

/// out[0] = the mean of all elements. Throws precis::error for an empty tensor.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
void mean(cuda_context& ctx, const device_tensor<T, N>& x, device_tensor<U, 1>& out) {
  detail::cuda::reduce_all_to<detail::cuda::reduce_kind::mean, P>("precis::mean", ctx, x, out);
}

/// out = mean of x along `axis`, on the device.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void mean(cuda_context& ctx, const device_tensor<T, N>& x, std::size_t axis,
                           device_tensor<U, N - 1>& out) {
  detail::cuda::reduce_axis_to<detail::cuda::reduce_kind::mean, P>("precis::mean", ctx, x, axis,
                                                                   out);
}

/// out[0] = the largest element (NaN if any is NaN). Throws precis::error for an empty
/// tensor.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
void max(cuda_context& ctx, const device_tensor<T, N>& x, device_tensor<U, 1>& out) {
  detail::cuda::reduce_all_to<detail::cuda::reduce_kind::max, P>("precis::max", ctx, x, out);
}

/// out = max of x along `axis`, on the device.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void max(cuda_context& ctx, const device_tensor<T, N>& x, std::size_t axis,
                          device_tensor<U, N - 1>& out) {
  detail::cuda::reduce_axis_to<detail::cuda::reduce_kind::max, P>("precis::max", ctx, x, axis, out);
}

/// out[0] = sqrt(sum of squares), the squares summed in the accumulate type.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
void l2_norm(cuda_context& ctx, const device_tensor<T, N>& x, device_tensor<U, 1>& out) {
  detail::cuda::reduce_all_to<detail::cuda::reduce_kind::l2, P>("precis::l2_norm", ctx, x, out);
}

/// out = L2 norm of x along `axis`, on the device.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void l2_norm(cuda_context& ctx, const device_tensor<T, N>& x, std::size_t axis,
                              device_tensor<U, N - 1>& out) {
  detail::cuda::reduce_axis_to<detail::cuda::reduce_kind::l2, P>("precis::l2_norm", ctx, x, axis,
                                                                 out);
}

namespace detail::cuda {

/// The plane (n C + c) that element i of an image tensor lies in, (i / image) C + i % C, by
/// multiplications, for tensors of fewer than 2^32 elements: image = H W C channels-last; for
/// NCHW image = H W and C is taken as 1 (plane_axes' inner), which gives i / (H W).
struct mean_plane_index {
  using index_type = std::uint32_t;
  fast_divmod by_image;     ///< H W C (channels-last), H W (NCHW)
  fast_divmod by_channels;  ///< C (channels-last), 1 (NCHW)
  __device__ std::size_t plane(std::uint32_t i) const {
    return std::size_t(by_image.div(i)) * by_channels.divisor + by_channels.mod(i);
  }
};
/// mean_plane_index in 64 bits, by divisions: for larger tensors, the same planes.
struct wide_mean_plane_index {
  using index_type = std::size_t;
  std::size_t image;     ///< H W C (channels-last), H W (NCHW)
  std::size_t channels;  ///< C (channels-last), 1 (NCHW)
  __device__ std::size_t plane(std::size_t i) const { return i / image * channels + i % channels; }
};

/// dx[i] = mean_share(dy[plane of i], pixels): global_avg_pool's backward pass, an element a
/// thread, in the host's arithmetic.
template <class M, class G, class U, class Ix>
__global__ void global_avg_pool_backward_kernel(const G* dy, U* dx, std::size_t n,
                                                std::size_t pixels, Ix ix) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    dx[i] = mean_share<U>(device_load<M>(dy[ix.plane(typename Ix::index_type(i))]), pixels);
  }
}

}  // namespace detail::cuda

/// y[n, c] = the mean of each plane of images x ([N, C, H, W], or channels-last [N, H, W, C]
/// with image_layout::nhwc), on the device: each output's pixels added in pixel order by one
/// thread, so the host's order and result (see the host global_avg_pool). Throws
/// precis::error, before anything is queued, for planes of no pixel or a y that is not [N, C].
template <Policy P, kernel_element T, kernel_element U>
void global_avg_pool(cuda_context& ctx, const device_tensor<T, 4>& x, device_tensor<U, 2>& y,
                     image_layout layout = image_layout::nchw) {
  detail::check_global_avg_pool("precis::global_avg_pool", "x", x, "y", y, layout);
  const auto a = detail::plane_axes_of(detail::shape_array<4>(x), layout);
  detail::cuda::launch_reduce_axis<detail::cuda::reduce_kind::mean, P>(
      "precis::global_avg_pool", ctx, x.data(), a.outer, a.count, a.inner, y.data());
}

/// dx (images, in `layout`) from dy [N, C] on the device: every pixel of plane (n, c) gets
/// dy[n, c] / (H W) in the math type, rounded once: the host's bits. Throws precis::error,
/// before anything is queued, for planes of no pixel or a dy that is not [N, C].
template <Policy P, kernel_element G, kernel_element U>
void global_avg_pool_backward(cuda_context& ctx, const device_tensor<G, 2>& dy,
                              device_tensor<U, 4>& dx, image_layout layout = image_layout::nchw) {
  detail::check_global_avg_pool("precis::global_avg_pool_backward", "dx", dx, "dy", dy, layout);
  const auto a = detail::plane_axes_of(detail::shape_array<4>(dx), layout);
  const std::size_t n = dx.size();
  if (n == 0) return;
  using M = detail::math_t<op::reduction, P, G>;
  const std::size_t image = a.count * a.inner;  // pixels (NCHW: inner = 1), or pixels x channels
  const auto launch = [&](auto ix) {
    detail::cuda::global_avg_pool_backward_kernel<M>
        <<<detail::cuda::grid_for(n), 256, 0, ctx.stream()>>>(dy.data(), dx.data(), n, a.count, ix);
  };
  if (n <= std::size_t(UINT32_MAX) && detail::fast_divmod::fits(image)) {
    launch(detail::cuda::mean_plane_index{detail::fast_divmod(std::uint32_t(image)),
                                          detail::fast_divmod(std::uint32_t(a.inner))});
  } else {
    launch(detail::cuda::wide_mean_plane_index{image, a.inner});
  }
  check(cudaGetLastError(), "precis::global_avg_pool_backward");
}

/// Gradients of out = a + b on the device (see the host add_backward): da = dy, and db =
/// dy where b had a's shape, else dy summed over the axes b was broadcast along: a column
/// sum in the reduction rule's accumulate type, in column_sums' fixed order (within the
/// float bound of a sum of that many terms of the host's row-order sum), rounded once to
/// db's type. Shapes are checked before anything is queued.
template <Policy P, kernel_element DY, std::size_t N, kernel_element DA, kernel_element DB,
          std::size_t K>
void add_backward(cuda_context& ctx, const device_tensor<DY, N>& dy, device_tensor<DA, N>& da,
                  device_tensor<DB, K>& db) {
  using M = detail::math_t<op::elementwise, P, DY>;
  check_shape("precis::add_backward: da", da, dy.shape());
  detail::check_suffix_shape("precis::add_backward", dy, db, "db");
  const std::size_t n = dy.size(), bn = db.size();
  if (n == 0) return;
  if (n == bn) {
    detail::cuda::launch_copy<M>("precis::add_backward", ctx, dy.data(), n, db.data());
  } else {
    using MR = detail::math_t<op::reduction, P, DY>;
    using Acc = detail::accumulate_t<op::reduction, P>;
    detail::cuda::column_reduce<Acc, 1>(
        ctx, n / bn, bn, detail::cuda::matrix_terms<MR, DY>{dy.data(), bn},
        detail::cuda::store_sums<typename accumulator<Acc>::value_type, DB>{db.data()},
        "precis::add_backward");
  }
  detail::cuda::launch_copy<M>("precis::add_backward", ctx, dy.data(), n, da.data());
}

/// Gradients of out = a * b on the device (see the host mul_backward): da = dy * b (b
/// broadcast), and db = dy * a, summed over the axes b was broadcast along as in
/// add_backward, each product formed in the reduction's math type before it is added.
/// Shapes are checked before anything is queued.
template <Policy P, kernel_element DY, std::size_t N, kernel_element A, kernel_element B,
          std::size_t K, kernel_element DA, kernel_element DB>
void mul_backward(cuda_context& ctx, const device_tensor<DY, N>& dy, const device_tensor<A, N>& a,
                  const device_tensor<B, K>& b, device_tensor<DA, N>& da,
                  device_tensor<DB, K>& db) {
  using M = detail::math_t<op::elementwise, P, DY, A, B>;
  check_same_shape("precis::mul_backward: dy and a", dy, a);
  detail::check_suffix_shape("precis::mul_backward", a, b);
  check_shape("precis::mul_backward: da", da, a.shape());
  check_shape("precis::mul_backward: db", db, b.shape());
  const std::size_t n = a.size(), bn = b.size();
  if (n == 0) return;
  if (n == bn) {
    detail::cuda::launch_binary<M, detail::cuda::mul_op>("precis::mul_backward", ctx, dy.data(), n,
                                                         a.data(), n, db.data());
  } else {
    using MR = detail::math_t<op::reduction, P, DY, A>;
    using Acc = detail::accumulate_t<op::reduction, P>;
    detail::cuda::column_reduce<Acc, 1>(
        ctx, n / bn, bn, detail::cuda::product_terms<MR, DY, A>{dy.data(), a.data(), bn},
        detail::cuda::store_sums<typename accumulator<Acc>::value_type, DB>{db.data()},
        "precis::mul_backward");
  }
  detail::cuda::launch_binary<M, detail::cuda::mul_op>("precis::mul_backward", ctx, dy.data(), n,
                                                       b.data(), bn, da.data());
}

}  // namespace precis

#endif
