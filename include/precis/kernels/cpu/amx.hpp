/// @file
/// precis's bfloat16 matrix product on AMX tiles (private; included by onednn.hpp, whose hardware
/// products use it for matmuls on CPUs with AMX-BF16).
///
/// The product: C (M x N, float) = A (M x K) B (K x N), bfloat16 inputs. B is packed into
/// panels of 16 columns, pairs of consecutive k as 32-bit words ([kp / 2][16][2], kp = K
/// rounded up to 32: the layout TDPBF16PS reads). A is read where it is, or copied into
/// rows of kp values (row stride kp + 32, so that 16 rows never share one L1 set). Each 32
/// x 32 block of C is four tiles summed over a range of k, stored, and loaded again for the
/// next range (the same floats): every element of C is one chain of TDPBF16PS steps in k
/// order, whatever the blocking and the thread count, so the result is the same bits for
/// any thread count. TDPBF16PS treats subnormal inputs as zero, flushes subnormal results
/// to zero and rounds each step's float sum to nearest even. The driver (amx_product, in
/// onednn.hpp) splits the work and writes the blocks out.
///
/// The kernel functions carry their own target attributes: a build for any x86-64 CPU
/// contains them, and amx_usable() decides at run time.
#pragma once

#include <precis/kernels/cpu/transpose.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define PRECIS_AMX_KERNEL 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define PRECIS_AMX_KERNEL 0
#endif

namespace precis::detail {

/// True when this CPU has AMX-TILE, AMX-BF16 and AVX512-BW and Linux let this process use
/// the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, asked once).
inline bool amx_usable() {
#if PRECIS_AMX_KERNEL
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool tile = ((d >> 24) & 1U) != 0, bf16 = ((d >> 22) & 1U) != 0;
    const bool bw = ((b >> 30) & 1U) != 0;
    if (!tile || !bf16 || !bw) return false;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

/// The padded sizes of one AMX product: K to a multiple of 32 (kp), A's packed row stride
/// (lda = kp + 32 values), N to a multiple of 32 (np: pairs of 16-column panels).
struct amx_layout {
  std::size_t k, kp, lda, n, np;

  static amx_layout of(std::size_t n, std::size_t k) {
    const std::size_t kp = (k + 31) / 32 * 32;
    return {k, kp, kp + 32, n, (n + 31) / 32 * 32};
  }
  std::size_t panels() const { return np / 16; }
  /// Values in one packed panel of B.
  std::size_t panel_values() const { return kp * 16; }
  /// Rows of packed A for m rows (a multiple of 32).
  static std::size_t rows(std::size_t m) { return (m + 31) / 32 * 32; }
};

/// Copies rows [0, m) of A (element (i, k) at a[i * row + k * col]) into dst as
/// amx_layout::rows(m) rows of l.lda values: zeros past K (up to kp) and in the rows past m.
inline void amx_pack_a(const std::uint16_t* a, std::int64_t row, std::int64_t col, std::size_t m,
                       const amx_layout& l, std::uint16_t* dst) {
  const std::size_t K = l.k;
  if (col == 1) {
    for (std::size_t i = 0; i < m; ++i)
      std::memcpy(dst + i * l.lda, a + std::int64_t(i) * row, K * 2);
  } else if (row == 1) {
    transpose_16(a, std::size_t(col), dst, l.lda, K, m);  // dst[i lda + k] = a[k col + i]
  } else {
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t k = 0; k < K; ++k) {
        dst[i * l.lda + k] = a[std::int64_t(i) * row + std::int64_t(k) * col];
      }
    }
  }
  for (std::size_t i = 0; i < m; ++i) std::fill(dst + i * l.lda + K, dst + i * l.lda + l.kp, 0);
  for (std::size_t i = m; i < amx_layout::rows(m); ++i) {
    std::fill(dst + i * l.lda, dst + i * l.lda + l.kp, 0);
  }
}

#if PRECIS_AMX_KERNEL
/// Panels [p0, p1) of row-major B (element (k, j) at b[k * ldb + j]): each pair of rows k,
/// k + 1 interleaved 16 columns at a time (one VPERMT2W per 64 bytes).
__attribute__((target("avx512f,avx512bw"))) inline void amx_pack_b_rows(
    const std::uint16_t* b, std::size_t ldb, const amx_layout& l, std::size_t p0, std::size_t p1,
    std::uint16_t* dst) {
  alignas(64) static constexpr std::uint16_t interleave[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i idx = _mm512_load_si512(interleave);
  for (std::size_t kk = 0; kk < l.kp / 2; ++kk) {
    const std::size_t k = 2 * kk;
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t j0 = p * 16;
      const std::size_t n = j0 < l.n ? std::min<std::size_t>(16, l.n - j0) : 0;
      const auto mask = static_cast<__mmask32>((std::uint32_t(1) << n) - 1U);
      const __m512i r0 = n > 0 && k < l.k ? _mm512_maskz_loadu_epi16(mask, b + k * ldb + j0)
                                          : _mm512_setzero_si512();
      const __m512i r1 = n > 0 && k + 1 < l.k
                             ? _mm512_maskz_loadu_epi16(mask, b + (k + 1) * ldb + j0)
                             : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + p * l.panel_values() + kk * 32,
                          _mm512_permutex2var_epi16(r0, idx, r1));
    }
  }
}
#endif

/// Panels [p0, p1) of B (element (k, j) at b[k * row + j * col]) into dst, panel p at
/// dst + p * l.panel_values(): [kp / 2][16][2], zeros past K and past N.
inline void amx_pack_b(const std::uint16_t* b, std::int64_t row, std::int64_t col,
                       const amx_layout& l, std::size_t p0, std::size_t p1, std::uint16_t* dst) {
#if PRECIS_AMX_KERNEL
  if (col == 1) {
    amx_pack_b_rows(b, std::size_t(row), l, p0, p1, dst);
    return;
  }
#endif
  const std::size_t K = l.k, N = l.n;
  const bool words = row == 1 && col % 2 == 0 && reinterpret_cast<std::uintptr_t>(b) % 4 == 0;
  for (std::size_t p = p0; p < p1; ++p) {
    std::uint16_t* d = dst + p * l.panel_values();
    const std::size_t j0 = p * 16, n = j0 < N ? std::min<std::size_t>(16, N - j0) : 0;
    std::size_t k_done = 0;
    if (words && n > 0) {
      // B^T row-major: the pair (k, k + 1) of column j is one 32-bit word; a transpose of
      // [n][K / 2] words gives [K / 2][16] (ld 16).
      std::fill(d, d + l.panel_values(), 0);
      transpose_32(reinterpret_cast<const std::uint32_t*>(b + j0 * std::size_t(col)),
                   std::size_t(col) / 2, reinterpret_cast<std::uint32_t*>(d), 16, n, K / 2);
      k_done = K / 2 * 2;
    }
    for (std::size_t k = k_done; k < l.kp; ++k) {
      for (std::size_t jj = 0; jj < 16; ++jj) {
        const std::size_t j = j0 + jj;
        d[(k / 2) * 32 + jj * 2 + k % 2] =
            k < K && j < N ? b[std::int64_t(k) * row + std::int64_t(j) * col] : std::uint16_t(0);
      }
    }
  }
}

#if PRECIS_AMX_KERNEL
/// Loads the tile configuration this kernel uses (tmm0-7, each 16 rows of 64 bytes) on the
/// calling thread: amx_block runs between amx_begin and amx_end (which releases the tiles).
// The configuration is a constant in memory: built on the stack, GCC 12 kept only the
// stores that the LDTILECFG asm operand's declared type covers (its first 16 bytes).
__attribute__((target("amx-tile"))) inline void amx_begin() {
  alignas(64) static constexpr std::uint8_t config[64] = {
      1,  0,  0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0,   // palette 1, row 0
      64, 0,  64, 0,  64, 0,  64, 0,  64, 0, 64, 0, 64, 0, 64, 0,   // tmm0-7: 64 bytes
      0,  0,  0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0,   // tmm8-15: unused
      16, 16, 16, 16, 16, 16, 16, 16, 0,  0, 0,  0, 0,  0, 0,  0};  // tmm0-7: 16 rows
  _tile_loadconfig(config);
}

__attribute__((target("amx-tile"))) inline void amx_end() { _tile_release(); }

/// One 32 x 32 block of C, tmm0-3, summed over k in [k0, k1) (multiples of 32) from two A
/// tiles (tmm4-5) and two B tiles (tmm6-7): A's 32 rows at a, lda values apart (zeros past
/// K), B's columns in panels b0 (j < 16) and b1 (packed by amx_pack_b). The sum starts from
/// zero, or from `from` where it is not null; the block is then stored to `to`. Both are
/// 32 x 32 floats, element (i, j) at i * 32 + j. A block's float values stored and loaded
/// again are unchanged, so a block summed over several ranges of k is the same bits as one
/// summed over all of them at once.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_block(
    const std::uint16_t* a, std::size_t lda, const std::uint16_t* b0, const std::uint16_t* b1,
    std::size_t k0, std::size_t k1, const float* from, float* to) {
  const std::size_t stride = lda * 2;
  const std::uint16_t* a1 = a + 16 * lda;
  if (from == nullptr) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, from, 128);
    _tile_loadd(1, from + 16, 128);
    _tile_loadd(2, from + 16 * 32, 128);
    _tile_loadd(3, from + 16 * 32 + 16, 128);
  }
  for (std::size_t k = k0; k < k1; k += 32) {
    _tile_loadd(4, a + k, stride);
    _tile_loadd(6, b0 + k * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + k * 16, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + k, stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, to, 128);
  _tile_stored(1, to + 16, 128);
  _tile_stored(2, to + 16 * 32, 128);
  _tile_stored(3, to + 16 * 32 + 16, 128);
}
#else
// Never called where PRECIS_AMX_KERNEL is 0 (amx_usable() is false there).
inline void amx_begin() {}
inline void amx_end() {}
inline void amx_block(const std::uint16_t*, std::size_t, const std::uint16_t*, const std::uint16_t*,
                      std::size_t, float*) {}
#endif

}  // namespace precis::detail
