// LayerNorm and RMSNorm over the last dim of x[T, H], forward above backward.
// x, y, dy, dx: one activation dtype; w, b: f32, bf16 or f16; mean, rstd: f32 [T];
// dw, db: f32 [H], accumulated (+=); dx: `=`, or `+=` with accumulate_dx (the residual
// stream's gradient). One warp per row; the statistics in two passes over the row
// (mean, then sum of squared deviations) for accuracy; dw/db through the deterministic
// column reduction in reduce.cuh.
//   LayerNorm: xhat = (x - mean) rstd, y = xhat w + b,
//              dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w
//   RMSNorm:   xhat = x rstd, y = xhat w, dx = rstd (g - xhat mean(g xhat))
#include "ops/cuda/common.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

// A parameter vector of run-time dtype (weights are read once per row from L1/L2).
struct PVec {
  const void* p = nullptr;
  DType t = DType::F32;
  __device__ __forceinline__ float operator[](int64_t i) const {
    switch (t) {
      case DType::BF16: return __bfloat162float(static_cast<const bf16*>(p)[i]);
      case DType::F16: return __half2float(static_cast<const f16*>(p)[i]);
      default: return static_cast<const float*>(p)[i];
    }
  }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kWarps = 8;

template <typename T, bool RMS>
static __global__ void norm_fwd_kernel(const T* __restrict__ x, PVec w, PVec b, float eps,
                                       T* __restrict__ y, float* __restrict__ mean_out,
                                       float* __restrict__ rstd_out, int64_t rows, int64_t H) {
  int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.y;
  if (row >= rows) return;
  int lane = threadIdx.x;
  const T* xr = x + row * H;
  float mean = 0.f;
  if (!RMS) {
    float s = 0.f;
    for (int64_t i = lane; i < H; i += 32) s += to_f(xr[i]);
    mean = warp_sum(s) / float(H);
  }
  float ss = 0.f;
  for (int64_t i = lane; i < H; i += 32) {
    float d = to_f(xr[i]) - mean;
    ss += d * d;
  }
  float rstd = rsqrtf(warp_sum(ss) / float(H) + eps);
  T* yr = y + row * H;
  for (int64_t i = lane; i < H; i += 32) {
    float v = (to_f(xr[i]) - mean) * rstd * w[i];
    if (b.p) v += b[i];
    yr[i] = from_f<T>(v);
  }
  if (lane == 0) {
    if (mean_out) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <typename T, bool RMS>
static __global__ void norm_bwd_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          PVec w, const float* __restrict__ mean_in,
                                          const float* __restrict__ rstd_in, T* dx, bool acc,
                                          int64_t rows, int64_t H) {
  int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.y;
  if (row >= rows) return;
  int lane = threadIdx.x;
  const T* xr = x + row * H;
  const T* dyr = dy + row * H;
  float mean = RMS ? 0.f : mean_in[row], rstd = rstd_in[row];
  float sg = 0.f, sgx = 0.f;
  for (int64_t i = lane; i < H; i += 32) {
    float g = to_f(dyr[i]) * w[i];
    float xh = (to_f(xr[i]) - mean) * rstd;
    sg += g;
    sgx += g * xh;
  }
  float mg = RMS ? 0.f : warp_sum(sg) / float(H);
  float mgx = warp_sum(sgx) / float(H);
  T* dxr = dx + row * H;
  for (int64_t i = lane; i < H; i += 32) {
    float g = to_f(dyr[i]) * w[i];
    float xh = (to_f(xr[i]) - mean) * rstd;
    float v = rstd * (g - mg - xh * mgx);
    if (acc) v += to_f(dxr[i]);
    dxr[i] = from_f<T>(v);
  }
}

// dw += dy * xhat, db += dy.
template <typename T, bool RMS>
struct NormParamGrad {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t H;
  __device__ void operator()(int64_t r, int64_t c, float (&acc)[RMS ? 1 : 2]) const {
    float d = to_f(dy[r * H + c]);
    float m = RMS ? 0.f : mean[r];
    acc[0] += d * (to_f(x[r * H + c]) - m) * rstd[r];
    if constexpr (!RMS) acc[1] += d;
  }
};

PVec pvec(const Tensor& t, int64_t H, const char* op, const char* name) {
  if (!t.defined()) return {};
  check_cuda(t, op, name);
  check_numel(t, H, op, name);
  MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
             "{}: {} is {}; f32, bf16 or f16 expected", op, name, t.str());
  return {t.raw(), t.dtype()};
}

template <bool RMS>
void norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                  Tensor* mean, Tensor& rstd, Stream& s, const char* op) {
  check_cuda(x, op, "x");
  check_cuda(y, op, "y");
  MCPP_CHECK(x.dtype() == y.dtype(), "{}: x is {}, y is {}; one dtype expected", op, x.str(),
             y.str());
  int64_t H = x.size(-1), rows = x.numel() / std::max<int64_t>(H, 1);
  check_numel(y, x.numel(), op, "y");
  MCPP_CHECK(w.defined(), "{}: the weight is undefined", op);
  PVec pw = pvec(w, H, op, "w"), pb = pvec(b, H, op, "b");
  float* mp = nullptr;
  if (mean) {
    check_f32(*mean, op, "mean");
    check_numel(*mean, rows, op, "mean");
    mp = static_cast<float*>(mean->raw());
  }
  check_f32(rstd, op, "rstd");
  check_numel(rstd, rows, op, "rstd");
  if (rows == 0) return;
  dim3 block(32, kWarps);
  unsigned grid = unsigned((rows + kWarps - 1) / kWarps);
  MCPP_DISPATCH_ACT(x.dtype(), op,
                    norm_fwd_kernel<T, RMS><<<grid, block, 0, stream_of(s)>>>(
                        static_cast<const T*>(x.raw()), pw, pb, float(eps),
                        static_cast<T*>(y.raw()), mp, static_cast<float*>(rstd.raw()), rows, H));
  MCPP_LAUNCH_CHECK();
}

template <bool RMS>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor* mean,
                   const Tensor& rstd, Tensor& dx, bool acc, Tensor& dw, Tensor* db, Stream& s,
                   const char* op) {
  check_cuda(x, op, "x");
  check_cuda(dy, op, "dy");
  int64_t H = x.size(-1), rows = x.numel() / std::max<int64_t>(H, 1);
  MCPP_CHECK(dy.dtype() == x.dtype(), "{}: dy is {}, x is {}; one dtype expected", op, dy.str(),
             x.str());
  check_numel(dy, x.numel(), op, "dy");
  PVec pw = pvec(w, H, op, "w");
  const float* mp = nullptr;
  if (mean) {
    check_f32(*mean, op, "mean");
    check_numel(*mean, rows, op, "mean");
    mp = static_cast<const float*>(mean->raw());
  }
  check_f32(rstd, op, "rstd");
  check_numel(rstd, rows, op, "rstd");
  const float* rp = static_cast<const float*>(rstd.raw());
  cudaStream_t cs = stream_of(s);
  if (rows == 0) return;
  if (dx.defined()) {
    check_cuda(dx, op, "dx");
    MCPP_CHECK(dx.dtype() == x.dtype(), "{}: dx is {}, x is {}; one dtype expected", op,
               dx.str(), x.str());
    check_numel(dx, x.numel(), op, "dx");
    dim3 block(32, kWarps);
    unsigned grid = unsigned((rows + kWarps - 1) / kWarps);
    MCPP_DISPATCH_ACT(x.dtype(), op,
                      norm_bwd_dx_kernel<T, RMS><<<grid, block, 0, cs>>>(
                          static_cast<const T*>(dy.raw()), static_cast<const T*>(x.raw()), pw,
                          mp, rp, static_cast<T*>(dx.raw()), acc, rows, H));
    MCPP_LAUNCH_CHECK();
  }
  float* dwp = nullptr;
  float* dbp = nullptr;
  if (dw.defined()) {
    check_f32(dw, op, "dw");
    check_numel(dw, H, op, "dw");
    dwp = static_cast<float*>(dw.raw());
  }
  if (db && db->defined()) {
    check_f32(*db, op, "db");
    check_numel(*db, H, op, "db");
    dbp = static_cast<float*>(db->raw());
  }
  if (!dwp && !dbp) return;
  MCPP_DISPATCH_ACT(x.dtype(), op, {
    NormParamGrad<T, RMS> f{static_cast<const T*>(dy.raw()), static_cast<const T*>(x.raw()), mp,
                            rp, H};
    column_reduce_add<RMS ? 1 : 2>(f, rows, H, dwp, dbp, cs);
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                       Tensor& mean, Tensor& rstd, Stream& s) {
  norm_forward<false>(x, w, b, eps, y, &mean, rstd, s, "layernorm_forward");
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, bool accumulate_dx, Tensor& dw,
                        Tensor& db, Stream& s) {
  norm_backward<false>(dy, x, w, &mean, rstd, dx, accumulate_dx, dw, &db, s,
                       "layernorm_backward");
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
                     Stream& s) {
  norm_forward<true>(x, w, Tensor(), eps, y, nullptr, rstd, s, "rmsnorm_forward");
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, bool accumulate_dx, Tensor& dw, Stream& s) {
  norm_backward<true>(dy, x, w, nullptr, rstd, dx, accumulate_dx, dw, nullptr, s,
                      "rmsnorm_backward");
}

}  // namespace mcpp::ops::cuda
