#include "model/transformer_layer.h"

#include "ops/nvtx.h"
#include <typeinfo>

#include "model/moe/moe_layer.h"
#include "ops/ops.h"

namespace mcpp::model {

void TransformerLayer::add_params(const TransformerConfig& c, int layer,
                                  std::vector<ParamInfo>& params) {
  const size_t first = params.size();
  Norm::add_params(c, layer_param_name(layer, "input_layernorm"), layer, params);
  Attention::add_params(c, layer, params);
  Norm::add_params(c, layer_param_name(layer, "pre_mlp_layernorm"), layer, params);
  if (c.is_moe_layer(layer))
    moe::MoeLayer::add_params(c, layer, params);
  else
    DenseMlp::add_params(c, layer, params);
  // An MTP depth's layer runs on the last stage after the decoder, with the head: its
  // parameters are ready (and gathered) with the head's, as the layer -1 ones.
  if (TransformerConfig::is_mtp_layer(layer))
    for (size_t i = first; i < params.size(); ++i) params[i].layer = -1;
}

void TransformerLayer::add_buffers(const TransformerConfig& c, int layer,
                                   std::vector<BufferInfo>& out) {
  if (c.is_moe_layer(layer)) moe::MoeLayer::add_buffers(c, layer, out);
}

// The MLP-contract module of this layer: MoE where --moe-layer-freq puts one, else dense.
static std::unique_ptr<MlpModule> make_mlp(const TransformerConfig& c, int layer,
                                           const ParamStore* store) {
  if (c.is_moe_layer(layer)) return std::make_unique<moe::MoeLayer>(c, layer, store);
  return std::make_unique<DenseMlp>(c, layer, store);
}

TransformerLayer::TransformerLayer(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      layer_(layer),
      ln1_(c, store, layer_param_name(layer, "input_layernorm")),
      attn_(c, layer, store),
      ln2_(c, store, layer_param_name(layer, "pre_mlp_layernorm")),
      mlp_(make_mlp(c, layer, store)) {}

// --recompute-modules layernorm: the norms' outputs live in ws.ln_y, written by forward and
// written again in backward just before the GEMM backward that reads them (each norm's
// input -- the layer input x, or x2 -- and rstd are kept anyway for the norm's backward).
bool TransformerLayer::recomputes_norms() const {
  return cfg_->recompute == TransformerConfig::Recompute::Selective && cfg_->recompute_norms;
}

// --recompute-modules moe: a MoE layer keeps nothing of its own. Its forward saves into
// ws.moe_rc, which every MoE layer shares and the next one overwrites; backward re-runs
// the forward from the layer's input (norm2's output, kept or recomputed) into ws.moe_rc
// right before the MoE backward reads it. The re-run is the same computation on the same
// input (the routing, capacity drops and all-to-all splits included), so the gradients are
// those of keeping it; the layer's statistics count each micro-batch once (MoeStats::seen).
// The shared set keeps the experts' activation, so the re-run replaces moe_act's.
bool TransformerLayer::recomputes_moe() const {
  return cfg_->recompute == TransformerConfig::Recompute::Selective && cfg_->recompute_moe &&
         cfg_->is_moe_layer(layer_);
}

void TransformerLayer::saved_specs(const Dims& d, bool keep_mlp_activation, LayerSaved& s,
                                   const TensorVisitor& v) const {
  Norm::saved_specs(*cfg_, d, s.ln1, v, !recomputes_norms());
  Attention::saved_specs(*cfg_, d, s.attn, v);
  v(s.x2, {d.Tl, d.H}, d.dt, true);
  Norm::saved_specs(*cfg_, d, s.ln2, v, !recomputes_norms());
  own_mlp_saved(s);
  if (!recomputes_moe()) mlp_->saved_specs(d, keep_mlp_activation, *s.mlp, v);
}

bool TransformerLayer::own_mlp_saved(LayerSaved& s) const {
  std::unique_ptr<MlpSaved> fresh = mlp_->new_saved();
  if (s.mlp && typeid(*s.mlp) == typeid(*fresh)) return false;
  s.mlp = std::move(fresh);
  return true;
}

void TransformerLayer::scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                                     const TensorVisitor& v) const {
  v(ws.tmp, {d.Tl, d.H}, d.dt, true);
  v(ws.dx, {d.Tl, d.H}, d.dt, true);
  v(ws.dtmp, {d.Tl, d.H}, d.dt, true);
  v(ws.dln, {d.Tl, d.H}, d.dt, true);
  v(ws.ln_y, {d.Tl, d.H}, d.dt, recomputes_norms());
  Attention::scratch_specs(*cfg_, d, ws, v);
  mlp_->scratch_specs(d, uses_scratch_activation, ws, v);
  if (recomputes_moe()) {
    if (!ws.moe_rc) ws.moe_rc = mlp_->new_saved();
    mlp_->saved_specs(d, /*keep_activation=*/true, *ws.moe_rc, v);
  }
}

void TransformerLayer::forward(const Tensor& x, LayerSaved& s, Tensor& out, Workspace& ws,
                               const StepContext& cx) const {
  const ops::NvtxRange nvtx("layer", layer_, "forward");  // Nsight timeline (ops/nvtx.h)
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H;
  // Without TP and hidden dropout the residual add runs in the GEMM's epilogue.
  const bool fuse_residual = !cx.tp_comm && cx.p_hidden == 0;
  Tensor tmp3 = ws.tmp.view({Sl, B, H}), x3 = x.view({Sl, B, H}), x23 = s.x2.view({Sl, B, H});
  // The full-recompute workspace's slots are sized by the chunk's first layer; in a model
  // of dense and MoE layers a slot may hold the other kind's MLP buffers: make its own
  // (recomputed layers keep no MLP activation).
  if (own_mlp_saved(s) && !recomputes_moe())
    allocate([&](const TensorVisitor& v) { mlp_->saved_specs(cx, false, *s.mlp, v); }, cx.dev,
             true);
  MlpSaved& ms = recomputes_moe() ? *ws.moe_rc : *s.mlp;
  if (recomputes_norms()) s.ln1.y = ws.ln_y, s.ln2.y = ws.ln_y;  // read at once, not kept
  // Attention block: x2 = x + dropout(attention(norm1(x))).
  ln1_.forward(x, s.ln1, cx);
  if (fuse_residual) {
    attn_.forward(s.ln1.y, s.attn, &x, s.x2, ws, cx);
  } else {
    attn_.forward(s.ln1.y, s.attn, nullptr, ws.tmp, ws, cx);
    ops::dropout_add_forward(tmp3, x3, cx.p_hidden,
                             dropout_key(c, cx.keys, layer_, DropoutSite::AfterProj), cx.g, x23,
                             st);
  }
  // MLP block: out = x2 + dropout(mlp(norm2(x2))).
  ln2_.forward(s.x2, s.ln2, cx);
  if (fuse_residual) {
    mlp_->forward(s.ln2.y, ms, &s.x2, out, ws, cx);
  } else {
    mlp_->forward(s.ln2.y, ms, nullptr, ws.tmp, ws, cx);
    Tensor out3 = out.view({Sl, B, H});
    ops::dropout_add_forward(tmp3, x23, cx.p_hidden,
                             dropout_key(c, cx.keys, layer_, DropoutSite::AfterFc2), cx.g, out3,
                             st);
  }
  if (recomputes_norms()) s.ln1.y = s.ln2.y = Tensor();  // the workspace is not kept
}

void TransformerLayer::inference_specs(const Dims& d, LayerSaved& s, Workspace& ws,
                                       const TensorVisitor& v) const {
  Norm::saved_specs(*cfg_, d, s.ln1, v);
  Attention::inference_specs(*cfg_, d, s.attn, v);
  v(s.x2, {d.Tl, d.H}, d.dt, true);
  Norm::saved_specs(*cfg_, d, s.ln2, v);
  if (!s.mlp) s.mlp = mlp_->new_saved();
  mlp_->saved_specs(d, /*keep_activation=*/true, *s.mlp, v);  // no shared activation needed
  v(ws.tmp, {d.Tl, d.H}, d.dt, true);
  RowParallelLinear::scratch_specs(d, ws, v);
}

void TransformerLayer::forward_cached(const Tensor& x, LayerSaved& s, Tensor& k_cache,
                                      Tensor& v_cache, Tensor& out, Workspace& ws,
                                      const StepContext& cx) const {
  Stream& st = cx.stream();
  // Without TP the residual adds run inside the projections (linear_decode: on the GPU one
  // rounding instead of two, one kernel fewer each); under TP after the reduction.
  const bool fuse_residual = !cx.tp_comm;
  // RMSNorms at TP 1 go into the kernels of the linear layers that read them (Norm::fold).
  const std::optional<Norm::Fold> f1 = ln1_.fold(s.ln1, cx);
  if (!f1) ln1_.forward(x, s.ln1, cx);
  const Tensor& attn_in = f1 ? x : s.ln1.y;
  const Norm::Fold* fold1 = f1 ? &*f1 : nullptr;
  if (fuse_residual) {
    attn_.forward_cached(attn_in, s.attn, k_cache, v_cache, &x, s.x2, ws, cx, fold1,
                         mlp_->first_weight());
  } else {
    attn_.forward_cached(attn_in, s.attn, k_cache, v_cache, nullptr, ws.tmp, ws, cx, fold1,
                         mlp_->first_weight());
    ops::add(x, ws.tmp, s.x2, st);
  }
  // (A MoE layer's router reads the norm's output too: never folded. A fold means TP 1, so
  // the residual add is fc2's.)
  const std::optional<Norm::Fold> f2 =
      cfg_->moe.num_experts == 0 ? ln2_.fold(s.ln2, cx) : std::nullopt;
  if (f2) return mlp_->forward_folded(s.x2, *f2, *s.mlp, &s.x2, out, ws, cx);
  ln2_.forward(s.x2, s.ln2, cx);
  MlpSaved* ms = s.mlp.get();
  if (cfg_->moe.num_experts > 0) {
    // Generation shares one LayerSaved between all layers (sized by layer 0); in a MoE model
    // each layer keeps its own MLP buffers, as dense and MoE layers save different things.
    if (!inf_mlp_) inf_mlp_ = mlp_->new_saved();
    allocate([&](const TensorVisitor& v) { mlp_->saved_specs(cx, true, *inf_mlp_, v); }, cx.dev,
             false);
    ms = inf_mlp_.get();
  }
  if (fuse_residual && cfg_->moe.num_experts == 0) {
    mlp_->forward(s.ln2.y, *ms, &s.x2, out, ws, cx);
  } else {
    mlp_->forward(s.ln2.y, *ms, nullptr, ws.tmp, ws, cx);
    ops::add(s.x2, ws.tmp, out, st);
  }
}

void TransformerLayer::backward(const Tensor& x, LayerSaved& s, Workspace& ws,
                                const StepContext& cx) {
  const ops::NvtxRange nvtx("layer", layer_, "backward");  // Nsight timeline (ops/nvtx.h)
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H;
  Tensor dx3 = ws.dx.view({Sl, B, H}), dtmp3 = ws.dtmp.view({Sl, B, H});
  // Without hidden dropout its gradient is d(out) itself: read dx in place of a copy (the
  // norm backward accumulates into dx only after the GEMMs have read it).
  const bool dropout = cx.p_hidden > 0;
  const Tensor& dproj = dropout ? ws.dtmp : ws.dx;
  attn_.prepare_backward(s.attn, ws, cx);
  // MLP block: out = x2 + dropout(mlp(norm2(x2))).
  if (dropout)
    ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, layer_, DropoutSite::AfterFc2),
                          cx.g, dtmp3, st);
  if (recomputes_norms()) {  // norm2's output again, for fc1's weight gradient
    s.ln1.y = ws.ln_y, s.ln2.y = ws.ln_y;
    ln2_.forward(s.x2, s.ln2, cx);
  }
  MlpSaved* ms = s.mlp.get();
  if (recomputes_moe()) {  // the MoE layer's forward again, its output unused
    ms = ws.moe_rc.get();
    mlp_->forward(s.ln2.y, *ms, nullptr, ws.tmp, ws, cx);
  }
  mlp_->backward(dproj, s.ln2.y, *ms, ws.dln, ws, cx);
  ln2_.backward(ws.dln, s.x2, s.ln2, ws.dx, true, cx);
  // Attention block: x2 = x + dropout(attention(norm1(x))).
  if (dropout)
    ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, layer_, DropoutSite::AfterProj),
                          cx.g, dtmp3, st);
  if (recomputes_norms()) ln1_.forward(x, s.ln1, cx);  // norm1's output, for QKV's
  attn_.backward(dproj, s.ln1.y, s.attn, ws.dln, ws, cx);
  ln1_.backward(ws.dln, x, s.ln1, ws.dx, true, cx);
  if (recomputes_norms()) s.ln1.y = s.ln2.y = Tensor();
}

}  // namespace mcpp::model
