#include "model/core_attention.h"

#include <cstdlib>

#include "ops/attention_backend.h"
#include "ops/ops.h"
#include "parallel/context_parallel/cp_attention.h"

namespace mcpp::model {

namespace {
const char* const kSinkName = "self_attention.core_attention.softmax_offset";
}  // namespace

CoreAttention::CoreAttention(const TransformerConfig& c, int layer, const ParamStore* store)
    : layer_(layer), keep_(keeps_output(c)) {
  using T = TransformerConfig::SoftmaxType;
  if (c.softmax_type == T::Learnable)
    sink_ = ParamStore::view(store, layer_param_name(layer, kSinkName));
  else if (c.softmax_type == T::OffByOne)
    off_by_one_heads_ = c.local_heads();
}

Tensor CoreAttention::sink(const StepContext& cx) const {
  if (!off_by_one_heads_) return sink_.w;
  if (!zero_sink_.defined() || zero_sink_.device() != cx.dev) {
    zero_sink_ = Tensor::empty({off_by_one_heads_}, DType::F32, cx.dev);
    ops::fill(zero_sink_, 0.0, cx.stream());
  }
  return zero_sink_;
}

void CoreAttention::add_params(const TransformerConfig& c, int layer,
                               std::vector<ParamInfo>& params) {
  if (c.softmax_type != TransformerConfig::SoftmaxType::Learnable) return;
  // Megatron: init_method (N(0, init_method_std)); a 1-D parameter, so no weight decay.
  params.push_back(make_param(layer_param_name(layer, kSinkName), {c.num_attention_heads},
                              TpSplit::Rows, Init::Normal, c.init_method_std, false, layer,
                              c.tp_size));
}

namespace {
// The step's attention dims as this layer sees them: a window layer's key starts
// (StepContext::window_key_start) in place of the document's.
ops::AttentionDims layer_dims(const StepContext& cx, int layer) {
  ops::AttentionDims d = cx.ad;
  if (cx.window_key_start.defined() && cx.cfg->is_window_layer(layer))
    d.key_start = cx.window_key_start;
  return d;
}
// This layer's context-parallel attention (cx.cp_comm set: CP > 1).
parallel::context_parallel::CpAttention cp_args(const StepContext& cx, int layer) {
  namespace cpa = parallel::context_parallel;
  using C = TransformerConfig::CpComm;
  cpa::CpAttention a;
  const C t = cx.cfg->cp_comm_of(layer);
  a.type = t == C::A2A         ? cpa::CommType::A2A
           : t == C::AllGather ? cpa::CommType::AllGather
           : t == C::A2AP2P    ? cpa::CommType::A2AP2P
                               : cpa::CommType::P2P;
  a.a2a = cx.cp_a2a_comm, a.p2p = cx.cp_p2p_comm;
  a.ad = layer_dims(cx, layer), a.scale = cx.scale, a.dropout_p = cx.p_attn;
  a.key = dropout_key(*cx.cfg, cx.keys, layer, DropoutSite::AttnProbs);
  return a;
}

// The step's attention dims with this layer's saved keep bits (when it keeps them).
ops::AttentionDims with_keep(const ops::AttentionDims& ad, const CoreAttention::Saved& s) {
  if (!s.keep.defined() || ad.key_start.defined()) return ad;
  ops::AttentionDims d = ad;
  d.keep_bits = s.keep;
  return d;
}
}  // namespace

bool CoreAttention::keeps_output(const TransformerConfig& c) {
  return c.recompute != TransformerConfig::Recompute::Selective || !c.recompute_core_attn;
}

bool CoreAttention::saves_dropout_mask(const TransformerConfig& c, int64_t S) {
  // MCPP_ATTENTION_SAVE_MASK=0: the backward draws the mask again (docs/environment.md).
  static const bool off = [] {
    const char* e = std::getenv("MCPP_ATTENTION_SAVE_MASK");
    return e && e[0] == '0';
  }();
  if (off || !(c.attention_dropout > 0) || c.device != Device::CUDA || c.cp_size != 1 ||
      S % 8 != 0 || !keeps_output(c))
    return false;
  return ops::choose_attention_backend(ops::attention_backend_query(
                                           c.device, c.dtype, c.kv_channels, c.attention_dropout))
             .backend == ops::AttentionBackend::Flash;
}

void CoreAttention::saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                                const TensorVisitor& v) {
  const int64_t NH = c.local_heads();
  v(s.ctx, {d.T, NH * c.kv_channels}, d.dt, keeps_output(c));
  v(s.lse, {d.B, NH, d.S}, d.sdt, keeps_output(c));
  v(s.keep, {(ops::flash_dropout_mask_bytes(d.B, NH, d.S) + 7) / 8}, DType::I64,
    saves_dropout_mask(c, d.S));
}

void CoreAttention::scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                                  const TensorVisitor& v) {
  const int64_t NH = c.local_heads();
  v(ws.sel_ctx, {d.T, NH * c.kv_channels}, d.dt, !keeps_output(c));
  v(ws.sel_lse, {d.B, NH, d.S}, d.sdt, !keeps_output(c));
}

void CoreAttention::forward(const Tensor& qkv, Saved& s, Workspace& ws,
                            const StepContext& cx) const {
  if (cx.cp_comm) {
    auto a = cp_args(cx, layer_);
    a.sink = sink(cx), a.dsink = sink_.g;
    parallel::context_parallel::attention_forward(a, qkv, *cx.cp_comm, ctx(s, ws), lse(s, ws),
                                                  cx.stream());
    return;
  }
  const ops::AttentionDims d = with_keep(layer_dims(cx, layer_), s);
  ops::attention_forward(qkv, d, cx.scale, cx.p_attn,
                         dropout_key(*cx.cfg, cx.keys, layer_, DropoutSite::AttnProbs), ctx(s, ws),
                         lse(s, ws), cx.stream());
  if (const Tensor z = sink(cx); z.defined())
    ops::attention_sink_forward(ctx(s, ws), lse(s, ws), z, 0, d, cx.stream());
}

ops::AttentionDims CoreAttention::cached_dims(const StepContext& cx) const {
  ops::AttentionDims d = cx.ad;
  d.sink = sink(cx);
  if (cx.cfg->is_window_layer(layer_)) d.window_left = cx.cfg->window_left;
  return d;
}

void CoreAttention::forward_cached(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Saved& s,
                                   const StepContext& cx) const {
  ensure(s.ctx, {cx.T, cx.ad.NH * cx.ad.HD}, cx.dt, cx.dev);
  if (cx.uniform_pos && cx.s0 == 0) {  // prompts from position 0: the training attention
    ensure(s.lse, {cx.B, cx.ad.NH, cx.S}, DType::F32, cx.dev);
    ops::attention_prefill(qkv, cached_dims(cx), cx.scale, k_cache, v_cache, s.ctx, s.lse,
                           cx.stream());
    return;
  }
  ops::attention_kv_cache_forward(qkv, cached_dims(cx), cx.pos_dev, cx.scale, k_cache, v_cache,
                                  s.ctx, cx.stream());
}

void CoreAttention::recompute(const Tensor& qkv, Saved& s, Workspace& ws,
                              const StepContext& cx) const {
  if (!keep_) forward(qkv, s, ws, cx);  // dropout masks are keyed: bitwise the original
}

void CoreAttention::backward(const Tensor& dctx, const Tensor& qkv, Saved& s, Tensor& dqkv,
                             Workspace& ws, const StepContext& cx) const {
  if (cx.cp_comm) {
    auto a = cp_args(cx, layer_);
    a.sink = sink(cx), a.dsink = sink_.g;
    parallel::context_parallel::attention_backward(a, dctx, qkv, ctx(s, ws), lse(s, ws),
                                                   *cx.cp_comm, dqkv, cx.stream());
    return;
  }
  const ops::AttentionDims d = with_keep(layer_dims(cx, layer_), s);
  if (Tensor dsink = sink_.g; dsink.defined())
    ops::attention_sink_backward(dctx, ctx(s, ws), lse(s, ws), sink_.w, 0, d, dsink, cx.stream());
  ops::attention_backward(dctx, qkv, ctx(s, ws), lse(s, ws), d, cx.scale, cx.p_attn,
                          dropout_key(*cx.cfg, cx.keys, layer_, DropoutSite::AttnProbs), dqkv,
                          cx.stream());
}

}  // namespace mcpp::model
