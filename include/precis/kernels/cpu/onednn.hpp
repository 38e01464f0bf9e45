/// @file
/// Hardware products on the CPU through oneDNN (private; included by the kernels when
/// PRECIS_HAS_ONEDNN is 1, which the precis::onednn target defines).
///
/// Products under products::hardware run as oneDNN primitives (matmul, convolution). With
/// bfloat16 inputs they use the CPU's bfloat16 dot-product instructions (AMX TDPBF16PS,
/// AVX512-BF16 VDPBF16PS), accumulating in float; those instructions treat subnormal
/// inputs as zero and flush subnormal results. With float inputs they use oneDNN's float
/// kernels (FMA on AVX2 and AVX-512): products fused into float sums, subnormals kept. Either
/// way oneDNN chooses the summation order per shape and machine; the result is still rounded
/// once to the output type, and is the same bits for a given machine, shape and thread
/// count.
///
/// Threads: the context's own worker threads run the parts of a product (rows, or columns,
/// or batch items split evenly; a deep layer's weight gradient, chunks of output channels),
/// each part one single-threaded oneDNN call. oneDNN's OpenMP threads are thus not started
/// beside precis's pool (a convolution with fewer images than threads is the exception: it
/// runs as one call on them): on a 2-core machine two pools would take turns on the cores.
/// Primitives are made once per shape and kept in the context with their scratch memory
/// (oneDNN's user scratchpad mode), so a call after the first allocates no scratch.
#pragma once

#if !PRECIS_HAS_ONEDNN
#error "precis/kernels/cpu/onednn.hpp is private: link precis::onednn, which defines PRECIS_HAS_ONEDNN"
#endif

#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/gemm_kernel.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>

#include <precis/kernels/cpu/amx.hpp>
#include <precis/kernels/cpu/transpose.hpp>

#include <dlfcn.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace precis::detail {

/// OpenMP's thread-count calls, looked up in the OpenMP runtime oneDNN was linked with
/// (Debian's oneDNN threads with libgomp). Looked up rather than linked so that a clang
/// build, whose -fopenmp would bring a second runtime (libomp), sets the one oneDNN reads.
struct omp_threads {
  using get_fn = int (*)();
  using set_fn = void (*)(int);
  get_fn get = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  set_fn set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));

  static const omp_threads& instance() {
    static const omp_threads o;
    return o;
  }

  /// Runs f with oneDNN on `threads` OpenMP threads, then restores the caller's setting.
  template <class F>
  void with(int threads, F&& f) const {
    if (get == nullptr || set == nullptr) {
      f();
      return;
    }
    const int before = get();
    set(threads);
    try {
      f();
    } catch (...) {
      set(before);
      throw;
    }
    set(before);
  }
};

/// The CPU's instruction set as oneDNN sees it, and whether it has bfloat16 dot products.
inline dnnl::cpu_isa onednn_isa() {
  static const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa;
}
inline bool onednn_has_bf16_products() {
  const dnnl::cpu_isa isa = onednn_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}
/// True where precis's AMX kernel takes large bfloat16 matrix products: the CPU and OS
/// allow AMX (amx_usable()) and so does oneDNN's instruction-set limit (its effective ISA,
/// which ONEDNN_MAX_CPU_ISA or dnnl::set_max_cpu_isa can lower, is avx512_core_amx). A
/// limit given to oneDNN thus holds for all of precis's hardware products.
inline bool amx_enabled() { return amx_usable() && onednn_isa() == dnnl::cpu_isa::avx512_core_amx; }
inline const char* onednn_isa_name() {
  switch (onednn_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    default:
      return "older than avx2";
  }
}

/// "oneDNN major.minor.patch" of the library this program runs with.
inline std::string onednn_version_name() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

/// 64-byte aligned bytes that grow and never shrink.
class scratch_bytes {
 public:
  void* get(std::size_t bytes) {
    if (bytes > size_) {
      data_.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64})));
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  struct free_aligned {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, free_aligned> data_;
  std::size_t size_ = 0;
};

/// What one part of a product owns: its stream and scratch memory (oneDNN's scratchpad,
/// float results waiting for precis's epilogue, operands reordered to a primitive's layout,
/// the working values of precis's weight packing; for an AMX product, A's copied rows, B's
/// panels when the part packs its own, and the blocks' sums).
struct onednn_part {
  std::mutex busy;  // held while a part runs (see cpu_context on concurrent kernels)
  std::unique_ptr<dnnl::stream> stream;
  scratch_bytes scratchpad, results, in0, in1, out, packing, slice;
};

/// A product's shape, layouts and types: the key of the primitive cache.
struct onednn_matmul_key {
  std::int64_t batch, m, n, k;
  std::int64_t a_batch, a_row, a_col, b_batch, b_row, b_col, c_batch, c_row;
  int in_type, c_type, bias_type;  // dnnl data types; bias_type 0: no bias
  float alpha = 1.0F;              // oneDNN's output scale (1: none)

  auto tie() const {
    return std::tie(batch, m, n, k, a_batch, a_row, a_col, b_batch, b_row, b_col, c_batch, c_row,
                    in_type, c_type, bias_type, alpha);
  }
  bool operator<(const onednn_matmul_key& o) const { return tie() < o.tie(); }
};

struct onednn_matmul_entry {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, bias, scratchpad;
  std::string implementation;
};

/// Which pass of a convolution a primitive computes.
enum class onednn_conv_kind { forward, backward_data, backward_weights };

/// A convolution's sizes as oneDNN takes them, for the images of one part: x [n, c, h, w],
/// w [co, c / groups, kh, kw], y [n, co, ho, wo] (the images NHWC in memory where
/// `channels_last`); `dilate` is dilation - 1, `pad_r` what makes oneDNN's output size
/// ho x wo.
struct onednn_conv_key {
  std::int64_t n, c, h, w, co, kh, kw, ho, wo, groups;
  std::int64_t stride_y, stride_x, pad_t, pad_l, pad_b, pad_r, dilate_y, dilate_x;
  onednn_conv_kind kind;
  int out_type;          // the output's dnnl data type (float or bfloat16; float for dw)
  bool bias;             // forward only: a float bias [co]
  std::int64_t threads;  // the OpenMP threads it runs on (set by onednn_conv)
  int in_type = 0;       // the inputs' dnnl data type (set by onednn_conv from its inputs)
  bool channels_last = false;  // precis's images are NHWC (else NCHW)

  auto tie() const {
    return std::tie(n, c, h, w, co, kh, kw, ho, wo, groups, stride_y, stride_x, pad_t, pad_l, pad_b,
                    pad_r, dilate_y, dilate_x, kind, in_type, out_type, bias, threads,
                    channels_last);
  }
  bool operator<(const onednn_conv_key& o) const { return tie() < o.tie(); }
};

/// How precis packs bfloat16 weights [O, I, KH, KW] into one of oneDNN's pair-interleaved
/// blocked layouts, the ones its bfloat16 convolutions take (AcdB16b32a2b, ABcd16a16b2a,
/// AcdB16a2b, ...: "VNNI" layouts). Blocks of bo output by bi input channels, the padding
/// past O and I zero; inside a block, pairs of values adjacent along the sum's dimension x
/// (I for forward weights, O for backward-data weights) as 32-bit words, [bx / 2][by]
/// words with by the other dimension's block. Blocks sit at ob s_ob + ib s_ib + h s_h +
/// w s_w elements, in whichever order the layout puts those four.
struct onednn_weight_packing {
  std::int64_t o, i, kh, kw;          // the weights' dims
  std::int64_t bo, bi;                // block sizes along O and I
  bool pairs_over_o;                  // x = O (backward data) rather than I
  std::int64_t s_ob, s_ib, s_h, s_w;  // strides of the outer indices, in elements

  /// The packing of a primitive's bfloat16 weight layout, or nothing where the layout is
  /// not one of this family (oneDNN's reorder packs those).
  static std::optional<onednn_weight_packing> of(const dnnl::memory::desc& prim) {
    const dnnl_memory_desc_t& d = prim.data;
    if (d.ndims != 4 || d.data_type != dnnl_bf16 || d.format_kind != dnnl_blocked ||
        d.extra.flags != 0 || d.offset0 != 0) {
      return std::nullopt;
    }
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    const int n = b.inner_nblks;
    if ((n != 2 && n != 3) || b.inner_blks[n - 1] != 2) return std::nullopt;
    const auto x = b.inner_idxs[n - 1], y = b.inner_idxs[n - 2];
    if (!((x == 0 && y == 1) || (x == 1 && y == 0))) return std::nullopt;
    if (n == 3 && b.inner_idxs[0] != x) return std::nullopt;
    const std::int64_t bx = n == 3 ? 2 * b.inner_blks[0] : 2, by = b.inner_blks[n - 2];
    onednn_weight_packing p{d.dims[0],        d.dims[1],        d.dims[2],   d.dims[3],
                            x == 0 ? bx : by, x == 1 ? bx : by, x == 0,      b.strides[0],
                            b.strides[1],     b.strides[2],     b.strides[3]};
    const auto up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
    for (int k = 0; k < 4; ++k) {
      if (d.padded_offsets[k] != 0) return std::nullopt;
    }
    if (d.padded_dims[0] != up(p.o, p.bo) || d.padded_dims[1] != up(p.i, p.bi) ||
        d.padded_dims[2] != p.kh || d.padded_dims[3] != p.kw ||
        prim.get_size() != std::size_t(up(p.o, p.bo) * up(p.i, p.bi) * p.kh * p.kw * 2)) {
      return std::nullopt;
    }
    return p;
  }
  std::size_t o_blocks() const { return std::size_t((o + bo - 1) / bo); }
  std::size_t i_blocks() const { return std::size_t((i + bi - 1) / bi); }
  std::size_t blocks() const { return o_blocks() * i_blocks(); }
  /// One kernel position's values in pack()'s scratch: [bo][I padded to whole blocks], and
  /// 32 more, so that the positions' rows do not all fall on the same cache sets (with
  /// 512 input channels they would be 16 KiB apart).
  std::size_t scratch_plane() const { return std::size_t(bo * bi) * i_blocks() + 32; }
  /// 16-bit values of the scratch pack() takes: one row of blocks' values, [KH KW] planes.
  std::size_t scratch_values() const { return scratch_plane() * std::size_t(kh * kw); }

  /// Packs blocks [b0, b1) (ob-major) of src [O, I, KH, KW] into dst, through `scratch`
  /// (scratch_values() values). For each row of blocks (one ob), the bo output channels'
  /// [I, KH KW] slices that the range covers are first turned into [KH KW][bo][I] (one
  /// long transpose_16 per channel, or a copy for 1x1 kernels; the scratch is zeroed first
  /// where the blocks have padding); then each kernel position's [bo, bi] values go to
  /// their block as word transposes (pairs along I) or row interleaves (pairs along O).
  void pack(const std::uint16_t* src, std::uint16_t* dst, std::size_t b0, std::size_t b1,
            std::uint16_t* scratch) const {
    const std::size_t k = std::size_t(kh * kw), ubo = std::size_t(bo), ubi = std::size_t(bi);
    const std::size_t ui = std::size_t(i), nib = i_blocks(), ipad = nib * ubi;
    const std::size_t plane = scratch_plane();
    for (std::size_t blk = b0; blk < b1;) {
      const std::size_t ob = blk / nib, ib0 = blk % nib, ib1 = std::min(nib, ib0 + (b1 - blk));
      const std::size_t o0 = ob * ubo, no = std::min(ubo, std::size_t(o) - o0);
      // Input channels [c0, c1) are the tensor's, [c1, c2) the padding of the last block.
      const std::size_t c0 = ib0 * ubi, c2 = ib1 * ubi, c1 = std::min(ui, c2);
      if (no < ubo || c1 < c2) std::fill(scratch, scratch + k * plane, std::uint16_t(0));
      for (std::size_t ol = 0; ol < no; ++ol) {
        const std::uint16_t* from = src + ((o0 + ol) * ui + c0) * k;
        if (k == 1) {
          std::copy(from, from + (c1 - c0), scratch + ol * ipad + c0);
        } else {
          transpose_16(from, k, scratch + ol * ipad + c0, plane, c1 - c0, k);
        }
      }
      for (std::size_t ib = ib0; ib < ib1; ++ib) {
        for (std::size_t hw = 0; hw < k; ++hw) {
          const std::uint16_t* m = scratch + hw * plane + ib * ubi;  // [bo][bi], rows ipad apart
          std::uint16_t* out = dst + std::int64_t(ob) * s_ob + std::int64_t(ib) * s_ib +
                               std::int64_t(hw / std::size_t(kw)) * s_h +
                               std::int64_t(hw % std::size_t(kw)) * s_w;
          if (!pairs_over_o) {
            // words [bo][bi / 2] -> [bi / 2][bo]
            transpose_32(reinterpret_cast<const std::uint32_t*>(m), ipad / 2,
                         reinterpret_cast<std::uint32_t*>(out), ubo, ubo, ubi / 2);
            continue;
          }
          for (std::size_t r = 0; r < ubo; r += 2) {  // rows r and r + 1 interleaved
            const std::uint16_t *a = m + r * ipad, *b = a + ipad;
            std::uint16_t* w = out + r * ubi;
            std::size_t j = 0;
#if defined(__SSE2__)
            for (; j + 8 <= ubi; j += 8) {
              const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + j));
              const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j));
              _mm_storeu_si128(reinterpret_cast<__m128i*>(w + 2 * j), _mm_unpacklo_epi16(va, vb));
              _mm_storeu_si128(reinterpret_cast<__m128i*>(w + 2 * j + 8),
                               _mm_unpackhi_epi16(va, vb));
            }
#endif
            for (; j < ubi; ++j) {
              w[2 * j] = a[j];
              w[2 * j + 1] = b[j];
            }
          }
        }
      }
      blk += ib1 - ib0;
    }
  }
};

/// How precis moves a float weight gradient from oneDNN's ABcd16b16a layout ([O / 16]
/// [I / 16][KH][KW] blocks of [16 i][16 o] values, what its bfloat16 weight-gradient kernels
/// write) back to [O, I, KH, KW]: per block and input channel, one [KH KW][16 o] transpose.
/// Whole blocks only (O and I multiples of 16).
struct onednn_weight_unblocking {
  std::int64_t o, i, k;     // the weights' output and input channels; KH KW
  std::int64_t s_ob, s_ib;  // strides of the blocks, in elements

  /// The unblocking of a primitive's float weight layout, or nothing where it is another.
  static std::optional<onednn_weight_unblocking> of(const dnnl::memory::desc& prim) {
    const dnnl_memory_desc_t& d = prim.data;
    if (d.ndims != 4 || d.data_type != dnnl_f32 || d.format_kind != dnnl_blocked ||
        d.extra.flags != 0 || d.offset0 != 0 || d.dims[0] % 16 != 0 || d.dims[1] % 16 != 0) {
      return std::nullopt;
    }
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    if (b.inner_nblks != 2 || b.inner_idxs[0] != 1 || b.inner_idxs[1] != 0 ||
        b.inner_blks[0] != 16 || b.inner_blks[1] != 16 || b.strides[3] != 256 ||
        b.strides[2] != 256 * d.dims[3]) {
      return std::nullopt;
    }
    for (int j = 0; j < 4; ++j) {
      if (d.padded_dims[j] != d.dims[j] || d.padded_offsets[j] != 0) return std::nullopt;
    }
    return onednn_weight_unblocking{d.dims[0], d.dims[1], d.dims[2] * d.dims[3], b.strides[0],
                                    b.strides[1]};
  }

  /// dst [O, I, KH, KW] from src in the blocked layout.
  void unpack(const float* src, float* dst) const {
    const auto ld = std::size_t(i * k), uk = std::size_t(k);
    for (std::int64_t ob = 0; ob < o / 16; ++ob) {
      for (std::int64_t ib = 0; ib < i / 16; ++ib) {
        const float* block = src + ob * s_ob + ib * s_ib;  // [KH KW][16 i][16 o]
        float* to = dst + (std::size_t(ob) * 16 * ld + std::size_t(ib) * 16 * uk);
        for (std::size_t c = 0; c < 16; ++c) {  // dst[o][c][hw] = block[hw][c][o]
          transpose_32(reinterpret_cast<const std::uint32_t*>(block + c * 16), 256,
                       reinterpret_cast<std::uint32_t*>(to + c * uk), ld, uk, 16);
        }
      }
    }
  }
};

/// How an operand gets from precis's layout to the primitive's (and back, for an output):
/// not at all; precis's transposes between NCHW and NHWC images, or between either and
/// 16-channel blocks (nChw16c, oneDNN's aBcd16b: [N][C / 16][H][W][16], what its AVX-512
/// bfloat16 kernels take without AMX); precis's weight packing, or its unblocking of float
/// weight gradients; or oneDNN's reorder.
enum class onednn_move {
  same,
  to_nhwc,
  to_nchw,
  nchw_to_blocks,
  blocks_to_nchw,
  nhwc_to_blocks,
  blocks_to_nhwc,
  pack,
  unblock_weights,
  reorder
};

/// The 16 channels of one pixel in an nChw16c image: moved as one value.
struct channel_block16 {
  std::uint16_t v[16];
};

/// oneDNN's reorder of one block of output channels of a weight tensor, for layouts that
/// keep whole blocks of output channels apart (ABcd16b16a, ABcd8b16a2b, ...: the output
/// channels' blocks outermost), so that the context's threads can move the blocks of a
/// large tensor in parts: block j is at j * step bytes both in precis's [O, I, KH, KW] and
/// in the primitive's layout (no padding: the same values, the same size).
struct onednn_block_reorder {
  /// Weights smaller than this are moved by one reorder on one thread: waking the other
  /// threads would cost more than it saves.
  static constexpr std::size_t min_bytes = std::size_t(1) << 19;

  dnnl::reorder reorder;  ///< of one block of output channels; blocks 0: none
  dnnl::memory::desc user, prim;
  std::size_t blocks = 0, step = 0;

  /// The reorder of one block of `prim`'s output channels from plain `user` weights, where
  /// prim's layout keeps those blocks outermost and there are at least two.
  static onednn_block_reorder of(const dnnl::engine& engine, const dnnl::memory::desc& user,
                                 const dnnl::memory::desc& prim) {
    const dnnl_memory_desc_t& d = prim.data;
    if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.extra.flags != 0 || d.offset0 != 0) {
      return {};
    }
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    std::int64_t rows = 1, padded = 1;
    for (int j = 0; j < b.inner_nblks; ++j) {
      if (b.inner_idxs[j] == 0) rows *= b.inner_blks[j];
    }
    for (int j = 0; j < 4; ++j) {
      if (d.padded_dims[j] != d.dims[j] || d.padded_offsets[j] != 0) return {};
      padded *= d.padded_dims[j];
    }
    // The output channels' blocks outermost: one block's values are contiguous.
    if (rows < 2 || d.dims[0] % rows != 0 || d.dims[0] / rows < 2 ||
        b.strides[0] * (d.dims[0] / rows) != padded) {
      return {};
    }
    dnnl_memory_desc_t block = d;
    block.dims[0] = block.padded_dims[0] = rows;
    const dnnl::memory::desc block_prim(block);
    const dnnl::memory::dims ud{rows, d.dims[1], d.dims[2], d.dims[3]};
    const dnnl::memory::desc block_user(ud, user.data_type(), dnnl::memory::format_tag::oihw);
    onednn_block_reorder r;
    r.reorder =
        dnnl::reorder(dnnl::reorder::primitive_desc(engine, block_user, engine, block_prim));
    r.user = block_user;
    r.prim = block_prim;
    r.blocks = std::size_t(d.dims[0] / rows);
    r.step = block_prim.get_size();
    return r;
  }
};

/// One operand of a convolution primitive: precis's layout (NCHW, OIHW), the primitive's
/// (oneDNN's choice: blocked or channels-last where its fast kernels want them) and the
/// way between them when they differ (user -> primitive for inputs, back for outputs).
struct onednn_operand {
  dnnl::memory::desc user, prim;
  onednn_move move = onednn_move::same;
  dnnl::reorder reorder;            ///< for onednn_move::reorder
  onednn_block_reorder blocks{};    ///< for onednn_move::reorder of weights, where it applies
  onednn_weight_packing packing{};  ///< for onednn_move::pack
  onednn_weight_unblocking unblocking{};  ///< for onednn_move::unblock_weights
};

/// Moves operand o's values from `from` to `to` (precis's layout to the primitive's for an
/// input, back for an output) by the transpose, packing or reorder o was made with, on the
/// calling thread (the reorder on oneDNN's); o.move is not `same`. `scratch` holds a
/// packing's working values.
inline void onednn_move_operand(const onednn_operand& o, dnnl::stream& s, dnnl::memory from,
                                dnnl::memory to,  // memory objects are shared handles
                                scratch_bytes& scratch) {
  if (o.move == onednn_move::reorder) {
    o.reorder.execute(s, from, to);
    return;
  }
  if (o.move == onednn_move::pack) {
    const onednn_weight_packing& w = o.packing;
    w.pack(static_cast<const std::uint16_t*>(from.get_data_handle()),
           static_cast<std::uint16_t*>(to.get_data_handle()), 0, w.blocks(),
           static_cast<std::uint16_t*>(scratch.get(w.scratch_values() * 2)));
    return;
  }
  if (o.move == onednn_move::unblock_weights) {
    o.unblocking.unpack(static_cast<const float*>(from.get_data_handle()),
                        static_cast<float*>(to.get_data_handle()));
    return;
  }
  const dnnl::memory::dims d = o.user.dims();  // N, C, H, W
  const auto images = std::size_t(d[0]), channels = std::size_t(d[1]);
  const auto pixels = std::size_t(d[2] * d[3]), blocks = channels / 16;
  const auto* src = static_cast<const std::uint16_t*>(from.get_data_handle());
  auto* dst = static_cast<std::uint16_t*>(to.get_data_handle());
  const auto* src_blocks = static_cast<const channel_block16*>(from.get_data_handle());
  auto* dst_blocks = static_cast<channel_block16*>(to.get_data_handle());
  switch (o.move) {
    case onednn_move::to_nhwc: transpose_images(src, dst, images, channels, pixels); break;
    case onednn_move::to_nchw: transpose_images(src, dst, images, pixels, channels); break;
    // A block of 16 channels of an NCHW image is [16][pixels]; in nChw16c [pixels][16].
    case onednn_move::nchw_to_blocks:
      transpose_images(src, dst, images * blocks, 16, pixels);
      break;
    case onednn_move::blocks_to_nchw:
      transpose_images(src, dst, images * blocks, pixels, 16);
      break;
    // An NHWC image is [pixels][blocks] of 16-channel blocks; nChw16c [blocks][pixels].
    case onednn_move::nhwc_to_blocks:
      transpose_images(src_blocks, dst_blocks, images, pixels, blocks);
      break;
    case onednn_move::blocks_to_nhwc:
      transpose_images(src_blocks, dst_blocks, images, blocks, pixels);
      break;
    default: throw error("precis: internal error: unknown oneDNN operand move");
  }
}

struct onednn_conv_entry {
  dnnl::primitive primitive;
  onednn_operand in0, in1, out;  // forward: x, w, y; data: dy, w, dx; weights: x, dy, dw
  dnnl::memory::desc bias, scratchpad;
  std::string implementation;
};

struct onednn_state {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex m;  // guards the maps and the list of parts
  std::map<onednn_matmul_key, onednn_matmul_entry> matmuls;
  std::map<onednn_conv_key, onednn_conv_entry> convs;
  std::vector<std::unique_ptr<onednn_part>> parts;
  /// A convolution's weights in its primitive's layout, or an AMX product's packed B.
  scratch_bytes shared_packed;
  /// Held by a convolution or an AMX product while its parts read shared_packed or kept
  /// weights: kernels called concurrently on one context are serialised there.
  std::mutex shared_use;

  /// A convolution's weights kept in its primitive's layout between calls, for a caller
  /// that names their contents (conv2d_params::weights_version): moved again only when
  /// the version differs. `version` is 0 while no complete move is held.
  struct kept_weights {
    const void* source = nullptr;
    dnnl::memory::desc layout;
    std::size_t bytes = 0;
    std::uint64_t version = 0;
    std::uint64_t last_use = 0;
    scratch_bytes values;
  };
  /// At most this many weight tensors are kept (a model's convolutions)...
  static constexpr std::size_t kept_limit = 256;
  /// ... holding at most this many bytes (a bfloat16 ResNet-50's weights take 50 MB); beyond
  /// either the least recently used are given up, their memory freed. Weights of a freed
  /// tensor are never used again (a new tensor at the same address has a new version) and
  /// go that way.
  std::size_t kept_bytes_limit = std::size_t(512) << 20;
  std::vector<std::unique_ptr<kept_weights>> kept;  // under shared_use
  std::uint64_t kept_uses = 0;                      // under shared_use
  /// Calls that found their weights kept (under shared_use; what tests count).
  std::size_t kept_reuses = 0;

  /// The kept weights of `source` in `layout`, made on first use (with version 0). Call
  /// under shared_use; the entry stays valid until the next call.
  kept_weights& keep(const void* source, const dnnl::memory::desc& layout) {
    auto it = std::find_if(kept.begin(), kept.end(), [&](const auto& k) {
      return k->source == source && k->layout == layout;
    });
    if (it == kept.end()) {
      auto k = std::make_unique<kept_weights>();
      k->source = source;
      k->layout = layout;
      k->bytes = layout.get_size();
      kept.push_back(std::move(k));
      it = std::prev(kept.end());
    }
    kept_weights* const found = it->get();
    found->last_use = ++kept_uses;
    std::size_t bytes = 0;
    for (const auto& k : kept) bytes += k->bytes;
    // Give up the least recently used but this call's own, which it needs whatever its size.
    while (kept.size() > 1 && (kept.size() > kept_limit || bytes > kept_bytes_limit)) {
      const auto oldest =
          std::min_element(kept.begin(), kept.end(), [&](const auto& a, const auto& b) {
            return a.get() != found && (b.get() == found || a->last_use < b->last_use);
          });
      bytes -= (*oldest)->bytes;
      kept.erase(oldest);
    }
    return *found;
  }

  /// The cached primitive for `key`, made on first use.
  // Primitives are made on as many OpenMP threads as they will run on: oneDNN fixes a
  // primitive's thread count when it makes it, whatever the count is when it runs.

  /// The cached primitive for `key`, made on first use (for one thread: every part of a
  /// product is a single-threaded call).
  const onednn_matmul_entry& matmul(const onednn_matmul_key& key) {
    const std::lock_guard lock(m);
    if (auto it = matmuls.find(key); it != matmuls.end()) return it->second;
    onednn_matmul_entry e;
    omp_threads::instance().with(1, [&] { e = make_matmul(key); });
    return matmuls.emplace(key, std::move(e)).first->second;
  }

  onednn_matmul_entry make_matmul(const onednn_matmul_key& key) const {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    const bool batched = key.batch > 1;
    const auto dims = [&](std::int64_t r, std::int64_t c) {
      return batched ? dnnl::memory::dims{key.batch, r, c} : dnnl::memory::dims{r, c};
    };
    const auto strides = [&](std::int64_t sb, std::int64_t sr, std::int64_t sc) {
      return batched ? dnnl::memory::dims{sb, sr, sc} : dnnl::memory::dims{sr, sc};
    };
    onednn_matmul_entry e;
    e.a = md(dims(key.m, key.k), dt(key.in_type), strides(key.a_batch, key.a_row, key.a_col));
    e.b = md(dims(key.k, key.n), dt(key.in_type), strides(key.b_batch, key.b_row, key.b_col));
    e.c = md(dims(key.m, key.n), dt(key.c_type), strides(key.c_batch, key.c_row, 1));
    if (key.bias_type != 0) {
      e.bias = md(batched ? dnnl::memory::dims{1, 1, key.n} : dnnl::memory::dims{1, key.n},
                  dt(key.bias_type),
                  batched ? dnnl::memory::dims{key.n, key.n, 1} : dnnl::memory::dims{key.n, 1});
    }
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0F) attr.set_output_scales(0, {key.alpha});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.bias, e.c), attr, engine);
    e.scratchpad = pd.scratchpad_desc();
    e.implementation = pd.impl_info_str();
    e.primitive = dnnl::matmul(pd);
    return e;
  }

  /// The cached convolution primitive for `key`, with its operands' layouts, made on first
  /// use.
  const onednn_conv_entry& conv(const onednn_conv_key& k) {
    const std::lock_guard lock(m);
    if (auto it = convs.find(k); it != convs.end()) return it->second;
    onednn_conv_entry e;
    omp_threads::instance().with(int(k.threads), [&] { e = make_conv(k); });
    return convs.emplace(k, std::move(e)).first->second;
  }

  onednn_conv_entry make_conv(const onednn_conv_key& k) const {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims xd{k.n, k.c, k.h, k.w}, yd{k.n, k.co, k.ho, k.wo};
    const dnnl::memory::dims wd =
        k.groups > 1 ? dnnl::memory::dims{k.groups, k.co / k.groups, k.c / k.groups, k.kh, k.kw}
                     : dnnl::memory::dims{k.co, k.c, k.kh, k.kw};
    const tag wtag = k.groups > 1 ? tag::goihw : tag::oihw;
    const dnnl::memory::dims strides{k.stride_y, k.stride_x}, dil{k.dilate_y, k.dilate_x};
    const dnnl::memory::dims pl{k.pad_t, k.pad_l}, pr{k.pad_b, k.pad_r};
    const dt in = dt(k.in_type), out = dt(k.out_type);
    const bool fwd = k.kind == onednn_conv_kind::forward;
    const bool bwd_w = k.kind == onednn_conv_kind::backward_weights;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const md bias_md = fwd && k.bias ? md({k.co}, dt::f32, tag::x) : md();
    const md x_any(xd, fwd || bwd_w ? in : out, tag::any);
    const md y_any(yd, fwd ? out : in, tag::any);
    const md w_any(wd, bwd_w ? dt::f32 : in, tag::any);
    const dnnl::convolution_forward::primitive_desc fwd_pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, md(xd, in, tag::any),
                                        md(wd, in, tag::any), bias_md,
                                        md(yd, fwd ? out : in, tag::any), strides, dil, pl, pr),
        attr, engine);
    onednn_conv_entry e;
    const auto operand = [&](const md& user, const md& prim, bool input) {
      onednn_operand o{user, prim, onednn_move::same, {}};
      if (user == prim) return o;
      const dnnl::memory::dims d = user.dims();
      // bfloat16 images, NCHW in precis and NHWC (acdb) in the primitive: precis's transpose.
      if (d.size() == 4 && user.data_type() == dt::bf16 && prim.data_type() == dt::bf16 &&
          user == md(d, dt::bf16, tag::nchw) && prim == md(d, dt::bf16, tag::nhwc)) {
        o.move = input ? onednn_move::to_nhwc : onednn_move::to_nchw;
        return o;
      }
      // bfloat16 images, NCHW or NHWC in precis and in 16-channel blocks in the primitive
      // (oneDNN's AVX-512 bfloat16 kernels without AMX), whole blocks only: precis's
      // transposes, several times faster than oneDNN 2.6's reorder for these layouts.
      if (d.size() == 4 && user.data_type() == dt::bf16 && d[1] % 16 == 0 &&
          prim == md(d, dt::bf16, tag::aBcd16b)) {
        if (user == md(d, dt::bf16, tag::nchw)) {
          o.move = input ? onednn_move::nchw_to_blocks : onednn_move::blocks_to_nchw;
          return o;
        }
        if (user == md(d, dt::bf16, tag::nhwc)) {
          o.move = input ? onednn_move::nhwc_to_blocks : onednn_move::blocks_to_nhwc;
          return o;
        }
      }
      // bfloat16 weights into a pair-interleaved blocked layout: precis's packing where
      // oneDNN runs its AMX kernels (their layouts, AcdB16b32a2b and ABcd16a16b2a, precis
      // packs faster than oneDNN 2.6's reorder: 512 x 512 x 3x3, 0.52 / 0.49 ms against
      // 0.71 / 0.53 on a Sapphire Rapids core). For the AVX512-BF16 kernels' layouts
      // (ABcd8b16a2b, ABcd8a16b2a) the reorder is the faster: 0.39-0.52 ms against
      // 0.71-0.95 on an EPYC core, and not slower than precis's packing split over two
      // threads. bench/results/README.md has both measurements.
      if (input && d.size() == 4 && user == md(d, dt::bf16, tag::oihw) &&
          onednn_isa() == dnnl::cpu_isa::avx512_core_amx) {
        if (const auto packing = onednn_weight_packing::of(prim)) {
          o.move = onednn_move::pack;
          o.packing = *packing;
          return o;
        }
      }
      // A float weight gradient out of 16 x 16 blocks: precis's transposes.
      if (!input && d.size() == 4 && user == md(d, dt::f32, tag::oihw)) {
        if (const auto unblocking = onednn_weight_unblocking::of(prim)) {
          o.move = onednn_move::unblock_weights;
          o.unblocking = *unblocking;
          return o;
        }
      }
      o.move = onednn_move::reorder;
      o.reorder = input ? dnnl::reorder(dnnl::reorder::primitive_desc(engine, user, engine, prim))
                        : dnnl::reorder(dnnl::reorder::primitive_desc(engine, prim, engine, user));
      // Large weights: also the reorder of one block of output channels, so that the
      // context's threads can share the move (onednn_conv).
      if (input && d.size() == 4 && user == md(d, user.data_type(), tag::oihw) &&
          prim.get_size() >= onednn_block_reorder::min_bytes) {
        o.blocks = onednn_block_reorder::of(engine, user, prim);
      }
      return o;
    };
    const tag itag = k.channels_last ? tag::nhwc : tag::nchw;  // precis's images
    const md x_user(xd, in, itag), y_user(yd, in, itag);
    const md w_user(wd, in, wtag);
    if (fwd) {
      e.in0 = operand(x_user, fwd_pd.src_desc(), true);
      e.in1 = operand(w_user, fwd_pd.weights_desc(), true);
      e.out = operand(md(yd, out, itag), fwd_pd.dst_desc(), false);
      e.bias = bias_md;
      e.scratchpad = fwd_pd.scratchpad_desc();
      e.implementation = fwd_pd.impl_info_str();
      e.primitive = dnnl::convolution_forward(fwd_pd);
    } else if (!bwd_w) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, x_any, w_any,
                                                y_any, strides, dil, pl, pr),
          attr, engine, fwd_pd);
      e.in0 = operand(y_user, pd.diff_dst_desc(), true);
      e.in1 = operand(w_user, pd.weights_desc(), true);
      e.out = operand(md(xd, out, itag), pd.diff_src_desc(), false);
      e.scratchpad = pd.scratchpad_desc();
      e.implementation = pd.impl_info_str();
      e.primitive = dnnl::convolution_backward_data(pd);
    } else {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, x_any,
                                                   w_any, y_any, strides, dil, pl, pr),
          attr, engine, fwd_pd);
      e.in0 = operand(x_user, pd.src_desc(), true);
      e.in1 = operand(y_user, pd.diff_dst_desc(), true);
      e.out = operand(md(wd, dt::f32, wtag), pd.diff_weights_desc(), false);
      e.scratchpad = pd.scratchpad_desc();
      e.implementation = pd.impl_info_str();
      e.primitive = dnnl::convolution_backward_weights(pd);
    }
    return e;
  }

  /// Part p's stream and scratch, made on first use.
  onednn_part& part(std::size_t p) {
    const std::lock_guard lock(m);
    while (parts.size() <= p) parts.push_back(std::make_unique<onednn_part>());
    onednn_part& q = *parts[p];
    if (!q.stream) q.stream = std::make_unique<dnnl::stream>(engine);
    return q;
  }
};

/// The oneDNN state of a context, made on first use.
inline onednn_state& onednn_of(const cpu_context& ctx) {
  engine_slot* slot = ctx.engines.get();
  if (slot == nullptr) throw error("precis: a cpu_context without engine state (moved from?)");
  std::call_once(slot->started, [&] { slot->onednn = std::make_shared<onednn_state>(); });
  return *slot->onednn;
}

/// Packs src into dst with `w`, the blocks split over the context's threads, each part
/// with its own scratch.
inline void onednn_pack_shared(const cpu_context& ctx, onednn_state& st,
                               const onednn_weight_packing& w, const std::uint16_t* src,
                               std::uint16_t* dst) {
  const std::size_t blocks = w.blocks();
  const std::size_t movers = std::min<std::size_t>(ctx.thread_count(), blocks);
  const std::size_t per = (blocks + movers - 1) / movers;
  parallel_for(ctx, movers, 1, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t p = p0; p < p1; ++p) {
      onednn_part& part = st.part(p);
      const std::lock_guard lock(part.busy);
      w.pack(src, dst, std::min(blocks, p * per), std::min(blocks, (p + 1) * per),
             static_cast<std::uint16_t*>(part.packing.get(w.scratch_values() * 2)));
    }
  });
}

template <class T>
constexpr int onednn_type() {
  if constexpr (std::is_same_v<T, float>) {
    return int(dnnl::memory::data_type::f32);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return int(dnnl::memory::data_type::bf16);
  } else {
    return 0;
  }
}

/// True when oneDNN can write type T (a product's output or bias) directly.
template <class T>
inline constexpr bool onednn_io_type_v = onednn_type<T>() != 0;

/// One strided operand of a product: element (b, r, c) at p[b * batch + r * row + c * col].
template <class T>
struct strided_operand {
  T* p;
  std::int64_t batch, row, col;
};

/// True when oneDNN runs products of TIn inputs on this CPU with more than its reference
/// code: bfloat16 needs the dot-product instructions; float runs on every x86-64 CPU, and
/// float16 on oneDNN's float kernels (see onednn_float_operand).
template <class TIn>
inline bool onednn_has_products() {
  if constexpr (std::is_same_v<TIn, bfloat16>) {
    return onednn_has_bf16_products();
  } else {
    static_assert(std::is_same_v<TIn, float> || std::is_same_v<TIn, float16>,
                  "precis: oneDNN products take bfloat16, float16 or float inputs");
    return true;
  }
}

/// A float16 product operand (batch items of rows x cols, see strided_operand) as float, in
/// a buffer of the context's, converted on its threads: contiguous along whichever of its
/// rows or columns is (a transposed operand stays transposed), or row by row where neither
/// is; one batch item where the operand's batch stride is 0 (one matrix for every item).
/// float16 inputs of products and convolutions run on oneDNN's float kernels so: every
/// float16 value is a float exactly, and so is the product of two (at most 22 significant
/// bits, and at least 2^-48, inside float's normal range), so converting them first gives
/// float16 inputs the float path's semantics (products::hardware with float inputs: products
/// fused into float sums, subnormals kept, oneDNN's order). Convolutions convert theirs with
/// conv.hpp's to_float.
class onednn_float_operand {
 public:
  onednn_float_operand(const cpu_context& ctx, strided_operand<const float16> o, std::size_t batch,
                       std::size_t rows, std::size_t cols)
      : buf_(ctx, (o.batch == 0 ? 1 : batch) * rows * cols) {
    const std::size_t items = o.batch == 0 ? 1 : batch, size = rows * cols;
    const bool by_columns = o.col != 1 && o.row == 1;
    // Runs of `inner` values contiguous in the copy: rows, or columns where by_columns.
    const std::size_t inner = by_columns ? rows : cols, outer = by_columns ? cols : rows;
    const std::int64_t step = by_columns ? o.row : o.col, run = by_columns ? o.col : o.row;
    float* dst = buf_.get();
    parallel_for(ctx, items * outer, std::max<std::size_t>(1, elements_per_thread / (inner + 1)),
                 [&](std::size_t r0, std::size_t r1) {
                   for (std::size_t r = r0; r < r1; ++r) {
                     const std::size_t item = r / outer, i = r % outer;
                     const float16* s = o.p + std::int64_t(item) * o.batch + std::int64_t(i) * run;
                     float* d = dst + item * size + i * inner;
                     if (step == 1) {
                       load_block(s, d, inner);
                     } else {
                       for (std::size_t j = 0; j < inner; ++j)
                         d[j] = float(s[std::int64_t(j) * step]);
                     }
                   }
                 });
    op_ = {dst, o.batch == 0 ? 0 : std::int64_t(size), by_columns ? 1 : std::int64_t(cols),
           by_columns ? std::int64_t(rows) : 1};
  }
  strided_operand<const float> operand() const { return op_; }

 private:
  float_buffer buf_;
  strided_operand<const float> op_{};
};

/// Rows of A an AMX product's part packs at once (amx_product): about 1 MiB of packed A,
/// which stays in the L2 cache while the panels of B pass over it.
inline std::size_t amx_row_block(const amx_layout& l) {
  return std::clamp<std::size_t>((std::size_t(1) << 19) / l.lda / 32 * 32, 32, 256);
}

/// The range of k an AMX product sums for one column block before moving on to the next
/// rows (amx_product): B's two panels for 256 values of k are 16 KiB, which stay in L1.
inline constexpr std::size_t amx_k_block = 256;

/// Whether a bfloat16 product of these sizes (per batch item) takes precis's AMX kernel
/// rather than oneDNN's: at least 256 rows, columns and terms, and B of at least 2^20
/// values, 2^21 where B is transposed (oneDNN 2.6's fastest layout). That is where it
/// measured faster than oneDNN 2.6 on a Sapphire Rapids core with bfloat16 output: 1.10-1.28x
/// at 1024 x 1024 x 1024 and 1.72-1.75x at 2048 (bench_gemm); in a throwaway comparison
/// of the layouts, 1.8x at 1024 with A transposed, 1.0x at 1024 and 1.2x at 2048 with B
/// transposed. On smaller products, and on products of few terms, its float-to-bfloat16
/// pass over each 32 x 32 block and its packing are not hidden behind the tiles' sums, and
/// oneDNN's whole product was faster in the same comparison (512: 0.85x; 6272 x 64 x 64
/// and 6272 x 64 x 256: 0.6x and 0.85x).
inline bool amx_takes(std::size_t M, std::size_t N, std::size_t K, bool b_transposed) {
  const std::size_t b_values = std::size_t(1) << (b_transposed ? 21 : 20);
  return M >= 256 && N >= 256 && K >= 256 && N * K >= b_values;
}

/// precis's AMX product (amx.hpp) for every batch item: the float sums of A B handed to
/// write(item, first row, rows, first column, values, count) in blocks of up to 32 columns,
/// row r's `count` values at values + 32 r. Batch items
/// are split over the context's threads when there are at least as many as threads (each
/// part packs its own B); otherwise B is packed once, its panels split over the threads,
/// and the product's 32-row or 32-column blocks, whichever are more, are split. Every
/// element is the same chain of tile steps however it is split. False, having written
/// nothing, where AMX is not enabled (amx_enabled()). Any sizes: onednn_product
/// calls it where amx_takes says.
template <class Write>
bool amx_product(const cpu_context& ctx, onednn_state& st, std::size_t batch, std::size_t M,
                 std::size_t N, std::size_t K, strided_operand<const bfloat16> a,
                 strided_operand<const bfloat16> b, Write&& write) {
  if (!amx_enabled()) return false;
  const amx_layout l = amx_layout::of(N, K);
  const std::size_t block = amx_row_block(l), columns = l.np / 32;
  const std::size_t threads = ctx.thread_count();
  const auto a_of = [&](std::size_t item) {
    return reinterpret_cast<const std::uint16_t*>(a.p + std::int64_t(item) * a.batch);
  };
  const auto b_of = [&](std::size_t item) {
    return reinterpret_cast<const std::uint16_t*>(b.p + std::int64_t(item) * b.batch);
  };
  // Rows [i0, i1) and 32-column blocks [q0, q1) of one item, B packed at bp. A is read in
  // place where its rows are whole tiles on cache-line boundaries, and not 4 KiB apart
  // (16 rows in one L1 set); otherwise, and for a last block of fewer than 32 rows, rows
  // are copied to the part's scratch first.
  const bool in_place = a.col == 1 && K % 32 == 0 && (a.row * 2) % 64 == 0 &&
                        (a.row * 2) % 4096 != 0 && (a.batch * 2) % 64 == 0 &&
                        reinterpret_cast<std::uintptr_t>(a.p) % 64 == 0;
  const auto run = [&](onednn_part& part, std::size_t item, const std::uint16_t* bp, std::size_t i0,
                       std::size_t i1, std::size_t q0, std::size_t q1) {
    const std::size_t rows = amx_layout::rows(block);
    auto* ap = static_cast<std::uint16_t*>(part.in0.get(rows * l.lda * 2));
    // The blocks' partial sums between ranges of k, then the finished block.
    auto* sums = static_cast<float*>(part.results.get((rows + 32) * 32 * sizeof(float)));
    float* out = sums + rows * 32;
    amx_begin();
    for (std::size_t r0 = i0; r0 < i1; r0 += block) {
      const std::size_t m = std::min(block, i1 - r0);
      const std::size_t whole = in_place ? m / 32 * 32 : 0;  // rows read in place
      if (whole < m) {
        amx_pack_a(a_of(item) + std::int64_t(r0 + whole) * a.row, a.row, a.col, m - whole, l, ap);
      }
      for (std::size_t q = q0; q < q1; ++q) {
        const std::uint16_t* b0 = bp + 2 * q * l.panel_values();
        const std::uint16_t* b1 = b0 + l.panel_values();
        const std::size_t j0 = 32 * q, n = std::min<std::size_t>(32, N - j0);
        // k in ranges of amx_k_block: B's panels for one range stay in L1 while the
        // block's rows pass over them.
        for (std::size_t k0 = 0; k0 < l.kp; k0 += amx_k_block) {
          const std::size_t k1 = std::min(l.kp, k0 + amx_k_block);
          for (std::size_t ir = 0; ir < m; ir += 32) {
            float* partial = sums + ir * 32;
            float* to = k1 == l.kp ? out : partial;
            if (ir < whole) {
              amx_block(a_of(item) + std::int64_t(r0 + ir) * a.row, std::size_t(a.row), b0, b1, k0,
                        k1, k0 == 0 ? nullptr : partial, to);
            } else {
              amx_block(ap + (ir - whole) * l.lda, l.lda, b0, b1, k0, k1,
                        k0 == 0 ? nullptr : partial, to);
            }
            if (k1 == l.kp) write(item, r0 + ir, std::min<std::size_t>(32, m - ir), j0, out, n);
          }
        }
      }
    }
    amx_end();
  };

  if (batch >= threads && batch > 1) {
    const std::size_t per = (batch + threads - 1) / threads, parts = (batch + per - 1) / per;
    parallel_for(ctx, parts, 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) {
        onednn_part& part = st.part(p);
        const std::lock_guard lock(part.busy);
        auto* bp = static_cast<std::uint16_t*>(part.in1.get(l.panels() * l.panel_values() * 2));
        for (std::size_t item = p * per; item < std::min(batch, (p + 1) * per); ++item) {
          amx_pack_b(b_of(item), b.row, b.col, l, 0, l.panels(), bp);
          run(part, item, bp, 0, M, 0, columns);
        }
      }
    });
    return true;
  }

  const std::size_t row_blocks = (M + 31) / 32;
  const bool split_rows = row_blocks >= columns;
  const std::size_t extent = split_rows ? row_blocks : columns;
  const std::size_t by_size = std::max<std::size_t>(1, M * N * K / (std::size_t(1) << 18));
  const std::size_t parts = std::max<std::size_t>(1, std::min({threads, extent, by_size}));
  const std::size_t chunk = (extent + parts - 1) / parts, used = (extent + chunk - 1) / chunk;
  const std::size_t pack_per = (columns + used - 1) / used;  // 32-column blocks per packer
  const std::lock_guard use(st.shared_use);
  auto* bp = static_cast<std::uint16_t*>(st.shared_packed.get(l.panels() * l.panel_values() * 2));
  for (std::size_t item = 0; item < batch; ++item) {
    parallel_for(ctx, used, 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) {
        amx_pack_b(b_of(item), b.row, b.col, l, 2 * std::min(columns, p * pack_per),
                   2 * std::min(columns, (p + 1) * pack_per), bp);
      }
    });
    parallel_for(ctx, used, 1, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p) {
        onednn_part& part = st.part(p);
        const std::lock_guard lock(part.busy);
        const std::size_t begin = p * chunk, end = std::min(extent, begin + chunk);
        if (split_rows) {
          run(part, item, bp, 32 * begin, std::min(M, 32 * end), 0, columns);
        } else {
          run(part, item, bp, 0, M, begin, end);
        }
      }
    });
  }
  return true;
}

/// Rows of an AMX product's block written straight to C (row r at out + r * ldc): out[j] =
/// v[j] (+ bias[j]) for j < n, row r's v at v + 32 r, rounded once to TC as store_block
/// rounds (map_store: bfloat16 in registers, by precis::convert's routine), the same values
/// as gemm_writer with alpha 1 and no epilogue.
template <class TC, class TBias>
void amx_store_rows(const float* v, std::size_t rows, std::size_t n, const TBias* bias, TC* out,
                    std::int64_t ldc) {
  alignas(64) float b[32];
  if (bias != nullptr) load_block(bias, b, n);
  for (std::size_t r = 0; r < rows; ++r, v += 32, out += ldc) {
    if (bias == nullptr) {
      map_store(
          out, n, [](vmath::vf x) { return x; }, v);
    } else {
      map_store(
          out, n, [](vmath::vf x, vmath::vf c) { return x + c; }, v, static_cast<const float*>(b));
    }
  }
}

/// Runs a product of bfloat16 or float operands (TIn; float16 ones take the overload below)
/// through oneDNN: for every batch item,
/// C = alpha A B (+ bias), all float sums, written straight to C when `direct` (C and the
/// bias of types oneDNN writes, nothing else to apply; alpha, oneDNN's output scale, only
/// without a bias, whose order with the scale oneDNN does not promise), else as float rows
/// of A B handed to finish(item, row, first column, values, count) for precis's epilogue
/// (which applies alpha). False, having written nothing, when the CPU has no dot-product
/// instructions for TIn or oneDNN offers only its reference implementation for this layout
/// (then the exact kernel is faster). bfloat16 products that amx_takes run on precis's AMX
/// kernel instead where the CPU has it (amx_product): written straight to C where oneDNN
/// would have written it (alpha 1), through finish otherwise.
template <class TIn, class TC, class TBias, class Finish>
bool onednn_product(const cpu_context& ctx, std::size_t batch, std::size_t M, std::size_t N,
                    std::size_t K, strided_operand<const TIn> a, strided_operand<const TIn> b,
                    TC* c, std::int64_t c_batch, std::int64_t ldc, const TBias* bias, float alpha,
                    bool direct, Finish&& finish) {
  if (!onednn_has_products<TIn>() || K == 0) return false;  // K == 0: the exact kernel's zeros
  if (batch == 0 || M == 0 || N == 0) return true;
  onednn_state& st = onednn_of(ctx);
  direct = direct && onednn_io_type_v<TC> && (bias == nullptr || onednn_io_type_v<TBias>) &&
           (alpha == 1.0F || bias == nullptr);
  if constexpr (std::is_same_v<TIn, bfloat16>) {
    if (amx_takes(M, N, K, b.row == 1) && amx_enabled()) {
      if constexpr (onednn_io_type_v<TC> && onednn_io_type_v<TBias>) {
        if (direct && alpha == 1.0F) {
          const auto store = [&](std::size_t item, std::size_t i0, std::size_t rows, std::size_t j0,
                                 const float* v, std::size_t n) {
            amx_store_rows(v, rows, n, bias == nullptr ? nullptr : bias + j0,
                           c + std::int64_t(item) * c_batch + std::int64_t(i0) * ldc + j0, ldc);
          };
          return amx_product(ctx, st, batch, M, N, K, a, b, store);
        }
      }
      const auto rows = [&](std::size_t item, std::size_t i0, std::size_t count, std::size_t j0,
                            const float* v, std::size_t n) {
        for (std::size_t r = 0; r < count; ++r) finish(item, i0 + r, j0, v + 32 * r, n);
      };
      return amx_product(ctx, st, batch, M, N, K, a, b, rows);
    }
  }

  // Parts: batch items when there are enough, else rows or columns, whichever is longer.
  const std::size_t work = batch * M * N * std::max<std::size_t>(K, 1);
  const std::size_t by_size = std::max<std::size_t>(1, work / (std::size_t(1) << 18));
  const bool split_batch = batch >= ctx.thread_count();
  const bool split_rows = M >= N;
  const std::size_t extent = split_batch ? batch : split_rows ? M : N;
  const std::size_t parts =
      std::max<std::size_t>(1, std::min({std::size_t(ctx.thread_count()), by_size, extent}));
  const std::size_t chunk = (extent + parts - 1) / parts;
  const std::size_t used = (extent + chunk - 1) / chunk;  // parts with something to do

  // The primitive for a part's sizes; every part but the last has the same ones.
  const auto key_for = [&](std::size_t len) {
    const std::size_t nb = split_batch ? len : batch;
    const std::size_t m = !split_batch && split_rows ? len : M;
    const std::size_t n = !split_batch && !split_rows ? len : N;
    return onednn_matmul_key{std::int64_t(nb),
                             std::int64_t(m),
                             std::int64_t(n),
                             std::int64_t(K),
                             a.batch,
                             a.row,
                             a.col,
                             b.batch,
                             b.row,
                             b.col,
                             direct ? c_batch : std::int64_t(m * n),
                             direct ? ldc : std::int64_t(n),
                             onednn_type<TIn>(),
                             direct ? onednn_type<TC>() : onednn_type<float>(),
                             bias == nullptr ? 0
                             : direct        ? onednn_type<TBias>()
                                             : 0,
                             direct ? alpha : 1.0F};
  };
  const auto reference = [](const onednn_matmul_entry& e) {
    return e.implementation.rfind("ref", 0) == 0;
  };
  const onednn_matmul_entry* first_entry = &st.matmul(key_for(std::min(chunk, extent)));
  if (reference(*first_entry) && direct && alpha != 1.0F) {
    direct = false;  // where oneDNN has no fast kernel with an output scale, precis applies it
    first_entry = &st.matmul(key_for(std::min(chunk, extent)));
  }
  const onednn_matmul_entry& first = *first_entry;
  if (reference(first)) return false;
  const std::size_t tail = extent - (used - 1) * chunk;
  const onednn_matmul_entry& last = tail == chunk ? first : st.matmul(key_for(tail));
  if (reference(last)) return false;

  parallel_for(ctx, used, 1, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t begin = p * chunk, len = std::min(chunk, extent - begin);
      const onednn_matmul_entry& e = len == chunk ? first : last;
      onednn_part& part = st.part(p);
      const std::lock_guard lock(part.busy);
      const std::int64_t b0 = split_batch ? std::int64_t(begin) : 0;
      const std::int64_t i0 = !split_batch && split_rows ? std::int64_t(begin) : 0;
      const std::int64_t j0 = !split_batch && !split_rows ? std::int64_t(begin) : 0;
      const auto* pa = a.p + b0 * a.batch + i0 * a.row;
      const auto* pb = b.p + b0 * b.batch + j0 * b.col;
      void* pc = direct ? static_cast<void*>(c + b0 * c_batch + i0 * ldc + j0)
                        : part.results.get(e.c.get_size());
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, dnnl::memory(e.a, st.engine, const_cast<TIn*>(pa))},
          {DNNL_ARG_WEIGHTS, dnnl::memory(e.b, st.engine, const_cast<TIn*>(pb))},
          {DNNL_ARG_DST, dnnl::memory(e.c, st.engine, pc)},
          {DNNL_ARG_SCRATCHPAD,
           dnnl::memory(e.scratchpad, st.engine, part.scratchpad.get(e.scratchpad.get_size()))}};
      if (direct && bias != nullptr) {
        args.emplace(DNNL_ARG_BIAS,
                     dnnl::memory(e.bias, st.engine, const_cast<TBias*>(bias + j0)));
      }
      omp_threads::instance().with(1, [&] {
        e.primitive.execute(*part.stream, args);
        part.stream->wait();
      });
      if (!direct) {
        const auto* values = static_cast<const float*>(pc);
        const std::size_t nb = split_batch ? len : batch;
        const std::size_t m = !split_batch && split_rows ? len : M;
        const std::size_t n = !split_batch && !split_rows ? len : N;
        for (std::size_t item = 0; item < nb; ++item) {
          for (std::size_t i = 0; i < m; ++i) {
            finish(std::size_t(b0) + item, std::size_t(i0) + i, std::size_t(j0),
                   values + (item * m + i) * n, n);
          }
        }
      }
    }
  });
  return true;
}

/// onednn_product with float16 operands: both converted to float (onednn_float_operand),
/// then the float product.
template <class TC, class TBias, class Finish>
bool onednn_product(const cpu_context& ctx, std::size_t batch, std::size_t M, std::size_t N,
                    std::size_t K, strided_operand<const float16> a,
                    strided_operand<const float16> b, TC* c, std::int64_t c_batch, std::int64_t ldc,
                    const TBias* bias, float alpha, bool direct, Finish&& finish) {
  if (K == 0) return false;  // the exact kernel's zeros
  if (batch == 0 || M == 0 || N == 0) return true;
  const onednn_float_operand fa(ctx, a, batch, M, K), fb(ctx, b, batch, K, N);
  return onednn_product(ctx, batch, M, N, K, fa.operand(), fb.operand(), c, c_batch, ldc, bias,
                        alpha, direct, finish);
}

/// An input operand in its primitive's layout: `user` itself, or its values moved into
/// `buf` (on the calling thread, or oneDNN's for a reorder).
inline dnnl::memory onednn_input(onednn_state& st, onednn_part& part, const onednn_operand& o,
                                 const void* user, scratch_bytes& buf) {
  dnnl::memory u(o.user, st.engine, const_cast<void*>(user));
  if (o.move == onednn_move::same) return u;
  dnnl::memory m(o.prim, st.engine, buf.get(o.prim.get_size()));
  onednn_move_operand(o, *part.stream, u, m, part.packing);
  return m;
}

/// Runs entry e's primitive of the given kind on part's stream: in0 and in1 in the
/// primitive's layouts (forward x, w; backward data dy, w; backward weights x, dy), the
/// output moved from the primitive's layout to `user_out` in precis's. Waits for it.
inline void onednn_execute(onednn_state& st, onednn_part& part, const onednn_conv_entry& e,
                           onednn_conv_kind kind, const dnnl::memory& a, const dnnl::memory& b,
                           const float* bias, void* user_out) {
  dnnl::stream& s = *part.stream;
  dnnl::memory o(e.out.prim, st.engine,
                 e.out.move == onednn_move::same ? user_out : part.out.get(e.out.prim.get_size()));
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SCRATCHPAD,
       dnnl::memory(e.scratchpad, st.engine, part.scratchpad.get(e.scratchpad.get_size()))}};
  if (kind == onednn_conv_kind::forward) {
    args.emplace(DNNL_ARG_SRC, a);
    args.emplace(DNNL_ARG_WEIGHTS, b);
    args.emplace(DNNL_ARG_DST, o);
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bias, st.engine, const_cast<float*>(bias)));
    }
  } else if (kind == onednn_conv_kind::backward_data) {
    args.emplace(DNNL_ARG_DIFF_DST, a);
    args.emplace(DNNL_ARG_WEIGHTS, b);
    args.emplace(DNNL_ARG_DIFF_SRC, o);
  } else {
    args.emplace(DNNL_ARG_SRC, a);
    args.emplace(DNNL_ARG_DIFF_DST, b);
    args.emplace(DNNL_ARG_DIFF_WEIGHTS, o);
  }
  e.primitive.execute(s, args);
  if (e.out.move != onednn_move::same) {
    // The primitive's writes finish before a transpose on this thread reads them.
    if (e.out.move != onednn_move::reorder) s.wait();
    dnnl::memory u(e.out.user, st.engine, user_out);
    onednn_move_operand(e.out, s, o, u, part.packing);
  }
  s.wait();
}

/// Float values of a weight gradient per chunk of output channels that suit the cache: a
/// chunk's gradient, in the primitive's layout and then in precis's, stays in a core's L2.
inline constexpr std::size_t onednn_weight_chunk_values = std::size_t(1) << 19;

/// Output channels per chunk where a weight gradient is computed by chunks of output
/// channels, or 0 where the images are split instead. By channels where the gradient is at
/// least as large as the images it is summed from (deep layers: 3x3, 512 channels, 7 x 7
/// pixels): split by images, each part would write and then add a whole gradient. The
/// chunks are whole 16-channel blocks, as many per thread, and each small enough for the
/// cache (onednn_weight_chunk_values) where the gradient is not.
inline std::size_t onednn_weight_chunk(const onednn_conv_key& k, std::size_t threads) {
  if (k.kind != onednn_conv_kind::backward_weights || k.groups != 1 || k.co < 32) return 0;
  const auto w_size = std::size_t(k.co * k.c * k.kh * k.kw);
  const auto images = std::size_t(k.n * (k.c * k.h * k.w + k.co * k.ho * k.wo));
  if (w_size < images) return 0;
  const std::size_t blocks = std::size_t(k.co + 15) / 16;
  const std::size_t workers = std::min(threads, blocks);
  const double per_worker = double(w_size) / double(workers * onednn_weight_chunk_values);
  const std::size_t m = std::max<std::size_t>(1, std::size_t(per_worker + 0.5));
  const std::size_t chunks = std::min(blocks, workers * m);
  if (chunks < 2) return 0;
  return (blocks + chunks - 1) / chunks * 16;
}

/// The weight gradient of `key` (backward_weights, groups 1) by chunks of `chunk` output
/// channels (onednn_weight_chunk), whole chunks split over the context's threads: for each,
/// one single-threaded call on every image, with dy's channels of the chunk copied out
/// first, and its float values (precis's [co, c, kh, kw] order) written to `out` where
/// `direct` (a float weight gradient), else to finish(first element, count, values). Each
/// worker moves x to the primitive's layout once. False, having written nothing, where
/// oneDNN offers only its reference implementation.
template <class TIn, class TOut, class Finish>
bool onednn_weights_by_channels(const cpu_context& ctx, onednn_state& st, onednn_conv_key key,
                                std::size_t chunk, const TIn* x, const TIn* dy, TOut* out,
                                bool direct, Finish& finish) {
  const std::size_t co = std::size_t(key.co), n = std::size_t(key.n);
  const std::size_t pixels = std::size_t(key.ho * key.wo);
  const std::size_t per_channel = std::size_t(key.c * key.kh * key.kw);
  const std::size_t chunks = (co + chunk - 1) / chunk;
  const std::size_t workers = std::min<std::size_t>(ctx.thread_count(), chunks);
  key.threads = 1;
  const auto entry_for = [&](std::size_t channels) -> const onednn_conv_entry& {
    onednn_conv_key k = key;
    k.co = std::int64_t(channels);
    return st.conv(k);
  };
  const onednn_conv_entry& full = entry_for(chunk);
  const std::size_t tail_channels = co - (chunks - 1) * chunk;
  const onednn_conv_entry& tail = tail_channels == chunk ? full : entry_for(tail_channels);
  if (full.implementation.rfind("ref", 0) == 0 || tail.implementation.rfind("ref", 0) == 0) {
    return false;
  }
  parallel_for(ctx, workers, 1, [&](std::size_t w0, std::size_t w1) {
    for (std::size_t w = w0; w < w1; ++w) {
      onednn_part& part = st.part(w);
      const std::lock_guard lock(part.busy);
      std::optional<dnnl::memory> xm;
      const onednn_operand* x_as = nullptr;
      omp_threads::instance().with(1, [&] {
        for (std::size_t j = chunks * w / workers; j < chunks * (w + 1) / workers; ++j) {
          const std::size_t o0 = j * chunk, oc = std::min(chunk, co - o0);
          const onednn_conv_entry& e = oc == chunk ? full : tail;
          // dy's channels [o0, o0 + oc) of every image, as a [n, oc, ...] tensor.
          auto* slice = static_cast<TIn*>(part.slice.get(n * oc * pixels * sizeof(TIn)));
          for (std::size_t i = 0; i < n; ++i) {
            const TIn* img = dy + i * co * pixels;
            TIn* to = slice + i * oc * pixels;
            if (key.channels_last) {
              for (std::size_t q = 0; q < pixels; ++q) {
                std::copy_n(img + q * co + o0, oc, to + q * oc);
              }
            } else {
              std::copy_n(img + o0 * pixels, oc * pixels, to);
            }
          }
          if (!xm || !(x_as->prim == e.in0.prim) || x_as->move != e.in0.move) {
            xm = onednn_input(st, part, e.in0, x, part.in0);
            x_as = &e.in0;
          }
          const dnnl::memory b = onednn_input(st, part, e.in1, slice, part.in1);
          void* values = direct ? static_cast<void*>(out + o0 * per_channel)
                                : part.results.get(oc * per_channel * sizeof(float));
          onednn_execute(st, part, e, onednn_conv_kind::backward_weights, *xm, b, nullptr, values);
          if (!direct) {
            finish(o0 * per_channel, oc * per_channel, static_cast<const float*>(values));
          }
        }
      });
    }
  });
  return true;
}

/// Runs a convolution pass with bfloat16 or float operands (TIn) through oneDNN. `key`
/// describes the whole batch (its n, kind, out_type and bias are used as given; in_type is
/// set from TIn); in0, in1 and out are in
/// precis's layouts (NCHW images, or NHWC where key.channels_last; [co, c / groups, kh, kw]
/// weights): forward x, w -> y,
/// backward_data dy, w -> dx, backward_weights x, dy -> dw. Images are split over the
/// context's threads when there are at least as many as threads (each part one
/// single-threaded call; weight gradients are float partial sums per part, added in part
/// order); fewer images run as one call on oneDNN's threads, as many as the context's.
/// A weight gradient at least as large as its images is computed by chunks of output
/// channels instead (onednn_weights_by_channels). `out` is written directly when `direct`
/// (its type is key.out_type; a weight gradient split by images is a sum of the parts',
/// finished); otherwise float values go to finish(first element, count, values). A nonzero
/// weights_version (forward and backward data) names the contents of in1: the weights
/// moved to the primitive's layout are kept, and a later call with the same in1, layout and
/// version uses them unmoved (see conv2d_params::weights_version). False, having written
/// nothing, where the CPU has no dot-product instructions for TIn or oneDNN offers only its
/// reference implementation.
template <class TIn, class TOut, class Finish>
bool onednn_conv(const cpu_context& ctx, onednn_conv_key key, const TIn* in0, const TIn* in1,
                 const float* bias, TOut* out, bool direct, std::uint64_t weights_version,
                 Finish&& finish) {
  if (!onednn_has_products<TIn>()) return false;
  key.in_type = onednn_type<TIn>();
  // Empty sums and empty tensors: the exact kernel writes their zeros.
  if (key.n == 0 || key.c == 0 || key.co == 0 || key.h == 0 || key.w == 0) return false;
  onednn_state& st = onednn_of(ctx);
  const bool weights = key.kind == onednn_conv_kind::backward_weights;
  const std::size_t threads = ctx.thread_count();
  if (const std::size_t channels = onednn_weight_chunk(key, threads)) {
    return onednn_weights_by_channels(ctx, st, key, channels, in0, in1, out, direct, finish);
  }
  const std::size_t n = std::size_t(key.n);
  const std::size_t parts = threads > 1 && n >= threads ? threads : 1;
  const std::size_t chunk = (n + parts - 1) / parts;
  const std::size_t used = (n + chunk - 1) / chunk;  // parts with at least one image
  const int omp = parts > 1 ? 1 : int(threads);
  const auto entry_for = [&](std::size_t images) -> const onednn_conv_entry& {
    onednn_conv_key k = key;
    k.n = std::int64_t(images);
    k.threads = omp;
    return st.conv(k);
  };
  const onednn_conv_entry& first = entry_for(std::min(chunk, n));
  const std::size_t tail = n - (used - 1) * chunk;
  const onednn_conv_entry& last = tail == chunk ? first : entry_for(tail);
  if (first.implementation.rfind("ref", 0) == 0 || last.implementation.rfind("ref", 0) == 0) {
    return false;
  }
  // Elements per image of x and y, and of the whole weight tensor.
  const std::size_t x_image = std::size_t(key.c * key.h * key.w);
  const std::size_t y_image = std::size_t(key.co * key.ho * key.wo);
  const std::size_t w_size = std::size_t(key.co * (key.c / key.groups) * key.kh * key.kw);
  const std::size_t in0_image = key.kind == onednn_conv_kind::backward_data ? y_image : x_image;
  const std::size_t out_image = key.kind == onednn_conv_kind::forward ? y_image : x_image;

  // The weights of a forward or backward-data pass are the same for every part: moved once
  // into the state's shared buffer. precis's packing splits its blocks over the context's
  // threads; oneDNN's reorder runs on the OpenMP threads the parts run on. Where the images
  // are split (each part on one OpenMP thread: a team woken here would spin beside
  // precis's threads), large weights are reordered by blocks of output channels, the
  // blocks split over the context's threads (onednn_block_reorder), else on one thread.
  // With a weights_version they are kept in the state, and moved only when it changed.
  std::optional<dnnl::memory> shared_weights;
  std::unique_lock<std::mutex> shared_use;
  if (!weights && first.in1.move != onednn_move::same && first.in1.prim == last.in1.prim) {
    shared_use = std::unique_lock(st.shared_use);
    onednn_state::kept_weights* kept =
        weights_version != 0 ? &st.keep(in1, first.in1.prim) : nullptr;
    const std::size_t bytes = first.in1.prim.get_size();
    shared_weights.emplace(first.in1.prim, st.engine,
                           kept != nullptr ? kept->values.get(bytes) : st.shared_packed.get(bytes));
    if (kept != nullptr && kept->version == weights_version) {
      ++st.kept_reuses;
    } else {
      if (kept != nullptr) kept->version = 0;  // until the move below has completed
      if (first.in1.move == onednn_move::pack) {
        onednn_pack_shared(ctx, st, first.in1.packing, reinterpret_cast<const std::uint16_t*>(in1),
                           static_cast<std::uint16_t*>(shared_weights->get_data_handle()));
      } else if (first.in1.move == onednn_move::reorder && first.in1.blocks.blocks != 0 &&
                 omp == 1 && threads > 1) {
        // The images are split over the threads, each part's call on one OpenMP thread:
        // the weights' blocks of output channels are split over the same threads, each
        // part's reorders on its own stream.
        const onednn_block_reorder& r = first.in1.blocks;
        const std::size_t blocks = r.blocks, movers = std::min(threads, blocks);
        const auto* from = reinterpret_cast<const char*>(in1);
        auto* to = static_cast<char*>(shared_weights->get_data_handle());
        parallel_for(ctx, movers, 1, [&](std::size_t p0, std::size_t p1) {
          for (std::size_t p = p0; p < p1; ++p) {
            onednn_part& part = st.part(p);
            const std::lock_guard lock(part.busy);
            omp_threads::instance().with(1, [&] {
              for (std::size_t j = blocks * p / movers; j < blocks * (p + 1) / movers; ++j) {
                dnnl::memory u(r.user, st.engine, const_cast<char*>(from + j * r.step));
                dnnl::memory m(r.prim, st.engine, to + j * r.step);
                r.reorder.execute(*part.stream, u, m);
              }
              part.stream->wait();
            });
          }
        });
      } else {
        onednn_part& p0 = st.part(0);
        const std::lock_guard lock(p0.busy);
        dnnl::memory u(first.in1.user, st.engine, const_cast<TIn*>(in1));
        omp_threads::instance().with(omp, [&] {
          onednn_move_operand(first.in1, *p0.stream, u, *shared_weights, p0.packing);
          p0.stream->wait();
        });
      }
      if (kept != nullptr) kept->version = weights_version;
    }
  }

  const auto run = [&](std::size_t p) {
    const std::size_t b0 = p * chunk, images = std::min(chunk, n - b0);
    const onednn_conv_entry& e = images == chunk ? first : last;
    onednn_part& part = st.part(p);
    const std::lock_guard lock(part.busy);
    // Where the output goes in precis's layout: y or dx itself, or float values kept in
    // the part for finish() or for the sum of the weight gradients' parts.
    const bool to_caller = direct && !weights;
    void* user_out = to_caller ? static_cast<void*>(out + b0 * out_image)
                               : part.results.get(e.out.user.get_size());
    omp_threads::instance().with(omp, [&] {
      const dnnl::memory a = onednn_input(st, part, e.in0, in0 + b0 * in0_image, part.in0);
      const dnnl::memory b =
          shared_weights
              ? *shared_weights
              : onednn_input(st, part, e.in1, weights ? in1 + b0 * y_image : in1, part.in1);
      onednn_execute(st, part, e, key.kind, a, b, key.bias ? bias : nullptr, user_out);
    });
    if (!to_caller && !weights) {
      finish(b0 * out_image, images * out_image, static_cast<const float*>(user_out));
    }
  };
  parallel_for(ctx, used, 1, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t p = p0; p < p1; ++p) run(p);
  });
  if (weights) {
    // The parts' float gradients, added in part order into part 0's, then finished.
    float* sum = static_cast<float*>(st.part(0).results.get(w_size * sizeof(float)));
    std::vector<const float*> partial(used);
    for (std::size_t p = 1; p < used; ++p) {
      partial[p] = static_cast<const float*>(st.part(p).results.get(w_size * sizeof(float)));
    }
    parallel_for(ctx, w_size, std::size_t(1) << 14, [&](std::size_t b, std::size_t e) {
      for (std::size_t p = 1; p < used; ++p) {
        for (std::size_t i = b; i < e; ++i) sum[i] += partial[p][i];
      }
      finish(b, e - b, sum + b);
    });
  }
  return true;
}

}  // namespace precis::detail
