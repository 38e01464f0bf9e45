/// @file
/// Fused multi-head attention on the device: cuDNN's scaled dot-product attention (flash
/// attention), forward and backward, built through the header-only cuDNN frontend. nn::attention
/// runs its scores, softmax and context pieces through it where its policies allow (see
/// nn/attention.hpp and docs/cuda.md, "Fused attention"); this header is its engine.
///
/// Available when the target links precis::cudnn_frontend (CMake; the frontend's headers come
/// from the PyPI package nvidia-cudnn-frontend), which defines PRECIS_HAS_CUDNN_FRONTEND;
/// precis::has_fused_attention says so at compile time. Host code: usable from .cpp files. Under
/// nvcc the frontend is read by the host pass only (its definitions are compiled out of the
/// device pass, which never calls them), which keeps a unit's device compilation as fast as
/// without it.
///
/// The tensors are attention's own layouts, read and written in place through strides, so that
/// nothing is split into heads or merged back:
///
///     qkv    [N, T, 3 H dh]   q, then k, then v, each head-major (nn::attention's qkv rows)
///     o, do  [N, T, H dh]     the context, heads merged (the output projection's input)
///     stats  [N, H, T]        float: each row's log-sum-exp, saved by forward for backward
///     dqkv   [N, T, 3 H dh]   dq, dk, dv in qkv's layout
///
/// Storage bfloat16 or float16; the scores, the softmax and the sums of both products in float,
/// the probabilities rounded to the storage type before the context product (as unfused
/// attention stores them). The backward pass uses cuDNN's deterministic algorithm: the same
/// bits on every run. Against the unfused pieces the results differ by the order of the sums
/// and the online softmax's rescaling: within a few units of the storage type's precision.
#pragma once

#include <precis/config.hpp>
#include <precis/cuda_error.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_tensor.hpp>

#if PRECIS_CUDA

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if defined(PRECIS_HAS_CUDNN_FRONTEND) && !defined(__CUDA_ARCH__)
// The frontend calls std::strlen without including <cstring> when built without its JSON
// library (CUDNN_FRONTEND_SKIP_JSON_LIB, which precis::cudnn_frontend sets).
#include <cstring>
#include <exception>
#include <unordered_map>

#include <cudnn_frontend.h>

// SDPA_attributes::set_generate_stats, with which the forward pass keeps the statistics
// backward reads, came with frontend 1.13.
static_assert(CUDNN_FRONTEND_VERSION >= 11300,
              "precis: fused attention needs the cuDNN frontend 1.13 or later (pip install nvidia-cudnn-frontend)");
#endif

namespace precis {

/// Whether this build runs attention fused on the device (the target links
/// precis::cudnn_frontend).
#if defined(PRECIS_HAS_CUDNN_FRONTEND)
inline constexpr bool has_fused_attention = true;
#else
inline constexpr bool has_fused_attention = false;
#endif

/// The geometry of one fused attention call: batch, heads, tokens, head width, and the
/// storage type (bfloat16, or float16 when `half`).
struct fused_attention_shape {
  std::int64_t batch = 0;      ///< N
  std::int64_t heads = 0;      ///< H
  std::int64_t tokens = 0;     ///< T
  std::int64_t head_dim = 0;   ///< dh
  bool half = false;           ///< float16 storage (else bfloat16)
  float scale = 1.0F;          ///< the scores' factor, 1 / sqrt(dh) in nn::attention
  /// Shapes compare member by member (the plan cache's key).
  friend bool operator==(const fused_attention_shape&, const fused_attention_shape&) = default;
};

/// cuDNN's fused attention for one layer: an execution plan per geometry and direction,
/// made on first use and kept (a model's shapes repeat, so steps after the first make none).
/// Workspace comes from the context (cuda_context::workspace, stream-ordered, kept across
/// calls). Every call runs on the context's stream and throws precis::error, naming the
/// stage and cuDNN's message, when cuDNN refuses the geometry (e.g. a head width it does not
/// support) or a launch fails; nothing is written then.
class fused_attention_engine {
 public:
  /// o and stats from qkv (layouts in the file comment).
  void forward(cuda_context& ctx, const fused_attention_shape& s, const void* qkv, void* o, float* stats);
  /// dqkv from qkv, o, do and the stats of the forward pass that gave o.
  void backward(cuda_context& ctx, const fused_attention_shape& s, const void* qkv, const void* o,
                const void* dout, const float* stats, void* dqkv);
  /// Plans made so far (one per geometry, direction and context).
  std::size_t plans() const { return plans_.size(); }

  /// Throws precis::error unless cuDNN's fused attention can take head width `head_dim`: a
  /// multiple of 8 (which also keeps q, k and v of each qkv row on 16-byte boundaries), at
  /// most 128; and, for a pass that will be backpropagated (`training`), at least 2 tokens
  /// (cuDNN's backward refuses one). `who` names the caller.
  static void check_geometry(std::int64_t head_dim, std::int64_t tokens, bool training, const std::string& who) {
    const char* unfused = "; give the attention tags a policy with products::exact to run the unfused pieces";
    if (head_dim % 8 != 0 || head_dim > 128 || head_dim <= 0) {
      throw error(who + ": cuDNN's fused attention takes head widths that are multiples of 8 up to 128, got " +
                  std::to_string(head_dim) + unfused);
    }
    if (training && tokens < 2) {
      throw error(who + ": cuDNN's fused attention backward takes at least 2 tokens, got " + std::to_string(tokens) +
                  unfused);
    }
  }

 private:
  struct plan;
  plan& plan_for(cuda_context& ctx, const fused_attention_shape& s, bool backward);
  std::vector<std::shared_ptr<plan>> plans_;
};

#if defined(PRECIS_HAS_CUDNN_FRONTEND) && !defined(__CUDA_ARCH__)

namespace detail::fused {

namespace fe = cudnn_frontend;

// The variant pack's tensor ids.
enum uid : std::int64_t {
  q_uid = 1,
  k_uid,
  v_uid,
  o_uid,
  stats_uid,
  do_uid,
  dq_uid,
  dk_uid,
  dv_uid,
  seq_len_q_uid,
  seq_len_kv_uid
};

/// Whether the backward pass of geometry s masks its padding with sequence lengths of its
/// own (every length T). cuDNN 9.15 and older give NaN or wrong gradients in the backward pass
/// where T is not a multiple of 128 (ViT's 65 and 197 tokens) unless it is masked. Frontend
/// 1.16 and later add that mask then, and 1.15 whenever T is not a multiple of 128, each with
/// lengths it copies from host memory on every call, which a captured step must not do;
/// given here, in device memory made with the plan, they leave the frontend nothing to add.
/// Elsewhere (a newer cuDNN with frontend 1.13, 1.14 or 1.16 on) nothing is masked.
inline bool own_padding_mask(const fused_attention_shape& s) {
  constexpr bool frontend_masks_always = CUDNN_FRONTEND_VERSION >= 11500 && CUDNN_FRONTEND_VERSION < 11600;
  return s.tokens % 128 != 0 && (cudnnGetVersion() <= 91500 || frontend_masks_always);
}

inline void check(fe::error_t e, const char* stage) {  // by value: get_message() is not const
  if (e.is_bad()) {
    throw error(std::string("precis::nn::attention (cuDNN fused attention): ") + stage + ": " + e.get_message());
  }
}

/// f(), with an exception the frontend throws (some of its builders throw rather than
/// return an error) given as precis::error naming the stage.
template <class F>
decltype(auto) translated(const char* stage, F&& f) {
  try {
    return f();
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(std::string("precis::nn::attention (cuDNN fused attention): ") + stage + ": " + e.what());
  }
}

/// The strides of q, k, v (and their gradients) in qkv's rows, of o in the merged rows, and of
/// the stats, over [N, H, T, dh] (stats [N, H, T, 1]).
struct layouts {
  std::vector<std::int64_t> dims, qkv, o, stats_dims, stats;
  explicit layouts(const fused_attention_shape& s) {
    const std::int64_t b = s.batch, h = s.heads, t = s.tokens, d = s.head_dim, width = h * d;
    dims = {b, h, t, d};
    qkv = {t * 3 * width, d, 3 * width, 1};
    o = {t * width, d, width, 1};
    stats_dims = {b, h, t, 1};
    stats = {h * t, t, 1, 1};
  }
};

inline std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, uid id,
                                                            const std::vector<std::int64_t>& dims,
                                                            const std::vector<std::int64_t>& strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(id).set_dim(dims).set_stride(strides));
}

inline std::shared_ptr<fe::graph::Graph> make_graph(cudnnHandle_t handle, const fused_attention_shape& s,
                                                    bool backward) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.half ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const layouts l(s);
  auto q = input(*g, "q", q_uid, l.dims, l.qkv);
  auto k = input(*g, "k", k_uid, l.dims, l.qkv);
  auto v = input(*g, "v", v_uid, l.dims, l.qkv);
  if (!backward) {
    auto attributes =
        fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(s.scale);
    auto [o, stats] = g->sdpa(q, k, v, attributes);
    o->set_output(true).set_uid(o_uid).set_dim(l.dims).set_stride(l.o);
    stats->set_output(true).set_uid(stats_uid).set_data_type(fe::DataType_t::FLOAT).set_dim(l.stats_dims).set_stride(
        l.stats);
  } else {
    auto o = input(*g, "o", o_uid, l.dims, l.o);
    auto dout = input(*g, "do", do_uid, l.dims, l.o);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(stats_uid)
                               .set_dim(l.stats_dims)
                               .set_stride(l.stats)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("attention_backward")
                          .set_attn_scale(s.scale)
                          .set_deterministic_algorithm(true);
    if (own_padding_mask(s)) {
      const auto lengths = [&](const char* name, uid id) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(id)
                             .set_dim({s.batch, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
      };
      attributes.set_padding_mask(true)
          .set_seq_len_q(lengths("seq_len_q", seq_len_q_uid))
          .set_seq_len_kv(lengths("seq_len_kv", seq_len_kv_uid));
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attributes);
    dq->set_output(true).set_uid(dq_uid).set_dim(l.dims).set_stride(l.qkv);
    dk->set_output(true).set_uid(dk_uid).set_dim(l.dims).set_stride(l.qkv);
    dv->set_output(true).set_uid(dv_uid).set_dim(l.dims).set_stride(l.qkv);
  }
  check(g->validate(), "validate");
  check(g->build_operation_graph(handle), "build_operation_graph");
  check(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans");
  check(g->check_support(), "check_support");
  check(g->build_plans(), "build_plans");
  return g;
}

}  // namespace detail::fused

struct fused_attention_engine::plan {
  fused_attention_shape shape;
  bool backward = false;
  std::uint64_t context = 0;  // the id() of the context whose handle the plan was built on
  std::shared_ptr<detail::fused::fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  // A backward plan's sequence lengths where it masks its padding (own_padding_mask): every
  // one T, for q and kv alike, on the device (copied from `lengths`, kept with the plan);
  // empty elsewhere. Allocated as the layers' buffers are (the plan may outlive the stream).
  std::vector<std::int32_t> lengths;
  device_tensor<std::int32_t, 1> device_lengths;
};

inline fused_attention_engine::plan& fused_attention_engine::plan_for(cuda_context& ctx, const fused_attention_shape& s,
                                                                       bool backward) {
  for (const auto& p : plans_) {
    if (p->shape == s && p->backward == backward && p->context == ctx.id()) return *p;
  }
  // Building a plan loads kernels and may allocate and wait: not inside a CUDA graph's capture.
  if (ctx.capturing()) {
    throw error("precis::nn::attention (cuDNN fused attention): a geometry without a plan while the stream is "
                "captured into a CUDA graph; run one step on tensors of these shapes before capturing it");
  }
  auto p = std::make_shared<plan>();
  p->shape = s;
  p->backward = backward;
  p->context = ctx.id();
  {
    // The frontend reads the architecture it builds for from the current device: the
    // context's, for the plan's build, then the caller's again.
    int current = 0;
    precis::check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != ctx.device()) precis::check(cudaSetDevice(ctx.device()), "cudaSetDevice");
    struct restore {
      int device;
      bool set;
      ~restore() {
        if (set) (void)cudaSetDevice(device);
      }
    } back{current, current != ctx.device()};
    p->graph = detail::fused::translated("building the plan",
                                         [&] { return detail::fused::make_graph(ctx.dnn(), s, backward); });
  }
  detail::fused::check(p->graph->get_workspace_size(p->workspace), "get_workspace_size");
  if (backward && detail::fused::own_padding_mask(s)) {
    p->lengths.assign(std::size_t(s.batch), std::int32_t(s.tokens));
    p->device_lengths = device_tensor<std::int32_t, 1>({p->lengths.size()});
    precis::check(cudaMemcpyAsync(p->device_lengths.data(), p->lengths.data(), p->lengths.size() * sizeof(std::int32_t),
                                  cudaMemcpyHostToDevice, ctx.stream()),
                  "cudaMemcpyAsync (fused attention's sequence lengths)");
  }
  plans_.push_back(p);
  return *p;
}

inline void fused_attention_engine::forward(cuda_context& ctx, const fused_attention_shape& s, const void* qkv,
                                            void* o, float* stats) {
  using namespace detail::fused;
  plan& p = plan_for(ctx, s, false);
  const std::size_t width = std::size_t(s.heads * s.head_dim) * 2;  // bytes of one third of a qkv row
  auto* base = static_cast<unsigned char*>(const_cast<void*>(qkv));
  std::unordered_map<std::int64_t, void*> pack{
      {q_uid, base}, {k_uid, base + width}, {v_uid, base + 2 * width}, {o_uid, o}, {stats_uid, stats}};
  void* ws = p.workspace > 0 ? ctx.workspace(std::size_t(p.workspace)) : nullptr;
  check(translated("execute", [&] { return p.graph->execute(ctx.dnn(), pack, ws); }), "execute");
}

inline void fused_attention_engine::backward(cuda_context& ctx, const fused_attention_shape& s, const void* qkv,
                                             const void* o, const void* dout, const float* stats, void* dqkv) {
  using namespace detail::fused;
  plan& p = plan_for(ctx, s, true);
  const std::size_t width = std::size_t(s.heads * s.head_dim) * 2;
  auto* base = static_cast<unsigned char*>(const_cast<void*>(qkv));
  auto* dbase = static_cast<unsigned char*>(dqkv);
  std::unordered_map<std::int64_t, void*> pack{{q_uid, base},
                                               {k_uid, base + width},
                                               {v_uid, base + 2 * width},
                                               {o_uid, const_cast<void*>(o)},
                                               {do_uid, const_cast<void*>(dout)},
                                               {stats_uid, const_cast<float*>(stats)},
                                               {dq_uid, dbase},
                                               {dk_uid, dbase + width},
                                               {dv_uid, dbase + 2 * width}};
  if (p.device_lengths.size() != 0) {
    pack.emplace(seq_len_q_uid, p.device_lengths.data());
    pack.emplace(seq_len_kv_uid, p.device_lengths.data());
  }
  void* ws = p.workspace > 0 ? ctx.workspace(std::size_t(p.workspace)) : nullptr;
  check(translated("execute", [&] { return p.graph->execute(ctx.dnn(), pack, ws); }), "execute");
}

#endif

}  // namespace precis

#endif  // PRECIS_CUDA
