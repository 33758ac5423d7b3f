#include "model/attention.h"

#include <cmath>

#include "ops/ops.h"
#include "ops/rope_math.h"
#include "ops/rope_interleave.h"

namespace mcpp::model {

ops::RopeFreqs rope_freqs(const TransformerConfig& c) {
  ops::RopeFreqs f(c.rotary_base);
  f.scaled = c.rope_scaling;
  f.factor = c.rope_scaling_factor;
  f.low_freq_factor = c.rope_low_freq_factor;
  f.high_freq_factor = c.rope_high_freq_factor;
  f.original_max_positions = c.rope_original_max_positions;
  f.interpolation = c.seq_len_interpolation_factor;
  if (c.yarn.on) {
    const auto& y = c.yarn;
    f.yarn = true, f.factor = y.factor, f.original_max_positions = y.original_max_positions;
    f.beta_fast = y.beta_fast, f.beta_slow = y.beta_slow, f.yarn_round_to_int = y.round_to_int;
    f.mscale = ops::yarn_concentration(y.factor, y.mscale, y.mscale_all_dim);
  }
  return f;
}

namespace {
std::string prefix(int layer, const char* s) { return layer_param_name(layer, s); }

// --rotary-interleaved: this rank's qkv layout for the permutation (ops/rope_interleave.h).
ops::RopePermuteDims permute_dims(const TransformerConfig& c) {
  ops::RopePermuteDims d;
  d.groups = c.local_groups(), d.heads_per_group = c.heads_per_group();
  d.head_dim = c.kv_channels, d.rot_dim = c.rot_dim();
  return d;
}

// RoPE (or its inverse) on this rank's rows of qkv [S*B, QKVW]: one call at CP 1, one per
// chunk under context parallelism, each at its global positions.
void rope_rows(bool backward, const Tensor& in, Tensor& out, const TransformerConfig& c,
               const StepContext& cx) {
  if (cx.position_ids.defined()) {  // --reset-position-ids: each token at its document place
    ops::rope_positions(in, cx.ad, c.rot_dim(), rope_freqs(c), cx.position_ids, backward, out,
                        cx.stream());
    return;
  }
  for_each_global_run(cx, 0, cx.S, [&](int64_t r0, int64_t n, int64_t pos) {
    ops::AttentionDims d = cx.ad;
    d.S = n;
    const Tensor src = in.narrow(r0 * cx.B, n * cx.B);
    Tensor dst = out.narrow(r0 * cx.B, n * cx.B);
    if (backward)
      ops::rope_backward(src, d, c.rot_dim(), rope_freqs(c), pos, dst, cx.stream());
    else
      ops::rope_forward(src, d, c.rot_dim(), rope_freqs(c), pos, dst, cx.stream());
  });
}
}  // namespace

void Attention::add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params) {
  CoreAttention::add_params(c, layer, params);  // --softmax-type learnable's sinks
  if (c.mla.on) {
    MlaAttention::add_params(c, layer, params);
    return;
  }
  const int64_t H = c.hidden_size, NHD = c.num_attention_heads * c.kv_channels;
  ColumnParallelLinear::add_params(c, prefix(layer, "self_attention.linear_qkv"), layer,
                                   c.qkv_width(), H, TpSplit::Rows, c.init_method_std, c.qkv_bias(),
                                   params);
  RowParallelLinear::add_params(c, prefix(layer, "self_attention.linear_proj"), layer, H, NHD,
                                output_init_std(c), c.add_bias_linear, params);
  // Megatron-Core's names (TENorm of --normalization over HD: LayerNorm's has a bias);
  // weights ones (zeros under 1p), biases zeros; no decay unless --apply-wd-to-qk-layernorm,
  // which decays the biases too (get_standard_config_overrides exempts every "q_layernorm." /
  // "k_layernorm." parameter from the no-decay rule; decay then applies to the stored value,
  // w - 1 under 1p, as Megatron's optimizer sees it). Each TP rank normalises its own heads
  // with the shared [HD] parameters: their gradients are partial sums over TP, with or without
  // SP (finalize_model_grads all-reduces them, as Megatron's
  // _allreduce_non_tensor_model_parallel_grads does for q_layernorm / k_layernorm).
  if (!c.qk_layernorm) return;
  auto add = [&](const char* n, Init init) {
    ParamInfo p = make_param(prefix(layer, n), {c.kv_channels}, TpSplit::None, init, 0,
                             c.qk_layernorm_weight_decay, layer, c.tp_size);
    p.tp_partial = c.tp_size > 1;
    params.push_back(std::move(p));
  };
  const Init w_init = c.zero_centered_gamma ? Init::Zeros : Init::Ones;
  add("self_attention.q_layernorm.weight", w_init);
  if (!c.rmsnorm) add("self_attention.q_layernorm.bias", Init::Zeros);
  add("self_attention.k_layernorm.weight", w_init);
  if (!c.rmsnorm) add("self_attention.k_layernorm.bias", Init::Zeros);
}

Attention::Attention(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      qkv_(store, prefix(layer, "self_attention.linear_qkv.weight"),
           prefix(layer, "self_attention.linear_qkv.bias")),
      core_(c, layer, store),
      proj_(store, prefix(layer, "self_attention.linear_proj.weight"),
            prefix(layer, "self_attention.linear_proj.bias")),
      rope_(c.layer_rope(layer)) {
  if (c.mla.on) mla_ = MlaAttention(c, layer, store);
  if (c.qk_l2_norm && store) {  // the weightless norm: ones, and gradients nobody reads
    const Device dev = c.device;
    Stream& st = ops::default_stream(dev);
    for (Tensor* t : {&l2_ones_, &l2_grad_}) *t = Tensor::empty({c.kv_channels}, c.dtype, dev);
    ops::fill(l2_ones_, 1.0, st);
    ops::fill(l2_grad_, 0.0, st);
  }
  if (!c.qk_layernorm || c.mla.on) return;
  q_norm_ = ParamStore::view(store, prefix(layer, "self_attention.q_layernorm.weight"));
  k_norm_ = ParamStore::view(store, prefix(layer, "self_attention.k_layernorm.weight"));
  if (c.rmsnorm) return;
  q_bias_ = ParamStore::view(store, prefix(layer, "self_attention.q_layernorm.bias"));
  k_bias_ = ParamStore::view(store, prefix(layer, "self_attention.k_layernorm.bias"));
}

void Attention::qk_norm_forward(const Tensor& in, Tensor& out, const StepContext& cx) const {
  const TransformerConfig& c = *cfg_;
  const int64_t r = c.heads_per_group();
  if (c.qk_l2_norm)
    ops::qk_norm_forward(in, l2_ones_, l2_ones_, r, c.norm_epsilon, false, out, cx.stream());
  else if (c.rmsnorm)
    ops::qk_norm_forward(in, q_norm_.w, k_norm_.w, r, c.norm_epsilon, c.zero_centered_gamma, out,
                         cx.stream());
  else
    ops::qk_layernorm_forward(in, q_norm_.w, q_bias_.w, k_norm_.w, k_bias_.w, r, c.norm_epsilon,
                              c.zero_centered_gamma, out, cx.stream());
}

void Attention::qk_norm_backward(const Tensor& in, Tensor& g, const StepContext& cx) {
  const TransformerConfig& c = *cfg_;
  const int64_t r = c.heads_per_group();
  if (c.qk_l2_norm)
    ops::qk_norm_backward(in, l2_ones_, l2_ones_, r, c.norm_epsilon, false, g, l2_grad_, l2_grad_,
                          cx.stream());
  else if (c.rmsnorm)
    ops::qk_norm_backward(in, q_norm_.w, k_norm_.w, r, c.norm_epsilon, c.zero_centered_gamma, g,
                          q_norm_.g, k_norm_.g, cx.stream());
  else
    ops::qk_layernorm_backward(in, q_norm_.w, k_norm_.w, r, c.norm_epsilon, c.zero_centered_gamma,
                               g, q_norm_.g, q_bias_.g, k_norm_.g, k_bias_.g, cx.stream());
}

void Attention::saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                            const TensorVisitor& v) {
  if (c.mla.on) {
    MlaAttention::saved_specs(c, d, s.mla, v);
    return;
  }
  ColumnParallelLinear::saved_specs(d, d.H, s.qkv_in, v);
  v(s.qkv, {d.T, c.qkv_width_local()}, d.dt, true);
  v(s.qk_in, {d.T, c.qkv_width_local()}, d.dt, c.qk_layernorm || c.qk_l2_norm);
  CoreAttention::saved_specs(c, d, s.core, v);
}

void Attention::scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                              const TensorVisitor& v) {
  if (c.mla.on) {
    MlaAttention::scratch_specs(c, d, ws, v);
    return;
  }
  ColumnParallelLinear::scratch_specs(d, ws, v);
  RowParallelLinear::scratch_specs(d, ws, v);
  CoreAttention::scratch_specs(c, d, ws, v);
  v(ws.dctx, {d.T, c.local_heads() * c.kv_channels}, d.dt, true);
  v(ws.dqkv, {d.T, c.qkv_width_local()}, d.dt, true);
}

void Attention::inference_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                                const TensorVisitor& v) {
  if (c.mla.on) {  // the latents and the packed qkv (the core's output is sized per step)
    MlaAttention::saved_specs(c, d, s.mla, v);
    return;
  }
  ColumnParallelLinear::saved_specs(d, d.H, s.qkv_in, v);
  v(s.qkv, {d.T, c.qkv_width_local()}, d.dt, true);
}

void Attention::forward(const Tensor& x, Saved& s, const Tensor* residual, Tensor& y, Workspace& ws,
                        const StepContext& cx) const {
  const auto& c = *cfg_;
  if (c.mla.on) {
    mla_.forward(x, s.mla, residual, y, ws, cx);
    return;
  }
  // --rotary-interleaved: the projection (and norms) into the backward's dqkv buffer, free
  // until then, and the permuted heads into the saved qkv.
  const bool permute = rope_ && c.rotary_interleaved;
  Tensor& pre = permute ? ws.dqkv : s.qkv;
  if (c.qk_layernorm || c.qk_l2_norm) {
    qkv_.forward(x, s.qkv_in, s.qk_in, ws, cx);
    qk_norm_forward(s.qk_in, pre, cx);
  } else {
    qkv_.forward(x, s.qkv_in, pre, ws, cx);
  }
  if (permute) ops::rope_deinterleave(pre, permute_dims(c), false, s.qkv, cx.stream());
  if (rope_) rope_rows(false, s.qkv, s.qkv, c, cx);
  core_.forward(s.qkv, s.core, ws, cx);
  const Tensor& ctx = core_.ctx(s.core, ws);
  if (residual)
    proj_.forward_residual(ctx, *residual, y, cx);
  else
    proj_.forward(ctx, y, ws, cx);
}

void Attention::forward_cached(const Tensor& x, Saved& s, Tensor& k_cache, Tensor& v_cache,
                               const Tensor* residual, Tensor& y, Workspace& ws,
                               const StepContext& cx, const Norm::Fold* fold,
                               const Tensor* next_weight) const {
  const auto& c = *cfg_;
  if (c.mla.on) {
    mla_.forward_cached(x, s.mla, k_cache, v_cache, residual, y, ws, cx, fold);
    return;
  }
  const bool permute = rope_ && c.rotary_interleaved;  // as forward: into dqkv, then permute
  if (permute) ensure(ws.dqkv, {cx.T, c.qkv_width_local()}, cx.dt, cx.dev);
  Tensor& pre = permute ? ws.dqkv : s.qkv;
  if (fold) {
    Tensor unused;
    qkv_.forward_folded(x, *fold, false, unused, pre, cx);
  } else {
    qkv_.forward(x, s.qkv_in, pre, ws, cx);
  }
  if (c.qk_layernorm || c.qk_l2_norm) qk_norm_forward(pre, pre, cx);
  if (permute) {
    ensure(s.qkv, {cx.T, c.qkv_width_local()}, cx.dt, cx.dev);
    ops::rope_deinterleave(pre, permute_dims(c), false, s.qkv, cx.stream());
  }
  // A decode step: RoPE at each row's position, the cache append and the attention in one op
  // (rope_decode + attention_kv_cache_forward; on the GPU one kernel for the usual head shapes).
  const bool decode_step = rope_ && cx.S == 1 && cx.pos_dev.defined();
  if (decode_step) {
    ensure(s.core.ctx, {cx.T, cx.ad.NH * cx.ad.HD}, cx.dt, cx.dev);
    const Tensor* const next[2] = {&proj_.weight(), next_weight};
    ops::rope_attention_decode(s.qkv, core_.cached_dims(cx), c.rot_dim(), rope_freqs(c), cx.pos_dev,
                               cx.scale, k_cache, v_cache, s.core.ctx, cx.stream(),
                               std::span<const Tensor* const>(next, next_weight ? 2 : 1));
  } else if (rope_ && cx.uniform_pos) {
    ops::rope_forward(s.qkv, cx.ad, c.rot_dim(), rope_freqs(c), cx.s0, s.qkv, cx.stream());
  } else if (rope_ && !cx.uniform_pos) {  // one row per sequence (Sq = 1), each at its position
    ops::AttentionDims d1 = cx.ad;
    d1.S = 1, d1.B = 1;
    const int64_t W = c.qkv_width_local();
    for (int64_t b = 0; b < cx.B; ++b) {
      Tensor row = s.qkv.narrow(b, 1).view({1, 1, W});
      ops::rope_forward(row, d1, c.rot_dim(), rope_freqs(c), cx.pos[b], row, cx.stream());
    }
  }
  if (!decode_step) core_.forward_cached(s.qkv, k_cache, v_cache, s.core, cx);
  if (residual)
    proj_.forward_residual(s.core.ctx, *residual, y, cx);
  else
    proj_.forward(s.core.ctx, y, ws, cx);
}

void Attention::prepare_backward(Saved& s, Workspace& ws, const StepContext& cx) const {
  if (cfg_->mla.on) {
    mla_.prepare_backward(s.mla, ws, cx);
    return;
  }
  core_.recompute(s.qkv, s.core, ws, cx);
}

// Mirrors forward: projection, core, RoPE, q/k norms, QKV.
void Attention::backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx, Workspace& ws,
                         const StepContext& cx) {
  const auto& c = *cfg_;
  if (c.mla.on) {
    mla_.backward(dy, x, s.mla, dx, ws, cx);
    return;
  }
  proj_.backward(dy, core_.ctx(s.core, ws), ws.dctx, ws, cx);
  core_.backward(ws.dctx, s.qkv, s.core, ws.dqkv, ws, cx);
  if (rope_) rope_rows(true, ws.dqkv, ws.dqkv, c, cx);
  // --rotary-interleaved: the permutation undone into the saved qkv, which the core has read
  // for the last time.
  Tensor& g = rope_ && c.rotary_interleaved ? s.qkv : ws.dqkv;
  if (rope_ && c.rotary_interleaved)
    ops::rope_deinterleave(ws.dqkv, permute_dims(c), true, s.qkv, cx.stream());
  if (c.qk_layernorm || c.qk_l2_norm) qk_norm_backward(s.qk_in, g, cx);
  qkv_.backward(g, x, s.qkv_in, dx, ws, cx);
}

}  // namespace mcpp::model
