// The attention core on this rank's heads: causal softmax(q k^T * scale) with attention
// dropout, times v, on linear_qkv's grouped layout (ops::attention_forward/backward: the
// cuDNN / flash / CPU kernels); under context parallelism (cx.cp_comm) the exchange over
// the CP group of parallel/context_parallel/cp_attention.h, the layer's --cp-comm-type.
//
//   forward:  ctx [T, NH*HD], lse [B, NH, S] = attention(qkv [T, QKVW])
//   backward: dqkv (=) from dctx, qkv, ctx, lse
//
// Selective recomputation (--recompute-granularity selective) lives here: the core does
// not keep ctx and lse (the largest activations for long sequences) but writes them to
// the shared workspace, and rebuilds them from the kept qkv before the layer's backward.
//
// Attention sinks (--softmax-type off-by-one / learnable; Megatron's softmax_offset): every
// head's softmax gains a logit with no value, 0 or the learnable
// self_attention.core_attention.softmax_offset [NH] (split over TP by heads, N(0, init
// std), no weight decay). The core joins it to the finished attention's (ctx, lse)
// (ops::attention_sink_forward, after the CP merge); the backward of the attention then
// runs unchanged on them, and the parameter's gradient comes from ops::attention_sink_backward.
// Generation passes the sinks to the KV-cache kernels (AttentionDims::sink).
#pragma once
#include "model/module.h"
#include "model/params.h"

namespace mcpp::model {

class CoreAttention {
 public:
  CoreAttention() = default;
  CoreAttention(const TransformerConfig& c, int layer, const ParamStore* store);
  // The learnable sinks' parameter (--softmax-type learnable).
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);

  struct Saved {
    Tensor ctx;   // [T, NH*HD] (not kept under selective recomputation)
    Tensor lse;   // [B, NH, S] log-sum-exp of each softmax row (CP: cp_attention.h's layout)
    Tensor keep;  // attention dropout's keep bits, a bit per score (saves_dropout_mask)
  };
  // Whether the output is kept for backward (false: selective recomputation).
  static bool keeps_output(const TransformerConfig& c);
  // Whether the layer keeps the dropout mask from forward to backward: the own flash
  // kernel with attention dropout on its aligned path (S a multiple of 8), no context
  // parallelism, output kept. The forward then draws the mask once and both backward
  // kernels read it (B NH S^2 / 8 bytes a layer) instead of the backward drawing it again.
  static bool saves_dropout_mask(const TransformerConfig& c, int64_t S);
  static void saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                          const TensorVisitor& v);
  static void scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                            const TensorVisitor& v);

  // Where the output lives: the Saved's, or the selective-recompute workspace.
  Tensor& ctx(Saved& s, Workspace& ws) const { return keep_ ? s.ctx : ws.sel_ctx; }
  Tensor& lse(Saved& s, Workspace& ws) const { return keep_ ? s.lse : ws.sel_lse; }

  void forward(const Tensor& qkv, Saved& s, Workspace& ws, const StepContext& cx) const;
  // Generation: appends the new keys and values of qkv [Sq*B, QKVW] to the cache
  // [B, max_seq, NG, HD], slot b at rows [cx.pos[b], +Sq), and attends over each slot's
  // rows [0, pos[b] + Sq) (a window layer's query at q over [q - L, q]: cached_dims);
  // s.ctx [Sq*B, NH*HD] (=). No dropout. Prompts that all start at position 0 take
  // ops::attention_prefill (the training kernels; s.lse its scratch).
  void forward_cached(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Saved& s,
                      const StepContext& cx) const;
  // The step's dims for the generation ops: cx.ad with this layer's sinks (AttentionDims::sink)
  // and, in a window layer, its window (AttentionDims::window_left).
  ops::AttentionDims cached_dims(const StepContext& cx) const;
  // Selective recomputation: rebuild the dropped output (no-op when it is kept).
  void recompute(const Tensor& qkv, Saved& s, Workspace& ws, const StepContext& cx) const;
  void backward(const Tensor& dctx, const Tensor& qkv, Saved& s, Tensor& dqkv, Workspace& ws,
                const StepContext& cx) const;

 private:
  int layer_ = 0;
  bool keep_ = true;
  // The learnable sink logits of the local heads and their gradient (undefined: none).
  ParamView sink_;
  // Off-by-one: zero logits, made on the step's device at the first forward (the model may be
  // built before the device backend starts).
  int64_t off_by_one_heads_ = 0;
  mutable Tensor zero_sink_;
  Tensor sink(const StepContext& cx) const;  // this layer's sink logits, or undefined
};

}  // namespace mcpp::model
