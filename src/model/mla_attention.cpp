#include "model/mla_attention.h"

#include <algorithm>

#include "ops/mla.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

namespace {
std::string name(int layer, const char* s) { return layer_param_name(layer, s); }

// A weight registered unsplit on every TP rank whose gradient each rank only partly forms
// (from its own heads): finalize_model_grads sums it over TP (ParamInfo::tp_partial); in
// FP8 each rank forms all of it (MlaAttention::latent_grads_whole).
ParamInfo replicated(const TransformerConfig& c, const std::string& n, Shape shape, Init init,
                     double std, bool decay, int layer) {
  ParamInfo p = make_param(n, std::move(shape), TpSplit::None, init, std, decay, layer, c.tp_size);
  p.tp_partial = c.tp_size > 1 && !MlaAttention::latent_grads_whole(c, layer);
  return p;
}

// y [T, a+b] -> its columns a [T, a] and b [T, b], through its transpose yT [a+b, T] (rows
// narrow, columns do not); join_cols is the inverse.
void split_cols(const Tensor& y, Tensor& a, Tensor& b, Tensor& yT, Stream& st) {
  ops::transpose(y, yT, st);
  const int64_t na = a.size(1);
  ops::transpose(yT.narrow(0, na), a, st);
  ops::transpose(yT.narrow(na, b.size(1)), b, st);
}
void join_cols(const Tensor& a, const Tensor& b, Tensor& y, Tensor& yT, Stream& st) {
  const int64_t na = a.size(1);
  Tensor top = yT.narrow(0, na), bottom = yT.narrow(na, b.size(1));
  ops::transpose(a, top, st);
  ops::transpose(b, bottom, st);
  ops::transpose(yT, y, st);
}
}  // namespace

bool MlaAttention::latent_grads_whole(const TransformerConfig& c, int layer) {
  return c.tp_size > 1 && c.fp8.layer_in_fp8(layer, c.num_layers);
}

ops::MlaDims mla_dims(const TransformerConfig& c) {
  ops::MlaDims d;
  d.heads = c.local_heads(), d.Dn = c.mla.qk_head_dim, d.Dr = c.mla.qk_pos_emb_head_dim;
  d.Dv = c.mla.v_head_dim;
  return d;
}

ops::MlaRope mla_rope(const TransformerConfig& c) {
  const auto& m = c.mla;
  ops::MlaRope r;
  r.base = c.rotary_base, r.yarn = m.yarn, r.factor = m.rotary_scaling_factor;
  r.original_max_positions = m.original_max_positions;
  r.beta_fast = m.beta_fast, r.beta_slow = m.beta_slow;
  // YaRN's concentration factor (Megatron's _yarn_get_concentration_factor) scales cos and
  // sin; plain RoPE leaves them.
  r.mscale = m.yarn ? ops::yarn_concentration(m.rotary_scaling_factor, m.mscale, m.mscale_all_dim)
                    : 1.0;
  return r;
}

void MlaAttention::add_params(const TransformerConfig& c, int layer,
                              std::vector<ParamInfo>& params) {
  const auto& m = c.mla;
  const int64_t H = c.hidden_size, NH = c.num_attention_heads, Dq = m.q_head_dim();
  const double sd = c.init_method_std;
  const Init norm_init = Init::Ones;
  if (m.q_lora_rank > 0) {
    params.push_back(replicated(c, name(layer, "self_attention.linear_q_down_proj.weight"),
                                {m.q_lora_rank, H}, Init::Normal, sd, true, layer));
    if (c.qk_layernorm)
      params.push_back(replicated(c, name(layer, "self_attention.q_layernorm.weight"),
                                  {m.q_lora_rank}, norm_init, 0, false, layer));
    params.push_back(make_param(name(layer, "self_attention.linear_q_up_proj.weight"),
                                {NH * Dq, m.q_lora_rank}, TpSplit::Rows, Init::Normal, sd, true,
                                layer, c.tp_size));
  } else {
    params.push_back(make_param(name(layer, "self_attention.linear_q_proj.weight"), {NH * Dq, H},
                                TpSplit::Rows, Init::Normal, sd, true, layer, c.tp_size));
  }
  params.push_back(replicated(c, name(layer, "self_attention.linear_kv_down_proj.weight"),
                              {m.kv_lora_rank + m.qk_pos_emb_head_dim, H}, Init::Normal, sd, true,
                              layer));
  if (c.qk_layernorm)
    params.push_back(replicated(c, name(layer, "self_attention.kv_layernorm.weight"),
                                {m.kv_lora_rank}, norm_init, 0, false, layer));
  params.push_back(make_param(name(layer, "self_attention.linear_kv_up_proj.weight"),
                              {NH * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank},
                              TpSplit::Rows, Init::Normal, sd, true, layer, c.tp_size));
  RowParallelLinear::add_params(c, name(layer, "self_attention.linear_proj"), layer, H,
                                NH * m.v_head_dim, output_init_std(c), c.add_bias_linear, params);
}

MlaAttention::MlaAttention(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      q_proj_(ParamStore::view(store, name(layer, "self_attention.linear_q_proj.weight"))),
      q_down_(ParamStore::view(store, name(layer, "self_attention.linear_q_down_proj.weight"))),
      q_up_(ParamStore::view(store, name(layer, "self_attention.linear_q_up_proj.weight"))),
      kv_down_(ParamStore::view(store, name(layer, "self_attention.linear_kv_down_proj.weight"))),
      kv_up_(ParamStore::view(store, name(layer, "self_attention.linear_kv_up_proj.weight"))),
      q_norm_(ParamStore::view(store, name(layer, "self_attention.q_layernorm.weight"))),
      kv_norm_(ParamStore::view(store, name(layer, "self_attention.kv_layernorm.weight"))),
      core_(c, layer, store),
      proj_(store, name(layer, "self_attention.linear_proj.weight"),
            name(layer, "self_attention.linear_proj.bias")),
      q_proj_fp8_(store, name(layer, "self_attention.linear_q_proj.weight")),
      q_down_fp8_(store, name(layer, "self_attention.linear_q_down_proj.weight")),
      q_up_fp8_(store, name(layer, "self_attention.linear_q_up_proj.weight")),
      kv_down_fp8_(store, name(layer, "self_attention.linear_kv_down_proj.weight")),
      kv_up_fp8_(store, name(layer, "self_attention.linear_kv_up_proj.weight")),
      recompute_up_(c.recompute == TransformerConfig::Recompute::Selective &&
                    c.recompute_mla_up_proj) {}

void MlaAttention::saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                               const TensorVisitor& v) {
  const auto& m = c.mla;
  const bool q_lat = m.q_lora_rank > 0, ln = c.qk_layernorm;
  v(s.q_lat, {d.T, m.q_lora_rank}, d.dt, q_lat);
  v(s.q_ln, {d.T, m.q_lora_rank}, d.dt, q_lat && ln);
  v(s.q_rstd, {d.T}, d.sdt, q_lat && ln);
  v(s.kv_lat, {d.T, m.kv_lora_rank}, d.dt, true);
  v(s.kv_ln, {d.T, m.kv_lora_rank}, d.dt, ln);
  v(s.kv_rstd, {d.T}, d.sdt, ln);
  const bool rc = c.recompute == TransformerConfig::Recompute::Selective &&
                  c.recompute_mla_up_proj;
  v(s.qkv, {d.T, c.qkv_width_local()}, d.dt, !rc);
  v(s.kpe, {d.T, m.qk_pos_emb_head_dim}, d.dt, rc);
  CoreAttention::saved_specs(c, d, s.core, v);
}

void MlaAttention::scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                                 const TensorVisitor& v) {
  const auto& m = c.mla;
  const int64_t NHl = c.local_heads();
  v(ws.dln_full, {d.T, d.H}, d.dt, d.sp);  // the gathered input, then d x_f (SP)
  RowParallelLinear::scratch_specs(d, ws, v);
  CoreAttention::scratch_specs(c, d, ws, v);
  v(ws.mla_q, {d.T, NHl * m.q_head_dim()}, d.dt, true);
  v(ws.mla_kv, {d.T, NHl * (m.qk_head_dim + m.v_head_dim)}, d.dt, true);
  v(ws.mla_kpe, {d.T, m.qk_pos_emb_head_dim}, d.dt, true);
  v(ws.mla_ctx, {d.T, NHl * m.v_head_dim}, d.dt, true);
  v(ws.mla_dctx, {d.T, NHl * m.v_head_dim}, d.dt, true);
  v(ws.mla_dql, {d.T, m.q_lora_rank}, d.dt, m.q_lora_rank > 0);
  v(ws.mla_dkvl, {d.T, m.kv_lora_rank}, d.dt, true);
  v(ws.mla_dqln, {d.T, m.q_lora_rank}, d.dt, m.q_lora_rank > 0 && c.qk_layernorm);
  v(ws.mla_dkvln, {d.T, m.kv_lora_rank}, d.dt, c.qk_layernorm);
  v(ws.dctx, {d.T, NHl * c.kv_channels}, d.dt, true);
  v(ws.dqkv, {d.T, c.qkv_width_local()}, d.dt, true);
  v(ws.mla_qkv, {d.T, c.qkv_width_local()}, d.dt,
    c.recompute == TransformerConfig::Recompute::Selective && c.recompute_mla_up_proj);
  const bool f8 = c.fp8.enabled();
  v(ws.mla_kvd, {d.T, m.kv_lora_rank + m.qk_pos_emb_head_dim}, d.dt, f8);
  v(ws.mla_kvdT, {m.kv_lora_rank + m.qk_pos_emb_head_dim, d.T}, d.dt, f8);
  v(ws.mla_dx2, {d.T, d.H}, d.dt, f8);
}

void MlaAttention::linear(const Fp8Linear& f, const Tensor& x, const Tensor& w, Tensor& y,
                          const StepContext& cx) const {
  const Tensor none;
  if (fp8(cx))
    f.forward(x, false, w, none, none, y, cx);
  else
    ops::linear_forward(x, w, none, y, cx.stream());
}

void MlaAttention::project(const Tensor& xf, Saved& s, Tensor& qkv, Workspace& ws,
                           const StepContext& cx) const {
  const auto& c = *cfg_;
  const auto& m = c.mla;
  Stream& st = cx.stream();
  const Tensor none;
  const double eps = c.norm_epsilon;
  if (m.q_lora_rank > 0) {
    ensure(s.q_lat, {cx.T, m.q_lora_rank}, cx.dt, cx.dev);  // generation: no specs ran
    linear(q_down_fp8_, xf, q_down_.w, s.q_lat, cx);
    if (c.qk_layernorm) {
      ensure(s.q_ln, s.q_lat.shape(), cx.dt, cx.dev);
      ensure(s.q_rstd, {cx.T}, cx.sdt, cx.dev);
      ops::rmsnorm_forward(s.q_lat, q_norm_.w, eps, s.q_ln, s.q_rstd, st);
    }
    linear(q_up_fp8_, c.qk_layernorm ? s.q_ln : s.q_lat, q_up_.w, ws.mla_q, cx);
  } else {
    linear(q_proj_fp8_, xf, q_proj_.w, ws.mla_q, cx);
  }
  ensure(s.kv_lat, {cx.T, m.kv_lora_rank}, cx.dt, cx.dev);
  if (fp8(cx)) {  // one FP8 GEMM over the whole weight (one scale, as Megatron's), then split
    const int64_t n = m.kv_lora_rank + m.qk_pos_emb_head_dim;
    ensure(ws.mla_kvd, {cx.T, n}, cx.dt, cx.dev);
    ensure(ws.mla_kvdT, {n, cx.T}, cx.dt, cx.dev);
    kv_down_fp8_.forward(xf, false, kv_down_.w, none, none, ws.mla_kvd, cx);
    split_cols(ws.mla_kvd, s.kv_lat, ws.mla_kpe, ws.mla_kvdT, st);
  } else {
    ops::linear_forward(xf, kv_down_.w.narrow(0, m.kv_lora_rank), none, s.kv_lat, st);
    ops::linear_forward(xf, kv_down_.w.narrow(m.kv_lora_rank, m.qk_pos_emb_head_dim), none,
                        ws.mla_kpe, st);
  }
  if (c.qk_layernorm) {
    ensure(s.kv_ln, s.kv_lat.shape(), cx.dt, cx.dev);
    ensure(s.kv_rstd, {cx.T}, cx.sdt, cx.dev);
    ops::rmsnorm_forward(s.kv_lat, kv_norm_.w, eps, s.kv_ln, s.kv_rstd, st);
  }
  linear(kv_up_fp8_, c.qk_layernorm ? s.kv_ln : s.kv_lat, kv_up_.w, ws.mla_kv, cx);
  ensure(qkv, {cx.T, c.qkv_width_local()}, cx.dt, cx.dev);
  pack(false, qkv, ws, cx);
}

void MlaAttention::rebuild_qkv(const Tensor& x, Saved& s, Workspace& ws,
                               const StepContext& cx) const {
  const auto& c = *cfg_;
  const auto& m = c.mla;
  Stream& st = cx.stream();
  // FP8: the same casts of the same tensors with the same scales (the delayed ones change
  // after the step; the current ones are the same amaxes'), so the same bits.
  if (m.q_lora_rank > 0) {
    linear(q_up_fp8_, c.qk_layernorm ? s.q_ln : s.q_lat, q_up_.w, ws.mla_q, cx);
  } else {  // q = x_f Wq^T: x gathered again under SP (its buffer is free until backward's)
    const bool sp = cx.tp_comm && cx.sp;
    if (sp) parallel::gather_from_sp(x, ws.dln_full, *cx.tp_comm, st);
    linear(q_proj_fp8_, sp ? ws.dln_full : x, q_proj_.w, ws.mla_q, cx);
  }
  linear(kv_up_fp8_, c.qk_layernorm ? s.kv_ln : s.kv_lat, kv_up_.w, ws.mla_kv, cx);
  ops::copy(s.kpe, ws.mla_kpe, st);
  pack(false, ws.mla_qkv, ws, cx);
}

void MlaAttention::pack(bool backward, Tensor& packed, Workspace& ws,
                        const StepContext& cx) const {
  const ops::MlaDims d = mla_dims(*cfg_);
  const ops::MlaRope r = mla_rope(*cfg_);
  Stream& st = cx.stream();
  auto run = [&](int64_t row0, int64_t rows, int64_t pos0, const Tensor& positions) {
    auto rows_of = [&](const Tensor& t) { return t.narrow(row0, rows); };
    if (backward) {
      Tensor dq = rows_of(ws.mla_q), dkv = rows_of(ws.mla_kv), dkpe = rows_of(ws.mla_kpe);
      ops::mla_qkv_backward(rows_of(packed), d, r, cx.B, pos0, positions, dq, dkv, dkpe, st);
    } else {
      Tensor out = rows_of(packed);
      ops::mla_qkv_forward(rows_of(ws.mla_q), rows_of(ws.mla_kv), rows_of(ws.mla_kpe), d, r,
                           cx.B, pos0, positions, out, st);
    }
  };
  const Tensor none;
  if (cx.pos) {  // generation: positions from the cache lengths
    if (cx.uniform_pos)
      run(0, cx.T, cx.s0, none);
    else  // one new row per sequence (Sq = 1), each at its own position
      run(0, cx.T, 0, cx.pos_dev);
    return;
  }
  if (cx.position_ids.defined()) {  // --reset-position-ids: each token at its document place
    run(0, cx.T, 0, cx.position_ids);
    return;
  }
  for_each_global_run(cx, 0, cx.S, [&](int64_t r0, int64_t n, int64_t pos) {
    run(r0 * cx.B, n * cx.B, pos, none);
  });
}

// The projections read the gathered input (SP), the core the packed qkv, the output
// projection the core's output narrowed to the value width.
void MlaAttention::forward(const Tensor& x, Saved& s, const Tensor* residual, Tensor& y,
                           Workspace& ws, const StepContext& cx) const {
  const Tensor* xf = &x;
  if (cx.tp_comm && cx.sp) {
    parallel::gather_from_sp(x, ws.dln_full, *cx.tp_comm, cx.stream());
    xf = &ws.dln_full;
  }
  // mla_up_proj: qkv to the shared buffer (read by the core now, rebuilt in backward); the
  // key's position part kept, the latents kept as always.
  Tensor& qkv = recompute_up_ ? ws.mla_qkv : s.qkv;
  project(*xf, s, qkv, ws, cx);
  if (recompute_up_) ops::copy(ws.mla_kpe, s.kpe, cx.stream());
  core_.forward(qkv, s.core, ws, cx);
  ops::mla_ctx_narrow(core_.ctx(s.core, ws), mla_dims(*cfg_), ws.mla_ctx, cx.stream());
  if (residual)
    proj_.forward_residual(ws.mla_ctx, *residual, y, cx);
  else
    proj_.forward(ws.mla_ctx, y, ws, cx);
}

void MlaAttention::forward_cached(const Tensor& x, Saved& s, Tensor& k_cache, Tensor& v_cache,
                                  const Tensor* residual, Tensor& y, Workspace& ws,
                                  const StepContext& cx, const Norm::Fold* fold) const {
  const auto& c = *cfg_;
  const auto& m = c.mla;
  const int64_t NHl = c.local_heads();
  ensure(ws.mla_q, {cx.T, NHl * m.q_head_dim()}, cx.dt, cx.dev);
  ensure(ws.mla_kv, {cx.T, NHl * (m.qk_head_dim + m.v_head_dim)}, cx.dt, cx.dev);
  ensure(ws.mla_kpe, {cx.T, m.qk_pos_emb_head_dim}, cx.dt, cx.dev);
  ensure(ws.mla_ctx, {cx.T, NHl * m.v_head_dim}, cx.dt, cx.dev);
  const Tensor* in = &x;
  if (fold) {  // x is the layer norm's input: the norm first (no fused decode kernel here)
    ensure(fold->s->y, x.shape(), cx.dt, cx.dev);
    ensure(fold->s->rstd, {x.shape()[0]}, cx.sdt, cx.dev);
    ops::rmsnorm_forward(x, *fold->w, fold->eps, fold->s->y, fold->s->rstd, cx.stream());
    in = &fold->s->y;
  }
  project(*in, s, s.qkv, ws, cx);
  core_.forward_cached(s.qkv, k_cache, v_cache, s.core, cx);
  ops::mla_ctx_narrow(s.core.ctx, mla_dims(c), ws.mla_ctx, cx.stream());
  if (residual)
    proj_.forward_residual(ws.mla_ctx, *residual, y, cx);
  else
    proj_.forward(ws.mla_ctx, y, ws, cx);
}

void MlaAttention::prepare_backward(Saved& s, Workspace& ws, const StepContext& cx) const {
  if (!recompute_up_) core_.recompute(s.qkv, s.core, ws, cx);  // else in backward, after qkv
}

// Mirrors forward: projection, core, unpacking, the up projections and latent norms, then
// the down projections' weight gradients (on the gathered input) before their data
// gradients, which share its buffer under SP, and the one TP reduction of d x_f.
void MlaAttention::backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx,
                            Workspace& ws, const StepContext& cx) {
  const auto& c = *cfg_;
  const auto& m = c.mla;
  Stream& st = cx.stream();
  const ops::MlaDims d = mla_dims(c);
  Tensor none;
  if (recompute_up_) {  // mla_up_proj: qkv again from the latents, then the core's recompute
    rebuild_qkv(x, s, ws, cx);
    core_.recompute(ws.mla_qkv, s.core, ws, cx);
  }
  const Tensor& qkv = recompute_up_ ? ws.mla_qkv : s.qkv;
  ops::mla_ctx_narrow(core_.ctx(s.core, ws), d, ws.mla_ctx, st);  // the projection's input
  proj_.backward(dy, ws.mla_ctx, ws.mla_dctx, ws, cx);
  ops::mla_ctx_pad(ws.mla_dctx, d, ws.dctx, st);
  core_.backward(ws.dctx, qkv, s.core, ws.dqkv, ws, cx);
  pack(true, ws.dqkv, ws, cx);  // dq -> ws.mla_q, dkv -> ws.mla_kv, dkpe -> ws.mla_kpe
  if (fp8(cx)) return backward_fp8(x, s, dx, ws, cx);
  const bool ln = c.qk_layernorm;
  // Key/value latent: d ckv (partial over this rank's heads).
  if (ln) {
    ops::linear_backward(ws.mla_kv, s.kv_ln, kv_up_.w, ws.mla_dkvln, false, kv_up_.g, none, st);
    ops::rmsnorm_backward(ws.mla_dkvln, s.kv_lat, kv_norm_.w, s.kv_rstd, ws.mla_dkvl, false,
                          kv_norm_.g, st);
  } else {
    ops::linear_backward(ws.mla_kv, s.kv_lat, kv_up_.w, ws.mla_dkvl, false, kv_up_.g, none, st);
  }
  // Query latent.
  if (m.q_lora_rank > 0 && ln) {
    ops::linear_backward(ws.mla_q, s.q_ln, q_up_.w, ws.mla_dqln, false, q_up_.g, none, st);
    ops::rmsnorm_backward(ws.mla_dqln, s.q_lat, q_norm_.w, s.q_rstd, ws.mla_dql, false,
                          q_norm_.g, st);
  } else if (m.q_lora_rank > 0) {
    ops::linear_backward(ws.mla_q, s.q_lat, q_up_.w, ws.mla_dql, false, q_up_.g, none, st);
  }
  // The down projections: weight gradients on x_f (gathered again under SP), then d x_f.
  const bool sp = cx.tp_comm && cx.sp;
  if (sp) parallel::gather_from_sp(x, ws.dln_full, *cx.tp_comm, st);
  const Tensor& xf = sp ? ws.dln_full : x;
  Tensor w_lat = kv_down_.w.narrow(0, m.kv_lora_rank);
  Tensor w_pe = kv_down_.w.narrow(m.kv_lora_rank, m.qk_pos_emb_head_dim);
  Tensor g_lat = kv_down_.g.narrow(0, m.kv_lora_rank);
  Tensor g_pe = kv_down_.g.narrow(m.kv_lora_rank, m.qk_pos_emb_head_dim);
  const Tensor& dq_in = m.q_lora_rank > 0 ? ws.mla_dql : ws.mla_q;
  const ParamView& wq = m.q_lora_rank > 0 ? q_down_ : q_proj_;
  Tensor gq = wq.g;
  ops::linear_backward(dq_in, xf, wq.w, none, false, gq, none, st);
  ops::linear_backward(ws.mla_dkvl, xf, w_lat, none, false, g_lat, none, st);
  ops::linear_backward(ws.mla_kpe, xf, w_pe, none, false, g_pe, none, st);
  Tensor& dxf = sp ? ws.dln_full : dx;
  ops::linear_backward(dq_in, xf, wq.w, dxf, false, none, none, st);
  ops::linear_backward(ws.mla_dkvl, xf, w_lat, dxf, true, none, none, st);
  ops::linear_backward(ws.mla_kpe, xf, w_pe, dxf, true, none, none, st);
  if (!cx.tp_comm) return;
  if (sp)
    parallel::gather_from_sp_backward(ws.dln_full, dx, *cx.tp_comm, st);
  else
    parallel::copy_to_tp_backward(dx, *cx.tp_comm, st);
}

// FP8: the up projections' data gradients all-reduced over TP (whole latent gradients),
// then the norms, the down projections' weight gradients on x_f and their data gradients,
// summed. Without a query latent, q_proj's d x_f is this rank's heads' part: the whole
// down-projection part is added on TP rank 0 only, before the one reduction.
void MlaAttention::backward_fp8(const Tensor& x, Saved& s, Tensor& dx, Workspace& ws,
                                const StepContext& cx) {
  const auto& c = *cfg_;
  const auto& m = c.mla;
  Stream& st = cx.stream();
  comm::Communicator* tp = cx.tp_comm;
  const bool ln = c.qk_layernorm, q_lat = m.q_lora_rank > 0;
  const ParamView nob;
  Tensor none;
  auto up = [&](const Fp8Linear& f, const ParamView& w, const Tensor& dy, const Tensor& in,
                Tensor& din) {
    f.backward(dy, tp != nullptr, in, false, w, nob, din, true, cx);
    if (tp) parallel::copy_to_tp_backward(din, *tp, st);
  };
  up(kv_up_fp8_, kv_up_, ws.mla_kv, ln ? s.kv_ln : s.kv_lat, ln ? ws.mla_dkvln : ws.mla_dkvl);
  if (ln)
    ops::rmsnorm_backward(ws.mla_dkvln, s.kv_lat, kv_norm_.w, s.kv_rstd, ws.mla_dkvl, false,
                          kv_norm_.g, st);
  if (q_lat) {
    up(q_up_fp8_, q_up_, ws.mla_q, ln ? s.q_ln : s.q_lat, ln ? ws.mla_dqln : ws.mla_dql);
    if (ln)
      ops::rmsnorm_backward(ws.mla_dqln, s.q_lat, q_norm_.w, s.q_rstd, ws.mla_dql, false,
                            q_norm_.g, st);
  }
  if (tp) parallel::copy_to_tp_backward(ws.mla_kpe, *tp, st);  // over every rank's heads
  join_cols(ws.mla_dkvl, ws.mla_kpe, ws.mla_kvd, ws.mla_kvdT, st);  // kv_down's d output
  const bool sp = tp && cx.sp;
  if (sp) parallel::gather_from_sp(x, ws.dln_full, *tp, st);
  const Tensor& xf = sp ? ws.dln_full : x;
  const Fp8Linear& fq = q_lat ? q_down_fp8_ : q_proj_fp8_;
  const ParamView& wq = q_lat ? q_down_ : q_proj_;
  const Tensor& dq = q_lat ? ws.mla_dql : ws.mla_q;
  const bool partial = !q_lat && tp;  // q_proj's output gradient: this rank's heads
  // The weight gradients first: under SP x_f and d x_f share dln_full.
  fq.backward(dq, partial, xf, false, wq, nob, none, true, cx);
  kv_down_fp8_.backward(ws.mla_kvd, false, xf, false, kv_down_, nob, none, true, cx);
  Tensor& dxf = sp ? ws.dln_full : dx;
  fq.backward(dq, partial, xf, false, wq, nob, dxf, false, cx);
  kv_down_fp8_.backward(ws.mla_kvd, false, xf, false, kv_down_, nob, ws.mla_dx2, false, cx);
  if (!partial || tp->rank() == 0) ops::add(dxf, ws.mla_dx2, dxf, st);
  if (partial) {
    if (sp)
      parallel::gather_from_sp_backward(ws.dln_full, dx, *tp, st);
    else
      parallel::copy_to_tp_backward(dx, *tp, st);
  } else if (sp) {  // whole on every rank: this rank's rows
    const int64_t Tl = dx.size(0);
    ops::copy(ws.dln_full.narrow(tp->rank() * Tl, Tl), dx, st);
  }
}

}  // namespace mcpp::model
