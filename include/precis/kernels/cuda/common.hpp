/// @file
/// What the device kernels share: loading an element as the math type, grid sizes, packed
/// (16-byte) elementwise kernels, and a block-wide reduction in a fixed order. Private to precis (namespace precis::detail::cuda). Compiled by nvcc
/// only.
#pragma once

#include <precis/config.hpp>
#include <precis/cuda_error.hpp>
#include <precis/kernels/common.hpp>

#if defined(__CUDACC__)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis::detail::cuda {

/// One element as the math type M (formats decode exactly to float first).
template <class M, class T>
__device__ inline M device_load(T x) {
  if constexpr (precis_format<T>) {
    return static_cast<M>(float(x));
  } else {
    return static_cast<M>(x);
  }
}

/// Elements of one tensor a block of a multi-tensor kernel takes (the "multi-tensor apply"
/// layout: many small tensors cost one launch, a large one is split over many blocks). 2^14:
/// with 2^16 the example ViT's 2.65M parameters made about 116 blocks for 132 SMs, each
/// thread of a full chunk 256 elements in turn.
inline constexpr std::size_t chunk_elements = std::size_t(1) << 14;

/// Calls f(begin, length) for each chunk of at most chunk_elements of a tensor of n
/// elements, in order.
template <class F>
void for_each_chunk(std::size_t n, F&& f) {
  for (std::size_t b = 0; b < n; b += chunk_elements) f(b, std::min(chunk_elements, n - b));
}

/// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(std::size_t n, unsigned threads = 256) {
  const std::size_t blocks = (n + threads - 1) / threads;
  return unsigned(std::clamp<std::size_t>(blocks, 1, 4096));
}

/// Runs copy plan `p` (kernels/common.hpp: a copy_plan, or a fast_copy_plan of fewer than
/// 2^32 elements, whose index decomposes without division), one thread per element. A
/// template so that every translation unit may define it.
template <class T, class Plan>
__global__ void strided_copy_kernel(const T* from, T* to, Plan p, std::size_t total) {
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < total;
       e += std::size_t(gridDim.x) * blockDim.x) {
    std::size_t a = 0, b = 0;
    if constexpr (requires { p.shape[0].divisor; }) {
      copy_offsets(p, static_cast<std::uint32_t>(e), a, b);  // a fast_copy_plan: e < total < 2^32
    } else {
      copy_offsets(p, e, a, b);
    }
    to[b] = from[a];
  }
}

/// Runs copy plan `p` as one launch of strided_copy_kernel on `stream`, its index
/// decomposed by multiplications where the plan fits 32 bits (fast_divmod). Throws
/// precis::error, naming `name`, when the launch fails.
template <class T, std::size_t R>
void strided_copy(cudaStream_t stream, const T* from, T* to, const copy_plan<R>& p, std::string_view name) {
  const std::size_t total = p.elements();
  if (total == 0) return;
  if (fits_fast(p)) {
    strided_copy_kernel<<<grid_for(total), 256, 0, stream>>>(from, to, make_fast(p), total);
  } else {
    strided_copy_kernel<<<grid_for(total), 256, 0, stream>>>(from, to, p, total);
  }
  check(cudaGetLastError(), name);
}

/// V values of T read or written as one access of V * sizeof(T) bytes.
template <class T, int V>
struct alignas(sizeof(T) * V) pack {
  T v[V];
};

/// The widest of the element types' sizes.
template <class... T>
constexpr std::size_t widest() {
  std::size_t m = 1;
  ((m = sizeof(T) > m ? sizeof(T) : m), ...);
  return m;
}

/// Elements per thread access of a packed kernel over these element types: 16 bytes of the
/// widest (float: 4; bfloat16 and float16: 8; float8 alone: 16). The narrower operands move
/// fewer bytes per access, in step with the widest.
template <class... T>
inline constexpr int pack_width = int(16 / widest<T...>());

/// Whether every pointer is aligned to V of its elements, so that packed_kernel<V> may read
/// and write it in packs.
template <int V, class... T>
bool pack_aligned(const T*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * V) == 0) && ...);
}

template <int V, class T>
__device__ inline pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const pack<T, V>*>(p);
}

template <int V, class T>
__device__ inline void store_pack(T* p, const pack<T, V>& v) {
  *reinterpret_cast<pack<T, V>*>(p) = v;
}

/// Calls body.template at<V>(i) for every i = 0, V, 2V, .. below n / V * V (a pack each,
/// grid-stride), and body.template at<1>(i) for the last n % V elements, one per thread.
/// Each element is computed by the same code in either, so packing changes no bits. A
/// template so that every translation unit may define it.
template <int V, class Body>
__global__ void packed_kernel(Body body, std::size_t n) {
  const std::size_t packs = n / V, t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  for (std::size_t p = t; p < packs; p += std::size_t(gridDim.x) * blockDim.x) body.template at<V>(p * V);
  if constexpr (V > 1) {
    if (const std::size_t i = packs * V + t; i < n) body.template at<1>(i);
  }
}

/// Runs `body` over n elements on `stream`: in packs of V where `aligned` (pack_aligned
/// for V of every pointer the body reads or writes), else one element per thread. Throws
/// precis::error, naming `name`, when the launch fails.
template <int V, class Body>
void launch_packed(cudaStream_t stream, const Body& body, std::size_t n, bool aligned, std::string_view name) {
  if (n == 0) return;
  if (V > 1 && aligned) {
    packed_kernel<V><<<grid_for(n / V + 1), 256, 0, stream>>>(body, n);
  } else {
    packed_kernel<1><<<grid_for(n), 256, 0, stream>>>(body, n);
  }
  check(cudaGetLastError(), name);
}

inline constexpr unsigned row_threads = 256;

/// The grid of a one-block-per-row kernel; throws precis::error for more rows than a grid
/// holds (2^31 - 1) instead of launching a truncated one.
inline unsigned row_blocks(std::size_t rows, std::string_view name) {
  if (rows > 2147483647U) {
    throw error(std::string(name) + ": " + std::to_string(rows) +
                " rows (one block each) exceed the 2^31 - 1 blocks of a CUDA grid");
  }
  return unsigned(rows);
}

/// The larger of two values, NaN winning (the host rows' rule, vmath::row_range_of).
template <class M>
__device__ inline M max_nan(M a, M b) {
  return (!::isnan(a) && (b > a || ::isnan(b))) ? b : a;
}

/// max_nan as a reduction's operation.
template <class M>
struct max_nan_op {
  __device__ M operator()(M a, M b) const { return max_nan(a, b); }
};

/// Combines every thread's `v` with `op` (warp shuffles, then the warps' results in warp
/// order); every thread of the block gets the result. `shared` holds 32 values. Each thread
/// combines the warps' results itself, in the same order (so with the same bits), which
/// saves a barrier and a broadcast over one thread combining them for all.
template <class M, class Op>
__device__ M block_reduce(M v, Op op, M* shared) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_down_sync(0xFFFFFFFFU, v, o));
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  M r = shared[0];
  for (unsigned w = 1; w < (blockDim.x + 31) / 32; ++w) r = op(r, shared[w]);
  return r;
}

/// Combines the 32 lanes' `v` with `op` by a butterfly of shuffles (lane i with lane i ^ o,
/// o = 16, 8, .., 1), in an order that depends on nothing but the lanes; every lane gets
/// lane 0's result (a max with NaN winning keeps the first NaN's payload, and the sign of a
/// zero, in the order of its operands, so lanes could otherwise differ there).
template <class M, class Op>
__device__ M warp_reduce(M v, Op op) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xFFFFFFFFU, v, o));
  return __shfl_sync(0xFFFFFFFFU, v, 0);
}

// ---- rows held in registers ----
//
// The row kernels (softmax, log-softmax, layer norm and cross-entropy, forward and backward)
// read each row once: the row's threads load their shares into registers, 16 bytes per access
// where the row allows it, reduce them, and write the outputs from the registers. Thread `rank`
// of a row's `threads` holds columns (i * threads + rank) * V + k in slot i * V + k (k < V, V
// the row's pack width, or 1 where the row's length or pointers allow no 16-byte access): a
// warp's accesses cover 32 consecutive packs, or 32 consecutive elements. Each thread adds its
// slots in slot order, then the row's threads combine in a fixed tree (warp_reduce, or
// block_reduce), so a result depends on the row's length and on whether the pointers allow
// 16-byte accesses (a device tensor's own data always do where the length does), never on
// the device or the run.

// The geometry (resident_rows_for, slot_column) is kernels/common.hpp's, checked on the host;
// rows longer than resident_row_limit are read once per pass by a block of row_threads.

/// A warp per row, several rows per block, a grid-stride loop over the rows.
struct warp_per_row {
  static constexpr unsigned max_threads = row_threads;  ///< threads per block (its launch bound)
  __device__ static unsigned rank() { return threadIdx.x % 32; }
  __device__ static unsigned threads() { return 32; }
  __device__ static std::size_t first() { return blockIdx.x * std::size_t(blockDim.x / 32) + threadIdx.x / 32; }
  __device__ static std::size_t step() { return std::size_t(gridDim.x) * (blockDim.x / 32); }
  __device__ static unsigned group() { return threadIdx.x / 32; }  ///< the row group within the block
  __device__ static unsigned groups() { return blockDim.x / 32; }  ///< row groups per block
  template <class M, class Op>
  __device__ static M reduce(M v, Op op) {
    return warp_reduce(v, op);
  }
};

/// A block per row, a grid-stride loop over the rows.
struct block_per_row {
  static constexpr unsigned max_threads = 512;  ///< threads per block at most (its launch bound)
  __device__ static unsigned rank() { return threadIdx.x; }
  __device__ static unsigned threads() { return blockDim.x; }
  __device__ static std::size_t first() { return blockIdx.x; }
  __device__ static std::size_t step() { return gridDim.x; }
  __device__ static unsigned group() { return 0; }
  __device__ static unsigned groups() { return 1; }
  template <class M, class Op>
  __device__ static M reduce(M v, Op op) {
    __shared__ M shared[32];
    return block_reduce(v, op, shared);
  }
};

static_assert(fused_norm_max_groups * 32 <= warp_per_row::max_threads,
              "precis: the fused layer norm backward's warps fit warp_per_row's launch bound");
static_assert(resident_rows_for(resident_row_limit).threads <= block_per_row::max_threads &&
                  resident_rows_for(resident_row_limit).threads * 16 >= resident_row_limit,
              "precis: the longest resident row fits a block of block_per_row::max_threads threads of 16 slots");

/// Whether a row kernel that reads one tensor keeps its next row in flight (pipelined_rows)
/// with `slots` values a thread: up to 16 (rows of up to 256 columns a warp, and every row a
/// block holds). With 32 a second row would take the registers of a third of the SM's warps.
__host__ __device__ constexpr bool pipelined_slots(int slots) { return slots <= 16; }

/// Calls launch(group, slots, width, blocks, threads) with the row group (warp_per_row or
/// block_per_row), the slots per thread and the columns per access (each a
/// std::integral_constant) and the grid for `rows` rows of `cols` (1 .. resident_row_limit)
/// columns, as resident_rows_for(cols) says, a group taking up to 4 rows where the kernel is
/// `pipelined` and pipelined_slots(slots). The width is V where the rows are `packed` (16
/// bytes per access); otherwise 1, so that a warp's loads and stores still cover 32
/// consecutive elements: V single-element accesses over groups of V columns would touch V
/// times the 32-byte sectors each (16 per warp access for 2-byte elements, where 2 do), and
/// store 2-byte pieces of the same sectors V times over.
template <int V, class F>
void with_resident_rows(std::size_t rows, std::size_t cols, bool packed, bool pipelined, F&& launch) {
  const auto with_width = [&](auto group, auto slots, unsigned blocks, unsigned threads) {
    if (packed) {
      launch(group, slots, std::integral_constant<int, V>{}, blocks, threads);
    } else {
      launch(group, slots, std::integral_constant<int, 1>{}, blocks, threads);
    }
  };
  const resident_rows g = resident_rows_for(cols);
  if (g.per_warp) {
    const std::size_t groups = row_threads / 32;
    const std::size_t per_block =
        groups * (pipelined && pipelined_slots(g.slots) ? resident_rows_per_group(rows, groups) : 1);
    const auto blocks = unsigned(std::clamp<std::size_t>((rows + per_block - 1) / per_block, 1, 65535));
    if (g.slots == 8) {
      with_width(warp_per_row{}, std::integral_constant<int, 8>{}, blocks, row_threads);
    } else {
      with_width(warp_per_row{}, std::integral_constant<int, 32>{}, blocks, row_threads);
    }
    return;
  }
  const std::size_t per_block = pipelined && pipelined_slots(g.slots) ? resident_rows_per_group(rows, 1) : 1;
  with_width(block_per_row{}, std::integral_constant<int, 16>{},
             unsigned(std::clamp<std::size_t>((rows + per_block - 1) / per_block, 1, 65535)), g.threads);
}

/// Calls body(r, load(r)) for the rows r = G::first(), G::first() + G::step(), .. below
/// `rows`, in that order; where Pipelined, the next row's load(r) is issued before the body
/// of the row before runs, so that a row group's reads of its next row are in flight while
/// it reduces and writes the current one (with_resident_rows gives a group up to 4 rows).
/// load returns what the body reads from memory (row_raw shares), by value. Pipelined costs
/// a second row's registers: pipelined_slots says where the kernels afford it.
template <class G, bool Pipelined, class Load, class Body>
__device__ __forceinline__ void pipelined_rows(std::size_t rows, Load&& load, Body&& body) {
  if constexpr (!Pipelined) {
    for (std::size_t r = G::first(); r < rows; r += G::step()) body(r, load(r));
    return;
  }
  std::size_t r = G::first();
  if (r >= rows) return;
  auto current = load(r);
  for (;;) {
    const std::size_t next = r + G::step();
    const bool more = next < rows;  // the same for the whole group
    decltype(current) following;
    if (more) following = load(next);
    body(r, current);
    if (!more) return;
    current = following;
    r = next;
  }
}

/// Reads the V values at columns c .. c + V - 1 of `p` (those below `cols`) as M: one 16-byte
/// access where `packed` (the row's length a multiple of V, every pointer aligned to V), else
/// one element at a time. Slots past the row's end are set to 0 and never used.
template <int V, class M, class T>
__device__ __forceinline__ void load_slots(const T* p, std::size_t c, std::size_t cols, bool packed, M (&out)[V]) {
  if (packed) {
    if (c < cols) {
      const auto in = load_pack<V>(p + c);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = device_load<M>(in.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = M(0);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = c + k < cols ? device_load<M>(p[c + k]) : M(0);
  }
}

/// Writes the values of `in` below column `cols` at columns c .. c + V - 1 of `p`, each
/// rounded once to T (one 16-byte access where `packed`, as load_slots).
template <int V, class M, class T>
__device__ __forceinline__ void store_slots(T* p, std::size_t c, std::size_t cols, bool packed, const M (&in)[V]) {
  if (packed) {
    if (c < cols) {
      pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = round_to<T>(in[k]);
      store_pack<V>(p + c, out);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (c + k < cols) p[c + k] = round_to<T>(in[k]);
    }
  }
}

/// A thread's share of a row: S values as M (at least V), in groups of V (read as a
/// row_raw, then converted: row_raw::share).
template <class M, int V, int S>
struct row_share {
  static constexpr int groups = resident_groups(S, V);
  static_assert(S < V || S % V == 0, "precis: a row share holds whole packs");
  M v[groups][V];

  /// The row's largest value (NaN winning), combined over the row group G.
  template <class G>
  __device__ __forceinline__ M row_max(std::size_t cols) {
    M m = -static_cast<M>(INFINITY);
    each<G>(cols, [&](M& v, std::size_t) { m = max_nan(m, v); });
    return G::reduce(m, max_nan_op<M>{});
  }
  /// Calls f(value, column) for each slot below the row's end, in slot order.
  template <class G, class F>
  __device__ __forceinline__ void each(std::size_t cols, F&& f) {
#pragma unroll
    for (int i = 0; i < groups; ++i) {
      const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (c + k < cols) f(v[i][k], c + k);
      }
    }
  }
};

/// A thread's share of a row as read, in the tensor's own type T (the same slots as
/// row_share<M, V, S>): what pipelined_rows keeps in flight for the next row, in half a
/// converted share's registers for 16-bit types. share<M>() converts it.
template <class T, int V, int S>
struct row_raw {
  static constexpr int groups = resident_groups(S, V);
  pack<T, V> v[groups];

  /// Reads the thread's share of `row` (cols columns) for the row group G, as load_slots:
  /// 16 bytes per access where `packed`; slots past the row's end are zero.
  template <class G>
  __device__ __forceinline__ void load(const T* row, std::size_t cols, bool packed) {
#pragma unroll
    for (int i = 0; i < groups; ++i) {
      const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
      if (packed && c < cols) {
        v[i] = load_pack<V>(row + c);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) v[i].v[k] = !packed && c + k < cols ? row[c + k] : T{};
      }
    }
  }
  /// The share converted to M.
  template <class M>
  __device__ __forceinline__ row_share<M, V, S> share() const {
    row_share<M, V, S> s;
#pragma unroll
    for (int i = 0; i < groups; ++i) {
#pragma unroll
      for (int k = 0; k < V; ++k) s.v[i][k] = device_load<M>(v[i].v[k]);
    }
    return s;
  }
};

/// pipelined_rows over the rows of one tensor x (rows x cols): body(r, s), s the thread's
/// share of row r converted to M, the next row in flight where pipelined_slots(S).
template <class G, class M, int V, int S, class T, class Body>
__device__ __forceinline__ void for_each_row_share(const T* x, std::size_t rows, std::size_t cols, bool packed,
                                                   Body&& body) {
  const auto load = [&](std::size_t r) {
    row_raw<T, V, S> raw;
    raw.template load<G>(x + r * cols, cols, packed);
    return raw;
  };
  pipelined_rows<G, pipelined_slots(S)>(rows, load, [&](std::size_t r, const row_raw<T, V, S>& raw) {
    auto s = raw.template share<M>();
    body(r, s);
  });
}

/// Adds two partial sums as the accumulate type Acc does.
template <class Acc, class M>
struct acc_add {
  __device__ M operator()(M a, M b) const {
    accumulator<Acc> s(static_cast<typename accumulator<Acc>::value_type>(a));
    s.add(static_cast<typename accumulator<Acc>::value_type>(b));
    return static_cast<M>(s.value());
  }
};

/// The sum of every thread's running sum `s`, combined in Acc's value type (float or
/// double: never rounded to a narrower math type on the way), as M; every thread gets it.
template <class M, class Acc>
__device__ M block_sum(const accumulator<Acc>& s) {
  using V = typename accumulator<Acc>::value_type;
  __shared__ V shared[32];
  return static_cast<M>(block_reduce(s.value(), acc_add<Acc, V>{}, shared));
}

}  // namespace precis::detail::cuda

#endif
