// SGD with momentum and Lion on CUDA (ops/momentum_step.h), one memory-bound pass as
// adamw_step's: with every pointer 16-byte aligned each thread moves 8 elements an
// iteration as whole 16-byte words, the rest (and unaligned views) go through the scalar
// loop; both call momentum_element (ops/momentum_math.h: the CPU op's arithmetic, each
// operation a rounded intrinsic), so the results are the CPU's bits whatever path runs.
// A pass moves 16 bytes an element (p, g, m read; p, m written; f32), 12 without SGD's
// buffer; +2 with the bf16/f16 model parameters. The split form (fp32 main parameters as
// bf16 model parameter + lower half, ops/split_main.h) moves 16.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/momentum_math.h"
#include "ops/split_main.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPack = 8;
using Scalars = MomentumScalars<float>;

// The gradient times the clipping factor, rounded to its type (as ops::scale leaves it).
template <typename TG>
__device__ __forceinline__ float scaled(TG g, float s) {
  return to_f(from_f<TG>(__fmul_rn(to_f(g), s)));
}

// TO: the model parameters' type (bf16/f16), void for none. m: null without a buffer.
template <typename TG, typename TO>
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(float* __restrict__ p, const TG* __restrict__ g, float* __restrict__ m,
                    TO* __restrict__ out, int64_t n, int64_t packs, Scalars a) {
  constexpr bool kOut = !std::is_void_v<TO>;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = tid; k < packs; k += stride) {
    const int64_t i = k * kPack;
    Pack<float, kPack> pp = ld_pack<kPack>(p + i), mp{};
    if (m) mp = ld_pack<kPack>(m + i);
    const Pack<TG, kPack> gp = ld_pack<kPack>(g + i);
#pragma unroll
    for (int j = 0; j < kPack; ++j)
      momentum_element(pp.v[j], mp.v[j], scaled(gp.v[j], a.gscale), a);
    st_pack(p + i, pp);
    if (m) st_pack(m + i, mp);
    if constexpr (kOut) {
      Pack<TO, kPack> op;
#pragma unroll
      for (int j = 0; j < kPack; ++j) op.v[j] = from_d<TO>(double(pp.v[j]));
      st_pack(out + i, op);
    }
  }
  for (int64_t i = packs * kPack + tid; i < n; i += stride) {
    float pi = p[i], mi = m ? m[i] : 0.f;
    momentum_element(pi, mi, scaled(g[i], a.gscale), a);
    p[i] = pi;
    if (m) m[i] = mi;
    if constexpr (kOut) out[i] = from_d<TO>(double(pi));
  }
}

__device__ __forceinline__ void split_element(uint16_t& o, uint16_t& l, float& m, float g,
                                             const Scalars& a) {
  float w = __uint_as_float(split_main_join(o, l));
  momentum_element(w, m, g, a);
  const uint32_t b = __float_as_uint(w);
  o = split_main_model(b), l = uint16_t(b);
}

template <typename TG>
__global__ void __launch_bounds__(kThreads)
    momentum_split_kernel(uint16_t* __restrict__ o, uint16_t* __restrict__ l,
                          const TG* __restrict__ g, float* __restrict__ m, int64_t n,
                          int64_t packs, Scalars a) {
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = tid; k < packs; k += stride) {
    const int64_t i = k * kPack;
    uint4 ow = *reinterpret_cast<const uint4*>(o + i), lw = *reinterpret_cast<const uint4*>(l + i);
    uint16_t* op = reinterpret_cast<uint16_t*>(&ow);
    uint16_t* lp = reinterpret_cast<uint16_t*>(&lw);
    Pack<float, kPack> mp{};
    if (m) mp = ld_pack<kPack>(m + i);
    const Pack<TG, kPack> gp = ld_pack<kPack>(g + i);
#pragma unroll
    for (int j = 0; j < kPack; ++j)
      split_element(op[j], lp[j], mp.v[j], scaled(gp.v[j], a.gscale), a);
    *reinterpret_cast<uint4*>(o + i) = ow;
    *reinterpret_cast<uint4*>(l + i) = lw;
    if (m) st_pack(m + i, mp);
  }
  for (int64_t i = packs * kPack + tid; i < n; i += stride) {
    uint16_t oi = o[i], li = l[i];
    float mi = m ? m[i] : 0.f;
    split_element(oi, li, mi, scaled(g[i], a.gscale), a);
    o[i] = oi, l[i] = li;
    if (m) m[i] = mi;
  }
}

// The grid: enough threads for the packs (or elements), at most the blocks the GPU holds at
// once (`resident`, asked once per kernel).
__global__ void __launch_bounds__(kThreads)
    adamuon_kernel(float* __restrict__ u, float* __restrict__ v, int64_t n, float w, float eps,
                   float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    adamuon_element(u[i], v[i], w, eps, scale);
}

unsigned grid_of(int64_t resident, bool vec, int64_t n) {
  const int64_t wanted = vec ? std::max(n / kPack, n % kPack) : n;
  return unsigned(std::min<int64_t>(grid_for(wanted, kThreads), resident));
}

}  // namespace

void momentum_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& model_param,
                   const MomentumStepParams& mp, Stream& s) {
  const char* op = "momentum_step";
  check_momentum_params(op, mp, m);
  check_f32(param, op, "param");
  check_cuda(grad, op, "grad");
  const int64_t n = param.numel();
  check_numel(grad, n, op, "grad");
  if (m.defined()) check_f32(m, op, "m"), check_numel(m, n, op, "m");
  const bool out = model_param.defined();
  if (out) {
    check_cuda(model_param, op, "model_param");
    check_numel(model_param, n, op, "model_param");
    MCPP_CHECK(model_param.dtype() == DType::BF16 || model_param.dtype() == DType::F16,
               "{}: model_param is {}, expected bf16 or f16 (f32 parameters are stepped in "
               "place)",
               op, model_param.str());
  }
  if (n == 0) return;
  const Scalars a = Scalars::of(mp);
  float* P = static_cast<float*>(param.raw());
  float* M = m.defined() ? static_cast<float*>(m.raw()) : nullptr;
  cudaStream_t cs = stream_of(s);
  auto launch = [&](auto* G, auto* O) {
    using TG = std::remove_const_t<std::remove_pointer_t<decltype(G)>>;
    using TO = std::remove_pointer_t<decltype(O)>;
    const bool vec = is_aligned16(P) && is_aligned16(G) && (!M || is_aligned16(M)) &&
                     (!O || is_aligned16(O));
    static const int64_t resident = occupancy_blocks(momentum_kernel<TG, TO>, kThreads);
    const unsigned grid = grid_of(resident, vec, n);
    momentum_kernel<TG, TO><<<grid, kThreads, 0, cs>>>(P, G, M, O, n, vec ? n / kPack : 0, a);
    MCPP_LAUNCH_CHECK();
  };
  MCPP_DISPATCH_ACT(grad.dtype(), op, {
    const T* G = static_cast<const T*>(grad.raw());
    if (!out)
      launch(G, static_cast<void*>(nullptr));
    else if (model_param.dtype() == DType::BF16)
      launch(G, static_cast<bf16*>(model_param.raw()));
    else
      launch(G, static_cast<f16*>(model_param.raw()));
  });
}

void momentum_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m,
                         const MomentumStepParams& mp, Stream& s) {
  const char* op = "momentum_step_split";
  check_momentum_params(op, mp, m);
  const int64_t n = check_split_main(op, model_param, lo, nullptr, Device::CUDA);
  MCPP_CHECK(lo.defined(), "{}: lo is undefined", op);
  check_cuda(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  if (m.defined()) check_f32(m, op, "m"), check_numel(m, n, op, "m");
  if (n == 0) return;
  const Scalars a = Scalars::of(mp);
  auto* O = static_cast<uint16_t*>(model_param.raw());
  auto* L = static_cast<uint16_t*>(lo.raw());
  float* M = m.defined() ? static_cast<float*>(m.raw()) : nullptr;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(grad.dtype(), op, {
    const T* G = static_cast<const T*>(grad.raw());
    const bool vec =
        is_aligned16(O) && is_aligned16(L) && is_aligned16(G) && (!M || is_aligned16(M));
    static const int64_t resident = occupancy_blocks(momentum_split_kernel<T>, kThreads);
    const unsigned grid = grid_of(resident, vec, n);
    momentum_split_kernel<T><<<grid, kThreads, 0, cs>>>(O, L, G, M, n, vec ? n / kPack : 0, a);
    MCPP_LAUNCH_CHECK();
  });
}

void adamuon_normalize(Tensor& u, Tensor& v, double beta2, double eps, double scale,
                       Stream& s) {
  const char* op = "adamuon_normalize";
  check_f32(u, op, "u"), check_f32(v, op, "v");
  const int64_t n = u.numel();
  check_numel(v, n, op, "v");
  if (n == 0) return;
  static const int64_t resident = occupancy_blocks(adamuon_kernel, kThreads);
  const unsigned grid = grid_of(resident, false, n);
  adamuon_kernel<<<grid, kThreads, 0, stream_of(s)>>>(static_cast<float*>(u.raw()),
                                                     static_cast<float*>(v.raw()), n,
                                                     float(1.0 - beta2), float(eps),
                                                     float(scale));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
