#include "model/moe/shared_experts.h"

#include <cmath>

#include "model/moe/transfer.h"
#include "ops/ops.h"

namespace mcpp::model::moe {

void SharedExperts::add_params(const TransformerConfig& c, int layer,
                               std::vector<ParamInfo>& params) {
  const int64_t H = c.hidden_size, Is = c.moe.shared_ffn_hidden_size;
  ColumnParallelLinear::add_params(c, layer_param_name(layer, "mlp.shared_experts.linear_fc1"),
                                   layer, (c.gated_linear_unit() ? 2 : 1) * Is, H,
                                   c.gated_linear_unit() ? TpSplit::SwigluRows : TpSplit::Rows,
                                   c.init_method_std, false, params);
  RowParallelLinear::add_params(c, layer_param_name(layer, "mlp.shared_experts.linear_fc2"),
                                layer, H, Is, output_init_std(c), false, params);
  if (c.moe.shared_expert_gate)
    params.push_back(make_param(layer_param_name(layer, "mlp.shared_experts.gate_weight"), {1, H},
                                TpSplit::None, Init::Normal, c.init_method_std, true, layer,
                                c.tp_size, c.sp()));
}

SharedExperts::SharedExperts(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c),
      Is_local_(c.moe.shared_ffn_hidden_size / c.tp_size),
      fc1_(store, layer_param_name(layer, "mlp.shared_experts.linear_fc1.weight"), ""),
      fc2_(store, layer_param_name(layer, "mlp.shared_experts.linear_fc2.weight"), ""),
      gate_(ParamStore::view(store, layer_param_name(layer, "mlp.shared_experts.gate_weight"))),
      recompute_(c.recompute == TransformerConfig::Recompute::Selective &&
                 c.recompute_shared_experts) {}

void SharedExperts::saved_specs(const Dims& d, bool keep_activation, Saved& s,
                                const TensorVisitor& v) const {
  const bool gate = cfg_->moe.shared_expert_gate;
  ColumnParallelLinear::saved_specs(d, d.H, s.fc1_in, v);
  v(s.fc1, {d.T, (cfg_->gated_linear_unit() ? 2 : 1) * Is_local_}, d.dt, !recompute_);
  // (FP8: fc2's cast of its input is made in the forward; the activation stays kept.)
  v(s.act, {d.T, Is_local_}, d.dt, cfg_->fp8.enabled() || (!recompute_ && keep_activation));
  v(s.y0, {d.Tl, d.H}, d.dt, gate);
  v(s.gate, {d.Tl}, d.sdt, gate);
  v(s.z, {d.Tl, 1}, d.dt, gate);
}

void SharedExperts::scratch_specs(const Dims& d, Scratch& w, Workspace& ws,
                                  const TensorVisitor& v) const {
  const bool gate = cfg_->moe.shared_expert_gate;
  ColumnParallelLinear::scratch_specs(d, ws, v);
  RowParallelLinear::scratch_specs(d, ws, v);
  v(w.dact, {d.T, Is_local_}, d.dt, true);
  v(w.dfc1, {d.T, (cfg_->gated_linear_unit() ? 2 : 1) * Is_local_}, d.dt, true);
  v(w.dy0, {d.Tl, d.H}, d.dt, gate);
  v(w.dz, {d.Tl, 1}, d.dt, gate);
  v(w.dgate, {d.Tl}, d.sdt, gate);
  v(w.act, {d.T, Is_local_}, d.dt, !cfg_->fp8.enabled());
  v(w.fc1, {d.T, (cfg_->gated_linear_unit() ? 2 : 1) * Is_local_}, d.dt, recompute_);
}

void SharedExperts::forward(const Tensor& x, Saved& s, Tensor& y, Scratch& w, Workspace& ws,
                            const StepContext& cx) const {
  Stream& st = cx.stream();
  Tensor& act = s.act.defined() ? s.act : w.act;
  Tensor& fc1 = s.fc1.defined() ? s.fc1 : w.fc1;
  fc1_.forward(x, s.fc1_in, fc1, ws, cx);
  ops::mlp_activation_forward(cfg_->activation(), fc1, act, st);
  if (!cfg_->moe.shared_expert_gate) {
    fc2_.forward(act, y, ws, cx);
    return;
  }
  fc2_.forward(act, s.y0, ws, cx);
  ops::linear_forward(x, gate_.w, Tensor(), s.z, st);
  std::vector<double> z = to_host(s.z, st);
  for (double& v : z) v = 1.0 / (1.0 + std::exp(-v));
  from_host(z, s.gate, st);
  ops::moe_scale_rows(s.y0, s.gate, y, st);
}

void SharedExperts::backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx, Scratch& w,
                             Workspace& ws, const StepContext& cx) {
  Stream& st = cx.stream();
  if (!s.fc1.defined()) fc1_.forward(x, s.fc1_in, w.fc1, ws, cx);  // shared_experts recompute
  const Tensor& fc1 = s.fc1.defined() ? s.fc1 : w.fc1;
  const Tensor* d0 = &dy;
  if (cfg_->moe.shared_expert_gate) {
    ops::moe_row_dot(dy, s.y0, w.dgate, st);
    std::vector<double> dg = to_host(w.dgate, st), g = to_host(s.gate, st);
    for (size_t i = 0; i < dg.size(); ++i) dg[i] *= g[i] * (1.0 - g[i]);
    from_host(dg, w.dz, st);
    ops::moe_scale_rows(dy, s.gate, w.dy0, st);
    d0 = &w.dy0;
  }
  if (s.act.defined()) {
    fc2_.backward(*d0, s.act, w.dact, ws, cx);
    ops::mlp_activation_backward(cfg_->activation(), w.dact, fc1, w.dfc1, st);
  } else if (cfg_->plain_swiglu()) {
    // fc2's input gradient (which does not read the activation), then the SwiGLU gradient
    // and the activation from one read of fc1's output, then fc2's weight gradient: the
    // same GEMMs as one backward (DenseMlp's order).
    const Tensor& g = fc2_.grad_output(*d0, ws, cx);
    fc2_.backward_data(g, w.act, w.dact, cx);
    ops::swiglu_backward_recompute(w.dact, fc1, w.dfc1, w.act, st);
    fc2_.backward_weights(g, w.act, cx);
  } else {  // the others: the activation again, then as when it is kept
    ops::mlp_activation_forward(cfg_->activation(), fc1, w.act, st);
    fc2_.backward(*d0, w.act, w.dact, ws, cx);
    ops::mlp_activation_backward(cfg_->activation(), w.dact, fc1, w.dfc1, st);
  }
  fc1_.backward(w.dfc1, x, s.fc1_in, dx, ws, cx);
  if (cfg_->moe.shared_expert_gate) {
    Tensor none;
    ops::linear_backward(w.dz, x, gate_.w, dx, true, gate_.g, none, st);
  }
}

}  // namespace mcpp::model::moe
