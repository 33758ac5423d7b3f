// AdamW on the CPU, torch.optim.AdamW semantics (decoupled weight decay, bias
// correction at 1-based step t):
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
//   param, m, v (updated in place) and grad: same numel, one dtype, f32 or f64.
//   model_param (optional, param f32): bf16/f16 = the updated param rounded to nearest even
//   with tensor/dtype.h's helpers, as cpu::copy rounds it.
// The per-step scalars are formed in f64 and the element update runs in the tensors'
// dtype, as torch does for fp32 main parameters. Gradient scaling (loss scale, clipping)
// is done by the caller beforehand, with ops::scale.
#include <cmath>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& model_param,
                const AdamWParams& p, Stream& s) {
  const Check c{"adamw_step"};
  c.stream(s);
  const DType dt = c.floating(param, "param");
  c.dtype(grad, "grad", dt), c.dtype(m, "m", dt), c.dtype(v, "v", dt);
  const int64_t n = param.numel();
  c.numel(grad, "grad", n), c.numel(m, "m", n), c.numel(v, "v", n);
  const bool out = model_param.defined();
  if (out) {
    c.defined(model_param, "model_param");
    c.numel(model_param, "model_param", n);
    MCPP_CHECK(model_param.dtype() == DType::BF16 || model_param.dtype() == DType::F16,
               "adamw_step: model_param is {}, expected bf16 or f16 (f32 and f64 parameters "
               "are stepped in place)",
               model_param.str());
    c.dtype(param, "param (fp32 main parameters, with a model_param)", DType::F32);
  }
  MCPP_CHECK(p.step >= 1, "adamw_step: step is {}, expected >= 1 (bias correction is 1-based)",
             p.step);
  MCPP_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1,
             "adamw_step: betas ({}, {}) must lie in [0, 1)", p.beta1, p.beta2);
  MCPP_CHECK(p.lr >= 0 && p.eps >= 0 && p.weight_decay >= 0,
             "adamw_step: lr {}, eps {}, weight_decay {} must be non-negative", p.lr, p.eps,
             p.weight_decay);
  const double bc1 = 1 - std::pow(p.beta1, double(p.step));
  const double bc2 = 1 - std::pow(p.beta2, double(p.step));
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    R *P = param.data<R>(), *M = m.data<R>(), *V = v.data<R>();
    const R* G = grad.data<R>();
    const R decay = R(1 - p.lr * p.weight_decay), b1 = R(p.beta1), b2 = R(p.beta2);
    const R c1 = R(1 - p.beta1), c2 = R(1 - p.beta2), step_size = R(p.lr / bc1);
    const R sqrt_bc2 = R(std::sqrt(bc2)), eps = R(p.eps), gs = R(p.grad_scale);
    // store(i, p): the model-parameter write, if any, of the updated element i.
    auto update = [&](auto store) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) {
        const R g = G[i] * gs;  // as scale(grad, grad_scale): one rounded product
        const R mi = b1 * M[i] + c1 * g;
        const R vi = b2 * V[i] + c2 * g * g;
        M[i] = mi, V[i] = vi;
        P[i] = P[i] * decay - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
        store(i, P[i]);
      }
    };
    auto* O = static_cast<uint16_t*>(out ? model_param.raw() : nullptr);
    if (!out)
      update([](int64_t, R) {});
    else if (model_param.dtype() == DType::BF16)
      update([O](int64_t i, R x) { O[i] = float_to_bf16(float(x)); });
    else
      update([O](int64_t i, R x) { O[i] = float_to_f16(float(x)); });
  });
}

}  // namespace mcpp::ops::cpu
