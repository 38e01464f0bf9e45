/// @file
/// Data-parallel training across processes with MPI. Link precis::mpi (precis + MPI's C bindings).
///
///     MPI_Init(&argc, &argv);
///     precis::mpi_reducer<> reducer;                      // MPI_COMM_WORLD, float on the wire
///     precis::basic_dynamic_scaler<precis::mpi_reducer<>> scaler({}, reducer);
///     precis::broadcast_parameters(model, reducer, ctx);  // rank 0's initial weights
///     model.set_amax_reducer(scaler.reducer_object());   // float8 recipes: the same amaxes
///     auto [first, last] = precis::shard(batch, reducer.rank(), reducer.size());
///     nn::trainer tr(model, loss, opt, scaler);            // averages gradients every step
///
/// The scalers take a reducer (concept precis::reducer): with mpi_reducer every process
/// skips the same steps (one process's infinity means all skip); a model's float8 recipes
/// use the same amaxes once pointed at it (nn::model::set_amax_reducer). nn::trainer finds `average`
/// on its scaler's reducer and averages the gradients over the processes once per optimizer step,
/// after the micro-batches and before unscaling, in buckets, so every process steps with the same
/// gradients and keeps the same weights. Every MPI call is checked: the communicator's error handler
/// is set to return errors, and a failure throws precis::error naming the call and MPI's message.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/scaling/gradients.hpp>
#include <precis/scaling/reducer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

namespace detail {

/// Throws precis::error naming `call` and MPI's message for `rc` unless it is MPI_SUCCESS.
inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw error(std::string("precis::mpi_reducer: ") + call + " failed: " +
              (len > 0 ? std::string(text, std::size_t(len)) : "error code " + std::to_string(rc)));
}

/// The MPI reduction for bfloat16 on the wire: each pair added in float and rounded once to
/// bfloat16 (as a bfloat16 all-reduce does), element by element.
inline void mpi_bfloat16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bfloat16*>(in);
  auto* b = static_cast<bfloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bfloat16(float(a[i]) + float(b[i]));
}

}  // namespace detail

/// The reducer of a data-parallel run over an MPI communicator (concept precis::reducer,
/// plus the gradient average nn::trainer uses). `Wire` is what gradients travel as: float
/// (the default; the average is exact up to the float sums) or precis::bfloat16 (half the
/// bytes; each process's gradients rounded to bfloat16, each partial sum rounded to
/// bfloat16, the average then formed in float). Found-inf flags and amax values always
/// travel exactly. Copies share the communicator; the communicator stays the caller's.
template <class Wire = float>
class mpi_reducer {
  static_assert(std::is_same_v<Wire, float> || std::is_same_v<Wire, bfloat16>,
                "precis: mpi_reducer sends gradients as float or precis::bfloat16");

 public:
  /// `comm` must be a valid communicator of an initialised MPI; its error handler is set to
  /// MPI_ERRORS_RETURN (so failures reach precis as errors, not aborts). `bucket_values`:
  /// gradient values per all-reduce call (large models make few calls, not one per tensor).
  explicit mpi_reducer(MPI_Comm comm, std::size_t bucket_values = std::size_t(1) << 20)
      : comm_(comm), bucket_values_(bucket_values) {
    int initialised = 0;
    detail::mpi_check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised)
      throw error("precis::mpi_reducer: MPI is not initialised (call MPI_Init first)");
    if (comm == MPI_COMM_NULL)
      throw error("precis::mpi_reducer: the communicator is MPI_COMM_NULL");
    if (bucket_values == 0) throw error("precis::mpi_reducer: bucket_values must be positive");
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    if constexpr (std::is_same_v<Wire, bfloat16>) {
      MPI_Op op = MPI_OP_NULL;
      detail::mpi_check(MPI_Op_create(&detail::mpi_bfloat16_sum, 1, &op), "MPI_Op_create");
      sum_ = std::shared_ptr<MPI_Op>(new MPI_Op(op), [](MPI_Op* p) {
        int finalised = 1;
        if (MPI_Finalized(&finalised) == MPI_SUCCESS && !finalised) MPI_Op_free(p);
        delete p;
      });
    }
  }

  /// MPI_COMM_WORLD (implicit, so that a scaler's defaulted reducer argument works).
  mpi_reducer() : mpi_reducer(MPI_COMM_WORLD) {}

  /// This process's rank in the communicator.
  int rank() const { return rank_; }
  /// The number of processes in the communicator.
  int size() const { return size_; }
  /// The communicator it reduces over (still the caller's).
  MPI_Comm communicator() const { return comm_; }

  /// Logical OR of the flag over the processes.
  bool any(bool local_found_inf) const {
    int in = local_found_inf ? 1 : 0, out = 0;
    detail::mpi_check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, comm_), "MPI_Allreduce");
    return out != 0;
  }

  /// Elementwise maximum over the processes, in place (the float8 recipes' amaxes).
  void max(std::span<float> values) const {
    if (values.empty()) return;
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_FLOAT,
                                    MPI_MAX, comm_),
                      "MPI_Allreduce");
  }

  /// Replaces every gradient by its mean over the processes: the values of all tensors are
  /// packed into buckets of `bucket_values`, each all-reduced in one call (the same order on
  /// every process, so every process gets the same bits), then divided by the process
  /// count and rounded once to the tensor's type. Float, bfloat16 and float16 tensors.
  template <gradients G>
  void average(G& grads) {
    std::size_t total = 0;
    gradient_access<G>::for_each(grads, [&](auto span) { total += span.size(); });
    bucket_.resize(std::min(total, bucket_values_));
    wire_.resize(std::is_same_v<Wire, float> ? 0 : bucket_.size());
    // Walks the tensors in order, filling a bucket, reducing it when full and writing the
    // means back, each piece in its tensor's type.
    struct piece {
      void* data;
      std::size_t offset, count;
      void (*write)(const float*, void*, std::size_t);
    };
    std::vector<piece> pieces;
    std::size_t used = 0;
    const auto flush = [&] {
      if (used == 0) return;
      reduce_bucket(used);
      const float inv = 1.0F / float(size_);
      for (std::size_t i = 0; i < used; ++i) bucket_[i] *= inv;
      for (const auto& p : pieces) p.write(bucket_.data() + p.offset, p.data, p.count);
      pieces.clear();
      used = 0;
    };
    gradient_access<G>::for_each(grads, [&](auto span) {
      using T = typename decltype(span)::element_type;
      std::size_t done = 0;
      while (done < span.size()) {
        const std::size_t n = std::min(span.size() - done, bucket_.size() - used);
        const auto part = span.subspan(done, n);
        if constexpr (std::is_same_v<T, float>) {
          std::copy(part.begin(), part.end(), bucket_.begin() + std::ptrdiff_t(used));
        } else {
          precis::convert(std::span<const T>(part), std::span<float>(bucket_.data() + used, n));
        }
        pieces.push_back({static_cast<void*>(part.data()), used, n, &write_back<T>});
        used += n;
        done += n;
        if (used == bucket_.size()) flush();
      }
    });
    flush();
  }

  /// Sends `values` from `root` to every process (in place).
  void broadcast(std::span<float> values, int root = 0) const {
    detail::mpi_check(MPI_Bcast(values.data(), count_of(values.size()), MPI_FLOAT, root, comm_),
                      "MPI_Bcast");
  }

  /// Gradient bytes this process has handed to the all-reduce so far (the wire format's).
  std::uint64_t gradient_bytes() const { return bytes_; }

 private:
  static int count_of(std::size_t n) {
    if (n > std::size_t(std::numeric_limits<int>::max())) {
      throw error("precis::mpi_reducer: " + std::to_string(n) +
                  " values in one call exceed MPI's int count");
    }
    return int(n);
  }

  /// Writes n means to a gradient tensor of type T, each rounded once.
  template <class T>
  static void write_back(const float* means, void* out, std::size_t n) {
    if constexpr (std::is_same_v<T, float>) {
      std::copy(means, means + n, static_cast<float*>(out));
    } else {
      precis::convert(std::span<const float>(means, n), std::span<T>(static_cast<T*>(out), n));
    }
  }

  void reduce_bucket(std::size_t n) {
    if constexpr (std::is_same_v<Wire, float>) {
      detail::mpi_check(
          MPI_Allreduce(MPI_IN_PLACE, bucket_.data(), count_of(n), MPI_FLOAT, MPI_SUM, comm_),
          "MPI_Allreduce");
      bytes_ += n * sizeof(float);
    } else {
      precis::convert(std::span<const float>(bucket_.data(), n),
                      std::span<bfloat16>(wire_.data(), n));
      detail::mpi_check(
          MPI_Allreduce(MPI_IN_PLACE, wire_.data(), count_of(n), MPI_UINT16_T, *sum_, comm_),
          "MPI_Allreduce");
      precis::convert(std::span<const bfloat16>(wire_.data(), n),
                      std::span<float>(bucket_.data(), n));
      bytes_ += n * sizeof(bfloat16);
    }
  }

  MPI_Comm comm_;
  std::size_t bucket_values_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<MPI_Op> sum_;
  std::vector<float> bucket_;
  std::vector<bfloat16> wire_;
  std::uint64_t bytes_ = 0;
};

static_assert(reducer<mpi_reducer<>>);
static_assert(reducer<mpi_reducer<bfloat16>>);

/// Rank 0's master weights sent to every process, then each process's working copies
/// refreshed from them: call once before training, so every process starts from the same
/// weights whatever its seed.
template <class Model, class Wire, class Ctx>
void broadcast_parameters(Model& model, const mpi_reducer<Wire>& r, const Ctx& ctx) {
  for (auto span : model.masters()) r.broadcast(span, 0);
  model.refresh(ctx);
}

/// The part [first, last) of `n` items (samples of a batch, or of a data set) that process
/// `rank` of `size` takes: contiguous, in rank order, sizes differing by at most one.
inline std::pair<std::size_t, std::size_t> shard(std::size_t n, int rank, int size) {
  if (size <= 0 || rank < 0 || rank >= size) {
    throw error("precis::shard: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " processes");
  }
  const auto r = std::size_t(rank), s = std::size_t(size);
  const std::size_t base = n / s, extra = n % s;
  const std::size_t first = r * base + std::min(r, extra);
  return {first, first + base + (r < extra ? 1 : 0)};
}

}  // namespace precis
