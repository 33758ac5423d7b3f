// The pre-norm transformer layer (Megatron-Core's TransformerLayer): an attention block
// and an MLP-contract block (MlpModule: the dense MLP, or a MoE layer: model/moe/), each
// behind a norm and followed by hidden dropout and the residual add.
//
//   x2  = x  + dropout(attention(norm1(x)))
//   out = x2 + dropout(mlp(norm2(x2)))
//
// Without TP and hidden dropout the residual add runs in the last GEMM's epilogue.
#pragma once
#include <memory>
#include <vector>

#include "model/attention.h"
#include "model/mlp.h"
#include "model/norm.h"

namespace mcpp::model {

// What one layer's forward keeps for its backward.
struct LayerSaved {
  Norm::Saved ln1;
  Attention::Saved attn;
  Tensor x2;  // [Tl,H] residual stream after attention
  Norm::Saved ln2;
  std::unique_ptr<MlpSaved> mlp;
};

class TransformerLayer {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  // Its persistent buffers (a MoE router's expert bias).
  static void add_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out);
  // store null: shape only (the memory estimate).
  TransformerLayer(const TransformerConfig& c, int layer, const ParamStore* store);

  int global() const { return layer_; }
  MlpModule& mlp() const { return *mlp_; }
  bool recomputes_norms() const;  // --recompute-modules layernorm
  bool recomputes_moe() const;    // --recompute-modules moe, in a MoE layer
  // keep_mlp_activation: --keep-mlp-activations chose this layer (see mlp.h).
  void saved_specs(const Dims& d, bool keep_mlp_activation, LayerSaved& s,
                   const TensorVisitor& v) const;
  void scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                     const TensorVisitor& v) const;

  // out = layer(x); x, out [Tl,H].
  void forward(const Tensor& x, LayerSaved& s, Tensor& out, Workspace& ws,
               const StepContext& cx) const;
  // Generation (no dropout, nothing kept for backward; s and ws are buffers): x2 = x +
  // attention over the KV cache (k_cache/v_cache: this layer's [B, Tmax, NG, HD], slot b
  // receiving positions [cx.pos[b], +Sq)), out = x2 + mlp(norm2(x2)). out may be x.
  void forward_cached(const Tensor& x, LayerSaved& s, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                      Workspace& ws, const StepContext& cx) const;
  // The buffers forward_cached uses, for the inference context's Dims.
  void inference_specs(const Dims& d, LayerSaved& s, Workspace& ws, const TensorVisitor& v) const;
  // The workspace's dx: d(out) in, d(x) out. Parameter gradients accumulate.
  void backward(const Tensor& x, LayerSaved& s, Workspace& ws, const StepContext& cx);

 private:
  // Gives s.mlp this layer's MLP Saved type (a new, unallocated one when it held the other
  // kind's); true when it replaced it.
  bool own_mlp_saved(LayerSaved& s) const;
  const TransformerConfig* cfg_;
  int layer_;
  Norm ln1_;
  Attention attn_;
  Norm ln2_;
  std::unique_ptr<MlpModule> mlp_;
  mutable std::unique_ptr<MlpSaved> inf_mlp_;  // generation buffers (MoE models)
};

}  // namespace mcpp::model
