// MoE token permutation and probability ops (catalogue.inc, ---- MoE): deterministic kernels
// (no atomics: each output element is one thread's fixed-order sum). Activations
// f32/bf16/f16; p and row-dot outputs f32; index tensors i64. Where rows are whole 16-byte
// words and aligned, the row kernels move them as packs (a row per block-row of threads, no
// per-element index division); the math per element is the scalar kernels', in the same
// order, so both paths give the same bits.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "ops/cuda/activation_math.cuh"
#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

template <typename T>
__global__ void permute_kernel(const T* __restrict__ x, const int64_t* __restrict__ src,
                               T* __restrict__ y, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i - n * H;
    y[i] = x[src[n] * H + h];
  }
}

template <typename T>
__global__ void unpermute_kernel(const T* __restrict__ y, const int64_t* __restrict__ off,
                                 const int64_t* __restrict__ rows, T* __restrict__ out, int64_t T_,
                                 int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T_ * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int64_t r = off[t]; r < off[t + 1]; ++r) acc += to_f(y[rows[r] * H + h]);
    out[i] = from_f<T>(acc);
  }
}

template <typename T>
__global__ void scale_rows_kernel(const T* __restrict__ x, const float* __restrict__ p, T* y,
                                  int64_t N, int64_t F) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(x[i]) * p[i / F]);
}

// One warp per row: lanes stride the row, then a fixed butterfly reduction.
template <typename T>
__global__ void row_dot_kernel(const T* __restrict__ a, const T* __restrict__ b,
                               float* __restrict__ out, int64_t N, int64_t F) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N) return;
  float acc = 0.f;
  for (int64_t f = lane; f < F; f += 32) acc += to_f(a[warp * F + f]) * to_f(b[warp * F + f]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[warp] = acc;
}

// The packed forms: rows of H elements as H/N packs of N (16 bytes); grid-stride over packs.
template <typename T, int N>
__global__ void permute_pack_kernel(const T* __restrict__ x, const int64_t* __restrict__ src,
                                    T* __restrict__ y, int64_t N_, int64_t HP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N_ * HP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / HP, c = i - n * HP;
    st_pack<N>(y + (n * HP + c) * N, ld_pack<N>(x + (src[n] * HP + c) * N));
  }
}

template <typename T, int N>
__global__ void unpermute_pack_kernel(const T* __restrict__ y, const int64_t* __restrict__ off,
                                      const int64_t* __restrict__ rows, T* __restrict__ out,
                                      int64_t T_, int64_t HP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T_ * HP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / HP, c = i - t * HP;
    float acc[N];
#pragma unroll
    for (int q = 0; q < N; ++q) acc[q] = 0.f;
    for (int64_t r = off[t]; r < off[t + 1]; ++r) {
      const Pack<T, N> v = ld_pack<N>(y + (rows[r] * HP + c) * N);
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] += to_f(v.v[q]);
    }
    Pack<T, N> o;
#pragma unroll
    for (int q = 0; q < N; ++q) o.v[q] = from_f<T>(acc[q]);
    st_pack<N>(out + (t * HP + c) * N, o);
  }
}

template <typename T, int N>
__global__ void scale_rows_pack_kernel(const T* __restrict__ x, const float* __restrict__ p,
                                       T* y, int64_t N_, int64_t FP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N_ * FP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float pn = p[i / FP];
    const Pack<T, N> v = ld_pack<N>(x + i * N);
    Pack<T, N> o;
#pragma unroll
    for (int q = 0; q < N; ++q) o.v[q] = from_f<T>(to_f(v.v[q]) * pn);
    st_pack<N>(y + i * N, o);
  }
}

// Whether rows of `width` elements of T can move as 16-byte packs between these pointers.
template <typename T>
bool packable(int64_t width, std::initializer_list<const void*> ptrs) {
  if (width % kPackN<T> != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned16(p)) return false;
  return true;
}

void check_index(const Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::I64, "{}: {} is {}, expected i64", op, name, t.str());
}

}  // namespace

void gather_rows(const Tensor& x, const Tensor& src, Tensor& y, Stream& s) {
  check_cuda(x, "gather_rows", "x");
  check_cuda(y, "gather_rows", "y");
  check_index(src, "gather_rows", "src");
  MCPP_CHECK(x.dtype() == y.dtype(), "gather_rows: x {} and y {} differ in dtype", x.str(), y.str());
  const int64_t N = src.numel(), H = N ? y.numel() / N : 0;
  if (N * H == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), "gather_rows", {
    constexpr int P = kPackN<T>;
    if (packable<T>(H, {x.raw(), y.raw()}))
      permute_pack_kernel<T, P><<<grid_for(N * H / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), src.data<int64_t>(), static_cast<T*>(y.raw()), N,
          H / P);
    else
      permute_kernel<T><<<grid_for(N * H, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), src.data<int64_t>(), static_cast<T*>(y.raw()), N, H);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_unpermute(const Tensor& y, const Tensor& offsets, const Tensor& rows, Tensor& out,
                   Stream& s) {
  check_cuda(y, "moe_unpermute", "y");
  check_cuda(out, "moe_unpermute", "out");
  check_index(offsets, "moe_unpermute", "offsets");
  check_index(rows, "moe_unpermute", "rows");
  MCPP_CHECK(y.dtype() == out.dtype(), "moe_unpermute: y {} and out {} differ in dtype", y.str(),
             out.str());
  const int64_t T_ = offsets.numel() - 1, H = T_ > 0 ? out.numel() / T_ : 0;
  if (T_ * H == 0) return;
  MCPP_DISPATCH_ACT(out.dtype(), "moe_unpermute", {
    constexpr int P = kPackN<T>;
    if (packable<T>(H, {y.raw(), out.raw()}))
      unpermute_pack_kernel<T, P><<<grid_for(T_ * H / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(y.raw()), offsets.data<int64_t>(), rows.data<int64_t>(),
          static_cast<T*>(out.raw()), T_, H / P);
    else
      unpermute_kernel<T><<<grid_for(T_ * H, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(y.raw()), offsets.data<int64_t>(), rows.data<int64_t>(),
          static_cast<T*>(out.raw()), T_, H);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_scale_rows(const Tensor& x, const Tensor& p, Tensor& y, Stream& s) {
  check_cuda(x, "moe_scale_rows", "x");
  check_cuda(y, "moe_scale_rows", "y");
  check_f32(p, "moe_scale_rows", "p");
  const int64_t N = p.numel(), F = N ? x.numel() / N : 0;
  check_numel(y, N * F, "moe_scale_rows", "y");
  if (N * F == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), "moe_scale_rows", {
    constexpr int P = kPackN<T>;
    if (packable<T>(F, {x.raw(), y.raw()}))
      scale_rows_pack_kernel<T, P><<<grid_for(N * F / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), p.data<float>(), static_cast<T*>(y.raw()), N, F / P);
    else
      scale_rows_kernel<T><<<grid_for(N * F, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), p.data<float>(), static_cast<T*>(y.raw()), N, F);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_row_dot(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  check_cuda(a, "moe_row_dot", "a");
  check_cuda(b, "moe_row_dot", "b");
  check_f32(out, "moe_row_dot", "out");
  const int64_t N = out.numel(), F = N ? a.numel() / N : 0;
  check_numel(b, N * F, "moe_row_dot", "b");
  if (N == 0) return;
  MCPP_DISPATCH_ACT(a.dtype(), "moe_row_dot",
                    row_dot_kernel<T><<<unsigned((N * 32 + 255) / 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(a.raw()), static_cast<const T*>(b.raw()),
                        out.data<float>(), N, F));
  MCPP_LAUNCH_CHECK();
}

// ---- the experts' activation with the probabilities (experts.h): ap = act(fc1) * p and its
// backward, each one pass over the rows. The element math is activations.cu's
// (activation_math.cuh) and the two scale kernels' above, with the activation rounded to T
// where the unfused ops store it and dap * p rounded where moe_scale_rows stores it, so ap
// and dfc1 are the unfused ops' bits; dp sums as row_dot_kernel does per lane (one f32 FMA
// an element), in a different order across lanes.

namespace {

// V elements of T at p as floats: one 16-byte pack (V = kPackN<T>, p aligned) or one scalar.
template <int V, typename T>
__device__ __forceinline__ void ld_vec(const T* p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = to_f(*p);
  } else {
    const Pack<T, V> v = ld_pack<V>(p);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = to_f(v.v[k]);
  }
}
template <int V, typename T>
__device__ __forceinline__ void st_vec(T* p, const float (&in)[V]) {
  if constexpr (V == 1) {
    *p = from_f<T>(in[0]);
  } else {
    Pack<T, V> v;
#pragma unroll
    for (int k = 0; k < V; ++k) v.v[k] = from_f<T>(in[k]);
    st_pack<V>(p, v);
  }
}

// Whether A is a gated unit: fc1 rows of [gate | up], the activation glu_f's (SwiGLU's bits
// when gp has no offset and no clamp).
template <MlpActivation A>
constexpr bool kGated = A == MlpActivation::Swiglu || A == MlpActivation::QuickGeglu;

// The activation of V columns starting at column c of row r (fc1 rows of W = 2F or F),
// rounded to T as the unfused forward stores it; g / u: the inputs (u: a gated unit's up
// only); gp: a gated unit's parameters.
template <typename T, MlpActivation A, int V>
__device__ __forceinline__ void act_vec(const T* fc1, int64_t r, int64_t c, int64_t F,
                                        const GluF& gp, float (&g)[V], float (&u)[V],
                                        float (&a)[V]) {
  constexpr bool kFast = kFastMath<T>, kGlu = kGated<A>;
  const T* row = fc1 + r * (kGlu ? 2 * F : F);
  ld_vec<V>(row + c, g);
  if constexpr (kGlu) ld_vec<V>(row + F + c, u);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if constexpr (kGlu)
      a[k] = to_f(from_f<T>(glu_f<kFast, A == MlpActivation::QuickGeglu>(gp, g[k], u[k])));
    else if constexpr (A == MlpActivation::SquaredRelu)
      a[k] = to_f(from_f<T>(squared_relu_f(g[k])));
    else if constexpr (A == MlpActivation::GeluErf)
      a[k] = to_f(from_f<T>(gelu_erf_f(g[k])));
    else
      a[k] = to_f(from_f<T>(gelu_f<kFast>(g[k])));
  }
}

// ap [N, F] = act(fc1) * p: V columns per thread and step, FV = F / V steps a row. small:
// N * FV fits 32 bits (the row of step v is then a 32-bit division).
template <typename T, MlpActivation A, int V>
__global__ void act_scale_fwd_kernel(const T* __restrict__ fc1, const float* __restrict__ p,
                                     T* __restrict__ ap, int64_t N, int64_t F, int64_t FV,
                                     bool small, GluF gp) {
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < N * FV;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = small ? int64_t(uint32_t(v) / uint32_t(FV)) : v / FV, c = (v - r * FV) * V;
    float g[V], u[V], a[V];
    act_vec<T, A, V>(fc1, r, c, F, gp, g, u, a);
    const float pr = p[r];
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fmul_rn(a[k], pr);  // moe_scale_rows' product
    st_vec<V>(ap + r * F + c, a);
  }
}

// The backward, a row per TPR threads (256 / TPR rows a block): each thread takes V columns
// a step, writes their dfc1 and sums dap * act; the row's sum is a butterfly in each warp,
// then the warps' sums in order (shared memory) when TPR > 32. The loop over rows is uniform
// across the block, so the barriers are reached by every thread. ap (null: not wanted): the
// forward's act * p for the same columns, written after the thread has read their dap, so it
// may alias dap -- which is why neither pointer is __restrict__.
template <typename T, MlpActivation A, int V, int TPR>
__global__ void __launch_bounds__(256)
    act_scale_bwd_kernel(const T* dap, const T* __restrict__ fc1, const float* __restrict__ p,
                         T* __restrict__ dfc1, float* __restrict__ dp, T* ap, int64_t N,
                         int64_t F, GluF gp) {
  constexpr int R = 256 / TPR, W = TPR / 32;  // rows a block, warps a row
  constexpr bool kFast = kFastMath<T>, kGlu = kGated<A>;
  __shared__ float part[256 / 32];
  const int sub = threadIdx.x / TPR, t = threadIdx.x % TPR;
  const int64_t W1 = kGlu ? 2 * F : F;
  for (int64_t base = blockIdx.x * int64_t(R); base < N; base += int64_t(gridDim.x) * R) {
    const int64_t r = base + sub;
    float acc = 0.f;
    if (r < N) {
      const float pr = p[r];
      for (int64_t c = int64_t(t) * V; c < F; c += int64_t(TPR) * V) {
        float g[V], u[V], a[V], d[V], dg[V], du[V];
        act_vec<T, A, V>(fc1, r, c, F, gp, g, u, a);
        ld_vec<V>(dap + r * F + c, d);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          acc += d[k] * a[k];
          const float dact = to_f(from_f<T>(__fmul_rn(d[k], pr)));  // moe_scale_rows' bits
          if constexpr (kGlu)
            glu_grad_f<kFast, A == MlpActivation::QuickGeglu>(gp, dact, g[k], u[k], dg[k], du[k]);
          else if constexpr (A == MlpActivation::SquaredRelu)
            dg[k] = dact * squared_relu_grad_f(g[k]);
          else if constexpr (A == MlpActivation::GeluErf)
            dg[k] = dact * gelu_erf_grad_f(g[k]);
          else
            dg[k] = dact * gelu_grad_f<kFast>(g[k]);
        }
        st_vec<V>(dfc1 + r * W1 + c, dg);
        if constexpr (kGlu) st_vec<V>(dfc1 + r * W1 + F + c, du);
        if (ap) {  // act_scale_fwd_kernel's product
#pragma unroll
          for (int k = 0; k < V; ++k) a[k] = __fmul_rn(a[k], pr);
          st_vec<V>(ap + r * F + c, a);
        }
      }
    }
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if constexpr (W == 1) {
      if (t == 0 && r < N) dp[r] = acc;
    } else {
      if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
      __syncthreads();
      if (t == 0 && r < N) {
        float sum = 0.f;
        for (int w = 0; w < W; ++w) sum += part[sub * W + w];
        dp[r] = sum;
      }
      __syncthreads();
    }
  }
}

template <typename T, MlpActivation A, int V, int TPR>
void act_scale_bwd_launch(const T* dap, const T* fc1, const float* p, T* dfc1, float* dp, T* ap,
                          int64_t N, int64_t F, const GluF& gp, Stream& s) {
  constexpr int R = 256 / TPR;
  const int64_t blocks = std::min<int64_t>((N + R - 1) / R, int64_t(1) << 20);
  act_scale_bwd_kernel<T, A, V, TPR>
      <<<unsigned(blocks), 256, 0, stream_of(s)>>>(dap, fc1, p, dfc1, dp, ap, N, F, gp);
}

// A row's threads: enough for a step or two of each, a warp at the least.
template <typename T, MlpActivation A, int V>
void act_scale_bwd_rows(const T* dap, const T* fc1, const float* p, T* dfc1, float* dp, T* ap,
                        int64_t N, int64_t F, const GluF& gp, Stream& s) {
  const int64_t FV = F / V;
  if (FV <= 64)
    act_scale_bwd_launch<T, A, V, 32>(dap, fc1, p, dfc1, dp, ap, N, F, gp, s);
  else if (FV <= 256)
    act_scale_bwd_launch<T, A, V, 128>(dap, fc1, p, dfc1, dp, ap, N, F, gp, s);
  else
    act_scale_bwd_launch<T, A, V, 256>(dap, fc1, p, dfc1, dp, ap, N, F, gp, s);
}

// Checks of the fused ops: T tensors of one activation dtype, p [N] f32; returns F.
int64_t act_scale_check(const char* op, const Tensor& fc1, const Tensor& p, MlpAct a,
                        std::initializer_list<std::pair<const Tensor*, const char*>> acts) {
  check_cuda(fc1, op, "fc1");
  check_f32(p, op, "p");
  const int64_t m = a.gated() ? 2 : 1;
  const int64_t N = p.numel(), F = N ? fc1.numel() / (m * N) : 0;
  check_numel(fc1, m * N * F, op, "fc1");
  for (const auto& [t, name] : acts) {
    check_cuda(*t, op, name);
    MCPP_CHECK(t->dtype() == fc1.dtype(), "{}: {} is {} but fc1 is {} (one activation dtype)", op,
               name, t->str(), fc1.str());
  }
  return F;
}

// Calls f(activation, width) with both as compile-time constants: the activation a, the
// pack width P when vec, else 1.
template <typename Fn, int P>
void dispatch_act_vec(MlpActivation a, bool vec, Fn&& f, std::integral_constant<int, P>) {
  using Sw = std::integral_constant<MlpActivation, MlpActivation::Swiglu>;
  using Qg = std::integral_constant<MlpActivation, MlpActivation::QuickGeglu>;
  using Sq = std::integral_constant<MlpActivation, MlpActivation::SquaredRelu>;
  using Ge = std::integral_constant<MlpActivation, MlpActivation::Gelu>;
  using Gx = std::integral_constant<MlpActivation, MlpActivation::GeluErf>;
  using VP = std::integral_constant<int, P>;
  using V1 = std::integral_constant<int, 1>;
  switch (a) {
    case MlpActivation::Swiglu: return vec ? f(Sw{}, VP{}) : f(Sw{}, V1{});
    case MlpActivation::QuickGeglu: return vec ? f(Qg{}, VP{}) : f(Qg{}, V1{});
    case MlpActivation::SquaredRelu: return vec ? f(Sq{}, VP{}) : f(Sq{}, V1{});
    case MlpActivation::Gelu: return vec ? f(Ge{}, VP{}) : f(Ge{}, V1{});
    case MlpActivation::GeluErf: return vec ? f(Gx{}, VP{}) : f(Gx{}, V1{});
  }
}

}  // namespace

void moe_act_scale_forward(const Tensor& fc1, const Tensor& p, MlpAct a, Tensor& ap,
                           Stream& s) {
  const char* op = "moe_act_scale_forward";
  const int64_t F = act_scale_check(op, fc1, p, a, {{&ap, "ap"}}), N = p.numel();
  check_numel(ap, N * F, op, "ap");
  if (N * F == 0) return;
  MCPP_DISPATCH_ACT(fc1.dtype(), op, {
    constexpr int P = kPackN<T>;
    auto x = static_cast<const T*>(fc1.raw());
    auto y = static_cast<T*>(ap.raw());
    const bool vec = packable<T>(F, {x, y});
    const int64_t FV = vec ? F / P : F;
    const bool small = N * FV <= int64_t(UINT32_MAX);
    const unsigned grid = grid_for(N * FV, 256);
    const GluF gp = glu_of(a);
    auto launch = [&](auto act, auto v) {
      act_scale_fwd_kernel<T, decltype(act)::value, decltype(v)::value>
          <<<grid, 256, 0, stream_of(s)>>>(x, p.data<float>(), y, N, F, FV, small, gp);
    };
    dispatch_act_vec(a.kind, vec, launch, std::integral_constant<int, P>{});
  });
  MCPP_LAUNCH_CHECK();
}

void moe_act_scale_backward(const Tensor& dap, const Tensor& fc1, const Tensor& p, MlpAct a,
                            Tensor& dfc1, Tensor& dp, Tensor& ap, Stream& s) {
  const char* op = "moe_act_scale_backward";
  const int64_t F = act_scale_check(op, fc1, p, a, {{&dap, "dap"}, {&dfc1, "dfc1"}}),
                N = p.numel();
  check_numel(dap, N * F, op, "dap");
  check_numel(dfc1, fc1.numel(), op, "dfc1");
  check_f32(dp, op, "dp");
  check_numel(dp, N, op, "dp");
  if (ap.defined()) {
    act_scale_check(op, fc1, p, a, {{&ap, "ap"}});
    check_numel(ap, N * F, op, "ap");
  }
  if (N == 0) return;
  MCPP_DISPATCH_ACT(fc1.dtype(), op, {
    constexpr int P = kPackN<T>;
    auto d = static_cast<const T*>(dap.raw());
    auto x = static_cast<const T*>(fc1.raw());
    auto dx = static_cast<T*>(dfc1.raw());
    auto ao = ap.defined() ? static_cast<T*>(ap.raw()) : nullptr;
    const float* pp = p.data<float>();
    float* o = dp.data<float>();
    // F % P == 0: the up half is aligned too
    const bool vec = packable<T>(F, {d, x, dx}) && (!ao || packable<T>(F, {ao}));
    const GluF gp = glu_of(a);
    auto launch = [&](auto act, auto v) {
      act_scale_bwd_rows<T, decltype(act)::value, decltype(v)::value>(d, x, pp, dx, o, ao, N, F,
                                                                       gp, s);
    };
    dispatch_act_vec(a.kind, vec, launch, std::integral_constant<int, P>{});
  });
  MCPP_LAUNCH_CHECK();
}

// ---- an expert's fc2 bias times the probabilities (Megatron's _apply_bias): y += p b, and
// its backward, db += p^T dy (a column sum) and dp += dy b (a row dot), each in a fixed order.

namespace {

template <typename T>
__global__ void bias_scale_kernel(const T* __restrict__ b, const float* __restrict__ p,
                                  T* __restrict__ y, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i - n * H;
    y[i] = from_f<T>(to_f(y[i]) + p[n] * to_f(b[h]));
  }
}

// 32 columns a block, 8 lanes of rows each (rows ty, ty + 8, ...), the lanes' sums added in
// lane order.
template <typename T>
__global__ void bias_scale_db_kernel(const T* __restrict__ dy, const float* __restrict__ p,
                                     float* __restrict__ db, int64_t N, int64_t H) {
  __shared__ float part[8][33];
  const int tx = int(threadIdx.x % 32), ty = int(threadIdx.x / 32);
  const int64_t h = int64_t(blockIdx.x) * 32 + tx;
  float acc = 0.f;
  if (h < H)
    for (int64_t n = ty; n < N; n += 8) acc += p[n] * to_f(dy[n * H + h]);
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && h < H) {
    float sum = 0.f;
    for (int k = 0; k < 8; ++k) sum += part[k][tx];
    db[h] += sum;
  }
}

// A warp a row: lanes stride the row, then the fixed butterfly (row_dot_kernel's).
template <typename T, typename B>
__global__ void bias_scale_dp_kernel(const T* __restrict__ dy, const B* __restrict__ b,
                                     float* __restrict__ dp, int64_t N, int64_t H) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N) return;
  float acc = 0.f;
  for (int64_t h = lane; h < H; h += 32) acc += to_f(dy[warp * H + h]) * to_f(b[h]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) dp[warp] += acc;
}

}  // namespace

void moe_bias_scale_forward(const Tensor& b, const Tensor& p, Tensor& y, Stream& s) {
  const char* op = "moe_bias_scale_forward";
  check_cuda(y, op, "y");
  check_cuda(b, op, "b");
  check_f32(p, op, "p");
  MCPP_CHECK(b.dtype() == y.dtype(), "{}: b is {} but y is {} (one activation dtype)", op,
             b.str(), y.str());
  const int64_t N = p.numel(), H = b.numel();
  check_numel(y, N * H, op, "y");
  if (N * H == 0) return;
  MCPP_DISPATCH_ACT(y.dtype(), op,
                    bias_scale_kernel<T><<<grid_for(N * H, 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(b.raw()), p.data<float>(),
                        static_cast<T*>(y.raw()), N, H));
  MCPP_LAUNCH_CHECK();
}

void moe_bias_scale_backward(const Tensor& dy, const Tensor& b, const Tensor& p, Tensor& db,
                             Tensor& dp, Stream& s) {
  const char* op = "moe_bias_scale_backward";
  check_cuda(dy, op, "dy");
  check_cuda(b, op, "b");
  check_f32(p, op, "p");
  check_f32(db, op, "db");
  check_f32(dp, op, "dp");
  MCPP_CHECK(b.dtype() == dy.dtype(), "{}: b is {} but dy is {} (one activation dtype)", op,
             b.str(), dy.str());
  const int64_t N = p.numel(), H = b.numel();
  check_numel(dy, N * H, op, "dy");
  check_numel(db, H, op, "db");
  check_numel(dp, N, op, "dp");
  if (N * H == 0) return;
  MCPP_DISPATCH_ACT(dy.dtype(), op, {
    auto g = static_cast<const T*>(dy.raw());
    bias_scale_db_kernel<T><<<unsigned((H + 31) / 32), 256, 0, stream_of(s)>>>(
        g, p.data<float>(), db.data<float>(), N, H);
    bias_scale_dp_kernel<T, T><<<unsigned((N * 32 + 255) / 256), 256, 0, stream_of(s)>>>(
        g, static_cast<const T*>(b.raw()), dp.data<float>(), N, H);
  });
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
