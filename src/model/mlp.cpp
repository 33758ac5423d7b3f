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
  v(ws.act, {d.T, cfg_->ffn_local()}, d.dt, uses_scratch_activation);
  v(ws.dfc1, {d.T, cfg_->fc1_width_local()}, d.dt, true);
  // SwiGLU only: GELU's gradient comes out of fc2's GEMM epilogue.
  v(ws.dact, {d.T, cfg_->ffn_local()}, d.dt, cfg_->swiglu);
}

void DenseMlp::forward(const Tensor& x, MlpSaved& sb, const Tensor* residual, Tensor& y,
                       Workspace& ws, const StepContext& cx) const {
  auto& s = static_cast<Saved&>(sb);
  Tensor& act = s.act.defined() ? s.act : ws.act;  // kept, or the shared scratch
  if (cfg_->swiglu) {
    fc1_.forward(x, s.fc1_in, s.fc1, ws, cx);
    ops::swiglu_forward(s.fc1, act, cx.stream());
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
