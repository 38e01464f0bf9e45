/// @file
/// Copies between models of one blueprint, on the host or the device, either way:
/// nn::copy_masters (the master weights) and nn::copy_state (every checkpoint field: the
/// masters and the layers' other state). `ctx` is the context of the device model where
/// there is one (a device model's header, precis/nn/cuda.hpp, comes first then), or any
/// cpu_context between host models.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/context.hpp>
#include <precis/nn/parameter.hpp>
#include <precis/scaling/checkpoint.hpp>

#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

/// Copies the master weights of model `from` into model `to` (models of one blueprint, on
/// the host or the device, either way) and refreshes `to`'s working copies; the layers'
/// other state (batch norm's running statistics, dropout's seed, float8 recipes) stays:
/// nn::copy_state copies both. Waits for the device. Throws precis::error, before changing
/// anything, when a parameter of `to` has no counterpart of its size in `from`.
template <class Ctx, class From, class To>
void copy_masters(Ctx& ctx, From& from, To& to) {
  std::map<std::string, std::vector<float>, std::less<>> values;
  from.for_each_parameter([&](const std::string& path, const auto& p) {
    values[path] = context_traits<typename From::context_type>::download(p.master());
  });
  to.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto it = values.find(path);
    if (it == values.end() || it->second.size() != p.size()) {
      throw error("precis::nn::copy_masters: " + path + " has no counterpart of " + std::to_string(p.size()) +
                  " values in the model copied from");
    }
  });
  to.for_each_parameter([&](const std::string& path, auto& p) {
    if constexpr (std::is_same_v<typename To::context_type, cpu_context>) {
      p.set(cpu_context{1}, values.find(path)->second);
    } else {
      p.set(ctx, values.find(path)->second);
    }
  });
}

/// Copies model `from`'s whole checkpoint state into model `to` (models of one blueprint, on
/// the host or the device, either way): the master weights as copy_masters copies them,
/// then every layer's other state -- batch norm's running statistics, dropout's seed and
/// call count, a float8 layer's recipes (scale, amax history) -- through the fields a
/// checkpoint holds, so that `to` evaluates and trains on as `from` would. A device model's
/// checkpoint goes through a host model, since save_checkpoint writes host models:
/// copy_state into a host model, the device optimizer's store() into a host optimizer, the
/// trainer's store_scaler(), then save_checkpoint; back with load_checkpoint, copy_state and
/// the optimizer's load(). Waits for the device. Throws precis::error, before changing
/// anything, when a parameter of `to` has no counterpart of its size in `from` or the two
/// models' layers hold other state fields.
template <class Ctx, class From, class To>
void copy_state(Ctx& ctx, From& from, To& to) {
  constexpr std::string_view kind = "nn::model state";
  const auto visit = [](auto& model, auto& archive) {
    model.for_each_layer([&](const std::string& path, auto& l) {
      l.visit_state(archive, path.empty() ? path : path + ".");
    });
  };
  precis::detail::checkpoint_writer fields, expected;
  visit(from, fields);
  visit(to, expected);  // a writer reads: `to` keeps its state
  if (fields.names() != expected.names()) {
    std::string missing;
    for (const auto& n : expected.names()) {
      if (!fields.names().contains(n)) missing += (missing.empty() ? "" : ", ") + n;
    }
    throw error("precis::nn::copy_state: the models' layers hold other state fields (" +
                (missing.empty() ? std::string("the model copied from has more") : "missing: " + missing) + ")");
  }
  copy_masters(ctx, from, to);
  try {
    const std::string bytes = precis::detail::framed_state(kind, fields);
    precis::detail::checkpoint_reader in(bytes, kind);
    visit(to, in);
    in.finish();
  } catch (const error& e) {
    throw error(std::string("precis::nn::copy_state: ") + e.what());
  }
  if (const std::string problem = to.validate(); !problem.empty()) {
    throw error("precis::nn::copy_state: " + problem);
  }
}

}  // namespace precis::nn
