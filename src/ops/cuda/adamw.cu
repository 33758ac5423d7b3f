// AdamW step (decoupled weight decay, bias correction), as torch.optim.AdamW and the
// catalogue: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// param, m, v: f32; grad: f32 (or bf16/f16). The bias corrections are computed once on
// the host in f64.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

template <typename TG>
static __global__ void adamw_kernel(float* __restrict__ p, const TG* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v, int64_t n,
                                    float lr, float b1, float b2, float eps, float decay,
                                    float inv_bc1, float inv_bc2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float gi = to_f(g[i]);
    float mi = b1 * m[i] + (1.f - b1) * gi;
    float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * decay;
    p[i] = pi - lr * (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
  }
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& ap,
                Stream& s) {
  const char* op = "adamw_step";
  check_f32(param, op, "param");
  check_f32(m, op, "m");
  check_f32(v, op, "v");
  check_cuda(grad, op, "grad");
  int64_t n = param.numel();
  check_numel(grad, n, op, "grad");
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  MCPP_CHECK(ap.step >= 1, "{}: step {} must be >= 1 (1-based, for bias correction)", op,
             ap.step);
  if (n == 0) return;
  double bc1 = 1.0 - std::pow(ap.beta1, double(ap.step));
  double bc2 = 1.0 - std::pow(ap.beta2, double(ap.step));
  MCPP_DISPATCH_ACT(grad.dtype(), op,
                    adamw_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
                        static_cast<float*>(param.raw()), static_cast<const T*>(grad.raw()),
                        static_cast<float*>(m.raw()), static_cast<float*>(v.raw()), n,
                        float(ap.lr), float(ap.beta1), float(ap.beta2), float(ap.eps),
                        float(1.0 - ap.lr * ap.weight_decay), float(1.0 / bc1),
                        float(1.0 / bc2)));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
