// GELU (tanh form and exact), SwiGLU, squared ReLU and the gated units with offset and clamp
// (glu_*: quick-GEGLU, SwiGLU), forward above backward. x, y, dy, dx: one activation dtype (f32,
// bf16, f16), f32 arithmetic; every output is overwritten (`=`). The element math (and its
// fast forms for 16-bit dtypes) is activation_math.cuh's.
// swiglu_backward_recompute writes both from one read of x (the MLP backward).
// Each op has a 16-byte vector kernel (a Pack of 8 bf16/f16 or 4 f32 per thread and step;
// common.cuh) taken when every pointer is 16-byte aligned (and, for SwiGLU, F is a whole
// number of packs), and the scalar kernel for anything else; both compute the same float
// expression per element, so they agree bit for bit.
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/activation_math.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

// The element-wise activations (GELU, squared ReLU) as an Op: f(x) and its derivative, in
// f32. GELU takes its fast 16-bit forms for bf16/f16 (kFastMath<T>).
template <typename T>
struct GeluOp {
  static __device__ __forceinline__ float f(float x) { return gelu_f<kFastMath<T>>(x); }
  static __device__ __forceinline__ float grad(float x) { return gelu_grad_f<kFastMath<T>>(x); }
};
// The exact GELU: y = x Phi(x) (erf form, every dtype).
template <typename T>
struct GeluErfOp {
  static __device__ __forceinline__ float f(float x) { return gelu_erf_f(x); }
  static __device__ __forceinline__ float grad(float x) { return gelu_erf_grad_f(x); }
};
// Squared ReLU: y = relu(x)^2, dx = dy * 2 relu(x).
template <typename T>
struct SquaredReluOp {
  static __device__ __forceinline__ float f(float x) { return squared_relu_f(x); }
  static __device__ __forceinline__ float grad(float x) { return squared_relu_grad_f(x); }
};

template <typename T, typename Op>
static __global__ void act_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(Op::f(to_f(x[i])));
}
template <typename T, typename Op>
static __global__ void act_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = from_f<T>(to_f(dy[i]) * Op::grad(to_f(x[i])));
}

// Vector forms: nv whole packs, then the n - nv*N tail elements one by one.
template <typename T, typename Op>
static __global__ void act_fwd_vec_kernel(const T* __restrict__ x, T* __restrict__ y,
                                          int64_t n) {
  constexpr int N = kPackN<T>;
  int64_t nv = n / N, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    Pack<T, N> a = ld_pack<N>(x + v * N), o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_f<T>(Op::f(to_f(a.v[k])));
    st_pack(y + v * N, o);
  }
  for (int64_t i = nv * N + tid; i < n; i += stride) y[i] = from_f<T>(Op::f(to_f(x[i])));
}
template <typename T, typename Op>
static __global__ void act_bwd_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          T* __restrict__ dx, int64_t n) {
  constexpr int N = kPackN<T>;
  int64_t nv = n / N, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    Pack<T, N> d = ld_pack<N>(dy + v * N), a = ld_pack<N>(x + v * N), o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_f<T>(to_f(d.v[k]) * Op::grad(to_f(a.v[k])));
    st_pack(dx + v * N, o);
  }
  for (int64_t i = nv * N + tid; i < n; i += stride)
    dx[i] = from_f<T>(to_f(dy[i]) * Op::grad(to_f(x[i])));
}

// The gated units' element rules as a Unit (value(g, u), grad(d, g, u, dg, du), f32): SwiGLU's
// (swiglu_*), or a gated unit with the offset and clamp it carries (glu_*).
template <typename T>
struct SwigluUnit {
  GluF p;  // (unused: SwiGLU has neither)
  __device__ __forceinline__ float value(float g, float u) const {
    return swiglu_f<kFastMath<T>>(g, u);
  }
  __device__ __forceinline__ void grad(float d, float g, float u, float& dg, float& du) const {
    swiglu_grad_f<kFastMath<T>>(d, g, u, dg, du);
  }
};
template <typename T, bool QUICK>
struct GluUnit {
  GluF p;
  __device__ __forceinline__ float value(float g, float u) const {
    return glu_f<kFastMath<T>, QUICK>(p, g, u);
  }
  __device__ __forceinline__ void grad(float d, float g, float u, float& dg, float& du) const {
    glu_grad_f<kFastMath<T>, QUICK>(p, d, g, u, dg, du);
  }
};
template <typename T>
using QuickGegluUnit = GluUnit<T, true>;
template <typename T>
using SiluGluUnit = GluUnit<T, false>;

// x[T, 2F] = [gate | up]; y, dy[T, F]; dx[T, 2F]. kY: write y = unit(x); kDx: write dx
// from dy; both: the two from one read of x (swiglu_backward_recompute). Pointers of an
// output not written (and dy without kDx) are null. One thread per output element.
template <typename T, typename U, bool kY, bool kDx>
static __global__ void swiglu_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     T* __restrict__ dx, T* __restrict__ y, int64_t rows,
                                     int64_t F, U unit) {
  int64_t n = rows * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / F, f = i - r * F;
    float g = to_f(x[r * 2 * F + f]), u = to_f(x[r * 2 * F + F + f]);
    if constexpr (kY) y[i] = from_f<T>(unit.value(g, u));
    if constexpr (kDx) {
      float dg, du;
      unit.grad(to_f(dy[i]), g, u, dg, du);
      dx[r * 2 * F + f] = from_f<T>(dg);
      dx[r * 2 * F + F + f] = from_f<T>(du);
    }
  }
}

// Vector form: one pack of N output columns per thread and step; F % N == 0, so a pack
// never straddles a row or the gate | up boundary. nv = rows * F / N < 2^32 (the launcher
// checks), so the row of pack v is a 32-bit division.
template <typename T, typename U, bool kY, bool kDx>
static __global__ void swiglu_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         T* __restrict__ dx, T* __restrict__ y, int64_t nv,
                                         uint32_t FV, int64_t F, U unit) {
  constexpr int N = kPackN<T>;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < nv;
       v += int64_t(gridDim.x) * blockDim.x) {
    uint32_t r = uint32_t(v) / FV, c = uint32_t(v) - r * FV;  // row, pack within the row
    int64_t off = int64_t(r) * 2 * F + int64_t(c) * N;
    Pack<T, N> pg = ld_pack<N>(x + off), pu = ld_pack<N>(x + off + F), pd, oy, og, ou;
    if constexpr (kDx) pd = ld_pack<N>(dy + v * N);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float g = to_f(pg.v[k]), u = to_f(pu.v[k]);
      if constexpr (kY) oy.v[k] = from_f<T>(unit.value(g, u));
      if constexpr (kDx) {
        float dg, du;
        unit.grad(to_f(pd.v[k]), g, u, dg, du);
        og.v[k] = from_f<T>(dg);
        ou.v[k] = from_f<T>(du);
      }
    }
    if constexpr (kY) st_pack(y + v * N, oy);
    if constexpr (kDx) {
      st_pack(dx + off, og);
      st_pack(dx + off + F, ou);
    }
  }
}

// The SwiGLU vector path: aligned pointers, F a whole number of packs, packs countable
// in 32 bits.
template <typename T>
bool swiglu_vec_ok(int64_t rows, int64_t F, std::initializer_list<const void*> ptrs) {
  constexpr int N = kPackN<T>;
  for (const void* p : ptrs)
    if (!is_aligned16(p)) return false;
  return F % N == 0 && rows * (F / N) <= int64_t(UINT32_MAX);
}

// Launches swiglu_kernel<T, Unit<T>, kY, kDx> or its vector form on checked tensors; dy and
// dx (without kDx) and y (without kY) are null. x is [rows, 2F]; p: the unit's parameters.
template <template <typename> class Unit, bool kY, bool kDx>
void swiglu_launch(const char* op, const Tensor* dy, const Tensor& x, Tensor* dx, Tensor* y,
                   int64_t rows, int64_t F, const GluF& p, Stream& s) {
  if (rows * F == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), op, {
    constexpr int N = kPackN<T>;
    auto xp = static_cast<const T*>(x.raw());
    auto dyp = dy ? static_cast<const T*>(dy->raw()) : nullptr;
    auto dxp = dx ? static_cast<T*>(dx->raw()) : nullptr;
    auto yp = y ? static_cast<T*>(y->raw()) : nullptr;
    const Unit<T> unit{p};
    if (swiglu_vec_ok<T>(rows, F, {dyp, xp, dxp, yp})) {  // null counts as aligned
      int64_t nv = rows * (F / N);
      swiglu_vec_kernel<T, Unit<T>, kY, kDx><<<grid_for(nv, 256), 256, 0, stream_of(s)>>>(
          dyp, xp, dxp, yp, nv, uint32_t(F / N), F, unit);
    } else {
      swiglu_kernel<T, Unit<T>, kY, kDx>
          <<<grid_for(rows * F, 256), 256, 0, stream_of(s)>>>(dyp, xp, dxp, yp, rows, F, unit);
    }
  });
  MCPP_LAUNCH_CHECK();
}

void check_same_act(const Tensor& a, const Tensor& b, const char* op, const char* na,
                    const char* nb) {
  check_cuda(a, op, na);
  check_cuda(b, op, nb);
  MCPP_CHECK(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}; one activation dtype expected",
             op, na, a.str(), nb, b.str());
}

}  // namespace

// y = Op(x), dx = dy * Op'(x): the vector kernel where every pointer is 16-byte aligned.
template <template <typename> class Op>
void act_forward(const Tensor& x, Tensor& y, Stream& s, const char* op) {
  check_same_act(x, y, op, "x", "y");
  check_numel(y, x.numel(), op, "y");
  int64_t n = x.numel();
  if (n == 0) return;
  bool vec = is_aligned16(x.raw()) && is_aligned16(y.raw());
  MCPP_DISPATCH_ACT(x.dtype(), op, {
    auto xp = static_cast<const T*>(x.raw());
    auto yp = static_cast<T*>(y.raw());
    if (vec)
      act_fwd_vec_kernel<T, Op<T>>
          <<<grid_for(n / kPackN<T> + 1, 256), 256, 0, stream_of(s)>>>(xp, yp, n);
    else
      act_fwd_kernel<T, Op<T>><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(xp, yp, n);
  });
  MCPP_LAUNCH_CHECK();
}

template <template <typename> class Op>
void act_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s, const char* op) {
  check_same_act(dy, x, op, "dy", "x");
  check_same_act(dx, x, op, "dx", "x");
  check_numel(dy, x.numel(), op, "dy");
  check_numel(dx, x.numel(), op, "dx");
  int64_t n = x.numel();
  if (n == 0) return;
  bool vec = is_aligned16(dy.raw()) && is_aligned16(x.raw()) && is_aligned16(dx.raw());
  MCPP_DISPATCH_ACT(x.dtype(), op, {
    auto dyp = static_cast<const T*>(dy.raw());
    auto xp = static_cast<const T*>(x.raw());
    auto dxp = static_cast<T*>(dx.raw());
    if (vec)
      act_bwd_vec_kernel<T, Op<T>>
          <<<grid_for(n / kPackN<T> + 1, 256), 256, 0, stream_of(s)>>>(dyp, xp, dxp, n);
    else
      act_bwd_kernel<T, Op<T>><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(dyp, xp, dxp, n);
  });
  MCPP_LAUNCH_CHECK();
}

void gelu_forward(const Tensor& x, Tensor& y, Stream& s) {
  act_forward<GeluOp>(x, y, s, "gelu_forward");
}
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  act_backward<GeluOp>(dy, x, dx, s, "gelu_backward");
}
void gelu_erf_forward(const Tensor& x, Tensor& y, Stream& s) {
  act_forward<GeluErfOp>(x, y, s, "gelu_erf_forward");
}
void gelu_erf_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  act_backward<GeluErfOp>(dy, x, dx, s, "gelu_erf_backward");
}
void squared_relu_forward(const Tensor& x, Tensor& y, Stream& s) {
  act_forward<SquaredReluOp>(x, y, s, "squared_relu_forward");
}
void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  act_backward<SquaredReluOp>(dy, x, dx, s, "squared_relu_backward");
}

void swiglu_forward(const Tensor& x, Tensor& y, Stream& s) {
  check_same_act(x, y, "swiglu_forward", "x", "y");
  int64_t W = x.size(-1);
  MCPP_CHECK(W % 2 == 0, "swiglu_forward: x {} has an odd last dimension", x.str());
  int64_t F = W / 2, rows = x.numel() / std::max<int64_t>(W, 1);
  check_numel(y, rows * F, "swiglu_forward", "y");
  swiglu_launch<SwigluUnit, true, false>("swiglu_forward", nullptr, x, nullptr, &y, rows, F,
                                      GluF{}, s);
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  check_same_act(dy, x, "swiglu_backward", "dy", "x");
  check_same_act(dx, x, "swiglu_backward", "dx", "x");
  int64_t W = x.size(-1);
  MCPP_CHECK(W % 2 == 0, "swiglu_backward: x {} has an odd last dimension", x.str());
  int64_t F = W / 2, rows = x.numel() / std::max<int64_t>(W, 1);
  check_numel(dy, rows * F, "swiglu_backward", "dy");
  check_numel(dx, x.numel(), "swiglu_backward", "dx");
  swiglu_launch<SwigluUnit, false, true>("swiglu_backward", &dy, x, &dx, nullptr, rows, F,
                                      GluF{}, s);
}

void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               Stream& s) {
  const char* op = "swiglu_backward_recompute";
  check_same_act(dy, x, op, "dy", "x");
  check_same_act(dx, x, op, "dx", "x");
  check_same_act(y, x, op, "y", "x");
  int64_t W = x.size(-1);
  MCPP_CHECK(W % 2 == 0, "{}: x {} has an odd last dimension", op, x.str());
  int64_t F = W / 2, rows = x.numel() / std::max<int64_t>(W, 1);
  check_numel(dy, rows * F, op, "dy");
  check_numel(dx, x.numel(), op, "dx");
  check_numel(y, rows * F, op, "y");
  swiglu_launch<SwigluUnit, true, true>(op, &dy, x, &dx, &y, rows, F, GluF{}, s);
}

void glu_forward(const Tensor& x, MlpAct act, Tensor& y, Stream& s) {
  const char* op = "glu_forward";
  MCPP_CHECK(act.gated(), "{}: the activation is not a gated unit (SwiGLU or quick-GEGLU)", op);
  check_same_act(x, y, op, "x", "y");
  int64_t W = x.size(-1);
  MCPP_CHECK(W % 2 == 0, "{}: x {} has an odd last dimension", op, x.str());
  int64_t F = W / 2, rows = x.numel() / std::max<int64_t>(W, 1);
  check_numel(y, rows * F, op, "y");
  if (act.kind == MlpActivation::QuickGeglu)
    swiglu_launch<QuickGegluUnit, true, false>(op, nullptr, x, nullptr, &y, rows, F, glu_of(act),
                                               s);
  else
    swiglu_launch<SiluGluUnit, true, false>(op, nullptr, x, nullptr, &y, rows, F, glu_of(act), s);
}

void glu_backward(const Tensor& dy, const Tensor& x, MlpAct act, Tensor& dx, Stream& s) {
  const char* op = "glu_backward";
  MCPP_CHECK(act.gated(), "{}: the activation is not a gated unit (SwiGLU or quick-GEGLU)", op);
  check_same_act(dy, x, op, "dy", "x");
  check_same_act(dx, x, op, "dx", "x");
  int64_t W = x.size(-1);
  MCPP_CHECK(W % 2 == 0, "{}: x {} has an odd last dimension", op, x.str());
  int64_t F = W / 2, rows = x.numel() / std::max<int64_t>(W, 1);
  check_numel(dy, rows * F, op, "dy");
  check_numel(dx, x.numel(), op, "dx");
  if (act.kind == MlpActivation::QuickGeglu)
    swiglu_launch<QuickGegluUnit, false, true>(op, &dy, x, &dx, nullptr, rows, F, glu_of(act), s);
  else
    swiglu_launch<SiluGluUnit, false, true>(op, &dy, x, &dx, nullptr, rows, F, glu_of(act), s);
}

}  // namespace mcpp::ops::cuda
