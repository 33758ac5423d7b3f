// GELU in its tanh form and its derivative, as f32 device functions: the one definition
// that activations.cu (gelu_forward / gelu_backward) and fp8_fused.cu (GELU fused into the
// FP8 casts) both apply, so the fused casts stay byte-identical to the unfused composition.
//   gelu(x)  = 0.5 x (1 + tanh(k0 (x + k1 x^3))),  k0 = sqrt(2/pi), k1 = 0.044715
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2),  t = tanh(...)
#pragma once

namespace mcpp::ops::cuda {

constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluK1 = 0.044715f;

__device__ __forceinline__ float gelu_f(float x) {
  float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
  return 0.5f * x * (1.f + t);
}
__device__ __forceinline__ float gelu_grad_f(float x) {
  float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
  return 0.5f * (1.f + t) +
         0.5f * x * (1.f - t * t) * kGeluK0 * (1.f + 3.f * kGeluK1 * x * x);
}

}  // namespace mcpp::ops::cuda
