// Attention's scores and context products multiply activations by activations and keep
// 16- or 32-bit inputs: an attention whose scores tag resolves to fp8_hybrid does not
// compile (its projections may be float8).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 3>(presets::fp8_hybrid{}, nn::attention(64, 4));
  (void)model;
}
