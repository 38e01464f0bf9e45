// precis/scaling/reducer.hpp: how found-inf flags and amax values agree across processes.
#pragma once

#include <span>

namespace precis {

/// The reduction customization point of the scalers. A reducer combines a value computed
/// by this process with the same value from every other process, so that all processes
/// skip the same steps and use the same float8 scales:
///
///     struct my_nccl_reducer {
///       bool any(bool local_found_inf);            // logical OR over processes
///       void max(std::span<float> local_amaxes);   // elementwise max over processes, in place
///     };
template <class R>
concept reducer = requires(R& r, bool flag, std::span<float> values) {
  { r.any(flag) } -> std::convertible_to<bool>;
  r.max(values);
};

/// One process: the values are already global.
struct single_process {
  constexpr bool any(bool local_found_inf) const { return local_found_inf; }
  constexpr void max(std::span<float>) const {}
};

static_assert(reducer<single_process>);

}  // namespace precis
