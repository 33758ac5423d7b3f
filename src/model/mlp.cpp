#include "model/mlp.h"

#include "ops/ops.h"

namespace mcpp::model {

void DenseMlp::add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params) {
  const bool glu = c.gated_linear_unit();
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, fc1 = (glu ? 2 : 1) * F;
  // A gated unit's fc1 is [gate; up]: each rank holds its rows of both halves.
  ColumnParallelLinear::add_params(c, layer_param_name(layer, "mlp.linear_fc1"), layer, fc1, H,
                                   glu ? TpSplit::SwigluRows : TpSplit::Rows,
                                   c.init_method_std, c.add_bias_linear, params);
  RowParallelLinear::add_params(c, layer_param_name(layer, "mlp.linear_fc2"), layer, H, F,
                                output_init_std(c), c.add_bias_linear, params);
}

DenseMlp::DenseMlp(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      fc1_(store, layer_param_name(layer, "mlp.linear_fc1.weight"),
           layer_param_name(layer, "mlp.linear_fc1.bias")),
      fc2_(store, layer_param_name(layer, "mlp.linear_fc2.weight"),
           layer_param_name(layer, "mlp.linear_fc2.bias")),
      recompute_(c.recompute == TransformerConfig::Recompute::Selective && c.recompute_mlp),
      swiglu_(c.plain_swiglu()),
      act_op_(c.activation().kind != ops::MlpActivation::Gelu && !swiglu_) {
  MCPP_CHECK(!recompute_ || (!c.fp8.enabled() && c.keep_mlp_activations == 0),
             "DenseMlp: --recompute-modules mlp with FP8 or --keep-mlp-activations (refused at "
             "start-up)");
}

// pre = fc1(x), act = the activation of pre, by the kernels the forward uses (GELU: the GEMM
// epilogue; squared ReLU, quick-GEGLU, SwiGLU with an offset or clamp: the GEMM, then the
// activation op).
void DenseMlp::fc1_act(const Tensor& x, ColumnParallelLinear::Saved& s, Tensor& pre, Tensor& act,
                       Workspace& ws, const StepContext& cx) const {
  if (swiglu_) return fc1_.forward_swiglu(x, s, pre, act, ws, cx);
  if (!act_op_) return fc1_.forward_gelu(x, s, pre, act, ws, cx);
  fc1_.forward(x, s, pre, ws, cx);  // (generation: linear_decode)
  ops::mlp_activation_forward(cfg_->activation(), pre, act, cx.stream());
}

void DenseMlp::saved_specs(const Dims& d, bool keep_activation, MlpSaved& sb,
                           const TensorVisitor& v) const {
  auto& s = static_cast<Saved&>(sb);
  ColumnParallelLinear::saved_specs(d, d.H, s.fc1_in, v);
  v(s.fc1, {d.T, cfg_->fc1_width_local()}, d.dt, !recompute_);
  keep_activation = keep_activation && !recompute_;
  // FP8 (keeps_input_t): a kept activation is kept as fc2's FP8 wgrad operand, its
  // column-wise copy [F, T] (half the bytes; the backward casts nothing for it).
  if (fc2_.fp8().keeps_input_t(*cfg_, d, cfg_->ffn_local()))
    v(s.act, {cfg_->ffn_local(), d.T}, Fp8Linear::kept_input_dtype(), keep_activation);
  else
    v(s.act, {d.T, cfg_->ffn_local()}, d.dt, keep_activation);
}

void DenseMlp::scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                             const TensorVisitor& v) const {
  ColumnParallelLinear::scratch_specs(d, ws, v);
  RowParallelLinear::scratch_specs(d, ws, v);
  // FP8 with the fused casts in every layer (delayed scaling, FP8 wgrad, no layer kept in
  // bf16, bf16 on CUDA; SwiGLU: F a multiple of 64): the activation is never written in
  // bf16, nor (SwiGLU) fc1's output gradient.
  const Fp8Config& f = cfg_->fp8;
  const bool fp8_fused = !act_op_ && f.delayed() && f.wgrad && f.bf16_start == 0 &&
                         f.bf16_end == 0 && d.dt == DType::BF16 && d.dev == Device::CUDA &&
                         d.T % 16 == 0 && cfg_->ffn_local() % (swiglu_ ? 64 : 16) == 0;
  // A layer that keeps its activation in FP8 without the fused casts (SwiGLU; the
  // activation ops always) writes the bf16 one to the scratch.
  const bool fp8_kept_t =
      (swiglu_ || act_op_) && fc2_.fp8().keeps_input_t(*cfg_, d, cfg_->ffn_local());
  v(ws.act, {d.T, cfg_->ffn_local()}, d.dt,
    (uses_scratch_activation || fp8_kept_t) && !fp8_fused);
  v(ws.dfc1, {d.T, cfg_->fc1_width_local()}, d.dt, !(fp8_fused && swiglu_));
  // All but GELU, whose gradient comes out of fc2's GEMM epilogue.
  v(ws.dact, {d.T, cfg_->ffn_local()}, d.dt, swiglu_ || act_op_);
  v(ws.fc1, {d.T, cfg_->fc1_width_local()}, d.dt, recompute_);
}

void DenseMlp::forward(const Tensor& x, MlpSaved& sb, const Tensor* residual, Tensor& y,
                       Workspace& ws, const StepContext& cx) const {
  auto& s = static_cast<Saved&>(sb);
  const bool kept_t = s.act.defined() && s.act.dtype() == Fp8Linear::kept_input_dtype();
  // kept, or the shared scratch (also when fc2 keeps its FP8 copy instead)
  Tensor& act = s.act.defined() && !kept_t ? s.act : ws.act;
  if (swiglu_ && fc2_.fp8().fused_swiglu(s.fc1, cx)) {
    // FP8: SwiGLU taken in the cast of fc2's input (fp8_swiglu_cast), one pass over fc1's
    // output, no bf16 activation; a kept activation is the cast's column-wise copy.
    // fc2 reads only the cast; fc1's output stands in for its input.
    fc1_.forward(x, s.fc1_in, s.fc1, ws, cx);
    fc2_.fp8().precast_swiglu_input(s.fc1, s.act, false, cx);
    if (residual)
      fc2_.forward_residual(s.fc1, *residual, y, cx);
    else
      fc2_.forward(s.fc1, y, ws, cx);
    fc2_.fp8().clear_precast();
    return;
  }
  if ((swiglu_ || act_op_) && kept_t) {
    // FP8, activation kept (SwiGLU without the fused casts, or an activation op): the bf16
    // activation in the scratch, cast both ways at once (the row-wise copy for fc2 now,
    // the column-wise one kept for its wgrad).
    MCPP_CHECK(ws.act.defined(), "DenseMlp: FP8 kept activation without the scratch activation");
    fc1_act(x, s.fc1_in, s.fc1, act, ws, cx);
    fc2_.fp8().precast_input(act, s.act, cx);
    if (residual)
      fc2_.forward_residual(act, *residual, y, cx);
    else
      fc2_.forward(act, y, ws, cx);
    fc2_.fp8().clear_precast();
    return;
  }
  if (recompute_) {  // fc1's output to the shared buffer (no FP8: refused at start-up)
    fc1_act(x, s.fc1_in, ws.fc1, act, ws, cx);
  } else if (swiglu_) {
    fc1_.forward_swiglu(x, s.fc1_in, s.fc1, act, ws, cx);  // (one op in generation)
  } else if (act_op_) {  // the GEMM, then the activation op (FP8: fc1's and fc2's GEMMs)
    fc1_act(x, s.fc1_in, s.fc1, act, ws, cx);
  } else if (fc2_.fp8().fused(s.fc1, cx)) {
    // FP8: GELU taken in the cast of fc2's input (fp8_gelu_cast), one pass over fc1's
    // output; the bf16 activation is written only when this layer keeps it.
    // fc2 reads only the cast; fc1's output (act's shape) stands in for its input.
    fc1_.forward(x, s.fc1_in, s.fc1, ws, cx);
    fc2_.fp8().precast_gelu_input(s.fc1, s.act, false, cx);
    if (residual)
      fc2_.forward_residual(s.fc1, *residual, y, cx);
    else
      fc2_.forward(s.fc1, y, ws, cx);
    fc2_.fp8().clear_precast();
    return;
  } else {
    MCPP_CHECK(!kept_t, "DenseMlp: an FP8 kept activation needs the fused FP8 cast ({})",
               s.fc1.str());
    fc1_.forward_gelu(x, s.fc1_in, s.fc1, act, ws, cx);  // GEMM epilogue
  }
  if (residual)
    fc2_.forward_residual(act, *residual, y, cx);
  else
    fc2_.forward(act, y, ws, cx);
}

void MlpModule::forward_folded(const Tensor& x, const Norm::Fold& f, MlpSaved& s,
                               const Tensor* residual, Tensor& y, Workspace& ws,
                               const StepContext& cx) const {
  ops::rmsnorm_forward(x, *f.w, f.eps, f.s->y, f.s->rstd, cx.stream());
  forward(f.s->y, s, residual, y, ws, cx);
}

// SwiGLU without FP8 (FP8's fused casts read fc1's output): fc1 with the norm and the SwiGLU
// in one kernel, then fc2 as in forward.
void DenseMlp::forward_folded(const Tensor& x, const Norm::Fold& f, MlpSaved& sb,
                              const Tensor* residual, Tensor& y, Workspace& ws,
                              const StepContext& cx) const {
  auto& s = static_cast<Saved&>(sb);
  if (!swiglu_ || fc1_.fp8().on(cx) || fc2_.fp8().on(cx) || recompute_)
    return MlpModule::forward_folded(x, f, sb, residual, y, ws, cx);
  Tensor& act = s.act.defined() ? s.act : ws.act;
  fc1_.forward_folded(x, f, true, s.fc1, act, cx);
  if (residual)
    fc2_.forward_residual(act, *residual, y, cx);
  else
    fc2_.forward(act, y, ws, cx);
}

void DenseMlp::backward(const Tensor& dy, const Tensor& x, MlpSaved& sb, Tensor& dx, Workspace& ws,
                        const StepContext& cx) {
  auto& s = static_cast<Saved&>(sb);
  Stream& st = cx.stream();
  if (recompute_) {
    // fc1's output again, by the forward's own kernel from the kept input (the activation
    // it also writes is rewritten below): then the backward as when fc1's output is kept.
    fc1_act(x, s.fc1_in, ws.fc1, ws.act, ws, cx);
  }
  const Tensor& fc1 = recompute_ ? ws.fc1 : s.fc1;
  const bool kept = s.act.defined();
  const bool kept_t = kept && s.act.dtype() == Fp8Linear::kept_input_dtype();
  if (swiglu_ && fc2_.fp8().fused_swiglu(fc1, cx)) {
    // FP8 with the fused casts: fc2's dgrad into ws.dact; fc2's wgrad operand swiglu(fc1)
    // cast column-wise from fc1's output (or kept from the forward); then SwiGLU's
    // gradient taken in the cast of fc1's output gradient: no bf16 activation or gradient.
    // fc1's output (the gradient's shape) stands in for the gradient the casts replace.
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, fc1, ws.dact, cx);
    Tensor none;
    if (kept_t)
      fc2_.fp8().use_kept_input(s.act, cx);
    else
      fc2_.fp8().precast_swiglu_input(fc1, none, true, cx);
    fc2_.backward_weights(g, fc1, cx);
    fc2_.fp8().clear_precast();
    fc1_.fp8_precast_dswiglu_grad(ws.dact, fc1, cx);
    fc1_.backward(fc1, x, s.fc1_in, dx, ws, cx);
    fc1_.fp8().clear_precast();
    return;
  }
  if ((swiglu_ || act_op_) && kept_t) {  // as below, fc2's wgrad operand the kept FP8 copy
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, ws.dact, ws.dact, cx);  // (x: the shape only)
    // (plain SwiGLU: swiglu_backward itself)
    ops::mlp_activation_backward(cfg_->activation(), ws.dact, fc1, ws.dfc1, st);
    fc2_.fp8().use_kept_input(s.act, cx);
    fc2_.backward_weights(g, ws.dact, cx);
    fc2_.fp8().clear_precast();
  } else if (swiglu_ && kept) {  // the same GEMMs and element functions as below, minus the y pass
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, s.act, ws.dact, cx);
    ops::swiglu_backward(ws.dact, fc1, ws.dfc1, st);
    fc2_.backward_weights(g, s.act, cx);
  } else if (swiglu_) {
    // fc2's input gradient first (it does not read the activation), then the SwiGLU
    // gradient and the activation from one read of fc1's output, then fc2's weight and
    // bias gradients, which need the activation. The same GEMMs as one linear_backward.
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, ws.act, ws.dact, cx);
    ops::swiglu_backward_recompute(ws.dact, fc1, ws.dfc1, ws.act, st);
    fc2_.backward_weights(g, ws.act, cx);
  } else if (act_op_) {
    // No GEMM epilogue for it: the activation again unless kept (or just rewritten by the
    // recomputed fc1), fc2's backward into dact, then the activation's backward op
    // (squared ReLU: 2 relu(fc1) dact; the gated units: glu_backward) into fc1's output
    // gradient.
    const ops::MlpAct a = cfg_->activation();
    if (!kept && !recompute_) ops::mlp_activation_forward(a, fc1, ws.act, st);
    fc2_.backward(dy, kept ? s.act : ws.act, ws.dact, ws, cx);
    ops::mlp_activation_backward(a, ws.dact, fc1, ws.dfc1, st);
  } else if (fc2_.fp8().fused(fc1, cx)) {
    // FP8 with the fused casts: fc2's wgrad operand gelu(fc1) cast from fc1's output (no
    // bf16 activation; kept or with --no-fp8-wgrad the bf16 one, as below), fc2's dgrad into
    // ws.dfc1, then GELU's derivative taken in the cast of fc1's output gradient (with
    // fc1's bias gradient): no separate GELU pass either way.
    // A kept activation is cast as it is (the same bytes: fp8_gelu_cast's FP8 of gelu(pre)
    // is the cast of its bf16 gelu(pre); a plain column-wise cast is the cheaper pass:
    // 0.24 against 0.34 ms on [32768x8192]).
    Tensor none;
    if (kept_t) {  // the column-wise copy kept from the forward
      fc2_.fp8().use_kept_input(s.act, cx);
      fc2_.backward(dy, fc1, ws.dfc1, ws, cx);  // fc1: act's shape
    } else if (fc2_.fp8().wgrad(cx) && !kept) {
      fc2_.fp8().precast_gelu_input(fc1, none, true, cx);
      fc2_.backward(dy, fc1, ws.dfc1, ws, cx);  // fc1: act's shape (the cast is made)
    } else {
      if (!kept) ops::gelu_forward(fc1, ws.act, st);
      fc2_.backward(dy, kept ? s.act : ws.act, ws.dfc1, ws, cx);
    }
    fc2_.fp8().clear_precast();
    fc1_.fp8_precast_dgelu_grad(ws.dfc1, fc1, ws.dfc1, cx);
    fc1_.backward(ws.dfc1, x, s.fc1_in, dx, ws, cx);
    fc1_.fp8().clear_precast();
    return;
  } else {  // the GELU gradient in the fc2 input-gradient GEMM's epilogue
    // On CUDA a kept activation is the fc1 GEMM epilogue's GELU (of the fp32 accumulator),
    // the recomputed one gelu_forward's of the rounded fc1 output: they may differ in the
    // last bits (docs/cuda-backend.md); on the CPU both are gelu_forward's.
    if (!kept) ops::gelu_forward(fc1, ws.act, st);
    fc2_.backward_gelu(dy, kept ? s.act : ws.act, fc1, ws.dfc1, ws, cx);
  }
  fc1_.backward(ws.dfc1, x, s.fc1_in, dx, ws, cx);
}

}  // namespace mcpp::model
