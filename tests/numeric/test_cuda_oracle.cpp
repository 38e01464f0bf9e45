// Every format against CUDA's own host-side conversion functions, bit for bit: decoding
// every pattern, and encoding at every midpoint between neighbours (every tie), at the
// midpoints' float neighbours, at special values, and on a strided sweep of float patterns.
// CUDA's headers come first: precis offers to_cuda/from_cuda for the CUDA types already
// declared (or for all of them under PRECIS_CUDA=1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <precis/numeric/numeric.hpp>

#include "reference.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using precis::bfloat16;
using precis::float16;
using precis::float8_e4m3;
using precis::float8_e5m2;
using precis::overflow;
using precis::rounding;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// CUDA's host functions, one per (format, mode).
std::uint32_t cuda_rn(float16, float x) { return __half_raw(__float2half_rn(x)).x; }
std::uint32_t cuda_rz(float16, float x) { return __half_raw(__float2half_rz(x)).x; }
std::uint32_t cuda_rn(bfloat16, float x) { return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x; }
std::uint32_t cuda_rz(bfloat16, float x) { return __nv_bfloat16_raw(__float2bfloat16_rz(x)).x; }
std::uint32_t cuda_rn(float8_e4m3, float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); }
std::uint32_t cuda_sat(float8_e4m3, float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
std::uint32_t cuda_rn(float8_e5m2, float x) { return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); }
std::uint32_t cuda_sat(float8_e5m2, float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

float cuda_decode(float16, std::uint32_t b) {
  __half_raw r;
  r.x = static_cast<unsigned short>(b);
  return __half2float(__half(r));
}
float cuda_decode(bfloat16, std::uint32_t b) {
  __nv_bfloat16_raw r;
  r.x = static_cast<unsigned short>(b);
  return __bfloat162float(__nv_bfloat16(r));
}
float cuda_decode(float8_e4m3, std::uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
}
float cuda_decode(float8_e5m2, std::uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E5M2)));
}

/// The float inputs where rounding decisions happen: every midpoint between neighbours
/// (including between max and the next binade, and between 0 and the smallest
/// subnormal), both float neighbours of each, every value itself, with both signs, plus
/// the special values.
template <class T>
std::vector<float> critical_inputs() {
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  const auto& v = ref.values();
  std::vector<float> xs;
  for (std::size_t k = 0; k + 1 < v.size(); ++k) {
    const auto mid = static_cast<float>((v[k] + v[k + 1]) / 2);  // exact for every format
    REQUIRE(double(mid) == (v[k] + v[k + 1]) / 2);
    for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                    static_cast<float>(v[k])}) {
      xs.push_back(m);
      xs.push_back(-m);
    }
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7FA00000U),  // signaling NaN
                            std::bit_cast<float>(0xFF800001U),  // negative NaN, small payload
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::lowest(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            1.0f,
                            -1.0f};
  xs.insert(xs.end(), std::begin(specials), std::end(specials));
  return xs;
}

template <class T, rounding R, overflow O, class Oracle>
void check_encode(float x, Oracle oracle) {
  const auto ours = precis::convert<T, R, O>(x).bits();
  const auto theirs = oracle(T{}, x);
  if (ours != theirs) {
    FAIL_CHECK("x = " << x << " (bits 0x" << std::hex << bits_of(x) << "): precis 0x" << unsigned(ours)
                      << ", CUDA 0x" << theirs);
  }
}

template <class T, rounding R, overflow O, class Oracle>
void check_all_encodings(Oracle oracle) {
  for (float x : critical_inputs<T>()) check_encode<T, R, O>(x, oracle);
  // Strided sweep over all 2^32 float patterns: a prime stride reaches every low-bit
  // residue, and 2^32 / 251 > 2^24 patterns are visited.
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 251) {
    check_encode<T, R, O>(std::bit_cast<float>(std::uint32_t(b)), oracle);
  }
}

template <class T>
void check_all_decodings() {
  using storage = typename T::storage_type;
  constexpr std::uint32_t count = 1U << (8 * sizeof(storage));
  for (std::uint32_t b = 0; b < count; ++b) {
    const float ours = T::from_bits(static_cast<storage>(b));
    const float theirs = cuda_decode(T{}, b);
    if (bits_of(ours) != bits_of(theirs)) {
      FAIL_CHECK("pattern 0x" << std::hex << b << ": precis 0x" << bits_of(ours) << ", CUDA 0x"
                              << bits_of(theirs));
    }
  }
}

auto rn = [](auto t, float x) { return cuda_rn(t, x); };
auto rz = [](auto t, float x) { return cuda_rz(t, x); };
auto sat = [](auto t, float x) { return cuda_sat(t, x); };

}  // namespace

TEST_CASE("decoding every pattern matches CUDA") {
  check_all_decodings<float16>();
  check_all_decodings<bfloat16>();
  check_all_decodings<float8_e4m3>();
  check_all_decodings<float8_e5m2>();
}

TEST_CASE("float16 encoding matches CUDA: nearest-even and toward zero") {
  check_all_encodings<float16, rounding::nearest_even, overflow::infinity>(rn);
  check_all_encodings<float16, rounding::toward_zero, overflow::infinity>(rz);
}

TEST_CASE("bfloat16 encoding matches CUDA: nearest-even and toward zero") {
  check_all_encodings<bfloat16, rounding::nearest_even, overflow::infinity>(rn);
  check_all_encodings<bfloat16, rounding::toward_zero, overflow::infinity>(rz);
}

TEST_CASE("float8_e4m3 encoding matches CUDA: non-saturating and saturating") {
  check_all_encodings<float8_e4m3, rounding::nearest_even, overflow::infinity>(rn);
  check_all_encodings<float8_e4m3, rounding::nearest_even, overflow::saturate>(sat);
}

TEST_CASE("float8_e5m2 encoding matches CUDA: non-saturating and saturating") {
  check_all_encodings<float8_e5m2, rounding::nearest_even, overflow::infinity>(rn);
  check_all_encodings<float8_e5m2, rounding::nearest_even, overflow::saturate>(sat);
}

TEST_CASE("the explicit constructor and saturate_cast are the nearest-even conversions") {
  for (float x : critical_inputs<float8_e4m3>()) {
    CHECK(float8_e4m3(x).bits() == cuda_rn(float8_e4m3{}, x));
    CHECK(precis::saturate_cast<float8_e4m3>(x).bits() == cuda_sat(float8_e4m3{}, x));
  }
  for (float x : critical_inputs<float16>()) CHECK(float16(x).bits() == cuda_rn(float16{}, x));
}

TEST_CASE("to_cuda and from_cuda keep every bit") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = float16::from_bits(static_cast<std::uint16_t>(b));
    CHECK(__half_raw(precis::to_cuda(h)).x == b);
    CHECK(precis::from_cuda(precis::to_cuda(h)).bits() == b);
    const auto g = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    CHECK(__nv_bfloat16_raw(precis::to_cuda(g)).x == b);
    CHECK(precis::from_cuda(precis::to_cuda(g)).bits() == b);
  }
  for (std::uint32_t b = 0; b < 256; ++b) {
    const auto e4 = float8_e4m3::from_bits(static_cast<std::uint8_t>(b));
    const auto e5 = float8_e5m2::from_bits(static_cast<std::uint8_t>(b));
    CHECK(precis::to_cuda(e4).__x == b);
    CHECK(precis::to_cuda(e5).__x == b);
    CHECK(precis::from_cuda(precis::to_cuda(e4)).bits() == b);
    CHECK(precis::from_cuda(precis::to_cuda(e5)).bits() == b);
  }
}
