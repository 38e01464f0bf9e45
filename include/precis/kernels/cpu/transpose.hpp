/// @file
/// Transposes of 16- and 32-bit matrices (private; used by the oneDNN layouts, the AMX product's
/// packing and the exact convolutions' channels-last images).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace precis::detail {

/// Rows [i0, i1) of columns [j0, j1) of a transpose, one value at a time: dst[j * ld_dst +
/// i] = src[i * ld_src + j] (the edges of transpose_16 and transpose_32).
template <class T>
inline void transpose_one_by_one(const T* s, std::size_t ld_src, T* d, std::size_t ld_dst,
                                 std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  for (std::size_t j = j0; j < j1; ++j) {
    for (std::size_t i = i0; i < i1; ++i) d[j * ld_dst + i] = s[i * ld_src + j];
  }
}

#if defined(__SSE2__)
/// v[0..7], eight rows of eight 16-bit values, transposed in place (24 unpacks).
inline void transpose_8x8_16(__m128i (&v)[8]) {
  const __m128i t0 = _mm_unpacklo_epi16(v[0], v[1]), t1 = _mm_unpackhi_epi16(v[0], v[1]);
  const __m128i t2 = _mm_unpacklo_epi16(v[2], v[3]), t3 = _mm_unpackhi_epi16(v[2], v[3]);
  const __m128i t4 = _mm_unpacklo_epi16(v[4], v[5]), t5 = _mm_unpackhi_epi16(v[4], v[5]);
  const __m128i t6 = _mm_unpacklo_epi16(v[6], v[7]), t7 = _mm_unpackhi_epi16(v[6], v[7]);
  const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
  const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
  const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
  const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
  v[0] = _mm_unpacklo_epi64(u0, u4);
  v[1] = _mm_unpackhi_epi64(u0, u4);
  v[2] = _mm_unpacklo_epi64(u1, u5);
  v[3] = _mm_unpackhi_epi64(u1, u5);
  v[4] = _mm_unpacklo_epi64(u2, u6);
  v[5] = _mm_unpackhi_epi64(u2, u6);
  v[6] = _mm_unpacklo_epi64(u3, u7);
  v[7] = _mm_unpackhi_epi64(u3, u7);
}
#endif

/// dst = src transposed, for a rows x cols matrix of 16-bit values: dst[j * ld_dst + i] =
/// src[i * ld_src + j]. 8 x 8 blocks go through SSE2 unpacks (8 loads, 24 unpacks, 8
/// stores); with at least 8 rows and columns, the edges are blocks that overlap the last
/// whole ones, otherwise they go one value at a time. The blocks run in strips 64 columns
/// wide, rows of blocks down each strip: the source is read a few whole cache lines at a
/// time, and the destination rows a strip writes (64 of them) stay in the cache until their
/// lines are full. A matrix of fewer than 8 rows whose destination rows are contiguous (NCHW ->
/// NHWC with 1 to 7 channels) takes 8 columns at a time too: each destination row is stored 8
/// values wide, the overhang landing on the next rows, which are written after it.
inline void transpose_16(const std::uint16_t* s, std::size_t ld_src, std::uint16_t* d,
                         std::size_t ld_dst, std::size_t rows, std::size_t cols) {
  const std::size_t r8 = rows - rows % 8, c8 = cols - cols % 8;
  const auto one_by_one = [&](std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
    transpose_one_by_one(s, ld_src, d, ld_dst, i0, i1, j0, j1);
  };
#if defined(__SSE2__)
  const auto block = [&](std::size_t r, std::size_t c, std::size_t valid_rows) {
    __m128i v[8];
    for (std::size_t i = 0; i < 8; ++i) {
      v[i] = i < valid_rows
                 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + (r + i) * ld_src + c))
                 : _mm_setzero_si128();
    }
    transpose_8x8_16(v);
    for (std::size_t j = 0; j < 8; ++j) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (c + j) * ld_dst + r), v[j]);
    }
  };
  if (rows < 8 && ld_dst == rows) {
    // A block's overhang reaches 8 - rows values past its last row; it must stay inside
    // the matrix, in rows written later.
    std::size_t c = 0;
    for (; c + 8 <= cols && (cols - c - 7) * rows > 7; c += 8) block(0, c, rows);
    one_by_one(0, rows, c, cols);
    return;
  }
  if (rows < 8) {
    one_by_one(0, rows, 0, cols);
    return;
  }
  // With at least 8 rows and columns, the last partial row or column of blocks is a whole
  // block moved back to end at the edge: it writes some values a second time, the same.
  const auto tail_rows = [&](std::size_t c) {
    if (r8 < rows) block(rows - 8, c, 8);
  };
  for (std::size_t c0 = 0; c0 < c8; c0 += 64) {
    const std::size_t c1 = std::min(c8, c0 + 64);
    for (std::size_t r0 = 0; r0 < r8; r0 += 64) {
      const std::size_t r1 = std::min(r8, r0 + 64);
      for (std::size_t c = c0; c < c1; c += 8) {
        for (std::size_t r = r0; r < r1; r += 8) block(r, c, 8);
      }
    }
    for (std::size_t c = c0; c < c1; c += 8) tail_rows(c);
  }
  if (c8 < cols) {
    if (cols < 8) {
      one_by_one(0, rows, c8, cols);
      return;
    }
    for (std::size_t r = 0; r < r8; r += 8) block(r, cols - 8, 8);
    tail_rows(cols - 8);
  }
#else
  one_by_one(0, rows, 0, cols);
#endif
}

/// The 32-bit version of transpose_16, 4 x 4 blocks through SSE2 unpacks: dst[j * ld_dst +
/// i] = src[i * ld_src + j] for a rows x cols matrix.
inline void transpose_32(const std::uint32_t* s, std::size_t ld_src, std::uint32_t* d,
                         std::size_t ld_dst, std::size_t rows, std::size_t cols) {
  const std::size_t r4 = rows - rows % 4, c4 = cols - cols % 4;
  const auto one_by_one = [&](std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
    transpose_one_by_one(s, ld_src, d, ld_dst, i0, i1, j0, j1);
  };
  for (std::size_t c = 0; c < c4; c += 4) {
    for (std::size_t r = 0; r < r4; r += 4) {
#if defined(__SSE2__)
      const auto row = [&](std::size_t i) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + (r + i) * ld_src + c));
      };
      const __m128i a0 = row(0), a1 = row(1), a2 = row(2), a3 = row(3);
      const __m128i t0 = _mm_unpacklo_epi32(a0, a1), t1 = _mm_unpackhi_epi32(a0, a1);
      const __m128i t2 = _mm_unpacklo_epi32(a2, a3), t3 = _mm_unpackhi_epi32(a2, a3);
      const auto out = [&](std::size_t j, __m128i v) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (c + j) * ld_dst + r), v);
      };
      out(0, _mm_unpacklo_epi64(t0, t2));
      out(1, _mm_unpackhi_epi64(t0, t2));
      out(2, _mm_unpacklo_epi64(t1, t3));
      out(3, _mm_unpackhi_epi64(t1, t3));
#else
      one_by_one(r, r + 4, c, c + 4);
#endif
    }
    one_by_one(r4, rows, c, c + 4);
  }
  one_by_one(0, rows, c4, cols);
}

/// dst = src transposed for a rows x cols matrix of any trivially copyable T:
/// dst[j * ld_dst + i] = src[i * ld_src + j]. 2- and 4-byte values take transpose_16 and
/// transpose_32 (moved as integers of their size: their bits, unchanged), others go one by
/// one in 16 x 16 tiles.
template <class T>
void transpose_matrix(const T* s, std::size_t ld_src, T* d, std::size_t ld_dst, std::size_t rows,
                      std::size_t cols) {
  static_assert(std::is_trivially_copyable_v<T>);
  if constexpr (sizeof(T) == 2 || sizeof(T) == 4) {
    using U = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::uint32_t>;
    const auto* su = reinterpret_cast<const U*>(s);
    auto* du = reinterpret_cast<U*>(d);
    if constexpr (sizeof(T) == 2) {
      transpose_16(su, ld_src, du, ld_dst, rows, cols);
    } else {
      transpose_32(su, ld_src, du, ld_dst, rows, cols);
    }
  } else {
    constexpr std::size_t tile = 16;
    for (std::size_t i = 0; i < rows; i += tile) {
      for (std::size_t j = 0; j < cols; j += tile) {
        transpose_one_by_one(s, ld_src, d, ld_dst, i, std::min(rows, i + tile), j, std::min(cols, j + tile));
      }
    }
  }
}

/// dst = each of `images` row-major rows x cols matrices of T, transposed (transpose_matrix).
/// NCHW -> NHWC images with rows = C, cols = H*W; back with rows = H*W, cols = C. oneDNN
/// 2.6's own reorder between these layouts (jit:uni) moved about 13 GB/s here, several
/// times the convolution's own time on small layers.
template <class T>
void transpose_images(const T* src, T* dst, std::size_t images, std::size_t rows,
                      std::size_t cols) {
  const std::size_t size = rows * cols;
  for (std::size_t n = 0; n < images; ++n) transpose_matrix(src + n * size, cols, dst + n * size, rows, rows, cols);
}

}  // namespace precis::detail
