/// @file
/// A model's weights from and to safetensors files (PyTorch's and Hugging Face's exchange format;
/// see precis/io/safetensors.hpp). Needs nlohmann/json: the CMake target precis::safetensors.
///
///     nn::load_safetensors(model, safetensors::file::read("vit.safetensors"), vit::torch_name);
///     nn::save_safetensors(model, "out.safetensors", vit::torch_name, safetensors::dtype::bf16);
///
/// The name map turns a parameter's path ("encoder.0.1.mlp.fc1.weight") into the file's
/// name for it ("blocks.0.fc1.weight"); by default the names are the paths. Shapes are
/// compared with their axes of size 1 left out (the data's order is the same), so PyTorch's
/// [1, 1, D] class token loads into a [D] parameter; anything else that differs is an error.
#pragma once

#include <precis/config.hpp>
#include <precis/io/safetensors.hpp>
#include <precis/nn/build.hpp>

#include <cstddef>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

/// The name map that keeps every parameter's path as its name.
struct same_names {
  /// `path`, unchanged.
  std::string operator()(std::string_view path) const { return std::string(path); }
};

/// How load_safetensors treats a file.
struct safetensors_load_options {
  /// Tensors of the file that no parameter takes are an error unless this is set (a file
  /// with an extra classifier, say).
  bool allow_unused = false;
};

namespace detail {

inline std::vector<std::size_t> without_unit_axes(std::span<const std::size_t> shape) {
  std::vector<std::size_t> out;
  for (auto s : shape) {
    if (s != 1) out.push_back(s);
  }
  return out;
}

}  // namespace detail

/// Sets every parameter of `m` from the tensor of `f` that `names` maps its path to
/// (converted exactly to float; then the working copies are refreshed on `ctx`). All or
/// nothing: when a tensor is missing, has another shape or a dtype that float does not hold
/// exactly, when two parameters map to one tensor, or (unless allowed) a tensor of the file
/// is left unused, precis::error lists every problem and no parameter is changed.
template <class Model, class Names = same_names>
void load_safetensors(context_ref_t<typename Model::context_type> ctx, Model& m, const safetensors::file& f,
                      Names&& names = {}, safetensors_load_options o = {}) {
  std::vector<std::string> problems;
  std::vector<std::vector<float>> values;
  std::set<std::string, std::less<>> used;
  std::map<std::string, std::string, std::less<>> taken_by;  // file name -> parameter path
  m.for_each_parameter([&](const std::string& path, const auto& p) {
    const std::string name = names(std::string_view(path));
    values.emplace_back();
    if (auto [it, fresh] = taken_by.emplace(name, path); !fresh) {
      problems.push_back("parameters " + it->second + " and " + path + " both map to \"" + name + "\"");
      return;
    }
    const safetensors::entry* e = f.find(name);
    if (e == nullptr) {
      problems.push_back("parameter " + path + ": the file has no tensor \"" + name + "\"");
      return;
    }
    used.insert(name);
    const auto& shape = p.master().shape();
    const std::vector<std::size_t> mine(shape.begin(), shape.end());
    if (detail::without_unit_axes(mine) != detail::without_unit_axes(e->shape)) {
      problems.push_back("parameter " + path + " has shape " + safetensors::shape_string(mine) + ", tensor \"" + name +
                         "\" has shape " + safetensors::shape_string(e->shape));
      return;
    }
    if (!safetensors::converts_to_float(e->type)) {
      problems.push_back("tensor \"" + name + "\" has dtype " + std::string(safetensors::name_of(e->type)) +
                         ", which does not convert exactly to float");
      return;
    }
    values.back() = f.floats(*e);
  });
  if (!o.allow_unused) {
    for (const auto& e : f.tensors()) {
      if (!used.count(e.name)) problems.push_back("tensor \"" + e.name + "\" is not used by any parameter");
    }
  }
  if (!problems.empty()) {
    std::string msg = "precis::nn::load_safetensors: " + f.source() + ": nothing was loaded; " +
                      std::to_string(problems.size()) + (problems.size() == 1 ? " problem" : " problems") + ":";
    const std::size_t shown = std::min<std::size_t>(problems.size(), 12);
    for (std::size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
    if (shown < problems.size()) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw error(msg);
  }
  std::size_t i = 0;
  m.for_each_parameter([&](const std::string&, auto& p) {
    using M = typename std::remove_cvref_t<decltype(p)>::master_type;
    const auto& v = values[i++];
    p.set(ctx, std::vector<M>(v.begin(), v.end()));
  });
}

/// load_safetensors for a model on the CPU.
template <class Model, class Names = same_names>
  requires std::is_same_v<typename Model::context_type, cpu_context>
void load_safetensors(Model& m, const safetensors::file& f, Names&& names = {}, safetensors_load_options o = {}) {
  load_safetensors(cpu_context{1}, m, f, std::forward<Names>(names), o);
}

/// Writes the master weights of `m` to `file` (atomically), each under the name `names`
/// gives its path, in the model's order, with the parameter's shape, as F32 or rounded
/// once (nearest-even) to `type` (F16, BF16, F8_E4M3, F8_E5M2), with `metadata`. Throws
/// precis::error when two parameters map to one name.
template <class Model, class Names = same_names>
void save_safetensors(const Model& m, const std::filesystem::path& file, Names&& names = {},
                      safetensors::dtype type = safetensors::dtype::f32,
                      const std::map<std::string, std::string, std::less<>>& metadata = {}) {
  std::vector<safetensors::tensor_data> out;
  m.for_each_parameter([&](const std::string& path, const auto& p) {
    static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(p)>::master_type, float>,
                  "precis: nn models keep float master weights");
    const auto& s = p.master().shape();
    std::vector<std::size_t> shape(s.begin(), s.end());
    const auto master = context_traits<typename Model::context_type>::download(p.master());
    const std::vector<float>& v = master;
    auto as = [&]<class T>(std::type_identity<T>) {
      std::vector<T> r(v.size());
      for (std::size_t k = 0; k < v.size(); ++k) r[k] = round_to<T>(v[k]);
      return safetensors::tensor(names(std::string_view(path)), std::move(shape), r);
    };
    switch (type) {
      case safetensors::dtype::f32: out.push_back(safetensors::tensor(names(std::string_view(path)), std::move(shape), v)); break;
      case safetensors::dtype::f16: out.push_back(as(std::type_identity<float16>{})); break;
      case safetensors::dtype::bf16: out.push_back(as(std::type_identity<bfloat16>{})); break;
      case safetensors::dtype::f8_e4m3: out.push_back(as(std::type_identity<float8_e4m3>{})); break;
      case safetensors::dtype::f8_e5m2: out.push_back(as(std::type_identity<float8_e5m2>{})); break;
      default:
        throw error("precis::nn::save_safetensors: weights are written as F32, F16, BF16, F8_E4M3 or F8_E5M2, not " +
                    std::string(safetensors::name_of(type)));
    }
  });
  safetensors::write(file, out, metadata);
}

}  // namespace precis::nn
