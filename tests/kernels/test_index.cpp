// The device's index arithmetic, checked on the host: fast_divmod (division by a fixed
// divisor with a multiply-high, an addition and a shift) against `/` and `%` for divisors
// and numerators at the edges and at random, the strided copies' fast plans against
// the plain plans' offsets, element for element, and the row kernels' register layout
// (resident_rows_for, slot_column) covering every column of a row once, and the staged axis
// reductions' tiles (axis_tile) loading every value once; the image kernels' 32-bit
// indexers (nearest_index, resample_index, pool_index) against the 64-bit formulas and
// brute-force searches, and bilinear upsampling's taps and the gradient's gather ranges
// against every output's taps.
#include <precis/kernels/common.hpp>
#include <precis/kernels/pooling.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

using precis::detail::copy_plan;
using precis::detail::fast_divmod;

namespace {

// Every numerator worth trying for divisor d: the edges of the 32-bit range, around each
// multiple of d near them and near small multiples, and random ones.
std::vector<std::uint32_t> numerators(std::uint32_t d, std::mt19937_64& rng) {
  std::vector<std::uint32_t> n{0, 1, 2, 0x7fffffffU, 0x80000000U, 0x80000001U, 0xfffffffeU, 0xffffffffU};
  for (std::uint64_t k : {1ULL, 2ULL, 3ULL, 1000ULL, 0xffffffffULL / d, 0xffffffffULL / d - 1, 0x7fffffffULL / d}) {
    const std::uint64_t m = k * d;
    for (std::int64_t delta = -2; delta <= 2; ++delta) {
      const std::int64_t v = std::int64_t(m) + delta;
      if (v >= 0 && v <= 0xffffffffLL) n.push_back(std::uint32_t(v));
    }
  }
  for (int i = 0; i < 200; ++i) n.push_back(std::uint32_t(rng()));
  return n;
}

}  // namespace

TEST_CASE("fast_divmod divides every 32-bit numerator as / and % do") {
  std::mt19937_64 rng(42);
  std::vector<std::uint32_t> divisors;
  for (std::uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int s = 1; s <= 31; ++s) {
    const std::uint32_t p = std::uint32_t(1) << s;
    divisors.insert(divisors.end(), {p - 1, p, p + 1});
  }
  for (int i = 0; i < 300; ++i) divisors.push_back(std::uint32_t(rng() % 0x80000000ULL) + 1);
  std::size_t wrong = 0, checked = 0;
  for (const std::uint32_t d : divisors) {
    if (!fast_divmod::fits(d)) continue;
    const fast_divmod f(d);
    for (const std::uint32_t n : numerators(d, rng)) {
      ++checked;
      if (f.div(n) != n / d || f.mod(n) != n % d) {
        if (wrong++ < 5) FAIL_CHECK("n = " << n << ", d = " << d << ": " << f.div(n) << " r " << f.mod(n));
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(checked > 100000);
  CHECK_FALSE(fast_divmod::fits(0));
  CHECK(fast_divmod::fits(std::uint64_t(1) << 31));
  CHECK_FALSE(fast_divmod::fits((std::uint64_t(1) << 31) + 1));
}

TEST_CASE("a fast copy plan gives the plain plan's offsets for every element") {
  // Attention's head split ([N, T, 3, H, Dh] rows to [3][N, H, T, Dh]), a permutation with
  // a broadcast (a source stride 0), and extents that are not powers of two.
  const copy_plan<4> heads{{5, 4, 17, 24}, {17 * 3 * 96, 24, 3 * 96, 1}, {4 * 17 * 24, 17 * 24, 24, 1}};
  const copy_plan<3> broadcast{{7, 1, 13}, {0, 13, 1}, {13, 91, 1}};
  const copy_plan<2> rows{{197, 768}, {768, 1}, {2304, 1}};
  auto same = [](const auto& p) {
    REQUIRE(precis::detail::fits_fast(p));
    const auto f = precis::detail::make_fast(p);
    std::size_t differ = 0;
    for (std::size_t e = 0; e < p.elements(); ++e) {
      std::size_t a = 0, b = 0, fa = 0, fb = 0;
      precis::detail::copy_offsets(p, e, a, b);
      precis::detail::copy_offsets(f, std::uint32_t(e), fa, fb);
      differ += (a != fa || b != fb) ? 1U : 0U;
    }
    return differ;
  };
  CHECK(same(heads) == 0);
  CHECK(same(broadcast) == 0);
  CHECK(same(rows) == 0);
  // Too many elements for 32 bits: the plain plan.
  const copy_plan<2> big{{std::size_t(1) << 20, std::size_t(1) << 13}, {1, 1}, {1, 1}};
  CHECK_FALSE(precis::detail::fits_fast(big));
}

TEST_CASE("transpose_plan moves each matrix to its transpose, every element once") {
  // No structured binding: clang 14's INFO cannot capture one.
  for (const auto& dims : {std::array<std::size_t, 3>{1, 1, 1}, {2, 3, 5}, {3, 17, 1}, {4, 1, 9}, {2, 64, 48}}) {
    const std::size_t count = dims[0], rows = dims[1], cols = dims[2];
    INFO(count << " matrices of " << rows << " x " << cols);
    const auto p = precis::detail::transpose_plan(count, rows, cols);
    const std::size_t total = count * rows * cols;
    REQUIRE(p.elements() == total);
    std::vector<int> written(total, 0);
    for (std::size_t e = 0; e < total; ++e) {
      std::size_t from = 0, to = 0;
      precis::detail::copy_offsets(p, e, from, to);
      // The source element (n, i, j) of a rows x cols matrix lands at (n, j, i) of cols x rows.
      const std::size_t n = from / (rows * cols), i = from % (rows * cols) / cols, j = from % cols;
      CHECK(to == (n * cols + j) * rows + i);
      CHECK(to == e);  // the destination is walked in order
      ++written[to];
    }
    CHECK(std::count(written.begin(), written.end(), 1) == std::ptrdiff_t(total));
  }
}

namespace {

// Row lengths for the row kernels' geometry: every one up to `dense`, then every `step`-th
// up to resident_row_limit, and the edges of the warp and block sizes.
std::vector<std::size_t> row_lengths(std::size_t dense, std::size_t step) {
  std::vector<std::size_t> lengths;
  for (std::size_t c = 1; c <= dense; ++c) lengths.push_back(c);
  for (std::size_t c = dense + 1; c <= precis::detail::resident_row_limit; c += step) lengths.push_back(c);
  for (const std::size_t c : {2047UL, 2048UL, 2049UL, 3072UL, 4095UL, 4096UL, 4097UL, 6144UL, 8184UL, 8191UL, 8192UL}) {
    lengths.push_back(c);
  }
  return lengths;
}

}  // namespace

TEST_CASE("the row kernels' threads and slots hold every column of a row exactly once") {
  using precis::detail::resident_groups;
  using precis::detail::resident_rows_for;
  using precis::detail::slot_column;
  const std::vector<std::size_t> lengths = row_lengths(2100, 37);
  std::vector<int> seen;
  for (const int v : {1, 2, 4, 8, 16}) {  // unpacked rows; 16 bytes of double, float, 16-bit and 8-bit elements
    for (const std::size_t cols : lengths) {
      const auto g = resident_rows_for(cols);
      CAPTURE(v);
      CAPTURE(cols);
      REQUIRE((g.slots == 8 || g.slots == 16 || g.slots == 32));
      REQUIRE(g.per_warp == (cols <= precis::detail::warp_row_limit));
      // A warp, or the smallest block of 64 to 512 threads of at most 16 columns each.
      REQUIRE((g.per_warp ? g.threads == 32U
                          : g.threads >= 64 && g.threads <= 512 && (g.threads & (g.threads - 1)) == 0 &&
                                g.threads * 16 >= cols && (g.threads == 64 || g.threads / 2 * 16 < cols)));
      seen.assign(cols, 0);
      const int groups = resident_groups(g.slots, v);
      bool whole = true;  // a group lies inside the row or outside it where cols % v == 0
      for (unsigned rank = 0; rank < g.threads; ++rank) {
        for (int i = 0; i < groups; ++i) {
          const std::size_t c0 = slot_column(i, rank, g.threads, v);
          int inside = 0;
          for (int k = 0; k < v; ++k) {
            if (c0 + std::size_t(k) < cols) {
              ++seen[c0 + std::size_t(k)];
              ++inside;
            }
          }
          whole = whole && (inside == 0 || inside == v || cols % std::size_t(v) != 0);
        }
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      REQUIRE(whole);
    }
  }
}

TEST_CASE("the fused layer norm backward's shared sums hold every column once, within the shared memory") {
  using precis::detail::column_min_blocks;
  using precis::detail::fused_norm_rows_for;
  using precis::detail::resident_groups;
  using precis::detail::resident_rows_for;
  using precis::detail::slot_column;
  const std::vector<std::size_t> lengths = row_lengths(1100, 29);
  std::vector<int> seen;
  for (const std::size_t acc : {sizeof(float), sizeof(double)}) {
    for (const int v : {1, 2, 4, 8, 16}) {
      for (const std::size_t cols : lengths) {
        const auto g = resident_rows_for(cols);
        const auto f = fused_norm_rows_for(12608, cols, v, acc);
        CAPTURE(acc);
        CAPTURE(v);
        CAPTURE(cols);
        const std::size_t held = std::size_t(resident_groups(g.slots, v));
        REQUIRE(f.used >= 1);
        REQUIRE(f.used <= held);
        // The slot groups a thread leaves out start at or past the row's end.
        if (f.used < held) REQUIRE(slot_column(int(f.used), 0, g.threads, v) >= cols);
        const std::size_t span = f.used * std::size_t(v) * g.threads;  // places per term and group
        const std::size_t budget = g.per_warp ? precis::detail::fused_norm_warp_shared_bytes
                                              : precis::detail::fused_norm_block_shared_bytes;
        // Float sums fuse rows of up to 4096 columns, double sums up to 2048, at every width.
        REQUIRE((f.groups != 0) == (cols * acc <= 16384));
        if (f.groups == 0) {
          // Only where one group's places, both terms, exceed the limit.
          REQUIRE(2 * span * acc > budget);
          continue;
        }
        REQUIRE(f.groups <= (g.per_warp ? precis::detail::fused_norm_max_groups : 1));
        REQUIRE(f.shared_bytes == f.groups * 2 * span * acc);
        REQUIRE(f.shared_bytes <= budget);
        // As many warps as fit, up to the most.
        if (g.per_warp && f.groups < precis::detail::fused_norm_max_groups) {
          REQUIRE((f.groups + 1) * 2 * span * acc > budget);
        }
        // Read one column at a time, the rows use no more places than with v per access
        // (the launch sizes shared memory from the widest pack).
        REQUIRE(fused_norm_rows_for(12608, cols, 1, acc).used * g.threads <= span);
        // Place p = s * threads + rank (slot s of thread rank) below span holds column
        // slot_column(s / v, rank) + s % v: every column below cols exactly once.
        seen.assign(cols, 0);
        for (std::size_t p = 0; p < span; ++p) {
          const std::size_t s = p / g.threads;
          const std::size_t col = slot_column(int(s / std::size_t(v)), unsigned(p % g.threads), g.threads, v) +
                                  s % std::size_t(v);
          if (col < cols) ++seen[col];
        }
        REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      }
    }
  }
  CHECK(fused_norm_rows_for(1, 4096, 8, 4).groups == 1);
  CHECK(fused_norm_rows_for(1, 4097, 8, 4).groups == 0);
  CHECK(fused_norm_rows_for(1, 2048, 8, 8).groups == 1);
  CHECK(fused_norm_rows_for(1, 2049, 8, 8).groups == 0);
  // Rows per block: 64, halved while fewer than column_min_blocks blocks, not below the groups.
  for (std::size_t rows = 1; rows < 200000; rows += rows / 5 + 1) {
    for (const std::size_t cols : {96UL, 768UL, 1024UL, 3000UL}) {
      const auto f = fused_norm_rows_for(rows, cols, 8, sizeof(float));
      CAPTURE(rows);
      CAPTURE(cols);
      const std::size_t blocks = (rows + f.block_rows - 1) / f.block_rows;
      REQUIRE(f.block_rows >= f.groups);
      REQUIRE(f.block_rows <= precis::detail::fused_norm_most_block_rows);
      REQUIRE((f.block_rows & (f.block_rows - 1)) == 0);
      if (f.block_rows < precis::detail::fused_norm_most_block_rows) {
        REQUIRE((rows + 2 * f.block_rows - 1) / (2 * f.block_rows) < column_min_blocks);
      }
      if (f.block_rows / 2 >= f.groups) REQUIRE(blocks >= column_min_blocks);
    }
  }
  // ViT-B at batch 64 (197 tokens of 768 bfloat16): 8 warps of 6 KiB, 32 rows a block.
  const auto vit = fused_norm_rows_for(64 * 197, 768, 8, sizeof(float));
  CHECK(vit.groups == 8);
  CHECK(vit.block_rows == 32);
  CHECK(vit.shared_bytes == 48 * 1024);
  // 1024 columns: 8 KiB a warp, 6 warps.
  CHECK(fused_norm_rows_for(64 * 197, 1024, 8, sizeof(float)).groups == 6);
}

TEST_CASE("the row kernels give a row group 1, 2 or 4 rows, leaving enough blocks") {
  using precis::detail::resident_min_blocks;
  using precis::detail::resident_rows_per_group;
  for (const std::size_t groups : {std::size_t(1), std::size_t(8)}) {  // a block per row, or 8 warps
    for (std::size_t rows = 1; rows < 40000; rows += rows / 7 + 1) {
      CAPTURE(groups);
      CAPTURE(rows);
      const std::size_t r = resident_rows_per_group(rows, groups);
      REQUIRE((r == 1 || r == 2 || r == 4));
      const std::size_t blocks = (rows + groups * r - 1) / (groups * r);
      // More rows a group only while at least resident_min_blocks blocks remain, and never
      // fewer rows than the smaller count would give.
      if (r > 1) REQUIRE(blocks >= resident_min_blocks);
      if (r < 4) REQUIRE(rows < 2 * r * groups * resident_min_blocks);
      REQUIRE(blocks * groups * r >= rows);
    }
  }
  CHECK(resident_rows_per_group(8200, 8) == 2);
  CHECK(resident_rows_per_group(2051, 1) == 4);
  CHECK(resident_rows_per_group(1100, 1) == 2);
  CHECK(resident_rows_per_group(1023, 1) == 1);
}

namespace {

// The planes the resampling indexers are checked on: each layout, 1 and 2 images, 1, 3 and 5
// channels, and planes that grow (by whole and other factors), keep their size and shrink.
struct resample_sizes {
  std::size_t h, w, ho, wo;
};
template <class F>
void for_each_resample(F f) {
  for (const bool last : {false, true}) {
    for (const std::size_t n : {1UL, 2UL}) {
      for (const std::size_t c : {1UL, 3UL, 5UL}) {
        for (const resample_sizes z :
             {resample_sizes{4, 4, 8, 8}, resample_sizes{3, 5, 7, 11}, resample_sizes{5, 5, 5, 5},
              resample_sizes{2, 3, 16, 24}, resample_sizes{7, 6, 3, 4}, resample_sizes{1, 1, 9, 2},
              resample_sizes{20, 20, 160, 160}}) {
          CAPTURE(last);
          CAPTURE(n);
          CAPTURE(c);
          CAPTURE(z.h);
          CAPTURE(z.w);
          CAPTURE(z.ho);
          CAPTURE(z.wo);
          f(last, n, c, z);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("nearest upsampling's 32-bit index arithmetic matches the 64-bit formulas and gathers every output once") {
  using precis::detail::nearest_index;
  for_each_resample([](bool last, std::size_t n, std::size_t c, const resample_sizes& z) {
    REQUIRE(nearest_index::fits(n * c, z.h, z.w, z.ho, z.wo, c));
    const auto ix = nearest_index::make(z.h, z.w, z.ho, z.wo, c, last);
    const std::size_t outs = n * c * z.ho * z.wo, ins = n * c * z.h * z.w, stride = last ? c : 1;
    // The generic kernels' 64-bit arithmetic: output i's source.
    std::vector<std::size_t> source(outs);
    for (std::size_t i = 0; i < outs; ++i) {
      std::size_t image = 0, ch = 0, o = 0;
      if (last) {
        ch = i % c;
        image = (i / c) / (z.ho * z.wo);
        o = (i / c) % (z.ho * z.wo);
      } else {
        image = i / (z.ho * z.wo);
        o = i % (z.ho * z.wo);
      }
      const std::size_t first = last ? image * z.h * z.w * c + ch : image * z.h * z.w;
      const std::size_t iy = (o / z.wo) * z.h / z.ho, ixx = (o % z.wo) * z.w / z.wo;
      source[i] = first + (iy * z.w + ixx) * stride;
      REQUIRE(ix.source(std::uint32_t(i)) == source[i]);
    }
    // Each input's outputs are exactly those whose source it is, each gathered once.
    std::vector<int> gathered(outs, 0);
    for (std::size_t i = 0; i < ins; ++i) {
      std::uint32_t base = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
      ix.outputs(std::uint32_t(i), base, oy0, oy1, ox0, ox1);
      for (std::uint32_t oy = oy0; oy < oy1; ++oy) {
        for (std::uint32_t ox = ox0; ox < ox1; ++ox) {
          const std::size_t o = base + (std::size_t(oy) * z.wo + ox) * stride;
          REQUIRE(o < outs);
          REQUIRE(source[o] == i);
          ++gathered[o];
        }
      }
    }
    REQUIRE(std::all_of(gathered.begin(), gathered.end(), [](int k) { return k == 1; }));
  });
  CHECK_FALSE(nearest_index::fits(1, 70000, 70000, 1, 1, 1));       // 2^32 input elements
  CHECK_FALSE(nearest_index::fits(1u << 20, 64, 64, 128, 128, 1));  // 2^34 output elements
  CHECK_FALSE(nearest_index::fits(0, 4, 4, 8, 8, 1));
}

TEST_CASE("pooling's 32-bit index arithmetic matches the 64-bit formulas and finds exactly the windows holding each input") {
  using precis::detail::pool_index;
  struct sizes {
    std::size_t h, w, kh, kw, sh, sw, ph, pw, extra;  // extra: outputs past the floor count (ceil mode)
  };
  for (const bool last : {false, true}) {
    for (const std::size_t n : {1UL, 2UL}) {
      for (const std::size_t c : {1UL, 3UL}) {
        for (const sizes& z : {sizes{8, 8, 3, 3, 2, 2, 1, 1, 0}, sizes{7, 9, 3, 3, 2, 2, 1, 1, 1},
                              sizes{6, 5, 2, 2, 2, 2, 0, 0, 0}, sizes{5, 7, 3, 2, 1, 3, 1, 0, 0},
                              sizes{4, 4, 4, 4, 4, 4, 0, 0, 0}, sizes{9, 6, 5, 3, 3, 2, 2, 1, 1},
                              sizes{3, 3, 1, 1, 1, 1, 0, 0, 0}, sizes{20, 20, 3, 3, 2, 2, 1, 1, 0}}) {
          const std::size_t ho = (z.h + 2 * z.ph - z.kh) / z.sh + 1 + z.extra;
          const std::size_t wo = (z.w + 2 * z.pw - z.kw) / z.sw + 1 + z.extra;
          CAPTURE(last);
          CAPTURE(n);
          CAPTURE(c);
          CAPTURE(z.h);
          CAPTURE(z.w);
          CAPTURE(z.kh);
          CAPTURE(z.sh);
          CAPTURE(z.ph);
          REQUIRE(pool_index::fits(n * c, z.h, z.w, ho, wo, c, z.kh, z.kw, z.sh, z.sw, z.ph, z.pw));
          const auto ix = pool_index::make(z.h, z.w, ho, wo, c, last, z.kh, z.kw, z.sh, z.sw, z.ph, z.pw);
          const std::size_t outs = n * c * ho * wo, ins = n * c * z.h * z.w, stride = last ? c : 1;
          REQUIRE(ix.stride() == stride);
          // Element i of planes of `pixels`, as the generic kernels split it in 64 bits: the
          // offset of its plane's first element in planes of `to` pixels, and its pixel.
          const auto place = [&](std::size_t i, std::size_t pixels, std::size_t to, std::size_t& pixel) {
            std::size_t image = 0, ch = 0;
            if (last) {
              ch = i % c;
              image = (i / c) / pixels;
              pixel = (i / c) % pixels;
            } else {
              image = i / pixels;
              pixel = i % pixels;
            }
            return last ? image * to * c + ch : image * to;
          };
          for (std::size_t i = 0; i < outs; ++i) {
            std::size_t o = 0;
            const std::size_t x_first = place(i, ho * wo, z.h * z.w, o);
            std::uint32_t f = 0, oy = 0, ox = 0;
            ix.output(std::uint32_t(i), f, oy, ox);
            REQUIRE(f == x_first);
            REQUIRE(oy == o / wo);
            REQUIRE(ox == o % wo);
          }
          // Each input's outputs are exactly those whose unclipped windows hold it.
          for (std::size_t i = 0; i < ins; ++i) {
            std::size_t at = 0;
            const std::size_t x_first = place(i, z.h * z.w, z.h * z.w, at);
            const std::size_t o_first = place(i, z.h * z.w, ho * wo, at);
            std::uint32_t xf = 0, of = 0, a = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
            ix.input(std::uint32_t(i), xf, of, a, oy0, oy1, ox0, ox1);
            REQUIRE(xf == x_first);
            REQUIRE(of == o_first);
            REQUIRE(a == at);
            const std::size_t iy = at / z.w, ixx = at % z.w;
            for (std::size_t oy = 0; oy < ho; ++oy) {
              for (std::size_t ox = 0; ox < wo; ++ox) {
                const bool holds = oy * z.sh <= iy + z.ph && iy + z.ph < oy * z.sh + z.kh && ox * z.sw <= ixx + z.pw &&
                                   ixx + z.pw < ox * z.sw + z.kw;
                const bool listed = oy >= oy0 && oy < oy1 && ox >= ox0 && ox < ox1;
                REQUIRE(holds == listed);
              }
            }
          }
        }
      }
    }
  }
  CHECK_FALSE(pool_index::fits(1, 70000, 70000, 1, 1, 1, 1, 1, 1, 1, 0, 0));         // 2^32 input elements
  CHECK_FALSE(pool_index::fits(1, 4, 4, 4, 4, 1, 1, 1, 0x100000000ULL, 1, 0, 0));    // a stride past 2^31
  CHECK_FALSE(pool_index::fits(1, 4, 4, 4, 4, 1, 1, 1, 1, 1, 0xfffffffeULL, 0));     // padded rows past 2^32
  CHECK_FALSE(pool_index::fits(0, 4, 4, 2, 2, 1, 2, 2, 2, 2, 0, 0));
  CHECK(pool_index::fits(16 * 64, 320, 320, 160, 160, 64, 3, 3, 2, 2, 1, 1));  // DBNet's stem at 640
}

TEST_CASE("bilinear upsampling's 32-bit indices match the 64-bit formulas") {
  using precis::detail::resample_index;
  for_each_resample([](bool last, std::size_t n, std::size_t c, const resample_sizes& z) {
    REQUIRE(resample_index::fits(n * c, z.h, z.w, z.ho, z.wo, c));
    const auto ix = resample_index::make(z.h, z.w, z.ho, z.wo, c, last);
    const std::size_t stride = last ? c : 1;
    // The generic kernels' 64-bit arithmetic: element i of a tensor of planes of
    // `pixels`, its image, channel and pixel.
    const auto place = [&](std::size_t i, std::size_t pixels, std::size_t& image, std::size_t& ch,
                           std::size_t& at) {
      ch = last ? i % c : 0;
      const std::size_t rest = last ? i / c : i;
      image = rest / pixels;
      at = rest % pixels;
    };
    const auto first = [&](std::size_t image, std::size_t ch, std::size_t pixels) {
      return last ? image * pixels * c + ch : image * pixels;
    };
    for (std::size_t i = 0; i < n * c * z.ho * z.wo; ++i) {
      std::size_t image = 0, ch = 0, o = 0;
      place(i, z.ho * z.wo, image, ch, o);
      std::uint32_t x_first = 0, oy = 0, ox = 0;
      ix.output(std::uint32_t(i), x_first, oy, ox);
      REQUIRE(x_first == first(image, ch, z.h * z.w));
      REQUIRE(oy == o / z.wo);
      REQUIRE(ox == o % z.wo);
      REQUIRE(first(image, ch, z.ho * z.wo) + ix.out_at(oy, ox) == i);
    }
    for (std::size_t i = 0; i < n * c * z.h * z.w; ++i) {
      std::size_t image = 0, ch = 0, pixel = 0;
      place(i, z.h * z.w, image, ch, pixel);
      std::uint32_t x_first = 0, o_first = 0, at = 0, iy = 0, jx = 0;
      ix.locate_input(std::uint32_t(i), x_first, o_first, at, iy, jx);
      REQUIRE(x_first == first(image, ch, z.h * z.w));
      REQUIRE(x_first + (std::size_t(iy) * z.w + jx) * stride == i);
      REQUIRE(o_first == first(image, ch, z.ho * z.wo));
      REQUIRE(at == pixel);
      REQUIRE(iy == pixel / z.w);
      REQUIRE(jx == pixel % z.w);
    }
  });
  CHECK_FALSE(resample_index::fits(1, 70000, 70000, 1, 1, 1));       // 2^32 input elements
  CHECK_FALSE(resample_index::fits(1u << 20, 64, 64, 128, 128, 1));  // 2^34 output elements
  CHECK(resample_index::fits(16 * 64, 160, 160, 640, 640, 64));
}

namespace {

// bilinear_taps over 32-bit and 64-bit indices along one axis of `in` inputs and `outs`
// outputs, and bilinear_readers against every output's taps: the readers of input t are
// exactly the outputs whose lower tap is t - 1 or t, and they hold every output that reads t.
template <class M>
void check_bilinear_axis(std::size_t in, std::size_t outs, bool align) {
  CAPTURE(in);
  CAPTURE(outs);
  CAPTURE(align);
  std::vector<std::size_t> lower(outs), upper(outs);
  for (std::size_t o = 0; o < outs; ++o) {
    M w64 = M(0), w32 = M(0);
    std::uint32_t a = 0, b = 0;
    precis::detail::bilinear_taps(o, in, outs, align, lower[o], upper[o], w64);
    precis::detail::bilinear_taps(std::uint32_t(o), std::uint32_t(in), std::uint32_t(outs), align, a, b, w32);
    REQUIRE(a == lower[o]);
    REQUIRE(b == upper[o]);
    REQUIRE(std::bit_cast<std::array<unsigned char, sizeof(M)>>(w32) ==
            std::bit_cast<std::array<unsigned char, sizeof(M)>>(w64));
    REQUIRE(lower[o] < in);
    REQUIRE((upper[o] == lower[o] + 1 || upper[o] == in - 1));
  }
  for (std::size_t t = 0; t < in; ++t) {
    CAPTURE(t);
    std::uint32_t lo = 0, hi = 0;
    precis::detail::bilinear_readers<M>(std::uint32_t(t), std::uint32_t(in), std::uint32_t(outs), align, lo, hi);
    REQUIRE(lo <= hi);
    REQUIRE(hi <= outs);
    for (std::size_t o = 0; o < outs; ++o) {
      const bool inside = o >= lo && o < hi;
      REQUIRE(inside == (lower[o] + 1 == t || lower[o] == t));
      if (lower[o] == t || upper[o] == t) REQUIRE(inside);
    }
  }
}

}  // namespace

TEST_CASE("bilinear upsampling's taps are the same over 32-bit indices, and its gradient gathers every reader") {
  for (const bool align : {false, true}) {
    for (std::size_t in = 1; in <= 24; ++in) {
      for (std::size_t outs = 1; outs <= 40; ++outs) {
        check_bilinear_axis<float>(in, outs, align);
        check_bilinear_axis<double>(in, outs, align);
      }
    }
    for (const auto [in, outs] : {std::array<std::size_t, 2>{160, 640}, {320, 640}, {1000, 7}, {7, 1000},
                                  {333, 1024}, {1024, 333}}) {
      check_bilinear_axis<float>(in, outs, align);
      check_bilinear_axis<double>(in, outs, align);
    }
  }
}

namespace {

// One tile geometry of the device's staged reductions along an axis: every (output, k) value
// of a stage loaded by exactly one (thread, load), into its own shared-memory element inside
// the tile; each thread's loads a constant step apart in memory; the adding threads (one per
// output, the same k) reading 4-byte words in 32 different banks where the elements are at
// most 4 bytes.
template <bool Rows, unsigned Outputs, std::size_t Size>
void check_axis_tile() {
  using Tile = precis::detail::axis_tile<Rows, Outputs, Size>;
  constexpr unsigned threads = precis::detail::axis_stage_threads;
  CAPTURE(Rows);
  CAPTURE(Outputs);
  CAPTURE(Size);
  REQUIRE(Tile::elements * Size == precis::detail::axis_stage_bytes);
  REQUIRE(Tile::per_thread * threads == Tile::elements);
  REQUIRE(Tile::ks * Outputs == Tile::elements);
  REQUIRE(Tile::size * Size <= precis::detail::axis_stage_bytes + Outputs * 8);
  std::vector<int> seen(Tile::elements, 0), slot(Tile::size, 0);
  // Memory offsets of (j, kk) in a tile of rows `count` apart (Rows) or of outputs
  // contiguous and k values `inner` apart (columns), for a count and inner of no special form.
  const long count = 1237, inner = 1237;
  const auto address = [&](unsigned j, unsigned kk) {
    return Rows ? long(j) * count + kk : long(kk) * inner + j;
  };
  for (unsigned t = 0; t < threads; ++t) {
    long step = 0;
    for (unsigned n = 0; n < Tile::per_thread; ++n) {
      unsigned j = 0, kk = 0;
      Tile::place(t, n, j, kk);
      REQUIRE(j < Outputs);
      REQUIRE(kk < Tile::ks);
      ++seen[j * Tile::ks + kk];
      const unsigned at = Tile::offset(j, kk);
      REQUIRE(at < Tile::size);
      ++slot[at];
      if (n > 0) {
        unsigned pj = 0, pk = 0;
        Tile::place(t, n - 1, pj, pk);
        // Within a row's loads the step is `lanes` values; from one row group to the next
        // the pointer moves rows_at_once rows and back to the thread's first value.
        if constexpr (Rows) {
          constexpr unsigned per_row = Tile::ks / Tile::lanes;
          unsigned j0 = 0, k0 = 0;
          Tile::place(t, n / per_row * per_row, j0, k0);
          REQUIRE(address(j, kk) - address(j0, k0) == long(n % per_row) * Tile::lanes);
          REQUIRE(j0 == t / Tile::lanes + n / per_row * Tile::rows_at_once);
        } else {
          const long d = address(j, kk) - address(pj, pk);
          if (n == 1) step = d;
          REQUIRE(d == step);
        }
      }
    }
  }
  REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  REQUIRE(std::count(slot.begin(), slot.end(), 1) == std::ptrdiff_t(Tile::elements));
  // A warp of loads reads consecutive addresses (Rows: along a row; columns: across outputs).
  for (unsigned n = 0; n < Tile::per_thread; ++n) {
    for (unsigned t = 1; t < 32 && t < (Rows ? Tile::lanes : Outputs); ++t) {
      unsigned a = 0, b = 0, c = 0, d = 0;
      Tile::place(t - 1, n, a, b);
      Tile::place(t, n, c, d);
      REQUIRE(address(c, d) == address(a, b) + 1);
    }
  }
  if constexpr (Size <= 4) {
    for (unsigned kk = 0; kk < Tile::ks; kk += 7) {
      std::vector<int> banks(32, 0);
      for (unsigned j = 0; j < Outputs; ++j) ++banks[Tile::offset(j, kk) * Size / 4 % 32];
      // Rows: one word per output in its own bank; columns: the outputs' values share words,
      // consecutive words in consecutive banks.
      const int most = *std::max_element(banks.begin(), banks.end());
      REQUIRE(most <= (Rows ? 1 : int(4 / Size)));
    }
  }
}

template <unsigned Outputs, std::size_t... Sizes>
void check_axis_tiles() {
  (check_axis_tile<true, Outputs, Sizes>(), ...);
  (check_axis_tile<false, Outputs, Sizes>(), ...);
}

}  // namespace

TEST_CASE(
    "the staged axis reductions' tiles load every value once and add it without bank conflicts") {
  check_axis_tiles<32, 1, 2, 4, 8>();
  check_axis_tiles<16, 1, 2, 4, 8>();
  CHECK(precis::detail::axis_tile_outputs(8192) == 32);
  CHECK(precis::detail::axis_tile_outputs(8191) == 16);
}

TEST_CASE("column reductions shorten their slabs just enough for column_min_blocks blocks") {
  using precis::detail::column_min_blocks;
  using precis::detail::column_slab_rows_for;
  // Blocks of the first pass: 32 threads of `width` columns across, a slab of rows deep.
  const auto blocks = [](std::size_t rows, std::size_t cols, std::size_t width, std::size_t slab) {
    return ((cols + 32 * width - 1) / (32 * width)) * ((rows + slab - 1) / slab);
  };
  std::mt19937_64 g(7);
  for (int i = 0; i < 20000; ++i) {
    const std::size_t rows = 1 + g() % (1u << (g() % 22)), cols = 1 + g() % (1u << (g() % 11));
    const std::size_t width = std::size_t(1) << (g() % 4), least = std::size_t(1) << (3 + g() % 4);
    const std::size_t most = least << (g() % 8);
    const std::size_t slab = column_slab_rows_for(rows, cols, width, most, least);
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(width);
    CAPTURE(most);
    CAPTURE(least);
    REQUIRE(slab >= least);
    REQUIRE(slab <= most);
    REQUIRE(most % slab == 0);
    REQUIRE((most / slab & (most / slab - 1)) == 0);  // a power of two
    if (slab > least) REQUIRE(blocks(rows, cols, width, slab) >= column_min_blocks);
    if (slab < most) REQUIRE(blocks(rows, cols, width, slab * 2) < column_min_blocks);
  }
  // Channels-last batch norm at batch 16 (bfloat16: 8 channels a thread), slabs of up to 4096.
  CHECK(column_slab_rows_for(16 * 20 * 20, 512, 8, 4096, 64) == 64);     // was 4 blocks, now 200
  CHECK(column_slab_rows_for(16 * 80 * 80, 128, 8, 4096, 64) == 256);    // 400 blocks
  CHECK(column_slab_rows_for(16 * 320 * 320, 64, 8, 4096, 64) == 4096);  // already 400 blocks
  // Bias gradients and layer norm's dgamma and dbeta keep their 64 rows.
  CHECK(column_slab_rows_for(64 * 197, 768, 8, 64, 64) == 64);
}
