// An nn::micro_batch does not bind a temporary: it keeps references, which would dangle
// once the full expression ends.
#include <precis/precis.hpp>

#include <cstdint>

int main() {
  using namespace precis;
  host_tensor<std::int32_t, 1> y({16});
  const nn::micro_batch<host_tensor<float, 2>, host_tensor<std::int32_t, 1>> b{host_tensor<float, 2>({16, 4}), y};
  (void)b;
}
