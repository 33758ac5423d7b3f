// SGD with momentum and Lion on the CPU (ops/momentum_step.h; the element update in
// ops/momentum_math.h). Compiled with -ffp-contract=off (CMakeLists.txt): the update's
// multiplies and adds stay separately rounded, as the CUDA kernels round them.
#include "ops/cpu/cpu_common.h"
#include "ops/momentum_math.h"
#include "ops/split_main.h"

namespace mcpp::ops::cpu {

namespace {

// The state buffer's values; null when SGD keeps none (momentum 0).
template <typename R>
R* state_or_null(Tensor& m) {
  return m.defined() ? m.data<R>() : nullptr;
}

}  // namespace

void momentum_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& model_param,
                   const MomentumStepParams& p, Stream& s) {
  const Check c{"momentum_step"};
  c.stream(s);
  check_momentum_params("momentum_step", p, m);
  const DType dt = c.floating(param, "param");
  const int64_t n = param.numel();
  c.dtype(grad, "grad", dt), c.numel(grad, "grad", n);
  if (m.defined()) c.dtype(m, "m", dt), c.numel(m, "m", n);
  const bool out = model_param.defined();
  if (out) {
    c.defined(model_param, "model_param");
    c.numel(model_param, "model_param", n);
    MCPP_CHECK(model_param.dtype() == DType::BF16 || model_param.dtype() == DType::F16,
               "momentum_step: model_param is {}, expected bf16 or f16 (f32 and f64 "
               "parameters are stepped in place)",
               model_param.str());
    c.dtype(param, "param (fp32 main parameters, with a model_param)", DType::F32);
  }
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const MomentumScalars<R> a = MomentumScalars<R>::of(p);
    R* P = param.data<R>();
    R* M = state_or_null<R>(m);
    const R* G = grad.data<R>();
    auto* O = static_cast<uint16_t*>(out ? model_param.raw() : nullptr);
    const bool bf16 = out && model_param.dtype() == DType::BF16;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      R none = 0;
      R& mi = M ? M[i] : none;
      momentum_element(P[i], mi, ms_mul(G[i], a.gscale), a);
      if (O) O[i] = bf16 ? float_to_bf16(float(P[i])) : float_to_f16(float(P[i]));
    }
  });
}

void momentum_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m,
                         const MomentumStepParams& p, Stream& s) {
  const Check c{"momentum_step_split"};
  c.stream(s);
  c.defined(lo, "lo");
  check_momentum_params("momentum_step_split", p, m);
  const int64_t n =
      check_split_main("momentum_step_split", model_param, lo, nullptr, Device::CPU);
  c.dtype(grad, "grad", DType::F32), c.numel(grad, "grad", n);
  if (m.defined()) c.dtype(m, "m", DType::F32), c.numel(m, "m", n);
  const MomentumScalars<float> a = MomentumScalars<float>::of(p);
  auto* O = static_cast<uint16_t*>(model_param.raw());
  auto* L = lo.data<uint16_t>();
  float* M = state_or_null<float>(m);
  const float* G = grad.data<float>();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    float w = bits_float(split_main_join(O[i], L[i])), none = 0;
    momentum_element(w, M ? M[i] : none, ms_mul(G[i], a.gscale), a);
    const uint32_t b = float_bits(w);
    O[i] = split_main_model(b), L[i] = uint16_t(b);
  }
}

void adamuon_normalize(Tensor& u, Tensor& v, double beta2, double eps, double scale,
                       Stream& s) {
  const Check c{"adamuon_normalize"};
  c.stream(s);
  const int64_t n = u.numel();
  c.dtype(u, "u", DType::F32), c.dtype(v, "v", DType::F32), c.numel(v, "v", n);
  float* U = u.data<float>();
  float* V = v.data<float>();
  const float w = float(1.0 - beta2), e = float(eps), sc = float(scale);
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) adamuon_element(U[i], V[i], w, e, sc);
}

}  // namespace mcpp::ops::cpu
