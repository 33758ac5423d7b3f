// The dispatch and shared argument checks of ops/momentum_step.h.
#include "ops/momentum_step.h"

#include "base/error.h"
#include "ops/dispatch.h"

namespace mcpp::ops {

void check_momentum_params(const char* op, const MomentumStepParams& p, const Tensor& m) {
  MCPP_CHECK(p.lr >= 0 && p.weight_decay >= 0,
             "{}: lr {} and weight_decay {} must be non-negative", op, p.lr, p.weight_decay);
  if (p.rule == MomentumStepParams::Rule::Lion) {
    MCPP_CHECK(p.beta1 >= 0 && p.beta1 <= 1 && p.beta2 >= 0 && p.beta2 < 1,
               "{}: Lion's betas ({}, {}) must lie in [0, 1]", op, p.beta1, p.beta2);
  } else {
    MCPP_CHECK(p.momentum >= 0, "{}: momentum {} must be non-negative", op, p.momentum);
  }
  const bool buffer = p.rule == MomentumStepParams::Rule::Lion || p.momentum != 0;
  MCPP_CHECK(!buffer || m.defined(), "{}: the state buffer m is undefined", op);
}

void momentum_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& model_param,
                   const MomentumStepParams& p, Stream& s) {
  MCPP_DISPATCH(momentum_step, param, grad, m, model_param, p, s);
}

void momentum_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m,
                         const MomentumStepParams& p, Stream& s) {
  MCPP_DISPATCH(momentum_step_split, model_param, lo, grad, m, p, s);
}

void adamuon_normalize(Tensor& u, Tensor& v, double beta2, double eps, double scale,
                       Stream& s) {
  MCPP_CHECK(beta2 >= 0 && beta2 < 1 && eps >= 0,
             "adamuon_normalize: beta2 {} must lie in [0, 1) and eps {} be non-negative", beta2,
             eps);
  MCPP_CHECK(u.dtype() == DType::F32 && v.dtype() == DType::F32 && u.numel() == v.numel(),
             "adamuon_normalize: u {} and v {} must be f32 of one size", u.str(), v.str());
  MCPP_DISPATCH(adamuon_normalize, u, v, beta2, eps, scale, s);
}

}  // namespace mcpp::ops
