// Compile-only tests of policies, presets, the rule set and policy maps: compiling this
// file is passing. Negative cases are concepts that must not hold.
#include <precis/policy/policy.hpp>

#include <type_traits>

namespace precis_static_test {

using namespace precis;
using std::is_same_v;

// Width comparisons and promotion.
static_assert(at_least_as_wide_v<float, bfloat16> && at_least_as_wide_v<float, float16>);
static_assert(!at_least_as_wide_v<float16, bfloat16> && !at_least_as_wide_v<bfloat16, float16>);
static_assert(at_least_as_wide_v<float16, float8_e4m3> && !at_least_as_wide_v<float16, float8_e5m2> == false);
static_assert(!at_least_as_wide_v<tfloat32, float> && at_least_as_wide_v<float, tfloat32>);
static_assert(is_same_v<promote_t<float16, bfloat16>, float>);
static_assert(is_same_v<promote_t<float16, float>, float>);
static_assert(is_same_v<promote_t<float8_e4m3, float16>, float16>);
static_assert(is_same_v<promote_t<float8_e4m3, float8_e5m2>, float>);
static_assert(is_same_v<promote_t<bfloat16, double, float16>, double>);
static_assert(is_same_v<promote_t<bfloat16>, bfloat16>);

// Loss-scaling need follows the gradient type's range.
static_assert(needs_loss_scaling_v<presets::fp16_mixed>);
static_assert(needs_loss_scaling_v<presets::fp8_hybrid>);
static_assert(!needs_loss_scaling_v<presets::bf16_mixed> && !needs_loss_scaling_v<presets::fp32>);
static_assert(!needs_loss_scaling_v<presets::bf16_pure> && !needs_loss_scaling_v<presets::tf32>);
static_assert(needs_loss_scaling<presets::fp16_mixed>::value);

// Every preset is a Policy and passes the policy rules; bf16_pure only through its waiver.
static_assert(Policy<presets::fp32> && Policy<presets::tf32> && Policy<presets::bf16_mixed> &&
              Policy<presets::fp16_mixed> && Policy<presets::bf16_pure> &&
              Policy<presets::fp8_hybrid>);
static_assert(check_policy<presets::fp32>() && check_policy<presets::tf32>() &&
              check_policy<presets::bf16_mixed>() && check_policy<presets::fp16_mixed>() &&
              check_policy<presets::bf16_pure>() && check_policy<presets::fp8_hybrid>());
static_assert(!master_is_fp32<presets::bf16_pure> && waives_v<presets::bf16_pure, rule::narrow_master>);
static_assert(!Policy<int> && !Policy<float16>);

// The named concepts reject the failure modes.
static_assert(!accumulates_wide_enough<policy<float16, float16, float16>> == false);
static_assert(!accumulates_wide_enough<policy<float16, float16, bfloat16>>);
static_assert(!accumulates_wide_enough<policy<float, float, bfloat16>>);
static_assert(!master_is_fp32<policy<float16, float16, float, float16>>);
static_assert(!fp8_is_scaled<policy<float8_e4m3, bfloat16, float>>);
static_assert(fp8_is_scaled<policy<float8_e4m3, bfloat16, float, float, float8_e5m2, recipe::current>>);
static_assert(!forward_not_e5m2<policy<float8_e5m2, bfloat16, float, float, float8_e5m2, recipe::delayed>>);
static_assert(!computes_in_fp32<presets::fp16_mixed> && computes_in_fp32<presets::fp32>);

// unsafe keeps the base policy's types, adds its waivers, and nests.
using twice = unsafe<unsafe<presets::fp16_mixed, rule::unscaled_gradients>, rule::fp32_operation>;
static_assert(is_same_v<twice::storage_type, float16>);
static_assert(is_same_v<twice::waived_rules, rule_list<rule::unscaled_gradients, rule::fp32_operation>>);
static_assert(waives_v<twice, rule::fp32_operation> && !waives_v<twice, rule::narrow_master>);

// Layers and their declared properties.
struct encoder_mlp : layer<op::matmul, max_abs<200000>, gemm_shape<128, 256, 64>> {};
struct attention_softmax : layer<op::softmax> {};
struct head_loss : layer<op::loss> {
  static constexpr std::string_view name = "head_loss";
};
struct classifier : layer<op::matmul, gemm_shape<32, 10, 64>> {};
struct patch_conv : layer<op::conv> {};
struct norm : layer<op::layer_norm> {};
struct gelu : layer<op::elementwise> {};
static_assert(Layer<encoder_mlp> && Layer<head_loss> && !Layer<int> && !Layer<op::matmul>);
static_assert(activation_bound_t<encoder_mlp>::value == 2.0e5);
static_assert(std::is_void_v<activation_bound_t<attention_softmax>>);
static_assert(gemm_shape_t<encoder_mlp>::n == 256 && std::is_void_v<gemm_shape_t<head_loss>>);

// The rule set on a default policy.
static_assert(is_same_v<apply_rules_t<op::matmul, presets::fp16_mixed>, presets::fp16_mixed>);
static_assert(is_same_v<apply_rules_t<op::softmax, presets::fp16_mixed>, policy<float16, float, float, float>>);
static_assert(is_same_v<apply_rules_t<op::elementwise, presets::bf16_mixed>, presets::bf16_mixed>);
static_assert(is_same_v<apply_rules_t<op::loss, presets::tf32>, presets::fp32>);
static_assert(is_same_v<apply_rules_t<op::matmul, presets::tf32>, presets::tf32>);
static_assert(is_same_v<apply_rules_t<op::layer_norm, presets::fp8_hybrid>,
                        policy<bfloat16, float, float, float, bfloat16, recipe::delayed>>);
static_assert(is_same_v<apply_rules_t<op::elementwise, presets::fp8_hybrid>,
                        policy<bfloat16, bfloat16, float, float, bfloat16, recipe::delayed>>);
static_assert(is_same_v<apply_rules_t<op::conv, presets::fp8_hybrid>, presets::fp8_hybrid>);
static_assert(is_same_v<apply_rules_t<op::reduction, presets::bf16_pure>,
                        unsafe<policy<bfloat16, float, float, bfloat16, bfloat16, recipe::none,
                                      products::hardware>,
                               rule::narrow_master>>);
// The products choice is kept by every kind (it only matters to matmul and conv).
static_assert(is_same_v<apply_rules_t<op::softmax, presets::bf16_exact>::products_type, products::exact>);
static_assert(is_same_v<apply_rules_t<op::conv, presets::bf16_mixed>::products_type, products::hardware>);
// fp16_hardware is fp16_mixed but for its products, and the rules treat both alike.
static_assert(is_same_v<apply_rules_t<op::matmul, presets::fp16_hardware>::products_type,
                        products::hardware>);
static_assert(is_same_v<apply_rules_t<op::softmax, presets::fp16_hardware>::compute_type,
                        apply_rules_t<op::softmax, presets::fp16_mixed>::compute_type>);
static_assert(is_same_v<apply_rules_t<op::loss, presets::fp16_hardware>::accumulate_type, float>);
static_assert(!Policy<policy<float, float, float, float, float, recipe::none, int>>);
// Not promoted when taken as an explicit override.
static_assert(is_same_v<apply_rules_t<op::softmax, presets::fp16_mixed, false>, presets::fp16_mixed>);

// Map shapes. Default only:
constexpr auto only_default = make_policy_map(presets::bf16_mixed{});
static_assert(is_same_v<policy_for_t<encoder_mlp, decltype(only_default)>, presets::bf16_mixed>);
static_assert(is_same_v<policy_for_t<attention_softmax, decltype(only_default)>,
                        policy<bfloat16, float, float, float, bfloat16, recipe::none, products::hardware>>);
static_assert(resolution<encoder_mlp, decltype(only_default)>::source == policy_source::default_policy);

// Operation-kind overrides only:
constexpr auto by_op = make_policy_map(presets::fp16_mixed{}, for_op<op::matmul>(presets::bf16_mixed{}),
                                       for_op<op::loss>(presets::fp32{}));
static_assert(is_same_v<policy_for_t<classifier, decltype(by_op)>, presets::bf16_mixed>);
static_assert(is_same_v<policy_for_t<head_loss, decltype(by_op)>, presets::fp32>);
static_assert(is_same_v<policy_for_t<norm, decltype(by_op)>, policy<float16, float, float, float>>);
static_assert(is_same_v<policy_for_t<gelu, decltype(by_op)>, presets::fp16_mixed>);
static_assert(resolution<head_loss, decltype(by_op)>::source == policy_source::op_override);

// Layer overrides only:
constexpr auto by_layer = make_policy_map(presets::fp16_mixed{}, for_layer<encoder_mlp>(presets::bf16_mixed{}));
static_assert(is_same_v<policy_for_t<encoder_mlp, decltype(by_layer)>, presets::bf16_mixed>);
static_assert(is_same_v<policy_for_t<classifier, decltype(by_layer)>, presets::fp16_mixed>);

// Both, with conflicting entries: the layer override wins over the operation kind's.
constexpr auto both = make_policy_map(presets::fp32{}, for_op<op::matmul>(presets::fp16_mixed{}),
                                      for_layer<encoder_mlp>(presets::bf16_mixed{}),
                                      for_layer<classifier>(presets::tf32{}));
static_assert(is_same_v<policy_for_t<encoder_mlp, decltype(both)>, presets::bf16_mixed>);
static_assert(is_same_v<policy_for_t<classifier, decltype(both)>, presets::tf32>);
static_assert(is_same_v<policy_for_t<patch_conv, decltype(both)>, presets::fp32>);
static_assert(resolution<encoder_mlp, decltype(both)>::source == policy_source::layer_override);
static_assert(is_same_v<decltype(policy_for<classifier>(both)), presets::tf32>);

// An explicit fp32-rule override that is wide enough, and a waived narrow one, compile.
constexpr auto waived = make_policy_map(
    presets::fp16_mixed{}, for_op<op::softmax>(presets::fp32{}),
    for_layer<head_loss>(unsafe<presets::fp16_mixed, rule::fp32_operation>{}));
static_assert(is_same_v<policy_for_t<head_loss, decltype(waived)>,
                        unsafe<presets::fp16_mixed, rule::fp32_operation>>);

// float8: matrix products keep it, the rest store the compute type; aligned GEMMs pass.
struct fp8_gemm : layer<op::matmul, gemm_shape<64, 128, 256>> {};
constexpr auto fp8 = make_policy_map(presets::fp8_hybrid{});
static_assert(is_same_v<policy_for_t<fp8_gemm, decltype(fp8)>, presets::fp8_hybrid>);
static_assert(is_same_v<typename policy_for_t<norm, decltype(fp8)>::storage_type, bfloat16>);

// A bf16 layer holds the ViT-H activation bound that float16 cannot.
constexpr auto vit = make_policy_map(presets::fp16_mixed{}, for_layer<encoder_mlp>(presets::bf16_mixed{}));
static_assert(is_same_v<policy_for_t<encoder_mlp, decltype(vit)>, presets::bf16_mixed>);
static_assert(!holds_activation_bound<presets::fp16_mixed, max_abs<200000>>);
static_assert(holds_activation_bound<presets::fp16_mixed, max_abs<60000>>);
// Scaled float8 is scaled into range per tensor; the bound does not apply to it.
static_assert(holds_activation_bound<presets::fp8_hybrid, max_abs<200000>>);
static_assert(!fp8_gemm_aligned<presets::fp8_hybrid, op::matmul, gemm_shape<64, 100, 64>>);
static_assert(fp8_gemm_aligned<presets::bf16_mixed, op::matmul, gemm_shape<64, 100, 64>>);

}  // namespace precis_static_test
