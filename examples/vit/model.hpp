// The Vision Transformer of the examples, written once as a blueprint with layer tags.
//
//     vit::blueprint<Depth>(config)            the model every map builds
//     vit::blueprint<Depth, vit::fc2_vit_h>(c) the same, its MLP output declaring ViT-H's range
//
// [N, C, H, W] images -> patchify (p x p patches) + linear patch embedding -> class token ->
// learned position embedding -> Depth pre-norm encoder blocks -> layer norm -> the class
// token -> linear head. A block is x + attention(layer_norm(x)), then
// x + fc2(gelu(fc1(layer_norm(x)))) with fc1 widening 4 times. Every layer a map may want to
// treat apart has a tag of its own; paths name the blocks ("encoder.2.1.mlp.fc2").
#pragma once

#include <precis/precis.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace vit {

using namespace precis;

// ---- layer tags: what a policy map can name ----

struct patch_embed : layer<op::matmul> {
  static constexpr std::string_view name = "patch_embed";
};
struct norm1 : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm1";
};
struct norm2 : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm2";
};
struct qkv : layer<op::matmul> {
  static constexpr std::string_view name = "qkv";
};
/// The attention scores q k^T / sqrt(d).
struct scores : layer<op::matmul> {
  static constexpr std::string_view name = "scores";
};
struct attn_softmax : layer<op::softmax> {
  static constexpr std::string_view name = "softmax";
};
/// The attention-weighted values.
struct context : layer<op::matmul> {
  static constexpr std::string_view name = "context";
};
struct attn_out : layer<op::matmul> {
  static constexpr std::string_view name = "proj";
};
struct mlp_fc1 : layer<op::matmul> {
  static constexpr std::string_view name = "fc1";
};
/// The second MLP projection of a model whose activations were not measured.
struct mlp_fc2 : layer<op::matmul> {
  static constexpr std::string_view name = "fc2";
};
/// The second MLP projection at ViT-H/16 size: its outputs were measured beyond float16's
/// 65504 (DINOv3's ViT-H/16 produced NaN logits in float16 from them), declared so that
/// rule d keeps the layer out of float16.
struct fc2_vit_h : layer<op::matmul, max_abs<200000>> {
  static constexpr std::string_view name = "fc2";
};
struct head : layer<op::matmul> {
  static constexpr std::string_view name = "head";
};

/// The sizes of a ViT (the depth is the blueprint's template argument: the blocks are one
/// array of one type).
struct config {
  std::size_t image = 28, patch = 4, channels = 1, width = 64, heads = 4, classes = 10;
  /// Patch tokens plus the class token.
  std::size_t tokens() const { return (image / patch) * (image / patch) + 1; }
  /// Throws precis::error unless the sizes make a model.
  void validate() const {
    auto bad = [](const std::string& what) { throw error("vit::config: " + what); };
    if (image == 0 || patch == 0 || channels == 0 || width == 0 || heads == 0 || classes == 0) {
      bad("every size must be positive");
    }
    if (image % patch != 0) bad("the patch size " + std::to_string(patch) + " does not divide the image size " + std::to_string(image));
    if (width % heads != 0) bad("the width " + std::to_string(width) + " is not a multiple of the heads " + std::to_string(heads));
  }
};

/// A pre-norm encoder block of width d: attention and a GELU MLP (ratio 4), each in a
/// residual.
template <class Fc2 = mlp_fc2>
auto block(std::size_t d, std::size_t heads) {
  return nn::seq(
      nn::residual(nn::seq(nn::layer_norm<norm1>(d),
                           nn::named("attn", nn::attention<qkv, scores, attn_softmax, context, attn_out>(d, heads)))),
      nn::residual(nn::seq(nn::layer_norm<norm2>(d),
                           nn::named("mlp", nn::seq(nn::linear<mlp_fc1>(d, 4 * d), nn::gelu(), nn::linear<Fc2>(4 * d, d))))));
}

/// The whole model on [N, C, H, W] images, giving [N, classes] logits.
template <std::size_t Depth, class Fc2 = mlp_fc2>
auto blueprint(const config& c) {
  return nn::seq(nn::patchify(c.patch), nn::linear<patch_embed>(c.channels * c.patch * c.patch, c.width),
                 nn::class_token(c.width), nn::position_embedding(c.tokens(), c.width),
                 nn::named("encoder", nn::repeat<Depth>(block<Fc2>(c.width, c.heads))), nn::layer_norm(c.width),
                 nn::select_token(0), nn::linear<head>(c.width, c.classes));
}

/// The name PyTorch gives the parameter at precis path `path` in the same model written as
/// bench/vit/torch_reference.py's ViT module (its state_dict and safetensors files):
/// "encoder.1.0.attn.qkv.weight" -> "blocks.1.qkv.weight", "2.token" -> "cls", layer norms'
/// gamma and beta -> weight and bias. For nn::load_safetensors and nn::save_safetensors.
/// Throws precis::error for a path the blueprint does not have.
inline std::string torch_name(std::string_view path) {
  std::vector<std::string_view> parts;
  for (std::size_t at = 0;;) {
    const auto dot = path.find('.', at);
    parts.push_back(path.substr(at, dot - at));
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  auto affine = [](std::string_view p) -> std::string_view {
    return p == "gamma" ? "weight" : p == "beta" ? "bias" : p;
  };
  const std::string_view last = parts.back();
  auto cat = [](std::initializer_list<std::string_view> ps) {
    std::string out;
    for (auto p : ps) {
      if (!out.empty()) out += '.';
      out.append(p);
    }
    return out;
  };
  if (parts.size() == 2 && (parts[0] == "patch_embed" || parts[0] == "head")) return std::string(path);
  if (path == "2.token") return "cls";
  if (path == "3.table") return "pos";
  if (parts.size() == 2 && parts[0] == "5" && (last == "gamma" || last == "beta")) return cat({"norm", affine(last)});
  if (parts.size() >= 5 && parts[0] == "encoder") {
    const std::string_view block = parts[1], half = parts[2];
    if (half == "0" && parts.size() == 5 && parts[3] == "norm1") return cat({"blocks", block, "norm1", affine(last)});
    if (half == "0" && parts.size() == 6 && parts[3] == "attn" && parts[4] == "qkv") return cat({"blocks", block, "qkv", last});
    if (half == "0" && parts.size() == 6 && parts[3] == "attn" && parts[4] == "out") return cat({"blocks", block, "proj", last});
    if (half == "1" && parts.size() == 5 && parts[3] == "norm2") return cat({"blocks", block, "norm2", affine(last)});
    if (half == "1" && parts.size() == 6 && parts[3] == "mlp") return cat({"blocks", block, parts[4], last});
  }
  throw error("vit::torch_name: the ViT has no parameter at path \"" + std::string(path) + "\"");
}

/// ViT-H/16 on 224 x 224 RGB images, 1000 classes (width 1280, 16 heads; 32 blocks).
inline constexpr config vit_h16{.image = 224, .patch = 16, .channels = 3, .width = 1280, .heads = 16, .classes = 1000};

/// float8 the way Transformer Engine uses it: every linear layer's products take float8_e4m3
/// inputs forward and float8_e5m2 output gradients backward, each tensor with its own
/// delayed-scaling recipe; activations between layers are bfloat16. Attention's scores and
/// context products (activations by activations) and the 10-way head stay in bfloat16.
/// float8 gradients need a loss scaler by rule b. The same map on the CPU and the GPU.
using fp8_map = decltype(precis::make_policy_map(precis::presets::fp8_hybrid{},
                                                 precis::for_layer<scores>(precis::presets::bf16_mixed{}),
                                                 precis::for_layer<context>(precis::presets::bf16_mixed{}),
                                                 precis::for_layer<head>(precis::presets::bf16_mixed{})));

}  // namespace vit
