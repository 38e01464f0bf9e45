/// @file
/// How found-inf flags and amax values agree across processes.
#pragma once

#include <span>
#include <type_traits>

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
  /// Returns `local_found_inf`: this process is the whole run.
  constexpr bool any(bool local_found_inf) const { return local_found_inf; }
  /// Leaves the values as they are: they are already the maxima.
  constexpr void max(std::span<float>) const {}
};

static_assert(reducer<single_process>);

/// A reducer chosen at run time: a non-owning reference to another reducer (which must
/// outlive its use), or, default-constructed, one process. The float8 recipes inside nn's
/// layers hold one, so that a data-parallel run can point them all at its reducer
/// (nn::model::set_amax_reducer) without the recipes' types depending on it.
class reducer_ref {
 public:
  reducer_ref() = default;
  /// Refers to `r`, which must outlive every use of this reference.
  template <reducer R>
  requires(!std::is_same_v<std::remove_cv_t<R>, reducer_ref>) explicit reducer_ref(R& r)
      : self_(&r),
        any_([](void* s, bool f) { return bool(static_cast<R*>(s)->any(f)); }),
        max_([](void* s, std::span<float> v) { static_cast<R*>(s)->max(v); }) {}

  /// The logical OR of `local_found_inf` over processes, through the referenced reducer
  /// (`local_found_inf` itself when none is referenced).
  bool any(bool local_found_inf) const {
    return self_ != nullptr ? any_(self_, local_found_inf) : local_found_inf;
  }
  /// Replaces `values` by their elementwise maxima over processes, through the referenced
  /// reducer (unchanged when none is referenced).
  void max(std::span<float> values) const {
    if (self_ != nullptr) max_(self_, values);
  }
  /// True when this refers to another reducer (not the single-process default).
  bool bound() const { return self_ != nullptr; }

 private:
  void* self_ = nullptr;
  bool (*any_)(void*, bool) = nullptr;
  void (*max_)(void*, std::span<float>) = nullptr;
};

static_assert(reducer<reducer_ref>);

}  // namespace precis
