// host_tensor's storage: aligned to host_tensor_alignment (64) bytes whatever the element
// type and size, after a resize, in copies and in tensors made from expressions; the
// alias is what is_host_tensor_v recognises.
#include <precis/tensor/host_tensor.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace {

template <class T>
bool aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % precis::host_tensor_alignment == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("host tensors are aligned to 64 bytes", T, float, double, precis::bfloat16,
                   precis::float16, precis::float8_e4m3, std::int32_t) {
  static_assert(precis::host_tensor_alignment == 64);
  // Many live tensors of odd sizes: malloc gives such blocks 16-byte alignment only.
  std::vector<precis::host_tensor<T, 2>> live;
  for (std::size_t n = 1; n < 200; n += 7) {
    live.push_back(precis::host_tensor<T, 2>::from_shape({n, 3}));
    CHECK(aligned(live.back().data()));
  }
  auto big = precis::host_tensor<T, 2>::from_shape({1000, 1003});
  CHECK(aligned(big.data()));
  big.resize({17, 5});
  CHECK(aligned(big.data()));
  for (std::size_t i = 0; i < live[3].size(); ++i) live[3].data()[i] = T(float(i % 7));
  const precis::host_tensor<T, 2> copy = live[3];
  CHECK(aligned(copy.data()));
  CHECK(copy == live[3]);
}

TEST_CASE("expressions evaluate into aligned host tensors") {
  auto a = precis::host_tensor<float, 1>::from_shape({37});
  for (std::size_t i = 0; i < a.size(); ++i) a(i) = float(i);
  const precis::host_tensor<float, 1> b = a * 2.0F + 1.0F;
  CHECK(aligned(b.data()));
  CHECK(b(36) == 73.0F);
  static_assert(precis::is_host_tensor_v<precis::host_tensor<float, 3>>);
  static_assert(precis::is_host_tensor_v<const precis::host_tensor<precis::bfloat16, 1>&> == false);
  static_assert(precis::HostTensor<const precis::host_tensor<precis::bfloat16, 1>&>);
}
