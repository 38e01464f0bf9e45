// Conversion throughput on 16M normally distributed floats: float -> each format and
// back, through precis's array conversion, against CUDA's host conversion functions
// (where CUDA's headers are present) and against a memcpy of the float array (64 MiB),
// all measured in this one run.
//
//   bench_convert [--csv out.csv] [--n elements]
#if __has_include(<cuda_fp16.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define PRECIS_BENCH_HAVE_CUDA 1
#else
#define PRECIS_BENCH_HAVE_CUDA 0
#endif

#include <precis/numeric/numeric.hpp>

#include "common.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace precis_bench;

#if PRECIS_BENCH_HAVE_CUDA
void cuda_encode_all(const std::vector<float>& in, std::vector<precis::float16>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = precis::float16::from_bits(__half_raw(__float2half_rn(in[i])).x);
}
void cuda_encode_all(const std::vector<float>& in, std::vector<precis::bfloat16>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = precis::bfloat16::from_bits(__nv_bfloat16_raw(__float2bfloat16_rn(in[i])).x);
}
void cuda_encode_all(const std::vector<float>& in, std::vector<precis::float8_e4m3>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = precis::float8_e4m3::from_bits(__nv_cvt_float_to_fp8(in[i], __NV_NOSAT, __NV_E4M3));
}
void cuda_encode_all(const std::vector<float>& in, std::vector<precis::float8_e5m2>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = precis::float8_e5m2::from_bits(__nv_cvt_float_to_fp8(in[i], __NV_NOSAT, __NV_E5M2));
}
void cuda_decode_all(const std::vector<precis::float16>& in, std::vector<float>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) { __half_raw r; r.x = in[i].bits(); out[i] = __half2float(__half(r)); }
}
void cuda_decode_all(const std::vector<precis::bfloat16>& in, std::vector<float>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) { __nv_bfloat16_raw r; r.x = in[i].bits(); out[i] = __bfloat162float(__nv_bfloat16(r)); }
}
void cuda_decode_all(const std::vector<precis::float8_e4m3>& in, std::vector<float>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(in[i].bits(), __NV_E4M3)));
}
void cuda_decode_all(const std::vector<precis::float8_e5m2>& in, std::vector<float>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(in[i].bits(), __NV_E5M2)));
}
#endif

template <class T>
void run(const char* name, const std::vector<float>& x, double memcpy_ms, table& t) {
  std::vector<T> y(x.size());
  std::vector<float> back(x.size());
  const double enc = best_ms([&] { precis::convert(x, y); });
  const double dec = best_ms([&] { precis::convert(y, back); });
  std::string cuda_enc = "-", cuda_dec = "-", enc_speedup = "-", dec_speedup = "-";
#if PRECIS_BENCH_HAVE_CUDA
  std::vector<T> yc(x.size());
  std::vector<float> backc(x.size());
  const double ce = best_ms([&] { cuda_encode_all(x, yc); }, 3);
  const double cd = best_ms([&] { cuda_decode_all(y, backc); }, 3);
  if (std::memcmp(yc.data(), y.data(), y.size() * sizeof(T)) != 0 ||
      std::memcmp(backc.data(), back.data(), back.size() * sizeof(float)) != 0) {
    std::printf("error: precis and CUDA disagree for %s\n", name);
    std::exit(1);
  }
  cuda_enc = fixed(ce);
  cuda_dec = fixed(cd);
  enc_speedup = fixed(ce / enc);
  dec_speedup = fixed(cd / dec);
#endif
  t.add({std::string("float -> ") + name, fixed(enc), cuda_enc, enc_speedup, fixed(enc / memcpy_ms)});
  t.add({std::string(name) + " -> float", fixed(dec), cuda_dec, dec_speedup, fixed(dec / memcpy_ms)});
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t(1) << 24;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--n") n = std::stoul(argv[i + 1]);
  }
  std::vector<float> x(n), copy(n);
  std::mt19937 g(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(g);
  const double memcpy_ms = best_ms([&] { std::memcpy(copy.data(), x.data(), n * sizeof(float)); });

  std::printf("%zu normally distributed floats; memcpy of the float array: %.2f ms\n", n, memcpy_ms);
  table t({"conversion", "precis ms", "CUDA host ms", "speedup vs CUDA", "time / memcpy"});
  run<precis::float16>("float16", x, memcpy_ms, t);
  run<precis::bfloat16>("bfloat16", x, memcpy_ms, t);
  run<precis::float8_e4m3>("float8_e4m3", x, memcpy_ms, t);
  run<precis::float8_e5m2>("float8_e5m2", x, memcpy_ms, t);
  t.print();
  if (auto path = csv_path(argc, argv); !path.empty()) t.write_csv(path);
}
