#include "model/moe/experts.h"

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::model::moe {
namespace {

std::string fc1_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc1.weight" + std::to_string(e));
}
std::string fc2_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc2.weight" + std::to_string(e));
}

}  // namespace

void GroupedExperts::add_params(const TransformerConfig& c, int layer,
                                std::vector<ParamInfo>& params) {
  const int64_t H = c.hidden_size, I = c.moe.ffn_hidden_size, fc1 = (c.swiglu ? 2 : 1) * I;
  const int64_t e0 = c.moe.first_expert();
  for (int64_t e = e0; e < e0 + c.moe.local_experts(); ++e) {  // global indices
    ParamInfo w1 = make_param(fc1_name(layer, e), {fc1, H},
                              c.swiglu ? TpSplit::SwigluRows : TpSplit::Rows, Init::Normal,
                              c.init_method_std, true, layer, c.moe_etp());
    ParamInfo w2 = make_param(fc2_name(layer, e), {H, I}, TpSplit::Cols, Init::Normal,
                              output_init_std(c), true, layer, c.moe_etp());
    for (ParamInfo* p : {&w1, &w2}) {
      p->grad_group = GradGroup::Expert;
      p->expert = int(e);
      // Sharded over the ETP group: its box of the global tensor follows the ETP rank.
      if (c.moe.etp_size > 0) p->split_rank = int(c.moe.etp_rank);
      params.push_back(std::move(*p));
    }
  }
}

GroupedExperts::GroupedExperts(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c) {
  const int64_t e0 = c.moe.first_expert();
  for (int64_t e = e0; e < e0 + c.moe.local_experts(); ++e) {
    w1_.push_back(ParamStore::view(store, fc1_name(layer, e)));
    w2_.push_back(ParamStore::view(store, fc2_name(layer, e)));
  }
}

void GroupedExperts::saved_specs(const TransformerConfig& c, int64_t Nmax, DType dt, Saved& s,
                                 const TensorVisitor& v) {
  v(s.fc1, {Nmax, c.moe_fc1_width_local()}, dt, true);
  v(s.act, {Nmax, c.moe_ffn_local()}, dt, true);
}

void GroupedExperts::scratch_specs(const TransformerConfig& c, int64_t Nmax, DType dt, Scratch& w,
                                   const TensorVisitor& v) {
  v(w.ap, {Nmax, c.moe_ffn_local()}, dt, true);
  v(w.dap, {Nmax, c.moe_ffn_local()}, dt, true);
  v(w.dact, {Nmax, c.moe_ffn_local()}, dt, true);
  v(w.dfc1, {Nmax, c.moe_fc1_width_local()}, dt, true);
}

void GroupedExperts::forward(const Tensor& xp, const Tensor& p, const std::vector<int64_t>& counts,
                             Saved& s, Tensor& yp, Scratch& w, Stream& st) const {
  MCPP_CHECK(counts.size() == w1_.size(), "GroupedExperts: {} row counts for {} local experts",
             counts.size(), w1_.size());
  const int64_t N = xp.size(0);
  Tensor fc1 = s.fc1.narrow(0, N), act = s.act.narrow(0, N), ap = w.ap.narrow(0, N);
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;  // an expert without tokens: nothing to compute
    Tensor h = fc1.narrow(off, n);
    ops::linear_forward(xp.narrow(off, n), w1_[e].w, Tensor(), h, st);
    off += n;
  }
  if (cfg_->swiglu)
    ops::swiglu_forward(fc1, act, st);
  else
    ops::gelu_forward(fc1, act, st);
  ops::moe_scale_rows(act, p, ap, st);  // probabilities after the activation
  off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor y = yp.narrow(off, n);
    ops::linear_forward(ap.narrow(off, n), w2_[e].w, Tensor(), y, st);
    off += n;
  }
}

void GroupedExperts::backward(const Tensor& dyp, const Tensor& xp, const Tensor& p,
                              const std::vector<int64_t>& counts, const Saved& s, Tensor& dxp,
                              Tensor& dp, Scratch& w, Stream& st) {
  MCPP_CHECK(counts.size() == w1_.size(), "GroupedExperts: {} row counts for {} local experts",
             counts.size(), w1_.size());
  const int64_t N = xp.size(0);
  Tensor fc1 = s.fc1.narrow(0, N), act = s.act.narrow(0, N);
  Tensor ap = w.ap.narrow(0, N), dap = w.dap.narrow(0, N), dact = w.dact.narrow(0, N);
  Tensor dfc1 = w.dfc1.narrow(0, N), none;
  ops::moe_scale_rows(act, p, ap, st);  // the fc2 input, for its weight gradient
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor dx = dap.narrow(off, n);
    ops::linear_backward(dyp.narrow(off, n), ap.narrow(off, n), w2_[e].w, dx, false, w2_[e].g,
                         none, st);
    off += n;
  }
  ops::moe_row_dot(dap, act, dp, st);
  ops::moe_scale_rows(dap, p, dact, st);
  if (cfg_->swiglu)
    ops::swiglu_backward(dact, fc1, dfc1, st);
  else
    ops::gelu_backward(dact, fc1, dfc1, st);
  off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor dx = dxp.narrow(off, n);
    ops::linear_backward(dfc1.narrow(off, n), xp.narrow(off, n), w1_[e].w, dx, false, w1_[e].g,
                         none, st);
    off += n;
  }
}

}  // namespace mcpp::model::moe
