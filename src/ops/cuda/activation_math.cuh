// The activation functions' element math, as f32 device functions: the one definition that
// activations.cu (gelu_* / swiglu_*) and fp8_fused.cu (the same functions fused into the
// FP8 casts) both apply, so the fused casts stay byte-identical to the unfused composition.
//   gelu(x)  = 0.5 x (1 + tanh(y)) = x sigmoid(2y),  y = k0 (x + k1 x^3),
//              k0 = sqrt(2/pi), k1 = 0.044715
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) y'      (t = tanh(y), y' = k0 (1 + 3 k1 x^2))
//            = s + 2 x s (1 - s) y'                   (s = sigmoid(2y): 1 + t = 2s,
//                                                      1 - t^2 = 4 s (1 - s))
//   swiglu([g | u]) = silu(g) u,  silu(g) = g sigmoid(g)
//   d/dg = dy u sigmoid(g) (1 + g (1 - sigmoid(g))),  d/du = dy silu(g)
//   glu([g | u]) with slope k, offset o and clamp C (quick-GEGLU k = 1.702, SwiGLU k = 1;
//   ops::GluParams): g' = min(g, C), u' = min(max(u, -C), C), y = g' sigmoid(k g') (u' + o)
//   d/dg = [g <= C] dy (u' + o) s (1 + k g' (1 - s)),  d/du = [-C <= u <= C] dy g' s,
//   s = sigmoid(k g'); at k 1 without offset and clamp, swiglu's expressions (the same bits)
//   squared_relu(x) = relu(x)^2,  d/dx = dy 2 relu(x)   (exact in every dtype's f32 math)
//   gelu_erf(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)),  d/dx = Phi(x) + x phi(x),
//   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)   (erff / expf in every dtype: no fast form)
// FAST (every 16-bit activation dtype: kFastMath<T>) takes the sigmoid forms with the
// hardware exp2 and reciprocal (__expf, __fdividef: a few f32 ulps, where tanhf, expf and
// an IEEE division cost ~40 instructions and made the fused FP8 casts compute-bound: 1.5x
// slower, bench/RESULTS.md); a bf16 or f16 result rounds differently from the exact forms'
// in well under 0.1% of elements, and then by one unit. f32 tensors keep tanhf / expf / IEEE
// division, as the CPU computes them.
#pragma once

#include <limits>
#include <type_traits>

#include "ops/types.h"

namespace mcpp::ops::cuda {

constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluK1 = 0.044715f;

template <typename T>
constexpr bool kFastMath = !std::is_same_v<T, float>;

template <bool FAST>
__device__ __forceinline__ float sigmoid_f(float x) {
  if constexpr (FAST)
    return __fdividef(1.f, 1.f + __expf(-x));  // 0 once exp(-x) overflows: sigmoid's limit
  else
    return 1.f / (1.f + expf(-x));
}

template <bool FAST>
__device__ __forceinline__ float gelu_f(float x) {
  if constexpr (FAST) {
    return x * sigmoid_f<true>(2.f * kGeluK0 * (x + kGeluK1 * x * x * x));
  } else {
    const float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
    return 0.5f * x * (1.f + t);
  }
}

template <bool FAST>
__device__ __forceinline__ float gelu_grad_f(float x) {
  if constexpr (FAST) {
    const float s = sigmoid_f<true>(2.f * kGeluK0 * (x + kGeluK1 * x * x * x));
    return s + 2.f * x * s * (1.f - s) * kGeluK0 * (1.f + 3.f * kGeluK1 * x * x);
  } else {
    const float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
    return 0.5f * (1.f + t) +
           0.5f * x * (1.f - t * t) * kGeluK0 * (1.f + 3.f * kGeluK1 * x * x);
  }
}

template <bool FAST>
__device__ __forceinline__ float swiglu_f(float g, float u) {
  return g * sigmoid_f<FAST>(g) * u;
}

// The exact GELU (torch's F.gelu) and its derivative.
constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
__device__ __forceinline__ float gelu_erf_f(float x) {
  return 0.5f * x * (1.f + erff(x * kInvSqrt2));
}
__device__ __forceinline__ float gelu_erf_grad_f(float x) {
  return 0.5f * (1.f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

// Both gradients from one sigmoid.
template <bool FAST>
__device__ __forceinline__ void swiglu_grad_f(float d, float g, float u, float& dg, float& du) {
  const float sg = sigmoid_f<FAST>(g);
  dg = d * u * sg * (1.f + g * (1.f - sg));
  du = d * g * sg;
}

// A gated unit's parameters in f32 (glu_*, the experts' fused op): the offset and the clamp
// (+inf: none). The gate's function is the kernels' template argument (QUICK: quick_gelu, with
// slope 1.702; else silu, with swiglu's expressions, so that the bits are swiglu_f's).
constexpr float kQuickGeluK = 1.702f;
struct GluF {
  float offset = 0.f, clamp = std::numeric_limits<float>::infinity();
  bool clamped = false;  // clamp given: the masks apply (kept out of the plain expressions)
};
inline GluF glu_of(const MlpAct& a) {
  return {float(a.glu.offset), float(a.glu.clamp), a.glu.clamped()};
}
template <bool QUICK>
__device__ __forceinline__ float glu_slope_f(float g) {
  if constexpr (QUICK)
    return kQuickGeluK * g;
  else
    return g;
}

// torch.clamp's bounds: a NaN stays NaN (no comparison holds for it).
__device__ __forceinline__ float glu_gate_f(float v, float c) { return v > c ? c : v; }
__device__ __forceinline__ float glu_up_f(float v, float c) {
  v = v < -c ? -c : v;
  return v > c ? c : v;
}

template <bool FAST, bool QUICK>
__device__ __forceinline__ float glu_f(const GluF& p, float gt, float ut) {
  const float g = p.clamped ? glu_gate_f(gt, p.clamp) : gt;
  const float u = p.clamped ? glu_up_f(ut, p.clamp) : ut;
  return g * sigmoid_f<FAST>(glu_slope_f<QUICK>(g)) * (p.offset == 0.f ? u : u + p.offset);
}

// Both gradients from one sigmoid; 0 where the clamp cut the input (torch.clamp's gradient
// passes at the bounds themselves). Unclamped, swiglu_grad_f's expressions, unmasked.
template <bool FAST, bool QUICK>
__device__ __forceinline__ void glu_grad_f(const GluF& p, float d, float gt, float ut, float& dg,
                                           float& du) {
  if (!p.clamped) {
    const float s = sigmoid_f<FAST>(glu_slope_f<QUICK>(gt));
    const float uo = p.offset == 0.f ? ut : ut + p.offset;
    dg = d * uo * s * (1.f + glu_slope_f<QUICK>(gt) * (1.f - s));
    du = d * gt * s;
    return;
  }
  const float g = glu_gate_f(gt, p.clamp), u = glu_up_f(ut, p.clamp);
  const float s = sigmoid_f<FAST>(glu_slope_f<QUICK>(g)), uo = p.offset == 0.f ? u : u + p.offset;
  dg = gt <= p.clamp ? d * uo * s * (1.f + glu_slope_f<QUICK>(g) * (1.f - s)) : 0.f;
  du = ut >= -p.clamp && ut <= p.clamp ? d * g * s : 0.f;
}

// Squared ReLU (Primer): no transcendental, so one form for every dtype, the CPU's.
__device__ __forceinline__ float squared_relu_f(float x) {
  const float r = fmaxf(x, 0.f);
  return r * r;
}
__device__ __forceinline__ float squared_relu_grad_f(float x) { return 2.f * fmaxf(x, 0.f); }

}  // namespace mcpp::ops::cuda
