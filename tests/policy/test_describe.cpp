// describe: the table of resolved policies, checked for a sample map.
#include <precis/policy/policy.hpp>

#include <doctest/doctest.h>

#include <string>

namespace sample {

using namespace precis;

struct encoder_mlp : layer<op::matmul, max_abs<200000>> {
  static constexpr std::string_view name = "encoder_mlp";
};
struct scores_softmax : layer<op::softmax> {
  static constexpr std::string_view name = "scores_softmax";
};
struct classifier : layer<op::matmul, gemm_shape<32, 10, 64>> {
  static constexpr std::string_view name = "classifier";
};
struct ce_loss : layer<op::loss> {};  // unnamed: describe prints the type's name

}  // namespace sample

using namespace precis;
using namespace sample;

TEST_CASE("describe prints each layer's resolved policy") {
  constexpr auto policies = make_policy_map(
      presets::fp16_mixed{}, for_op<op::matmul>(presets::bf16_mixed{}),
      for_layer<encoder_mlp>(presets::bf16_pure{}));
  const std::string table = describe<encoder_mlp, scores_softmax, classifier, ce_loss>(policies);
  const std::string expected =
      "layer            op       storage   compute   accumulate  master    gradient  fp8   from     waived         notes\n"
      "encoder_mlp      matmul   bfloat16  bfloat16  float       bfloat16  bfloat16  none  layer    narrow_master  hardware products; activations up to 200000\n"
      "scores_softmax   softmax  float16   float     float       float     float16   none  default  -              fp32 by rule\n"
      "classifier       matmul   bfloat16  bfloat16  float       float     bfloat16  none  op       -              hardware products; performance: M, N, K not all multiples of 8 (tensor cores run slower)\n"
      "sample::ce_loss  loss     float16   float     float       float     float16   none  default  -              fp32 by rule\n";
  CHECK(table == expected);
}

TEST_CASE("describe_policy prints one policy") {
  CHECK(describe_policy<presets::fp8_hybrid>() ==
        "storage=float8_e4m3 compute=bfloat16 accumulate=float master=float "
        "gradient=float8_e5m2 fp8=delayed products=exact waived=-");
  CHECK(describe_policy<presets::bf16_pure>().ends_with("products=hardware waived=narrow_master"));
  CHECK(describe_policy<presets::bf16_exact>().find("products=exact") != std::string::npos);
  CHECK(describe_policy<presets::fp16_hardware>() ==
        "storage=float16 compute=float16 accumulate=float master=float gradient=float16 fp8=none "
        "products=hardware waived=-");
}
