// AdamW step (decoupled weight decay, bias correction), as torch.optim.AdamW and the
// catalogue: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// param, m, v: f32; grad: f32 (or bf16/f16); model_param (optional): bf16/f16, written with
// the updated param rounded as copy rounds it (from_d), so a mixed-precision step needs no
// second pass over the fp32 main params. The bias corrections are computed once on the
// host in f64.
//
// One memory-bound pass: 28 bytes per element (p, g, m, v read; p, m, v written; f32
// grads), +2 with the bf16/f16 output. When every pointer is 16-byte aligned, each thread
// moves kPack = 8 elements per iteration as whole 16-byte words (two per f32 array, one per
// 16-bit one: up to 128 bytes in flight per thread); the last n % kPack elements, and
// every element of unaligned views, go through the scalar loop. Both paths call
// adamw_element (the arithmetic of the scalar kernel this file had before, each operation
// explicitly rounded), so results are bitwise the same whatever path runs. The grid
// is the number of blocks the GPU holds at once (or fewer for small runs), each thread
// striding over the packs. adamw_step_split (ops/split_main.h) runs the same element update
// on main parameters held as (bf16 model parameter, lower half): 28 bytes an element.
// Both take bf16 moments beside f32 gradients (ops/split_main.h): each moment widened,
// updated by adamw_element, stored rounded to nearest even (2 bytes an element less each).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"
#include "ops/split_main.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPack = 8;  // elements per thread per iteration

// The per-step scalars, formed on the host.
struct AdamWScalars {
  float lr, b1, b2, c1, c2, eps, decay, inv_bc1, inv_bc2;  // c1 = 1 - b1, c2 = 1 - b2
  float gscale;  // the gradient's factor (clipping): exact when 1
};

// Every operation an explicitly rounded intrinsic: nvcc may not contract any of them into
// an FMA, so the packed and the scalar loop (inlined into different code) give the same
// bits (GpuAdamW.FusedModelParamsBitwise; with plain operators the two loops were
// contracted differently and differed in the last bit).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g,
                                              const AdamWScalars& a) {
  const float mi = __fadd_rn(__fmul_rn(a.b1, m), __fmul_rn(a.c1, g));
  const float vi = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(__fmul_rn(a.c2, g), g));
  m = mi;
  v = vi;
  const float den = __fadd_rn(__fsqrt_rn(__fmul_rn(vi, a.inv_bc2)), a.eps);
  p = __fsub_rn(__fmul_rn(p, a.decay), __fdiv_rn(__fmul_rn(a.lr, __fmul_rn(mi, a.inv_bc1)), den));
}

// The gradient times the clipping factor, rounded to the gradient's type: the bits
// ops::scale (axpby's beta * y, one rounded product) would have left in the buffer.
template <typename TG>
__device__ __forceinline__ float scaled_grad(TG g, float s) {
  return to_f(from_f<TG>(__fmul_rn(s, to_f(g))));
}

// A pack of a moment as f32 (TS: float or bf16), and back (bf16: rounded to nearest even).
template <typename TS>
__device__ __forceinline__ Pack<float, kPack> ld_moments(const TS* x) {
  if constexpr (std::is_same_v<TS, float>) {
    return ld_pack<kPack>(x);
  } else {
    const Pack<TS, kPack> h = ld_pack<kPack>(x);
    Pack<float, kPack> f;
#pragma unroll
    for (int j = 0; j < kPack; ++j) f.v[j] = to_f(h.v[j]);
    return f;
  }
}
template <typename TS>
__device__ __forceinline__ void st_moments(TS* x, const Pack<float, kPack>& f) {
  if constexpr (std::is_same_v<TS, float>) {
    st_pack(x, f);
  } else {
    Pack<TS, kPack> h;
#pragma unroll
    for (int j = 0; j < kPack; ++j) h.v[j] = from_f<TS>(f.v[j]);
    st_pack(x, h);
  }
}

// TG: the gradient's type. TO: the model parameters' (bf16/f16), or void for none (out is
// then null). TM, TV: the moments' (float, or bf16 with f32 gradients). packs: whole
// kPack-element packs done with 16-byte accesses (0 when a pointer is unaligned); the
// scalar loop does elements packs * kPack .. n-1.
template <typename TG, typename TO, typename TM, typename TV>
static __global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ p, const TG* __restrict__ g, TM* __restrict__ m,
                 TV* __restrict__ v, TO* __restrict__ out, int64_t n, int64_t packs,
                 AdamWScalars a) {
  constexpr bool kOut = !std::is_void_v<TO>;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = tid; k < packs; k += stride) {
    const int64_t i = k * kPack;
    Pack<float, kPack> pp = ld_pack<kPack>(p + i), mp = ld_moments(m + i),
                       vp = ld_moments(v + i);
    const Pack<TG, kPack> gp = ld_pack<kPack>(g + i);
#pragma unroll
    for (int j = 0; j < kPack; ++j)
      adamw_element(pp.v[j], mp.v[j], vp.v[j], scaled_grad(gp.v[j], a.gscale), a);
    st_pack(p + i, pp);
    st_moments(m + i, mp);
    st_moments(v + i, vp);
    if constexpr (kOut) {
      Pack<TO, kPack> op;
#pragma unroll
      for (int j = 0; j < kPack; ++j) op.v[j] = from_d<TO>(double(pp.v[j]));
      st_pack(out + i, op);
    }
  }
  for (int64_t i = packs * kPack + tid; i < n; i += stride) {
    float pi = p[i], mi = to_f(m[i]), vi = to_f(v[i]);
    adamw_element(pi, mi, vi, scaled_grad(g[i], a.gscale), a);
    p[i] = pi;
    m[i] = from_f<TM>(mi);
    v[i] = from_f<TV>(vi);
    if constexpr (kOut) out[i] = from_d<TO>(double(pi));
  }
}

// Blocks of kThreads that the device holds at once for this kernel: the grid for a large
// step (more blocks would only queue behind them).
template <typename TG, typename TO, typename TM, typename TV>
int64_t resident_blocks() {
  static const int64_t blocks = occupancy_blocks(adamw_kernel<TG, TO, TM, TV>, kThreads);
  return blocks;
}

template <typename TG, typename TO, typename TM, typename TV>
void launch_adamw(float* p, const TG* g, TM* m, TV* v, TO* out, int64_t n,
                  const AdamWScalars& a, cudaStream_t cs) {
  const bool vec = is_aligned16(p) && is_aligned16(g) && is_aligned16(m) && is_aligned16(v) &&
                   (out == nullptr || is_aligned16(out));
  const int64_t packs = vec ? n / kPack : 0;
  const int64_t threads_wanted = vec ? std::max(packs, n % kPack) : n;
  const unsigned grid = unsigned(std::min<int64_t>(grid_for(threads_wanted, kThreads),
                                                   resident_blocks<TG, TO, TM, TV>()));
  adamw_kernel<TG, TO, TM, TV><<<grid, kThreads, 0, cs>>>(p, g, m, v, out, n, packs, a);
  MCPP_LAUNCH_CHECK();
}

// f(M, V) with the moments' typed pointers: float, or bf16 (f32 gradients only; the ops'
// checks ensure it), so the bf16 kernels are instantiated for f32 gradients alone.
template <typename TG, typename F>
void with_moments(Tensor& m, Tensor& v, F&& f) {
  auto with_v = [&](auto* M) {
    if constexpr (std::is_same_v<TG, float>)
      if (v.dtype() == DType::BF16) return f(M, static_cast<bf16*>(v.raw()));
    f(M, static_cast<float*>(v.raw()));
  };
  if constexpr (std::is_same_v<TG, float>)
    if (m.dtype() == DType::BF16) return with_v(static_cast<bf16*>(m.raw()));
  with_v(static_cast<float*>(m.raw()));
}

// m and v f32, or bf16 beside an f32 gradient.
void check_moments(const char* op, const Tensor& m, const Tensor& v, const Tensor& grad) {
  for (auto [t, name] : {std::pair{&m, "m"}, std::pair{&v, "v"}}) {
    check_cuda(*t, op, name);
    const bool bf16_ok = t->dtype() == DType::BF16 && grad.dtype() == DType::F32;
    MCPP_CHECK(t->dtype() == DType::F32 || bf16_ok,
               "{}: {} is {}, expected f32 (or bf16 beside an f32 gradient)", op, name, t->str());
  }
}

// The per-step scalars from the op's parameters (bias corrections in f64 on the host).
AdamWScalars scalars_of(const AdamWParams& ap) {
  const double bc1 = 1.0 - std::pow(ap.beta1, double(ap.step));
  const double bc2 = 1.0 - std::pow(ap.beta2, double(ap.step));
  return AdamWScalars{float(ap.lr),
                      float(ap.beta1),
                      float(ap.beta2),
                      1.f - float(ap.beta1),
                      1.f - float(ap.beta2),
                      float(ap.eps),
                      float(1.0 - ap.lr * ap.weight_decay),
                      float(1.0 / bc1),
                      float(1.0 / bc2),
                      float(ap.grad_scale)};
}

// ---- fp32 main parameters as (bf16 model parameter, lower half): ops/split_main.h ---------
// 8 elements a thread per iteration when every pointer is 16-byte aligned: one 16-byte word
// each of the model parameters and of the lower halves, two each of g, m and v (28 bytes an
// element with f32 gradients); the rest through the scalar loop, with the same arithmetic.

__device__ __forceinline__ void split_element(uint16_t& o, uint16_t& l, float& m, float& v,
                                             float g, const AdamWScalars& a) {
  float w = __uint_as_float(split_main_join(o, l));
  adamw_element(w, m, v, g, a);
  const uint32_t b = __float_as_uint(w);
  o = split_main_model(b), l = uint16_t(b);
}

template <typename TG, typename TM, typename TV>
static __global__ void __launch_bounds__(kThreads)
    adamw_split_kernel(uint16_t* __restrict__ o, uint16_t* __restrict__ l,
                       const TG* __restrict__ g, TM* __restrict__ m, TV* __restrict__ v,
                       int64_t n, int64_t packs, AdamWScalars a) {
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = tid; k < packs; k += stride) {
    const int64_t i = k * kPack;
    uint4 ow = *reinterpret_cast<const uint4*>(o + i), lw = *reinterpret_cast<const uint4*>(l + i);
    uint16_t* op = reinterpret_cast<uint16_t*>(&ow);
    uint16_t* lp = reinterpret_cast<uint16_t*>(&lw);
    Pack<float, kPack> mp = ld_moments(m + i), vp = ld_moments(v + i);
    const Pack<TG, kPack> gp = ld_pack<kPack>(g + i);
#pragma unroll
    for (int j = 0; j < kPack; ++j)
      split_element(op[j], lp[j], mp.v[j], vp.v[j], scaled_grad(gp.v[j], a.gscale), a);
    *reinterpret_cast<uint4*>(o + i) = ow;
    *reinterpret_cast<uint4*>(l + i) = lw;
    st_moments(m + i, mp);
    st_moments(v + i, vp);
  }
  for (int64_t i = packs * kPack + tid; i < n; i += stride) {
    uint16_t oi = o[i], li = l[i];
    float mi = to_f(m[i]), vi = to_f(v[i]);
    split_element(oi, li, mi, vi, scaled_grad(g[i], a.gscale), a);
    o[i] = oi, l[i] = li, m[i] = from_f<TM>(mi), v[i] = from_f<TV>(vi);
  }
}

static __global__ void split_main_kernel(const float* __restrict__ x, uint16_t* __restrict__ o,
                                         uint16_t* __restrict__ l, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t b = __float_as_uint(x[i]);
    o[i] = split_main_model(b);
    if (l) l[i] = uint16_t(b);
  }
}

static __global__ void join_main_kernel(const uint16_t* __restrict__ o,
                                        const uint16_t* __restrict__ l, float* __restrict__ y,
                                        int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(split_main_join(o[i], l[i]));
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& model_param,
                const AdamWParams& ap, Stream& s) {
  const char* op = "adamw_step";
  check_f32(param, op, "param");
  check_cuda(grad, op, "grad");
  check_moments(op, m, v, grad);
  int64_t n = param.numel();
  check_numel(grad, n, op, "grad");
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  const bool out = model_param.defined();
  if (out) {
    check_cuda(model_param, op, "model_param");
    check_numel(model_param, n, op, "model_param");
    MCPP_CHECK(model_param.dtype() == DType::BF16 || model_param.dtype() == DType::F16,
               "{}: model_param is {}, expected bf16 or f16 (f32 parameters are stepped in "
               "place)",
               op, model_param.str());
  }
  MCPP_CHECK(ap.step >= 1, "{}: step {} must be >= 1 (1-based, for bias correction)", op, ap.step);
  if (n == 0) return;
  const AdamWScalars a = scalars_of(ap);
  float* P = static_cast<float*>(param.raw());
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(grad.dtype(), op, {
    const T* G = static_cast<const T*>(grad.raw());
    with_moments<T>(m, v, [&](auto* M, auto* V) {
      if (!out)
        launch_adamw<T, void>(P, G, M, V, nullptr, n, a, cs);
      else if (model_param.dtype() == DType::BF16)
        launch_adamw<T, bf16>(P, G, M, V, static_cast<bf16*>(model_param.raw()), n, a, cs);
      else
        launch_adamw<T, f16>(P, G, M, V, static_cast<f16*>(model_param.raw()), n, a, cs);
    });
  });
}

void adamw_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m, Tensor& v,
                      const AdamWParams& ap, Stream& s) {
  const char* op = "adamw_step_split";
  const int64_t n = check_split_main(op, model_param, lo, nullptr, Device::CUDA);
  MCPP_CHECK(lo.defined(), "{}: lo is undefined", op);
  check_cuda(grad, op, "grad");
  check_moments(op, m, v, grad);
  check_numel(grad, n, op, "grad");
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  MCPP_CHECK(ap.step >= 1, "{}: step {} must be >= 1 (1-based, for bias correction)", op, ap.step);
  if (n == 0) return;
  const AdamWScalars a = scalars_of(ap);
  auto* O = static_cast<uint16_t*>(model_param.raw());
  auto* L = static_cast<uint16_t*>(lo.raw());
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(grad.dtype(), op, {
    const T* G = static_cast<const T*>(grad.raw());
    with_moments<T>(m, v, [&](auto* M, auto* V) {
      using TM = std::remove_pointer_t<decltype(M)>;
      using TV = std::remove_pointer_t<decltype(V)>;
      const bool vec = is_aligned16(O) && is_aligned16(L) && is_aligned16(G) &&
                       is_aligned16(M) && is_aligned16(V);
      const int64_t packs = vec ? n / kPack : 0;
      const int64_t threads_wanted = vec ? std::max(packs, n % kPack) : n;
      static const int64_t resident =
          occupancy_blocks(adamw_split_kernel<T, TM, TV>, kThreads);
      const unsigned grid =
          unsigned(std::min<int64_t>(grid_for(threads_wanted, kThreads), resident));
      adamw_split_kernel<T, TM, TV><<<grid, kThreads, 0, cs>>>(O, L, G, M, V, n, packs, a);
      MCPP_LAUNCH_CHECK();
    });
  });
}

void split_main_params(const Tensor& values, Tensor& model_param, Tensor& lo, Stream& s) {
  const int64_t n =
      check_split_main("split_main_params", model_param, lo, &values, Device::CUDA);
  if (n == 0) return;
  split_main_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
      static_cast<const float*>(values.raw()), static_cast<uint16_t*>(model_param.raw()),
      lo.defined() ? static_cast<uint16_t*>(lo.raw()) : nullptr, n);
  MCPP_LAUNCH_CHECK();
}

void join_main_params(const Tensor& model_param, const Tensor& lo, Tensor& out, Stream& s) {
  const int64_t n = check_split_main("join_main_params", model_param, lo, &out, Device::CUDA);
  MCPP_CHECK(lo.defined(), "join_main_params: lo is undefined");
  if (n == 0) return;
  join_main_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(s)>>>(
      static_cast<const uint16_t*>(model_param.raw()), static_cast<const uint16_t*>(lo.raw()),
      static_cast<float*>(out.raw()), n);
  MCPP_LAUNCH_CHECK();
}

void clear_main_lo(Tensor& lo, Stream& s) {
  check_cuda(lo, "clear_main_lo", "lo");
  MCPP_CHECK(lo.dtype() == DType::U16, "clear_main_lo: lo is {}, expected u16", lo.str());
  if (lo.numel() > 0) CUDA_CHECK(cudaMemsetAsync(lo.raw(), 0, lo.nbytes(), stream_of(s)));
}

}  // namespace mcpp::ops::cuda
