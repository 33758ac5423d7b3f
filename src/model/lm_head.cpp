#include "model/lm_head.h"

#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

namespace {
const char* output_weight(const TransformerConfig& c) {
  return c.tie_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight";
}
}  // namespace

void LmHead::add_params(const TransformerConfig& c, bool first_stage,
                        std::vector<ParamInfo>& params) {
  Norm::add_params(c, "decoder.final_layernorm", -1, params);
  if (!c.tie_embeddings) {
    ColumnParallelLinear::add_params(c, "output_layer", -1, c.padded_vocab_size, c.hidden_size,
                                     TpSplit::Rows, c.init_method_std, false, params);
    params.back().embedding_or_output = true;  // --decoupled-lr's group
  }
  // The tied output weight -- or, with MTP layers, the word embedding they read -- on a last
  // stage without the embedding: a copy of the first stage's, its gradient summed with it.
  if (!first_stage && (c.tie_embeddings || c.mtp_num_layers > 0)) {
    params.push_back(make_param("embedding.word_embeddings.weight",
                                {c.padded_vocab_size, c.hidden_size}, TpSplit::Rows, Init::Normal,
                                c.init_method_std, true, -1, c.tp_size));
    params.back().pipeline_duplicate = true;
    params.back().embedding_or_output = true;
  }
}

LmHead::LmHead(const TransformerConfig& c, const ParamStore* store, const std::string& norm)
    : cfg_(&c), norm_(c, store, norm), output_(store, output_weight(c), "") {}

void LmHead::saved_specs(const TransformerConfig& c, const Dims& d, bool copy_batch, Saved& s,
                         const TensorVisitor& v) {
  const int64_t T = d.T;
  Norm::saved_specs(c, d, s.lnf, v);
  ColumnParallelLinear::saved_specs(d, d.H, s.out_in, v);
  v(s.logits, {T, c.vocab_local()}, d.dt, true);
  v(s.labels, {d.B, d.S}, DType::I64, copy_batch);
  v(s.mask_bs, {d.B, d.S}, DType::F32, copy_batch);
  v(s.targets, {d.S, d.B}, DType::I64, true);
  v(s.mask_f32, {d.S, d.B}, DType::F32, true);
  v(s.mask, {d.S, d.B}, d.sdt, d.sdt != DType::F32);
  for (Tensor* t : {&s.row_max, &s.sum_exp, &s.target_logit, &s.losses}) v(*t, {T}, d.sdt, true);
}

void LmHead::scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                           const TensorVisitor& v) {
  v(ws.local_max, {d.T}, d.sdt, d.tp);
  v(ws.dloss, {d.S, d.B}, d.sdt, true);
  v(ws.dx, {d.Tl, d.H}, d.dt, true);
  v(ws.dln, {d.Tl, d.H}, d.dt, true);
  ColumnParallelLinear::scratch_specs(d, ws, v);
}

double PendingLoss::value() const {
  return partial.defined() ? ops::dot_end(partial, *stream) : 0.0;
}

PendingLoss LmHead::forward(const Tensor& x, const MicroBatch& mb, Saved& s, Workspace& ws,
                            const StepContext& cx) const {
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  const int64_t V = c.vocab_local();
  const DType sdt = cx.sdt;
  norm_.forward(x, s.lnf, cx);
  output_.forward(s.lnf.y, s.out_in, s.logits, ws, cx);
  scale_logits(s.logits, cx);

  // Labels and mask to sequence-first order: row t = s*B + b.
  MCPP_CHECK(mb.labels.dtype() == DType::I64 && mb.loss_mask.dtype() == DType::F32,
             "labels must be i64 and loss_mask f32 [B, S], got {} and {}", mb.labels.str(),
             mb.loss_mask.str());
  const Tensor& labels = on_device(mb.labels, s.labels, cx.dev, st);
  const Tensor& mask_bs = on_device(mb.loss_mask, s.mask_bs, cx.dev, st);
  ops::transpose(labels, s.targets, st);
  ops::transpose(mask_bs, s.mask_f32, st);
  if (sdt == DType::F32)
    s.mask = s.mask_f32;
  else
    ops::copy(s.mask_f32, s.mask, st);
  // One pass over the logits (online softmax) for this rank's row max, sum of exponentials
  // and target logit. Megatron's vocab_parallel_cross_entropy all-reduces the max before
  // the exponentials, which takes a second pass; here each rank's sum is moved to the
  // global max afterwards (sum_exp * exp(local max - global max)), then summed.
  ops::ce_stats(s.logits, s.targets, c.tp_rank * V, s.row_max, s.sum_exp, s.target_logit, st);
  if (cx.tp_comm) {
    ops::copy(s.row_max, ws.local_max, st);
    parallel::max_from_tp(s.row_max, *cx.tp_comm, st);
    ops::ce_rescale_sum_exp(ws.local_max, s.row_max, s.sum_exp, st);
    parallel::reduce_from_tp(s.sum_exp, *cx.tp_comm, st);
    parallel::reduce_from_tp(s.target_logit, *cx.tp_comm, st);
  }
  ops::ce_loss(s.row_max, s.sum_exp, s.target_logit, s.losses, st);
  PendingLoss loss;
  loss.stream = &st;
  ops::dot_begin(s.losses, s.mask, loss.partial, st);
  return loss;
}

void LmHead::logits_forward(const Tensor& x, Saved& s, const StepContext& cx) const {
  const int64_t rows = x.size(0);
  ensure(s.lnf.y, {rows, cx.H}, cx.dt, cx.dev), ensure(s.lnf.rstd, {rows}, cx.sdt, cx.dev);
  if (!cfg_->rmsnorm) ensure(s.lnf.mean, {rows}, cx.sdt, cx.dev);
  ensure(s.logits, {rows, cfg_->vocab_local()}, cx.dt, cx.dev);
  if (const auto f = norm_.fold(s.lnf, cx)) {  // the final RMSNorm in the output layer's kernel
    Tensor unused;
    output_.forward_folded(x, *f, false, unused, s.logits, cx);
    scale_logits(s.logits, cx);
    return;
  }
  norm_.forward(x, s.lnf, cx);
  Workspace unused;  // generation: no sequence parallelism, nothing gathered
  output_.forward(s.lnf.y, s.out_in, s.logits, unused, cx);
  scale_logits(s.logits, cx);
}

void LmHead::scale_logits(Tensor& logits, const StepContext& cx) const {
  if (cfg_->mup.on && cfg_->mup.output_mult != 1.0)
    ops::scale(logits, cfg_->mup.output_mult, cx.stream());
}

// Mirrors forward: cross-entropy, output layer, final norm.
void LmHead::backward(const Tensor& x, double grad_scale, Saved& s, Workspace& ws,
                      const StepContext& cx, const Tensor* d_norm_out) {
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  ops::copy(s.mask, ws.dloss, st);
  // muP's output multiplier: d(unscaled logits) = mult x d(logits), taken in dloss (the
  // cross-entropy gradient is linear in it).
  const double mult = c.mup.on ? c.mup.output_mult : 1.0;
  ops::scale(ws.dloss, grad_scale * mult, st);
  ops::ce_backward(s.logits, s.row_max, s.sum_exp, s.targets, c.tp_rank * c.vocab_local(), ws.dloss,
                   s.logits, st);
  output_.backward(s.logits, s.lnf.y, s.out_in, ws.dln, ws, cx);
  if (d_norm_out) ops::add(ws.dln, *d_norm_out, ws.dln, st);
  norm_.backward(ws.dln, x, s.lnf, ws.dx, false, cx);
}

}  // namespace mcpp::model
