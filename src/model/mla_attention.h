// Multi-latent attention (Megatron-Core's MLASelfAttention, DeepSeek-V2/V3): queries, keys
// and values come from low-rank latents of the layer's input x [Tl,H]; a small shared key
// part carries the position (RoPE), the rest none. With Dq = Dn + Dr (qk_head_dim +
// qk_pos_emb_head_dim), NH heads, this rank's NHl = NH/TP:
//
//   forward:  x_f  = gather_from_sp(x) (SP) | x                              [T, H]
//             cq   = norm_q(x_f @ Wqd^T)          (--q-lora-rank rq)         [T, rq]
//             q    = cq @ Wqu^T  |  x_f @ Wq^T    (without a query latent)   [T, NHl*Dq]
//             ckv  = norm_kv(x_f @ Wkvd[:rkv]^T)                             [T, rkv]
//             kpe  = x_f @ Wkvd[rkv:]^T           (one head, shared)         [T, Dr]
//             kv   = ckv @ Wkvu^T                 (per head: k_nope | v)     [T, NHl*(Dn+Dv)]
//             qkv  = ops::mla_qkv_forward(q, kv, kpe) (RoPE on the position parts, values
//                    padded to Dq; the grouped layout of NH groups of one head)
//             ctx  = core(qkv) [T, NHl*Dq];  y = linear_proj(narrow to Dv per head)
//   --recompute-modules mla_up_proj (Megatron's): the layer keeps the latents (and kpe), not
//             qkv; backward runs the up projections and the packing again (the same
//             bits), then the core's backward (or its recompute) reads them.
//   backward: the mirror; the latents' gradients are partial sums over this rank's heads,
//             so Wqd, Wkvd and the latent norms' weights are TP-partial (all-reduced over TP
//             by finalize_model_grads) and d x_f gets one TP reduction (all-reduce, or the
//             reduce-scatter under SP) for all three down projections.
//
// FP8 (--fp8-format, a layer in FP8): every projection is an FP8 linear with its own
// scaling state, as Megatron's Transformer Engine modules: linear_q_down_proj /
// linear_q_proj, linear_q_up_proj, linear_kv_down_proj (one GEMM over the latent and the
// position part, split after it), linear_kv_up_proj and linear_proj. A quantised partial
// sum is not the quantised sum, so at TP > 1 each latent's gradient (and d kpe) is
// all-reduced over TP before its norm and down projection, as Megatron's column-parallel
// up projections do: the down projections' and latent norms' gradients are then whole on
// every rank (latent_grads_whole: registered without tp_partial), and their FP8 casts see
// the serial run's tensors.
//
// norm_q / norm_kv are RMSNorms under --qk-layernorm and the identity without (Megatron's
// QKNormConfigResolver). The down projections run on the gathered rows on every TP rank
// (Megatron's duplicated TELinear runs them on the sequence shard): the same numbers, the
// down projections' GEMMs repeated TP times, which are small beside the up projections.
// The value heads padded to Dq cost the core (Dq - Dv) / Dq more work on values; every
// attention backend, context parallelism and the KV cache then serve MLA unchanged.
#pragma once
#include <vector>

#include "model/core_attention.h"
#include "model/linear.h"

namespace mcpp::ops {
struct MlaDims;
struct MlaRope;
}  // namespace mcpp::ops

namespace mcpp::model {

class MlaAttention {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  // Whether layer `layer`'s latent gradients are made whole over TP (FP8 at TP > 1).
  static bool latent_grads_whole(const TransformerConfig& c, int layer);
  MlaAttention() = default;
  MlaAttention(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved {
    Tensor q_lat, q_ln, q_rstd;     // [T, rq], its norm's output and rstd (query latent)
    Tensor kv_lat, kv_ln, kv_rstd;  // [T, rkv], the same for the key/value latent
    Tensor qkv;                     // [T, NHl*3*Dq]: exactly what the core saw (not kept
                                    // under mla_up_proj: rebuilt into Workspace::mla_qkv)
    Tensor kpe;                     // [T, Dr] the key's position part (mla_up_proj only)
    CoreAttention::Saved core;
  };
  static void saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                          const TensorVisitor& v);
  static void scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                            const TensorVisitor& v);

  void forward(const Tensor& x, Saved& s, const Tensor* residual, Tensor& y, Workspace& ws,
               const StepContext& cx) const;
  // Generation over the KV cache [B, Tmax, NH, Dq] (keys and padded values after RoPE);
  // fold: x is the input of the layer's RMSNorm (Norm::fold), normalised here first.
  void forward_cached(const Tensor& x, Saved& s, Tensor& k_cache, Tensor& v_cache,
                      const Tensor* residual, Tensor& y, Workspace& ws, const StepContext& cx,
                      const Norm::Fold* fold) const;
  void prepare_backward(Saved& s, Workspace& ws, const StepContext& cx) const;
  void backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx, Workspace& ws,
                const StepContext& cx);

 private:
  const TransformerConfig* cfg_ = nullptr;
  ParamView q_proj_, q_down_, q_up_, kv_down_, kv_up_, q_norm_, kv_norm_;
  CoreAttention core_;
  RowParallelLinear proj_;
  Fp8Linear q_proj_fp8_, q_down_fp8_, q_up_fp8_, kv_down_fp8_, kv_up_fp8_;
  bool recompute_up_ = false;  // --recompute-modules mla_up_proj
  bool fp8(const StepContext& cx) const { return kv_up_fp8_.on(cx); }
  // y = x W^T for a projection whose input is whole on every rank: FP8 through f, or not.
  void linear(const Fp8Linear& f, const Tensor& x, const Tensor& w, Tensor& y,
              const StepContext& cx) const;
  // The backward from the unpacked gradients (ws.mla_q / mla_kv / mla_kpe) to dx, in FP8.
  void backward_fp8(const Tensor& x, Saved& s, Tensor& dx, Workspace& ws, const StepContext& cx);
  // The projections up to the packed qkv (forward and generation): x_f the gathered input.
  void project(const Tensor& x_f, Saved& s, Tensor& qkv, Workspace& ws,
               const StepContext& cx) const;
  // The up projections of the kept latents and the packing again, into ws.mla_qkv (the
  // forward's bits): x is the attention's input (the query projection's, without a query
  // latent).
  void rebuild_qkv(const Tensor& x, Saved& s, Workspace& ws, const StepContext& cx) const;
  // packed = mla_qkv_forward(...) (backward: packed is d qkv, read; d of its inputs to
  // ws.mla_q / mla_kv / mla_kpe) over this rank's rows at their positions: one call, or one
  // per run of consecutive positions under CP.
  void pack(bool backward, Tensor& packed, Workspace& ws, const StepContext& cx) const;
};

// The ops' view of the configuration: this rank's heads and the head widths, and the RoPE
// (plain or YaRN, with YaRN's concentration factor on cos and sin).
ops::MlaDims mla_dims(const TransformerConfig& c);
ops::MlaRope mla_rope(const TransformerConfig& c);

}  // namespace mcpp::model
