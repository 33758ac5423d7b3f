#include "model/mlp.h"

#include "ops/ops.h"

namespace mcpp::model {

void DenseMlp::add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params) {
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, fc1 = (c.swiglu ? 2 : 1) * F;
  // SwiGLU's fc1 is [gate; up]: each rank holds its rows of both halves.
  ColumnParallelLinear::add_params(c, layer_param_name(layer, "mlp.linear_fc1"), layer, fc1, H,
                                   c.swiglu ? TpSplit::SwigluRows : TpSplit::Rows,
                                   c.init_method_std, c.add_bias_linear, params);
  RowParallelLinear::add_params(c, layer_param_name(layer, "mlp.linear_fc2"), layer, H, F,
                                output_init_std(c), c.add_bias_linear, params);
}

DenseMlp::DenseMlp(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      fc1_(store, layer_param_name(layer, "mlp.linear_fc1.weight"),
           layer_param_name(layer, "mlp.linear_fc1.bias")),
      fc2_(store, layer_param_name(layer, "mlp.linear_fc2.weight"),
           layer_param_name(layer, "mlp.linear_fc2.bias")) {}

void DenseMlp::saved_specs(const Dims& d, bool keep_activation, MlpSaved& sb,
                           const TensorVisitor& v) const {
  auto& s = static_cast<Saved&>(sb);
  ColumnParallelLinear::saved_specs(d, d.H, s.fc1_in, v);
  v(s.fc1, {d.T, cfg_->fc1_width_local()}, d.dt, true);
  v(s.act, {d.T, cfg_->ffn_local()}, d.dt, keep_activation);
}

void DenseMlp::scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                             const TensorVisitor& v) const {
  ColumnParallelLinear::scratch_specs(d, ws, v);
  RowParallelLinear::scratch_specs(d, ws, v);
  // FP8 with the fused casts in every layer (a GELU MLP, delayed scaling, FP8 wgrad, no
  // layer kept in bf16, bf16 on CUDA): the activation is never written in bf16.
  const Fp8Config& f = cfg_->fp8;
  const bool fp8_fused = !cfg_->swiglu && f.delayed() && f.wgrad && f.bf16_start == 0 &&
                         f.bf16_end == 0 && d.dt == DType::BF16 && d.dev == Device::CUDA &&
                         d.T % 16 == 0 && cfg_->ffn_local() % 16 == 0;
  v(ws.act, {d.T, cfg_->ffn_local()}, d.dt, uses_scratch_activation && !fp8_fused);
  v(ws.dfc1, {d.T, cfg_->fc1_width_local()}, d.dt, true);
  // SwiGLU only: GELU's gradient comes out of fc2's GEMM epilogue.
  v(ws.dact, {d.T, cfg_->ffn_local()}, d.dt, cfg_->swiglu);
}

void DenseMlp::forward(const Tensor& x, MlpSaved& sb, const Tensor* residual, Tensor& y,
                       Workspace& ws, const StepContext& cx) const {
  auto& s = static_cast<Saved&>(sb);
  Tensor& act = s.act.defined() ? s.act : ws.act;  // kept, or the shared scratch
  if (cfg_->swiglu) {
    fc1_.forward_swiglu(x, s.fc1_in, s.fc1, act, ws, cx);  // (one op in generation)
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
    fc1_.forward_gelu(x, s.fc1_in, s.fc1, act, ws, cx);  // GEMM epilogue
  }
  if (residual)
    fc2_.forward_residual(act, *residual, y, cx);
  else
    fc2_.forward(act, y, ws, cx);
}

void DenseMlp::backward(const Tensor& dy, const Tensor& x, MlpSaved& sb, Tensor& dx, Workspace& ws,
                        const StepContext& cx) {
  auto& s = static_cast<Saved&>(sb);
  Stream& st = cx.stream();
  const bool kept = s.act.defined();
  if (cfg_->swiglu && kept) {  // the same GEMMs and element functions as below, minus the y pass
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, s.act, ws.dact, cx);
    ops::swiglu_backward(ws.dact, s.fc1, ws.dfc1, st);
    fc2_.backward_weights(g, s.act, cx);
  } else if (cfg_->swiglu) {
    // fc2's input gradient first (it does not read the activation), then the SwiGLU
    // gradient and the activation from one read of fc1's output, then fc2's weight and
    // bias gradients, which need the activation. The same GEMMs as one linear_backward.
    const Tensor& g = fc2_.grad_output(dy, ws, cx);
    fc2_.backward_data(g, ws.act, ws.dact, cx);
    ops::swiglu_backward_recompute(ws.dact, s.fc1, ws.dfc1, ws.act, st);
    fc2_.backward_weights(g, ws.act, cx);
  } else if (fc2_.fp8().fused(s.fc1, cx)) {
    // FP8 with the fused casts: fc2's wgrad operand gelu(fc1) cast from fc1's output (no
    // bf16 activation; kept or with --no-fp8-wgrad the bf16 one, as below), fc2's dgrad into
    // ws.dfc1, then GELU's derivative taken in the cast of fc1's output gradient (with
    // fc1's bias gradient): no separate GELU pass either way.
    // A kept activation is cast as it is (the same bytes: fp8_gelu_cast's FP8 of gelu(pre)
    // is the cast of its bf16 gelu(pre); a plain column-wise cast is the cheaper pass:
    // 0.24 against 0.34 ms on [32768x8192]).
    Tensor none;
    if (fc2_.fp8().wgrad(cx) && !kept) {
      fc2_.fp8().precast_gelu_input(s.fc1, none, true, cx);
      fc2_.backward(dy, s.fc1, ws.dfc1, ws, cx);  // s.fc1: act's shape (the cast is made)
    } else {
      if (!kept) ops::gelu_forward(s.fc1, ws.act, st);
      fc2_.backward(dy, kept ? s.act : ws.act, ws.dfc1, ws, cx);
    }
    fc2_.fp8().clear_precast();
    fc1_.fp8_precast_dgelu_grad(ws.dfc1, s.fc1, ws.dfc1, cx);
    fc1_.backward(ws.dfc1, x, s.fc1_in, dx, ws, cx);
    fc1_.fp8().clear_precast();
    return;
  } else {  // the GELU gradient in the fc2 input-gradient GEMM's epilogue
    // On CUDA a kept activation is the fc1 GEMM epilogue's GELU (of the fp32 accumulator),
    // the recomputed one gelu_forward's of the rounded fc1 output: they may differ in the
    // last bits (docs/cuda-backend.md); on the CPU both are gelu_forward's.
    if (!kept) ops::gelu_forward(s.fc1, ws.act, st);
    fc2_.backward_gelu(dy, kept ? s.act : ws.act, s.fc1, ws.dfc1, ws, cx);
  }
  fc1_.backward(ws.dfc1, x, s.fc1_in, dx, ws, cx);
}

}  // namespace mcpp::model
