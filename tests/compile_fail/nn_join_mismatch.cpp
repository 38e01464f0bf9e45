// Parallel branches joined by an add must end in the same storage type: hand-assembled
// branches that do not fail (nn::build inserts nn::cast_out).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  using a = nn::linear_layer<nn::tags::linear, presets::fp32, 2, cpu_context>;
  using b = nn::cast_in<nn::cast_layer<float, bfloat16, float, bfloat16, 2, cpu_context>,
                        nn::linear_layer<nn::tags::linear, presets::bf16_mixed, 2, cpu_context>>;
  using joined = nn::branches<nn::join_kind::add, false, a, b>;
  joined* model = nullptr;
  (void)model->output_shape({1, 4}, "");
}
