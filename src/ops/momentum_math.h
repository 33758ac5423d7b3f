// The element update of ops/momentum_step.h, shared by the CPU and CUDA backends so both
// leave the same bits: each multiply and add rounded on its own (the CUDA side through the
// _rn intrinsics, which nvcc never fuses; the CPU file is compiled with
// -ffp-contract=off).
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/momentum_step.h"

#if defined(__CUDACC__)
#define MCPP_MS_HD __host__ __device__ __forceinline__
#else
#define MCPP_MS_HD inline
#endif

namespace mcpp::ops {

#if defined(__CUDA_ARCH__)
MCPP_MS_HD float ms_div(float a, float b) { return __fdiv_rn(a, b); }
MCPP_MS_HD float ms_sqrt(float a) { return __fsqrt_rn(a); }
MCPP_MS_HD float ms_mul(float a, float b) { return __fmul_rn(a, b); }
MCPP_MS_HD float ms_add(float a, float b) { return __fadd_rn(a, b); }
MCPP_MS_HD float ms_sub(float a, float b) { return __fsub_rn(a, b); }
MCPP_MS_HD double ms_mul(double a, double b) { return __dmul_rn(a, b); }
MCPP_MS_HD double ms_add(double a, double b) { return __dadd_rn(a, b); }
MCPP_MS_HD double ms_sub(double a, double b) { return __dsub_rn(a, b); }
#else
MCPP_MS_HD float ms_div(float a, float b) { return a / b; }
MCPP_MS_HD float ms_sqrt(float a) { return std::sqrt(a); }
template <typename R>
MCPP_MS_HD R ms_mul(R a, R b) { return a * b; }
template <typename R>
MCPP_MS_HD R ms_add(R a, R b) { return a + b; }
template <typename R>
MCPP_MS_HD R ms_sub(R a, R b) { return a - b; }
#endif

// What one element's update does (the rule and, for SGD, the buffer's state).
enum class MomentumKind : int { SgdFirst, Sgd, SgdNoBuffer, Lion };

// The per-step scalars, formed in f64 on the host and rounded to R once.
template <typename R>
struct MomentumScalars {
  MomentumKind kind;
  bool decay_on;  // weight decay is not zero
  R lr, wd, momentum, decay, b1, c1, b2, c2, gscale;  // decay = 1 - lr wd; c = 1 - b

  static MomentumScalars of(const MomentumStepParams& p) {
    using Rule = MomentumStepParams::Rule;
    MomentumScalars a{};
    a.kind = p.rule == Rule::Lion   ? MomentumKind::Lion
             : p.momentum == 0      ? MomentumKind::SgdNoBuffer
             : p.first              ? MomentumKind::SgdFirst
                                    : MomentumKind::Sgd;
    a.decay_on = p.weight_decay != 0;
    a.lr = R(p.lr), a.wd = R(p.weight_decay), a.momentum = R(p.momentum);
    a.decay = R(1.0 - p.lr * p.weight_decay);
    a.b1 = R(p.beta1), a.c1 = R(1.0 - p.beta1), a.b2 = R(p.beta2), a.c2 = R(1.0 - p.beta2);
    a.gscale = R(p.grad_scale);
    return a;
  }
};

// One element: w the main parameter, m its state, g the (already scaled) gradient.
template <typename R>
MCPP_MS_HD void momentum_element(R& w, R& m, R g, const MomentumScalars<R>& a) {
  if (a.kind == MomentumKind::Lion) {
    if (a.decay_on) w = ms_mul(w, a.decay);
    const R c = ms_add(ms_mul(a.b1, m), ms_mul(a.c1, g));
    // torch.sign: -1, 0 or 1, and NaN stays NaN.
    const R sgn = c > R(0) ? R(1) : c < R(0) ? R(-1) : c == R(0) ? R(0) : c;
    w = ms_sub(w, ms_mul(a.lr, sgn));
    m = ms_add(ms_mul(a.b2, m), ms_mul(a.c2, g));
    return;
  }
  if (a.decay_on) g = ms_add(g, ms_mul(a.wd, w));
  if (a.kind == MomentumKind::SgdFirst)
    m = g;
  else if (a.kind == MomentumKind::Sgd)
    m = ms_add(ms_mul(a.momentum, m), g);
  w = ms_sub(w, ms_mul(a.lr, a.kind == MomentumKind::SgdNoBuffer ? g : m));
}

// adamuon_normalize's element (ops/momentum_step.h): w = 1 - beta2, all f32.
MCPP_MS_HD void adamuon_element(float& u, float& v, float w, float eps, float scale) {
  v = ms_add(v, ms_mul(w, ms_sub(ms_mul(u, u), v)));
  u = ms_mul(ms_div(u, ms_add(ms_sqrt(v), eps)), scale);
}

}  // namespace mcpp::ops
