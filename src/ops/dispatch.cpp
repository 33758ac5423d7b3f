// Forwards each catalogue entry to the backend of the stream's device.
#include "ops/ops.h"

#include "ops/dispatch.h"

namespace mcpp::ops {

Stream& default_stream(Device d) {
  if (d == Device::CPU) return Stream::cpu();
#ifdef MCPP_HAVE_CUDA
  cuda::init_device();
  return cuda::default_stream();
#else
  fail_at(__FILE__, __LINE__, "a CUDA stream was asked for in a build without CUDA",
          "rebuild with nvcc present to get the CUDA backend");
#endif
}

Tensor on_device(const Tensor& host, Device dev, Stream& s) {
  if (dev == Device::CPU) return host;
  Tensor d = Tensor::empty(host.shape(), host.dtype(), dev);
  copy(host, d, s);
  return d;
}

void gemm(bool ta, bool tb, double alpha, const Tensor& A, const Tensor& B, double beta,
          Tensor& C, Stream& s) {
  MCPP_DISPATCH_SHAPED(gemm, C, ta, tb, alpha, A, B, beta, C, s);
}
void gemm_add(bool ta, bool tb, double alpha, const Tensor& A, const Tensor& B, double beta,
              const Tensor& C, Tensor& D, Stream& s) {
  MCPP_DISPATCH_SHAPED(gemm_add, D, ta, tb, alpha, A, B, beta, C, D, s);
}
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_forward, w, x, w, b, y, s);
}
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, bool acc,
                     Tensor& dw, Tensor& db, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_backward, w, dy, x, w, dx, acc, dw, db, s);
}
void linear_residual_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                             const Tensor& residual, Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_residual_forward, w, x, w, b, residual, y, s);
}
void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre,
                         Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_gelu_forward, w, x, w, b, pre, y, s);
}
void linear_gelu_backward(const Tensor& dy, const Tensor& act, const Tensor& w,
                          const Tensor& pre, Tensor& dpre, Tensor& dw, Tensor& db, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_gelu_backward, w, dy, act, w, pre, dpre, dw, db, s);
}
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                       Tensor& mean, Tensor& rstd, Stream& s) {
  MCPP_DISPATCH(layernorm_forward, x, w, b, eps, y, mean, rstd, s);
}
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, bool acc, Tensor& dw, Tensor& db,
                        Stream& s) {
  MCPP_DISPATCH(layernorm_backward, dy, x, w, mean, rstd, dx, acc, dw, db, s);
}
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
                     Stream& s) {
  MCPP_DISPATCH(rmsnorm_forward, x, w, eps, y, rstd, s);
}
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, bool acc, Tensor& dw, Stream& s) {
  MCPP_DISPATCH(rmsnorm_backward, dy, x, w, rstd, dx, acc, dw, s);
}
void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                     bool one_plus, Tensor& y, Stream& s) {
  MCPP_DISPATCH(qk_norm_forward, x, wq, wk, r, eps, one_plus, y, s);
}
void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                      bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dwk, Stream& s) {
  MCPP_DISPATCH(qk_norm_backward, x, wq, wk, r, eps, one_plus, dqkv, dwq, dwk, s);
}
void qk_layernorm_forward(const Tensor& x, const Tensor& wq, const Tensor& bq, const Tensor& wk,
                          const Tensor& bk, int64_t r, double eps, bool one_plus, Tensor& y,
                          Stream& s) {
  MCPP_DISPATCH(qk_layernorm_forward, x, wq, bq, wk, bk, r, eps, one_plus, y, s);
}
void qk_layernorm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r,
                           double eps, bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dbq,
                           Tensor& dwk, Tensor& dbk, Stream& s) {
  MCPP_DISPATCH(qk_layernorm_backward, x, wq, wk, r, eps, one_plus, dqkv, dwq, dbq, dwk, dbk, s);
}
void gelu_forward(const Tensor& x, Tensor& y, Stream& s) { MCPP_DISPATCH(gelu_forward, x, y, s); }
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  MCPP_DISPATCH(gelu_backward, dy, x, dx, s);
}
void mlp_activation_forward(MlpAct a, const Tensor& x, Tensor& y, Stream& s) {
  if (a.plain_swiglu()) return swiglu_forward(x, y, s);
  if (a.gated()) return glu_forward(x, a, y, s);
  if (a.kind == MlpActivation::SquaredRelu) return squared_relu_forward(x, y, s);
  if (a.kind == MlpActivation::GeluErf) return gelu_erf_forward(x, y, s);
  gelu_forward(x, y, s);
}
void mlp_activation_backward(MlpAct a, const Tensor& dy, const Tensor& x, Tensor& dx,
                             Stream& s) {
  if (a.plain_swiglu()) return swiglu_backward(dy, x, dx, s);
  if (a.gated()) return glu_backward(dy, x, a, dx, s);
  if (a.kind == MlpActivation::SquaredRelu) return squared_relu_backward(dy, x, dx, s);
  if (a.kind == MlpActivation::GeluErf) return gelu_erf_backward(dy, x, dx, s);
  gelu_backward(dy, x, dx, s);
}
void glu_forward(const Tensor& x, MlpAct act, Tensor& y, Stream& s) {
  MCPP_DISPATCH(glu_forward, x, act, y, s);
}
void glu_backward(const Tensor& dy, const Tensor& x, MlpAct act, Tensor& dx, Stream& s) {
  MCPP_DISPATCH(glu_backward, dy, x, act, dx, s);
}
void gelu_erf_forward(const Tensor& x, Tensor& y, Stream& s) {
  MCPP_DISPATCH(gelu_erf_forward, x, y, s);
}
void gelu_erf_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  MCPP_DISPATCH(gelu_erf_backward, dy, x, dx, s);
}
void squared_relu_forward(const Tensor& x, Tensor& y, Stream& s) {
  MCPP_DISPATCH(squared_relu_forward, x, y, s);
}
void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  MCPP_DISPATCH(squared_relu_backward, dy, x, dx, s);
}
void swiglu_forward(const Tensor& x, Tensor& y, Stream& s) {
  MCPP_DISPATCH(swiglu_forward, x, y, s);
}
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  MCPP_DISPATCH(swiglu_backward, dy, x, dx, s);
}
void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               Stream& s) {
  MCPP_DISPATCH(swiglu_backward_recompute, dy, x, dx, y, s);
}
void fill(Tensor& x, double v, Stream& s) { MCPP_DISPATCH(fill, x, v, s); }
void copy(const Tensor& src, Tensor& dst, Stream& s) { MCPP_DISPATCH(copy, src, dst, s); }
void add(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  MCPP_DISPATCH(add, a, b, out, s);
}
void axpy(double alpha, const Tensor& x, Tensor& y, Stream& s) {
  MCPP_DISPATCH(axpy, alpha, x, y, s);
}
void scale(Tensor& x, double alpha, Stream& s) { MCPP_DISPATCH(scale, x, alpha, s); }
double sum_squares(const Tensor& x, Stream& s) { MCPP_DISPATCH(sum_squares, x, s); }
std::vector<double> sum_squares_each(const std::vector<Tensor>& xs, Stream& s) {
  MCPP_DISPATCH(sum_squares_each, xs, s);
}
bool has_nonfinite(const Tensor& x, Stream& s) { MCPP_DISPATCH(has_nonfinite, x, s); }
double dot(const Tensor& x, const Tensor& y, Stream& s) { MCPP_DISPATCH(dot, x, y, s); }
void dot_begin(const Tensor& x, const Tensor& y, Tensor& partial, Stream& s) {
  MCPP_DISPATCH(dot_begin, x, y, partial, s);
}
double dot_end(const Tensor& partial, Stream& s) { MCPP_DISPATCH(dot_end, partial, s); }
void transpose(const Tensor& x, Tensor& y, Stream& s) { MCPP_DISPATCH(transpose, x, y, s); }
void dropout_add_forward(const Tensor& x, const Tensor& residual, double p, DropoutKey key,
                         const GlobalIndex3& g, Tensor& out, Stream& s) {
  MCPP_DISPATCH(dropout_add_forward, x, residual, p, key, g, out, s);
}
void dropout_backward(const Tensor& dout, double p, DropoutKey key, const GlobalIndex3& g,
                      Tensor& dx, Stream& s) {
  MCPP_DISPATCH(dropout_backward, dout, p, key, g, dx, s);
}
void random_normal(DropoutKey key, const GlobalIndex3& g, Tensor& y, Stream& s) {
  MCPP_DISPATCH(random_normal, key, g, y, s);
}
void uniform_scale(const Tensor& x, double lo, double hi, DropoutKey key, const GlobalIndex3& g,
                   Tensor& y, Stream& s) {
  MCPP_DISPATCH(uniform_scale, x, lo, hi, key, g, y, s);
}
void embedding_forward(const Tensor& ids, const Tensor& table, int64_t vs, Tensor& y,
                       Stream& s) {
  MCPP_DISPATCH(embedding_forward, ids, table, vs, y, s);
}
void embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vs, Tensor& dtable,
                        Stream& s) {
  MCPP_DISPATCH(embedding_backward, dy, ids, vs, dtable, s);
}
void position_embedding_forward(const Tensor& pos, int64_t off, Tensor& y, Stream& s) {
  MCPP_DISPATCH(position_embedding_forward, pos, off, y, s);
}
void position_embedding_backward(const Tensor& dy, int64_t off, Tensor& dpos, Stream& s) {
  MCPP_DISPATCH(position_embedding_backward, dy, off, dpos, s);
}
void ce_row_max(const Tensor& logits, Tensor& row_max, Stream& s) {
  MCPP_DISPATCH(ce_row_max, logits, row_max, s);
}
void ce_sum_exp_target(const Tensor& logits, const Tensor& row_max, const Tensor& targets,
                       int64_t vs, Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  MCPP_DISPATCH(ce_sum_exp_target, logits, row_max, targets, vs, sum_exp, target_logit, s);
}
void ce_stats(const Tensor& logits, const Tensor& targets, int64_t vs, Tensor& row_max,
              Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  MCPP_DISPATCH(ce_stats, logits, targets, vs, row_max, sum_exp, target_logit, s);
}
void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp,
                        Stream& s) {
  MCPP_DISPATCH(ce_rescale_sum_exp, local_max, global_max, sum_exp, s);
}
void ce_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
             Tensor& loss, Stream& s) {
  MCPP_DISPATCH(ce_loss, row_max, sum_exp, target_logit, loss, s);
}
void ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                 const Tensor& targets, int64_t vs, const Tensor& dloss, Tensor& dlogits,
                 Stream& s) {
  MCPP_DISPATCH(ce_backward, logits, row_max, sum_exp, targets, vs, dloss, dlogits, s);
}
void attention_forward(const Tensor& qkv, const AttentionDims& d, double sc, double p,
                       DropoutKey key, Tensor& out, Tensor& lse, Stream& s) {
  MCPP_CHECK(!d.sink.defined(), "attention_forward: sinks join through attention_sink_forward");
  MCPP_CHECK(d.window_left < 0, "attention_forward: a window reaches it as key_start");
  MCPP_DISPATCH(attention_forward, qkv, d, sc, p, key, out, lse, s);
}
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttentionDims& d, double sc, double p,
                        DropoutKey key, Tensor& dqkv, Stream& s) {
  MCPP_CHECK(!d.sink.defined(), "attention_backward: sinks join through attention_sink_backward");
  MCPP_CHECK(d.window_left < 0, "attention_backward: a window reaches it as key_start");
  MCPP_DISPATCH(attention_backward, dout, qkv, out, lse, d, sc, p, key, dqkv, s);
}
void attention_kv_cache_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& pos,
                                double sc, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                Stream& s) {
  MCPP_DISPATCH(attention_kv_cache_forward, qkv, d, pos, sc, k_cache, v_cache, out, s);
}
void rope_forward(const Tensor& in, const AttentionDims& d, int64_t rot, const RopeFreqs& freqs,
                  int64_t off, Tensor& out, Stream& s) {
  MCPP_DISPATCH(rope_forward, in, d, rot, freqs, off, out, s);
}
void rope_backward(const Tensor& dout, const AttentionDims& d, int64_t rot, const RopeFreqs& freqs,
                   int64_t off, Tensor& din, Stream& s) {
  MCPP_DISPATCH(rope_backward, dout, d, rot, freqs, off, din, s);
}
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& model_param,
                const AdamWParams& p, Stream& s) {
  MCPP_DISPATCH(adamw_step, param, grad, m, v, model_param, p, s);
}

// ---- context parallel
void attention_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                             bool causal, double sc, double p, DropoutKey key, Tensor& out,
                             Tensor& lse, Stream& s) {
  MCPP_DISPATCH(attention_block_forward, q_src, kv_src, d, causal, sc, p, key, out, lse, s);
}
void attention_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                              const Tensor& out, const Tensor& lse, const AttentionDims& d,
                              bool causal, double sc, double p, DropoutKey key, Tensor& dq,
                              Tensor& dkv, Stream& s) {
  MCPP_DISPATCH(attention_block_backward, dout, q_src, kv_src, out, lse, d, causal, sc, p, key,
                dq, dkv, s);
}
bool attention_block_rect_supported(DType dt, const AttentionDims& d, bool causal, double p,
                                    Stream& s) {
  MCPP_DISPATCH(attention_block_rect_supported, dt, d, causal, p, s);
}
void attention_lse_merge(const Tensor& out_i, const Tensor& lse_i, const AttentionDims& d,
                         Tensor& out, Tensor& lse, Stream& s) {
  MCPP_DISPATCH(attention_lse_merge, out_i, lse_i, d, out, lse, s);
}
void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink, int64_t h0,
                            const AttentionDims& d, Stream& s) {
  MCPP_DISPATCH(attention_sink_forward, out, lse, sink, h0, d, s);
}
void attention_sink_backward(const Tensor& dout, const Tensor& out, const Tensor& lse,
                             const Tensor& sink, int64_t h0, const AttentionDims& d,
                             Tensor& dsink, Stream& s) {
  MCPP_DISPATCH(attention_sink_backward, dout, out, lse, sink, h0, d, dsink, s);
}
void rope_positions(const Tensor& in, const AttentionDims& d, int64_t rot, const RopeFreqs& freqs,
                    const Tensor& positions, bool inverse, Tensor& out, Stream& s) {
  MCPP_DISPATCH(rope_positions, in, d, rot, freqs, positions, inverse, out, s);
}
// ---- FP8
void fp8_quantize(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& y, Stream& s) {
  MCPP_DISPATCH(fp8_quantize, x, fmt, scale, y, s);
}
void fp8_amax(const Tensor& x, Tensor& amax, Stream& s) { MCPP_DISPATCH(fp8_amax, x, amax, s); }
void fp8_scale_update(Tensor& history, Tensor& scale, int64_t e5m2_columns, int64_t margin,
                      bool amax_max, bool roll, Stream& s) {
  MCPP_DISPATCH(fp8_scale_update, history, scale, e5m2_columns, margin, amax_max, roll, s);
}
void fp8_cast_transpose(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& q,
                        Tensor& qt, Tensor& amax, Tensor& scale_inv, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_cast_transpose, x, x, fmt, scale, q, qt, amax, scale_inv, s);
}
void fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
              const Tensor& b_scale_inv, const Tensor& bias, const Tensor& addend,
              bool accumulate, bool fast_accum, Tensor& c, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_gemm, b, a, a_scale_inv, b, b_scale_inv, bias, addend, accumulate,
                       fast_accum, c, s);
}
void fp8_cast_transpose_dbias(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& q,
                              Tensor& qt, Tensor& amax, Tensor& scale_inv, Tensor& db, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_cast_transpose_dbias, x, x, fmt, scale, q, qt, amax, scale_inv, db, s);
}
void fp8_gelu_cast(const Tensor& pre, Fp8Format fmt, const Tensor& scale, Tensor& act, Tensor& q,
                   Tensor& qt, Tensor& amax, Tensor& scale_inv, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_gelu_cast, pre, pre, fmt, scale, act, q, qt, amax, scale_inv, s);
}
void fp8_dgelu_cast(const Tensor& dact, const Tensor& pre, Fp8Format fmt, const Tensor& scale,
                    Tensor& dpre, Tensor& q, Tensor& qt, Tensor& amax, Tensor& scale_inv,
                    Tensor& db, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_dgelu_cast, pre, dact, pre, fmt, scale, dpre, q, qt, amax, scale_inv,
                       db, s);
}
void fp8_swiglu_cast(const Tensor& pre, Fp8Format fmt, const Tensor& scale, Tensor& act, Tensor& q,
                     Tensor& qt, Tensor& amax, Tensor& scale_inv, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_swiglu_cast, pre, pre, fmt, scale, act, q, qt, amax, scale_inv, s);
}
void fp8_dswiglu_cast(const Tensor& dact, const Tensor& pre, Fp8Format fmt, const Tensor& scale,
                      Tensor& dpre, Tensor& q, Tensor& qt, Tensor& amax, Tensor& scale_inv,
                      Tensor& db, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_dswiglu_cast, pre, dact, pre, fmt, scale, dpre, q, qt, amax,
                       scale_inv, db, s);
}
// ---- FP8 blockwise
void fp8_block_quantize(const Tensor& x, Fp8Format fmt, int64_t br, int64_t bc, Tensor& y,
                        Tensor& scale_inv, Stream& s) {
  MCPP_DISPATCH(fp8_block_quantize, x, fmt, br, bc, y, scale_inv, s);
}
void fp8_block_cast(const Tensor& x, Fp8Format fmt, bool tile, Tensor& q, Tensor& s_q, Tensor& qt,
                    Tensor& s_qt, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_block_cast, x, x, fmt, tile, q, s_q, qt, s_qt, s);
}
void fp8_block_gemm(const Tensor& a, const Tensor& a_scale_inv, bool a_tile, const Tensor& b,
                    const Tensor& b_scale_inv, bool b_tile, const Tensor& bias,
                    const Tensor& addend, bool accumulate, Tensor& c, Stream& s) {
  MCPP_DISPATCH_SHAPED(fp8_block_gemm, b, a, a_scale_inv, a_tile, b, b_scale_inv, b_tile, bias,
                       addend, accumulate, c, s);
}
// ---- MoE
void gather_rows(const Tensor& x, const Tensor& src, Tensor& y, Stream& s) {
  MCPP_DISPATCH(gather_rows, x, src, y, s);
}
void moe_unpermute(const Tensor& y, const Tensor& offsets, const Tensor& rows, Tensor& out,
                   Stream& s) {
  MCPP_DISPATCH(moe_unpermute, y, offsets, rows, out, s);
}
void moe_scale_rows(const Tensor& x, const Tensor& p, Tensor& y, Stream& s) {
  MCPP_DISPATCH(moe_scale_rows, x, p, y, s);
}
void moe_row_dot(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  MCPP_DISPATCH(moe_row_dot, a, b, out, s);
}
void moe_act_scale_forward(const Tensor& fc1, const Tensor& p, MlpAct act, Tensor& ap,
                           Stream& s) {
  MCPP_DISPATCH(moe_act_scale_forward, fc1, p, act, ap, s);
}
void moe_act_scale_backward(const Tensor& dap, const Tensor& fc1, const Tensor& p, MlpAct act,
                            Tensor& dfc1, Tensor& dp, Tensor& ap, Stream& s) {
  MCPP_DISPATCH(moe_act_scale_backward, dap, fc1, p, act, dfc1, dp, ap, s);
}
void moe_bias_scale_forward(const Tensor& b, const Tensor& p, Tensor& y, Stream& s) {
  MCPP_DISPATCH(moe_bias_scale_forward, b, p, y, s);
}
void moe_bias_scale_backward(const Tensor& dy, const Tensor& b, const Tensor& p, Tensor& db,
                             Tensor& dp, Stream& s) {
  MCPP_DISPATCH(moe_bias_scale_backward, dy, b, p, db, dp, s);
}
void moe_route_topk(const Tensor& logits, const Tensor& bias, const MoeRouteSpec& r,
                    Tensor& idx, Tensor& prob, Stream& s) {
  MCPP_DISPATCH(moe_route_topk, logits, bias, r, idx, prob, s);
}
void moe_route_index(const Tensor& idx, Tensor& prob, const MoeRouteSpec& r, int64_t blocks,
                     Tensor& counts, Tensor& bias_counts, Tensor& src, Tensor& row_slot,
                     Tensor& slot_row, Tensor& offsets, Tensor& rows, Stream& s) {
  MCPP_DISPATCH(moe_route_index, idx, prob, r, blocks, counts, bias_counts, src, row_slot,
                slot_row, offsets, rows, s);
}
void moe_gather(const Tensor& x, const Tensor& index, Tensor& y, Stream& s) {
  MCPP_DISPATCH(moe_gather, x, index, y, s);
}
void moe_route_counts(const Tensor& logits, const MoeRouteSpec& r, int64_t B, Tensor& aux_counts,
                      Stream& s) {
  MCPP_DISPATCH(moe_route_counts, logits, r, B, aux_counts, s);
}
void moe_route_stats(const Tensor& logits, const Tensor& aux_counts, const MoeRouteSpec& r,
                     int64_t B, Tensor& losses, Stream& s) {
  MCPP_DISPATCH(moe_route_stats, logits, aux_counts, r, B, losses, s);
}
void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dprob,
                        const Tensor& aux_counts, const MoeRouteSpec& r, int64_t B,
                        double aux_scale, int64_t r0, int64_t r1, Tensor& dlogits, Stream& s) {
  MCPP_DISPATCH(moe_route_backward, logits, idx, dprob, aux_counts, r, B, aux_scale, r0, r1,
                dlogits, s);
}

// ---- inference
void decode_attention(const Tensor& qkv, const AttentionDims& d, const Tensor& pos, double sc,
                      const Tensor& k_cache, const Tensor& v_cache, Tensor& out, Stream& s) {
  MCPP_DISPATCH(decode_attention, qkv, d, pos, sc, k_cache, v_cache, out, s);
}
void rope_decode(const Tensor& in, const AttentionDims& d, int64_t rot, const RopeFreqs& freqs,
                 const Tensor& pos, Tensor& out, Stream& s) {
  MCPP_DISPATCH(rope_decode, in, d, rot, freqs, pos, out, s);
}
void argmax_rows(const Tensor& logits, int64_t V, Tensor& ids, Stream& s) {
  MCPP_DISPATCH(argmax_rows, logits, V, ids, s);
}
void linear_decode(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual,
                   Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_decode, w, x, w, b, residual, y, s);
}
void linear_swiglu_decode(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& fc1,
                          Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(linear_swiglu_decode, w, x, w, b, fc1, y, s);
}
void rmsnorm_linear_decode(const Tensor& x, const Tensor& nw, double eps, Tensor& xn,
                           Tensor& rstd, const Tensor& w, const Tensor& b, bool swiglu,
                           Tensor& fc1, Tensor& y, Stream& s) {
  MCPP_DISPATCH_SHAPED(rmsnorm_linear_decode, w, x, nw, eps, xn, rstd, w, b, swiglu, fc1, y, s);
}
void rope_attention_decode(Tensor& qkv, const AttentionDims& d, int64_t rot, const RopeFreqs& freqs,
                           const Tensor& pos, double sc, Tensor& k_cache, Tensor& v_cache,
                           Tensor& out, Stream& s, std::span<const Tensor* const> l2_next) {
  MCPP_DISPATCH(rope_attention_decode, qkv, d, rot, freqs, pos, sc, k_cache, v_cache, out, s,
                l2_next);
}
void attention_prefill(const Tensor& qkv, const AttentionDims& d, double sc, Tensor& k_cache,
                       Tensor& v_cache, Tensor& out, Tensor& lse, Stream& s) {
  MCPP_DISPATCH(attention_prefill, qkv, d, sc, k_cache, v_cache, out, lse, s);
}

}  // namespace mcpp::ops
