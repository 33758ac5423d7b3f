#include "model/norm.h"

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::model {

void Norm::add_params(const TransformerConfig& c, const std::string& prefix, int layer,
                      std::vector<ParamInfo>& params) {
  const int64_t H = c.hidden_size;
  const Init w_init = c.zero_centered_gamma ? Init::Zeros : Init::Ones;  // 1 + 0 = 1 either way
  params.push_back(make_param(prefix + ".weight", {H}, TpSplit::None, w_init, 0, false, layer,
                              c.tp_size, /*sp=*/true));
  if (!c.rmsnorm)
    params.push_back(make_param(prefix + ".bias", {H}, TpSplit::None, Init::Zeros, 0, false, layer,
                                c.tp_size, /*sp=*/true));
}

Norm::Norm(const TransformerConfig& c, const ParamStore* store, const std::string& prefix)
    : rms_(c.rmsnorm),
      one_plus_(c.zero_centered_gamma),
      eps_(c.norm_epsilon),
      w_(ParamStore::view(store, prefix + ".weight")),
      b_(ParamStore::view(store, prefix + ".bias")) {}

void Norm::saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                       const TensorVisitor& v, bool keep_y) {
  v(s.y, {d.Tl, d.H}, d.dt, keep_y);
  v(s.rstd, {d.Tl}, d.sdt, true);
  v(s.mean, {d.Tl}, d.sdt, !c.rmsnorm);
}

// [H]: a small tensor, so recomputing 1 + w at each use (after every optimizer step the
// stored weight changes) costs two elementwise passes over H values.
const Tensor& Norm::gamma(const StepContext& cx) const {
  if (!one_plus_) return w_.w;
  if (!gamma_.defined())
    gamma_ = Tensor::empty(w_.w.shape(), w_.w.dtype(), w_.w.device());
  ops::fill(gamma_, 1.0, cx.stream());
  ops::axpy(1.0, w_.w, gamma_, cx.stream());
  return gamma_;
}

void Norm::forward(const Tensor& x, Saved& s, const StepContext& cx) const {
  const Tensor& w = gamma(cx);
  if (rms_)
    ops::rmsnorm_forward(x, w, eps_, s.y, s.rstd, cx.stream());
  else
    ops::layernorm_forward(x, w, b_.w, eps_, s.y, s.mean, s.rstd, cx.stream());
}

std::optional<Norm::Fold> Norm::fold(Saved& s, const StepContext& cx) const {
  // MCPP_DECODE_FOLD_NORM=0: every norm its own kernel (the same bits; bench/gpu comparisons).
  static const bool enabled = [] {
    const char* e = std::getenv("MCPP_DECODE_FOLD_NORM");
    if (!e || !*e) return true;
    const std::string v(e);
    MCPP_CHECK(v == "0" || v == "1", "MCPP_DECODE_FOLD_NORM={} is not 0 or 1", v);
    return v == "1";
  }();
  if (!enabled || !rms_ || !cx.pos || cx.tp_comm) return std::nullopt;
  return Fold{&gamma(cx), eps_, &s};
}

void Norm::backward(const Tensor& dy, const Tensor& x, const Saved& s, Tensor& dx, bool accumulate,
                    const StepContext& cx) {
  const Tensor& w = gamma(cx);
  if (rms_)
    ops::rmsnorm_backward(dy, x, w, s.rstd, dx, accumulate, w_.g, cx.stream());
  else
    ops::layernorm_backward(dy, x, w, s.mean, s.rstd, dx, accumulate, w_.g, b_.g, cx.stream());
}

}  // namespace mcpp::model
