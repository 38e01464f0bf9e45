// A hand-assembled model whose neighbouring layers store different types does not compile:
// the cast between them must be visible (nn::build inserts it). The compiler's note names
// both layers' tags and types (nn::edge_fits<edge_from, bfloat16, ..., edge_to, float, ...>).
#include <precis/precis.hpp>

struct edge_from : precis::layer<precis::op::matmul> {};
struct edge_to : precis::layer<precis::op::matmul> {};

int main() {
  using namespace precis;
  using from = nn::linear_layer<edge_from, presets::bf16_mixed, 2, cpu_context>;
  using to = nn::linear_layer<edge_to, presets::fp32, 2, cpu_context>;
  nn::sequence<from, to> model(from(nn::linear<edge_from>(4, 4)), to(nn::linear<edge_to>(4, 2)));
  (void)model;
}
