// Self-attention (Megatron-Core's SelfAttention): column-parallel QKV, RoPE, the core,
// row-parallel output projection. x is the normed input [Tl,H]; each rank holds NH/TP
// query heads and NG/TP key/value groups.
//
//   forward:  qkv = rope(qk_norm(linear_qkv(x)))   [T, QKVW]  (qk_norm: --qk-layernorm only)
//             ctx = core(qkv)                       [T, NH*HD]
//             y   = linear_proj(ctx) (+ residual)   [Tl, H]
//   backward: dctx = linear_proj'(dy); dqkv = qk_norm'(rope'(core'(dctx)));
//             dx = linear_qkv'(dqkv)
#pragma once
#include <string>
#include <vector>

#include "model/core_attention.h"
#include "model/linear.h"
#include "model/mla_attention.h"

namespace mcpp::model {

// The RoPE frequencies of c (its base, Llama 3.x scaling and position interpolation) as the
// rope ops take them.
ops::RopeFreqs rope_freqs(const TransformerConfig& c);

class Attention {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  Attention() = default;
  Attention(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved {
    ColumnParallelLinear::Saved qkv_in;  // the gathered x (SP)
    Tensor qkv;                          // [T,QKVW] after RoPE: exactly what the core saw
    Tensor qk_in;                        // [T,QKVW] before the q/k norms (--qk-layernorm)
    CoreAttention::Saved core;
    MlaAttention::Saved mla;  // --multi-latent-attention: the rest stay empty
  };
  static void saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                          const TensorVisitor& v);
  static void scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                            const TensorVisitor& v);
  // What generation keeps of a layer's attention between its steps (the projection's output).
  static void inference_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                              const TensorVisitor& v);

  // y = attention(x), or residual + attention(x) in the projection's GEMM epilogue when
  // `residual` is given (TP 1 only).
  void forward(const Tensor& x, Saved& s, const Tensor* residual, Tensor& y, Workspace& ws,
               const StepContext& cx) const;
  // Generation: y = attention(x) (+ *residual, without TP) over the KV cache
  // [B, Tmax, NG, HD], whose slot b receives the new positions [cx.pos[b], +Sq) (RoPE at
  // each sequence's own positions). fold: x is the input of that norm, folded into the
  // QKV projection (Norm::fold), not its output. next_weight: the weight the layer reads
  // after the projection (the MLP's first), which a decode step's attention asks the GPU to
  // bring into L2 after the projection's own (ops::rope_attention_decode's l2_next).
  void forward_cached(const Tensor& x, Saved& s, Tensor& k_cache, Tensor& v_cache,
                      const Tensor* residual, Tensor& y, Workspace& ws, const StepContext& cx,
                      const Norm::Fold* fold = nullptr,
                      const Tensor* next_weight = nullptr) const;
  // Before the layer's backward: the core rebuilds what selective recomputation dropped.
  void prepare_backward(Saved& s, Workspace& ws, const StepContext& cx) const;
  // dy [Tl,H] -> dx [Tl,H] (=, the workspace's dln); parameter gradients +=.
  void backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx, Workspace& ws,
                const StepContext& cx);

 private:
  const TransformerConfig* cfg_ = nullptr;
  ColumnParallelLinear qkv_;
  CoreAttention core_;
  RowParallelLinear proj_;
  ParamView q_norm_, k_norm_;  // --qk-layernorm: [HD] each
  ParamView q_bias_, k_bias_;  // ... with --normalization LayerNorm: [HD] each
  mutable Tensor l2_ones_, l2_grad_;   // --qk-l2-norm: the weightless norm's ones and scratch [HD]
  MlaAttention mla_;           // --multi-latent-attention: every method goes to it
  bool rope_ = false;          // RoPE in this layer (not a --no-rope-freq layer)
  // qkv [T, QKVW] -> out (may alias in): the q/k norms of --normalization's form
  // (ops::qk_norm_forward for RMSNorm, ops::qk_layernorm_forward for LayerNorm).
  void qk_norm_forward(const Tensor& in, Tensor& out, const StepContext& cx) const;
  // g: dL/d(norm output) in, dL/d(in) out; the norms' gradients +=.
  void qk_norm_backward(const Tensor& in, Tensor& g, const StepContext& cx);
};

}  // namespace mcpp::model
