/// @file
/// The float engine behind gemm, conv and their backward passes on the CPU. Private to precis
/// (namespace precis::detail).
///
/// Why this design: products of float16, bfloat16, float8 and tfloat32-rounded inputs are
/// exact in float, so converting the inputs to float while packing them (as BLIS and
/// OpenBLAS pack panels anyway) and running a float FMA micro-kernel gives exactly the
/// tensor-core semantics: sum_k (exact a_ik b_kj), added in float in k order, rounded once
/// at the end. An FMA of an exact product equals the product added, so the result does not
/// depend on whether the target has FMA. Written here rather than taken from a BLAS so that
/// precis links nothing, owns its threads (a BLAS's global thread pool would be global
/// state) and gives the same bits for every thread count.
///
/// Determinism: every output element is the float sum over k = 0, 1, ..., K-1 of its
/// products, accumulated in one register lane in that order (the partial sums between
/// K blocks are stored and reloaded as floats, which changes nothing). Threads split the
/// output into disjoint column (or row) ranges; no element's sequence depends on the split.
///
/// The micro-kernel is MR x NR floats of registers, NR = two SIMD vectors: AVX-512 or
/// AVX2+FMA when the build targets them. A build for an x86 target without FMA (no -march:
/// a baseline x86-64) carries the AVX2+FMA kernel compiled for that instruction set alone
/// and runs it where the CPU has it, else a loop of std::fma (the C library's exact fma).
/// Other targets use GCC/Clang vectors with std::fma per lane. Every product is fused into
/// its sum on every path, so products of float inputs, which are not exact, give the same
/// bits under any build flags and on any CPU (docs/reproducibility.md).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/policy/policy.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <new>
#include <utility>

#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/// Whether the build chooses the gemm micro-kernel at run time (an x86 target without FMA),
/// and the target attribute its AVX2+FMA kernel is compiled with.
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__)) && \
    (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PRECIS_GEMM_RUNTIME_FMA 1
#define PRECIS_GEMM_TARGET __attribute__((target("avx2,fma")))
#else
#define PRECIS_GEMM_RUNTIME_FMA 0
#define PRECIS_GEMM_TARGET
#endif

namespace precis::detail {

/// True when T may be an input of a kernel of kind Op under P: float or double, or the
/// (rule-applied) policy's storage or gradient type. Anything else means the caller
/// forgot a cast, or called with the wrong policy.
template <op_kind Op, Policy P, class T>
inline constexpr bool policy_input_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, typename kernel_policy_t<Op, P>::storage_type> ||
    std::is_same_v<T, typename kernel_policy_t<Op, P>::gradient_type>;


/// The SIMD vector the micro-kernel is written in, with the four operations it needs.
struct gemm_simd {
#if defined(__AVX512F__)
  using vec = __m512;
  static constexpr std::size_t width = 16;
  static constexpr std::size_t mr = 12;  // 24 accumulators + 2 B vectors + 1 broadcast of 32 zmm
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
#elif (defined(__AVX2__) && defined(__FMA__)) || PRECIS_GEMM_RUNTIME_FMA
  using vec = __m256;
  static constexpr std::size_t width = 8;
  static constexpr std::size_t mr = 6;  // 12 accumulators + 2 + 1 of 16 ymm
  PRECIS_GEMM_TARGET static vec zero() { return _mm256_setzero_ps(); }
  PRECIS_GEMM_TARGET static vec load(const float* p) { return _mm256_loadu_ps(p); }
  PRECIS_GEMM_TARGET static void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  PRECIS_GEMM_TARGET static vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  PRECIS_GEMM_TARGET static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
#else
  // GCC/Clang vector extensions (NEON on AArch64), fused lane by lane.
  typedef float vec __attribute__((vector_size(16)));
  static constexpr std::size_t width = 4;
  static constexpr std::size_t mr = 6;
  static vec zero() { return vec{0, 0, 0, 0}; }
  static vec load(const float* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
  static vec broadcast(const float* p) { return vec{*p, *p, *p, *p}; }
  static vec fma(vec a, vec b, vec c) {
    vec r;
    for (int i = 0; i < 4; ++i) r[i] = std::fma(a[i], b[i], c[i]);
    return r;
  }
#endif
  static constexpr std::size_t nr = 2 * width;
};

/// Rows and columns of one micro-kernel tile.
inline constexpr std::size_t gemm_mr = gemm_simd::mr;
inline constexpr std::size_t gemm_nr = gemm_simd::nr;
/// Cache blocking: a KC x NR panel of B (32 KiB at NR = 32) stays in L1 while the MC x KC
/// block of A (96 KiB) streams from L2; the KC x NC block of B sits in L2/L3.
inline constexpr std::size_t gemm_kc = 256;
inline constexpr std::size_t gemm_mc = gemm_mr * 8;
inline constexpr std::size_t gemm_nc = 1024;

/// C[MR x NR] (row stride ldc) = (first ? 0 : C) + A_panel * B_panel over kc steps, where
/// the packed A panel holds MR floats per k and the B panel NR floats per k. The
/// accumulators are locals of this function, indexed by constants only, so the compiler
/// keeps them in registers (captured by a lambda that is not inlined they would live in
/// memory, a several-fold slowdown).
template <bool First, bool Two, std::size_t... R>
PRECIS_GEMM_TARGET inline void gemm_micro_rows(std::index_sequence<R...>, std::size_t kc,
                                               const float* a, const float* b, float* c,
                                               std::size_t ldc) {
  using S = gemm_simd;
  using V = S::vec;
  constexpr std::size_t W = S::width, MR = sizeof...(R);
  V acc0[MR], acc1[MR];
  if constexpr (First) {
    ((acc0[R] = S::zero(), acc1[R] = S::zero()), ...);
  } else {
    ((acc0[R] = S::load(c + R * ldc), acc1[R] = Two ? S::load(c + R * ldc + W) : S::zero()), ...);
  }
  for (std::size_t k = 0; k < kc; ++k) {
    const V b0 = S::load(b);
    if constexpr (Two) {
      const V b1 = S::load(b + W);
      ((acc0[R] = S::fma(S::broadcast(a + R), b0, acc0[R]),
        acc1[R] = S::fma(S::broadcast(a + R), b1, acc1[R])),
       ...);
    } else {
      ((acc0[R] = S::fma(S::broadcast(a + R), b0, acc0[R])), ...);
    }
    a += MR;
    b += 2 * W;
  }
  if constexpr (Two) {
    ((S::store(c + R * ldc, acc0[R]), S::store(c + R * ldc + W, acc1[R])), ...);
  } else {
    ((S::store(c + R * ldc, acc0[R])), ...);
  }
}

/// The tile's sums as gemm_micro_rows forms them, one std::fma per product: the same bits
/// (each sum is the same sequence of fused operations). Runs where a build that chooses at
/// run time finds no FMA instructions; std::fma is then the C library's exact fma (slow).
template <bool First>
void gemm_micro_portable(std::size_t kc, const float* a, const float* b, float* c, std::size_t ldc,
                         std::size_t cols = gemm_simd::nr) {
  constexpr std::size_t MR = gemm_simd::mr, NR = gemm_simd::nr;
  const std::size_t n = cols <= gemm_simd::width ? gemm_simd::width : NR;
  for (std::size_t r = 0; r < MR; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      float s = First ? 0.0F : c[r * ldc + j];
      for (std::size_t k = 0; k < kc; ++k) s = std::fma(a[k * MR + r], b[k * NR + j], s);
      c[r * ldc + j] = s;
    }
  }
}

/// True when the CPU runs the AVX2+FMA micro-kernel (asked once).
inline bool gemm_cpu_has_fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
#else
  return false;
#endif
}

/// The tile's sums; `cols` (at most NR) says how many of its columns are wanted: at most
/// one vector's worth takes half the work (a narrow product, as attention's P V with 16-
/// or 32-value heads has). Every sum wanted is the same sequence of operations either way.
template <bool First>
inline void gemm_micro(std::size_t kc, const float* a, const float* b, float* c, std::size_t ldc,
                       std::size_t cols = gemm_simd::nr) {
#if PRECIS_GEMM_RUNTIME_FMA
  if (!gemm_cpu_has_fma()) {
    gemm_micro_portable<First>(kc, a, b, c, ldc, cols);
    return;
  }
#endif
  if (cols <= gemm_simd::width) {
    gemm_micro_rows<First, false>(std::make_index_sequence<gemm_simd::mr>{}, kc, a, b, c, ldc);
  } else {
    gemm_micro_rows<First, true>(std::make_index_sequence<gemm_simd::mr>{}, kc, a, b, c, ldc);
  }
}

/// A float buffer aligned for the SIMD loads, uninitialised. Made with a context, a large
/// one is taken from the context's scratch cache and given back when destroyed.
class float_buffer {
 public:
  explicit float_buffer(std::size_t n) : p_(scratch_cache::allocate(n)) {}
  float_buffer(const cpu_context& ctx, std::size_t n) {
    if (n * sizeof(float) >= scratch_cache::min_bytes && ctx.scratch) {
      auto [b, size] = ctx.scratch->take(n);
      p_ = std::move(b);
      size_ = size;
      home_ = ctx.scratch;
    } else {
      p_ = scratch_cache::allocate(n);
    }
  }
  float_buffer(float_buffer&&) noexcept = default;
  float_buffer& operator=(float_buffer&& o) noexcept {
    release();
    p_ = std::move(o.p_);
    size_ = o.size_;
    home_ = std::move(o.home_);
    return *this;
  }
  float_buffer(const float_buffer&) = delete;
  float_buffer& operator=(const float_buffer&) = delete;
  ~float_buffer() { release(); }

  float* get() const { return p_.get(); }

 private:
  void release() noexcept {
    if (home_ && p_) {
      try {
        home_->give(std::move(p_), size_);
      } catch (...) {  // no memory to keep it: it is freed
      }
    }
    p_.reset();
    home_.reset();
  }

  scratch_cache::block p_;
  std::size_t size_ = 0;
  std::shared_ptr<scratch_cache> home_;
};

/// True for packers that hold their panels already laid out as gemm_serial reads them
/// (prepacked): `panel(j0, k0, kc)` gives the start of the panels from j0 at depth k0.
template <class Pack>
concept panel_source = requires(const Pack& p, std::size_t n) {
  { p.panel(n, n, n) } -> std::convertible_to<const float*>;
};

/// Rounds a float to tfloat32 (10 mantissa bits) to nearest-even, as tensor cores read
/// float inputs under TF32; NaN and infinity pass unchanged, a carry overflows to infinity.
inline float round_tf32(float x) {
  auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7F800000U) == 0x7F800000U) return x;
  u += 0x0FFFU + ((u >> 13) & 1U);
  return std::bit_cast<float>(u & 0xFFFFE000U);
}

/// One thread's share of C = op(A) op(B) in float: rows [m0, m1) and columns [n0, n1).
/// `pack_a(i0, rows, k0, kc, out)` writes the float values op(A)[i0 + r][k0 + k] to
/// out[k * MR + r] for r < rows and zero for rows <= r < MR; `pack_b(j0, cols, k0, kc,
/// out)` writes op(B)[k0 + k][j0 + c] to out[k * NR + c] likewise. The finished float sums
/// go to the epilogue a row at a time, `epilogue(i, j0, acc, n)` (n sums of row i from
/// column j0), or, when it takes six arguments, a block at a time, `epilogue(i0, rows, j0,
/// cols, acc, ld)` (row i0 + r at acc + r * ld), for outputs whose columns are not
/// contiguous in memory.
template <class Epilogue>
void finish_rows(Epilogue& epilogue, std::size_t i0, std::size_t rows, std::size_t j0,
                 std::size_t cols, const float* acc, std::size_t ld) {
  if constexpr (std::is_invocable_v<Epilogue&, std::size_t, std::size_t, std::size_t,
                                    std::size_t, const float*, std::size_t>) {
    epilogue(i0, rows, j0, cols, acc, ld);
  } else {
    for (std::size_t r = 0; r < rows; ++r) epilogue(i0 + r, j0, acc + r * ld, cols);
  }
}

template <class PackA, class PackB, class Epilogue>
void gemm_serial(std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1, std::size_t K,
                 PackA& pack_a, PackB& pack_b, Epilogue& epilogue) {
  constexpr std::size_t MR = gemm_mr, NR = gemm_nr, KC = gemm_kc, MC = gemm_mc, NC = gemm_nc;
  if (m0 >= m1 || n0 >= n1) return;
  const std::size_t M = m1 - m0;
  const std::size_t mpad = (M + MR - 1) / MR * MR;
  const std::size_t ncmax = std::min(NC, n1 - n0);
  const std::size_t ldw = (ncmax + NR - 1) / NR * NR;
  // With one depth block (K <= KC) each MC block of rows is finished before the next one
  // starts, so the sums need MC rows (they stay in cache); deeper products keep every row's
  // sums across the depth blocks. Either way each element's sum runs over k in the same
  // order.
  const bool one_block = K <= KC;
  const std::size_t ws_rows = one_block ? std::min(mpad, MC) : mpad;
  float_buffer bpb(panel_source<PackB> ? 0 : KC * ldw), apb(panel_source<PackA> ? 0 : KC * std::min(mpad, MC)),
      wsb(ws_rows * ldw);
  float* const bp = bpb.get();
  float* const ap = apb.get();
  float* const ws = wsb.get();
  for (std::size_t jc = n0; jc < n1; jc += NC) {
    const std::size_t nc = std::min(NC, n1 - jc);
    if (K == 0) {
      std::fill_n(ws, ws_rows * ldw, 0.0F);
      for (std::size_t ic = 0; ic < M; ic += ws_rows) {
        finish_rows(epilogue, m0 + ic, std::min(ws_rows, M - ic), jc, nc, ws, ldw);
      }
    }
    for (std::size_t pc = 0; pc < K; pc += KC) {
      const std::size_t kc = std::min(KC, K - pc);
      const float* b_panels = bp;
      if constexpr (panel_source<PackB>) {
        b_panels = pack_b.panel(jc, pc, kc);
      } else {
        for (std::size_t jr = 0; jr < nc; jr += NR) {
          pack_b(jc + jr, std::min(NR, nc - jr), pc, kc, bp + jr * kc);
        }
      }
      for (std::size_t ic = 0; ic < M; ic += MC) {
        const std::size_t mc = std::min(MC, M - ic);
        const float* a_panels = ap;
        if constexpr (panel_source<PackA>) {
          a_panels = pack_a.panel(m0 + ic, pc, kc);
        } else {
          for (std::size_t ir = 0; ir < mc; ir += MR) {
            pack_a(m0 + ic + ir, std::min(MR, mc - ir), pc, kc, ap + ir * kc);
          }
        }
        float* const sums = ws + (one_block ? 0 : ic * ldw);
        for (std::size_t jr = 0; jr < nc; jr += NR) {
          for (std::size_t ir = 0; ir < mc; ir += MR) {
            float* c = sums + ir * ldw + jr;
            const std::size_t cols = std::min(NR, nc - jr);
            if (pc == 0) {
              gemm_micro<true>(kc, a_panels + ir * kc, b_panels + jr * kc, c, ldw, cols);
            } else {
              gemm_micro<false>(kc, a_panels + ir * kc, b_panels + jr * kc, c, ldw, cols);
            }
          }
        }
        if (pc + kc >= K) {
          finish_rows(epilogue, m0 + ic, mc, jc, nc, sums, ldw);
        }
      }
    }
  }
}

/// All of an operand (`extent` rows of A or columns of B, depth K) packed once, in parallel,
/// as gemm_serial lays out its panels: K blocks of KC, each `pad` wide, W-wide tiles of
/// kc x W floats in it; gemm_serial then reads its panels in place (panel_source).
template <std::size_t W>
struct prepacked {
  float_buffer data;
  std::size_t pad;

  template <class Pack>
  prepacked(const cpu_context& ctx, std::size_t extent, std::size_t K, Pack& pack)
      : data(ctx, K * ((extent + W - 1) / W * W)), pad((extent + W - 1) / W * W) {
    const std::size_t kblocks = (K + gemm_kc - 1) / gemm_kc, tiles = pad / W;
    parallel_for(ctx, kblocks * tiles, 1, [&](std::size_t t0, std::size_t t1) {
      for (std::size_t t = t0; t < t1; ++t) {
        const std::size_t pc = (t / tiles) * gemm_kc, j = (t % tiles) * W;
        const std::size_t kc = std::min(gemm_kc, K - pc);
        pack(j, std::min(W, extent - j), pc, kc, data.get() + pc * pad + j * kc);
      }
    });
  }

  /// The panels from j0 (a multiple of W) at depth k0 (a multiple of KC), kc deep, laid out
  /// as gemm_serial packs them: gemm_serial reads them in place.
  const float* panel(std::size_t j0, std::size_t k0, std::size_t kc) const { return data.get() + k0 * pad + j0 * kc; }
};

/// C = op(A) op(B) (M x N, depth K) in float on ctx's threads. The output is split into
/// column ranges (rows when N is small), whole NR-wide panels each, so every element is
/// computed as gemm_serial computes it whatever the thread count. The operand every thread
/// would otherwise pack in full (A under a column split, B under a row split) is packed
/// once, shared, when it is small enough; the values packed are the same, so is the result.
template <class PackA, class PackB, class Epilogue>
void gemm_float(const cpu_context& ctx, std::size_t M, std::size_t N, std::size_t K,
                PackA&& pack_a, PackB&& pack_b, Epilogue&& epilogue) {
  constexpr std::size_t NR = gemm_nr, MR = gemm_mr;
  // Below ~4 MFLOP a second thread costs more than it saves.
  const std::size_t min_flops = std::size_t(1) << 22;
  // Largest operand (floats) packed once and shared: 16 MiB.
  const std::size_t max_shared = std::size_t(1) << 22;
  const std::size_t work = std::max<std::size_t>(1, M * N * std::max<std::size_t>(K, 1));
  const bool by_cols = N >= M;
  const std::size_t unit = by_cols ? NR : MR;
  const std::size_t units = ((by_cols ? N : M) + unit - 1) / unit;
  const std::size_t per_unit = std::max<std::size_t>(1, work / units);
  const std::size_t min_units = std::max<std::size_t>(1, min_flops / per_unit);
  const bool threaded = std::min<std::size_t>(ctx.thread_count(), units / min_units) > 1;
  const auto split = [&](auto& pa, auto& pb) {
    parallel_for(ctx, units, min_units, [&](std::size_t u0, std::size_t u1) {
      if (by_cols) {
        gemm_serial(0, M, u0 * NR, std::min(N, u1 * NR), K, pa, pb, epilogue);
      } else {
        gemm_serial(u0 * MR, std::min(M, u1 * MR), 0, N, K, pa, pb, epilogue);
      }
    });
  };
  if (threaded && by_cols && K * (M + MR) <= max_shared) {
    prepacked<MR> shared(ctx, M, K, pack_a);
    split(shared, pack_b);
  } else if (threaded && !by_cols && K * (N + NR) <= max_shared) {
    prepacked<NR> shared(ctx, N, K, pack_b);
    split(pack_a, shared);
  } else {
    split(pack_a, pack_b);
  }
}

}  // namespace precis::detail
